//! What this server may still admit of each key while the store cannot answer: its share
//! of what the store last said remains. The fallback limiter starts every key it knows
//! nothing about at a fresh share of the quota; a key the store has answered for starts
//! at a share of what was left (the store may have admitted most of the quota already).
//!
//! A rule is named by its identity ([`RuleId`]), which a swap that keeps the rule's name
//! and algorithm keeps: what the store said outlives a reload. A share is rescaled to the
//! quota it is read under when that changed (a swap's new quota, a tier): what the key
//! used stays used, as in the store (see `LimiterHandle`).
//!
//! At most `capacity` entries in all (100,000 a limiter): when full, a new one takes the
//! place of the lapsed ones, else of the least binding (those with the most of their
//! share left, then those whose quota is whole soonest), which the fallback's fresh share
//! decides nearly alike. A key spent through the store is never pushed out by a flood of
//! keys the store answered for once.

use super::sharded::Sharded;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;

use super::RuleId;
use crate::algorithm::Algorithm;
use crate::key::Key;
use crate::quota::Quota;
use crate::store::Check;

/// Per (rule, key): this server's share of what the store said remains, until the quota
/// is whole again.
pub(crate) struct Shares {
    shards: Sharded<Shard>,
    /// The most entries, in all shards, and how many there are.
    cap: usize,
    len: AtomicUsize,
}

#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
}

struct Entry {
    rule: RuleId,
    key: Key,
    /// Units this server may still admit in the fallback, under `quota` (below 0: the key
    /// used more than `quota` holds, see [`rescaled`]).
    left: i64,
    /// When the store's quota is whole again (µs, the runtime's clock): the share no
    /// longer binds.
    until: u64,
    /// The quota `left` counts under, and the servers it was shared by.
    quota: Quota,
    servers: u64,
    /// How recent `left` is (µs): when the call whose answer set it was made, or the
    /// fallback's last take (which no answer to a call made before it counts). An answer
    /// to a call made before then is older news than what the entry holds.
    asked: u64,
}

impl Entry {
    /// How much the entry holds the fallback back beyond its fresh share (the quota
    /// divided by the servers), lowest first: the part of that share it says is gone, then
    /// when it lapses. The first to go when the shares are full.
    fn binding(&self) -> u128 {
        let fresh = self.quota.limit().max(self.quota.burst_size()) / self.servers.max(1);
        let fresh_i = i64::try_from(fresh).unwrap_or(i64::MAX);
        let left = u64::try_from(self.left.clamp(0, fresh_i)).unwrap_or(0);
        let gone = if fresh == 0 { 1024 } else { 1024 - u128::from(left) * 1024 / u128::from(fresh) };
        (gone << 64) | u128::from(self.until)
    }

    /// Reads the share under `quota` from now on (unchanged when it is the same).
    fn under(&mut self, quota: Quota, algorithm: Algorithm) -> &mut Self {
        if self.quota != quota {
            self.left = rescaled(self.left, self.servers, self.quota, quota, algorithm);
            self.quota = quota;
        }
        self
    }
}

/// This server's share `left` of what remains of a key under quota `from`, read under
/// `to`: what the key used stays used, as the store keeps it. The window algorithms count
/// units (a key that used 80 of 100 has 120 left of 200); the bucket algorithms and GCRA
/// keep time, read at the new rate (rounded up: never more than the store would admit).
/// Below 0 when the key used more than `to` holds: read back under `from`, it has used as
/// much as before.
fn rescaled(left: i64, servers: u64, from: Quota, to: Quota, algorithm: Algorithm) -> i64 {
    let s = i128::from(servers.max(1));
    let (cap_from, cap_to) = match algorithm {
        Algorithm::FixedWindow
        | Algorithm::SlidingWindowLog
        | Algorithm::SlidingWindowCounter
        | Algorithm::Concurrent => (from.limit(), to.limit()),
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => (from.burst_size(), to.burst_size()),
    };
    let used = i128::from(cap_from) / s - i128::from(left);
    let used = match algorithm {
        Algorithm::FixedWindow
        | Algorithm::SlidingWindowLog
        | Algorithm::SlidingWindowCounter
        | Algorithm::Concurrent => used,
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
            let (t_from, t_to) = (from.emission_interval_micros(), to.emission_interval_micros().max(1));
            // Rounded up: time ahead is never read as less.
            (used * i128::from(t_from)).div_euclid(i128::from(t_to))
                + i128::from((used * i128::from(t_from)).rem_euclid(i128::from(t_to)) != 0)
        }
    };
    let left = i128::from(cap_to) / s - used;
    i64::try_from(left).unwrap_or(if left < 0 { i64::MIN } else { i64::MAX })
}

