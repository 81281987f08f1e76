//! The local blocked-key cache: keys known to be rejected until some time are rejected in
//! this process, with no store call.

use super::sharded::{Sharded, SHARDS};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hashbrown::HashTable;

use crate::decision::Decision;
use crate::key::Key;
use crate::quota::Quota;

/// What the cache knows of a (rule, key) rejection that still applies.
pub(crate) enum Cached {
    /// Rejected: the store's decision as it stands now.
    Blocked(Decision),
    /// Rejected when last asked, and due to be asked again.
    Recheck,
}

/// Keys known to be rejected until some time: rejected locally, with no store call.
pub(crate) struct BlockedCache {
    shards: Sharded<Blocked>,
    cap_per_shard: usize,
    /// The latest `until` ever recorded: from then on nothing is blocked, and a lookup
    /// takes no lock (the common case of a service whose clients stay within limits).
    last_until: AtomicU64,
    /// How many entries were forgotten (units refunded, a reset): a rejection the store
    /// made before a forget may describe units that are back, so it is not recorded.
    forgets: AtomicU64,
}

struct Blocked {
    table: HashTable<BlockedEntry>,
    sweep_at: usize,
}

struct BlockedEntry {
    rule: RuleId,
    key: Key,
    /// The smallest cost known rejected, and the quota it was rejected under.
    cost: u64,
    quota: Quota,
    until: u64,
    /// Until when the entry answers (`until`, or sooner: see `insert`'s `max_age`).
    fresh_until: u64,
    /// The store's rejection, and when it was made: a cached answer says what the store
    /// said (its remaining units, its times less what has passed since).
    decision: Decision,
    at: u64,
}

/// A rule's identity in this process: a hash of what decides how its store state reads
/// (its name, its algorithm; see `RuleSet::id`), the same in every rule set that keeps
/// them, so what the store taught outlives a swap that keeps the rule.
pub(crate) type RuleId = u64;

