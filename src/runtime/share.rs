//! What this server may still admit of each key while the store cannot answer: its share
//! of what the store last said remains. The fallback limiter starts every key it knows
//! nothing about at a fresh share of the quota; a key the store has answered for starts
//! at a share of what was left (the store may have admitted most of the quota already).

use std::hash::BuildHasher;
use std::sync::Mutex;

use hashbrown::HashTable;

use super::RuleId;
use crate::key::Key;

/// Per (rule, key): this server's share of what the store said remains, until the quota
/// is whole again.
pub(crate) struct Shares {
    shards: Box<[Mutex<Shard>]>,
    hasher: hashbrown::DefaultHashBuilder,
    cap_per_shard: usize,
}

/// One shard: its entries, and when it last dropped its lapsed ones, full.
#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
    swept: u64,
}

/// How often a full shard drops its lapsed entries, µs.
const FULL_SWEEP_US: u64 = 1_000_000;

struct Entry {
    rule: RuleId,
    key: Key,
    /// Units this server may still admit in the fallback.
    left: u64,
    /// When the store's quota is whole again (µs, the runtime's clock): the share no
    /// longer binds.
    until: u64,
}

const SHARDS: usize = 16;

impl Shares {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: hashbrown::DefaultHashBuilder::default(),
            cap_per_shard: (capacity / SHARDS).max(1),
        }
    }

    fn shard(&self, rule: RuleId, key: &Key) -> (u64, std::sync::MutexGuard<'_, Shard>) {
        let h = self.hasher.hash_one((rule, key));
        #[allow(clippy::cast_possible_truncation)]
        let i = ((h >> 32) as usize) % SHARDS;
        (h, self.shards[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// The store said `remaining` units of (rule, key) are left at `now`, and all of them
    /// back `whole_in` µs later: this server's share is `remaining / servers`, rounded
    /// down, until then. An answer that came `late` (after its call's deadline, while the
    /// fallback decided) only lowers the share: the fallback may have admitted more since
    /// that call, in calls the store has yet to count.
    #[allow(clippy::too_many_arguments, reason = "one entry's fields")]
    pub(crate) fn record(
        &self,
        rule: RuleId,
        key: &Key,
        remaining: u64,
        whole_in: u64,
        servers: u64,
        now: u64,
        late: bool,
    ) {
        let left = remaining / servers.max(1);
        let until = now.saturating_add(whole_in);
        let (h, mut shard) = self.shard(rule, key);
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == *key) {
            (e.left, e.until) =
                if late && e.until > now { (left.min(e.left), until.max(e.until)) } else { (left, until) };
            return;
        }
        if shard.table.len() >= self.cap_per_shard {
            if now.saturating_sub(shard.swept) < FULL_SWEEP_US {
                return; // bounded: a key not recorded gets the fallback's fresh share
            }
            shard.swept = now;
            shard.table.retain(|e| e.until > now);
            if shard.table.len() >= self.cap_per_shard {
                return;
            }
        }
        let entry = Entry { rule, key: key.clone(), left, until };
        let hasher = &self.hasher;
        shard.table.insert_unique(h, entry, |e| hasher.hash_one((e.rule, &e.key)));
    }

    /// Whether `cost` units of (rule, key) fit in this server's share at `now`: `Err`
    /// with the µs until the store's quota is whole again when they do not. A key the
    /// store said nothing about (or long enough ago) fits.
    pub(crate) fn fits(&self, rule: RuleId, key: &Key, cost: u64, now: u64) -> Result<(), u64> {
        let (h, shard) = self.shard(rule, key);
        match shard.table.find(h, |e| e.rule == rule && e.key == *key) {
            Some(e) if e.until > now && e.left < cost => Err(e.until - now),
            _ => Ok(()),
        }
    }

    /// Takes `cost` units of (rule, key) from this server's share: what the fallback
    /// admitted.
    pub(crate) fn take(&self, rule: RuleId, key: &Key, cost: u64, now: u64) {
        let (h, mut shard) = self.shard(rule, key);
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == *key) {
            if e.until > now {
                e.left = e.left.saturating_sub(cost);
            }
        }
    }
}

impl Shares {
    /// What this server may still admit of (rule, key) at `now`, when the store said how
    /// much remains and that still binds.
    pub(crate) fn left(&self, rule: RuleId, key: &Key, now: u64) -> Option<u64> {
        let (h, shard) = self.shard(rule, key);
        shard.table.find(h, |e| e.rule == rule && e.key == *key).filter(|e| e.until > now).map(|e| e.left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_what_remains_binds_until_the_quota_is_whole() {
        let shares = Shares::new(SHARDS * 4);
        let k = Key::from("k");
        assert_eq!(shares.fits((1, 0), &k, 1, 0), Ok(()), "nothing known: the fresh share decides");
        // 10 left, 3 servers: 3 for this one, for 1 s.
        shares.record((1, 0), &k, 10, 1_000_000, 3, 0, false);
        for _ in 0..3 {
            assert_eq!(shares.fits((1, 0), &k, 1, 10), Ok(()));
            shares.take((1, 0), &k, 1, 10);
        }
        assert_eq!(shares.fits((1, 0), &k, 1, 10), Err(999_990));
        assert_eq!(shares.fits((1, 1), &k, 1, 10), Ok(()), "another rule");
        assert_eq!(shares.fits((1, 0), &k, 1, 1_000_000), Ok(()), "the quota is whole again");
        // A late answer only lowers it: the fallback admitted since.
        shares.record((1, 0), &k, 3, 1_000_000, 1, 20, true);
        assert_eq!(shares.fits((1, 0), &k, 1, 21), Err(999_999));
        shares.record((1, 0), &k, 0, 5, 3, 20, true);
        assert_eq!(shares.fits((1, 0), &k, 1, 21), Err(999_999), "the quota is whole no sooner");
        // An answer in time replaces it, up or down.
        shares.record((1, 0), &k, 9, 50, 3, 30, false);
        assert_eq!(shares.fits((1, 0), &k, 3, 31), Ok(()));
        assert_eq!(shares.fits((1, 0), &k, 4, 31), Err(49));
    }

    /// A full shard drops its lapsed entries at most once a second, not at each new key.
    #[test]
    fn a_full_shard_sweeps_once_a_second() {
        let shares = Shares::new(SHARDS);
        // One entry a shard, lapsing at 10 µs: every shard is full.
        let mut i = 0;
        while shares.shards.iter().any(|s| s.lock().unwrap().table.is_empty()) {
            shares.record((1, 0), &Key::from(format!("k{i}")), 0, 10, 1, 0, false);
            i += 1;
        }
        let x = Key::from("x");
        // At 20 µs the entries have lapsed, but the shard swept less than a second ago.
        shares.record((1, 0), &x, 0, 1_000_000, 1, 20, false);
        assert_eq!(shares.fits((1, 0), &x, 1, 21), Ok(()), "full, no sweep within the second: not recorded");
        shares.record((1, 0), &x, 0, 1_000_000, 1, 2_000_000, false);
        assert!(shares.fits((1, 0), &x, 1, 2_000_001).is_err(), "the lapsed entries made room");
    }

    #[test]
    fn shares_are_bounded() {
        let shares = Shares::new(SHARDS * 4);
        for i in 0..1_000 {
            shares.record((1, 0), &Key::from(format!("k{i}")), 0, u64::MAX / 2, 1, 0, false);
        }
        let n: usize = shares.shards.iter().map(|s| s.lock().unwrap().table.len()).sum();
        assert!(n <= SHARDS * 4, "{n} entries");
    }
}