impl Shares {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { shards: Sharded::new(Shard::default), cap: capacity.max(1), len: AtomicUsize::new(0) }
    }

    fn shard(&self, rule: RuleId, key: &Key) -> (u64, std::sync::MutexGuard<'_, Shard>) {
        self.shards.lock(rule, key)
    }

    /// The store said `remaining` units of `check`'s key under rule `rule` are left at
    /// `now` (under the check's quota), and all of them back `whole_in` µs later: this
    /// server's share is `remaining / servers`, rounded down, until then. An answer that
    /// came `late` (after its call's deadline, while the fallback decided) only lowers the
    /// share: the fallback may have admitted more since that call, in calls the store has
    /// yet to count. So does one to a call made (`asked`) before the one whose answer the
    /// share holds, or before the fallback's last take: answers reach this process in any
    /// order (a loaded one wakes its callers late), and an old one heard last must not
    /// raise the share a fresher one, or the fallback's takes since, lowered.
    #[allow(clippy::too_many_arguments, reason = "one entry's fields")]
    pub(crate) fn record(
        &self,
        rule: RuleId,
        check: &Check,
        remaining: u64,
        whole_in: u64,
        servers: u64,
        now: u64,
        asked: u64,
        late: bool,
    ) {
        let (key, quota, servers) = (&check.key, check.params.quota, servers.max(1));
        let left = i64::try_from(remaining / servers).unwrap_or(i64::MAX);
        let until = now.saturating_add(whole_in);
        let (h, mut shard) = self.shard(rule, key);
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == *key) {
            let old_news = late || asked < e.asked;
            let e = e.under(quota, check.algorithm);
            (e.left, e.until) =
                if old_news && e.until > now { (left.min(e.left), until.max(e.until)) } else { (left, until) };
            e.servers = servers;
            if !old_news || e.until <= now {
                e.asked = asked;
            }
            return;
        }
        let entry = Entry { rule, key: key.clone(), left, until, quota, servers, asked };
        if self.len.load(Ordering::Relaxed) >= self.cap && !self.make_room(&mut shard, now, entry.binding()) {
            // Full of entries that bind more than this one: it is not recorded (the
            // fallback's fresh share decides the key, which holds less back).
            return;
        }
        // Another shard's room may be taken meanwhile: the count may pass the cap by the
        // records under way (a few), never more.
        self.len.fetch_add(1, Ordering::Relaxed);
        let shards = &self.shards;
        shard.table.insert_unique(h, entry, |e| shards.hash(e.rule, &e.key));
    }

    /// Whether `cost` units of `check`'s key under rule `rule` fit in this server's share
    /// at `now`, under the check's quota: `Err` with the µs until the store's quota is
    /// whole again when they do not. A key the store said nothing about (or long enough
    /// ago) fits.
    pub(crate) fn fits(&self, rule: RuleId, check: &Check, cost: u64, now: u64) -> Result<(), u64> {
        let (h, mut shard) = self.shard(rule, &check.key);
        match shard.table.find_mut(h, |e| e.rule == rule && e.key == check.key) {
            Some(e) if e.until > now => {
                let e = e.under(check.params.quota, check.algorithm);
                if e.left < i64::try_from(cost).unwrap_or(i64::MAX) {
                    Err(e.until - now)
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// Full: makes room in `shard` (the new entry's, whose binding is `incoming`), whose
    /// entries are a sample of all (keys are spread by a seeded hash): an eighth of it,
    /// its lapsed entries first, then its least binding (see [`Entry::binding`]) — only
    /// those that bind less than the new entry: a shard that holds only spent keys keeps
    /// them (it once gave one up to a key with most of its share left). Each round frees
    /// room for the records that follow, in any shard: a record pays for a round once per
    /// eighth of a shard. Whether any room was made.
    fn make_room(&self, shard: &mut Shard, now: u64, incoming: u128) -> bool {
        let before = shard.table.len();
        let n = (before / 8).max(1);
        shard.table.retain(|e| e.until > now);
        let lapsed = before - shard.table.len();
        if lapsed < n && !shard.table.is_empty() {
            let mut scores: Vec<u128> = shard.table.iter().map(Entry::binding).filter(|&b| b < incoming).collect();
            let mut to_go = (n - lapsed).min(scores.len());
            if to_go > 0 {
                let (_, &mut nth, _) = scores.select_nth_unstable(to_go - 1);
                shard.table.retain(|e| {
                    let b = e.binding();
                    let go = to_go > 0 && b <= nth && b < incoming;
                    to_go -= usize::from(go);
                    !go
                });
            }
        }
        let freed = before - shard.table.len();
        self.len.fetch_sub(freed, Ordering::Relaxed);
        freed > 0
    }

    /// Forgets what the store said of (rule, key): a reset, a lifted block.
    pub(crate) fn forget(&self, rule: RuleId, key: &Key) {
        let (h, mut shard) = self.shard(rule, key);
        if let Ok(e) = shard.table.find_entry(h, |e| e.rule == rule && e.key == *key) {
            e.remove();
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Takes `cost` units of `check`'s key under rule `rule` from this server's share,
    /// under the check's quota: what the fallback admitted. What this server may still
    /// admit of the key, when the store said how much remains and that still binds.
    pub(crate) fn take(&self, rule: RuleId, check: &Check, cost: u64, now: u64) -> Option<u64> {
        let (h, mut shard) = self.shard(rule, &check.key);
        let e = shard.table.find_mut(h, |e| e.rule == rule && e.key == check.key)?;
        if e.until <= now {
            return None;
        }
        let e = e.under(check.params.quota, check.algorithm);
        e.left = e.left.saturating_sub(i64::try_from(cost).unwrap_or(i64::MAX));
        e.asked = e.asked.max(now);
        Some(u64::try_from(e.left).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Params;
    use crate::runtime::sharded::SHARDS;

    /// A check of `key` under rule "r" with `quota`, on `algorithm`.
    fn check(key: &str, quota: Quota, algorithm: Algorithm) -> Check {
        Check { rule: "r".into(), key: key.into(), algorithm, params: Params::new(quota) }
    }

    #[test]
    fn a_share_of_what_remains_binds_until_the_quota_is_whole() {
        let shares = Shares::new(SHARDS * 4);
        let k = check("k", Quota::per_day(10), Algorithm::Gcra);
        assert_eq!(shares.fits(1, &k, 1, 0), Ok(()), "nothing known: the fresh share decides");
        // 10 left, 3 servers: 3 for this one, for 1 s.
        shares.record(1, &k, 10, 1_000_000, 3, 0, 0, false);
        for _ in 0..3 {
            assert_eq!(shares.fits(1, &k, 1, 10), Ok(()));
            shares.take(1, &k, 1, 10);
        }
        assert_eq!(shares.fits(1, &k, 1, 10), Err(999_990));
        assert_eq!(shares.fits(2, &k, 1, 10), Ok(()), "another rule");
        assert_eq!(shares.fits(1, &k, 1, 1_000_000), Ok(()), "the quota is whole again");
        // A late answer only lowers it: the fallback admitted since.
        shares.record(1, &k, 3, 1_000_000, 1, 20, 20, true);
        assert_eq!(shares.fits(1, &k, 1, 21), Err(999_999));
        shares.record(1, &k, 0, 5, 3, 20, 20, true);
        assert_eq!(shares.fits(1, &k, 1, 21), Err(999_999), "the quota is whole no sooner");
        // An answer in time replaces it, up or down.
        shares.record(1, &k, 9, 50, 3, 30, 30, false);
        assert_eq!(shares.fits(1, &k, 3, 31), Ok(()));
        assert_eq!(shares.fits(1, &k, 4, 31), Err(49));
    }

    /// A share read under another quota (a swap's, a tier's) keeps what the key used: a
    /// count of units for the window algorithms, time for GCRA and the buckets.
    #[test]
    fn a_share_is_rescaled_to_the_quota_it_is_read_under() {
        let shares = Shares::new(SHARDS * 4);
        let (q100, q200, q50) = (Quota::per_day(100), Quota::per_day(200), Quota::per_day(50));
        // GCRA, the key spent (0 left): spent under any rate, as in the store.
        shares.record(1, &check("g", q100, Algorithm::Gcra), 0, 86_400_000_000, 3, 0, 0, false);
        assert!(shares.fits(1, &check("g", q200, Algorithm::Gcra), 1, 10).is_err(), "spent time stays spent");
        assert!(shares.fits(1, &check("g", q50, Algorithm::Gcra), 1, 10).is_err());
        // GCRA, 60 of 100 left on 2 servers (30 each): 120 of 200 (60 each), 30 of 50 (15).
        shares.record(2, &check("h", q100, Algorithm::Gcra), 60, 1_000_000, 2, 0, 0, false);
        assert_eq!(shares.fits(2, &check("h", q200, Algorithm::Gcra), 60, 10), Ok(()));
        assert!(shares.fits(2, &check("h", q200, Algorithm::Gcra), 61, 10).is_err());
        assert_eq!(shares.fits(2, &check("h", q50, Algorithm::Gcra), 15, 10), Ok(()));
        assert!(shares.fits(2, &check("h", q50, Algorithm::Gcra), 16, 10).is_err());
        // A window, the key spent: a raise frees what it adds, a cut stays spent.
        let w = Algorithm::SlidingWindowLog;
        shares.record(3, &check("w", q100, w), 0, 1_000_000, 2, 0, 0, false);
        assert_eq!(shares.fits(3, &check("w", q200, w), 50, 10), Ok(()), "100 more, 50 each");
        shares.take(3, &check("w", q200, w), 50, 10);
        assert!(shares.fits(3, &check("w", q200, w), 1, 10).is_err(), "taken under the new quota");
        assert!(shares.fits(3, &check("w", q50, w), 1, 10).is_err());
        assert!(shares.fits(3, &check("w", q100, w), 1, 10).is_err(), "and back: still spent");
    }

    /// Full, a new entry takes the place of lapsed ones, else of the least binding: a
    /// spent key outlives a flood of keys with most of their share left.
    #[test]
    fn full_shares_keep_the_most_binding() {
        let shares = Shares::new(SHARDS * 8);
        let q = Quota::per_day(10);
        let c = |k: &str| check(k, q, Algorithm::Gcra);
        // Spent keys (0 left of 10) early, and one lapsing at 10 µs.
        for i in 0..SHARDS {
            shares.record(1, &c(&format!("spent{i}")), 0, 1_000_000_000, 1, 0, 0, false);
        }
        shares.record(1, &c("lapsing"), 0, 10, 1, 0, 0, false);
        // A flood of keys with 9 of 10 left.
        for i in 0..10_000 {
            shares.record(1, &c(&format!("k{i}")), 9, 500_000_000, 1, 20, 20, false);
            assert!(shares.len.load(Ordering::Relaxed) <= SHARDS * 8 + 1, "over the cap at {i}");
        }
        for i in 0..SHARDS {
            assert!(shares.fits(1, &c(&format!("spent{i}")), 1, 30).is_err(), "spent{i} pushed out");
        }
        // A late spent key too.
        shares.record(1, &c("late"), 0, 1_000_000_000, 1, 40, 40, false);
        for i in 10_000..20_000 {
            shares.record(1, &c(&format!("k{i}")), 9, 500_000_000, 1, 50, 50, false);
        }
        assert!(shares.fits(1, &c("late"), 1, 60).is_err(), "late pushed out");
        let n: usize = shares.shards.each().map(|s| s.table.len()).sum();
        assert_eq!(n, shares.len.load(Ordering::Relaxed), "the count");
        shares.forget(1, &Key::from("late"));
        assert_eq!(n - 1, shares.len.load(Ordering::Relaxed), "a forget counts");
    }

    #[test]
    fn shares_are_bounded() {
        let shares = Shares::new(SHARDS * 4);
        for i in 0..1_000 {
            let c = check(&format!("k{i}"), Quota::per_day(10), Algorithm::Gcra);
            shares.record(1, &c, 0, u64::MAX / 2, 1, 0, 0, false);
        }
        let n: usize = shares.shards.each().map(|s| s.table.len()).sum();
        assert!(n <= SHARDS * 4 + 1, "{n} entries");
    }
}
