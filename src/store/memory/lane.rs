//! A lane: one rule's GCRA or token-bucket states, one word a key.
//!
//! Both algorithms keep one number, the theoretical arrival time (the token bucket as its
//! GCRA twin), so a key is a `u64` and an `AtomicU64`, decided by one compare-and-swap
//! under its shard's read lock: no other read-modify-write on a decision of a key that
//! has a state. The write lock is taken to make a key's word, and to sweep.
//!
//! A TAT in the past is "never seen" (`max(TAT, now)` decides), so an entry has no
//! expiry of its own: the sweep drops an entry whose TAT is more than the grace period
//! behind. Keys that are `u64`s ([`Key::as_u64`]) are held as the number (16 bytes an
//! entry); others as the table's other keys are (inline up to 22 bytes).
//!
//! A lane is a rule's: the rule is neither in the entry nor in the hash. Blocks are not
//! in the lane: they stay in the store's shards, per (rule, key), only for keys that have
//! one (see `MemoryStore`).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use hashbrown::hash_table::Entry as Slot;
use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use smallvec::SmallVec;

use super::table::{Inner, Probe, TableKey, GRACE_US, MIN_SWEEP};
use crate::algorithm::gcra::Gcra;
use crate::algorithm::{Algorithm, Params, MAX_COST, MAX_DEBT};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::RuleName;

/// A key as a lane looks it up: a number, or the table's probe.
pub(super) enum LaneProbe<'a> {
    Int(u64),
    Other(Probe<'a>),
}

impl<'a> LaneProbe<'a> {
    #[inline]
    pub(super) fn of(key: &'a Key) -> Self {
        match key.as_u64() {
            Some(n) => LaneProbe::Int(n),
            None => LaneProbe::Other(Probe::of(key)),
        }
    }
}

/// A lane's shard on cache lines of its own (see `table::Padded`).
#[repr(align(128))]
struct Padded(RwLock<Cells>);

/// The words of one shard: numbers, and other keys.
struct Cells {
    ints: HashTable<(u64, AtomicU64)>,
    others: HashTable<(TableKey, AtomicU64)>,
    /// Sweep when the shard holds this many.
    sweep_at: usize,
}

/// One rule's states of one algorithm (GCRA, or the token bucket).
pub(super) struct Lane {
    shards: Box<[Padded]>,
}

impl Lane {
    fn new(shards: usize) -> Self {
        let cells = || Cells { ints: HashTable::new(), others: HashTable::new(), sweep_at: MIN_SWEEP };
        Self { shards: (0..shards).map(|_| Padded(RwLock::new(cells()))).collect() }
    }

    #[inline]
    fn hash(inner: &Inner, probe: &LaneProbe<'_>) -> u64 {
        match probe {
            LaneProbe::Int(n) => inner.hasher.hash_one(n),
            LaneProbe::Other(p) => inner.hash_key(p),
        }
    }

