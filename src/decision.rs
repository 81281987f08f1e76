//! [`Decision`]: what a store decided for one rule.

use std::time::Duration;

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The outcome of one rule for one request.
///
/// The middleware puts the `Decision` of the most restrictive rule into the request's
/// extensions, so handlers can read the remaining quota:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::Extension;
/// use tollgate::Decision;
///
/// async fn handler(Extension(d): Extension<Decision>) -> String {
///     format!("{} requests left", d.remaining())
/// }
/// # }
/// ```
///
/// A decision costs what is read of it: the store writes the numbers it decided on, and
/// each method works out its answer from them (a remaining count of a bucket is a
/// division, which a caller that asks only `allowed` never pays).
#[derive(Clone, Copy)]
pub struct Decision {
    /// Whether the request may pass.
    pub allowed: bool,
    /// The rule's limit (units per period).
    pub limit: u64,
    /// What is left, in `unit`s: `remaining` is `free / unit` (a bucket's free time over
    /// its emission interval; a window's count over 1).
    free: u64,
    unit: u64,
    /// µs until the quota is whole again.
    reset_us: u64,
    /// µs until more quota than `remaining` is available; [`BY_UNIT`]: until one more
    /// `unit` fits in `free`.
    refill_us: u64,
    /// µs until the same request would be accepted; [`NONE`]: allowed, or never.
    retry_us: u64,
    /// µs to wait before forwarding (the leaky bucket).
    delay_us: u64,
    /// Who decided (a byte of the padding after `allowed`).
    by: DecidedBy,
    /// When, µs since the Unix epoch on the deciding clock (0: made by hand).
    at_us: u64,
}

/// `refill_us`: worked out from `free` and `unit`.
const BY_UNIT: u64 = u64::MAX;
/// `retry_us`: no retry time.
const NONE: u64 = u64::MAX;

/// A duration in whole µs, below the sentinels.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).min(u64::MAX - 1)
}

impl Decision {
    /// A decision with no time in it (for tests of code that reads decisions: a handler,
    /// a response hook): `remaining` of `limit` left, every duration zero, no retry time.
    #[must_use]
    pub const fn new(allowed: bool, limit: u64, remaining: u64) -> Self {
        Self {
            allowed,
            limit,
            free: remaining,
            unit: 1,
            reset_us: 0,
            refill_us: 0,
            retry_us: NONE,
            delay_us: 0,
            by: DecidedBy::Store,
            at_us: 0,
        }
    }

