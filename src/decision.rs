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
///     format!("{} requests left", d.remaining)
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may pass.
    pub allowed: bool,
    /// The rule's limit (units per period).
    pub limit: u64,
    /// Units still available right now after this request (never below 0).
    pub remaining: u64,
    /// Time until the quota is fully restored (nothing of it in use).
    pub reset_after: Duration,
    /// Time until more of the quota is available than `remaining`: when allowed, until at
    /// least one more unit would fit (draft-ietf-httpapi-ratelimit-headers-10's `t`, "the
    /// number of seconds until additional quota is made available"); when rejected, the
    /// `retry_after` (or `reset_after` for a request that can never be accepted). The
    /// rate-limit headers send this; see [`crate::headers`].
    pub refill_after: Duration,
    /// When rejected: the earliest time after which the same request would be accepted
    /// if nobody else consumed anything. `None` when allowed, and when the request can
    /// never be accepted (its cost is above the capacity).
    pub retry_after: Option<Duration>,
    /// Leaky bucket only: how long to wait before forwarding the request.
    pub delay: Duration,
}

impl Decision {
    /// `Retry-After` as the headers send it: whole seconds, rounded up, at least 1.
    /// `None` when allowed, and when the request can never be accepted.
    #[must_use]
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(|d| ceil_secs(d).max(1))
    }

    /// The seconds every rate-limit header names, rounded up (the IETF `t`, and
    /// `X-RateLimit-Reset` less the current Unix time): on a rejection, the
    /// [`Decision::retry_after_secs`] (when the same request is next admitted); when
    /// allowed, [`Decision::refill_after`] (when more quota is available).
    #[must_use]
    pub fn reset_secs(&self) -> u64 {
        self.retry_after_secs().unwrap_or_else(|| ceil_secs(self.refill_after))
    }

    /// Whether this allowed decision leaves the rule with `share` or more of its quota in
    /// use (`share` in (0, 1]; 0.8: at most a fifth left): a warning before clients are
    /// rejected, as Envoy's `near_limit`. The limiter counts these in the metric
    /// `tollgate_near_limit_total` (see `LimiterBuilder::near_limit`).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # let d = |remaining| tollgate::Decision { allowed: true, limit: 100, remaining,
    /// #     reset_after: Duration::ZERO, refill_after: Duration::ZERO, retry_after: None, delay: Duration::ZERO };
    /// assert!(d(20).is_near_limit(0.8));
    /// assert!(!d(21).is_near_limit(0.8));
    /// ```
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn is_near_limit(&self, share: f64) -> bool {
        let used = self.limit.saturating_sub(self.remaining) as f64;
        self.allowed && self.limit > 0 && used >= share * self.limit as f64
    }

    pub(crate) fn allow(limit: u64, remaining: u64, reset_after_us: u64, refill_after_us: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            reset_after: Duration::from_micros(reset_after_us),
            refill_after: Duration::from_micros(refill_after_us),
            retry_after: None,
            delay: Duration::ZERO,
        }
    }

    /// Refused by a block that ends in `left_us` (see [`crate::algorithm::blocking`]).
    pub(crate) fn blocked(limit: u64, left_us: u64, reset_after: Duration) -> Self {
        let left = Duration::from_micros(left_us.max(1));
        Self {
            allowed: false,
            limit,
            remaining: 0,
            reset_after: reset_after.max(left),
            refill_after: left,
            retry_after: Some(left),
            delay: Duration::ZERO,
        }
    }

    pub(crate) fn reject(limit: u64, remaining: u64, reset_after_us: u64, retry_after_us: Option<u64>) -> Self {
        let retry_after = retry_after_us.map(|us| Duration::from_micros(us.max(1)));
        let reset_after = Duration::from_micros(reset_after_us);
        Self {
            allowed: false,
            limit,
            remaining,
            reset_after,
            refill_after: retry_after.unwrap_or(reset_after),
            retry_after,
            delay: Duration::ZERO,
        }
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
