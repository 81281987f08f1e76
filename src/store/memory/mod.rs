//! [`MemoryStore`]: in-process state, sharded, with idle keys dropped automatically.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};

mod table;

use self::table::{guard_for, lock, matches, Entry, Inner, Padded, Shard, FULL_SWEEP_US, MIN_SWEEP, SWEEP_PERIOD_US};
use super::{Check, LocalStore, Outcome, Refund};
use crate::algorithm::{Algorithm, State};
use crate::clock::{Clock, SharedClock, SystemClock};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;

/// In-process limiter state: no setup, no I/O.
///
/// Concurrent: keys are spread over independent shards (no global lock), and the rules
/// of one request are decided under the locks of their shards, so a multi-rule request is
/// atomic. Clones share the state.
///
/// Memory stays bounded with no help: states expired more than a second ago are dropped
/// by a shard whenever it has doubled in size since it last looked, and by a sweep that
/// visits every shard at least every 10 s of traffic (after an idle hour, the first
/// request sweeps them all). The second of grace spares keys that are busy but below
/// their quota from being dropped and re-created between requests.
/// [`MemoryStore::max_keys`] bounds the number of states outright.
///
/// Limits hold per process: use `RedisStore` to share them between servers.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("keys", &self.len())
            .field("max_keys", &self.inner.max_keys)
            .finish()
    }
}

impl MemoryStore {
    /// A store on the system clock.
    #[must_use]
    pub fn new() -> Self {
        Self::build(SharedClock(Arc::new(SystemClock)), None)
    }

