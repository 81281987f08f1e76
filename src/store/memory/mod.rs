//! [`MemoryStore`]: in-process state, sharded, with idle keys dropped automatically.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

mod lane;
mod table;

#[cfg(test)]
mod held;

use self::lane::{laned, LaneProbe, Lanes};
use self::table::{guard_for, lock, Inner, Padded, Probe, Shard, Tabled, FULL_SWEEP_US, SWEEP_PERIOD_US};
use super::{Check, LocalStore, Outcome, Refund, RuleName, Taken};
use crate::algorithm::{by_algorithm, Algorithm, Kind};
use crate::clock::{Clock, SharedClock};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;

/// In-process limiter state: no setup, no I/O.
///
/// Concurrent: keys are spread over independent shards (no global lock), and the rules
/// of one request are decided under the locks of their shards, so a multi-rule request is
/// atomic. GCRA and the token bucket (its GCRA twin) keep each rule's keys in a lane of
/// their own: a key is one word, decided by one compare-and-swap under its shard's read
/// lock, so threads deciding different keys of a rule — or the same key — never wait for
/// one another's lock. Clones share the state.
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
    /// The GCRA and token-bucket states, a lane per (rule, algorithm).
    lanes: Arc<Lanes>,
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
        Self::build(SharedClock::System, None)
    }

    /// A store whose time comes from `clock` (tests: `ManualClock`, feature `test-util`).
    #[must_use]
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::build(SharedClock::new(clock), None)
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
    /// history. A `block_for` penalty of a GCRA or token-bucket key needs a state of its
    /// own beside the key's word: with no room left for it, the key's word is pushed past
    /// the penalty's end instead (refused until then, and refilling from then on).
    #[must_use]
    pub fn max_keys(self, n: usize) -> Self {
        Self::build(self.inner.clock.clone(), Some(n))
    }

    fn build(clock: SharedClock, max_keys: Option<usize>) -> Self {
        let n = std::thread::available_parallelism().map_or(4, usize::from);
        let shards = (n * 16).next_power_of_two().max(16);
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Padded(Mutex::new(Shard::new()))).collect(),
                hasher: DefaultHashBuilder::default(),
                clock,
                max_keys,
                live: AtomicUsize::new(0),
                id: super::new_identity(),
                next_sweep: AtomicU64::new(0),
                cursor: AtomicUsize::new(0),
                next_full_sweep: AtomicU64::new(0),
            }),
            // A lane's keys are decided under its shards' read locks, which readers share:
            // its shards need only spread the lock words (and the writes that make keys)
            // over the cores, 2 a core, at least 4 — 512 bytes a rule on 2 cores — where
            // the shards above, locked outright, are 16 a core.
            lanes: Arc::new(Lanes::new((n * 2).next_power_of_two().max(4))),
        }
    }

    /// How many (rule, key) states are held, expired ones not yet dropped included.
    #[must_use]
    pub fn len(&self) -> usize {
        let mut lanes = 0;
        self.lanes.each(|lane| lanes += lane.len());
        self.inner.shards.iter().map(|s| lock(s).len()).sum::<usize>() + lanes
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

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        lock(&self.inner.shards[self.shard_of(hash)])
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
            self.lanes.each(|lane| lane.sweep_shard(i, now, &self.inner));
        }
    }

    /// Decides one rule synchronously at `now`, with no allocation.
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when the rule's key has no state yet and the store holds
    /// [`MemoryStore::max_keys`] live states.
    pub fn check_one_at(&self, check: &Check, now: u64) -> Result<Outcome, StoreError> {
        if laned(check.algorithm) {
            self.sweep_due(now);
            return match self.lane_check(check, now) {
                Err(StoreError::Full(_)) if self.make_room_everywhere(now) => self.lane_check(check, now),
                result => result,
            };
        }
        by_algorithm!(check.algorithm, K => self.check_one_of::<K>(check, now))
    }

    /// Decides a GCRA or token-bucket check in its rule's lane, committing it when it
    /// accepts: one compare-and-swap on the key's word. A rule that
    /// reads blocks reads the key's block from the shards first, once any key of the store
    /// was blocked.
    fn lane_check(&self, check: &Check, now: u64) -> Result<Outcome, StoreError> {
        let p = &check.params;
        let lane = self.lanes.of(check.rule, check.algorithm);
        let probe = LaneProbe::of(&check.key);
        let blocked = self.lane_block(check, now);
        if blocked > now {
            // Refused by the block: nothing taken, no word made.
            let tat = lane.find(&self.inner, &probe, |w| w.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(0);
            let d = lane::decide(tat, p, now);
            return Ok(Outcome { decision: crate::algorithm::blocking(d, blocked, p, now).0, taken: None });
        }
        let (tat, new) = lane.with(&self.inner, &probe, now, |w| lane::check(w, p, now))?;
        let decision = lane::decide(tat, p, now);
        if !decision.allowed && p.block_us > 0 {
            let (decision, start) = crate::algorithm::blocking(decision, 0, p, now);
            if let Some(until) = start {
                self.start_lane_block(check, until, now);
            }
            return Ok(Outcome { decision, taken: None });
        }
        Ok(Outcome { decision, taken: new.map(|at| Taken { at }) })
    }

    /// The end of a lane key's block (0: none), from the shards: read only by a rule that
    /// reads blocks, once any key of the store was blocked.
    fn lane_block(&self, check: &Check, now: u64) -> u64 {
        if !check.params.reads_block() || !self.lanes.blocks_seen.load(Ordering::Relaxed) {
            return 0;
        }
        self.at(check.rule, &check.key, |shard, h, probe| shard.block_of(h, check.rule, probe, now))
    }

    /// Starts a `block_for` penalty of a lane key until `until`: a state beside its word, in
    /// the shards. On a store too full for that state, the word itself is pushed past the
    /// block's end (the key refused until then, refilling from then on: stricter than the
    /// block, never looser), so a penalty holds on a full store too, as a window rule's
    /// does in its own entry.
    fn start_lane_block(&self, check: &Check, until: u64, now: u64) {
        if self.block_until(check, until, now).is_ok() {
            return;
        }
        let q = check.params.quota;
        let past = until.saturating_add(q.burst_size().saturating_mul(q.emission_interval_micros()));
        let lane = self.lanes.of(check.rule, check.algorithm);
        let _ = lane.with(&self.inner, &LaneProbe::of(&check.key), now, |w| w.fetch_max(past, Ordering::Relaxed));
    }

    /// Gives back a lane commit (see [`lane::refund`]).
    fn lane_refund(&self, check: &Check, at: u64, now: u64) {
        if let Some(lane) = self.lanes.get(check.rule, check.algorithm) {
            lane.find(&self.inner, &LaneProbe::of(&check.key), |w| lane::refund(w, &check.params, at, now));
        }
    }

    /// Blocks `check`'s key under its rule until `until` (0: lifts it), in the state of
    /// its algorithm (made for it: a lane's key keeps its block there, in a state of its
    /// own) and of every other algorithm that has one.
    fn block_until(&self, check: &Check, until: u64, now: u64) -> Result<(), StoreError> {
        if until == 0 {
            // Lifted: nothing to do for a key with no state, and no state to make.
            self.at(check.rule, &check.key, |shard, h, probe| shard.set_block(h, check.rule, probe, 0, now));
            return Ok(());
        }
        self.lanes.blocks_seen.store(true, Ordering::Relaxed);
        let block = || {
            self.at(check.rule, &check.key, |shard, h, probe| {
                by_algorithm!(check.algorithm, K => {
                    shard.entry::<K>(h, check, probe, now, &self.inner, false).map(|e| e.blocked_until = until)
                })?;
                shard.set_block(h, check.rule, probe, until, now);
                Ok(())
            })
        };
        match block() {
            Err(StoreError::Full(_)) if self.make_room_everywhere(now) => block(),
            result => result,
        }
    }

    fn check_one_of<K: Tabled>(&self, check: &Check, now: u64) -> Result<Outcome, StoreError> {
        self.sweep_due(now);
        let probe = Probe::of(&check.key);
        let hash = self.inner.hash(check.rule, &probe);
        // One frame, the decision written straight into the answer: a wrapper returning
        // the `Result` through a second call measured 7 % more instructions a decision.
        let mut swept = false;
        loop {
            let full = {
                let mut shard = self.shard(hash);
                match shard.entry::<K>(hash, check, &probe, now, &self.inner, false) {
                    Ok(entry) => {
                        let blocked = entry.blocked_until;
                        let decision = entry.decide(check, now);
                        // A probe (cost 0, a charged rule's admission) takes nothing.
                        let taken = (decision.allowed && check.params.cost > 0).then(|| entry.commit(check, now));
                        // A rejection that started a block: the key's, under every algorithm.
                        let started = (entry.blocked_until != blocked).then_some(entry.blocked_until);
                        if let Some(until) = started {
                            self.lanes.blocks_seen.store(true, Ordering::Relaxed);
                            shard.set_block(hash, check.rule, &probe, until, now);
                        }
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
        self.lanes.each(|lane| lane.make_room(now, &self.inner));
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
        self.sweep_due(now);
        if !checks.iter().any(|c| laned(c.algorithm)) {
            return match self.check_all_once(&checks.iter().collect::<SmallVec<[&Check; 4]>>(), now, &[]) {
                Err(StoreError::Full(_)) if self.make_room_everywhere(now) => {
                    self.check_all_once(&checks.iter().collect::<SmallVec<[&Check; 4]>>(), now, &[])
                }
                result => result,
            };
        }
        match self.check_with_lanes(checks, now) {
            Err(StoreError::Full(_)) if self.make_room_everywhere(now) => self.check_with_lanes(checks, now),
            result => result,
        }
    }

    /// A check of several rules, some in lanes: their words under their shards' write
    /// locks for the whole call (no compare-and-swap moves them meanwhile), the others
    /// under their shards' locks, all decided before any commits. Lane locks come first,
    /// then the shards' (the one order every path takes them in).
    fn check_with_lanes(&self, checks: &[Check], now: u64) -> Result<Vec<Outcome>, StoreError> {
        let laned_checks: SmallVec<[&Check; 4]> = checks.iter().filter(|c| laned(c.algorithm)).collect();
        let lanes: SmallVec<[lane::LaneRef<'_>; 4]> =
            laned_checks.iter().map(|c| self.lanes.of(c.rule, c.algorithm)).collect();
        let spots: SmallVec<[lane::Spot<'_>; 4]> =
            laned_checks.iter().zip(&lanes).map(|(c, lane)| lane.spot(&self.inner, &c.key)).collect();
        // Blocks first, from the shards (no lock held): a blocked key takes nothing, so it
        // needs no word, and is refused on a full store too.
        let blocks: SmallVec<[u64; 4]> = laned_checks.iter().map(|c| self.lane_block(c, now)).collect();
        let needed: SmallVec<[bool; 4]> = blocks.iter().map(|&b| b <= now).collect();
        let mut held = lane::Held::lock(&spots);
        let new = held.make_all(&spots, &needed, now, &self.inner)?;
        // Decided on the words as they are.
        let mut starts: SmallVec<[(&Check, u64); 2]> = SmallVec::new();
        let mut decided: SmallVec<[(Decision, u64); 4]> = SmallVec::new();
        for ((c, spot), &blocked) in laned_checks.iter().zip(&spots).zip(&blocks) {
            let p = &c.params;
            let tat = held.find(spot).map_or(0, |w| w.load(Ordering::Relaxed));
            let (d, start) = crate::algorithm::blocking(lane::decide(tat, p, now), blocked, p, now);
            starts.extend(start.map(|until| (*c, until)));
            decided.push((d, tat));
        }
        let pass = decided.iter().zip(&laned_checks).all(|((d, _), c)| d.allowed || c.params.shadow);
        let others: SmallVec<[&Check; 4]> = checks.iter().filter(|c| !laned(c.algorithm)).collect();
        let rest = match self.check_all_once(&others, now, &[pass]) {
            Ok(rest) => rest,
            Err(err) => {
                held.unmake(&spots, &new, &self.inner);
                return Err(err);
            }
        };
        let all = pass && rest.iter().zip(&others).all(|(o, c)| o.decision.allowed || c.params.shadow);
        let (mut rest, mut lanes) = (rest.into_iter(), decided.into_iter().zip(&spots));
        let outcomes = checks
            .iter()
            .map(|c| {
                if !laned(c.algorithm) {
                    return rest.next().expect("decided");
                }
                let ((decision, tat), spot) = lanes.next().expect("decided");
                let p = &c.params;
                let taken = (all && decision.allowed && p.cost > 0).then(|| {
                    let new = tat.max(now) + p.cost * p.quota.emission_interval_micros();
                    held.word(spot).store(new, Ordering::Relaxed);
                    Taken { at: new }
                });
                Outcome { decision, taken }
            })
            .collect();
        drop(held);
        for (c, until) in starts {
            self.start_lane_block(c, until, now);
        }
        Ok(outcomes)
    }

    /// Decides `checks` (none in a lane) under their shards' locks; commits them only if
    /// every enforced one accepts, and so did the lanes' rules of the call (`pass`, when
    /// given).
    fn check_all_once(&self, checks: &[&Check], now: u64, pass: &[bool]) -> Result<Vec<Outcome>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        // Several rules: lock their shards in ascending order (no deadlock), decide all,
        // commit only if every enforced one passes (and then each shadow one that passes).
        let probes: SmallVec<[Probe<'_>; 4]> = checks.iter().map(|c| Probe::of(&c.key)).collect();
        let hashes: SmallVec<[u64; 4]> = checks.iter().zip(&probes).map(|(c, p)| self.inner.hash(c.rule, p)).collect();
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
        let each = || checks.iter().copied().zip(&probes).zip(&hashes).map(|((c, p), &h)| (c, p, h));
        let missing = |guards: &mut [(usize, MutexGuard<'_, Shard>)]| {
            let mut absent = |&(c, p, h): &(&Check, &Probe<'_>, u64)| {
                let shard = guard_for(guards, self.shard_of(h));
                by_algorithm!(c.algorithm, K => shard.find::<K>(h, c.rule, p).is_none())
            };
            each().filter(|x| absent(x)).count()
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
        let decisions: Vec<Decision> = each()
            .map(|(c, p, h)| {
                let shard = guard_for(&mut guards, self.shard_of(h));
                let (decision, started) = by_algorithm!(c.algorithm, K => {
                    let e = shard.entry::<K>(h, c, p, now, &self.inner, true).expect("room reserved");
                    let blocked = e.blocked_until;
                    let decision = e.decide(c, now);
                    (decision, (e.blocked_until != blocked).then_some(e.blocked_until))
                });
                // A rejection that started a block: the key's, under every algorithm.
                if let Some(until) = started {
                    self.lanes.blocks_seen.store(true, Ordering::Relaxed);
                    shard.set_block(h, c.rule, p, until, now);
                }
                decision
            })
            .collect();
        let all = pass.iter().all(|&p| p) && decisions.iter().zip(checks).all(|(d, c)| d.allowed || c.params.shadow);
        let mut outcomes = Vec::with_capacity(checks.len());
        for ((c, p, h), decision) in each().zip(decisions) {
            let taken = if all && decision.allowed && c.params.cost > 0 {
                let shard = guard_for(&mut guards, self.shard_of(h));
                Some(by_algorithm!(c.algorithm, K => shard.entry::<K>(h, c, p, now, &self.inner, true)?.commit(c, now)))
            } else {
                None
            };
            outcomes.push(Outcome { decision, taken });
        }
        Ok(outcomes)
    }

    /// Takes what `charges` say at `now`, whatever the decisions (see [`LocalStore::charge_now`]).
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::check_one_at`].
    pub fn charge_at(&self, charges: &[Check], now: u64) -> Result<(), StoreError> {
        self.sweep_due(now);
        // Each charge taken once: a charge that finds no room is tried again, once the
        // store made room, from where it stopped (those before it are taken already).
        let mut swept = false;
        let mut rest = charges;
        while let Some((c, after)) = rest.split_first() {
            match self.charge_one(c, now) {
                Err(StoreError::Full(_)) if !swept && self.make_room_everywhere(now) => swept = true,
                Err(err) => return Err(err),
                Ok(()) => rest = after,
            }
        }
        Ok(())
    }

    fn charge_one(&self, c: &Check, now: u64) -> Result<(), StoreError> {
        if c.params.cost == 0 {
            return Ok(());
        }
        if laned(c.algorithm) {
            let lane = self.lanes.of(c.rule, c.algorithm);
            return lane.with(&self.inner, &LaneProbe::of(&c.key), now, |w| lane::charge(w, &c.params, now));
        }
        let probe = Probe::of(&c.key);
        let hash = self.inner.hash(c.rule, &probe);
        let mut shard = self.shard(hash);
        by_algorithm!(c.algorithm, K => {
            let e = shard.entry::<K>(hash, c, &probe, now, &self.inner, false)?;
            Kind::charge(&mut e.state, &c.params, now);
            e.expires_at = e.expires_at.max(e.state.expires_at(&c.params));
        });
        Ok(())
    }

    /// Gives back what `refunds` took, at `now` (see [`LocalStore::refund_now`]).
    pub fn refund_at(&self, refunds: &[Refund], now: u64) {
        for r in refunds {
            let c = &r.check;
            if laned(c.algorithm) {
                self.lane_refund(c, r.taken.at, now);
                continue;
            }
            self.at(c.rule, &c.key, |shard, h, probe| {
                by_algorithm!(c.algorithm, K => {
                    if let Some(e) = shard.find::<K>(h, c.rule, probe) {
                        e.state.refund(&c.params, r.taken.at, now);
                        // Given back to "never seen": forgotten, as Redis deletes the key (the
                        // two differ once the clock steps back). A window's expiry depends on
                        // the period it is read with: a key shared by tiers of different
                        // periods is forgotten only once the longest one's commits expired
                        // too (an empty log at once, as Redis deletes it).
                        let own = e.state.expires_at(&c.params);
                        let windowed = matches!(
                            c.algorithm,
                            Algorithm::FixedWindow | Algorithm::SlidingWindowLog | Algorithm::SlidingWindowCounter
                        );
                        if own <= now && (!windowed || own == 0 || e.expires_at <= now) {
                            e.state = K::default();
                        }
                    }
                });
            });
        }
    }

    /// `f` with the locked shard of `rule`'s state of `key`, its hash and its probe.
    fn at<R>(&self, rule: RuleName, key: &Key, f: impl FnOnce(&mut Shard, u64, &Probe<'_>) -> R) -> R {
        let probe = Probe::of(key);
        let h = self.inner.hash(rule, &probe);
        f(&mut self.shard(h), h, &probe)
    }
}

impl LocalStore for MemoryStore {
    fn check_one_now(&self, check: &Check) -> Result<Outcome, StoreError> {
        self.check_one_at(check, self.inner.clock.now())
    }

    fn check_now(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        self.check_at(checks, self.inner.clock.now()).map(|os| os.into_iter().map(Some).collect())
    }

    fn refund_now(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        self.refund_at(refunds, self.inner.clock.now());
        Ok(())
    }

    fn charge_now(&self, charges: &[Check]) -> Result<(), StoreError> {
        self.charge_at(charges, self.inner.clock.now())
    }

    fn peek_now(&self, check: &Check) -> Result<Decision, StoreError> {
        let now = self.inner.clock.now();
        if laned(check.algorithm) {
            let p = &check.params;
            let tat = self
                .lanes
                .get(check.rule, check.algorithm)
                .and_then(|lane| lane.find(&self.inner, &LaneProbe::of(&check.key), |w| w.load(Ordering::Relaxed)));
            let d = lane::decide(tat.unwrap_or(0), p, now);
            return Ok(crate::algorithm::blocking(d, self.lane_block(check, now), p, now).0);
        }
        Ok(self.at(check.rule, &check.key, |shard, h, probe| {
            by_algorithm!(check.algorithm, K => match shard.find::<K>(h, check.rule, probe) {
                Some(e) if e.live_until() > now => e.peek(check, now),
                // No state under this algorithm: the key's block may be another's.
                _ if check.params.reads_block() => {
                    let blocked = shard.block_of(h, check.rule, probe, now);
                    crate::algorithm::blocking(K::default().decide(&check.params, now), blocked, &check.params, now).0
                }
                _ => K::default().decide(&check.params, now),
            })
        }))
    }

    fn reset_now(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        // A name no rule or check has used has no state to reset.
        let Some(rule) = RuleName::existing(rule) else { return Ok(()) };
        let now = self.inner.clock.now();
        if laned(algorithm) {
            if let Some(lane) = self.lanes.get(rule, algorithm) {
                lane.remove(&self.inner, &LaneProbe::of(key));
            }
        }
        self.at(rule, key, |shard, h, probe| {
            by_algorithm!(algorithm, K => {
                if shard.remove::<K>(h, rule, probe) {
                    self.inner.release(1);
                }
            });
            // The block too, as Redis deletes it: it is the key's, whatever the algorithm.
            shard.set_block(h, rule, probe, 0, now);
        });
        Ok(())
    }

    fn block_now(&self, check: &Check, duration: Duration) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        // A block is the key's under its rule, whatever the algorithm (as on Redis): set,
        // or lifted, in the state of every algorithm that has one.
        let until = if duration.is_zero() {
            0
        } else {
            now.saturating_add(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)).max(1)
        };
        self.block_until(check, until, now)
    }

    fn identity(&self) -> Option<usize> {
        Some(self.inner.id)
    }
}
