//! How a `RedisStore` counts the servers sharing it ([`Store::servers`](crate::store::Store::servers)):
//! each one announces itself every second in a sorted set, `<prefix>:servers`, scored by
//! when its announcement lapses (server time, [`LAPSE`] later), and reads how many have
//! not lapsed. A server announces from its limiter's build when a runtime is running,
//! else from its first call; it counts again with its first check (when the servers
//! started at about the same time, its first count may have come before theirs). For
//! the first [`LAPSE`] after its first count, a server takes one server more than it
//! counted: a peer that started with it may have announced itself just after that count,
//! and a store that stalls at once would leave no time to count again.
//!
//! The heartbeat also loads the charge and refund scripts on each new connection: what the
//! fallback admitted is charged to the store while it is slow, and a charge must be run
//! in the order it was sent (behind the calls the store has yet to answer). A first
//! `EVALSHA` of an unknown script would be refused (`NOSCRIPT`) and its `EVAL` sent after
//! whatever was sent meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_redis::redis::{self, Value};

use super::call::Inner;
use super::script::SCRIPTS;

/// How often a server announces itself and counts.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long an announcement counts: a server that stopped is no longer counted after
/// this.
const LAPSE: Duration = Duration::from_secs(3);

/// Adds this server's `ARGV[3]` limiters (`ARGV[1]:<i>`) until `ARGV[2]` ms from the
/// server's now, drops the lapsed, and counts the rest.
const ANNOUNCE: &str = "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, tonumber(ARGV[3]) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1] .. ':' .. i)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])";

/// One store's part in the count.
pub(super) struct Presence {
    /// The servers counted last; 0 before the first count.
    count: AtomicU64,
    /// Whether a limiter asked for the count ([`Store::announce`](crate::store::Store::announce)):
    /// a store used on its own announces nothing.
    wanted: AtomicBool,
    /// How many limiters were built over the store: each has a fallback of its own, so
    /// each counts as a server (two layers of one process that share a count take two
    /// shares of it, not two whole quotas).
    limiters: AtomicU64,
    /// Whether the heartbeat task runs.
    started: AtomicBool,
    /// Whether the first check counted again.
    recounted: AtomicBool,
    /// This server's name in the set: random, never another's.
    member: String,
    /// The connection on which the charge and refund scripts were loaded last (0: none).
    loaded: AtomicU64,
    /// When the first count came back.
    first: std::sync::OnceLock<std::time::Instant>,
    /// When `count` last rose or was confirmed (ms after `first`).
    high_at: AtomicU64,
}

impl Presence {
    pub(super) fn new(identity: usize) -> Self {
        use std::hash::BuildHasher;
        let seed = hashbrown::DefaultHashBuilder::default();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let member = format!("{:016x}", seed.hash_one((std::process::id(), nanos, identity)));
        Self {
            count: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            limiters: AtomicU64::new(0),
            started: AtomicBool::new(false),
            recounted: AtomicBool::new(false),
            member,
            loaded: AtomicU64::new(0),
            first: std::sync::OnceLock::new(),
            high_at: AtomicU64::new(0),
        }
    }

    /// The servers counted last, if any count succeeded; one more for the first [`LAPSE`]
    /// (see the module docs).
    pub(super) fn servers(&self) -> Option<u64> {
        let n = self.count.load(Ordering::Relaxed);
        let young = self.first.get().is_some_and(|t| t.elapsed() < LAPSE);
        (n > 0).then(|| n + u64::from(young))
    }

    /// A count came back: taken at once when it is higher, and only once the higher one
    /// has held for [`LAPSE`] when it is lower (after a restart of Redis, the set fills
    /// again one announcement at a time).
    fn counted(&self, n: u64) {
        let first = *self.first.get_or_init(std::time::Instant::now);
        let now = u64::try_from(first.elapsed().as_millis()).unwrap_or(u64::MAX);
        let held = now.saturating_sub(self.high_at.load(Ordering::Relaxed));
        if n >= self.count.load(Ordering::Relaxed) || held >= u64::try_from(LAPSE.as_millis()).unwrap_or(u64::MAX) {
            self.count.store(n, Ordering::Relaxed);
            self.high_at.store(now, Ordering::Relaxed);
        }
    }

    /// Whether the first check has yet to count again: true once, for a store a limiter
    /// asked to count.
    pub(super) fn recount_now(&self) -> bool {
        !self.recounted.load(Ordering::Relaxed)
            && self.wanted.load(Ordering::Relaxed)
            && !self.recounted.swap(true, Ordering::AcqRel)
    }
}

/// One more limiter over `inner`'s store counts on it: its heartbeat starts. Dropping
/// what this returns (with the limiter) withdraws it.
pub(super) fn announce_limiter(inner: &Arc<Inner>) -> crate::store::Announced {
    inner.presence.limiters.fetch_add(1, Ordering::Relaxed);
    inner.presence.wanted.store(true, Ordering::Relaxed);
    start(inner);
    crate::store::Announced::new(Withdraw(Arc::downgrade(inner)))
}

/// One limiter's announcement: withdrawn when dropped (its members lapse).
struct Withdraw(Weak<Inner>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.presence.limiters.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Starts the heartbeat of `inner`'s store, once, when a runtime is running (else the
/// first check starts it). It ends when the store is dropped.
pub(super) fn start(inner: &Arc<Inner>) {
    let presence = &inner.presence;
    if presence.started.load(Ordering::Relaxed) || presence.started.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        presence.started.store(false, Ordering::Release);
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    drop(runtime.spawn(async move {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            announce(&inner).await;
            drop(inner);
            tokio::time::sleep(HEARTBEAT).await;
        }
    }));
}

/// Starts the heartbeat if it does not run yet, and counts once more at once, in a task of
/// its own.
pub(super) fn recount(inner: &Arc<Inner>) {
    start(inner);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let inner = Arc::clone(inner);
    drop(runtime.spawn(async move { announce(&inner).await }));
}

/// Announces this server and counts: the count is kept when the store answers.
pub(super) async fn announce(inner: &Inner) {
    let name = format!("{}:servers", inner.config.names.prefix);
    let mut cmd = redis::cmd("EVAL");
    let limiters = inner.presence.limiters.load(Ordering::Relaxed);
    cmd.arg(ANNOUNCE).arg(1).arg(&name).arg(&inner.presence.member).arg(LAPSE.as_millis() as u64).arg(limiters);
    let Ok((conn, generation)) = inner.connection().await else { return };
    let slot = inner.config.origin.is_cluster().then(|| super::keys::slot(name.as_bytes()));
    if let Ok(Value::Int(n)) = inner.query(conn.clone(), generation, slot, &cmd, None).await {
        inner.presence.counted(u64::try_from(n).unwrap_or(0));
    }
    let presence = &inner.presence;
    if presence.loaded.load(Ordering::Relaxed) != generation {
        let mut loaded = true;
        for script in [&SCRIPTS.multi, &SCRIPTS.refund] {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.text);
            loaded &= inner.query(conn.clone(), generation, None, &load, None).await.is_ok();
        }
        if loaded {
            presence.loaded.store(generation, Ordering::Relaxed);
        }
    }
}
