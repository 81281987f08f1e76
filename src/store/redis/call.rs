//! How one call to Redis is made: the connection to use, the command and its `NOSCRIPT`
//! fallback, the response timeout, and what an error means for the caller.

use std::sync::Arc;

use deadpool_redis::redis::{self, ErrorKind, RedisError, ServerErrorKind, Value};

use super::conn::Link;
use super::origin::Origin;
use super::pool::{self, Timeouts};
use super::script::{
    parse_check, script_cmd, validate, Reply, Script, MODE_BLOCK, MODE_CHECK, MODE_FORCE, MODE_PEEK, SCRIPTS,
};
use super::{keys, security};
use crate::algorithm::Algorithm;
use crate::clock::SharedClock;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Check, Outcome, Refund};

#[derive(Clone)]
pub(super) struct Config {
    pub(super) origin: Origin,
    /// Where the store connects to, for messages: `host:port`, never a password.
    pub(super) addr: String,
    /// The prefix, and how client keys appear in names.
    pub(super) names: keys::Names,
    pub(super) timeouts: Timeouts,
    pub(super) clock: Option<SharedClock>,
    /// Made with the store, kept by every store built from it (`response_timeout`, …):
    /// with the prefix, the store's identity (`Store::identity`).
    pub(super) identity: usize,
    /// The most single-rule decisions one batch script call carries; 1: no batching.
    pub(super) max_batch: usize,
}

pub(super) struct Inner {
    pub(super) config: Config,
    pub(super) link: Arc<Link>,
    /// This store's part in the count of servers sharing it.
    pub(super) presence: super::presence::Presence,
}

impl Inner {
    pub(super) fn unavailable(&self, why: &str) -> StoreError {
        StoreError::Unavailable(format!("redis at {} is not connected: {why}", self.config.addr))
    }