    /// Units still available right now after this request (never below 0).
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.free / self.unit
    }

    /// Time until the quota is fully restored (nothing of it in use).
    #[must_use]
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_us)
    }

    /// Time until more of the quota is available than `remaining`: when allowed, until at
    /// least one more unit would fit (draft-ietf-httpapi-ratelimit-headers-10's `t`, "the
    /// number of seconds until additional quota is made available"); when rejected, the
    /// `retry_after` (or `reset_after` for a request that can never be accepted). The
    /// rate-limit headers send this; see [`crate::headers`].
    #[must_use]
    pub fn refill_after(&self) -> Duration {
        Duration::from_micros(self.refill_micros())
    }

    fn refill_micros(&self) -> u64 {
        if self.refill_us == BY_UNIT {
            self.unit - self.free % self.unit
        } else {
            self.refill_us
        }
    }

    /// When rejected: the earliest time after which the same request would be accepted
    /// if nobody else consumed anything. `None` when allowed, and when the request can
    /// never be accepted (its cost is above the capacity).
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_us != NONE).then(|| Duration::from_micros(self.retry_us))
    }

    /// Leaky bucket only: how long to wait before forwarding the request.
    #[must_use]
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us)
    }

    /// `Retry-After` as the headers send it: whole seconds, rounded up, at least 1.
    /// `None` when allowed, and when the request can never be accepted.
    #[must_use]
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(|d| ceil_secs(d).max(1))
    }

    /// The seconds every rate-limit header names, rounded up (the IETF `t`, and
    /// `X-RateLimit-Reset` less the current Unix time): on a rejection, the
    /// [`Decision::retry_after_secs`] (when the same request is next admitted); when
    /// allowed, [`Decision::refill_after`] (when more quota is available).
    #[must_use]
    pub fn reset_secs(&self) -> u64 {
        self.retry_after_secs().unwrap_or_else(|| ceil_secs(self.refill_after()))
    }

    /// Whether this allowed decision leaves the rule with `share` or more of its quota in
    /// use (`share` in (0, 1]; 0.8: at most a fifth left): a warning before clients are
    /// rejected, as Envoy's `near_limit`. The limiter counts these in the metric
    /// `tollgate_near_limit_total` (see `LimiterBuilder::near_limit`).
    ///
    /// ```
    /// # use tollgate::Decision;
    /// assert!(Decision::new(true, 100, 20).is_near_limit(0.8));
    /// assert!(!Decision::new(true, 100, 21).is_near_limit(0.8));
    /// ```
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn is_near_limit(&self, share: f64) -> bool {
        let used = self.limit.saturating_sub(self.remaining()) as f64;
        self.allowed && self.limit > 0 && used >= share * self.limit as f64
    }

    pub(crate) fn allow(limit: u64, remaining: u64, reset_after_us: u64, refill_after_us: u64) -> Self {
        Self {
            allowed: true,
            limit,
            free: remaining,
            unit: 1,
            reset_us: reset_after_us.min(u64::MAX - 1),
            refill_us: refill_after_us.min(u64::MAX - 1),
            retry_us: NONE,
            delay_us: 0,
            by: DecidedBy::Store,
            at_us: 0,
        }
    }

    /// Allowed, with `free / unit` left and the next unit when `free` next reaches a
    /// multiple of `unit` (the buckets and GCRA: `free` µs of capacity, `unit` µs a unit).
    pub(crate) fn allow_units(limit: u64, free: u64, unit: u64, reset_after_us: u64) -> Self {
        Self {
            allowed: true,
            limit,
            free,
            unit: unit.max(1),
            reset_us: reset_after_us.min(u64::MAX - 1),
            refill_us: BY_UNIT,
            retry_us: NONE,
            delay_us: 0,
            by: DecidedBy::Store,
            at_us: 0,
        }
    }

    /// Refused by a block that ends in `left_us` (see [`crate::algorithm::blocking`]).
    pub(crate) fn blocked(limit: u64, left_us: u64, reset_after: Duration) -> Self {
        let left = left_us.clamp(1, u64::MAX - 1);
        Self {
            allowed: false,
            limit,
            free: 0,
            unit: 1,
            reset_us: micros(reset_after).max(left),
            refill_us: left,
            retry_us: left,
            delay_us: 0,
            by: DecidedBy::Store,
            at_us: 0,
        }
    }

    pub(crate) fn reject(limit: u64, remaining: u64, reset_after_us: u64, retry_after_us: Option<u64>) -> Self {
        Self::reject_units(limit, remaining, 1, reset_after_us, retry_after_us)
    }

    /// Refused, with `free / unit` left (see [`Decision::allow_units`]).
    pub(crate) fn reject_units(
        limit: u64,
        free: u64,
        unit: u64,
        reset_after_us: u64,
        retry_after_us: Option<u64>,
    ) -> Self {
        let reset_us = reset_after_us.min(u64::MAX - 1);
        let retry_us = retry_after_us.map_or(NONE, |us| us.clamp(1, u64::MAX - 1));
        Self {
            allowed: false,
            limit,
            free,
            unit: unit.max(1),
            reset_us,
            refill_us: if retry_us == NONE { reset_us } else { retry_us },
            retry_us,
            delay_us: 0,
            by: DecidedBy::Store,
            at_us: 0,
        }
    }

    /// A decision from every value read of it (one made from another's, changed).
    pub(crate) fn from_parts(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        refill_after: Duration,
        retry_after: Option<Duration>,
        delay: Duration,
    ) -> Self {
        Self {
            allowed,
            limit,
            free: remaining,
            unit: 1,
            reset_us: micros(reset_after),
            refill_us: micros(refill_after),
            retry_us: retry_after.map_or(NONE, micros),
            delay_us: micros(delay),
            by: DecidedBy::Store,
            at_us: 0,
        }
    }

    /// Says `remaining` units are left, the rest unchanged.
    pub(crate) fn set_remaining(&mut self, remaining: u64) {
        self.refill_us = self.refill_micros();
        (self.free, self.unit) = (remaining, 1);
    }

    /// Says the same request is accepted after `retry` (`None`: never, or allowed).
    pub(crate) fn set_retry_after(&mut self, retry: Option<Duration>) {
        self.retry_us = retry.map_or(NONE, micros);
    }

    /// Says the quota is whole again after `reset`.
    pub(crate) fn set_reset_after(&mut self, reset: Duration) {
        self.reset_us = micros(reset);
    }

    /// Says more quota comes after `refill`.
    pub(crate) fn set_refill_after(&mut self, refill: Duration) {
        self.refill_us = micros(refill);
    }

    /// Says the request waits `delay` before it is forwarded.
    pub(crate) fn set_delay(&mut self, delay: Duration) {
        self.delay_us = micros(delay);
    }

    /// Who decided: the store, or (through a [`Limiter`](crate::Limiter)) the fallback
    /// while the store failed, the blocked-key cache, or a quota slice.
    #[must_use]
    pub fn decided_by(&self) -> DecidedBy {
        self.by
    }

    /// When it was decided: µs since the Unix epoch on the clock that decided it — the
    /// store's (Redis's `TIME`, the in-process store's clock, the fallback's), or, for a
    /// quota slice's decision, this server's reading of the store's clock. A bucket's
    /// bound (at most `B + r·Δ` admissions in any span `Δ`) holds on these readings. 0 for
    /// a decision made by hand ([`Decision::new`]).
    #[must_use]
    pub fn decided_at_micros(&self) -> u64 {
        self.at_us
    }

    /// Stamped with the clock reading it was decided at (µs since the Unix epoch).
    #[must_use]
    pub(crate) fn at(mut self, now: u64) -> Self {
        self.at_us = now;
        self
    }

    /// Says who decided.
    pub(crate) fn set_decided_by(&mut self, by: DecidedBy) {
        self.by = by;
    }
}

