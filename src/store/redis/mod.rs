#![doc = include_str!("../../../docs/redis-store.md")]

mod batch;
mod call;
mod cluster;
mod conn;
mod heartbeat;
mod keys;
mod origin;
mod pool;
mod presence;
mod release;
mod script;
mod security;
mod sentinel;
mod slots;
mod store_trait;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, Value};

use self::call::{Config, Inner};
use self::conn::Link;
use self::origin::{parse_url, Origin};
use self::pool::Timeouts;
#[cfg(feature = "test-util")]
use crate::clock::SharedClock;
use crate::error::{BuildError, StoreError};

/// The default key prefix.
const DEFAULT_PREFIX: &str = "tollgate";
/// Default for [`RedisStore::response_timeout`].
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(100);
/// Default for [`RedisStore::connect_timeout`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Limiter state in Redis, shared by every server: standalone Redis, Redis Sentinel or
/// Redis Cluster, through `deadpool-redis` and `redis`.
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
    /// Checks waiting for their batch (group commit, `batch.rs`).
    queue: Arc<batch::Queue>,
    /// Permits' releases waiting for their call (group commit, `release.rs`).
    releases: Arc<release::Releases>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        f.debug_struct("RedisStore")
            .field(
                "mode",
                &match c.origin {
                    Origin::Sentinel(_) => "sentinel",
                    _ if c.origin.is_cluster() => "cluster",
                    _ => "standalone",
                },
            )
            .field("addr", &c.addr)
            .field("prefix", &c.names.prefix)
            .field("hashed_keys", &c.names.hashes_keys())
            .field("response_timeout", &c.timeouts.response)
            .field("connect_timeout", &c.timeouts.connect)
            .field("clock", &if c.clock.is_some() { "manual" } else { "redis TIME" })
            .field("tls", &c.origin.describe_tls())
            .field("connected", &self.inner.link.ready().is_some())
            .finish()
    }
}

impl RedisStore {
    fn build(config: Config) -> Self {
        let link = Link::new(config.origin.clone(), config.timeouts);
        let presence = presence::Presence::new(config.identity);
        Self { inner: Arc::new(Inner { config, link, presence }), queue: Arc::default(), releases: Arc::default() }
    }

    fn with_config(config: Config) -> Result<Self, BuildError> {
        pool::make_pools(&config.origin, config.timeouts).map_err(BuildError::InvalidStore)?;
        Ok(Self::build(config))
    }

    /// A new store with a changed configuration (builders run before first use).
    fn rebuild(&self, f: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.inner.config.clone();
        f(&mut config);
        Self::build(config)
    }

    fn config(origin: Origin, addr: String) -> Config {
        let origin_is_cluster = origin.is_cluster();
        Config {
            origin,
            addr,
            names: keys::Names::new(DEFAULT_PREFIX.into()),
            timeouts: Timeouts { response: RESPONSE_TIMEOUT, connect: CONNECT_TIMEOUT },
            clock: None,
            identity: crate::store::new_identity(),
            // Off on a cluster, whose keys rarely share a slot (see `max_batch`).
            max_batch: if origin_is_cluster { 1 } else { batch::MAX_BATCH },
        }
    }

