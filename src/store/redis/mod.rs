//! [`RedisStore`]: limiter state shared by every server through Redis (standalone or
//! Redis Cluster).
//!
//! # How a decision is made
//!
//! One `EVALSHA` of a Lua script per decision (one per cluster slot touched): the script
//! reads the server's `TIME`, reads the rules' state, decides, and writes only when every
//! rule accepts. It returns the state it read, and the same pure functions that
//! `MemoryStore` uses compute the [`Decision`]s, so both stores decide bit for bit alike.
//! A script that disagrees with them is reported as [`StoreError::Backend`].
//!
//! # Keys
//!
//! `<prefix>:{<key>}:<rule>:<algorithm>:v1`, one Redis key per (rule, key): a packed
//! string (`GET`/`SET … PX`, at most three commands a decision with `TIME`) for every
//! algorithm but the sliding window log, which keeps a sorted set of one member per
//! accepted unit. The hash tag is the client key alone, so all rules of one key share a
//! cluster slot and are decided atomically; key and rule are escaped so that no bytes
//! can make two names collide or move the slot, and keys longer than
//! [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN) are stored as their SHA-256 digest.
//!
//! Every key has a TTL that ends when its state is the same as "never seen": idle keys
//! cost nothing. Under memory pressure Redis may evict limiter keys (and so forget what
//! clients consumed) with `allkeys-*` and, as every limiter key has a TTL, `volatile-*`
//! policies alike: for limits that must hold, use a dedicated instance with `noeviction`.
//!
//! # Several rules across cluster slots
//!
//! Rules whose keys sit in different slots are decided by one script per slot, at the
//! same time. When one slot rejects, the units taken by the slots that accepted are given
//! back: concurrent requests may briefly see them as taken (a little under-admission),
//! never more than the limit is admitted.
//!
//! # Credentials and TLS
//!
//! A password or an ACL user goes in the URL (`redis://[user]:password@host`); neither
//! shows in `Debug` output, errors or log lines. `rediss://` (feature `redis-tls`) connects
//! over TLS with rustls, trusting the system's CA store or the CAs given to
//! `RedisStore::tls_root_certificates`. Wrong credentials and untrusted certificates are a
//! [`StoreError`] at request time that says so, handled by the layer's fail mode.
//!
//! # Connections
//!
//! The store takes one multiplexed connection (or one cluster connection) out of its
//! deadpool pool and pipelines every request over clones of it: deadpool's per-checkout
//! `PING` never runs. When the connection breaks it is replaced by a background task;
//! until then requests fail at once with [`StoreError::Unavailable`] instead of waiting.
//! The only wait is a new store's very first request, for the first connection attempt
//! (at most the response timeout); [`RedisStore::ping`] at start-up connects ahead.

mod conn;
mod keys;
mod script;
mod security;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use deadpool_redis::redis::{self, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind, Value};

use self::conn::{Link, Origin, Timeouts};
use self::script::{parse_check, validate, write_rule_args, Reply, Script, MODE_CHECK, MODE_PEEK, SCRIPTS};
use super::{Check, Store};
use crate::clock::SharedClock;
use crate::key::Key;
use crate::{Algorithm, BuildError, Decision, StoreError};

/// Not part of the API: one check script call, see `RedisStore::__check_script_call`.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct ScriptCall {
    /// The script's SHA1, for `EVALSHA`.
    pub sha: String,
    /// The script, for `EVAL`.
    pub text: &'static str,
    /// The `EVALSHA` command, byte for byte as the store sends it.
    pub evalsha: redis::Cmd,
}

