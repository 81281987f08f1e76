//! How one call to Redis is made: the connection to use, the command and its `NOSCRIPT`
//! fallback, the response timeout, and what an error means for the caller.

use std::sync::Arc;

use deadpool_redis::redis::{self, ErrorKind, RedisError, ServerErrorKind, Value};

use super::conn::Link;
use super::origin::Origin;
use super::pool::{self, Timeouts};
use super::script::{parse_check, script_cmd, validate, Reply, Script, MODE_CHECK, SCRIPTS};
use super::{keys, security};
use crate::clock::SharedClock;
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

    /// `err` of a call about cluster slot `slot` while other slots answer (one node failed,
    /// not the store): a timeout as [`StoreError::NodeTimeout`] (sent, outcome unknown), a
    /// broken connection as [`StoreError::NodeUnavailable`].
    pub(super) fn on_node(&self, slot: Option<u16>, err: StoreError) -> StoreError {
        match (slot, err) {
            (Some(slot), err @ StoreError::Timeout(_)) if self.link.others_answer(slot) => {
                StoreError::NodeTimeout(format!(
                    "redis at {}: the node serving slot {slot} did not answer while the others do ({err})",
                    self.config.addr
                ))
            }
            (Some(slot), err @ StoreError::Unavailable(_)) if self.link.others_answer(slot) => {
                StoreError::NodeUnavailable(format!(
                    "redis at {}: the node serving slot {slot} failed while the others answer ({err})",
                    self.config.addr
                ))
            }
            (_, err) => err,
        }
    }

    /// The connection to use: at once when there is one (every request but the first); the
    /// rare wait for one is boxed so that it does not enlarge every request's future.
    pub(super) async fn connection(&self) -> Result<(pool::Conn, u64), StoreError> {
        match self.link.ready() {
            Some(ready) => Ok(ready),
            None => Box::pin(self.link.get(self.config.timeouts.response, false)).await.map_err(|why| {
                StoreError::NotConnected(format!("redis at {} is not connected: {why}", self.config.addr))
            }),
        }
    }

    /// The cluster slot of a call about `key` (`None` on a standalone server).
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
        // A multiplexed connection enforces the response timeout itself.
        let conn_times_out = matches!(conn, pool::Conn::Single(_));
        // Dropped unanswered (the caller's deadline, or the caller left), a call counts as a
        // timeout once it has waited a while: a hung node is noticed whatever the deadline.
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
            // Boxed: the timer would enlarge every request's future. No shorter than the node
            // connections' own: a request dropped sooner may never be sent (and never count).
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

    /// Runs `script` by `EVALSHA`, by `EVAL` when the server does not know it: `cmd(verb,
    /// SHA1 or text, now)` writes the command, `now` being the store's clock, else `None`
    /// for the server's `TIME`.
    pub(super) async fn eval_cmd(
        &self,
        script: &Script,
        slot: Option<u16>,
        cmd: impl Fn(&str, &str, Option<u64>) -> redis::Cmd + Sync,
    ) -> Result<Value, StoreError> {
        let (conn, generation) = self.connection().await?;
        let now = self.config.clock.as_ref().map(SharedClock::now);
        let eval = || cmd("EVAL", script.text, now);
        self.query(conn, generation, slot, &cmd("EVALSHA", &script.sha, now), Some(&eval)).await
    }

    /// Runs `script` over `checks` (with each one's `at`, for refunds).
    pub(super) async fn eval(
        &self,
        script: &Script,
        checks: &[&Check],
        ats: &[u64],
        mode: &str,
    ) -> Result<Value, StoreError> {
        checks.iter().try_for_each(|c| validate(c))?;
        let slot = checks.first().and_then(|c| self.slot_of(&c.key));
        let names = &self.config.names;
        self.eval_cmd(script, slot, |verb, script, now| script_cmd(verb, script, names, checks, ats, mode, now)).await
    }

    /// Runs a check script over `checks` (all in one slot, or standalone).
    pub(super) async fn run_check(&self, checks: &[&Check], mode: &str) -> Result<Reply, StoreError> {
        let reply = self.eval(SCRIPTS.check_for(checks), checks, &[], mode).await?;
        parse_check(&reply, checks, mode)
    }

    /// The outcome of the check script over one check (`none`: the error if it has none).
    pub(super) async fn run_one(&self, check: &Check, mode: &str, none: &str) -> Result<Outcome, StoreError> {
        let reply = self.run_check(&[check], mode).await?;
        reply.outcomes.into_iter().next().flatten().ok_or_else(|| StoreError::Backend(none.into()))
    }

    /// Runs the renew script over `permits` (all in one slot, or standalone; issue 42).
    pub(super) async fn run_renew(&self, permits: &[&Refund]) -> Result<(), StoreError> {
        let checks: Vec<&Check> = permits.iter().map(|r| &r.check).collect();
        let ats: Vec<u64> = permits.iter().map(|r| r.taken.at).collect();
        match self.eval(&SCRIPTS.renew, &checks, &ats, MODE_CHECK).await? {
            Value::Int(_) => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected reply from the tollgate renew script: {other:?}"))),
        }
    }

    /// Runs the release script over `permits` (releases of concurrency rules' permits only,
    /// all in one slot, or standalone): the refund script's work for them, straight-line.
    pub(super) async fn run_release(&self, permits: &[&Refund]) -> Result<(), StoreError> {
        let checks: Vec<&Check> = permits.iter().map(|r| &r.check).collect();
        let ats: Vec<u64> = permits.iter().map(|r| r.taken.at).collect();
        match self.eval(&SCRIPTS.release, &checks, &ats, MODE_CHECK).await? {
            Value::Int(_) => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected reply from the tollgate release script: {other:?}"))),
        }
    }

    /// Runs the refund script over `refunds` (all in one slot, or standalone).
    pub(super) async fn run_refund(&self, refunds: &[&Refund]) -> Result<(), StoreError> {
        let checks: Vec<&Check> = refunds.iter().map(|r| &r.check).collect();
        let ats: Vec<u64> = refunds.iter().map(|r| r.taken.at).collect();
        match self.eval(&SCRIPTS.refund, &checks, &ats, MODE_CHECK).await? {
            Value::Int(_) => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected reply from the tollgate refund script: {other:?}"))),
        }
    }
}

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
