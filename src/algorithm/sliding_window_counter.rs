//! Sliding window counter: counters for the current and the previous aligned window.
//!
//! With `e` the µs elapsed in the current window, the estimate is
//! `prev · (W - e) / W + curr`, evaluated in IEEE-754 doubles in exactly that order (the
//! Redis script does the same operations, so both round alike); accept iff
//! `estimate + c <= L`. Examples: `L = 100`, prev 84, curr 15, a quarter into the window
//! → 78, accepted; prev 9, curr 5, 15 s into a 60 s window → 11.75.

use super::Params;
use crate::decision::Decision;

/// The current window's index and the counts of it and of the window before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlidingWindowCounter {
    /// `floor(t / W)` of the window `curr` counts.
    pub window: u64,
    /// Units accepted in window `window - 1`.
    pub prev: u64,
    /// Units accepted in window `window`.
    pub curr: u64,
    /// The earliest time a commit into this state recorded (µs; 0: none): a refund of a
    /// commit made before it gives nothing back — that commit went into a state a reset
    /// forgot.
    pub born: u64,
}

/// Below this, a sum of two counts is an integer a double holds exactly (2⁵³).
const EXACT: u64 = 1 << 52;

/// `prev · (W - e) / W + curr`, in this order, in doubles.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub(crate) fn estimate(prev: u64, curr: u64, elapsed: u64, period: u64) -> f64 {
    if prev == 0 {
        // What the doubles give (`0 · x / W + curr` is `curr`), without the division.
        return curr as f64;
    }
    prev as f64 * (period - elapsed) as f64 / period as f64 + curr as f64
}

#[allow(clippy::cast_precision_loss)]
fn fits(prev: u64, curr: u64, elapsed: u64, period: u64, cost: u64, limit: u64) -> bool {
    estimate(prev, curr, elapsed, period) + cost as f64 <= limit as f64
}

impl SlidingWindowCounter {
    /// The window of `now` ([`super::window_of`]) and the µs elapsed in it.
    fn window_of(&self, period: u64, now: u64) -> (u64, u64) {
        let w = super::window_of(self.window, period, now);
        (w, now.saturating_sub(w * period))
    }

    /// `(prev, curr)` as seen from window `w`.
    fn counts_at(&self, w: u64) -> (u64, u64) {
        if self.window == w {
            (self.prev, self.curr)
        } else if self.window + 1 == w {
            (self.curr, 0)
        } else {
            (0, 0)
        }
    }

    /// Decides without changing anything.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, period, c) = (p.quota.limit(), p.quota.period_micros(), p.cost);
        let (w, e) = self.window_of(period, now);
        let (prev, curr) = self.counts_at(w);
        // The common path: nothing in the previous window (a key's first window, or one
        // quiet for a window). Every number is an integer below 2⁵³, so the doubles'
        // `curr + c <= l` and `floor(l - (curr + c))` are exact: the integers decide and
        // count as they do, with no float.
        if prev == 0 && curr < EXACT && c < EXACT {
            if curr + c <= l {
                let left = l - curr - c;
                let more = match curr + c {
                    0 => retry(0, 0, l, l, period, e),
                    used => period - e + next_unit(used, l, period),
                };
                return Decision::allow(l, left, 2 * period - e, more);
            }
            let reset = if curr > 0 { 2 * period - e } else { 0 };
            let retry = (c <= l).then(|| retry(0, curr, c, l, period, e));
            return Decision::reject(l, l.saturating_sub(curr), reset, retry);
        }
        Self::decide_in_doubles(prev, curr, p, e)
    }

    /// [`SlidingWindowCounter::decide`] from the counts seen from the window of `now`, `e`
    /// µs into it, in doubles as the Redis script weighs them.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    fn decide_in_doubles(prev: u64, curr: u64, p: &Params, e: u64) -> Decision {
        let (l, period, c) = (p.quota.limit(), p.quota.period_micros(), p.cost);
        let est = estimate(prev, curr, e, period);
        let remaining = |est: f64| (l as f64 - est).max(0.0).floor() as u64;
        if fits(prev, curr, e, period, c, l) {
            let left = remaining(est + c as f64);
            // More fits once the weighted estimate has fallen by enough for `left + 1`
            // (at most `l`): the retry of a request of that cost after this one.
            // (A probe of a key with nothing in use leaves `l`: the whole limit is the most.)
            let more = retry(prev, curr + c, (left + 1).min(l), l, period, e);
            // Fully restored when this window's count has left the next window too.
            return Decision::allow(l, left, 2 * period - e, more);
        }
        let reset = if curr > 0 {
            2 * period - e
        } else if prev > 0 {
            period - e
        } else {
            0
        };
        let retry = (c <= l).then(|| retry(prev, curr, c, l, period, e));
        Decision::reject(l, remaining(est), reset, retry)
    }

    /// Units counted in the current window (a charge's room: [`super::MAX_DEBT`]).
    pub(crate) fn in_use(&self, p: &Params, now: u64) -> u64 {
        let (w, _) = self.window_of(p.quota.period_micros(), now);
        self.counts_at(w).1
    }

    /// Applies an accepted request; returns `now` (whose window holds its units; the
    /// stored window's start when the clock stepped back before it).
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        let period = p.quota.period_micros();
        let (w, _) = self.window_of(period, now);
        let (prev, curr) = self.counts_at(w);
        let at = now.max(w * period);
        let born = if self.born == 0 { at } else { self.born.min(at) };
        *self = Self { window: w, prev, curr: curr + p.cost, born };
        at
    }

    /// Gives back the units of a commit made at `at`: from `curr` while its window is the
    /// current one, from `prev` once the state rolled over to the next, and nothing after
    /// that (they have left the estimate).
    pub(crate) fn refund(&mut self, p: &Params, at: u64, _now: u64) {
        let w = at / p.quota.period_micros();
        if at < self.born {
            return;
        }
        if self.window == w {
            self.curr = self.curr.saturating_sub(p.cost);
        } else if self.window == w + 1 {
            self.prev = self.prev.saturating_sub(p.cost);
        }
    }

    /// When both counts have left the window.
    #[must_use]
    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        (self.window + 2) * p.quota.period_micros()
    }
}

