//! The store's connection: one multiplexed (or cluster) connection taken out of the
//! deadpool pool and cloned per request, replaced in a background task when it breaks.
//!
//! A request never waits for a connection to be made, with one exception: the very
//! first request of a store waits for the first connection attempt, at most as long as
//! the response timeout. While there is no connection, requests fail at once with
//! [`StoreError::NotConnected`](crate::StoreError::NotConnected).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use deadpool_redis::cluster::ClusterConnection;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use deadpool_redis::Runtime;
use tokio::sync::watch;

use super::origin::Origin;
use super::sentinel::{self, Watch};

#[derive(Clone)]
enum Pools {
    Single(deadpool_redis::Pool),
    Cluster(deadpool_redis::cluster::Pool),
    /// Cluster URLs: redis-rs's cluster client, with the store's timeouts on every node
    /// connection (deadpool-redis's cluster manager sets none, and a slot-map refresh
    /// that asks a hung node then stalls every request of the connection).
    ClusterClient(Box<deadpool_redis::cluster::ClusterClient>),
    Sentinel(Arc<Watch>),
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
        Origin::Sentinel(s) => Ok(Pools::Sentinel(Watch::new(s.clone()))),
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
        Origin::ClusterUrls(infos) => deadpool_redis::cluster::ClusterClientBuilder::new(infos.clone())
            // Half the attempt's time: a new connection may wait for a hung node once.
            .connection_timeout(t.connect / 2)
            .response_timeout(t.response.max(MIN_NODE_RESPONSE))
            .build()
            .map(|client| Pools::ClusterClient(Box::new(client)))
            .map_err(|e| e.to_string()),
    }
}