/// The default key prefix.
const DEFAULT_PREFIX: &str = "tollgate";
/// Default for [`RedisStore::response_timeout`].
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(100);
/// Default for [`RedisStore::connect_timeout`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Limiter state in Redis, shared by every server: standalone Redis or Redis Cluster,
/// through `deadpool-redis`.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
///
/// let store = RedisStore::from_url("redis://127.0.0.1:6379")?.prefix("myapp")?;
/// store.ping().await?; // start-up check: connects and asks the server
/// # Ok(()) }
/// ```
///
/// Clones share one connection. Decisions take one round trip (one `EVALSHA`); time
/// comes from the Redis server (`TIME`), so servers with skewed clocks agree. See the
/// [module docs](self) for the key layout, TTLs and cluster behaviour.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Config {
    origin: Origin,
    /// Where the store connects to, for messages: `host:port`, never a password.
    addr: String,
    prefix: Arc<str>,
    timeouts: Timeouts,
    clock: Option<SharedClock>,
}

struct Inner {
    config: Config,
    link: Arc<Link>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        f.debug_struct("RedisStore")
            .field("mode", &if c.origin.is_cluster() { "cluster" } else { "standalone" })
            .field("addr", &c.addr)
            .field("prefix", &c.prefix)
            .field("response_timeout", &c.timeouts.response)
            .field("connect_timeout", &c.timeouts.connect)
            .field("clock", &if c.clock.is_some() { "manual" } else { "redis TIME" })
            .field("tls", &security::describe(&c.origin))
            .field("connected", &self.inner.link.is_connected())
            .finish()
    }
}

/// `url` without its user name and password, for messages: everything up to the last `@`
/// (after the scheme, if any), so that a password with an unescaped `/`, `?` or `#` does
/// not end the user info early and get shown.
fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].rfind('@') {
        Some(at) => format!("{}***@{}", &url[..start], &url[start + at + 1..]),
        None => url.to_owned(),
    }
}

fn parse_url(url: &str) -> Result<redis::ConnectionInfo, BuildError> {
    let shown = redact(url);
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "valkey+unix" | "unix") => {}
        Some(other) => {
            return Err(BuildError::InvalidStore(format!(
                "redis URL {shown:?} has the scheme {other:?}: use redis://host:port \
                 (or rediss://, redis+unix://)"
            )))
        }
        None => {
            return Err(BuildError::InvalidStore(format!(
                "{shown:?} is not a redis URL: expected redis://[user:password@]host[:port][/db]"
            )))
        }
    }
    security::check_url(scheme.as_deref().unwrap_or_default(), url, &shown).map_err(BuildError::InvalidStore)?;
    url.into_connection_info().map_err(|e| {
        BuildError::InvalidStore(format!(
            "invalid redis URL {shown:?}: {e} (expected redis://[user:password@]host[:port][/db])"
        ))
    })
}

impl RedisStore {
    fn build(config: Config) -> Self {
        let link = Link::new(config.origin.clone(), config.timeouts);
        Self { inner: Arc::new(Inner { config, link }) }
    }

    fn with_config(config: Config) -> Result<Self, BuildError> {
        conn::build_pool(&config.origin, config.timeouts).map_err(BuildError::InvalidStore)?;
        Ok(Self::build(config))
    }

    /// A new store with a changed configuration (builders run before first use).
    fn rebuild(&self, f: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.inner.config.clone();
        f(&mut config);
        Self::build(config)
    }

    fn config(origin: Origin, addr: String) -> Config {
        Config {
            origin,
            addr,
            prefix: DEFAULT_PREFIX.into(),
            timeouts: Timeouts { response: RESPONSE_TIMEOUT, connect: CONNECT_TIMEOUT },
            clock: None,
        }
    }

    /// A store on the standalone Redis at `url` (`redis://[user:password@]host[:port][/db]`).
    ///
    /// Nothing is sent yet: the connection is made in the background at first use, or by
    /// [`RedisStore::ping`]. An unreachable server is not an error here but a
    /// [`StoreError`] at request time.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] when `url` is not a usable redis URL (it says why;
    /// passwords are never shown).
    pub fn from_url(url: &str) -> Result<Self, BuildError> {
        let info = parse_url(url)?;
        let addr = info.addr().to_string();
        Self::with_config(Self::config(Origin::Url(info), addr))
    }