/// How long from elapsed `e` until a request of cost `c <= l` fits, given the counts.
fn retry(prev: u64, curr: u64, c: u64, l: u64, period: u64, e: u64) -> u64 {
    if curr.saturating_add(c) <= l {
        // Later in this window, as the previous window's weight fades.
        period - e - first_fit(prev, curr, c, l, period, e)
    } else {
        // In the next window, where this window's count becomes `prev`.
        period - e + (period - first_fit(curr, 0, c, l, period, 0))
    }
}

/// When, into the next window, one more unit fits after this one rolls over holding
/// `used` units (`1 <= used <= l`) and nothing more is taken: the elapsed `e'` of
/// `retry(0, used, l - used + 1, ..)`, which is [`first_fit`]`(used, 0, l - used + 1, ..)`
/// from 0. There the exact answer is `ceil(W / used)` (`used·(W - e') <= (used - 1)·W`),
/// and the rounding test of [`first_fit`] reduces to how far `used·e'` is from `W` on either
/// side: one division and a few products in 64-bit words, the common allowed decision's
/// whole refill time.
fn next_unit(used: u64, l: u64, period: u64) -> u64 {
    if let Some(span) = (l + 1).checked_mul(period) {
        // `used·e <= W + used <= span`: every product below fits.
        let e = period.div_ceil(used);
        let slack = span >> 50;
        let (after, before) = (used * e - period, period - used * (e - 1));
        let fits_at_e = e == period || after > slack || (after == 0 && used * (period - e) < 1 << 53);
        if fits_at_e && before > slack {
            return e;
        }
    }
    period - first_fit(used, 0, l - used + 1, l, period, 0)
}

/// The remaining time `W - e'` at the earliest elapsed `e' >= from` of a window at which
/// `prev·(W - e')/W + curr + c <= L` holds (the caller knows it holds at `e' = W`).
/// Starts from the exact rational answer, and steps to where the double predicate flips
/// only when the two could differ (at a tie, or within the doubles' rounding of one).
pub(super) fn first_fit(prev: u64, curr: u64, c: u64, l: u64, period: u64, from: u64) -> u64 {
    if prev == 0 {
        // `0 · x / W` is 0 in doubles too: `curr + c <= l` fits at once.
        return period - from;
    }
    // Exact: W - e' <= room·W/prev.
    let room = l - curr - c;
    let e = (period - most_left(room, period, prev)).max(from);
    // Off a tie by more than the doubles' rounding, they decide as the integers do: `e`
    // fits and `e - 1` does not, and the search below would not move. No division then.
    let clear = |e: u64| clear_of_rounding(prev, curr + c, room, period, e);
    if (e == period || clear(e)) && (e == from || clear(e - 1)) {
        return period - e;
    }
    first_fit_by_doubles(prev, curr, c, l, period, from, e)
}

