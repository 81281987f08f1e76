//! Sliding window log: the timestamps of the units accepted in the last period.
//!
//! Entries `<= now - W` are dropped; accept iff `len + c <= L`. Exact: for every `t`, the
//! units accepted in `(t - W, t]` never exceed `L`. Memory per key is bounded by `L`
//! entries (here run-length encoded: units accepted at the same µs share one entry).
//!
//! A decision is amortised O(1) for cost-1 requests: the log keeps a running total of its
//! units, so the count in the window is that total less the expired prefix, which every
//! commit drains and so is short. Only a rejection walks further, to the `k`-th oldest
//! unit in the window, where `k` is how many units must leave first (1 for a cost-1
//! request at the limit).

use std::collections::VecDeque;

use super::Params;
use crate::decision::Decision;

/// How many expired entries [`SlidingWindowLog::summary`] steps over one by one before it
/// binary-searches for the first live one. A commit drains the expired prefix, so it is
/// usually 0 or 1 entries long; it grows only while a key is decided but not committed (for
/// example, another rule on the same request keeps rejecting it).
const WALK: usize = 8;

/// Entries a log makes room for at its first commit.
const FIRST: usize = 8;

/// Accepted units as `(timestamp, units)`, oldest first, with their running total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SlidingWindowLog {
    /// `(µs since the epoch, units accepted then)`, in non-decreasing time order.
    entries: VecDeque<(u64, u64)>,
    /// The units of every entry, expired or not: `commit` and `refund` keep it in step.
    total: u64,
    /// The oldest and the newest entry's µs (0 when empty), beside the log: the common
    /// decision (nothing has expired, the request fits) and commit (a later µs) read no
    /// entry, whose buffer is a cache miss of its own.
    oldest: u64,
    newest: u64,
}

/// What a decision needs to know of a log: what the Redis script reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Units in the window `(now - W, now]`.
    pub in_window: u64,
    /// When the request does not fit: the timestamp of the `k`-th oldest unit in the
    /// window, where `k = in_window + cost - L` is how many must leave before it fits (0
    /// when it can never fit). When it fits: the oldest timestamp in the window (0 when
    /// the window is empty), the first unit to leave after this request.
    pub kth: u64,
    /// The newest timestamp in the window (0 when empty).
    pub newest: u64,
}

impl Summary {
    /// The decision for a log summarised at `now`.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, w, c) = (p.quota.limit(), p.quota.period_micros(), p.cost);
        let n = self.in_window;
        if n.saturating_add(c) <= l {
            // One more unit fits when the oldest leaves: this request's own, if first.
            let oldest = if n == 0 { now } else { self.kth };
            return Decision::allow(l, l - n - c, w, (oldest + w).saturating_sub(now).max(1));
        }
        let reset = if n == 0 { 0 } else { (self.newest + w).saturating_sub(now) };
        let retry = (c <= l).then(|| (self.kth + w).saturating_sub(now));
        Decision::reject(l, l.saturating_sub(n), reset, retry)
    }

    /// How many units must leave the window before `cost` more fit (0: they fit now, or
    /// can never fit).
    #[must_use]
    pub(crate) fn units_to_leave(in_window: u64, p: &Params) -> u64 {
        let (l, c) = (p.quota.limit(), p.cost);
        if c > l || in_window.saturating_add(c) <= l {
            0
        } else {
            in_window + c - l
        }
    }
}

impl SlidingWindowLog {
    /// The expired prefix at `now`, the entries `<= now - W`: how many there are, and
    /// their units.
    #[inline]
    fn expired(&self, p: &Params, now: u64) -> (usize, u64) {
        // Nothing expired (the common case, decided and committed alike): read off the
        // inline oldest µs, in the caller, with no call and no entry read.
        if self.entries.is_empty() || self.oldest + p.quota.period_micros() > now {
            return (0, 0);
        }
        self.expired_prefix(p, now)
    }

    /// [`SlidingWindowLog::expired`] once the oldest entry has expired.
    fn expired_prefix(&self, p: &Params, now: u64) -> (usize, u64) {
        let w = p.quota.period_micros();
        let mut units = 0;
        for (i, &(ts, n)) in self.entries.iter().enumerate().take(WALK) {
            if ts + w > now {
                return (i, units);
            }
            units += n;
        }
        let len = self.entries.len();
        if len <= WALK {
            return (len, units);
        }
        // A long prefix: find where it ends, then add up whichever side is shorter.
        let first = self.entries.partition_point(|&(ts, _)| ts + w <= now);
        let sum = |range| self.entries.range(range).map(|&(_, n)| n).sum::<u64>();
        if first - WALK <= len - first {
            (first, units + sum(WALK..first))
        } else {
            (first, self.total - sum(first..len))
        }
    }

    /// The summary a decision needs.
    #[must_use]
    pub(crate) fn summary(&self, p: &Params, now: u64) -> Summary {
        let (first, expired) = self.expired(p, now);
        let in_window = self.total - expired;
        let k = Summary::units_to_leave(in_window, p);
        let mut kth = 0;
        if in_window.saturating_add(p.cost) <= p.quota.limit() {
            kth = match first {
                _ if first >= self.entries.len() => 0,
                0 => self.oldest,
                _ => self.entries[first].0,
            };
        } else if k > 0 {
            // The oldest live entry holds the `k`-th unit (a cost-1 request at the limit
            // needs one unit to leave): no walk.
            // (`in_window` is not 0 here: the newest is in the window.)
            if let Some(&(ts, _)) = self.entries.get(first).filter(|&&(_, n)| n >= k) {
                return Summary { in_window, kth: ts, newest: self.newest };
            }
            let mut seen = 0;
            for &(ts, n) in self.entries.range(first..) {
                seen += n;
                if seen >= k {
                    kth = ts;
                    break;
                }
            }
        }
        Summary { in_window, kth, newest: if in_window == 0 { 0 } else { self.newest } }
    }