    /// A store taking its connection from `pool`.
    ///
    /// The store takes one connection out of the pool for good and multiplexes every
    /// request over it; it comes back to the pool only to replace a broken one. Requests
    /// are bounded by [`RedisStore::response_timeout`] whatever the pool's settings.
    #[must_use]
    pub fn new(pool: deadpool_redis::Pool) -> Self {
        Self::build(Self::config(Origin::Pool(pool), "redis (application pool)".to_owned()))
    }

    /// A store on a Redis Cluster, reached through any of `urls` (the cluster's other
    /// nodes are discovered).
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] when `urls` is empty or one is not a usable redis URL.
    pub fn cluster<I, S>(urls: I) -> Result<Self, BuildError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let infos = urls.into_iter().map(|u| parse_url(u.as_ref())).collect::<Result<Vec<_>, _>>()?;
        if infos.is_empty() {
            return Err(BuildError::InvalidStore("no redis cluster URL given: pass at least one node".into()));
        }
        let addr = infos.iter().map(|i| i.addr().to_string()).collect::<Vec<_>>().join(",");
        Self::with_config(Self::config(Origin::ClusterUrls(infos), format!("cluster {addr}")))
    }

    /// A store on a Redis Cluster, taking its connection from `pool`.
    #[must_use]
    pub fn new_cluster(pool: deadpool_redis::cluster::Pool) -> Self {
        Self::build(Self::config(Origin::ClusterPool(pool), "redis cluster (application pool)".to_owned()))
    }

    /// Trusts the CA certificates in `pem` (one or more PEM `CERTIFICATE` blocks) for the
    /// `rediss://` connection, instead of the system's trust store: for a managed Redis or
    /// a server whose certificate a private CA signed. Call before the store is used.
    ///
    /// Without it, a `rediss://` store trusts the operating system's CA store (as
    /// `SSL_CERT_FILE` / `SSL_CERT_DIR` may point it elsewhere). The server's certificate
    /// must name the URL's host (a DNS name, or an IP address in its subject alternative
    /// names): there is no way to turn the check off.
    ///
    /// ```no_run
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/myapp/redis-ca.pem")?;
    /// let store = tollgate::RedisStore::from_url("rediss://:password@redis.internal:6380")?
    ///     .tls_root_certificates(&ca)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] when `pem` holds no certificate or a malformed one,
    /// when the store's URL is not `rediss://`, and for stores made by
    /// [`RedisStore::cluster`] (deadpool-redis builds cluster clients without custom roots:
    /// add the CA to the system's trust store) or from an application's pool (configure
    /// TLS on the pool).
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn tls_root_certificates(self, pem: &[u8]) -> Result<Self, BuildError> {
        let origin = match &self.inner.config.origin {
            Origin::Url(info) => {
                Origin::Url(security::with_root_certificates(info, pem).map_err(BuildError::InvalidStore)?)
            }
            Origin::ClusterUrls(_) => {
                return Err(BuildError::InvalidStore(
                    "root certificates cannot be given to a redis cluster store (deadpool-redis builds \
                     cluster clients without them): add the CA to the system's trust store"
                        .into(),
                ))
            }
            Origin::Pool(_) | Origin::ClusterPool(_) => {
                return Err(BuildError::InvalidStore(
                    "root certificates cannot be given to a store on an application's pool: \
                     configure TLS on the pool"
                        .into(),
                ))
            }
        };
        Ok(self.rebuild(|c| c.origin = origin))
    }

    /// Puts every key under `prefix` instead of `"tollgate"` (for several applications
    /// or environments sharing one Redis). Call before the store is used.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] when the prefix is empty or holds `{` or `}` (which
    /// would change the cluster slot of every key).
    pub fn prefix(self, prefix: &str) -> Result<Self, BuildError> {
        if prefix.is_empty() {
            return Err(BuildError::InvalidStore("the redis key prefix is empty".into()));
        }
        if prefix.contains(['{', '}']) {
            return Err(BuildError::InvalidStore(format!(
                "the redis key prefix {prefix:?} holds a brace: braces would change the cluster \
                 slot of every key"
            )));
        }
        Ok(self.rebuild(|c| c.prefix = prefix.into()))
    }

    /// How long one request to Redis may take before it fails with
    /// [`StoreError::Timeout`] (default 100 ms). The layer's own deadline applies on top.
    /// It is set on the connection the store takes, also when that comes from a pool given
    /// to [`RedisStore::new`] (whose other connections keep their own setting).
    /// Call before the store is used.
    #[must_use]
    pub fn response_timeout(self, timeout: Duration) -> Self {
        self.rebuild(|c| c.timeouts.response = timeout)
    }

    /// How long one background connection attempt may take, pool wait included
    /// (default 1 s). [`RedisStore::ping`] waits at most this for a connection. Call
    /// before the store is used.
    #[must_use]
    pub fn connect_timeout(self, timeout: Duration) -> Self {
        self.rebuild(|c| c.timeouts.connect = timeout)
    }

    /// Decides on the times of `clock` instead of the Redis server's `TIME` (tests of
    /// limits, with [`ManualClock`](crate::ManualClock)). Call before the store is used.
    ///
    /// Key TTLs are computed from the clock's time but run on the server's real clock:
    /// moving the clock ahead is fine (a state that has logically expired decides like a
    /// fresh one), but a test must finish a scenario before its keys expire in real time,
    /// so use quotas of seconds or longer. Do not pause tokio's clock in tests that talk
    /// to Redis: the paused clock jumps ahead while a task waits on the socket.
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    #[must_use]
    pub fn with_clock(self, clock: impl crate::Clock) -> Self {
        let clock = SharedClock(Arc::new(clock));
        self.rebuild(|c| c.clock = Some(clock))
    }

    /// Not part of the API (for `examples/loadtest.rs`, which measures the script alone as
    /// a baseline): what [`Store::check`] sends for `checks` on a standalone server, by
    /// `EVALSHA` of `sha` (or `EVAL` of `text` after a `NOSCRIPT`). May change in any release.
    ///
    /// # Errors
    ///
    /// As [`Store::check`], for quotas that Lua cannot compute exactly.
    #[doc(hidden)]
    pub fn __check_script_call(&self, checks: &[Check]) -> Result<ScriptCall, StoreError> {
        let checks: Vec<&Check> = checks.iter().collect();
        checks.iter().try_for_each(|c| validate(c))?;
        let script = SCRIPTS.check_for(&checks);
        let evalsha = self.inner.script_cmd("EVALSHA", &script.sha, &checks, MODE_CHECK, None);
        Ok(ScriptCall { sha: script.sha.clone(), text: script.text, evalsha })
    }

    /// Connects (if not yet connected) and sends `PING`: a start-up check that Redis is
    /// reachable.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection can be made within the connect
    /// timeout, [`StoreError::Timeout`] when the server does not answer in time, or the
    /// server's error.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (conn, generation) =
            inner.link.wait_connected(inner.config.timeouts.connect).await.map_err(|why| inner.unavailable(&why))?;
        match inner.query(conn, generation, &redis::cmd("PING"), None).await? {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            Value::Okay => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected answer to PING: {other:?}"))),
        }
    }
}

