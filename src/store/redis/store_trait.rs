//! The [`Store`] trait's methods for [`RedisStore`], over the calls of `call.rs`,
//! `batch.rs` and `cluster.rs`; the first check counts the servers again (`heartbeat.rs`).

use std::time::Duration;

use deadpool_redis::redis::{self, Value};

use super::script::{parse_check, MODE_BLOCK, MODE_CHECK, MODE_FORCE, MODE_PEEK, SCRIPTS};
use super::{batch, heartbeat, RedisStore};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Announced, Check, Outcome, Refund, Store};

impl RedisStore {
    /// After the first check of a store a limiter counts servers on: starts the heartbeat if
    /// the limiter was built outside a runtime, and counts again (see `presence.rs`) in a
    /// task of its own, after the check: the servers started with this one have had one
    /// round trip more to announce themselves, and the answer waits for nothing.
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
        // On the runtime that polls the check (where its flush task is spawned).
        let outcome = match batch::Queue::runtime_for(&self.inner, check) {
            Some(rt) => self.queue.check(&self.inner, check, rt).await,
            None => self.inner.run_one(check, MODE_CHECK, "a rule got no decision").await,
        };
        self.recount();
        outcome
    }

    async fn check(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        // A multi-check in one slot is group-committed as single-rule checks are (`batch.rs`).
        let outcomes = match batch::Queue::runtime_for_many(&self.inner, checks) {
            Some(rt) => self.queue.check_many(&self.inner, checks, rt).await,
            None => self.inner.check(checks).await,
        };
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

    async fn refund(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        // Releases of permits (issue 42) are group-committed (`release.rs`).
        let permits = refunds.iter().all(|r| r.check.algorithm == crate::algorithm::Algorithm::Concurrent);
        if permits && !refunds.is_empty() && self.inner.config.max_batch > 1 {
            if let Some(answer) = self.releases.release(&self.inner, refunds) {
                return answer.await.unwrap_or_else(|_| {
                    Err(StoreError::Unavailable("the release's flush task ended with its runtime".into()))
                });
            }
        }
        let refunds: Vec<&Refund> = refunds.iter().collect();
        self.inner
            .per_slot(&refunds, |r| &r.check.key, |group| async move { self.inner.run_refund(&group).await })
            .await
    }

    /// One call per cluster slot (issue 42): every permit this server holds there.
    async fn renew(&self, permits: &[Refund]) -> Result<(), StoreError> {
        let permits: Vec<&Refund> = permits.iter().collect();
        self.inner.per_slot(&permits, |r| &r.check.key, |group| async move { self.inner.run_renew(&group).await }).await
    }

    async fn charge(&self, charges: &[Check]) -> Result<(), StoreError> {
        // One forced call per slot, each on its own: a charge is no decision, so there is
        // nothing to roll back when another slot fails.
        let charges: Vec<&Check> = charges.iter().filter(|c| c.params.cost > 0).collect();
        self.inner
            .per_slot(
                &charges,
                |c| &c.key,
                |group| async move {
                    let reply = self.inner.eval(&SCRIPTS.multi, &group, &[], MODE_FORCE).await?;
                    parse_check(&reply, &group, MODE_FORCE).map(drop)
                },
            )
            .await
    }

    async fn peek(&self, check: &Check) -> Result<Decision, StoreError> {
        self.inner.run_one(check, MODE_PEEK, "peek got no decision").await.map(|o| o.decision)
    }

    async fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (conn, generation) = inner.connection().await?;
        let mut cmd = redis::cmd("DEL");
        // The state and the block (`Rule::block_for`), in one slot.
        cmd.arg(inner.config.names.name(rule, key, algorithm)).arg(inner.config.names.block_name(rule, key));
        inner.query(conn, generation, inner.slot_of(key), &cmd, None).await.map(drop)
    }

    async fn block(&self, check: &Check, duration: Duration) -> Result<(), StoreError> {
        // One call of the check script in block mode.
        let mut check = check.clone();
        check.params.block_us = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX).min(1 << 52);
        check.params.blockable = true;
        match self.inner.eval(&SCRIPTS.multi, &[&check], &[], MODE_BLOCK).await? {
            Value::Array(_) => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected reply from the tollgate block script: {other:?}"))),
        }
    }

    /// On a cluster, [`StoreError::NodeTimeout`] while calls about other slots succeed: the
    /// deadline cut off a call to one stalled node. A call over several slots is named after
    /// the slot that did not answer (see `Slots::unanswered`), not its first check's: that
    /// one may be a healthy slot that answered, and a plain timeout would have the breaker
    /// stop the healthy nodes too.
    fn timed_out(&self, checks: &[Check], deadline: Duration) -> StoreError {
        let slots: smallvec::SmallVec<[u16; 4]> = checks.iter().filter_map(|c| self.inner.slot_of(&c.key)).collect();
        let slot = self.inner.link.unanswered(&slots);
        self.inner.on_node(slot, StoreError::Timeout(deadline))
    }

    /// On Redis's own `TIME`, not on a test clock ([`RedisStore::with_clock`]): quota
    /// slices lapse on this process's clock, which runs at the rate of the server's.
    fn real_clock(&self) -> bool {
        self.inner.config.clock.is_none()
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