    /// The shard of a hash, from its upper half (the table picks buckets by the low bits).
    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        #[allow(clippy::cast_possible_truncation)]
        let high = (hash >> 32) as usize;
        high & (self.shards.len() - 1)
    }

    fn shard(&self, hash: u64) -> &RwLock<Cells> {
        &self.shards[self.shard_index(hash)].0
    }

    /// Where `key`'s word is, for a check of several rules ([`Held`]).
    pub(super) fn spot<'a>(&'a self, inner: &Inner, key: &'a Key) -> Spot<'a> {
        let probe = LaneProbe::of(key);
        let hash = Self::hash(inner, &probe);
        Spot { lane: self, shard: self.shard_index(hash), probe, hash }
    }

    /// `f` on the key's word, made ("never seen": 0) when the key has none: a new word
    /// needs room under `max_keys`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`]: a new word and no room, even once this shard's states
    /// that have expired are dropped.
    pub(super) fn with<R>(
        &self,
        inner: &Inner,
        probe: &LaneProbe<'_>,
        now: u64,
        f: impl FnOnce(&AtomicU64) -> R,
    ) -> Result<R, StoreError> {
        let hash = Self::hash(inner, probe);
        let shard = self.shard(hash);
        {
            let cells = shard.read();
            if let Some(word) = cells.find(hash, probe) {
                return Ok(f(word));
            }
        }
        let mut cells = shard.write();
        let word = cells.make(hash, probe, now, inner)?;
        Ok(f(word))
    }

    /// `f` on the key's word, if it has one.
    pub(super) fn find<R>(&self, inner: &Inner, probe: &LaneProbe<'_>, f: impl FnOnce(&AtomicU64) -> R) -> Option<R> {
        let hash = Self::hash(inner, probe);
        self.shard(hash).read().find(hash, probe).map(f)
    }

    /// Drops the key's word; whether it had one.
    pub(super) fn remove(&self, inner: &Inner, probe: &LaneProbe<'_>) -> bool {
        let hash = Self::hash(inner, probe);
        let found = self.shard(hash).write().remove(hash, probe);
        if found {
            inner.release(1);
        }
        found
    }

    /// The time-based sweep of shard `i` (taken modulo the lane's shards).
    pub(super) fn sweep_shard(&self, i: usize, now: u64, inner: &Inner) {
        self.shards[i % self.shards.len()].0.write().sweep(now, inner);
    }

    /// Room under `max_keys`: drops every word whose TAT has passed, in every shard.
    pub(super) fn make_room(&self, now: u64, inner: &Inner) {
        for shard in &*self.shards {
            shard.0.write().make_room(now, inner);
        }
    }

    /// Words held.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.read().len()).sum()
    }
}

impl Cells {
    fn len(&self) -> usize {
        self.ints.len() + self.others.len()
    }

    #[inline]
    fn find(&self, hash: u64, probe: &LaneProbe<'_>) -> Option<&AtomicU64> {
        match probe {
            LaneProbe::Int(n) => self.ints.find(hash, |(k, _)| k == n).map(|(_, w)| w),
            LaneProbe::Other(p) => self.others.find(hash, |(k, _)| p.matches(k)).map(|(_, w)| w),
        }
    }

    /// The key's word, made when absent (another thread may have made it between the
    /// read lock and this write lock).
    fn make(&mut self, hash: u64, probe: &LaneProbe<'_>, now: u64, inner: &Inner) -> Result<&AtomicU64, StoreError> {
        if self.find(hash, probe).is_none() {
            if self.len() >= self.sweep_at {
                self.sweep(now, inner);
            }
            if !inner.reserve(1) {
                self.make_room(now, inner);
                if !inner.reserve(1) {
                    return Err(StoreError::Full(inner.max_keys.unwrap_or(usize::MAX)));
                }
            }
        }
        Ok(self.made(hash, probe, inner))
    }

    /// The key's word, made when absent, its room taken already.
    fn made(&mut self, hash: u64, probe: &LaneProbe<'_>, inner: &Inner) -> &AtomicU64 {
        match probe {
            LaneProbe::Int(n) => match self.ints.entry(hash, |(k, _)| k == n, |(k, _)| inner.hasher.hash_one(k)) {
                Slot::Occupied(o) => &o.into_mut().1,
                Slot::Vacant(v) => &v.insert((*n, AtomicU64::new(0))).into_mut().1,
            },
            LaneProbe::Other(p) => {
                match self.others.entry(hash, |(k, _)| p.matches(k), |(k, _)| inner.hash_key(&k.probe())) {
                    Slot::Occupied(o) => &o.into_mut().1,
                    Slot::Vacant(v) => &v.insert((p.to_key(), AtomicU64::new(0))).into_mut().1,
                }
            }
        }
    }

    fn remove(&mut self, hash: u64, probe: &LaneProbe<'_>) -> bool {
        match probe {
            LaneProbe::Int(n) => self.ints.find_entry(hash, |(k, _)| k == n).map(|e| e.remove()).is_ok(),
            LaneProbe::Other(p) => self.others.find_entry(hash, |(k, _)| p.matches(k)).map(|e| e.remove()).is_ok(),
        }
    }

    /// Keeps the words for which `keep(tat)` holds; gives back the room of the others.
    fn retain(&mut self, inner: &Inner, keep: impl Fn(u64) -> bool) {
        let before = self.len();
        self.ints.retain(|(_, w)| keep(*w.get_mut()));
        self.others.retain(|(_, w)| keep(*w.get_mut()));
        inner.release(before - self.len());
    }

