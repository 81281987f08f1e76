//! The store's connection: one multiplexed (or cluster) connection taken out of the
//! deadpool pool and cloned per request, replaced in a background task when it breaks.
//!
//! A request never waits for a connection to be made, with one exception: the very
//! first request of a store waits for the first connection attempt, at most as long as
//! the response timeout. While there is no connection, requests fail at once with
//! [`StoreError::Unavailable`](crate::StoreError::Unavailable).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use deadpool_redis::cluster::ClusterConnection;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{AsyncConnectionConfig, Cmd, RedisError, RedisResult, Value};
use deadpool_redis::Runtime;
use tokio::sync::watch;

use super::origin::Origin;

#[derive(Clone)]
enum Pools {
    Single(deadpool_redis::Pool),
    Cluster(deadpool_redis::cluster::Pool),
}

/// The connection timeouts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
}

/// Builds the pool of an origin. Only fails for a bad configuration.
pub(crate) fn build_pool(origin: &Origin, t: Timeouts) -> Result<(), String> {
    make_pools(origin, t).map(drop)
}

fn make_pools(origin: &Origin, t: Timeouts) -> Result<Pools, String> {
    // Each pool hands out one connection that the store keeps; the spare slot only
    // matters while a replacement is made.
    const MAX_SIZE: usize = 2;
    match origin {
        Origin::Pool(p) => Ok(Pools::Single(p.clone())),
        Origin::ClusterPool(p) => Ok(Pools::Cluster(p.clone())),
        Origin::Url(info) => {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(t.connect))
                .set_response_timeout(Some(t.response));
            let manager = deadpool_redis::Manager::new_with_config(info.clone(), config).map_err(|e| e.to_string())?;
            deadpool_redis::Pool::builder(manager)
                .max_size(MAX_SIZE)
                .wait_timeout(Some(t.connect))
                .create_timeout(Some(t.connect))
                .recycle_timeout(Some(t.connect))
                .runtime(Runtime::Tokio1)
                .build()
                .map(Pools::Single)
                .map_err(|e| e.to_string())
        }
        Origin::ClusterUrls(infos) => {
            let manager = deadpool_redis::cluster::Manager::new(infos.clone(), false).map_err(|e| e.to_string())?;
            deadpool_redis::cluster::Pool::builder(manager)
                .max_size(MAX_SIZE)
                .wait_timeout(Some(t.connect))
                .create_timeout(Some(t.connect))
                .recycle_timeout(Some(t.connect))
                .runtime(Runtime::Tokio1)
                .build()
                .map(Pools::Cluster)
                .map_err(|e| e.to_string())
        }
    }
}

impl Pools {
    /// One new connection, taken out of the pool for good. A multiplexed connection gets
    /// the store's response timeout (whatever pool it came from), so that requests on it
    /// need no timer of their own.
    async fn connect(&self, timeouts: Timeouts) -> Result<Conn, String> {
        let t = timeouts.connect;
        let late = || format!("no connection within {t:?}");
        match self {
            Pools::Single(p) => match tokio::time::timeout(t, p.get()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(pool_error(e)),
                Ok(Ok(c)) => {
                    let mut c = deadpool_redis::Connection::take(c);
                    c.set_response_timeout(timeouts.response);
                    Ok(Conn::Single(c))
                }
            },
            Pools::Cluster(p) => match tokio::time::timeout(t, p.get()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(pool_error(e)),
                Ok(Ok(c)) => Ok(Conn::Cluster(deadpool_redis::cluster::Connection::take(c))),
            },
        }
    }
}

/// Why the pool gave no connection; redis errors (wrong password, untrusted certificate)
/// are worded by [`super::security::explain`].
fn pool_error(e: deadpool_redis::PoolError) -> String {
    match e {
        deadpool_redis::PoolError::Backend(e) => super::security::explain(&e),
        other => other.to_string(),
    }
}

/// A connection, cheap to clone: clones pipeline their requests over one socket (per node).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Whether the connection enforces the store's response timeout itself (a
    /// multiplexed connection does; a cluster connection's timeouts are its pool's).
    pub(crate) fn times_out_itself(&self) -> bool {
        matches!(self, Conn::Single(_))
    }

    pub(crate) async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

/// A connection in use that has seen no success for this long while its requests fail
/// or time out is replaced (a half-open socket, a stopped server, a lost cluster).
const STALE_AFTER: Duration = Duration::from_secs(2);
/// Pause between failed connection attempts: doubles from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// The connection of one store and the task that (re)makes it.
pub(crate) struct Link {
    origin: Origin,
    timeouts: Timeouts,
    pools: OnceLock<Result<Pools, String>>,
    state: Mutex<State>,
    /// Counts finished connection attempts, so that waiters can tell one ended.
    attempts: watch::Sender<u64>,
    /// Since when (ms since `base`, plus one) requests have failed without a success in
    /// between; 0 while they succeed.
    failing_since: AtomicU64,
    base: Instant,
}

#[derive(Default)]
struct State {
    conn: Option<Conn>,
    /// Which connection `conn` is: errors of an older one do not break a newer one.
    generation: u64,
    connecting: bool,
    last_error: Option<String>,
}

