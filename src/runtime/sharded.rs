//! State kept per (rule, key) in [`SHARDS`] shards, each behind its own lock: the
//! blocked-key cache, the fallback's shares and the quota slices.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::RuleId;
use crate::key::Key;

pub(crate) const SHARDS: usize = 16;

pub(crate) struct Sharded<S> {
    shards: Box<[Mutex<S>]>,
    /// foldhash with a random seed, as `MemoryStore`'s.
    hasher: hashbrown::DefaultHashBuilder,
}

impl<S> Sharded<S> {
    pub(crate) fn new(mut make: impl FnMut() -> S) -> Self {
        Self { shards: (0..SHARDS).map(|_| Mutex::new(make())).collect(), hasher: Default::default() }
    }

    /// The hash of (rule, key), for the table inside a shard.
    pub(crate) fn hash(&self, rule: RuleId, key: &Key) -> u64 {
        self.hasher.hash_one((rule, key))
    }

    /// The shard of (rule, key), locked, and the pair's hash.
    pub(crate) fn lock(&self, rule: RuleId, key: &Key) -> (u64, MutexGuard<'_, S>) {
        let h = self.hash(rule, key);
        // The upper half: the table inside the shard picks buckets by the low bits.
        #[allow(clippy::cast_possible_truncation)]
        let i = ((h >> 32) as usize) % SHARDS;
        (h, self.shards[i].lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every shard, locked one at a time.
    pub(crate) fn each(&self) -> impl Iterator<Item = MutexGuard<'_, S>> {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