    /// Drops the words whose TAT passed more than the grace period ago.
    fn sweep(&mut self, now: u64, inner: &Inner) {
        self.retain(inner, |tat| tat.saturating_add(GRACE_US) > now);
        self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
    }

    /// Drops the words whose TAT has passed (any, no grace): room under `max_keys`.
    fn make_room(&mut self, now: u64, inner: &Inner) {
        self.retain(inner, |tat| tat > now);
    }
}

/// A check of `p` on a word at `now`: the TAT it read and decided on, and, when it
/// accepted with a cost, the TAT it left (the commit's identity, for
/// [`refund`]). One compare-and-swap, again only if another thread moved the word between
/// the read and the swap.
#[inline]
pub(super) fn check(word: &AtomicU64, p: &Params, now: u64) -> (u64, Option<u64>) {
    let (b, t, c) = (p.quota.burst_size(), p.quota.emission_interval_micros(), p.cost);
    let mut tat = word.load(Relaxed);
    let earliest = now.saturating_add(p.after_us);
    loop {
        let base = tat.max(earliest);
        // GCRA's rule (gcra.rs): accept iff c <= B and TAT' - now + c·T <= B·T (a quota
        // slice's reaches `ahead_us` further).
        let reach = b * t + p.ahead_us;
        if !(c > 0 && c.saturating_mul(t) <= reach && base - now + c * t <= reach) {
            return (tat, None);
        }
        let new = base + c * t;
        match word.compare_exchange_weak(tat, new, Relaxed, Relaxed) {
            Ok(_) => return (tat, Some(new)),
            Err(seen) => tat = seen,
        }
    }
}

/// The decision of `p` on a key whose TAT was `tat` before it: GCRA's (the token bucket's
/// is the same).
#[inline]
pub(super) fn decide(tat: u64, p: &Params, now: u64) -> Decision {
    Gcra { tat }.decide(p, now).at(now)
}

/// Takes `p.cost` units whatever the decision (a charge): the TAT moves on by them, at
/// most [`MAX_COST`] and what keeps the debt within [`MAX_DEBT`] (as `Kind::charge`).
pub(super) fn charge(word: &AtomicU64, p: &Params, now: u64) {
    let t = p.quota.emission_interval_micros();
    let mut tat = word.load(Relaxed);
    loop {
        let base = tat.max(now);
        let room = (now + MAX_DEBT).saturating_sub(base) / t;
        let cost = p.cost.min(MAX_COST).min(room);
        if cost == 0 {
            return;
        }
        match word.compare_exchange_weak(tat, base + cost * t, Relaxed, Relaxed) {
            Ok(_) => return,
            Err(seen) => tat = seen,
        }
    }
}

/// Gives back the commit that left the TAT at `at`: all its `c·T` when the word is still
/// `at` (no commit since), nothing otherwise. A word equal to `at` again after other
/// commits means each of them was given back, or that the TAT is in the past, where
/// moving it changes no decision: either way nothing is given twice.
/// Whether it gave anything back.
pub(super) fn refund(word: &AtomicU64, p: &Params, at: u64, now: u64) -> bool {
    let cells = p.cost.saturating_mul(p.quota.emission_interval_micros());
    // Given back to "never seen" (a TAT not after now): forgotten, 0, as Redis deletes
    // the key (the two differ once the clock steps back).
    let back = Some(at.saturating_sub(cells)).filter(|&tat| tat > now).unwrap_or(0);
    back < at && word.compare_exchange(at, back, Relaxed, Relaxed).is_ok()
}

/// Whether `algorithm` is decided in a lane.
pub(super) fn laned(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket)
}

/// Every lane of a store: found by (rule, algorithm) with two loads and no lock, in an
/// array that grows by chunks and never moves (a rule's lane is at its name's index),
/// for the first [`DENSE`] / 2 names this process interned; under a read lock in a map
/// for the names after them (a process with that many names, some of them one-off).
pub(super) struct Lanes {
    chunks: [OnceLock<Chunk>; CHUNKS],
    /// The lanes of the names past the chunks.
    rest: RwLock<hashbrown::HashMap<usize, Arc<Lane>>>,
    /// Every lane made, for the sweeps (which take this lock, never a decision).
    all: Mutex<Vec<Arc<Lane>>>,
    /// Whether any key of the store was ever blocked: until then a lane's rule that reads
    /// blocks looks for none.
    pub(super) blocks_seen: std::sync::atomic::AtomicBool,
    /// The shards a lane has: a power of two.
    shards: usize,
}