/// Whether `prev·(W-e)/W + rest <= rest + room` (`rest` = `curr + c`) comes out the same
/// in doubles as in integers: the sides differ by more than the doubles' rounding. Every
/// input is an integer below 2⁵³ (periods up to a year, counts up to `MAX_DEBT` plus a
/// limit), so exact as a double; each of the four operations of [`fits`] is within 2⁻⁵³ of
/// exact, so the `V` it computes is within `4.01·2⁻⁵³·V < 2⁻⁵⁰·(prev + rest)` of the true
/// value. A difference of the sides of at least that (times `W`, in integers) stands; so
/// does no difference at all when every step is exact.
fn clear_of_rounding(prev: u64, rest: u64, room: u64, period: u64, e: u64) -> bool {
    // In 64-bit words when the largest products fit one (the counts and periods of every
    // quota short of extreme debt): the same comparisons, without 128-bit arithmetic.
    let words = || Some((prev.checked_add(rest)?.checked_mul(period)?, room.checked_mul(period)?));
    if let Some((span, free)) = words() {
        let used = prev * (period - e); // at most `prev·W <= span`
        let off = used.abs_diff(free);
        return off > span >> 50 || (off == 0 && used < 1 << 53);
    }
    let used = u128::from(prev) * u128::from(period - e);
    let free = u128::from(room) * u128::from(period);
    let bound = (((u128::from(prev) + u128::from(rest)) * u128::from(period)) >> 50) + 1;
    let off = used.abs_diff(free);
    // An exact tie (`W` a multiple of `prev`, as 60 s is of small counts) is computed
    // exactly in doubles when the product is: `used / W` is then the integer `room`.
    off >= bound || (off == 0 && used < 1 << 53)
}

/// The first fit found by evaluating [`fits`] itself from the exact guess `e`.
pub(super) fn first_fit_by_doubles(prev: u64, curr: u64, c: u64, l: u64, period: u64, from: u64, mut e: u64) -> u64 {
    let fits_at = |e: u64| fits(prev, curr, e, period, c, l);
    while e < period && !fits_at(e) {
        e += 1;
    }
    while e > from && fits_at(e - 1) {
        e -= 1;
    }
    period - e
}

/// `min(room·period/prev, period)`, in 64 bits when the product fits (a 128-bit division is
/// a library call, on the allowed path of every decision). `prev` is not 0.
pub(super) fn most_left(room: u64, period: u64, prev: u64) -> u64 {
    match room.checked_mul(period) {
        Some(product) => (product / prev).min(period),
        None => {
            let left = (u128::from(room) * u128::from(period) / u128::from(prev)).min(u128::from(period));
            u64::try_from(left).unwrap_or(period)
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::quota::Quota;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5_000, ..ProptestConfig::default() })]

        /// The integer path decides, counts and times exactly as the doubles do, on states
        /// with and without a previous window, near and at the limit, costs of 0 to past it.
        #[test]
        fn the_integer_path_is_the_doubles_path(
            limit in prop_oneof![Just(1u64), 1u64..5, 1u64..1_000, Just(1 << 32)],
            period in prop_oneof![Just(1u64), Just(60_000_000), 1u64..10_000_000_000],
            prev in prop_oneof![Just(0u64), 0u64..1_100, Just(1 << 46)],
            curr in prop_oneof![Just(0u64), 0u64..1_100, Just(1 << 46)],
            cost in prop_oneof![Just(0u64), Just(1), 0u64..1_100, Just(u64::MAX)],
            at in 0u64..=1_000,
        ) {
            let window = 1_700_000_000_000_000 / period;
            let e = period * at / 1_000 % period;
            let now = window * period + e;
            let quota = Quota::try_new(limit, std::time::Duration::from_micros(period));
            prop_assume!(quota.is_ok());
            let p = Params { cost, ..Params::new(quota.unwrap()) };
            let s = SlidingWindowCounter { window, prev, curr, born: 1 };
            let d = s.decide(&p, now);
            let doubles = SlidingWindowCounter::decide_in_doubles(prev, curr, &p, e);
            prop_assert_eq!(d, doubles);
        }

        /// The next unit's shortcut is the first fit it stands for, ties and all.
        #[test]
        fn the_next_unit_is_the_first_fit(
            l in prop_oneof![1u64..100, 1u64..=1 << 32],
            period in prop_oneof![Just(60_000_000u64), 1u64..1_000, 1u64..=366 * 86_400 * 1_000_000],
            share in 0.0f64..=1.0,
            divides in prop::bool::ANY,
        ) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            let mut used = ((l as f64 * share) as u64).clamp(1, l);
            if divides {
                // A tie: `used` divides the period (their greatest common divisor).
                let (mut a, mut b) = (used, period);
                while b != 0 {
                    (a, b) = (b, a % b);
                }
                used = a;
            }
            prop_assert_eq!(next_unit(used, l, period), period - first_fit(used, 0, l - used + 1, l, period, 0));
        }
    }
}