    /// A store on the standalone Redis at `url` (`redis://[user:password@]host[:port][/db]`),
    /// or on the primary that Redis Sentinel names:
    /// `redis+sentinel://[user:password@]host[:port][,host[:port]…]/master-name[/db]`.
    ///
    /// In the sentinel form, the hosts are the sentinels (port 26379 when none is given),
    /// `master-name` is the name they monitor the primary under, and the user info and
    /// database are the primary's; sentinels that require a password of their own get it
    /// from [`RedisStore::sentinel_credentials`]. `rediss+sentinel://` (feature `redis-tls`)
    /// talks TLS to both, trusting the system's CA store. The store connects to the
    /// primary the sentinels name, follows a failover by itself (see the
    /// [module docs](self#redis-sentinel)), and asks the sentinels every 250 ms which
    /// server is the primary.
    ///
    /// ```no_run
    /// # fn run() -> Result<(), tollgate::BuildError> {
    /// let store = tollgate::RedisStore::from_url(
    ///     "redis+sentinel://:s3cret@10.0.0.1,10.0.0.2,10.0.0.3/mymaster",
    /// )?;
    /// # let _ = store; Ok(()) }
    /// ```
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
        if url.split_once("://").is_some_and(|(scheme, _)| scheme.to_ascii_lowercase().ends_with("+sentinel")) {
            let sentinel = origin::parse_sentinel_url(url)?;
            let addr = format!("sentinel {} master {}", sentinel.addrs(), sentinel.master);
            return Self::with_config(Self::config(Origin::Sentinel(sentinel), addr));
        }
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
    /// For a `rediss+sentinel://` store, the CAs are trusted for the sentinels and the
    /// primary alike.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] when `pem` holds no certificate or a malformed one,
    /// when the store's URL is not `rediss://` (or `rediss+sentinel://`), and for stores
    /// made by [`RedisStore::cluster`] (not supported for cluster clients: add the CA to
    /// the system's trust store) or from an application's pool (configure TLS on the
    /// pool).
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn tls_root_certificates(self, pem: &[u8]) -> Result<Self, BuildError> {
        let origin = self.inner.config.origin.with_root_certificates(pem).map_err(BuildError::InvalidStore)?;
        Ok(self.rebuild(|c| c.origin = origin))
    }

    /// The user name (for an ACL user) and password that the sentinels of a
    /// `redis+sentinel://` store require (`requirepass` in the sentinels' configuration);
    /// the primary's credentials are the URL's user info. Call before the store is used.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] for a store that is not a sentinel store.
    pub fn sentinel_credentials(self, username: Option<&str>, password: &str) -> Result<Self, BuildError> {
        let Origin::Sentinel(s) = &self.inner.config.origin else {
            return Err(BuildError::InvalidStore(
                "sentinel credentials were given to a store that is not a redis+sentinel:// store".into(),
            ));
        };
        let origin = Origin::Sentinel(s.clone().with_sentinel_credentials(username, password));
        Ok(self.rebuild(|c| c.origin = origin))
    }

    /// Names client keys in Redis by a keyed hash instead of the key itself: HMAC-SHA-256
    /// under `secret` (its first 128 bits, in hex). API keys, account ids and addresses
    /// then appear nowhere in Redis — not in `SCAN`, `MONITOR`, the slow log or a backup —
    /// and cannot be recovered from a dump without the secret. Everything else is as
    /// before: one key's rules share a cluster slot, and `peek`/`reset` take the clear key.
    ///
    /// Every server sharing the limits needs the same secret. Turning this on, or changing
    /// the secret, changes every name: limits start afresh (the old keys expire on their
    /// own). Call before the store is used.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), tollgate::BuildError> {
    /// let secret = std::env::var("LIMITER_KEY_SECRET").expect("a secret of 16 bytes or more");
    /// let store = tollgate::RedisStore::from_url("redis://127.0.0.1:6379")?.hash_keys(secret)?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] when the secret is shorter than 16 bytes.
    pub fn hash_keys(self, secret: impl AsRef<[u8]>) -> Result<Self, BuildError> {
        let secret = secret.as_ref();
        if secret.len() < 16 {
            return Err(BuildError::InvalidStore(format!(
                "the secret for hashed key names is {} bytes long: use 16 or more (32 random bytes are a good choice)",
                secret.len()
            )));
        }
        Ok(self.rebuild(|c| c.names = c.names.clone().hashed(secret)))
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
        Ok(self.rebuild(|c| c.names.prefix = prefix.into()))
    }

