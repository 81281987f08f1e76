//! Sliding window log: the timestamps of the units accepted in the last period.
//!
//! Entries `<= now - W` are dropped; accept iff `len + c <= L`. Exact: for every `t`, the
//! units accepted in `(t - W, t]` never exceed `L`. Memory per key is bounded by `L`
//! entries (here run-length encoded: units accepted at the same µs share one entry).

use std::collections::VecDeque;

use super::Params;
use crate::Decision;

/// Accepted units as `(timestamp, units)`, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingWindowLog {
    /// `(µs since the epoch, units accepted then)`, in non-decreasing time order.
    pub entries: VecDeque<(u64, u64)>,
}

/// What a decision needs to know of a log: what the Redis script reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Units in the window `(now - W, now]`.
    pub in_window: u64,
    /// The timestamp of the `k`-th oldest unit in the window, where
    /// `k = in_window + cost - L` is how many must leave before the request fits
    /// (0 when it already fits or can never fit).
    pub kth: u64,
    /// The newest timestamp in the window (0 when empty).
    pub newest: u64,
}

impl Summary {
    /// The decision for a log summarised at `now`.
    #[must_use]
    pub fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, w, c) = (p.quota.limit(), p.quota.period_micros(), p.cost);
        let n = self.in_window;
        if n.saturating_add(c) <= l {
            return Decision::allow(l, l - n - c, w);
        }
        let reset = if n == 0 { 0 } else { (self.newest + w).saturating_sub(now) };
        let retry = (c <= l).then(|| (self.kth + w).saturating_sub(now));
        Decision::reject(l, l.saturating_sub(n), reset, retry)
    }

    /// How many units must leave the window before `cost` more fit (0: they fit now, or
    /// can never fit).
    #[must_use]
    pub fn units_to_leave(in_window: u64, p: &Params) -> u64 {
        let (l, c) = (p.quota.limit(), p.cost);
        if c > l || in_window.saturating_add(c) <= l {
            0
        } else {
            in_window + c - l
        }
    }
}

impl SlidingWindowLog {
    /// Index of the first entry inside the window `(now - W, now]`.
    fn first_live(&self, p: &Params, now: u64) -> usize {
        let w = p.quota.period_micros();
        self.entries.partition_point(|&(ts, _)| ts + w <= now)
    }

    /// The summary a decision needs.
    #[must_use]
    pub fn summary(&self, p: &Params, now: u64) -> Summary {
        let live = self.entries.range(self.first_live(p, now)..);
        let in_window: u64 = live.clone().map(|&(_, n)| n).sum();
        let k = Summary::units_to_leave(in_window, p);
        let mut kth = 0;
        if k > 0 {
            let mut seen = 0;
            for &(ts, n) in live {
                seen += n;
                if seen >= k {
                    kth = ts;
                    break;
                }
            }
        }
        let newest = self.entries.back().map_or(0, |&(ts, _)| ts);
        Summary { in_window, kth, newest: if in_window == 0 { 0 } else { newest } }
    }

    /// Decides without changing anything.
    #[must_use]
    pub fn decide(&self, p: &Params, now: u64) -> Decision {
        self.summary(p, now).decide(p, now)
    }

    /// Applies an accepted request: drops expired entries, records the units at `now`.
    pub fn commit(&mut self, p: &Params, now: u64) {
        let first = self.first_live(p, now);
        self.entries.drain(..first);
        match self.entries.back_mut() {
            // A clock that stepped back still records in order.
            Some((ts, n)) if *ts >= now => *n += p.cost,
            _ => self.entries.push_back((now, p.cost)),
        }
    }

    /// Gives back the newest `cost` units.
    pub fn refund(&mut self, p: &Params, _now: u64) {
        let mut left = p.cost;
        while left > 0 {
            let Some((_, n)) = self.entries.back_mut() else { break };
            let take = left.min(*n);
            *n -= take;
            left -= take;
            if *n == 0 {
                self.entries.pop_back();
            }
        }
    }

    /// When the newest entry leaves the window.
    #[must_use]
    pub fn expires_at(&self, p: &Params) -> u64 {
        self.entries.back().map_or(0, |&(ts, _)| ts + p.quota.period_micros())
    }
}