impl Link {
    pub(crate) fn new(origin: Origin, timeouts: Timeouts) -> Arc<Self> {
        Arc::new(Self {
            origin,
            timeouts,
            pools: OnceLock::new(),
            state: Mutex::new(State::default()),
            attempts: watch::Sender::new(0),
            failing_since: AtomicU64::new(0),
            base: Instant::now(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; recover rather than propagate a poison.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.state().conn.is_some()
    }

    /// Why there is no connection.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.state().last_error.clone()
    }

    /// The connection and its generation, if there is one now.
    pub(crate) fn ready(&self) -> Option<(Conn, u64)> {
        let s = self.state();
        s.conn.clone().map(|c| (c, s.generation))
    }

    /// The connection to use now, or why there is none (and a reconnect is under way).
    /// Waits only for the first attempt a store ever makes, at most `first_wait`.
    pub(crate) async fn get(self: &Arc<Self>, first_wait: Duration) -> Result<(Conn, u64), String> {
        if let Some(ready) = self.ready() {
            return Ok(ready);
        }
        let mut attempts = self.attempts.subscribe();
        self.start_connect()?;
        // Only the very first attempt of the store is waited for.
        if *attempts.borrow_and_update() == 0 {
            let _ = tokio::time::timeout(first_wait, attempts.changed()).await;
        }
        self.ready().ok_or_else(|| self.last_error().unwrap_or_else(|| "connecting".to_owned()))
    }

    /// Waits until connected, until a connection attempt fails, or for `timeout`.
    pub(crate) async fn wait_connected(self: &Arc<Self>, timeout: Duration) -> Result<(Conn, u64), String> {
        // Subscribed before looking, so that an attempt ending in between is seen.
        let mut attempts = self.attempts.subscribe();
        attempts.borrow_and_update();
        if let Some(ready) = self.ready() {
            return Ok(ready);
        }
        self.start_connect()?;
        let _ = tokio::time::timeout(timeout, attempts.changed()).await;
        self.ready().ok_or_else(|| self.last_error().unwrap_or_else(|| format!("no connection within {timeout:?}")))
    }

    /// Starts the background connection task unless it runs already.
    fn start_connect(self: &Arc<Self>) -> Result<(), String> {
        let mut s = self.state();
        if s.connecting || s.conn.is_some() {
            return Ok(());
        }
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| "RedisStore must be used inside a tokio runtime".to_owned())?;
        s.connecting = true;
        drop(s);
        handle.spawn(connect_loop(Arc::downgrade(self)));
        Ok(())
    }

    /// A request succeeded.
    pub(crate) fn on_ok(&self) {
        if self.failing_since.load(Ordering::Relaxed) != 0 {
            self.failing_since.store(0, Ordering::Relaxed);
        }
    }

    /// A request on connection `generation` failed.
    pub(crate) fn on_error(self: &Arc<Self>, generation: u64, err: &RedisError) {
        if err.is_timeout() {
            self.on_timeout(generation);
        } else if !self.origin.is_cluster() && (err.is_io_error() || err.is_unrecoverable_error()) {
            // A multiplexed connection whose socket failed stays failed.
            self.replace(generation, err.to_string());
        } else if err.is_io_error() || err.is_unrecoverable_error() {
            // A cluster connection reconnects to single nodes by itself: replace it
            // only when nothing has worked for a while.
            self.on_timeout(generation);
        }
    }

    /// A request on connection `generation` did not answer in time: after failures
    /// with no success for [`STALE_AFTER`], the connection is replaced.
    pub(crate) fn on_timeout(self: &Arc<Self>, generation: u64) {
        let now = self.elapsed_ms() + 1;
        let since = match self.failing_since.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(since) => since,
        };
        let failing = now.saturating_sub(since);
        if failing >= u64::try_from(STALE_AFTER.as_millis()).unwrap_or(u64::MAX) {
            self.failing_since.store(0, Ordering::Relaxed);
            self.replace(generation, format!("no answer for {failing} ms"));
        }
    }

    fn replace(self: &Arc<Self>, generation: u64, why: String) {
        let mut s = self.state();
        if s.generation != generation || s.conn.is_none() {
            return;
        }
        tracing::warn!(target: "tollgate", reason = %why, "redis connection lost; reconnecting in the background");
        s.conn = None;
        s.last_error = Some(format!("connection lost ({why})"));
        drop(s);
        // Outside a runtime there is no request either: the next request starts it.
        let _ = self.start_connect();
    }

    fn pools(&self) -> Result<Pools, String> {
        self.pools
            .get_or_init(|| {
                super::security::ensure_crypto_provider(&self.origin);
                make_pools(&self.origin, self.timeouts)
            })
            .clone()
    }

    /// Records the end of a connection attempt; true when connected.
    fn finish_attempt(&self, result: Result<Conn, String>) -> bool {
        let mut s = self.state();
        let ok = match result {
            Ok(conn) => {
                s.conn = Some(conn);
                s.generation += 1;
                s.connecting = false;
                s.last_error = None;
                self.failing_since.store(0, Ordering::Relaxed);
                true
            }
            Err(e) => {
                if s.last_error.as_deref().is_none_or(|last| !last.ends_with(&e)) {
                    tracing::warn!(target: "tollgate", error = %e, "cannot connect to redis; retrying in the background");
                }
                s.last_error = Some(format!("cannot connect: {e}"));
                false
            }
        };
        drop(s);
        self.attempts.send_modify(|n| *n += 1);
        ok
    }
}

/// Connects, retrying with backoff, until connected or the store is dropped.
async fn connect_loop(link: Weak<Link>) {
    let mut pause = BACKOFF.0;
    loop {
        let Some(strong) = link.upgrade() else { return };
        let timeouts = strong.timeouts;
        let pools = strong.pools();
        drop(strong);
        let result = match pools {
            Ok(pools) => pools.connect(timeouts).await,
            Err(e) => Err(e),
        };
        let Some(strong) = link.upgrade() else { return };
        if strong.finish_attempt(result) {
            tracing::debug!(target: "tollgate", "connected to redis");
            return;
        }
        drop(strong);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(BACKOFF.1);
    }
}
