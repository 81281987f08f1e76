//! The table of a [`MemoryStore`](super::MemoryStore): shards on cache lines of their own,
//! entries (rule, key, algorithm, state, expiry, block), sweeping expired states, and the
//! count of live states under `max_keys`.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::hash_table::Entry as Slot;
use hashbrown::{DefaultHashBuilder, HashTable};

use crate::algorithm::{Algorithm, State};
use crate::clock::SharedClock;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Check, Taken};

/// A shard on a cache line of its own: neighbouring shards locked by different threads
/// must not share one (false sharing made two threads slower than one).
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

pub(super) struct Entry {
    pub(super) rule: Arc<str>,
    pub(super) algorithm: Algorithm,
    pub(super) key: Key,
    pub(super) state: State,
    pub(super) expires_at: u64,
    /// The end of the key's block (`Rule::block_for`), µs since the epoch; 0: none.
    pub(super) blocked_until: u64,
}

pub(super) struct Shard {
    pub(super) table: HashTable<Entry>,
    /// Sweep expired entries when the table reaches this size.
    pub(super) sweep_at: usize,
}

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
    // A panic while holding a shard cannot leave an entry half-written: recover.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn matches(e: &Entry, rule: &str, algorithm: Algorithm, key: &Key) -> bool {
    // The rule's name is most often the very `Arc` the entry holds: no `memcmp` then.
    let same_rule = std::ptr::eq(e.rule.as_ptr(), rule.as_ptr()) && e.rule.len() == rule.len() || &*e.rule == rule;
    e.algorithm == algorithm && e.key == *key && same_rule
}

impl Entry {
    /// Until when the entry means something: its state's expiry, or its block's end.
    pub(super) fn live_until(&self) -> u64 {
        self.expires_at.max(self.blocked_until)
    }

    /// Decides `check` at `now`, with the key's block (see [`crate::algorithm::blocking`]);
    /// a rejection that starts a block stores it (the one change a rejection makes).
    pub(super) fn decide(&mut self, check: &Check, now: u64, write: bool) -> Decision {
        let d = self.state.decide(&check.params, now);
        if self.blocked_until <= now && (d.allowed || check.params.block_us == 0) {
            // Nothing to block, nor blocked (the common case): the decision is not moved
            // through `blocking`.
            return d;
        }
        let (d, block) = crate::algorithm::blocking(d, self.blocked_until, &check.params, now);
        if let (Some(until), true) = (block, write) {
            self.blocked_until = until;
        }
        d
    }

    pub(super) fn peek(&self, check: &Check, now: u64) -> Decision {
        crate::algorithm::blocking(self.state.decide(&check.params, now), self.blocked_until, &check.params, now).0
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
    /// The hash of a (rule, algorithm, key) state.
    pub(super) fn hash(&self, rule: &str, algorithm: Algorithm, key: &Key) -> u64 {
        // Three writes rather than the six of hashing the tuple: both lengths in the last
        // one keep the encoding unambiguous.
        let mut h = self.hasher.build_hasher();
        h.write(rule.as_bytes());
        h.write(key.as_bytes());
        let lengths = (rule.len() as u64) << 32 | (key.as_bytes().len() as u64) << 8;
        h.write_u64(lengths | u64::from(key.is_hashed()) << 7 | algorithm as u64);
        h.finish()
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
    /// Drops the states expired more than the grace period ago (a key below its quota,
    /// whose state expires between requests, is not dropped and made again each time).
    pub(super) fn sweep(&mut self, now: u64, inner: &Inner) {
        let before = self.table.len();
        self.table.retain(|e| e.live_until().saturating_add(GRACE_US) > now);
        inner.release(before - self.table.len());
        self.sweep_at = (self.table.len() * 2).max(MIN_SWEEP);
    }

    /// [`Shard::sweep`], amortised: only once the table doubled since the last sweep.
    pub(super) fn maybe_sweep(&mut self, now: u64, inner: &Inner) {
        if self.table.len() >= self.sweep_at {
            self.sweep(now, inner);
        }
    }

    /// Makes room under `max_keys`: drops the expired states (any expiry, no grace).
    pub(super) fn make_room(&mut self, now: u64, inner: &Inner) {
        let before = self.table.len();
        self.table.retain(|e| e.live_until() > now);
        inner.release(before - self.table.len());
    }

    /// The live entry for `check`, created (or reset, when expired) as needed; one probe.
    /// A new one needs room under `max_keys`, unless the caller `reserved` it (and then
    /// nothing is swept or dropped here).
    pub(super) fn entry(
        &mut self,
        hash: u64,
        check: &Check,
        now: u64,
        inner: &Inner,
        reserved: bool,
    ) -> Result<&mut Entry, StoreError> {
        let rehash = |e: &Entry| inner.hash(&e.rule, e.algorithm, &e.key);
        let find = |e: &Entry| matches(e, &check.rule, check.algorithm, &check.key);
        if !reserved {
            self.maybe_sweep(now, inner);
            // Under a bound only (one more probe): is this a new state, and is there room?
            if inner.max_keys.is_some() && self.table.find(hash, find).is_none() && !inner.reserve(1) {
                self.make_room(now, inner);
                if !inner.reserve(1) {
                    return Err(StoreError::Full(inner.max_keys.unwrap_or(usize::MAX)));
                }
            }
        }
        let e = match self.table.entry(hash, find, rehash) {
            Slot::Occupied(o) => o.into_mut(),
            Slot::Vacant(v) => v
                .insert(Entry {
                    rule: check.rule.clone(),
                    algorithm: check.algorithm,
                    key: check.key.clone(),
                    state: State::new(check.algorithm),
                    expires_at: 0,
                    blocked_until: 0,
                })
                .into_mut(),
        };
        let live = e.live_until();
        if live <= now && live != 0 {
            e.state = State::new(check.algorithm);
            e.expires_at = 0;
            e.blocked_until = 0;
        }
        Ok(e)
    }
}
