//! GCRA, the generic cell rate algorithm: the theoretical arrival time decides; the time
//! of the latest commit bounds refunds.
//!
//! Emission interval `T = ceil(W / L)`. With `TAT' = max(TAT, now)`: accept iff
//! `TAT' + c·T - now <= B·T`, then `TAT = TAT' + c·T`. `B` requests may arrive at the same
//! instant; a cost above `B` is never accepted. Same decisions as the token bucket.
//!
//! A refund of the commit made at `a` moves the TAT back by
//! `min(c·T, a + c·T - latest commit)`. Sound whatever else is refunded: the TAT stays at
//! least that of the commits still standing, since a commit made at `m` after `a` left a
//! TAT at least `m` ahead of `a + c·T`'s share (so, with `m <= latest`, removing this
//! commit may move the TAT back by at most `a + c·T - latest` past it). And tight where it
//! matters: with no commit since (a slow handler's own count-by-outcome refund) it is
//! `c·T`; overlapping commits rolled back together lose only the gap between them.

use super::{next_unit, Params};
use crate::decision::Decision;

/// The theoretical arrival time and the latest commit, µs since the epoch (0: never
/// seen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// Theoretical arrival time.
    pub tat: u64,
    /// When the latest commit was made (bounds refunds; see the module docs).
    pub last: u64,
}

impl Gcra {
    /// Decides without changing anything.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, b, t, c) = (p.quota.limit(), p.quota.burst_size(), p.quota.emission_interval_micros(), p.cost);
        let tat = self.tat.max(now);
        let capacity = b * t;
        let used = tat - now;
        if c <= b && used + c * t <= capacity {
            let used = used + c * t;
            return Decision::allow(l, (capacity - used) / t, used, next_unit(capacity - used, t));
        }
        let retry = (c <= b).then(|| used + c * t - capacity);
        Decision::reject(l, capacity.saturating_sub(used) / t, used, retry)
    }

    /// Applies an accepted request; returns `now`, the commit's identity for
    /// [`Gcra::refund`].
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        self.tat = self.tat.max(now) + p.cost * p.quota.emission_interval_micros();
        self.last = self.last.max(now);
        now
    }

    /// Gives back what the commit made at `at` still holds back: its `c·T`, less the time
    /// from it to the latest commit (see the module docs), never moving the TAT before
    /// `now` (what has drained since is not given twice).
    pub(crate) fn refund(&mut self, p: &Params, at: u64, now: u64) {
        let cells = p.cost * p.quota.emission_interval_micros();
        let held = cells.min((at + cells).saturating_sub(self.last));
        self.tat = self.tat.saturating_sub(held).max(now);
    }

    /// The theoretical arrival time: from then on the full burst is available again.
    #[must_use]
    pub(crate) fn expires_at(&self, _p: &Params) -> u64 {
        self.tat
    }
}