/// Two decisions are equal when what they say is (who decided is not compared).
impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed
            && self.limit == other.limit
            && self.remaining() == other.remaining()
            && self.reset_us == other.reset_us
            && self.refill_micros() == other.refill_micros()
            && self.retry_us == other.retry_us
            && self.delay_us == other.delay_us
    }
}

impl Eq for Decision {}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining())
            .field("reset_after", &self.reset_after())
            .field("refill_after", &self.refill_after())
            .field("retry_after", &self.retry_after())
            .field("delay", &self.delay())
            .field("decided_by", &self.by)
            .field("decided_at_micros", &self.at_us)
            .finish()
    }
}

/// Of the rejections offered, the one that makes its caller wait longest: one that can
/// never accept (no retry time) counts as longest; of equals, the last offered. The one
/// choice the store's, the blocked-key cache's and the fallback's rejections make.
pub(crate) struct Longest<T>(Option<(Duration, T)>);

impl<T> Longest<T> {
    pub(crate) fn new() -> Self {
        Self(None)
    }

    /// A rejection whose caller may retry after `retry_after`, and what names it.
    pub(crate) fn offer(&mut self, retry_after: Option<Duration>, what: T) {
        let wait = retry_after.unwrap_or(Duration::MAX);
        if self.0.as_ref().is_none_or(|(longest, _)| wait >= *longest) {
            self.0 = Some((wait, what));
        }
    }

    /// What names the longest wait, if any was offered.
    pub(crate) fn take(self) -> Option<T> {
        self.0.map(|(_, what)| what)
    }
}

/// Who decided a [`Verdict`](crate::verdict::Verdict) or a [`Decision`] (also at
/// `tollgate::verdict::DecidedBy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecidedBy {
    /// The store.
    Store,
    /// The in-process fallback limiter, while the store failed (an approximate limit:
    /// each rule's share for one server; its decisions' `limit` is the rule's quota, their
    /// `remaining` what is left of this server's share).
    Fallback,
    /// This process's cache of blocked keys: a rejection the store made earlier, still
    /// in force.
    LocalCache,
    /// A quota slice this server took from the store for the key (see
    /// [`Rule::slices`](crate::Rule::slices)): decided in memory, on units the store
    /// already counted.
    Slice,
}

impl DecidedBy {
    /// The `decided_by` label of `tollgate_decisions_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            DecidedBy::Store => "store",
            DecidedBy::Fallback => "fallback",
            DecidedBy::LocalCache => "cache",
            DecidedBy::Slice => "slice",
        }
    }
}
