//! The table of a [`MemoryStore`](super::MemoryStore): shards on cache lines of their own,
//! each with a table per algorithm of compact entries (key, rule, state, expiry, block),
//! sweeping expired states, and the count of live states under `max_keys`.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hashbrown::hash_table::Entry as Slot;
use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::{Mutex, MutexGuard};

use crate::algorithm::concurrency::Concurrency;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::leaky_bucket::LeakyBucket;
use crate::algorithm::sliding_window_counter::SlidingWindowCounter;
use crate::algorithm::sliding_window_log::SlidingWindowLog;
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::Kind;
use crate::clock::SharedClock;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::{Key, SHORT};
use crate::store::{Check, RuleName, Taken};

/// A shard on a cache line of its own: neighbouring shards locked by different threads
/// must not share one (false sharing made two threads slower than one).
///
/// Under `parking_lot`'s mutex: as cheap as the standard one uncontended (its unlock is one
/// atomic read-modify-write too), and on a key many threads decide at once it spins
/// before it parks and lets the releasing thread take the lock again, so the entry's cache
/// line stays on one core longer: issue 28's hot key on 2 threads went from 0.6× to about
/// 1.1× governor's speed, on 8 threads (2 cores) from 15 to 27 M checks/s. Waiters sleep
/// once they have spun, so a preempted or lower-priority holder is not kept off the CPU by
/// them. The price, with more threads than cores on one key: a parked waiter is handed
/// the lock only at a fair unlock (at random, about every half millisecond), so about one
/// decision in a hundred waited 30–190 µs where the standard mutex's waited 1–2 µs — and
/// its worst waits were milliseconds shorter (`bench/hot_latency.rs`). With a thread per
/// core, both stay within a few µs.
#[repr(align(128))]
pub(super) struct Padded(pub(super) Mutex<Shard>);

impl std::ops::Deref for Padded {
    type Target = Mutex<Shard>;

    fn deref(&self) -> &Mutex<Shard> {
        &self.0
    }
}

pub(super) struct Inner {
    pub(super) shards: Box<[Padded]>,
    /// foldhash with a per-store random seed: fast, and not predictable by clients who
    /// choose their keys.
    pub(super) hasher: DefaultHashBuilder,
    pub(super) clock: SharedClock,
    /// The bound given to [`MemoryStore::max_keys`], and the states held against it
    /// (counted only under a bound: an unbounded store shares no counter between threads).
    pub(super) max_keys: Option<usize>,
    pub(super) live: AtomicUsize,
    /// This store's identity, shared by its clones (see `Store::identity`).
    pub(super) id: usize,
    /// When the next time-based sweep step is due (µs), and the shard it visits.
    pub(super) next_sweep: AtomicU64,
    pub(super) cursor: AtomicUsize,
    /// When the store, full, may next sweep every shard for room (µs).
    pub(super) next_full_sweep: AtomicU64,
}

/// A key as the table holds it: a number as itself (`Key::as_u64`: a `u64` key, or its
/// canonical decimal given as text, so both land on one entry) — hashed as one word and
/// compared as one, with no digits written on the hot path; another plain key of at most
/// [`SHORT`] bytes inline (its length first, zero-padded, so that one fixed-size comparison
/// matches it), a longer one or a digest out of line. 24 bytes.
#[derive(PartialEq, Eq)]
pub(super) enum TableKey {
    Int(u64),
    Short([u8; SHORT + 1]),
    Long(Box<[u8]>, bool),
}

/// A check's key as it is looked up: made once per check, with no allocation.
pub(super) enum Probe<'a> {
    Int(u64),
    Short([u8; SHORT + 1]),
    Long(&'a [u8], bool),
}

impl<'a> Probe<'a> {
    pub(super) fn of(key: &'a Key) -> Self {
        if let Some(n) = key.as_u64() {
            return Probe::Int(n);
        }
        match key.short() {
            Some(short) => Probe::Short(short),
            None => Probe::Long(key.held_bytes().expect("a number is short"), key.is_hashed()),
        }
    }