    /// A store whose time comes from `clock` (tests: `ManualClock`, feature `test-util`).
    #[must_use]
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::build(SharedClock(Arc::new(clock)), None)
    }

    /// A new store like this one, holding at most `n` (rule, key) states: the bound for a
    /// process facing floods of distinct keys. Call before use; states of this store are
    /// not carried over.
    ///
    /// When a check needs a new state and the store holds `n`, the shard of the new state
    /// first drops its expired states, then (at most every 100 ms) every shard does; if
    /// that makes no room, the check fails with
    /// [`StoreError::Full`] (a check of several rules takes nothing then) and
    /// the limiter's fail mode decides (open: the request passes unlimited and the
    /// failure is logged and counted; closed: it is refused). Keys that already have a
    /// state keep being limited exactly: a flood of new keys never evicts a client's
    /// history.
    #[must_use]
    pub fn max_keys(self, n: usize) -> Self {
        Self::build(self.inner.clock.clone(), Some(n))
    }

    fn build(clock: SharedClock, max_keys: Option<usize>) -> Self {
        let n = std::thread::available_parallelism().map_or(4, usize::from);
        let shards = (n * 16).next_power_of_two().max(16);
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| Padded(Mutex::new(Shard { table: HashTable::new(), sweep_at: MIN_SWEEP })))
                    .collect(),
                hasher: DefaultHashBuilder::default(),
                clock,
                max_keys,
                live: AtomicUsize::new(0),
                id: super::new_identity(),
                next_sweep: AtomicU64::new(0),
                cursor: AtomicUsize::new(0),
                next_full_sweep: AtomicU64::new(0),
            }),
        }
    }

    /// How many (rule, key) states are held, expired ones not yet dropped included.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Whether no state is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current time of this store's clock, µs since the epoch.
    #[must_use]
    pub fn now_micros(&self) -> u64 {
        self.inner.clock.now()
    }

    /// The shard of a hash: from its upper half. The table inside the shard picks buckets
    /// by the low bits: a shard chosen by them too would leave each table 1/`shards` of
    /// its buckets to start probes at.
    fn shard_of(&self, hash: u64) -> usize {
        #[allow(clippy::cast_possible_truncation)]
        let high = (hash >> 32) as usize;
        high & (self.inner.shards.len() - 1)
    }

    fn hash(&self, rule: &str, algorithm: Algorithm, key: &Key) -> u64 {
        self.inner.hash(rule, algorithm, key)
    }

    /// The time-based sweep: one shard per `SWEEP_PERIOD / shards` of time that has
    /// passed, all of them after a long quiet spell. Costs one atomic load while none is
    /// due.
    fn sweep_due(&self, now: u64) {
        let due_at = self.inner.next_sweep.load(Ordering::Relaxed);
        if now < due_at {
            return;
        }
        let shards = self.inner.shards.len();
        let step = SWEEP_PERIOD_US / shards as u64;
        if self.inner.next_sweep.compare_exchange(due_at, now + step, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return; // another thread claimed this step
        }
        let due = usize::try_from((now - due_at) / step + 1).unwrap_or(usize::MAX).min(shards);
        for _ in 0..due {
            let i = self.inner.cursor.fetch_add(1, Ordering::Relaxed) % shards;
            lock(&self.inner.shards[i]).sweep(now, &self.inner);
        }
    }

    /// Decides one rule synchronously at `now`, with no allocation.
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when the rule's key has no state yet and the store holds
    /// [`MemoryStore::max_keys`] live states.
    pub fn check_one_at(&self, check: &Check, now: u64) -> Result<Outcome, StoreError> {
        self.sweep_due(now);
        let hash = self.hash(&check.rule, check.algorithm, &check.key);
        // One frame, the decision written straight into the answer: a wrapper returning
        // the `Result` through a second call measured 7 % more instructions a decision.
        let mut swept = false;
        loop {
            let full = {
                let mut shard = lock(&self.inner.shards[self.shard_of(hash)]);
                match shard.entry(hash, check, now, &self.inner, false) {
                    Ok(entry) => {
                        let decision = entry.decide(check, now, true);
                        // A probe (cost 0, a charged rule's admission) takes nothing.
                        let taken = (decision.allowed && check.params.cost > 0).then(|| entry.commit(check, now));
                        return Ok(Outcome { decision, taken });
                    }
                    Err(err) => err,
                }
            };
            // Full: once, with no shard locked, make room in every shard and try again.
            if swept || !matches!(full, StoreError::Full(_)) || !self.make_room_everywhere(now) {
                return Err(full);
            }
            swept = true;
        }
    }

    /// Full under `max_keys`: drops the expired states of every shard, one at a time with
    /// no other lock held, at most once per [`FULL_SWEEP_US`] (a flood of new keys must not
    /// sweep the whole table on each of its requests). Whether it swept.
    fn make_room_everywhere(&self, now: u64) -> bool {
        let due = self.inner.next_full_sweep.load(Ordering::Relaxed);
        if now < due
            || self
                .inner
                .next_full_sweep
                .compare_exchange(due, now.saturating_add(FULL_SWEEP_US), Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        for shard in &*self.inner.shards {
            lock(shard).make_room(now, &self.inner);
        }
        true
    }

    /// Decides synchronously at `now` (the `Store` impl calls this with the clock's time).
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::check_one_at`].
    pub fn check_at(&self, checks: &[Check], now: u64) -> Result<Vec<Outcome>, StoreError> {
        if let [check] = checks {
            return Ok(vec![self.check_one_at(check, now)?]);
        }
        super::distinct(checks)?;
        match self.check_all_once(checks, now) {
            Err(StoreError::Full(_)) if self.make_room_everywhere(now) => self.check_all_once(checks, now),
            result => result,
        }
    }

    fn check_all_once(&self, checks: &[Check], now: u64) -> Result<Vec<Outcome>, StoreError> {
        self.sweep_due(now);
        // Several rules: lock their shards in ascending order (no deadlock), decide all,
        // commit only if every enforced one passes (and then each shadow one that passes).
        let hashes: Vec<u64> = checks.iter().map(|c| self.hash(&c.rule, c.algorithm, &c.key)).collect();
        let mut order: Vec<usize> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, lock(&self.inner.shards[i]))).collect();
        // Room for every new state first, all or nothing, before anything is created,
        // dropped or decided: a state made for one rule is never dropped for the next.
        for (_, shard) in &mut guards {
            shard.maybe_sweep(now, &self.inner);
        }
        let missing = |guards: &mut [(usize, MutexGuard<'_, Shard>)]| {
            let mut absent = |(c, &h): (&Check, &u64)| {
                let shard = guard_for(guards, self.shard_of(h));
                shard.table.find(h, |e| matches(e, &c.rule, c.algorithm, &c.key)).is_none()
            };
            checks.iter().zip(&hashes).filter(|&pair| absent(pair)).count()
        };
        let new = missing(&mut guards);
        if new > 0 && !self.inner.reserve(new) {
            for (_, shard) in &mut guards {
                shard.make_room(now, &self.inner);
            }
            if !self.inner.reserve(missing(&mut guards)) {
                return Err(StoreError::Full(self.inner.max_keys.unwrap_or(usize::MAX)));
            }
        }
        let decisions: Vec<Decision> = checks
            .iter()
            .zip(&hashes)
            .map(|(c, &h)| {
                let shard = guard_for(&mut guards, self.shard_of(h));
                let e = shard.entry(h, c, now, &self.inner, true).expect("room reserved");
                e.decide(c, now, true)
            })
            .collect();
        let all = decisions.iter().zip(checks).all(|(d, c)| d.allowed || c.params.shadow);
        let mut outcomes = Vec::with_capacity(checks.len());
        for ((c, &h), decision) in checks.iter().zip(&hashes).zip(decisions) {
            let taken = if all && decision.allowed && c.params.cost > 0 {
                let e = guard_for(&mut guards, self.shard_of(h)).entry(h, c, now, &self.inner, true)?;
                Some(e.commit(c, now))
            } else {
                None
            };
            outcomes.push(Outcome { decision, taken });
        }
        Ok(outcomes)
    }

    /// Takes what `charges` say at `now`, whatever the decisions (see [`LocalStore::charge`]).
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::check_one_at`].
    pub fn charge_at(&self, charges: &[Check], now: u64) -> Result<(), StoreError> {
        match self.charge_once(charges, now) {
            Err(StoreError::Full(_)) if self.make_room_everywhere(now) => self.charge_once(charges, now),
            result => result,
        }
    }

    fn charge_once(&self, charges: &[Check], now: u64) -> Result<(), StoreError> {
        self.sweep_due(now);
        for c in charges.iter().filter(|c| c.params.cost > 0) {
            let hash = self.hash(&c.rule, c.algorithm, &c.key);
            let mut shard = lock(&self.inner.shards[self.shard_of(hash)]);
            let e = shard.entry(hash, c, now, &self.inner, false)?;
            e.state.charge(&c.params, now);
            e.expires_at = e.expires_at.max(e.state.expires_at(&c.params));
        }
        Ok(())
    }

    /// Gives back what `refunds` took, at `now` (see [`LocalStore::refund`]).
    pub fn refund_at(&self, refunds: &[Refund], now: u64) {
        for r in refunds {
            let c = &r.check;
            self.with_existing(&c.rule, c.algorithm, &c.key, |t, h| {
                if let Some(e) = t.find_mut(h, |e| matches(e, &c.rule, c.algorithm, &c.key)) {
                    e.state.refund(&c.params, r.taken.at, now);
                    // Given back to "never seen": forgotten, as Redis deletes the key (the
                    // two differ once the clock steps back).
                    if e.state.expires_at(&c.params) <= now {
                        e.state = State::new(c.algorithm);
                    }
                }
            });
        }
    }

    fn with_existing<R>(
        &self,
        rule: &str,
        algorithm: Algorithm,
        key: &Key,
        f: impl FnOnce(&mut HashTable<Entry>, u64) -> R,
    ) -> R {
        let h = self.hash(rule, algorithm, key);
        f(&mut lock(&self.inner.shards[self.shard_of(h)]).table, h)
    }
}

