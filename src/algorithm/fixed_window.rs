//! Fixed window counter: a counter per aligned window `floor(now / W)`.
//!
//! Accept iff `count + cost <= L`. Up to `2L` units may pass in a `W`-long span that
//! straddles a window boundary (`L` at the end of one window, `L` at the start of the next).

use super::{window_of, Params};
use crate::decision::Decision;

/// The window index and the units accepted in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    /// `floor(t / W)` of the window the count belongs to.
    pub window: u64,
    /// Units accepted in that window.
    pub count: u64,
    /// The earliest time a commit into this state recorded (µs; 0: none): a refund of a
    /// commit made before it gives nothing back — that commit went into a state a reset
    /// forgot, and its units are not in this count.
    pub born: u64,
}

impl FixedWindow {
    fn count_at(&self, w: u64) -> u64 {
        if self.window == w {
            self.count
        } else {
            0
        }
    }

    /// Decides without changing anything.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, period, c) = (p.quota.limit(), p.quota.period_micros(), p.cost);
        let w = window_of(self.window, period, now);
        let count = self.count_at(w);
        let window_end = (w + 1) * period - now;
        if count.saturating_add(c) <= l {
            // Units come back all at once, at the window's end.
            return Decision::allow(l, l - count - c, window_end, window_end);
        }
        let reset = if count == 0 { 0 } else { window_end };
        let retry = (c <= l).then_some(window_end);
        Decision::reject(l, l.saturating_sub(count), reset, retry)
    }

    /// Units counted in the current window (a charge's room: [`super::MAX_DEBT`]).
    pub(crate) fn in_use(&self, p: &Params, now: u64) -> u64 {
        self.count_at(window_of(self.window, p.quota.period_micros(), now))
    }

    /// Applies an accepted request; returns where its units went (`now`, whose window
    /// holds them; the stored window's start when the clock stepped back before it).
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        let period = p.quota.period_micros();
        let w = window_of(self.window, period, now);
        self.count = self.count_at(w) + p.cost;
        self.window = w;
        let at = now.max(w * period);
        self.born = if self.born == 0 { at } else { self.born.min(at) };
        at
    }

    /// Gives back the units of a commit made at `at`, if its window is still the stored
    /// one (after the boundary they have left already; units of the new window are never
    /// touched) and it is not older than every commit this state holds (else a reset
    /// forgot it).
    pub(crate) fn refund(&mut self, p: &Params, at: u64, _now: u64) {
        if self.window == at / p.quota.period_micros() && at >= self.born {
            self.count = self.count.saturating_sub(p.cost);
        }
    }

    /// The end of the stored window.
    #[must_use]
    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        (self.window + 1) * p.quota.period_micros()
    }
}
