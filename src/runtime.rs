//! What a layer keeps at run time, shared by every clone of its service: the circuit
//! breaker, the in-flight counter, the local blocked-key cache, the fallback limiter and
//! the rate limiter of its own warnings.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use crate::key::Key;
use crate::{Quota, StoreError};

pub(crate) struct Runtime {
    pub(crate) deadline: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) breaker: Breaker,
    #[cfg(feature = "memory")]
    pub(crate) fallback: Option<(crate::MemoryStore, u64)>,
    pub(crate) cache_enabled: bool,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) cache: BlockedCache,
    warn_at: AtomicU64,
    suppressed: AtomicU64,
    base: Instant,
}

impl Default for Runtime {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(50),
            max_in_flight: 1024,
            breaker: Breaker::new(5, Duration::from_secs(1)),
            #[cfg(feature = "memory")]
            fallback: None,
            cache_enabled: true,
            in_flight: AtomicUsize::new(0),
            cache: BlockedCache::new(100_000),
            warn_at: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            base: Instant::now(),
        }
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("deadline", &self.deadline)
            .field("max_in_flight", &self.max_in_flight)
            .field("breaker", &self.breaker)
            .field("cache_enabled", &self.cache_enabled)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// The same settings with fresh counters (a layer reconfigured after cloning).
    pub(crate) fn fresh_copy(&self) -> Self {
        Self {
            deadline: self.deadline,
            max_in_flight: self.max_in_flight,
            breaker: Breaker::new(self.breaker.threshold, self.breaker.cool_down),
            #[cfg(feature = "memory")]
            fallback: self.fallback.clone(),
            cache_enabled: self.cache_enabled,
            ..Self::default()
        }
    }

    /// Microseconds on this runtime's monotonic clock (tokio's, so paused-time tests work).
    pub(crate) fn mono_us(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Logs a store failure at most once per 10 s, saying how many were not logged.
    pub(crate) fn warn_store_failure(&self, err: &StoreError, failed_open: bool) {
        let now_ms = self.mono_us() / 1000 + 10_000;
        let last = self.warn_at.load(Ordering::Relaxed);
        if now_ms >= last + 10_000
            && self.warn_at.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            let action = if failed_open { "request passed (fail open)" } else { "request refused (fail closed)" };
            tracing::warn!(error = %err, suppressed, "tollgate: rate-limit store failed; {action}");
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Counts store calls in flight; `None` when the cap is reached.
pub(crate) struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    pub(crate) fn enter(counter: &'a AtomicUsize, cap: usize) -> Option<Self> {
        let n = counter.fetch_add(1, Ordering::AcqRel);
        if n >= cap {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self(counter))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A circuit breaker: closed; open for `cool_down` after `threshold` consecutive
/// failures; then one probe decides whether it closes or opens again.
pub(crate) struct Breaker {
    threshold: u32,
    cool_down: Duration,
    failures: AtomicU32,
    /// Monotonic µs until which the circuit is open; 0 when closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("threshold", &self.threshold)
            .field("cool_down", &self.cool_down)
            .field("open", &(self.open_until.load(Ordering::Relaxed) != 0))
            .finish()
    }
}

/// Whether a call may go to the store, and if it is the half-open probe.
pub(crate) enum Admit {
    Call { probe: bool },
    Refuse(Duration),
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    pub(crate) fn admit(&self, now_us: u64) -> Admit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Admit::Call { probe: false };
        }
        if now_us < until {
            return Admit::Refuse(Duration::from_micros(until - now_us));
        }
        if self.probing.swap(true, Ordering::AcqRel) {
            return Admit::Refuse(self.cool_down);
        }
        Admit::Call { probe: true }
    }

    pub(crate) fn success(&self, probe: bool) {
        self.failures.store(0, Ordering::Relaxed);
        if probe || self.open_until.load(Ordering::Relaxed) != 0 {
            self.open_until.store(0, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            crate::metrics::circuit_open(false);
            if probe {
                tracing::info!("tollgate: store answered the probe; circuit closed");
            }
        }
    }

    pub(crate) fn failure(&self, probe: bool, now_us: u64) {
        let cool = u64::try_from(self.cool_down.as_micros()).unwrap_or(u64::MAX);
        if probe {
            self.open_until.store(now_us.saturating_add(cool).max(1), Ordering::Release);
            self.probing.store(false, Ordering::Release);
            return;
        }
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.threshold && self.open_until.load(Ordering::Relaxed) == 0 {
            self.open_until.store(now_us.saturating_add(cool).max(1), Ordering::Release);
            crate::metrics::circuit_open(true);
            tracing::warn!(failures = n, cool_down = ?self.cool_down, "tollgate: store keeps failing; circuit open");
        }
    }
}

/// Keys known to be rejected until some time: rejected locally, with no store call.
pub(crate) struct BlockedCache {
    shards: Box<[Mutex<Blocked>]>,
    /// foldhash with a random seed, as `MemoryStore`'s.
    hasher: hashbrown::DefaultHashBuilder,
    cap_per_shard: usize,
    /// The latest `until` ever recorded: from then on nothing is blocked, and a lookup
    /// takes no lock (the common case of a service whose clients stay within limits).
    last_until: AtomicU64,
}

struct Blocked {
    table: HashTable<BlockedEntry>,
    sweep_at: usize,
}

struct BlockedEntry {
    rule: usize,
    key: Key,
    /// The smallest cost known rejected, and the quota it was rejected under.
    cost: u64,
    quota: Quota,
    until: u64,
    retry: Duration,
}

const SHARDS: usize = 16;

impl BlockedCache {
    fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Blocked { table: HashTable::new(), sweep_at: 64 })).collect(),
            hasher: hashbrown::DefaultHashBuilder::default(),
            cap_per_shard: capacity / SHARDS,
            last_until: AtomicU64::new(0),
        }
    }

    fn shard(&self, rule: usize, key: &Key) -> (u64, std::sync::MutexGuard<'_, Blocked>) {
        let h = self.hasher.hash_one((rule, key));
        // The upper half: the table inside the shard picks buckets by the low bits.
        #[allow(clippy::cast_possible_truncation)]
        let i = ((h >> 32) as usize) % SHARDS;
        (h, self.shards[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// If (rule, key) is blocked at `now` for `cost` under `quota`: the time left.
    pub(crate) fn blocked(&self, rule: usize, key: &Key, cost: u64, quota: Quota, now: u64) -> Option<Duration> {
        if now >= self.last_until.load(Ordering::Relaxed) {
            return None;
        }
        let (h, shard) = self.shard(rule, key);
        let e = shard.table.find(h, |e| e.rule == rule && e.key == *key)?;
        (e.until > now && cost >= e.cost && quota == e.quota).then(|| {
            let left = Duration::from_micros(e.until - now);
            left.min(e.retry)
        })
    }

    /// Records that (rule, key) rejects `cost` for `retry`.
    pub(crate) fn insert(&self, rule: usize, key: &Key, cost: u64, quota: Quota, now: u64, retry: Duration) {
        let until = now.saturating_add(u64::try_from(retry.as_micros()).unwrap_or(u64::MAX));
        let (h, mut shard) = self.shard(rule, key);
        // A lookup racing with this may miss the new entry and ask the store: harmless.
        self.last_until.fetch_max(until, Ordering::Relaxed);
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == *key) {
            *e = BlockedEntry { rule, key: key.clone(), cost, quota, until, retry };
            return;
        }
        if shard.table.len() >= shard.sweep_at {
            shard.table.retain(|e| e.until > now);
            shard.sweep_at = (shard.table.len() * 2).max(64);
        }
        if shard.table.len() >= self.cap_per_shard {
            return; // bounded: under a flood of distinct keys, stop caching
        }
        let hasher = &self.hasher;
        shard.table.insert_unique(h, BlockedEntry { rule, key: key.clone(), cost, quota, until, retry }, |e| {
            hasher.hash_one((e.rule, &e.key))
        });
    }

    /// Forgets (rule, key): after an admin reset, the key must reach the store again.
    pub(crate) fn forget(&self, rule: usize, key: &Key) {
        let (h, mut shard) = self.shard(rule, key);
        if let Ok(e) = shard.table.find_entry(h, |e| e.rule == rule && e.key == *key) {
            e.remove();
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().table.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_probes_and_closes() {
        let b = Breaker::new(3, Duration::from_secs(1));
        for _ in 0..2 {
            b.failure(false, 0);
        }
        assert!(matches!(b.admit(0), Admit::Call { probe: false }));
        b.failure(false, 0);
        assert!(matches!(b.admit(500_000), Admit::Refuse(d) if d == Duration::from_millis(500)));
        // After the cool-down exactly one caller probes.
        assert!(matches!(b.admit(1_000_000), Admit::Call { probe: true }));
        assert!(matches!(b.admit(1_000_001), Admit::Refuse(_)));
        b.failure(true, 1_000_002);
        assert!(matches!(b.admit(1_500_000), Admit::Refuse(_)));
        assert!(matches!(b.admit(2_000_002), Admit::Call { probe: true }));
        b.success(true);
        assert!(matches!(b.admit(2_000_003), Admit::Call { probe: false }));
    }

    #[test]
    fn in_flight_is_capped() {
        let c = AtomicUsize::new(0);
        let a = InFlight::enter(&c, 2).unwrap();
        let _b = InFlight::enter(&c, 2).unwrap();
        assert!(InFlight::enter(&c, 2).is_none());
        drop(a);
        assert!(InFlight::enter(&c, 2).is_some());
        assert_eq!(c.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn blocked_cache_is_exact_and_bounded() {
        let cache = BlockedCache::new(SHARDS * 100);
        let k = Key::from("k");
        let q = Quota::per_minute(10);
        cache.insert(0, &k, 2, q, 1_000, Duration::from_micros(500));
        assert!(cache.blocked(0, &k, 2, q, 1_499).is_some());
        assert!(cache.blocked(0, &k, 3, q, 1_200).is_some(), "a larger cost is rejected too");
        assert!(cache.blocked(0, &k, 1, q, 1_200).is_none(), "a smaller cost may fit");
        assert!(cache.blocked(0, &k, 2, Quota::per_minute(20), 1_200).is_none(), "another tier's limit");
        assert!(cache.blocked(0, &k, 2, Quota::per_hour(10), 1_200).is_none(), "another tier's period");
        assert!(cache.blocked(0, &k, 2, q, 1_500).is_none());
        cache.insert(1, &k, 1, q, 1_000, Duration::from_micros(100));
        assert!(cache.blocked(1, &k, 1, q, 1_050).is_some(), "an earlier end recorded later");
        assert!(cache.blocked(1, &k, 2, q, 1_200).is_none());
        for i in 0..10_000 {
            cache.insert(0, &Key::from(format!("k{i}")), 1, q, 2_000, Duration::from_secs(1));
        }
        assert!(cache.len() <= SHARDS * 100 + SHARDS);
    }
}