    /// Decides without changing anything.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        self.summary(p, now).decide(p, now)
    }

    /// Units in the window (a charge's room: [`super::MAX_DEBT`]).
    pub(crate) fn in_use(&self, p: &Params, now: u64) -> u64 {
        self.total - self.expired(p, now).1
    }

    /// Applies an accepted request: drops expired entries, records the units at `now`.
    /// Returns the timestamp they were recorded under (`now`, or the newest entry's when
    /// the clock stepped back).
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        let (first, expired) = self.expired(p, now);
        if first > 0 {
            self.entries.drain(..first);
            self.total -= expired;
            self.ends();
        }
        self.total += p.cost;
        match self.entries.back_mut() {
            // A clock that stepped back still records in order.
            Some((ts, n)) if self.newest >= now => {
                *n += p.cost;
                *ts
            }
            _ => {
                if self.entries.is_empty() {
                    self.oldest = now;
                }
                self.make_room(p.quota.limit());
                self.entries.push_back((now, p.cost));
                self.newest = now;
                now
            }
        }
    }

    /// Room for one more entry: [`FIRST`] of them at first, then four times as many, up
    /// to the limit (a log holds at most one entry a unit in its window, debt aside). A key
    /// of a few dozen requests a window takes two allocations, where the deque's own
    /// doubling from 4 took four (each a copy): on a fresh store a third of a commit's time.
    fn make_room(&mut self, limit: u64) {
        let (len, cap) = (self.entries.len(), self.entries.capacity());
        if len < cap {
            return;
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let want = if cap == 0 { FIRST } else { cap.saturating_mul(4) };
        self.entries.reserve_exact(want.min(limit).max(len + 1) - len);
    }

    /// The oldest and newest µs again, after entries left from either end.
    fn ends(&mut self) {
        self.oldest = self.entries.front().map_or(0, |&(ts, _)| ts);
        self.newest = self.entries.back().map_or(0, |&(ts, _)| ts);
    }

    /// Gives back the units of the commit recorded at `at`: from its own entry, while that
    /// is still in the window — never units of other requests.
    pub(crate) fn refund(&mut self, p: &Params, at: u64, now: u64) {
        if at + p.quota.period_micros() <= now {
            return; // they have left the window
        }
        let i = self.entries.partition_point(|&(ts, _)| ts < at);
        let Some((ts, n)) = self.entries.get_mut(i) else { return };
        if *ts != at {
            return;
        }
        let take = p.cost.min(*n);
        *n -= take;
        self.total -= take;
        if *n == 0 {
            self.entries.remove(i);
            self.ends();
        }
    }

    /// When the newest entry leaves the window.
    #[must_use]
    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        if self.entries.is_empty() {
            0
        } else {
            self.newest + p.quota.period_micros()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::Kind;
    use crate::quota::Quota;

    /// The inline ends are the deque's ends (0 and 0 when it is empty).
    fn ends_hold(log: &SlidingWindowLog) -> Result<(), TestCaseError> {
        let front = log.entries.front().map_or(0, |&(ts, _)| ts);
        let back = log.entries.back().map_or(0, |&(ts, _)| ts);
        prop_assert_eq!((log.oldest, log.newest), (front, back), "ends of {:?}", log.entries);
        prop_assert_eq!(log.total, log.entries.iter().map(|&(_, n)| n).sum::<u64>());
        prop_assert!(log.entries.iter().all(|&(_, n)| n > 0), "an empty entry in {:?}", log.entries);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        /// Commits at equal µs, a clock stepping back, charges past the limit, refunds of
        /// the first, last and middle entries, drains to empty, long expired prefixes (past
        /// the walk of 8): the inline `oldest`/`newest` never disagree with the deque.
        #[test]
        fn the_logs_inline_ends_are_the_deques_ends(
            limit in 1u64..40,
            w in prop_oneof![Just(1u64), Just(5), Just(100)],
            steps in prop::collection::vec((0u8..6, -120i64..150, 1u64..5, 0usize..64), 1..200),
        ) {
            let q = Quota::new(limit, Duration::from_micros(w));
            let mut log = SlidingWindowLog::default();
            let mut commits: Vec<(u64, u64)> = Vec::new();
            let mut now = 1_000_000u64;
            for (op, pct, cost, pick) in steps {
                // Now and then the same µs, or back in time.
                now = now.saturating_add_signed(if op == 5 { 0 } else { pct * w as i64 / 100 });
                let p = Params::new(q).cost(cost);
                match op {
                    0 | 5 if log.decide(&p, now).allowed => commits.push((log.commit(&p, now), cost)),
                    0 | 5 => {}
                    1 => commits.push((log.commit(&p, now), cost)),
                    2 => Kind::charge(&mut log, &p, now),
                    _ if !commits.is_empty() => {
                        // The oldest, the newest or any commit, refunded by its identity.
                        let i = match op { 3 => 0, 4 => commits.len() - 1, _ => pick % commits.len() };
                        let (at, cost) = commits.remove(i);
                        log.refund(&p.cost(cost), at, now);
                    }
                    _ => {}
                }
                ends_hold(&log)?;
                // And what it decides is what a log with its ends read off the deque does.
                let mut rebuilt = log.clone();
                rebuilt.ends();
                for later in [now, now + w / 2, now + w] {
                    prop_assert_eq!(log.decide(&p, later), rebuilt.decide(&p, later));
                    prop_assert_eq!(log.expires_at(&p), rebuilt.expires_at(&p));
                }
            }
        }
    }
}