    fn error(&self, e: &RedisError) -> StoreError {
        let unavailable = e.is_io_error()
            || e.is_unrecoverable_error()
            || matches!(
                e.kind(),
                ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::BusyLoading
                ) | ErrorKind::ClusterConnectionNotFound
            );
        if e.is_timeout() {
            StoreError::Timeout(self.config.timeouts.response)
        } else if unavailable {
            StoreError::Unavailable(format!("redis at {}: {}", self.config.addr, security::explain(e)))
        } else {
            StoreError::Backend(format!("redis at {}: {}", self.config.addr, security::explain(e)))
        }
    }

    /// `err` of a call about cluster slot `slot`, as [`StoreError::NodeUnavailable`]
    /// while other slots answer (one node failed, not the store).
    pub(super) fn on_node(&self, slot: Option<u16>, err: StoreError) -> StoreError {
        match (slot, err) {
            (Some(slot), err @ (StoreError::Timeout(_) | StoreError::Unavailable(_)))
                if self.link.others_answer(slot) =>
            {
                StoreError::NodeUnavailable(format!(
                    "redis at {}: the node serving slot {slot} failed while the others answer ({err})",
                    self.config.addr
                ))
            }
            (_, err) => err,
        }
    }

    /// The script command for `checks`, at `now`, else the store's clock, else the
    /// server's `TIME`.
    pub(super) fn script_cmd(
        &self,
        verb: &str,
        script: &str,
        checks: &[&Check],
        ats: &[u64],
        mode: &str,
        now: Option<u64>,
    ) -> redis::Cmd {
        let now = now.or_else(|| self.config.clock.as_ref().map(SharedClock::now));
        script_cmd(verb, script, &self.config.names, checks, ats, mode, now)
    }

    /// The connection to use: at once when there is one (every request but the first); the
    /// rare wait for one is boxed so that it does not enlarge every request's future.
    pub(super) async fn connection(&self) -> Result<(pool::Conn, u64), StoreError> {
        match self.link.ready() {
            Some(ready) => Ok(ready),
            None => Box::pin(self.link.get(self.config.timeouts.response)).await.map_err(|why| {
                StoreError::NotConnected(format!("redis at {} is not connected: {why}", self.config.addr))
            }),
        }
    }

    /// The cluster slot of a call about `key` (`None` on a standalone server): the
    /// connection tracks failures per slot, to notice a node that stopped answering.
    pub(super) fn slot_of(&self, key: &Key) -> Option<u16> {
        self.config.origin.is_cluster().then(|| self.config.names.slot(key))
    }

    /// Sends `cmd` (about keys of `slot`) on `conn` within the response timeout (a
    /// multiplexed connection keeps it itself, per command); on `NOSCRIPT`, sends `fallback`.
    pub(super) async fn query(
        &self,
        mut conn: pool::Conn,
        generation: u64,
        slot: Option<u16>,
        cmd: &redis::Cmd,
        fallback: Option<&(dyn Fn() -> redis::Cmd + Sync)>,
    ) -> Result<Value, StoreError> {
        let conn_times_out = conn.times_out_itself();
        // A call dropped unanswered (the caller's deadline is shorter than the response
        // timeout, or the caller left) counts as a timeout of its slot and connection
        // once it has waited a while: a hung node is noticed whatever the deadline.
        let mut pending =
            Pending { link: &self.link, generation, slot, started: std::time::Instant::now(), done: false };
        let run = async {
            match conn.query(cmd).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => match fallback {
                    Some(f) => conn.query(&f()).await,
                    None => Err(e),
                },
                other => other,
            }
        };
        let answer = if conn_times_out {
            Ok(run.await)
        } else {
            // Boxed: the timer would enlarge every request's future, also where unused. As
            // long as the node connections' own timeout: a request dropped sooner may never
            // be sent, and what the fallback admitted for it (issue 26) never counted.
            let timeout = self.config.timeouts.response.max(pool::MIN_NODE_RESPONSE);
            Box::pin(tokio::time::timeout(timeout, run)).await
        };
        pending.done = true;
        match answer {
            Err(_) => {
                self.link.on_timeout(generation, slot);
                Err(self.on_node(slot, StoreError::Timeout(self.config.timeouts.response)))
            }
            Ok(Err(e)) => {
                self.link.on_error(generation, slot, &e);
                Err(self.on_node(slot, self.error(&e)))
            }
            Ok(Ok(v @ Value::ServerError(_))) => {
                let e = v
                    .extract_error()
                    .err()
                    .unwrap_or_else(|| RedisError::from((ErrorKind::UnexpectedReturnType, "server error")));
                self.link.on_error(generation, slot, &e);
                Err(self.error(&e))
            }
            Ok(Ok(v)) => {
                self.link.on_ok(slot);
                Ok(v)
            }
        }
    }

    /// Runs `script` over `checks` (with each one's `at`, for refunds) by `EVALSHA`, by
    /// `EVAL` when the server does not know it.
    async fn eval(
        &self,
        script: &Script,
        checks: &[&Check],
        ats: &[u64],
        mode: &str,
        now: Option<u64>,
    ) -> Result<Value, StoreError> {
        checks.iter().try_for_each(|c| validate(c))?;
        let (conn, generation) = self.connection().await?;
        let evalsha = self.script_cmd("EVALSHA", &script.sha, checks, ats, mode, now);
        let eval = || self.script_cmd("EVAL", script.text, checks, ats, mode, now);
        let slot = checks.first().and_then(|c| self.slot_of(&c.key));
        self.query(conn, generation, slot, &evalsha, Some(&eval)).await
    }

    /// Runs a check script over `checks` (all in one slot, or standalone).
    pub(super) async fn run_check(&self, checks: &[&Check], mode: &str) -> Result<Reply, StoreError> {
        let reply = self.eval(SCRIPTS.check_for(checks), checks, &[], mode, None).await?;
        parse_check(&reply, checks, mode)
    }

    /// Runs the refund script over `refunds` (all in one slot, or standalone).
    pub(super) async fn run_refund(&self, refunds: &[&Refund]) -> Result<(), StoreError> {
        let checks: Vec<&Check> = refunds.iter().map(|r| &r.check).collect();
        let ats: Vec<u64> = refunds.iter().map(|r| r.taken.at).collect();
        match self.eval(&SCRIPTS.refund, &checks, &ats, MODE_CHECK, None).await? {
            Value::Int(_) => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected reply from the tollgate refund script: {other:?}"))),
        }
    }

    pub(super) async fn check_one(&self, check: &Check) -> Result<Outcome, StoreError> {
        let reply = self.run_check(&[check], MODE_CHECK).await?;
        reply.outcomes.into_iter().next().flatten().ok_or_else(|| StoreError::Backend("a rule got no decision".into()))
    }

    pub(super) async fn refund(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        let refunds: Vec<&Refund> = refunds.iter().collect();
        self.per_slot(&refunds, |r| &r.check.key, |group| async move { self.run_refund(&group).await }).await
    }

    /// Charges: one forced call per slot (standalone: one), each slot on its own — a
    /// charge is no decision, so there is nothing to roll back when another slot fails.
    pub(super) async fn charge(&self, charges: &[Check]) -> Result<(), StoreError> {
        let charges: Vec<&Check> = charges.iter().filter(|c| c.params.cost > 0).collect();
        self.per_slot(
            &charges,
            |c| &c.key,
            |group| async move {
                let reply = self.eval(&SCRIPTS.multi, &group, &[], MODE_FORCE, None).await?;
                parse_check(&reply, &group, MODE_FORCE).map(drop)
            },
        )
        .await
    }

    pub(super) async fn peek(&self, check: &Check) -> Result<Decision, StoreError> {
        let reply = self.run_check(&[check], MODE_PEEK).await?;
        let outcome = reply.outcomes.into_iter().next().flatten();
        outcome.map(|o| o.decision).ok_or_else(|| StoreError::Backend("peek got no decision".into()))
    }

    /// Blocks `check`'s key under its rule for `duration` from the server's now (lifts
    /// its block for zero): one call of the check script in block mode.
    pub(super) async fn block(&self, check: &Check, duration: std::time::Duration) -> Result<(), StoreError> {
        let mut check = check.clone();
        check.params.block_us = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX).min(1 << 52);
        check.params.blockable = true;
        match self.eval(&SCRIPTS.multi, &[&check], &[], MODE_BLOCK, None).await? {
            Value::Array(_) => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected reply from the tollgate block script: {other:?}"))),
        }
    }

    pub(super) async fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        let (conn, generation) = self.connection().await?;
        let mut cmd = redis::cmd("DEL");
        // The state and the block (`Rule::block_for`), in one slot.
        cmd.arg(self.config.names.name(rule, key, algorithm)).arg(self.config.names.block_name(rule, key));
        self.query(conn, generation, self.slot_of(key), &cmd, None).await.map(drop)
    }
}

/// How long a call must have waited unanswered for its drop to count as a timeout.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_millis(5);

/// A call in flight: dropped before its answer, after [`ABANDONED_AFTER`], it counts as a
/// timeout of its connection (and slot).
struct Pending<'a> {
    link: &'a Arc<Link>,
    generation: u64,
    slot: Option<u16>,
    started: std::time::Instant,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done && self.started.elapsed() >= ABANDONED_AFTER {
            self.link.on_timeout(self.generation, self.slot);
        }
    }
}
