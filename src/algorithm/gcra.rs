//! GCRA, the generic cell rate algorithm: one stored value, the theoretical arrival time.
//!
//! Emission interval `T = ceil(W / L)`. With `TAT' = max(TAT, now)`: accept iff
//! `TAT' + c·T - now <= B·T`, then `TAT = TAT' + c·T`. `B` requests may arrive at the same
//! instant; a cost above `B` is never accepted. Same decisions as the token bucket.

use super::{next_unit, Params};
use crate::Decision;

/// The theoretical arrival time, µs since the epoch (0: never seen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gcra {
    /// Theoretical arrival time.
    pub tat: u64,
}

impl Gcra {
    /// Decides without changing anything.
    #[must_use]
    pub fn decide(&self, p: &Params, now: u64) -> Decision {
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
    pub fn commit(&mut self, p: &Params, now: u64) -> u64 {
        self.tat = self.tat.max(now) + p.cost * p.quota.emission_interval_micros();
        now
    }

    /// Gives back what the commit made at `at` still holds back: its `c·T`, less the time
    /// since `at` (one cell drains per `T`; a cell given back after it would have drained
    /// lets more than the burst through at once). Never moves the TAT before `now`.
    ///
    /// Conservative, and by design: when later requests kept the bucket from draining,
    /// the commit holds back more than this gives back. A bound taken from the TAT the
    /// commit left instead would count the debts of other requests, which may be given
    /// back too (the model test found the over-admission).
    pub fn refund(&mut self, p: &Params, at: u64, now: u64) {
        let cells = p.cost * p.quota.emission_interval_micros();
        let held = cells.min((at + cells).saturating_sub(now));
        self.tat = self.tat.saturating_sub(held).max(now);
    }

    /// The theoretical arrival time: from then on the full burst is available again.
    #[must_use]
    pub fn expires_at(&self, _p: &Params) -> u64 {
        self.tat
    }
}