impl Pools {
    /// One new connection, taken out of the pool for good, and for a sentinel store the
    /// primary's address it was made to. A multiplexed connection gets the store's
    /// response timeout (whatever pool it came from), so that requests on it need no
    /// timer of their own.
    async fn connect(&self, timeouts: Timeouts) -> Result<(Conn, Option<String>), String> {
        let t = timeouts.connect;
        let late = || format!("no connection within {t:?}");
        match self {
            Pools::Single(p) => match tokio::time::timeout(t, p.get()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(pool_error(e)),
                Ok(Ok(c)) => {
                    let mut c = deadpool_redis::Connection::take(c);
                    c.set_response_timeout(timeouts.response);
                    Ok((Conn::Single(c), None))
                }
            },
            Pools::Cluster(p) => match tokio::time::timeout(t, p.get()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(pool_error(e)),
                Ok(Ok(c)) => Ok((Conn::Cluster(deadpool_redis::cluster::Connection::take(c)), None)),
            },
            Pools::ClusterClient(client) => match tokio::time::timeout(t, client.get_async_connection()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(super::security::explain(&e)),
                Ok(Ok(c)) => Ok((Conn::Cluster(c), None)),
            },
            Pools::Sentinel(watch) => {
                match tokio::time::timeout(t, watch.connect(timeouts.connect, timeouts.response)).await {
                    Err(_) => Err(late()),
                    Ok(Err(e)) => Err(e),
                    Ok(Ok((c, addr))) => Ok((Conn::Single(c), Some(addr))),
                }
            }
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
/// or time out ([`STALE_FAILURES`] of them at least) is replaced (a half-open socket, a
/// stopped server, a lost cluster).
const STALE_AFTER: Duration = Duration::from_secs(2);
const STALE_FAILURES: u64 = 3;
/// A cluster slot whose calls have failed for this long, without a success in between,
/// while the connection is otherwise in use (a master that died or hangs, whose replica
/// may have taken over), makes the store ask the cluster for its slot map again: redis-rs
/// does not for a node that stopped answering.
const SLOT_STALE_AFTER: Duration = Duration::from_secs(1);
/// How recent a success of another slot must be for a slot's failure to count as its
/// node's ([`StoreError::NodeUnavailable`](crate::StoreError::NodeUnavailable)).
const OTHERS_ANSWERED: Duration = Duration::from_secs(1);
/// How many slots failing at once, with no success since, make the store read the slot
/// map again even when none has failed twice.
const SPREAD_SLOTS: usize = 8;
/// A failing slot with no failure for this long starts afresh (a rarely used key's
/// failures minutes apart are no outage).
const SLOT_FORGET: Duration = Duration::from_secs(10);
/// At most one slot-map refresh per this long.
const REFRESH_GAP: Duration = Duration::from_secs(1);
/// The least response timeout of a cluster node connection: redis-rs's own slot-map
/// queries go through them too.
const MIN_NODE_RESPONSE: Duration = Duration::from_millis(250);
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
    /// Failures in the current run (since `failing_since`).
    failing_count: AtomicU64,
    base: Instant,
    /// Whether the task that polls the sentinels runs (sentinel stores).
    watching: AtomicBool,
    /// Cluster stores: since when (ms since `base`, plus one) each failing slot has failed
    /// with no success in between; `slots_failing` tells whether there is any.
    failing_slots: Mutex<SlotTable>,
    slots_failing: AtomicBool,
    /// Cluster stores: the last success, as ms since `base` (plus one) << 16 | its slot.
    last_ok: AtomicU64,
    /// Whether a slot-map refresh is under way, and when the last one started.
    refreshing: AtomicBool,
    last_refresh: AtomicU64,
}

#[derive(Default)]
struct State {
    conn: Option<Conn>,
    /// Which connection `conn` is: errors of an older one do not break a newer one.
    generation: u64,
    connecting: bool,
    last_error: Option<String>,
    /// Sentinel stores: the primary the sentinels named when `conn` was made.
    primary: Option<String>,
}

impl Link {
    pub(crate) fn new(origin: Origin, timeouts: Timeouts) -> Arc<Self> {
        Arc::new(Self {
            watching: AtomicBool::new(false),
            failing_slots: Mutex::new(SlotTable::default()),
            slots_failing: AtomicBool::new(false),
            last_ok: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            last_refresh: AtomicU64::new(0),
            origin,
            timeouts,
            pools: OnceLock::new(),
            state: Mutex::new(State::default()),
            attempts: watch::Sender::new(0),
            failing_since: AtomicU64::new(0),
            failing_count: AtomicU64::new(0),
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
        // The guard goes in with the task: dropped even if the task never runs.
        handle.spawn(connect_loop(Arc::downgrade(self), NotConnecting(Some(Arc::downgrade(self)))));
        Ok(())
    }

    /// A request (about keys of `slot`, on a cluster) succeeded.
    pub(crate) fn on_ok(&self, slot: Option<u16>) {
        if self.failing_since.load(Ordering::Relaxed) != 0 {
            self.failing_since.store(0, Ordering::Relaxed);
        }
        if let Some(slot) = slot {
            let last = ((self.elapsed_ms() + 1) << 16) | u64::from(slot);
            // Stored only when it changed: most successes within a millisecond write nothing.
            if self.last_ok.load(Ordering::Relaxed) != last {
                self.last_ok.store(last, Ordering::Relaxed);
            }
            if self.slots_failing.load(Ordering::Relaxed) {
                let mut failing = self.failing_slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                failing.slots.remove(&slot);
                self.slots_failing.store(!failing.slots.is_empty(), Ordering::Relaxed);
            }
        }
    }

    /// Whether a call about another slot than `slot` succeeded within the last
    /// [`OTHERS_ANSWERED`]: then a failure of `slot` is its node's, not the cluster's.
    pub(crate) fn others_answer(&self, slot: u16) -> bool {
        let last = self.last_ok.load(Ordering::Relaxed);
        let (at, last_slot) = (last >> 16, last & 0xFFFF);
        at != 0 && last_slot != u64::from(slot) && self.elapsed_ms() < at + millis(OTHERS_ANSWERED)
    }

    /// A request about keys of cluster slot `slot` failed. The slot map is asked for again
    /// when a slot has failed twice with no success in between, over [`SLOT_STALE_AFTER`]
    /// or more; or when [`SPREAD_SLOTS`] slots or more are failing so, some of them for
    /// that long (keys spread over many slots each fail rarely). A slot that has not failed
    /// for [`SLOT_FORGET`] starts afresh.
    fn on_slot_failure(self: &Arc<Self>, slot: u16) {
        let stale = millis(SLOT_STALE_AFTER);
        let why = {
            let mut t = self.failing_slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Read under the lock: no other failure recorded here can be later.
            let now = self.elapsed_ms() + 1;
            self.slots_failing.store(true, Ordering::Relaxed);
            if now.saturating_sub(t.swept) >= stale {
                t.slots.retain(|_, f| now.saturating_sub(f.last) <= millis(SLOT_FORGET));
                t.swept = now;
            }
            if t.slots.is_empty() {
                t.failing_since = now;
            }
            let f = t.slots.entry(slot).or_insert(SlotFailures { since: now, last: now, count: 0 });
            if now.saturating_sub(f.last) > millis(SLOT_FORGET) {
                *f = SlotFailures { since: now, last: now, count: 0 };
            }
            f.count += 1;
            f.last = now;
            let (count, failed_for) = (f.count, now.saturating_sub(f.since));
            if count >= 2 && failed_for >= stale {
                Some(format!("calls for cluster slot {slot} have failed for {failed_for} ms"))
            } else if t.slots.len() >= SPREAD_SLOTS && now.saturating_sub(t.failing_since) >= stale {
                Some(format!("calls for {} cluster slots have failed with no success since", t.slots.len()))
            } else {
                None
            }
        };
        if let Some(why) = why {
            self.refresh(why);
        }
    }

    /// Makes a new cluster connection (which reads the slot map afresh) in the background
    /// and swaps it in; the current one serves every request meanwhile.
    fn refresh(self: &Arc<Self>, why: String) {
        let now = self.elapsed_ms() + 1;
        let last = self.last_refresh.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < millis(REFRESH_GAP) {
            return;
        }
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        self.last_refresh.store(now, Ordering::Relaxed);
        tracing::warn!(target: "tollgate", reason = %why, "refreshing the redis cluster slot map in the background");
        handle.spawn(refresh_task(Arc::downgrade(self), ClearOnDrop(Arc::downgrade(self), |l| &l.refreshing)));
    }

    /// A request on connection `generation` (about keys of `slot`, on a cluster) failed.
    pub(crate) fn on_error(self: &Arc<Self>, generation: u64, slot: Option<u16>, err: &RedisError) {
        let lost = err.is_timeout()
            || err.is_io_error()
            || err.is_unrecoverable_error()
            || matches!(err.kind(), ErrorKind::Server(ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown));
        if let Some(slot) = slot.filter(|_| lost) {
            self.on_slot_failure(slot);
        }
        let replica = matches!(err.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown));
        if replica && !self.origin.is_cluster() {
            // The server is (now) a replica, or one that lost its primary: a failover, or
            // an operator's `REPLICAOF`, which keeps connections open. Connect afresh (a
            // sentinel store asks the sentinels again).
            self.replace(generation, format!("the server answers as a replica ({})", err.code().unwrap_or("")));
        } else if err.is_timeout() {
            self.on_timeout(generation, None);
        } else if !self.origin.is_cluster() && (err.is_io_error() || err.is_unrecoverable_error()) {
            // A multiplexed connection whose socket failed stays failed.
            self.replace(generation, err.to_string());
        } else if err.is_io_error() || err.is_unrecoverable_error() {
            // A cluster connection reconnects to single nodes by itself: replace it
            // only when nothing has worked for a while.
            self.on_timeout(generation, None);
        }
    }

    /// A request on connection `generation` did not answer in time: after failures
    /// with no success for [`STALE_AFTER`], the connection is replaced.
    pub(crate) fn on_timeout(self: &Arc<Self>, generation: u64, slot: Option<u16>) {
        if let Some(slot) = slot {
            self.on_slot_failure(slot);
        }
        let now = self.elapsed_ms() + 1;
        // A new run of failures starts with the first since a success.
        if self.failing_since.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.failing_count.store(1, Ordering::Relaxed);
            return;
        }
        let count = self.failing_count.fetch_add(1, Ordering::Relaxed) + 1;
        let failing = now.saturating_sub(self.failing_since.load(Ordering::Relaxed));
        // Three failures at least: two isolated cut-offs on a healthy, idle server are no
        // outage; a dead connection fails every call, however sparse the calls.
        if failing >= millis(STALE_AFTER) && count >= STALE_FAILURES {
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
        s.primary = None;
        s.last_error = Some(format!("connection lost ({why})"));
        drop(s);
        // Outside a runtime there is no request either: the next request starts it.
        let _ = self.start_connect();
    }

    fn pools(&self) -> Result<Pools, String> {
        self.pools
            .get_or_init(|| {
                super::security::ensure_crypto_provider(self.origin.uses_tls());
                make_pools(&self.origin, self.timeouts)
            })
            .clone()
    }

    /// Records the end of a connection attempt; true when connected.
    fn finish_attempt(self: &Arc<Self>, result: Result<(Conn, Option<String>), String>) -> bool {
        let mut s = self.state();
        let ok = match result {
            Ok((conn, primary)) => {
                s.conn = Some(conn);
                s.primary = primary;
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
        if ok {
            if let Ok(Pools::Sentinel(watch)) = self.pools() {
                if !self.watching.swap(true, Ordering::AcqRel) {
                    let guard = ClearOnDrop(Arc::downgrade(self), |l| &l.watching);
                    tokio::spawn(watch_loop(Arc::downgrade(self), watch, guard));
                }
            }
        }
        ok
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A slot-map refresh: a new connection, swapped in when made (the failing slots start
/// afresh); on failure, the next failing call may try again after [`REFRESH_GAP`].
/// `_refreshing` clears the flag however the task ends, also dropped unpolled with its
/// runtime.
async fn refresh_task(link: Weak<Link>, _refreshing: ClearOnDrop) {
    let Some(strong) = link.upgrade() else { return };
    let (timeouts, pools) = (strong.timeouts, strong.pools());
    // The connection this refresh replaces: a newer one made meanwhile (a reconnection
    // after a failure, with a newer slot map) is kept.
    let replaces = strong.state().generation;
    drop(strong);
    let result = match pools {
        Ok(pools) => pools.connect(timeouts).await,
        Err(e) => Err(e),
    };
    let Some(strong) = link.upgrade() else { return };
    match result {
        Ok((conn, _)) => {
            let mut s = strong.state();
            // Only over the live connection it was made for: a reconnection under way
            // makes its own, and one made while this refresh connected is newer.
            if s.conn.is_some() && s.generation == replaces {
                s.conn = Some(conn);
                s.generation += 1;
            }
            drop(s);
            strong.failing_slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).slots.clear();
            strong.slots_failing.store(false, Ordering::Relaxed);
            tracing::info!(target: "tollgate", "redis cluster slot map refreshed");
        }
        Err(e) => tracing::warn!(target: "tollgate", error = %e, "could not refresh the redis cluster slot map"),
    }
}

/// Clears a flag of the link when dropped: a task that ends in any way, also dropped
/// unfinished with its runtime, lets the next one start.
struct ClearOnDrop(Weak<Link>, fn(&Link) -> &AtomicBool);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        if let Some(link) = self.0.upgrade() {
            (self.1)(&link).store(false, Ordering::Release);
        }
    }
}

/// Connects, retrying with backoff, until connected or the store is dropped.
/// `unfinished`: a loop dropped before connecting (its runtime shut down, even before it
/// first ran) lets the next request start one.
async fn connect_loop(link: Weak<Link>, mut unfinished: NotConnecting) {
    let mut pause = BACKOFF.0;
    loop {
        let Some(strong) = link.upgrade() else { return };
        let timeouts = strong.timeouts;
        let pools = strong.pools();
        let watch_pause = matches!(strong.origin, Origin::Sentinel(_));
        drop(strong);
        let result = match pools {
            Ok(pools) => pools.connect(timeouts).await,
            Err(e) => Err(e),
        };
        let Some(strong) = link.upgrade() else { return };
        if strong.finish_attempt(result) {
            tracing::debug!(target: "tollgate", "connected to redis");
            unfinished.0 = None;
            return;
        }
        drop(strong);
        tokio::time::sleep(pause).await;
        // A sentinel store's attempt is cheap: it may ask again soon, and so follows a
        // failover sooner.
        let most = if watch_pause { sentinel::RECONNECT_PAUSE } else { BACKOFF.1 };
        pause = (pause * 2).min(most);
    }
}

/// Sentinel stores: asks the sentinels every [`sentinel::POLL`] which server is the primary,
/// and replaces a connection made to another one (after `SENTINEL FAILOVER` the old
/// primary stays writable for seconds, with its clients connected). Ends with the store.
async fn watch_loop(link: Weak<Link>, watch: Arc<Watch>, _watching: ClearOnDrop) {
    loop {
        tokio::time::sleep(sentinel::POLL).await;
        let Some(strong) = link.upgrade() else { return };
        let timeouts = strong.timeouts;
        let current = {
            let s = strong.state();
            s.conn.as_ref().and(s.primary.clone()).map(|p| (s.generation, p))
        };
        drop(strong);
        // Without a connection, the connection task asks the sentinels itself.
        let Some((generation, primary)) = current else { continue };
        let Ok(named) = watch.primary(sentinel::question_timeout(timeouts.connect)).await else { continue };
        // A majority, or a lagging or cut-off sentinel could move the store back and forth.
        if named.addr() != primary && watch.is_majority(&named) {
            let Some(strong) = link.upgrade() else { return };
            let why = format!("the sentinels now name {} as the primary, not {primary}", named.addr());
            strong.replace(generation, why);
        }
    }
}

/// The cluster slots whose calls fail with no success since (times in ms since
/// `Link::base`, plus one).
#[derive(Default)]
struct SlotTable {
    slots: HashMap<u16, SlotFailures>,
    /// Since when the table has held a failing slot.
    failing_since: u64,
    swept: u64,
}

/// A slot's run of failures: since when, the latest, how many.
struct SlotFailures {
    since: u64,
    last: u64,
    count: u32,
}

/// While a connection loop runs: if it is dropped before connecting, the link may start
/// another.
struct NotConnecting(Option<Weak<Link>>);

impl Drop for NotConnecting {
    fn drop(&mut self) {
        if let Some(link) = self.0.take().and_then(|l| l.upgrade()) {
            link.state().connecting = false;
        }
    }
}
