//! The [`Store`] trait's methods for [`RedisStore`]: each forwards to the call that does
//! it (`call.rs`, `batch.rs`, `cluster.rs`), and the first check counts the servers again
//! (`heartbeat.rs`).

use std::future::Future;
use std::time::Duration;

use super::{batch, heartbeat, RedisStore};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Announced, Check, Outcome, Refund, Store};

impl RedisStore {
    async fn check_one_now(&self, check: &Check) -> Result<Outcome, StoreError> {
        // On the runtime that polls the check (where its flush task is spawned).
        match batch::Queue::runtime_for(&self.inner, check) {
            Some(rt) => self.queue.check(&self.inner, check, rt).await,
            None => self.inner.check_one(check).await,
        }
    }

    /// After the first check of a store a limiter counts servers on: starts the heartbeat
    /// if the limiter was built outside a runtime, and counts the servers again (see
    /// `presence.rs`), in a task of its own. After the check, not with it: the other
    /// servers, started with this one, have had one round trip more to announce
    /// themselves; and the answer waits for nothing.
    fn recount(&self) {
        let presence = &self.inner.presence;
        if presence.recount_now() {
            heartbeat::recount(&self.inner);
        } else if presence.stopped() {
            // Its runtime went away: this one runs it again.
            heartbeat::start(&self.inner);
        }
    }
}

impl Store for RedisStore {
    async fn check_one(&self, check: &Check) -> Result<Outcome, StoreError> {
        let outcome = self.check_one_now(check).await;
        self.recount();
        outcome
    }

    async fn check(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        let outcomes = self.inner.check(checks).await;
        self.recount();
        outcomes
    }

    /// The servers that announced themselves on this store in the last 3 s, as last
    /// counted (every second, and with this store's first check).
    fn servers(&self) -> Option<u64> {
        self.inner.presence.servers()
    }

    fn announce(&self) -> Announced {
        heartbeat::announce_limiter(&self.inner)
    }

    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.refund(refunds)
    }

    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.charge(charges)
    }

    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.inner.peek(check)
    }

    fn reset(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(rule, key, algorithm)
    }

    fn block(&self, check: &Check, duration: Duration) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.block(check, duration)
    }

    /// On a cluster, [`StoreError::NodeUnavailable`] while calls about other slots
    /// succeed: the deadline cut off a call to one failing node.
    fn timed_out(&self, checks: &[Check], deadline: Duration) -> StoreError {
        let slot = checks.first().and_then(|c| self.inner.slot_of(&c.key));
        self.inner.on_node(slot, StoreError::Timeout(deadline))
    }

    /// The store as built by `from_url`, `new`, `cluster` or `cluster_pool`, and its key
    /// prefix: a reconfigured copy (`response_timeout`, `with_clock`, …) counts into the
    /// same keys and keeps the identity; another prefix is another identity. Two stores
    /// built separately have two identities even on one server — as several servers do,
    /// or one process playing several in a test.
    fn identity(&self) -> Option<usize> {
        use std::hash::{Hash, Hasher};
        let config = &self.inner.config;
        // Fixed keys: the same inputs give the same identity in the whole process.
        let mut h = std::hash::DefaultHasher::new();
        config.identity.hash(&mut h);
        config.names.prefix.hash(&mut h);
        config.names.hashes_keys().hash(&mut h);
        #[allow(clippy::cast_possible_truncation, reason = "an identity, not a number")]
        Some(h.finish() as usize)
    }
}