impl LocalStore for MemoryStore {
    fn check_one(&self, check: &Check) -> Result<Outcome, StoreError> {
        self.check_one_at(check, self.inner.clock.now())
    }

    fn check(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        self.check_at(checks, self.inner.clock.now()).map(|os| os.into_iter().map(Some).collect())
    }

    fn refund(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        self.refund_at(refunds, self.inner.clock.now());
        Ok(())
    }

    fn charge(&self, charges: &[Check]) -> Result<(), StoreError> {
        self.charge_at(charges, self.inner.clock.now())
    }

    fn peek(&self, check: &Check) -> Result<Decision, StoreError> {
        let now = self.inner.clock.now();
        Ok(self.with_existing(&check.rule, check.algorithm, &check.key, |t, h| {
            match t.find(h, |e| matches(e, &check.rule, check.algorithm, &check.key)) {
                Some(e) if e.live_until() > now => e.peek(check, now),
                _ => State::new(check.algorithm).decide(&check.params, now),
            }
        }))
    }

    fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        self.with_existing(rule, algorithm, key, |t, h| {
            if let Ok(e) = t.find_entry(h, |e| matches(e, rule, algorithm, key)) {
                e.remove();
                self.inner.release(1);
            }
        });
        Ok(())
    }

    fn block(&self, check: &Check, duration: Duration) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        if duration.is_zero() {
            // Lifted: nothing to do for a key with no state, and no state to make.
            self.with_existing(&check.rule, check.algorithm, &check.key, |t, h| {
                if let Some(e) = t.find_mut(h, |e| matches(e, &check.rule, check.algorithm, &check.key)) {
                    e.blocked_until = 0;
                }
            });
            return Ok(());
        }
        let until = now.saturating_add(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX));
        let block = || {
            let h = self.hash(&check.rule, check.algorithm, &check.key);
            let mut shard = lock(&self.inner.shards[self.shard_of(h)]);
            shard.entry(h, check, now, &self.inner, false).map(|e| e.blocked_until = until)
        };
        match block() {
            Err(StoreError::Full(_)) if self.make_room_everywhere(now) => block(),
            result => result,
        }
    }

    fn identity(&self) -> Option<usize> {
        Some(self.inner.id)
    }
}