impl Inner {
    fn unavailable(&self, why: &str) -> StoreError {
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

    /// `verb` (`EVALSHA` or `EVAL`) of `script` (its SHA1 or text) over `checks`, written
    /// straight into one command: `KEYS` are the rules' names, `ARGV` the time (`now`,
    /// else the store's clock, else empty for the server's `TIME`), the mode, and each
    /// rule's 7 arguments. Call [`validate`] on every check first.
    fn script_cmd(&self, verb: &str, script: &str, checks: &[&Check], mode: &str, now: Option<u64>) -> redis::Cmd {
        let mut cmd = redis::Cmd::with_capacity(5 + 8 * checks.len(), script.len() + 16 + 96 * checks.len());
        cmd.arg(verb).arg(script).arg(checks.len());
        for c in checks {
            cmd.arg(keys::name(&self.config.prefix, &c.rule, &c.key, c.algorithm));
        }
        match now.or_else(|| self.config.clock.as_ref().map(SharedClock::now)) {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(mode);
        for c in checks {
            write_rule_args(&mut cmd, c);
        }
        cmd
    }

    /// The connection to use: at once when there is one (every request but the first); the
    /// rare wait for one is boxed so that it does not enlarge every request's future.
    async fn connection(&self) -> Result<(conn::Conn, u64), StoreError> {
        match self.link.ready() {
            Some(ready) => Ok(ready),
            None => Box::pin(self.link.get(self.config.timeouts.response)).await.map_err(|why| self.unavailable(&why)),
        }
    }

    /// Sends `cmd` on `conn` within the response timeout (a multiplexed connection keeps it
    /// itself, per command); on `NOSCRIPT`, sends `fallback`.
    async fn query(
        &self,
        mut conn: conn::Conn,
        generation: u64,
        cmd: &redis::Cmd,
        fallback: Option<&(dyn Fn() -> redis::Cmd + Sync)>,
    ) -> Result<Value, StoreError> {
        let conn_times_out = conn.times_out_itself();
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
            // Boxed: the timer would enlarge every request's future, also where unused.
            Box::pin(tokio::time::timeout(self.config.timeouts.response, run)).await
        };
        match answer {
            Err(_) => {
                self.link.on_timeout(generation);
                Err(StoreError::Timeout(self.config.timeouts.response))
            }
            Ok(Err(e)) => {
                self.link.on_error(generation, &e);
                Err(self.error(&e))
            }
            Ok(Ok(Value::ServerError(e))) => Err(StoreError::Backend(format!("redis at {}: {e:?}", self.config.addr))),
            Ok(Ok(v)) => {
                self.link.on_ok();
                Ok(v)
            }
        }
    }

    /// Runs `script` over `checks` by `EVALSHA`, by `EVAL` when the server does not know it.
    async fn eval(
        &self,
        script: &Script,
        checks: &[&Check],
        mode: &str,
        now: Option<u64>,
    ) -> Result<Value, StoreError> {
        checks.iter().try_for_each(|c| validate(c))?;
        let (conn, generation) = self.connection().await?;
        let evalsha = self.script_cmd("EVALSHA", &script.sha, checks, mode, now);
        let eval = || self.script_cmd("EVAL", script.text, checks, mode, now);
        self.query(conn, generation, &evalsha, Some(&eval)).await
    }

    /// Runs a check script over `checks` (all in one slot, or standalone).
    async fn run_check(&self, checks: &[&Check], mode: &str) -> Result<Reply, StoreError> {
        let reply = self.eval(SCRIPTS.check_for(checks), checks, mode, None).await?;
        parse_check(&reply, checks)
    }

    /// Runs the refund script over `checks` (all in one slot, or standalone), at `now`
    /// when given.
    async fn run_refund(&self, checks: &[&Check], now: Option<u64>) -> Result<(), StoreError> {
        match self.eval(&SCRIPTS.refund, checks, MODE_CHECK, now).await? {
            Value::Int(_) => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected reply from the tollgate refund script: {other:?}"))),
        }
    }

    /// The checks grouped so that each group is one script call: everything at once on
    /// a standalone server, one group per slot on a cluster.
    fn groups<'c>(&self, checks: &'c [Check]) -> Vec<Vec<&'c Check>> {
        if !self.config.origin.is_cluster() {
            return vec![checks.iter().collect()];
        }
        let mut groups: Vec<(u16, Vec<&Check>)> = Vec::new();
        for c in checks {
            let slot = keys::key_slot(&c.key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(c),
                None => groups.push((slot, vec![c])),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }

    async fn check_one(&self, check: &Check) -> Result<Decision, StoreError> {
        let reply = self.run_check(&[check], MODE_CHECK).await?;
        reply.decisions.into_iter().next().ok_or_else(|| StoreError::Backend("a rule got no decision".into()))
    }

    async fn check(&self, checks: &[Check]) -> Result<Vec<Decision>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let groups = self.groups(checks);
        if let [group] = groups.as_slice() {
            return Ok(self.run_check(group, MODE_CHECK).await?.decisions.into_vec());
        }
        // Several slots: each decides atomically, all at once; the units of slots that
        // accepted are given back when another rejected (or failed).
        let replies = join_all(groups.iter().map(|g| self.run_check(g, MODE_CHECK))).await;
        let everyone = replies.iter().all(|r| matches!(r, Ok(reply) if reply.all));
        if !everyone {
            let rollbacks = groups.iter().zip(&replies).filter_map(|(g, r)| match r {
                Ok(reply) if reply.all => Some(self.run_refund(g, Some(reply.now))),
                _ => None,
            });
            for result in join_all(rollbacks).await {
                if let Err(e) = result {
                    tracing::warn!(target: "tollgate", error = %e, "could not give back the units of a rejected multi-slot check");
                }
            }
        }
        // Decisions back in the order of `checks`.
        let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
        for (group, reply) in groups.iter().zip(replies) {
            for (c, d) in group.iter().zip(reply?.decisions) {
                if let Some(i) = checks.iter().position(|x| std::ptr::eq(x, *c)) {
                    decisions[i] = Some(d);
                }
            }
        }
        decisions.into_iter().map(|d| d.ok_or_else(|| StoreError::Backend("a rule got no decision".into()))).collect()
    }

