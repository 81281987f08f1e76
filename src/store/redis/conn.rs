//! The store's connection: one multiplexed (or cluster) connection taken out of the
//! deadpool pool and cloned per request, replaced in a background task when it breaks.
//!
//! A request never waits for a connection to be made, with one exception: the very
//! first request of a store waits for the first connection attempt, at most as long as
//! the response timeout. While there is no connection, requests fail at once with
//! [`StoreError::NotConnected`](crate::StoreError::NotConnected).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use deadpool_redis::redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::sync::watch;

use super::origin::Origin;
use super::pool::{make_pools, Conn, Pools, Timeouts};
use super::sentinel::{self, Watch};
use super::slots::{millis, Slots, REFRESH_GAP};

/// A connection in use that has seen no success for this long while its requests fail
/// or time out ([`STALE_FAILURES`] of them at least) is replaced (a half-open socket, a
/// stopped server, a lost cluster).
const STALE_AFTER: Duration = Duration::from_secs(2);
const STALE_FAILURES: u64 = 3;
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
    /// Since when (ms since `base`, plus one) requests have failed with no success since
    /// (0: they succeed), and how many.
    failing_since: AtomicU64,
    failing_count: AtomicU64,
    base: Instant,
    /// Whether the connection task, and the task that polls the sentinels, run.
    connecting: AtomicBool,
    watching: AtomicBool,
    /// Cluster stores: the failing slots and the last success.
    slots: Slots,
    /// Whether a slot-map refresh is under way, and when the last one started.
    refreshing: AtomicBool,
    last_refresh: AtomicU64,
}

#[derive(Default)]
struct State {
    conn: Option<Conn>,
    /// Which connection `conn` is: errors of an older one do not break a newer one.
    generation: u64,
    last_error: Option<String>,
    /// Sentinel stores: the primary the sentinels named when `conn` was made.
    primary: Option<String>,
}

