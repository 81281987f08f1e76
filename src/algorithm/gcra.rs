//! GCRA, the generic cell rate algorithm: one word of state, the theoretical arrival time.
//!
//! Emission interval `T = ceil(W / L)`. With `TAT' = max(TAT, now)`: accept iff
//! `TAT' + c·T - now <= B·T`, then `TAT = TAT' + c·T`. `B` requests may arrive at the same
//! instant; a cost above `B` is never accepted. The token bucket is decided as this
//! (`token_bucket.rs`). A quota slice's check may reach `ahead_us` further
//! (`TAT' + c·T - now <= B·T + ahead`), with `TAT' = max(TAT, now + after)`: it reserves a
//! run of future emission slots, whose units its server admits no earlier than a
//! request's check would (`runtime/slice.rs`).
//!
//! A commit's identity is the TAT it left. A refund gives back all of the commit's `c·T`
//! when no commit was made on the key since (the TAT is still the one it left), nothing
//! otherwise: all or nothing, so that the state stays one word, moved by one
//! compare-and-swap in an in-process lane.

use super::Params;
use crate::decision::Decision;

/// The theoretical arrival time, µs since the epoch (0: never seen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// Theoretical arrival time.
    pub tat: u64,
}

impl Gcra {
    /// Decides without changing anything.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, b, t, c) = (p.quota.limit(), p.quota.burst_size(), p.quota.emission_interval_micros(), p.cost);
        let tat = self.tat.max(now.saturating_add(p.after_us));
        let capacity = b * t;
        // A quota slice may reserve slots up to `ahead_us` past the burst.
        let reach = capacity + p.ahead_us;
        let (used, ct) = (tat - now, c.saturating_mul(t));
        if ct <= reach && used + ct <= reach {
            let used = used + ct;
            return Decision::allow_units(l, capacity.saturating_sub(used), t, used);
        }
        let retry = (ct <= reach).then(|| used + ct - reach);
        Decision::reject_units(l, capacity.saturating_sub(used), t, used, retry)
    }

    /// Applies an accepted request (or a charge: past the burst, the TAT goes into debt);
    /// returns the TAT it left, the commit's identity for [`Gcra::refund`].
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        let base = self.tat.max(now.saturating_add(p.after_us));
        self.tat = base + p.cost * p.quota.emission_interval_micros();
        self.tat
    }

    /// Gives back all `c·T` of the commit that left the TAT at `at` when no commit was made
    /// on the key since (the TAT is still `at`), nothing otherwise; never moving the TAT
    /// before `now` (what has drained since is not given twice).
    ///
    /// ABA is harmless: commits only move the TAT later, and a refund moves it back to no
    /// earlier than the refunded commit's start (or `now`). So a TAT equal to `at` again
    /// means every later commit was refunded (the key holds exactly what it held then), or
    /// the TAT is at or before `now`, where moving it to `now` changes no decision.
    pub(crate) fn refund(&mut self, p: &Params, at: u64, now: u64) {
        if self.tat == at {
            let cells = p.cost * p.quota.emission_interval_micros();
            self.tat = at.saturating_sub(cells).max(now);
        }
    }

    /// The theoretical arrival time: from then on the full burst is available again.
    #[must_use]
    pub(crate) fn expires_at(&self, _p: &Params) -> u64 {
        self.tat
    }
}