    pub(super) fn matches(&self, key: &TableKey) -> bool {
        match (self, key) {
            (Probe::Int(a), TableKey::Int(b)) => a == b,
            (Probe::Short(a), TableKey::Short(b)) => a == b,
            (Probe::Long(a, x), TableKey::Long(b, y)) => x == y && *a == &**b,
            _ => false,
        }
    }

    pub(super) fn to_key(&self) -> TableKey {
        match *self {
            Probe::Int(n) => TableKey::Int(n),
            Probe::Short(short) => TableKey::Short(short),
            Probe::Long(bytes, hashed) => TableKey::Long(bytes.into(), hashed),
        }
    }
}

impl TableKey {
    pub(super) fn probe(&self) -> Probe<'_> {
        match self {
            TableKey::Int(n) => Probe::Int(*n),
            TableKey::Short(short) => Probe::Short(*short),
            TableKey::Long(bytes, hashed) => Probe::Long(bytes, *hashed),
        }
    }
}

/// One (rule, key) state of algorithm `K`.
pub(super) struct Entry<K> {
    key: TableKey,
    rule: RuleName,
    pub(super) state: K,
    pub(super) expires_at: u64,
    /// The end of the key's block (`Rule::block_for`), µs since the epoch; 0: none.
    pub(super) blocked_until: u64,
}

// A GCRA entry fits a cache line (issue 28): 24 + 8 + 8 + 8 + 8 bytes.
const _: () = assert!(std::mem::size_of::<Entry<Gcra>>() <= 64);

/// The tables of one shard, one per algorithm.
#[derive(Default)]
pub(super) struct Shard {
    fixed_window: HashTable<Entry<FixedWindow>>,
    sliding_window_log: HashTable<Entry<SlidingWindowLog>>,
    sliding_window_counter: HashTable<Entry<SlidingWindowCounter>>,
    token_bucket: HashTable<Entry<TokenBucket>>,
    leaky_bucket: HashTable<Entry<LeakyBucket>>,
    gcra: HashTable<Entry<Gcra>>,
    concurrent: HashTable<Entry<Concurrency>>,
    /// States held, in every table (one count, so that the sweep's check is one load).
    len: usize,
    /// Sweep expired entries when the shard holds this many.
    sweep_at: usize,
}

/// An algorithm's state whose table a [`Shard`] holds.
pub(super) trait Tabled: Kind {
    /// This algorithm's table in `shard`, and the shard's count of states.
    fn table(shard: &mut Shard) -> (&mut HashTable<Entry<Self>>, &mut usize);
}

macro_rules! tabled {
    ($($t:ty => $field:ident),*) => {
        $(impl Tabled for $t {
            fn table(shard: &mut Shard) -> (&mut HashTable<Entry<Self>>, &mut usize) {
                (&mut shard.$field, &mut shard.len)
            }
        })*

        impl Shard {
            /// Keeps the entries for which `keep(live_until)` holds; how many went.
            fn retain(&mut self, keep: impl Fn(u64) -> bool) -> usize {
                let before = self.len;
                $(self.$field.retain(|e| keep(e.live_until()));)*
                self.len = 0 $(+ self.$field.len())*;
                before - self.len
            }

            /// The end of the block of `rule` and `probe` at `now` under any algorithm (0:
            /// none): a block is the key's under its rule, whatever the algorithm, as on
            /// Redis (a swap of algorithm starts the counting afresh, not the block).
            pub(super) fn block_of(&self, hash: u64, rule: RuleName, probe: &Probe<'_>, now: u64) -> u64 {
                let mut until = 0;
                $(if let Some(e) = self.$field.find(hash, |e| e.is(rule, probe)) {
                    until = until.max(e.blocked_until);
                })*
                if until > now { until } else { 0 }
            }

            /// Sets the block of `rule` and `probe` to end at `until` (0: lifted) in the
            /// state of every algorithm that is live at `now` (one that is not takes the
            /// block when it is made again: see [`Shard::entry`]).
            pub(super) fn set_block(&mut self, hash: u64, rule: RuleName, probe: &Probe<'_>, until: u64, now: u64) {
                $(if let Some(e) = self.$field.find_mut(hash, |e| e.is(rule, probe)) {
                    if until == 0 || e.live_until() > now {
                        e.blocked_until = until;
                    }
                })*
            }
        }
    };
}

