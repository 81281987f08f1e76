//! Support tooling by rule name and key: block a key by hand, look at what a rule would
//! decide, forget a key's state.

use std::time::Duration;

use super::Limiter;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::quota::Quota;
use crate::store::{Check, Store};

impl<St: Store, I: ?Sized + 'static> Limiter<St, I> {
    /// Blocks `key` under rule `rule` for `duration` from now, on every server that
    /// shares the store: until then the key is refused outright, with the rest of the
    /// block as its `Retry-After`, as a [`Rule::block_for`](crate::Rule::block_for) penalty refuses it. A block
    /// replaces the key's earlier one (a penalty's too); `Duration::ZERO` lifts it, and so
    /// does [`Limiter::reset`]. `Ok(false)` when there is no such rule.
    ///
    /// The rule must be able to block: built with [`Rule::blockable`](crate::Rule::blockable) or
    /// [`Rule::block_for`](crate::Rule::block_for) (on Redis, its checks then read the key's block).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryStore, Quota, Rule};
    ///
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .add_rule(Rule::new("api", Quota::per_minute(100), |user: &str| Some(user.to_owned())).blockable())
    ///     .build()?;
    /// limiter.block("api", "mallory", Duration::from_secs(24 * 3600)).await?; // a day
    /// let verdict = limiter.check("mallory").await;
    /// assert!(verdict.is_rejected());
    /// assert!(verdict.retry_after() > Some(Duration::from_secs(23 * 3600)));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Invalid`] for a rule that cannot block (neither
    /// [`Rule::blockable`](crate::Rule::blockable) nor [`Rule::block_for`](crate::Rule::block_for)), or the store's error (no deadline or
    /// circuit breaker applies here).
    pub async fn block(&self, rule: &str, key: impl Into<Key>, duration: Duration) -> Result<bool, StoreError> {
        let set = self.rules.load();
        let Some((i, r)) = set.find(rule) else { return Ok(false) };
        if !r.params(r.quota, 1).reads_block() {
            return Err(StoreError::Invalid(format!(
                "rule {rule:?} cannot be blocked by hand: build it with Rule::blockable() (or Rule::block_for)"
            )));
        }
        let key = key.into();
        let check =
            Check { rule: r.name.clone(), key, algorithm: r.algorithm_or(set.algorithm), params: r.params(r.quota, 1) };
        let id = set.id(i);
        drop(set);
        self.holders.store.block(&check, duration).await?;
        // A rejection this process cached for the key may end before a new block, or
        // after a lifted one.
        self.runtime.cache.forget(id, &check.key);
        Ok(true)
    }

    /// What rule `rule` would decide now for one unit of `key`, without consuming
    /// anything ("why is this customer limited?"): `remaining` counts what would be left
    /// after that unit. `Ok(None)` when there is no such rule. Uses the quota given to
    /// [`Rule::new`](crate::Rule::new): for a rule whose quota is chosen per input ([`Rule::quota_fn`](crate::Rule::quota_fn)), use
    /// [`Limiter::peek_with`].
    ///
    /// # Errors
    ///
    /// The store's error (no deadline or circuit breaker applies here).
    pub async fn peek(&self, rule: &str, key: impl Into<Key>) -> Result<Option<Decision>, StoreError> {
        let quota = self.rules.load().find(rule).map(|(_, r)| r.quota);
        match quota {
            Some(quota) => self.peek_with(rule, key, quota).await,
            None => Ok(None),
        }
    }

    /// [`Limiter::peek`] under `quota` (e.g. the key's tier).
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn peek_with(
        &self,
        rule: &str,
        key: impl Into<Key>,
        quota: Quota,
    ) -> Result<Option<Decision>, StoreError> {
        let set = self.rules.load();
        let Some((_, r)) = set.find(rule) else { return Ok(None) };
        let check = Check {
            rule: r.name.clone(),
            key: key.into(),
            algorithm: r.algorithm_or(set.algorithm),
            params: r.params(quota, 1),
        };
        drop(set);
        self.holders.store.peek(&check).await.map(Some)
    }

    /// Forgets the state of `key` under rule `rule`, in the store and in this process's
    /// blocked-key cache: the key starts afresh. `Ok(false)` when there is no such rule.
    /// Other servers' blocked-key caches may still reject the key until their entry runs
    /// out (at most its `Retry-After`).
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn reset(&self, rule: &str, key: impl Into<Key>) -> Result<bool, StoreError> {
        let set = self.rules.load();
        let Some((i, r)) = set.find(rule) else { return Ok(false) };
        let key = key.into();
        self.holders.store.reset(rule, &key, r.algorithm_or(set.algorithm)).await?;
        self.runtime.cache.forget(set.id(i), &key);
        Ok(true)
    }
}
