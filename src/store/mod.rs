//! Where limiter state lives: the [`Store`] trait, [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
//! `RedisStore`.

use std::future::Future;
use std::sync::Arc;

use crate::algorithm::Params;
use crate::key::Key;
use crate::{Algorithm, Decision, StoreError};

#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

/// The decisions of one request's rules: inline for one rule, the common case.
pub(crate) type Decisions = smallvec::SmallVec<[Decision; 1]>;

/// One rule's check of one request.
#[derive(Debug, Clone)]
pub struct Check {
    /// The rule's name (unique per layer and store prefix).
    pub rule: Arc<str>,
    /// The key the rule limits.
    pub key: Key,
    /// The rule's algorithm.
    pub algorithm: Algorithm,
    /// Quota, cost, and max delay.
    pub params: Params,
}

/// A place that keeps limiter state and decides.
///
/// `check` decides every rule of one request in one call: the request is accepted only
/// if every rule accepts it, and a request rejected by any rule consumes nothing from
/// the others. Decisions come back in the order of `checks`.
pub trait Store: Send + Sync + 'static {
    /// Decides one rule: what `check(&[check])` decides, without a `Vec`. The layer calls
    /// this for the (common) requests that one rule applies to. The default calls `check`.
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let checks = std::slice::from_ref(check);
        let fut = self.check(checks);
        async move {
            fut.await?.into_iter().next().ok_or_else(|| StoreError::Backend("the store returned no decision".into()))
        }
    }

    /// Decides `checks` together; commits them only if all are allowed.
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Gives back the units of earlier accepted checks (count-by-outcome rules).
    fn refund(&self, checks: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What `check` would decide now, without consuming anything (support tooling).
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Forgets the state of one (rule, key, algorithm): the key starts afresh.
    fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm)
        -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether the store is in-process (no I/O): the layer then skips the deadline, the
    /// circuit breaker and the local blocked-key cache, which only pay off for a remote
    /// store. Default: `false`.
    fn is_local(&self) -> bool {
        false
    }
}

impl<S: Store> Store for Arc<S> {
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check_one(check)
    }
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        (**self).check(checks)
    }
    fn refund(&self, checks: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).refund(checks)
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).peek(check)
    }
    fn reset(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(rule, key, algorithm)
    }
    fn is_local(&self) -> bool {
        (**self).is_local()
    }
}