tabled!(
    FixedWindow => fixed_window,
    SlidingWindowLog => sliding_window_log,
    SlidingWindowCounter => sliding_window_counter,
    TokenBucket => token_bucket,
    LeakyBucket => leaky_bucket,
    Gcra => gcra,
    Concurrency => concurrent
);

pub(super) const MIN_SWEEP: usize = 64;
/// How long past its expiry a state is kept before a sweep may drop it, µs.
pub(super) const GRACE_US: u64 = 1_000_000;
/// Every shard is swept at least once per this much time of traffic, µs.
pub(super) const SWEEP_PERIOD_US: u64 = 10_000_000;
/// A full store sweeps every shard for room at most once per this much time, µs.
pub(super) const FULL_SWEEP_US: u64 = 100_000;

pub(super) fn guard_for<'a, 'g>(guards: &'a mut [(usize, MutexGuard<'g, Shard>)], i: usize) -> &'a mut Shard {
    let pos = guards.iter().position(|(j, _)| *j == i).expect("shard locked");
    &mut guards[pos].1
}

pub(super) fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // parking_lot has no poisoning: a panic while a shard is held unlocks it as it was.
    // No user code runs under a shard (the clock is read before), and nothing under one
    // panics but on a bug; if something did, an entry's state could be committed without its
    // expiry raised (`Entry::commit`), a multi-rule check could be left with only its first
    // rules committed, and room reserved under `max_keys` could be left unused for good.
    m.lock()
}

impl<K: Kind> Entry<K> {
    pub(super) fn is(&self, rule: RuleName, probe: &Probe<'_>) -> bool {
        self.rule == rule && probe.matches(&self.key)
    }

    /// Until when the entry means something: its state's expiry, or its block's end.
    pub(super) fn live_until(&self) -> u64 {
        self.expires_at.max(self.blocked_until)
    }

    /// Decides `check` at `now`, with the key's block (see [`crate::algorithm::blocking`]);
    /// a rejection that starts a block stores it (the one change a rejection makes).
    pub(super) fn decide(&mut self, check: &Check, now: u64) -> Decision {
        let d = self.state.decide(&check.params, now);
        // A rule that reads no blocks (no `block_for`, not blockable: swapped since the
        // block was set) decides without it, as Redis's scripts and the lanes do.
        if !check.params.reads_block() {
            return d;
        }
        if self.blocked_until <= now && (d.allowed || check.params.block_us == 0) {
            // Nothing to block, nor blocked (the common case): the decision is not moved
            // through `blocking`.
            return d;
        }
        let (d, block) = crate::algorithm::blocking(d, self.blocked_until, &check.params, now);
        if let Some(until) = block {
            self.blocked_until = until;
        }
        d
    }

    pub(super) fn peek(&self, check: &Check, now: u64) -> Decision {
        let blocked = if check.params.reads_block() { self.blocked_until } else { 0 };
        crate::algorithm::blocking(self.state.decide(&check.params, now), blocked, &check.params, now).0
    }

    /// Commits an allowed check. The state is kept until the latest expiry any of its
    /// commits asked for: a key whose quota changes between requests (tiers) never loses
    /// a longer period's state to a shorter one's.
    pub(super) fn commit(&mut self, check: &Check, now: u64) -> Taken {
        let at = self.state.commit(&check.params, now);
        self.expires_at = self.expires_at.max(self.state.expires_at(&check.params));
        Taken { at }
    }
}

impl Inner {
    /// The hash of a rule's state of a key.
    pub(super) fn hash(&self, rule: RuleName, probe: &Probe<'_>) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_usize(rule.id());
        Self::hash_into(&mut h, probe);
        h.finish()
    }

    /// The hash of a key alone (a lane is a rule's: the rule is not hashed).
    pub(super) fn hash_key(&self, probe: &Probe<'_>) -> u64 {
        let mut h = self.hasher.build_hasher();
        Self::hash_into(&mut h, probe);
        h.finish()
    }