/// A lane as [`Lanes`] finds it: borrowed from the array (no reference count touched),
/// or shared out of the map.
pub(super) enum LaneRef<'a> {
    Dense(&'a Lane),
    Shared(Arc<Lane>),
}

impl std::ops::Deref for LaneRef<'_> {
    type Target = Lane;

    #[inline]
    fn deref(&self) -> &Lane {
        match self {
            LaneRef::Dense(lane) => lane,
            LaneRef::Shared(lane) => lane,
        }
    }
}

/// Chunks of the array: the `k`-th holds `2^k` lanes, up to [`DENSE`] in all (16 bytes
/// each: at most 4 KiB a store, however many names the process has).
const CHUNKS: usize = 8;
const DENSE: usize = (1 << CHUNKS) - 1;

/// A chunk of [`Lanes`]: the `k`-th holds `2^k` lanes.
type Chunk = Box<[OnceLock<Arc<Lane>>]>;

/// A locked shard of [`Held`], with its lock-order place.
type Guard<'a> = ((usize, usize), RwLockWriteGuard<'a, Cells>);

impl Lanes {
    /// Lanes of `shards` shards each (a power of two).
    pub(super) fn new(shards: usize) -> Self {
        Self {
            chunks: std::array::from_fn(|_| OnceLock::new()),
            rest: RwLock::default(),
            all: Mutex::default(),
            blocks_seen: std::sync::atomic::AtomicBool::new(false),
            shards,
        }
    }

    /// The place of (rule, algorithm), from 1.
    fn place(rule: RuleName, algorithm: Algorithm) -> usize {
        rule.index() * 2 + usize::from(algorithm == Algorithm::TokenBucket) + 1
    }

    fn made(&self) -> Arc<Lane> {
        let lane = Arc::new(Lane::new(self.shards));
        self.all.lock().push(Arc::clone(&lane));
        lane
    }

    /// The lane of `rule` under `algorithm` (one of [`laned`]'s), made on first use.
    #[inline]
    pub(super) fn of(&self, rule: RuleName, algorithm: Algorithm) -> LaneRef<'_> {
        let i = Self::place(rule, algorithm);
        if i > DENSE {
            if let Some(lane) = self.rest.read().get(&i) {
                return LaneRef::Shared(Arc::clone(lane));
            }
            return LaneRef::Shared(Arc::clone(self.rest.write().entry(i).or_insert_with(|| self.made())));
        }
        let chunk = i.ilog2() as usize;
        let slots = self.chunks[chunk].get_or_init(|| (0..1usize << chunk).map(|_| OnceLock::new()).collect());
        LaneRef::Dense(slots[i - (1 << chunk)].get_or_init(|| self.made()))
    }

    /// The lane of `rule` under `algorithm`, if one was made.
    pub(super) fn get(&self, rule: RuleName, algorithm: Algorithm) -> Option<LaneRef<'_>> {
        let i = Self::place(rule, algorithm);
        if i > DENSE {
            return self.rest.read().get(&i).cloned().map(LaneRef::Shared);
        }
        let chunk = i.ilog2() as usize;
        self.chunks[chunk].get()?[i - (1 << chunk)].get().map(|l| LaneRef::Dense(l))
    }

    /// `f` on every lane made.
    pub(super) fn each(&self, mut f: impl FnMut(&Lane)) {
        let all: Vec<Arc<Lane>> = self.all.lock().clone();
        for lane in &all {
            f(lane);
        }
    }
}

/// Where a check's word is: its lane, key, hash and shard.
pub(super) struct Spot<'a> {
    lane: &'a Lane,
    probe: LaneProbe<'a>,
    hash: u64,
    shard: usize,
}

