//! Concurrency: at most `n` permits of a key held at once (`Rule::concurrent`). Not a rate:
//! no window, no refill — a permit is taken when an input is admitted and given back when
//! its work ends.
//!
//! Each permit is one entry with its own id (what a commit returns, and what a release
//! names: releasing an id twice, or one the state does not hold, gives nothing back), its
//! units (a cost of several permits is one entry), and when it was taken. The quota's
//! `limit` is `n`; its period is the rule's hold limit, after which a permit a remote
//! store holds lapses unless renewed (here, in-process, nothing dies without its permits
//! being dropped: they do not lapse).
//!
//! A refusal says when to retry: the median of the key's recent hold times (the last
//! [`HOLDS`] releases), at least [`MIN_RETRY_US`]. A cost above `n` can never be admitted
//! and has no retry time.

use smallvec::SmallVec;

use super::Params;
use crate::decision::Decision;

/// How many recent hold times a key keeps for its retry time.
pub(crate) const HOLDS: usize = 8;

/// The shortest retry time of a refusal, µs (10 ms).
pub(crate) const MIN_RETRY_US: u64 = 10_000;

/// One permit held: its id, its units, and when it was taken (µs since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub id: u64,
    pub units: u64,
    pub since: u64,
}

/// The permits a key holds, and its recent hold times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Concurrency {
    pub held: SmallVec<[Held; 2]>,
    /// The last id given: ids grow, and are at least the time of their commit, so an id
    /// given before this state was forgotten is never given again.
    pub last: u64,
    /// Recent hold times, µs (0: none yet), a ring written at `next`.
    pub holds: [u64; HOLDS],
    pub next: u8,
    /// The last time a permit was taken or given back (µs; what keeps the hold times).
    pub touched: u64,
}

impl Concurrency {
    /// Permits held.
    #[must_use]
    pub(crate) fn in_use(&self) -> u64 {
        self.held.iter().map(|h| h.units).sum()
    }

    /// Decides without changing anything: admitted iff the permits held plus the cost fit
    /// in `n`. A cost of 0 asks whether one more would fit, and takes nothing.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, _now: u64) -> Decision {
        let (n, cost, used) = (p.quota.limit(), p.cost, self.in_use());
        if used.saturating_add(cost.max(1)) <= n {
            return Decision::allow(n, n - used - cost.min(n - used), 0, 0);
        }
        let retry = (cost <= n).then(|| retry_after(&self.holds));
        Decision::reject(n, n.saturating_sub(used), 0, retry)
    }

    /// Takes `cost` permits as one entry; returns its id.
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        let id = now.max(self.last.saturating_add(1));
        self.last = id;
        self.touched = now;
        self.held.push(Held { id, units: p.cost, since: now });
        id
    }

    /// Gives back the permits of id `at`, if this state holds them (at most once), and
    /// records how long they were held.
    pub(crate) fn refund(&mut self, _p: &Params, at: u64, now: u64) {
        if let Some(i) = self.held.iter().position(|h| h.id == at) {
            let h = self.held.swap_remove(i);
            self.holds[usize::from(self.next) % HOLDS] = now.saturating_sub(h.since).max(1);
            self.next = (self.next + 1) % HOLDS as u8;
            self.touched = now;
        }
    }

    /// Never while permits are held (they do not lapse in process); else a hold limit
    /// after the last release (the hold times are kept that long).
    #[must_use]
    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        if self.held.is_empty() {
            self.touched.saturating_add(p.quota.period_micros())
        } else {
            u64::MAX
        }
    }
}

/// The retry time of a refusal: the median of the recorded hold times (the upper one of
/// an even count), at least [`MIN_RETRY_US`]; that minimum when none is recorded.
#[must_use]
pub(crate) fn retry_after(holds: &[u64]) -> u64 {
    let mut seen: SmallVec<[u64; HOLDS]> = holds.iter().copied().filter(|&h| h > 0).collect();
    if seen.is_empty() {
        return MIN_RETRY_US;
    }
    seen.sort_unstable();
    seen[seen.len() / 2].max(MIN_RETRY_US)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::quota::Quota;

    fn p(n: u64, cost: u64) -> Params {
        Params::new(Quota::new(n, Duration::from_secs(60))).cost(cost)
    }

    #[test]
    fn admits_up_to_n_and_a_release_makes_room() {
        let mut s = Concurrency::default();
        let a = s.commit(&p(2, 1), 1_000);
        assert!(s.decide(&p(2, 1), 1_000).allowed);
        let _b = s.commit(&p(2, 1), 1_000);
        let d = s.decide(&p(2, 1), 1_000);
        assert!(!d.allowed);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(10)), "no hold time yet: the minimum");
        s.refund(&p(2, 1), a, 301_000);
        assert!(s.decide(&p(2, 1), 301_000).allowed);
        s.refund(&p(2, 1), a, 302_000);
        assert_eq!(s.in_use(), 1, "a second release of one id gives nothing back");
    }

    #[test]
    fn ids_are_distinct_at_one_instant_and_a_cost_is_several_permits() {
        let mut s = Concurrency::default();
        let a = s.commit(&p(5, 3), 7);
        let b = s.commit(&p(5, 1), 7);
        assert_ne!(a, b);
        assert_eq!(s.in_use(), 4);
        assert!(!s.decide(&p(5, 2), 7).allowed);
        assert_eq!(s.decide(&p(5, 6), 7).retry_after(), None, "more than n can never be admitted");
    }

    #[test]
    fn the_retry_time_is_the_median_hold_at_least_ten_ms() {
        assert_eq!(retry_after(&[0; HOLDS]), MIN_RETRY_US);
        assert_eq!(retry_after(&[200_000, 100_000, 300_000, 0, 0, 0, 0, 0]), 200_000);
        assert_eq!(retry_after(&[5, 6, 7, 0, 0, 0, 0, 0]), MIN_RETRY_US);
    }
}