impl BlockedCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: Sharded::new(|| Blocked { table: HashTable::new(), sweep_at: 64 }),
            cap_per_shard: capacity / SHARDS,
            last_until: AtomicU64::new(0),
            forgets: AtomicU64::new(0),
        }
    }

    fn shard(&self, rule: RuleId, key: &Key) -> (u64, std::sync::MutexGuard<'_, Blocked>) {
        self.shards.lock(rule, key)
    }

    /// If (rule, key) is blocked at `now` for `cost` under `quota`: the store's rejection
    /// as it stands now (its durations less the time since).
    #[cfg(test)]
    pub(crate) fn blocked(&self, rule: RuleId, key: &Key, cost: u64, quota: Quota, now: u64) -> Option<Decision> {
        match self.lookup(rule, key, cost, quota, now)? {
            Cached::Blocked(d) => Some(d),
            Cached::Recheck => None,
        }
    }

    /// [`BlockedCache::blocked`], and whether a rejection that still applies is due to be
    /// asked of the store again ([`Cached::Recheck`]): then no other rule's cached
    /// rejection may answer for the request either, as it might not be the longest wait.
    pub(crate) fn lookup(&self, rule: RuleId, key: &Key, cost: u64, quota: Quota, now: u64) -> Option<Cached> {
        if now >= self.last_until.load(Ordering::Relaxed) {
            return None;
        }
        let (h, shard) = self.shard(rule, key);
        let e = shard.table.find(h, |e| e.rule == rule && e.key == *key)?;
        if !(e.until > now && cost >= e.cost && quota == e.quota) {
            return None;
        }
        if e.fresh_until <= now {
            return Some(Cached::Recheck);
        }
        Some(Cached::Blocked({
            let left = Duration::from_micros(e.until - now);
            let passed = Duration::from_micros(now.saturating_sub(e.at));
            let d = &e.decision;
            // On a 429 the next unit comes with the retry (as the store's answer says).
            Decision::from_parts(
                d.allowed,
                d.limit,
                d.remaining(),
                d.reset_after().saturating_sub(passed).max(left),
                left,
                Some(left),
                Duration::ZERO,
            )
        }))
    }

    /// Where the forgets stand: take it before asking the store, and give it to
    /// [`BlockedCache::insert`] with the store's rejection.
    pub(crate) fn epoch(&self) -> u64 {
        self.forgets.load(Ordering::Acquire)
    }

    /// Records that (rule, key) rejects `cost`, as `decision` says: until its retry, or
    /// for `max_age` µs at most (then the store is asked again; the answers given until
    /// then still say the whole retry) — unless something was forgotten since `epoch`
    /// (units came back while the store decided: its rejection may not hold).
    #[allow(clippy::too_many_arguments, reason = "one entry's fields")]
    pub(crate) fn insert(
        &self,
        rule: RuleId,
        key: &Key,
        cost: u64,
        quota: Quota,
        now: u64,
        decision: &Decision,
        max_age: u64,
        epoch: u64,
    ) {
        let Some(retry) = decision.retry_after() else { return };
        let until = now.saturating_add(u64::try_from(retry.as_micros()).unwrap_or(u64::MAX));
        let fresh_until = until.min(now.saturating_add(max_age));
        let (h, mut shard) = self.shard(rule, key);
        // Under the shard's lock, which a forget of this key takes too (and counts under).
        if self.forgets.load(Ordering::Acquire) != epoch {
            return;
        }
        // A lookup racing with this may miss the new entry and ask the store: harmless.
        self.last_until.fetch_max(fresh_until, Ordering::Relaxed);
        let entry =
            BlockedEntry { rule, key: key.clone(), cost, quota, until, fresh_until, decision: *decision, at: now };
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == *key) {
            *e = entry;
            return;
        }
        if shard.table.len() >= shard.sweep_at {
            shard.table.retain(|e| e.fresh_until > now);
            shard.sweep_at = (shard.table.len() * 2).max(64);
        }
        if shard.table.len() >= self.cap_per_shard {
            return; // bounded: under a flood of distinct keys, stop caching
        }
        let shards = &self.shards;
        shard.table.insert_unique(h, entry, |e| shards.hash(e.rule, &e.key));
    }

    /// Forgets (rule, key): after an admin reset, the key must reach the store again.
    pub(crate) fn forget(&self, rule: RuleId, key: &Key) {
        let (h, mut shard) = self.shard(rule, key);
        self.forgets.fetch_add(1, Ordering::AcqRel);
        if let Ok(e) = shard.table.find_entry(h, |e| e.rule == rule && e.key == *key) {
            e.remove();
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.each().map(|s| s.table.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's rejection: 3 of 10 left, the next fit in `retry` µs, all back in 40 s.
    fn rejected(retry: u64) -> Decision {
        Decision::from_parts(
            false,
            10,
            3,
            Duration::from_secs(40),
            Duration::from_micros(retry),
            Some(Duration::from_micros(retry)),
            Duration::ZERO,
        )
    }

    #[test]
    fn blocked_cache_is_exact_and_bounded() {
        let cache = BlockedCache::new(SHARDS * 100);
        let k = Key::from("k");
        let q = Quota::per_minute(10);
        cache.insert(7, &k, 2, q, 1_000, &rejected(500), u64::MAX, 0);
        let d = cache.blocked(7, &k, 2, q, 1_499).unwrap();
        // The store's answer, 499 µs on.
        assert_eq!((d.allowed, d.limit, d.remaining()), (false, 10, 3));
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)));
        assert_eq!(d.refill_after(), Duration::from_micros(1));
        assert_eq!(d.reset_after(), Duration::from_micros(40_000_000 - 499));
        assert!(cache.blocked(7, &k, 3, q, 1_200).is_some(), "a larger cost is rejected too");
        assert!(cache.blocked(7, &k, 1, q, 1_200).is_none(), "a smaller cost may fit");
        assert!(cache.blocked(7, &k, 2, Quota::per_minute(20), 1_200).is_none(), "another tier's limit");
        assert!(cache.blocked(7, &k, 2, Quota::per_hour(10), 1_200).is_none(), "another tier's period");
        assert!(cache.blocked(7, &k, 2, q, 1_500).is_none());
        cache.insert(71, &k, 1, q, 1_000, &rejected(100), u64::MAX, 0);
        assert!(cache.blocked(71, &k, 1, q, 1_050).is_some(), "an earlier end recorded later");
        assert!(cache.blocked(71, &k, 2, q, 1_200).is_none());
        for i in 0..10_000 {
            cache.insert(7, &Key::from(format!("k{i}")), 1, q, 2_000, &rejected(1_000_000), u64::MAX, 0);
        }
        assert!(cache.len() <= SHARDS * 100 + SHARDS);
    }

    /// An entry with a `max_age` answers for that long only, and says the whole retry.
    #[test]
    fn a_short_lived_entry_says_the_whole_retry_and_then_asks_again() {
        let cache = BlockedCache::new(SHARDS * 100);
        let (k, q) = (Key::from("k"), Quota::per_minute(10));
        cache.insert(9, &k, 1, q, 1_000, &rejected(10_000), 100, 0);
        let d = cache.blocked(9, &k, 1, q, 1_050).expect("fresh");
        assert_eq!(d.retry_after(), Some(Duration::from_micros(9_950)), "the store's retry, not the cache's age");
        assert!(cache.blocked(9, &k, 1, q, 1_100).is_none(), "asked again after max_age");
    }

    /// A rejection the store made before a forget (units refunded meanwhile) is not
    /// recorded: it would outlive the refund.
    #[test]
    fn a_rejection_from_before_a_forget_is_not_recorded() {
        let cache = BlockedCache::new(SHARDS * 100);
        let (k, q) = (Key::from("k"), Quota::per_minute(10));
        let epoch = cache.epoch();
        cache.forget(5, &Key::from("other"));
        cache.insert(5, &k, 1, q, 1_000, &rejected(10_000), u64::MAX, epoch);
        assert!(cache.blocked(5, &k, 1, q, 1_001).is_none(), "recorded after a forget");
        cache.insert(5, &k, 1, q, 1_000, &rejected(10_000), u64::MAX, cache.epoch());
        assert!(cache.blocked(5, &k, 1, q, 1_001).is_some());
    }
}
