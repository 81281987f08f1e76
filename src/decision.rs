//! [`Decision`]: what a store decided for one rule.

use std::time::Duration;

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