    fn hash_into(h: &mut impl Hasher, probe: &Probe<'_>) {
        match probe {
            // A number and a text key never match (the text of a number is `Int`): a hash
            // shared by the two costs a comparison, never a wrong entry.
            Probe::Int(n) => h.write_u64(*n),
            // Three words (the last overlapping the second): foldhash takes a word in a
            // multiply, where 23 bytes take its long path.
            Probe::Short(short) => {
                let word = |at: usize| u64::from_le_bytes(short[at..at + 8].try_into().unwrap_or_default());
                h.write_u64(word(0));
                h.write_u64(word(8));
                h.write_u64(word(SHORT + 1 - 8));
            }
            Probe::Long(bytes, hashed) => {
                h.write(bytes);
                h.write_u8(u8::from(*hashed));
            }
        }
    }

    /// Takes room for `n` new states under [`MemoryStore::max_keys`]; `false` when there
    /// is not that much left.
    pub(super) fn reserve(&self, n: usize) -> bool {
        let Some(max) = self.max_keys else { return true };
        n == 0
            || self
                .live
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |live| (live + n <= max).then_some(live + n))
                .is_ok()
    }

    /// `n` states were dropped.
    pub(super) fn release(&self, n: usize) {
        if self.max_keys.is_some() && n > 0 {
            self.live.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

impl Shard {
    /// An empty shard.
    pub(super) fn new() -> Self {
        Self { sweep_at: MIN_SWEEP, ..Self::default() }
    }

    /// States held, in every table.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Drops the states expired more than the grace period ago (a key below its quota,
    /// whose state expires between requests, is not dropped and made again each time).
    pub(super) fn sweep(&mut self, now: u64, inner: &Inner) {
        inner.release(self.retain(|live| live.saturating_add(GRACE_US) > now));
        self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
    }

    /// [`Shard::sweep`], amortised: only once the shard doubled since the last sweep.
    pub(super) fn maybe_sweep(&mut self, now: u64, inner: &Inner) {
        if self.len() >= self.sweep_at {
            self.sweep(now, inner);
        }
    }

    /// Makes room under `max_keys`: drops the expired states (any expiry, no grace).
    pub(super) fn make_room(&mut self, now: u64, inner: &Inner) {
        inner.release(self.retain(|live| live > now));
    }

    /// The entry of `rule` and `probe` in `K`'s table, if there is one.
    pub(super) fn find<K: Tabled>(&mut self, hash: u64, rule: RuleName, probe: &Probe<'_>) -> Option<&mut Entry<K>> {
        K::table(self).0.find_mut(hash, |e| e.is(rule, probe))
    }

    /// Drops the entry of `rule` and `probe` in `K`'s table; whether there was one.
    pub(super) fn remove<K: Tabled>(&mut self, hash: u64, rule: RuleName, probe: &Probe<'_>) -> bool {
        let (table, len) = K::table(self);
        let found = table.find_entry(hash, |e| e.is(rule, probe)).map(|e| e.remove()).is_ok();
        *len -= usize::from(found);
        found
    }

    /// The live entry for `check`, created (or reset, when expired) as needed; one probe.
    /// A new one needs room under `max_keys`, unless the caller `reserved` it (and then
    /// nothing is swept or dropped here).
    pub(super) fn entry<K: Tabled>(
        &mut self,
        hash: u64,
        check: &Check,
        probe: &Probe<'_>,
        now: u64,
        inner: &Inner,
        reserved: bool,
    ) -> Result<&mut Entry<K>, StoreError> {
        // A state made (or made again) for a rule that reads blocks takes the key's block,
        // which another algorithm's state may hold (a swap of algorithm): one more probe
        // for such rules, six when the state is new.
        let inherit = if check.params.reads_block()
            && self.find::<K>(hash, check.rule, probe).is_none_or(|e| e.live_until() <= now)
        {
            self.block_of(hash, check.rule, probe, now)
        } else {
            0
        };
        if !reserved {
            self.maybe_sweep(now, inner);
            // Under a bound only (one more probe): is this a new state, and is there room?
            if inner.max_keys.is_some() && self.find::<K>(hash, check.rule, probe).is_none() && !inner.reserve(1) {
                self.make_room(now, inner);
                if !inner.reserve(1) {
                    return Err(StoreError::Full(inner.max_keys.unwrap_or(usize::MAX)));
                }
            }
        }
        let rehash = |e: &Entry<K>| inner.hash(e.rule, &e.key.probe());
        let (table, len) = K::table(self);
        let e = match table.entry(hash, |e| e.is(check.rule, probe), rehash) {
            Slot::Occupied(o) => o.into_mut(),
            Slot::Vacant(v) => {
                *len += 1;
                v.insert(Entry {
                    key: probe.to_key(),
                    rule: check.rule,
                    state: K::default(),
                    expires_at: 0,
                    blocked_until: 0,
                })
                .into_mut()
            }
        };
        let live = e.live_until();
        if live <= now && live != 0 {
            e.state = K::default();
            e.expires_at = 0;
            e.blocked_until = 0;
        }
        e.blocked_until = e.blocked_until.max(inherit);
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Params;
    use crate::quota::Quota;
    use crate::store::memory::MemoryStore;

    /// Keys on both sides of the lines: 22 bytes inline, 23 out of line, digests beside the
    /// plain keys of their 32 bytes.
    fn keys() -> Vec<Key> {
        let mut keys = Vec::new();
        for len in [1, 22, 23, 47, 129] {
            for last in [b'a', b'b'] {
                let mut bytes = vec![b'k'; len];
                bytes[len - 1] = last;
                let key = Key::new(&bytes);
                if key.is_hashed() {
                    keys.push(Key::new(&key.as_bytes()));
                }
                keys.push(key);
            }
        }
        // Numbers, held as themselves, beside texts that are not their canonical decimal
        // ("01") and that read as digits of another length.
        for n in [0u64, 1, 10, u64::MAX] {
            keys.push(Key::from(n));
        }
        keys.extend(["01", "1 ", "184467440737095516150"].map(Key::from));
        keys
    }

    #[test]
    fn a_number_and_its_decimal_text_share_one_entry_and_one_block() {
        use crate::clock::ManualClock;
        use crate::store::LocalStore;
        use crate::Algorithm::*;
        let now = 1_700_000_000_000_000;
        let store = MemoryStore::with_clock(ManualClock::new(now));
        let params = Params { blockable: true, ..Params::new(Quota::per_hour(3)) };
        for algorithm in [FixedWindow, SlidingWindowLog, SlidingWindowCounter] {
            let check = |key: Key| Check { rule: "int-or-text".into(), key, algorithm, params };
            let (int, text) = (check(Key::from(42u64)), check(Key::from("42")));
            for c in [&int, &text, &int] {
                assert!(store.check_one_at(c, now).unwrap().decision.allowed, "{algorithm:?}");
            }
            // Three taken between the two forms: the fourth is refused under either.
            assert!(!store.check_one_at(&text, now).unwrap().decision.allowed, "{algorithm:?}");
            assert!(!store.check_one_at(&int, now).unwrap().decision.allowed, "{algorithm:?}");
            // "042" is another key.
            assert!(store.check_one_at(&check(Key::from("042")), now).unwrap().decision.allowed, "{algorithm:?}");
        }
        assert_eq!(store.len(), 6);
        // A block of the number is the text's, under every algorithm.
        let check = |key: Key, algorithm| Check { rule: "int-or-text".into(), key, algorithm, params };
        LocalStore::block_now(&store, &check(Key::from(7u64), FixedWindow), std::time::Duration::from_secs(60))
            .unwrap();
        for algorithm in [FixedWindow, SlidingWindowLog, SlidingWindowCounter] {
            let d = store.check_one_at(&check(Key::from("7"), algorithm), now).unwrap().decision;
            assert!(!d.allowed && d.retry_after().is_some(), "{algorithm:?}: {d:?}");
        }
    }

    #[test]
    fn entries_are_told_apart_by_rule_key_and_digest_alone() {
        // Every probe under one hash: only the comparison can tell the entries apart.
        let store = MemoryStore::new();
        let inner = &store.inner;
        let mut shard = Shard::new();
        shard.gcra.reserve(64, |_| 0);
        let (now, params) = (1_000_000, Params::new(Quota::per_hour(10)));
        let checks: Vec<Check> = ["r1", "r2"]
            .into_iter()
            .flat_map(|rule| keys().into_iter().map(move |key| (rule, key)))
            .map(|(rule, key)| Check { rule: rule.into(), key, algorithm: crate::Algorithm::Gcra, params })
            .collect();
        for (i, c) in checks.iter().enumerate() {
            let probe = Probe::of(&c.key);
            let e = shard.entry::<Gcra>(0, c, &probe, now, inner, true).unwrap();
            assert_eq!(e.state, Gcra::default(), "check {i} ({c:?}) found another's entry");
            e.commit(c, now);
        }
        assert_eq!(shard.len(), checks.len());
        for c in &checks {
            let probe = Probe::of(&c.key);
            assert!(shard.find::<Gcra>(0, c.rule, &probe).is_some_and(|e| e.state.tat > now), "{c:?}");
        }
    }

    /// A shard's guard must stay `!Send` (parking_lot without its `send_guard` feature), so
    /// that a future holding one across an `.await` cannot be spawned: this fails to
    /// compile (the trait's item is ambiguous) if some dependency turns the feature on.
    #[test]
    fn a_shard_guard_is_not_send() {
        trait AmbiguousIfSend<A> {
            fn some_item() {}
        }
        impl<T: ?Sized> AmbiguousIfSend<()> for T {}
        impl<T: ?Sized + Send> AmbiguousIfSend<u8> for T {}
        let _item = <MutexGuard<'static, Shard> as AmbiguousIfSend<_>>::some_item;
    }

    /// The entries a shard really holds, table by table (not its `len` counter).
    fn held(shard: &Shard) -> usize {
        shard.fixed_window.len()
            + shard.sliding_window_log.len()
            + shard.sliding_window_counter.len()
            + shard.token_bucket.len()
            + shard.leaky_bucket.len()
            + shard.gcra.len()
    }

    /// `len` of every shard against the entries held, and `live` (room under `max_keys`)
    /// against the states held: a drift either way leaks room or over-admits states.
    fn assert_counts(store: &MemoryStore, what: &str) {
        let (mut counted, mut real) = (0, 0);
        for (i, s) in store.inner.shards.iter().enumerate() {
            let shard = lock(s);
            assert_eq!(shard.len(), held(&shard), "shard {i}'s len after {what}");
            counted += shard.len();
            real += held(&shard);
        }
        let mut lanes = 0;
        store.lanes.each(|lane| lanes += lane.len());
        real += lanes;
        counted += lanes;
        assert_eq!(store.len(), real, "len after {what}");
        assert_eq!(counted, real);
        let live = store.inner.live.load(Ordering::SeqCst);
        assert_eq!(live, real, "live (max_keys room taken) after {what}");
        assert!(live <= store.inner.max_keys.unwrap(), "over the bound after {what}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

        /// Every way a state is made, changed or dropped, across the algorithms of one
        /// store (several share each shard): `len` and `live` stay the count of entries.
        #[test]
        fn len_and_live_stay_the_count_of_entries_held(
            bound in 1usize..12,
            ops in proptest::collection::vec((0u8..12, 0usize..6, 0usize..3, 0usize..6, 0u64..4), 1..120),
        ) {
            use crate::clock::{Clock, ManualClock};
            use crate::store::{LocalStore, Refund};
            use crate::Algorithm::*;
            let algorithms = [FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, LeakyBucket, Gcra];
            let keys: Vec<Key> = ["", "a", "a\0", &"k".repeat(22), &"k".repeat(23), &"k".repeat(129)]
                .into_iter()
                .map(Key::from)
                .collect();
            let clock = ManualClock::new(1_700_000_000_000_000);
            let store = MemoryStore::with_clock(clock.clone()).max_keys(bound);
            let check = |a: usize, r: usize, k: usize, cost: u64| Check {
                rule: ["count-r0", "count-r1", "count-r2"][r].into(),
                key: keys[k].clone(),
                algorithm: algorithms[a],
                params: Params { cost, ..Params::new(Quota::per_second(2)) },
            };
            let mut taken: Vec<Refund> = Vec::new();
            for (op, a, r, k, x) in ops {
                let c = check(a, r, k, x.min(3));
                let now = clock.now_micros();
                let what = format!("op {op} on {c:?}");
                match op {
                    0..=2 => {
                        if let Ok(o) = store.check_one_at(&c, now) {
                            taken.extend(o.taken.map(|t| Refund { check: c.clone(), taken: t }));
                        }
                    }
                    3 => {
                        // Two or three distinct checks in one call, some maybe new.
                        let mut cs = vec![c.clone(), check((a + 1) % 6, r, k, 1)];
                        if x > 1 {
                            cs.push(check(a, (r + 1) % 3, (k + 1) % 6, 1));
                        }
                        if let Ok(os) = store.check_at(&cs, now) {
                            for (c, o) in cs.iter().zip(os) {
                                taken.extend(o.taken.map(|t| Refund { check: c.clone(), taken: t }));
                            }
                        }
                    }
                    4 => drop(store.charge_at(&[c.clone(), check(a, (r + 1) % 3, k, 2)], now)),
                    5 => {
                        if !taken.is_empty() {
                            let i = (a * 7 + k) % taken.len();
                            store.refund_at(&[taken.swap_remove(i)], now);
                        }
                    }
                    6 => drop(LocalStore::block_now(&store, &c, std::time::Duration::from_micros(x * 700_000))),
                    7 => LocalStore::reset_now(&store, &c.rule, &c.key, c.algorithm).unwrap(),
                    8 => drop(LocalStore::peek_now(&store, &c)),
                    9 => clock.set(now + x * 400_000),
                    10 => clock.set(now + 2_000_000 + x * 5_000_000), // past expiry and grace: sweeps
                    _ => clock.set(now.saturating_sub(x * 300_000)),   // the clock steps back
                }
                assert_counts(&store, &what);
            }
            // Far ahead: the time-based sweep drops every state, and gives back all room.
            clock.set(clock.now_micros() + 3_600_000_000);
            drop(store.check_one_at(&check(0, 0, 0, 0), clock.now_micros()));
            drop(store.check_one_at(&check(0, 0, 0, 0), clock.now_micros() + 20_000_000));
            assert_counts(&store, "an hour later");
            proptest::prop_assert!(store.len() <= 1);
        }
    }

    /// Threads making, charging, blocking, resetting and sweeping states of a full store at
    /// once: when they are done, `len` and `live` are still the count of entries, and the
    /// bound was never passed.
    #[test]
    fn len_and_live_stay_the_count_of_entries_under_contention() {
        use crate::clock::{Clock, ManualClock};
        use crate::store::LocalStore;
        use crate::Algorithm::*;
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(40);
        let algorithms = [FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, LeakyBucket, Gcra];
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (store, clock) = (&store, &clock);
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let mut next = || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for _ in 0..3_000 {
                        let r = next();
                        let check = |r: u64| Check {
                            rule: ["contended-a", "contended-b"][(r % 2) as usize].into(),
                            key: Key::from(r / 2 % 30),
                            algorithm: algorithms[(r / 64 % 6) as usize],
                            params: Params::new(Quota::per_second(3)),
                        };
                        let c = check(r);
                        let now = clock.now_micros();
                        match r >> 60 {
                            0..=5 => drop(store.check_one_at(&c, now)),
                            6..=8 => drop(store.check_at(&[c.clone(), check(next())], now)),
                            9 => drop(store.charge_at(&[c], now)),
                            10 => drop(LocalStore::block_now(store, &c, std::time::Duration::from_millis(r % 3 * 500))),
                            11 => LocalStore::reset_now(store, &c.rule, &c.key, c.algorithm).unwrap(),
                            12 => clock.advance(std::time::Duration::from_millis(r % 700)),
                            _ => drop(LocalStore::peek_now(store, &c)),
                        }
                        assert!(store.inner.live.load(Ordering::SeqCst) <= 40, "over the bound");
                    }
                });
            }
        });
        assert_counts(&store, "the threads");
    }
}