impl Spot<'_> {
    /// The lock-order place of its shard: lanes by address, then shards by index.
    fn place(&self) -> (usize, usize) {
        (std::ptr::from_ref(self.lane) as usize, self.shard)
    }
}

/// The words of a check of several rules, under their shards' write locks, taken in one
/// global order (no deadlock between two such checks): no compare-and-swap of another
/// thread moves them until the call has decided and committed every rule, so the call is
/// all or nothing, as the shards' rules are.
pub(super) struct Held<'a> {
    guards: SmallVec<[Guard<'a>; 4]>,
}

impl<'a> Held<'a> {
    pub(super) fn lock(spots: &[Spot<'a>]) -> Self {
        let mut order: SmallVec<[&Spot<'a>; 4]> = spots.iter().collect();
        order.sort_unstable_by_key(|s| s.place());
        order.dedup_by_key(|s| s.place());
        Self { guards: order.into_iter().map(|s| (s.place(), s.lane.shards[s.shard].0.write())).collect() }
    }

    fn cells(&mut self, spot: &Spot<'_>) -> &mut Cells {
        let place = spot.place();
        &mut self.guards.iter_mut().find(|(p, _)| *p == place).expect("shard locked").1
    }

    /// Makes every missing word of the spots `needed`, room for all of them taken at once
    /// under `max_keys` (or none made): which spots had none and were made.
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`], with nothing made.
    pub(super) fn make_all(
        &mut self,
        spots: &[Spot<'_>],
        needed: &[bool],
        now: u64,
        inner: &Inner,
    ) -> Result<SmallVec<[bool; 4]>, StoreError> {
        let missing = |held: &mut Self| -> SmallVec<[bool; 4]> {
            spots.iter().zip(needed).map(|(s, &n)| n && held.cells(s).find(s.hash, &s.probe).is_none()).collect()
        };
        let mut new = missing(self);
        let count = |new: &[bool]| new.iter().filter(|&&n| n).count();
        if !inner.reserve(count(&new)) {
            for (_, cells) in &mut self.guards {
                cells.make_room(now, inner);
            }
            new = missing(self);
            if !inner.reserve(count(&new)) {
                return Err(StoreError::Full(inner.max_keys.unwrap_or(usize::MAX)));
            }
        }
        for (s, _) in spots.iter().zip(&new).filter(|(_, &n)| n) {
            self.cells(s).made(s.hash, &s.probe, inner);
        }
        Ok(new)
    }

    /// The word at `spot`, if it has one.
    pub(super) fn find(&mut self, spot: &Spot<'_>) -> Option<&AtomicU64> {
        self.cells(spot).find(spot.hash, &spot.probe)
    }

    /// The word at `spot` (made by [`Held::make_all`]).
    pub(super) fn word(&mut self, spot: &Spot<'_>) -> &AtomicU64 {
        self.find(spot).expect("word made")
    }

    /// Drops the words [`Held::make_all`] made (`new`), and gives back their room.
    pub(super) fn unmake(&mut self, spots: &[Spot<'_>], new: &[bool], inner: &Inner) {
        for (s, _) in spots.iter().zip(new).filter(|(_, &n)| n) {
            if self.cells(s).remove(s.hash, &s.probe) {
                inner.release(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    const T0: u64 = 1_700_000_000_000_000;

    /// The lane's three compare-and-swaps (a commit, a charge, a refund) raced by threads
    /// on one word: none is lost or applied twice. The word ends exactly where the
    /// operations that took effect put it — the first commit, never refunded, keeps the
    /// TAT ahead of `now`, so every other one moves it by exactly its units — and no
    /// commit was admitted past the burst.
    #[test]
    fn racing_commits_charges_and_refunds_lose_nothing() {
        let p = Params::new(Quota::per_hour(3_600).burst(2_000));
        let t = p.quota.emission_interval_micros();
        let word = AtomicU64::new(0);
        let (first_tat, first) = check(&word, &p, T0);
        assert_eq!((first_tat, first), (0, Some(T0 + t)));
        let (commits, charges, refunds): (u64, u64, u64) = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4u64)
                .map(|i| {
                    let (word, p) = (&word, &p);
                    s.spawn(move || {
                        let (mut commits, mut charges, mut refunds) = (0, 0, 0);
                        let mut mine = Vec::new();
                        for n in 0..3_000u64 {
                            match (n + i) % 5 {
                                0..=2 => {
                                    if let (_, Some(at)) = check(word, p, T0) {
                                        commits += 1;
                                        mine.push(at);
                                    }
                                }
                                3 => {
                                    charge(word, &Params { cost: 1, ..*p }, T0);
                                    charges += 1;
                                }
                                _ => {
                                    if let Some(at) = mine.pop() {
                                        refunds += u64::from(refund(word, p, at, T0));
                                    }
                                }
                            }
                        }
                        (commits, charges, refunds)
                    })
                })
                .collect();
            threads.into_iter().map(|h| h.join().unwrap()).fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
        });
        let tat = word.load(Relaxed);
        assert_eq!(
            tat,
            T0 + t * (1 + commits + charges - refunds),
            "{commits} commits, {charges} charges, {refunds} refunds"
        );
        // Admitted commits never pass the burst: each saw at most B·T in use with its own.
        assert!(commits - refunds < 2_000, "{commits} commits, {refunds} refunds, burst 2000");
    }
}

#[cfg(test)]
mod review_tests {
    use super::Padded;
    use crate::algorithm::Params;
    use crate::key::Key;
    use crate::quota::Quota;
    use crate::store::memory::MemoryStore;
    use crate::store::Check;
    use crate::Algorithm;

    /// One key under each of many GCRA rules (a rule a tenant, a route, a plan): before
    /// the lanes a state cost its table entry (64 bytes and the table's slack) whatever its
    /// rule; now every (rule, algorithm) a store sees costs a lane of `shards` padded locks
    /// of 128 bytes, `shards` = 16 x the cores rounded up (32 on 2 cores: 4 KiB a rule; 1024
    /// on a 64-core host: 128 KiB a rule, 128 MiB for 1000 rules), kept for the store's life
    /// once its keys are swept.
    #[test]
    fn review_a_state_under_a_rule_of_its_own_costs_about_a_state() {
        const T0: u64 = 1_700_000_000_000_000;
        let store = MemoryStore::new();
        let rules = 1000;
        for i in 0..rules {
            let c = Check {
                rule: format!("review-lane-heap-{i}").as_str().into(),
                key: Key::from("k"),
                algorithm: Algorithm::Gcra,
                params: Params::new(Quota::per_second(10)),
            };
            assert!(store.check_one_at(&c, T0).unwrap().decision.allowed);
        }
        // The lanes' shards alone (their tables' buckets not counted).
        let mut shard_bytes = 0;
        store.lanes.each(|lane| shard_bytes += lane.shards.len() * std::mem::size_of::<Padded>());
        let per_state = shard_bytes / rules;
        assert!(
            per_state <= 512,
            "a state under a rule of its own holds {per_state} bytes of lane shards ({} shards a lane)",
            store.inner.shards.len()
        );
    }

    /// The lanes' index is sized by the rule's place in the process-wide interner, not by
    /// what the store uses: a store that sees one rule, the 5000th name the process ever
    /// interned, allocates a chunk of 8192 lane slots (128 KiB) for it; the 1 000 000th,
    /// 32 MiB — per store, fallbacks and `max_keys` rebuilds included.
    #[test]
    fn review_a_store_with_one_rule_holds_an_index_of_one_rule() {
        const T0: u64 = 1_700_000_000_000_000;
        for i in 0..5000 {
            let _ = crate::store::RuleName::new(&format!("review-lane-index-{i}"));
        }
        let store = MemoryStore::new();
        let c = Check {
            rule: "review-lane-index-4999".into(),
            key: Key::from("k"),
            algorithm: Algorithm::Gcra,
            params: Params::new(Quota::per_second(10)),
        };
        assert!(store.check_one_at(&c, T0).unwrap().decision.allowed);
        let slots: usize = store.lanes.chunks.iter().filter_map(|c| c.get()).map(|c| c.len()).sum();
        let bytes = slots * std::mem::size_of::<std::sync::OnceLock<std::sync::Arc<super::Lane>>>();
        assert!(bytes <= 4096, "one rule's lane index holds {slots} slots, {bytes} bytes");
    }
}