    async fn refund(&self, checks: &[Check]) -> Result<(), StoreError> {
        if checks.is_empty() {
            return Ok(());
        }
        let groups = self.groups(checks);
        for result in join_all(groups.iter().map(|g| self.run_refund(g, None))).await {
            result?;
        }
        Ok(())
    }

    async fn peek(&self, check: &Check) -> Result<Decision, StoreError> {
        let reply = self.run_check(&[check], MODE_PEEK).await?;
        reply.decisions.into_iter().next().ok_or_else(|| StoreError::Backend("peek got no decision".into()))
    }

    async fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        let (conn, generation) = self.connection().await?;
        let mut cmd = redis::cmd("DEL");
        cmd.arg(keys::name(&self.config.prefix, rule, key, algorithm));
        self.query(conn, generation, &cmd, None).await.map(drop)
    }
}

/// Polls every future to completion, concurrently, on the caller's task.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

impl Store for RedisStore {
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.inner.check_one(check)
    }

    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        self.inner.check(checks)
    }

    fn refund(&self, checks: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.refund(checks)
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

    fn is_local(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:secret@host:1/0"), "redis://***@host:1/0");
        assert_eq!(redact("redis://user:secret@host"), "redis://***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("no url"), "no url");
        assert_eq!(redact("user:secret@host:1"), "***@host:1");
        assert_eq!(redact("redis://:pa/ss?w#d@host:1"), "redis://***@host:1");
    }

    #[test]
    fn debug_never_shows_the_password() {
        let store = RedisStore::from_url("redis://user:hunter2@127.0.0.1:6379/0").unwrap();
        let shown = format!("{store:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("127.0.0.1:6379"), "{shown}");
        let err = RedisStore::from_url("http://user:hunter2@127.0.0.1:6379").unwrap_err().to_string();
        assert!(!err.contains("hunter2") && err.contains("http"), "{err}");
    }

    #[test]
    fn bad_prefixes_are_refused() {
        let store = RedisStore::from_url("redis://127.0.0.1").unwrap();
        assert!(store.clone().prefix("a{b").is_err());
        assert!(store.clone().prefix("a}b").is_err());
        assert!(store.clone().prefix("").is_err());
        assert_eq!(&*store.prefix("app:prod").unwrap().inner.config.prefix, "app:prod");
    }
}
