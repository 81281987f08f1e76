//! Token bucket: capacity `B`, refilled continuously at `L` tokens per `W`, lazily from
//! the stored `(level, last)` — no background refiller.
//!
//! To stay in exact integers the level is kept in microseconds of refill: one token is
//! `T = ceil(W / L)` µs, the capacity is `B·T`, and the level grows by one per elapsed µs.
//! Accept iff the level holds `c·T`. (Same decisions as GCRA, by construction.)

use super::{next_unit, Params};
use crate::decision::Decision;

/// The bucket's level (in µs of refill, `tokens × T`) at time `last`, the latest commit.
///
/// The default (`level 0` at `last 0`) refills to a full bucket at any real time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TokenBucket {
    /// Tokens × T at `last`.
    pub level: u64,
    /// When the latest commit was made (µs since the epoch): the level is as of then.
    /// Refunds add to the level without moving it, so it bounds them as GCRA's does.
    pub last: u64,
}

impl TokenBucket {
    /// The level at `now`: 0 while in debt (`last` is then ahead of `now`).
    fn level_at(&self, capacity: u64, now: u64) -> u64 {
        self.level.saturating_add(now.saturating_sub(self.last)).min(capacity)
    }

    /// Decides without changing anything.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, b, t, c) = (p.quota.limit(), p.quota.burst_size(), p.quota.emission_interval_micros(), p.cost);
        let capacity = b * t;
        let level = self.level_at(capacity, now);
        let debt = self.debt(now);
        if c <= b && level >= c * t && debt == 0 {
            let left = level - c * t;
            return Decision::allow(l, left / t, capacity - left, next_unit(left, t));
        }
        let retry = (c <= b).then(|| c * t - level + debt);
        Decision::reject(l, level / t, capacity - level + debt, retry)
    }

    /// A bucket in debt (charged past empty, see [`TokenBucket::force`]) is empty with
    /// its `last` in the future: the debt is the time until then.
    fn debt(&self, now: u64) -> u64 {
        if self.level == 0 {
            self.last.saturating_sub(now)
        } else {
            0
        }
    }

    /// How far ahead of `now` the bucket's use reaches, as GCRA's TAT: `last` plus the
    /// time to refill to full (a charge's room: [`super::MAX_DEBT`]).
    pub(crate) fn ahead(&self, p: &Params, now: u64) -> u64 {
        let capacity = p.quota.burst_size() * p.quota.emission_interval_micros();
        self.last.max(now) + (capacity - self.level_at(capacity, now))
    }

    /// Takes `c` tokens whatever the level (a charge reported after the response): past
    /// empty, the bucket goes into debt by moving `last` forward by the missing refill
    /// time, so that it refills from then on — time pushed forward, as GCRA's TAT is.
    pub(crate) fn take(&mut self, p: &Params, now: u64) {
        let t = p.quota.emission_interval_micros();
        let capacity = p.quota.burst_size() * t;
        let need = p.cost * t;
        let level = self.level_at(capacity, now);
        let last = self.last.max(now);
        if level >= need {
            (self.level, self.last) = (level - need, last);
        } else {
            (self.level, self.last) = (0, last + (need - level));
        }
    }

    /// Applies an accepted request; returns `now`, the commit's identity for
    /// [`TokenBucket::refund`].
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        let t = p.quota.emission_interval_micros();
        let capacity = p.quota.burst_size() * t;
        // Saturating: a check list naming the same state twice must not underflow.
        self.level = self.level_at(capacity, now).saturating_sub(p.cost * t);
        self.last = self.last.max(now);
        now
    }

    /// Gives back what the commit made at `at` still holds back: its `c` tokens, less one
    /// per `T` from it to the latest commit (the same bound as
    /// [`Gcra::refund`](super::gcra::Gcra::refund), whose module docs say why), never
    /// above the capacity. The level stays as of the latest commit: adding to it there is
    /// adding to it now, as the refill since is the same.
    pub(crate) fn refund(&mut self, p: &Params, at: u64, _now: u64) {
        let t = p.quota.emission_interval_micros();
        let capacity = p.quota.burst_size() * t;
        let tokens = p.cost * t;
        let held = tokens.min((at + tokens).saturating_sub(self.last));
        self.level = (self.level + held).min(capacity);
    }

    /// When the bucket is full again.
    #[must_use]
    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        let capacity = p.quota.burst_size() * p.quota.emission_interval_micros();
        self.last + (capacity - self.level.min(capacity))
    }
}
