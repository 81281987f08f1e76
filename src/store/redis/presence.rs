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
use std::time::Duration;

use super::slots::millis;

/// How often a server announces itself and counts.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long an announcement counts: a server that stopped is no longer counted after
/// this.
pub(super) const LAPSE: Duration = Duration::from_secs(3);

/// Adds this server (`ARGV[1]:1`, when `ARGV[3]` is 1: a limiter counts on it; 0: it is
/// withdrawn and lapses) until `ARGV[2]` ms from the server's now, drops the lapsed, and
/// counts the rest.
pub(super) const ANNOUNCE: &str = "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, tonumber(ARGV[3]) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1] .. ':' .. i)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])";

/// One store's part in the count.
#[derive(Default)]
pub(super) struct Presence {
    /// The servers counted last; 0 before the first count.
    pub(super) count: AtomicU64,
    /// Whether a limiter asked for the count ([`Store::announce`](crate::store::Store::announce)):
    /// a store used on its own announces nothing.
    pub(super) wanted: AtomicBool,
    /// How many live limiters count on the store: the process is announced (one member)
    /// while there is one at least. Limiters of one process are one server: two layers
    /// that share a rule's count divide their shares of it between themselves instead
    /// (see the rule-name registry).
    pub(super) limiters: AtomicU64,
    /// Whether the heartbeat task runs.
    pub(super) started: AtomicBool,
    /// Whether the first check counted again.
    pub(super) recounted: AtomicBool,
    /// This server's name in the set: random per process, and the store's identity, so
    /// that every copy of one store in one process (`response_timeout`, …) announces one
    /// member, and stores built separately (several servers played in one process) two.
    pub(super) member: String,
    /// The connection on which the charge and refund scripts were loaded last (0: none).
    pub(super) loaded: AtomicU64,
    /// When the first count came back.
    pub(super) first: std::sync::OnceLock<std::time::Instant>,
    /// When `count` last rose or was confirmed (ms after `first`).
    pub(super) high_at: AtomicU64,
    /// Whether the first [`LAPSE`] after `first` is over (for good): read on every
    /// decision, it spares the clock.
    settled: AtomicBool,
}

impl Presence {
    pub(super) fn new(identity: usize) -> Self {
        use std::hash::BuildHasher;
        // Random per process (fixed keys: one member per identity in the whole process).
        static PROCESS: std::sync::OnceLock<(u32, Duration)> = std::sync::OnceLock::new();
        let process = PROCESS.get_or_init(|| {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (std::process::id(), nanos)
        });
        let seed = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
        let member = format!("{:016x}", seed.hash_one((process, identity)));
        Self { member, ..Self::default() }
    }

    /// The servers counted last, if any count succeeded; one more for the first [`LAPSE`]
    /// (see the module docs).
    pub(super) fn servers(&self) -> Option<u64> {
        let n = self.count.load(Ordering::Relaxed);
        if n == 0 {
            return None;
        }
        let young = !self.settled.load(Ordering::Relaxed) && self.first.get().is_some_and(|t| t.elapsed() < LAPSE);
        if !young && self.first.get().is_some() {
            self.settled.store(true, Ordering::Relaxed);
        }
        Some(n + u64::from(young))
    }

    /// A count came back: taken at once when it is higher, and only once the higher one
    /// has held for [`LAPSE`] when it is lower (after a restart of Redis, the set fills
    /// again one announcement at a time).
    pub(super) fn counted(&self, n: u64) {
        let first = *self.first.get_or_init(std::time::Instant::now);
        let now = millis(first.elapsed());
        let held = now.saturating_sub(self.high_at.load(Ordering::Relaxed));
        if n >= self.count.load(Ordering::Relaxed) || held >= millis(LAPSE) {
            self.count.store(n, Ordering::Relaxed);
            self.high_at.store(now, Ordering::Relaxed);
        }
    }

    /// Whether a limiter counts on this store and its heartbeat does not run (its runtime
    /// shut down): two loads, on every check.
    pub(super) fn stopped(&self) -> bool {
        self.wanted.load(Ordering::Relaxed) && !self.started.load(Ordering::Relaxed)
    }

    /// Whether the first check has yet to count again: true once, for a store a limiter
    /// asked to count.
    pub(super) fn recount_now(&self) -> bool {
        !self.recounted.load(Ordering::Relaxed)
            && self.wanted.load(Ordering::Relaxed)
            && !self.recounted.swap(true, Ordering::AcqRel)
    }
}