    /// How long one request to Redis may take before it fails with
    /// [`StoreError::Timeout`] (default 100 ms; on a cluster at least 250 ms, the node
    /// connections' own, which redis-rs's slot-map queries share). The layer's own deadline
    /// applies on top: a call it cuts runs on until this, and its answer is still the
    /// store's decision.
    /// It is set on the connection the store takes, also when that comes from a pool given
    /// to [`RedisStore::new`] (whose other connections keep their own setting).
    /// Call before the store is used.
    #[must_use]
    pub fn response_timeout(self, timeout: Duration) -> Self {
        self.rebuild(|c| c.timeouts.response = timeout)
    }

    /// The most single-rule decisions that one script call to Redis may carry (group
    /// commit; default 64, and 1 on a cluster). `1` turns batching off: each decision is
    /// then its own call.
    ///
    /// Decisions that arrive while others are on their way to Redis go together as one
    /// script call (one `TIME`, one call's overhead), which decides each of them on its
    /// own, in arrival order, exactly as separate calls would: atomic per decision, a
    /// rejected request consumes nothing, and a decision that fails (a key of another
    /// type) is that request's error only. Nothing waits to fill a batch: a decision that
    /// arrives alone goes alone. Batched are the checks of one rule (not rules that block
    /// or are charged; a sliding window log decision that would read past the head of its
    /// log is sent on its own after its batch, so a batch stays O(1) a decision), the checks
    /// of several rules of one input whose keys share a slot and that read no block (each
    /// all or nothing, in calls of their own), and releases of permits; on a cluster,
    /// only decisions whose keys share a slot, which is why it is off there by default:
    /// with 10,000 keys, or 64, spread over the slots, a cluster store batched 0.2 % or 18 %
    /// of its calls away and ran at 0.85× or 0.90× the rate of one call per decision. Turn
    /// it on for a cluster whose traffic concentrates on a few keys. The time in the queue
    /// counts against the
    /// limiter's deadline. See the [module docs](self#group-commit). Call before the store
    /// is used.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] when `max` is 0.
    pub fn max_batch(self, max: usize) -> Result<Self, BuildError> {
        if max == 0 {
            return Err(BuildError::InvalidStore(
                "max_batch(0): a script call carries at least one decision (1 turns batching off)".into(),
            ));
        }
        Ok(self.rebuild(|c| c.max_batch = max))
    }

    /// How long one background connection attempt may take, pool wait included
    /// (default 1 s). [`RedisStore::ping`] waits at most this for a connection. Call
    /// before the store is used.
    #[must_use]
    pub fn connect_timeout(self, timeout: Duration) -> Self {
        self.rebuild(|c| c.timeouts.connect = timeout)
    }

    /// Decides on the times of `clock` instead of the Redis server's `TIME` (tests of
    /// limits, with [`ManualClock`](crate::clock::ManualClock)). Call before the store is used.
    ///
    /// Key TTLs are computed from the clock's time but run on the server's real clock:
    /// moving the clock ahead is fine (a state that has logically expired decides like a
    /// fresh one), but a test must finish a scenario before its keys expire in real time,
    /// so use quotas of seconds or longer. Do not pause tokio's clock in tests that talk
    /// to Redis: the paused clock jumps ahead while a task waits on the socket.
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    #[must_use]
    pub fn with_clock(self, clock: impl crate::clock::Clock) -> Self {
        let clock = SharedClock::new(clock);
        self.rebuild(|c| c.clock = Some(clock))
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
        let (conn, generation) = inner.link.get(inner.config.timeouts.connect, true).await.map_err(|why| {
            StoreError::Unavailable(format!("redis at {} is not connected: {why}", inner.config.addr))
        })?;
        match inner.query(conn, generation, None, &redis::cmd("PING"), None).await? {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            Value::Okay => Ok(()),
            other => Err(StoreError::Backend(format!("unexpected answer to PING: {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(&*store.prefix("app:prod").unwrap().inner.config.names.prefix, "app:prod");
    }
}
