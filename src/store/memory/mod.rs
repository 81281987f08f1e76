//! [`MemoryStore`]: in-process state, sharded, with idle keys dropped automatically.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};

mod table;

use self::table::{guard_for, lock, matches, Entry, Inner, Padded, Shard, FULL_SWEEP_US, MIN_SWEEP, SWEEP_PERIOD_US};
use super::{Check, LocalStore, Outcome, Refund};
use crate::algorithm::Algorithm;
use crate::algorithm::State;
use crate::clock::Clock;
use crate::clock::SharedClock;
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
        Self::build(SharedClock::system(), None)
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
    /// by the low bits (and its tags by the top 7): a shard chosen by low bits too would
    /// leave each table only 1/`shards` of its buckets to start probes at, and every probe
    /// long once the table fills.
    fn shard_of(&self, hash: u64) -> usize {
        #[allow(clippy::cast_possible_truncation)]
        let high = (hash >> 32) as usize;
        high & (self.inner.shards.len() - 1)
    }

    fn hash(&self, rule: &str, algorithm: Algorithm, key: &Key) -> u64 {
        self.inner.hasher.hash_one((rule, algorithm, key))
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
        // Room for every new state first: all or nothing, before anything is created,
        // dropped or decided (a state made for one rule was dropped to make room for the
        // next, then made again to commit it: a refused call kept a unit).
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
            e.state.force(&c.params, now);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::Params;
    use crate::clock::ManualClock;
    use crate::quota::Quota;
    use crate::store::Taken;

    const T0: u64 = 1_700_000_000_000_000;

    fn check(rule: &str, key: &str, algorithm: Algorithm, quota: Quota) -> Check {
        Check { rule: rule.into(), key: key.into(), algorithm, params: Params::new(quota) }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hammering_one_key_accepts_exactly_the_limit() {
        for algorithm in Algorithm::ALL {
            if algorithm == Algorithm::LeakyBucket {
                continue; // shapes rather than counts; covered by the service tests
            }
            let clock = ManualClock::new(T0);
            let store = MemoryStore::with_clock(clock.clone());
            let c = check("r", "hot", algorithm, Quota::per_hour(100));
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let (store, c) = (store.clone(), c.clone());
                    tokio::spawn(async move {
                        let mut n = 0;
                        for _ in 0..50 {
                            if store.check_one(&c).unwrap().decision.allowed {
                                n += 1;
                            }
                            tokio::task::yield_now().await;
                        }
                        n
                    })
                })
                .collect();
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap();
            }
            assert_eq!(total, 100, "{algorithm}");
        }
    }

    #[test]
    fn idle_keys_are_dropped_without_help() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let q = Quota::per_second(10);
        for i in 0..20_000 {
            store.check_at(&[check("r", &format!("k{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
        }
        assert!(store.len() >= 20_000);
        // Long after every state expired, new traffic sweeps the old keys out.
        clock.advance(Duration::from_secs(5));
        for i in 0..20_000 {
            store.check_at(&[check("r", &format!("n{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
        }
        let len = store.len();
        assert!(len < 30_000, "expired keys were kept: {len}");
    }

    #[test]
    fn recently_expired_keys_are_kept_for_a_second() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let q = Quota::per_second(10); // a GCRA state expires 100 ms after one request
        for i in 0..20_000 {
            store.check_at(&[check("r", &format!("k{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
        }
        clock.advance(Duration::from_millis(200));
        for i in 0..20_000 {
            store.check_at(&[check("r", &format!("n{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
        }
        // Every shard swept at least once, and kept the states expired 100 ms ago.
        assert_eq!(store.len(), 40_000);
    }

    /// A charged rule's probe (cost 0) is decided and takes nothing, alone or beside a
    /// rule that takes; a charge takes its units whatever the decision.
    #[test]
    fn a_probe_takes_nothing_and_a_charge_takes_past_the_limit() {
        let store = MemoryStore::new();
        for a in Algorithm::ALL {
            let mut probe = check("tokens", "k", a, Quota::per_minute(3));
            probe.params.cost = 0;
            let other = check("requests", "k", a, Quota::per_minute(3));
            for _ in 0..5 {
                assert!(store.check_at(std::slice::from_ref(&probe), T0).unwrap()[0].taken.is_none(), "{a}");
                let both = store.check_at(&[probe.clone(), other.clone()], T0).unwrap();
                assert!(both[0].taken.is_none(), "{a}");
            }
            let left = |c: &Check| {
                let mut one = c.clone();
                one.params.cost = 1;
                store.check_at(std::slice::from_ref(&one), T0).unwrap()[0].decision.allowed
            };
            assert!(left(&probe), "{a}: five probes took nothing");
            let mut charge = probe.clone();
            charge.params.cost = 7;
            store.charge_at(std::slice::from_ref(&charge), T0).unwrap();
            assert!(!store.check_at(std::slice::from_ref(&probe), T0).unwrap()[0].decision.allowed, "{a}: in debt");
        }
    }

    #[test]
    fn a_rejected_rule_consumes_nothing_from_the_others() {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let wide = check("wide", "k", Algorithm::SlidingWindowLog, Quota::per_minute(10));
        let narrow = check("narrow", "k", Algorithm::FixedWindow, Quota::per_minute(2));
        let both = [wide.clone(), narrow.clone()];
        let got: Vec<bool> =
            (0..5).map(|_| store.check_at(&both, T0).unwrap().iter().all(|o| o.decision.allowed)).collect();
        assert_eq!(got, [true, true, false, false, false]);
        // Only the two accepted requests were taken from the wide rule.
        assert_eq!(store.check_at(&[wide], T0).unwrap()[0].decision.remaining, 7);
    }

    #[tokio::test]
    async fn peek_and_reset() {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let c = check("r", "k", Algorithm::TokenBucket, Quota::per_minute(3));
        for _ in 0..3 {
            store.check(std::slice::from_ref(&c)).unwrap();
        }
        let d = store.peek(&c).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert!(!store.peek(&c).unwrap().allowed, "peek consumed something");
        store.reset("r", &c.key, c.algorithm).unwrap();
        assert_eq!(store.peek(&c).unwrap().remaining, 2);
        store.refund(&[Refund { check: c.clone(), taken: Taken { at: T0 } }]).unwrap();
    }

    #[test]
    fn a_spike_of_keys_is_swept_by_time_under_light_traffic() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let q = Quota::per_minute(10);
        for i in 0..200_000 {
            store.check_one_at(&check("r", &format!("k{i}"), Algorithm::Gcra, q), clock.now_micros()).unwrap();
        }
        assert_eq!(store.len(), 200_000);
        // An hour later, light traffic: a single request (on one shard) sweeps them all.
        clock.advance(Duration::from_secs(3600));
        store.check_one_at(&check("r", "one", Algorithm::Gcra, q), clock.now_micros()).unwrap();
        assert_eq!(store.len(), 1, "the spike outlived its expiry");
    }

    #[test]
    fn max_keys_bounds_the_states_and_keeps_every_known_key_exact() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(1_000);
        let cap = 1_000;
        let q = Quota::per_hour(3);
        let mut full = 0;
        for i in 0..5_000 {
            match store.check_one_at(&check("r", &format!("k{i}"), Algorithm::FixedWindow, q), T0) {
                Ok(o) => assert!(o.decision.allowed),
                Err(StoreError::Full(1_000)) => full += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(store.len() <= cap, "{} states for a bound of {cap}", store.len());
        assert!(full >= 5_000 - cap, "{full} refused");
        // A key that has a state is still limited exactly while the store is full.
        let known = (0..5_000)
            .map(|i| check("r", &format!("k{i}"), Algorithm::FixedWindow, q))
            .find(|c| store.check_one_at(c, T0).is_ok())
            .unwrap();
        let allowed: Vec<bool> = (0..3).map(|_| store.check_one_at(&known, T0).unwrap().decision.allowed).collect();
        assert_eq!(allowed, [true, false, false], "1 + 1 taken above, of 3");
        // Once states expire, new keys get room again.
        clock.advance(Duration::from_secs(3600));
        assert!(store.check_one_at(&check("r", "late", Algorithm::FixedWindow, q), clock.now_micros()).is_ok());
    }

    #[test]
    fn a_tier_with_a_shorter_period_does_not_shorten_a_longer_ones_state() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let daily = check("r", "acct", Algorithm::SlidingWindowLog, Quota::per_day(2));
        let minute = check("r", "acct", Algorithm::SlidingWindowLog, Quota::per_minute(1000));
        assert!(store.check_one_at(&daily, T0).unwrap().decision.allowed);
        assert!(store.check_one_at(&minute, T0).unwrap().decision.allowed);
        // The per-minute commit asked for a short life; the daily units must still count
        // once it has passed, also across a sweep.
        clock.advance(Duration::from_secs(120));
        store
            .check_one_at(&check("r", "other", Algorithm::SlidingWindowLog, Quota::per_day(2)), clock.now_micros())
            .unwrap();
        let d = store.check_one_at(&daily, clock.now_micros()).unwrap().decision;
        assert!(!d.allowed, "the daily state was forgotten early: {d:?}");
    }

    /// A block needs a state; its lift does not make one, and a lifted block no longer
    /// keeps its key's state alive in a full store (it used to, until the block's end).
    #[test]
    fn a_lifted_block_takes_no_room_in_a_full_store() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(1);
        let q = Quota::per_minute(10);
        let key = |i: usize| check("r", &format!("k{i}"), Algorithm::Gcra, q);
        let (a, b) = (key(0), key(1));
        LocalStore::block(&store, &a, Duration::from_secs(86_400)).unwrap();
        assert!(matches!(LocalStore::check_one(&store, &b), Err(StoreError::Full(1))), "the block holds the room");
        LocalStore::block(&store, &b, Duration::ZERO).expect("a lift of a key with no state is a no-op");
        LocalStore::block(&store, &a, Duration::ZERO).unwrap();
        clock.advance(Duration::from_secs(2));
        assert!(LocalStore::check_one(&store, &b).unwrap().decision.allowed, "the lifted block still held the room");
    }

    /// `max_keys(n)` refuses the first new state at `n`, whatever the hash seed (it used to
    /// split `n` over the shards, and one full shard refused at 39–70 % of `n`).
    #[test]
    fn max_keys_refuses_first_at_n_whatever_the_seed() {
        for seed in 0..6 {
            let store = MemoryStore::with_clock(ManualClock::new(T0)).max_keys(320);
            let q = Quota::per_hour(3);
            let held = (0..10_000)
                .take_while(|i| {
                    store.check_one_at(&check("r", &format!("s{seed}-{i}"), Algorithm::Gcra, q), T0).is_ok()
                })
                .count();
            assert_eq!(held, 320, "store {seed}: the first refusal came at {held}");
            assert_eq!(store.len(), 320);
        }
    }

    /// A check of two new rules on a full store is refused whole: neither keeps a unit (a
    /// state made for the first was dropped to make room for the second, then made again
    /// to commit it).
    #[test]
    fn a_multi_rule_check_on_a_full_store_takes_nothing() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(1);
        let q = Quota::per_hour(3);
        let (a, b) = (check("a", "k1", Algorithm::Gcra, q), check("b", "k2", Algorithm::Gcra, q));
        let err = store.check_at(&[a.clone(), b.clone()], T0).unwrap_err();
        assert!(matches!(err, StoreError::Full(1)), "{err}");
        assert_eq!(store.len(), 0, "a refused call made a state");
        let d = store.check_one_at(&a, T0).unwrap().decision;
        assert_eq!(d.remaining, 2, "the refused call kept a unit of rule a");
        // With room for both, both are decided together.
        let store = MemoryStore::with_clock(clock).max_keys(2);
        let outcomes = store.check_at(&[a, b], T0).unwrap();
        assert!(outcomes.iter().all(|o| o.taken.is_some()));
    }
}