impl Link {
    pub(crate) fn new(origin: Origin, timeouts: Timeouts) -> Arc<Self> {
        Arc::new(Self {
            connecting: AtomicBool::new(false),
            watching: AtomicBool::new(false),
            slots: Slots::default(),
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
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn elapsed_ms(&self) -> u64 {
        millis(self.base.elapsed())
    }

    pub(crate) fn ready(&self) -> Option<(Conn, u64)> {
        let s = self.state();
        s.conn.clone().map(|c| (c, s.generation))
    }

    /// The connection, or why there is none (and a reconnect is under way), after waiting
    /// at most `wait` for a connection attempt to end: any attempt (`ping`), or only the
    /// very first a store makes (requests wait for no other).
    pub(crate) async fn get(self: &Arc<Self>, wait: Duration, any_attempt: bool) -> Result<(Conn, u64), String> {
        // Subscribed before looking, so that an attempt ending in between is seen.
        let mut attempts = self.attempts.subscribe();
        let first = *attempts.borrow_and_update() == 0;
        if let Some(ready) = self.ready() {
            return Ok(ready);
        }
        self.start_connect()?;
        if any_attempt || first {
            let _ = tokio::time::timeout(wait, attempts.changed()).await;
        }
        self.ready().ok_or_else(|| {
            let waited = if any_attempt { format!("no connection within {wait:?}") } else { "connecting".into() };
            self.state().last_error.clone().unwrap_or(waited)
        })
    }

    /// Starts the background connection task unless it runs already.
    fn start_connect(self: &Arc<Self>) -> Result<(), String> {
        let s = self.state();
        if self.connecting.load(Ordering::Acquire) || s.conn.is_some() {
            return Ok(());
        }
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| "RedisStore must be used inside a tokio runtime".to_owned())?;
        self.connecting.store(true, Ordering::Release);
        drop(s);
        // The guard goes in with the task: dropped even if the task never runs.
        handle.spawn(connect_loop(Arc::downgrade(self), ClearOnDrop(Arc::downgrade(self), |l| &l.connecting)));
        Ok(())
    }

    pub(crate) fn on_ok(&self, slot: Option<u16>) {
        if self.failing_since.load(Ordering::Relaxed) != 0 {
            self.failing_since.store(0, Ordering::Relaxed);
        }
        if let Some(slot) = slot {
            self.slots.on_ok(slot, self.elapsed_ms() + 1);
        }
    }

    /// Whether a call about another slot than `slot` succeeded lately (see [`Slots`]).
    pub(crate) fn others_answer(&self, slot: u16) -> bool {
        self.slots.others_answer(slot, self.elapsed_ms() + 1)
    }

    /// Of a cut call's slots, the one that did not answer (see [`Slots::unanswered`]).
    pub(crate) fn unanswered(&self, slots: &[u16]) -> Option<u16> {
        self.slots.unanswered(slots)
    }

    fn on_slot_failure(self: &Arc<Self>, slot: u16) {
        if let Some(why) = self.slots.on_failure(slot, || self.elapsed_ms() + 1) {
            self.refresh(why);
        }
    }

    /// Makes a new cluster connection (which reads the slot map afresh) in the background
    /// and swaps it in; the current one serves every request meanwhile.
    fn refresh(self: &Arc<Self>, why: String) {
        let now = self.elapsed_ms() + 1;
        let last = self.last_refresh.load(Ordering::Relaxed);
        let recent = last != 0 && now.saturating_sub(last) < millis(REFRESH_GAP);
        if recent || self.refreshing.swap(true, Ordering::AcqRel) {
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

    pub(crate) fn on_error(self: &Arc<Self>, generation: u64, slot: Option<u16>, err: &RedisError) {
        let broken = err.is_io_error() || err.is_unrecoverable_error();
        let lost = broken
            || err.is_timeout()
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
        } else if broken && !err.is_timeout() && !self.origin.is_cluster() {
            // A multiplexed connection whose socket failed stays failed.
            self.replace(generation, err.to_string());
        } else if broken || err.is_timeout() {
            // A timeout; or a cluster connection, which reconnects to single nodes by
            // itself: replaced only when nothing has worked for a while.
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
                self.connecting.store(false, Ordering::Release);
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

/// A slot-map refresh: a new connection, swapped in when made (the failing slots start
/// afresh); on failure, the next failing call may try again after [`REFRESH_GAP`].
async fn refresh_task(link: Weak<Link>, _refreshing: ClearOnDrop<Link>) {
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
            strong.slots.clear();
            tracing::info!(target: "tollgate", "redis cluster slot map refreshed");
        }
        Err(e) => tracing::warn!(target: "tollgate", error = %e, "could not refresh the redis cluster slot map"),
    }
}

/// Clears a flag of a link or store when dropped: a task that ends in any way, also
/// dropped unfinished with its runtime, lets the next one start.
pub(super) struct ClearOnDrop<T>(pub(super) Weak<T>, pub(super) fn(&T) -> &AtomicBool);

impl<T> Drop for ClearOnDrop<T> {
    fn drop(&mut self) {
        if let Some(t) = self.0.upgrade() {
            (self.1)(&t).store(false, Ordering::Release);
        }
    }
}

/// Connects, retrying with backoff, until connected or the store is dropped; `unfinished`,
/// dropped with a loop that never connected (its runtime shut down), lets the next start.
async fn connect_loop(link: Weak<Link>, mut unfinished: ClearOnDrop<Link>) {
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
            unfinished.0 = Weak::new();
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

/// Sentinel stores: asks the sentinels every [`sentinel::POLL`] which server is the
/// primary, and replaces a connection made to another one (after `SENTINEL FAILOVER` the
/// old primary stays writable for seconds, with its clients connected).
async fn watch_loop(link: Weak<Link>, watch: Arc<Watch>, _watching: ClearOnDrop<Link>) {
    loop {
        tokio::time::sleep(sentinel::POLL).await;
        let Some(strong) = link.upgrade() else { return };
        let connect = strong.timeouts.connect;
        let current = {
            let s = strong.state();
            s.conn.as_ref().and(s.primary.clone()).map(|p| (s.generation, p))
        };
        drop(strong);
        // Without a connection, the connection task asks the sentinels itself.
        let Some((generation, primary)) = current else { continue };
        let Ok(named) = watch.candidates(sentinel::question_timeout(connect)).await else { continue };
        // A majority (never one of two tied), or a lagging or cut-off sentinel could move
        // the store back and forth.
        let named = &named[0];
        if named.addr() != primary && watch.is_majority(named) {
            let Some(strong) = link.upgrade() else { return };
            strong
                .replace(generation, format!("the sentinels now name {} as the primary, not {primary}", named.addr()));
        }
    }
}
