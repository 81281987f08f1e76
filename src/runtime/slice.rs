//! Quota slices: a server that decides a key of a window algorithm or a bucket (GCRA, the
//! token bucket) often takes a slice of its quota from the store — the algorithm's own
//! check of `k` units, through the same script as a request's check — and decides that key
//! in memory until the slice is spent, its window ends, or it lapses ([`LAPSE_US`]).
//!
//! **A bucket's slice is a run of future emission slots** ([`Slots`]): its check may reach
//! up to [`REACH_US`] past the burst (`ahead_us`), so that it is granted at the key's edge too,
//! where the bucket holds less than a unit; its units are admitted no earlier than their
//! slots, and a request that comes before its slot is refused here with the `retry_after`
//! the store would give it. Its state is the key's one TAT on the store: nothing else is
//! stored, and a per-request decision on another server reads the slots as taken. What
//! it leaves goes back as GCRA's refund of its commit, taken only while no commit came
//! after; slots the clock passed unused are stranded.
//!
//! **Never over the limit.** A slice's units are counted by the store when it grants
//! them, in the window of the grant (the store's `now`, [`Taken::at`]). This server admits
//! them only while that window is surely current: until the window's end counted from
//! when it *asked* (its clock is then never later than the store's), and never past the
//! lapse. For the fixed window, a window's count is then never above `L`; for the sliding
//! window counter, the estimate at every later moment of the window is at most the one
//! the grant was decided by (the previous window's weight only falls).
//!
//! What a slice does not use goes back to the store when it lapses (a refund of its
//! commit, exact for both algorithms while the window lasts): only the units left when
//! the window ended are lost to it (*stranded*), and the metrics count them. A unit a
//! request gives back (a `count_if` status, a dropped lease, `Limiter::refund`) returns to
//! its slice while the slice is open, and to the store, as a refund of the slice's commit,
//! after.
//!
//! Sizes come from traffic: a slice is what this server's demand on the key needs for the
//! next [`PERIOD_US`], at most a fair part of what the store last said remains (that
//! divided by the servers sharing the store), and only when both are at least
//! [`MIN_UNITS`]; below that (the edge of a quota) every decision goes to the store.

use super::sharded::Sharded;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hashbrown::HashTable;
use smallvec::SmallVec;

use super::RuleId;
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::key::Key;
use crate::quota::Quota;
use crate::store::{Check, Outcome, Refund, Taken};

/// The demand a slice is sized for: this server's units on the key over this long, µs.
pub(crate) const PERIOD_US: u64 = 100_000;
/// The longest a slice's units may be admitted, from when it was asked, µs: a block, a
/// reset or a swap on another server reaches this one within it.
pub(crate) const LAPSE_US: u64 = 100_000;
/// How far past the burst a bucket's slice may reserve slots, µs: its life, so that its
/// last slot is admitted by the time it lapses; the same for every server (a server whose
/// slices reached further would leave the others none).
pub(crate) const REACH_US: u64 = LAPSE_US;
/// A slice is asked for when what is held would last less than this part of a period.
const AHEAD: u64 = 8;
/// The least slice worth a store call: below it, per-request decisions.
pub(crate) const MIN_UNITS: u64 = 16;
/// A key seen less recently than this, holding nothing, is forgotten, µs.
const IDLE_US: u64 = 1_000_000;
/// How long a key waits before asking again after a slice was refused or failed, µs.
const RETRY_US: u64 = 2_000;
/// The most keys tracked (a flood of cold keys of a sliced rule is tracked up to it).
pub(crate) const SLICE_KEYS: usize = 100_000;
/// The bit of [`Slice::left`] that says the slice is closed.
const CLOSED: u64 = 1 << 63;

/// Whether `algorithm` takes slices.
pub(crate) fn sliceable(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter | Algorithm::Gcra | Algorithm::TokenBucket
    )
}

/// Whether `algorithm`'s slices are runs of future emission slots (a bucket's), not units
/// of a window.
pub(crate) fn slotted(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket)
}

/// The store check that asks for a slice of `k` units of `check`'s rule and key: the
/// algorithm's own check of cost `k`. A bucket's reaches [`REACH_US`] past the burst (its
/// units are admitted no earlier than their slots, all within its life), and its first
/// slot comes at least `after` µs from now ([`Take::after`]).
pub(crate) fn slice_check(check: &Check, k: u64, after: u64) -> Check {
    let mut asked = check.clone();
    asked.params.cost = k;
    if slotted(check.algorithm) {
        asked.params.ahead_us = REACH_US;
        asked.params.after_us = after;
    }
    asked
}

/// How far ahead of now a bucket's run of `k` slots is to start for a server whose demand
/// is `demand` units a [`PERIOD_US`]: its units come every `PERIOD_US / demand` µs and its
/// slots every `T`, so the run's last slot is reached by the clock
/// `k·(PERIOD_US / demand − T)` µs before that unit comes, less what the run starts ahead; a quarter more for a
/// demand that slows. At most the lapse (the slice is spent by then or closed), and at
/// most an eighth of the burst's span `B·T`: where the key's TAT is behind that, the slots
/// skipped are the burst's, lost to every server (a key waking from idle loses at most an
/// eighth of its burst; a slice whose demand is slower strands its last slots instead).
fn slots_ahead(quota: &Quota, k: u64, demand: u64) -> u64 {
    let t = quota.emission_interval_micros().max(1);
    let gap = PERIOD_US / demand.max(1);
    let behind = k.saturating_mul(gap.saturating_sub(t));
    (behind + behind / 4).min(LAPSE_US).min(quota.burst_size().saturating_mul(t) / 8)
}

/// Whether a rule of `quota` shared by `servers` gives each server at least
/// [`MIN_UNITS`] a [`PERIOD_US`]: else slices never pay.
pub(crate) fn pays(quota: Quota, servers: u64) -> bool {
    let per_period = u128::from(quota.limit()) * u128::from(PERIOD_US) / u128::from(quota.period_micros().max(1));
    per_period / u128::from(servers.max(1)) >= u128::from(MIN_UNITS)
}

/// The slices' name for a rule: its count's identity and its quota (a slice holds only
/// under the quota it was taken under; a swap to another quota leaves the old slices to
/// lapse and go back).
pub(crate) fn slice_id(share_id: RuleId, quota: Quota) -> RuleId {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (share_id, quota.limit(), quota.period_micros(), quota.burst_size()).hash(&mut h);
    h.finish()
}

/// One slice: units the store counted for this server, to admit until `until`.
#[derive(Debug)]
pub(crate) struct Slice {
    /// The check the store committed (its cost: the slice's size).
    pub(crate) check: Check,
    pub(crate) taken: Taken,
    /// Until when its units may be admitted (µs, the runtime's clock).
    until: u64,
    /// After this, its window has surely ended: what is left is stranded (µs).
    ended_by: u64,
    /// When it was asked for (µs), and what the store said then (µs from then).
    asked: u64,
    /// When its answer came (µs): the store's clock had run no further than from then.
    received: u64,
    reset_after: u64,
    refill_after: u64,
    /// A window's slice: units not admitted yet. A bucket's: its own TAT (µs, the store's
    /// clock), the end of the slots it has used ([`Slots`]). [`CLOSED`] once closed.
    left: AtomicU64,
    /// A bucket's slice: its run of emission slots.
    slots: Option<Slots>,
    /// A bucket's slice: slots the clock passed unused (stranded).
    skipped: AtomicU64,
}

/// A bucket's slice (GCRA, the token bucket): the run of future emission slots its commit
/// reserved, `[end - c·T, end)` on the store's clock, each admitted as a request's check
/// would admit it there, as GCRA on a TAT of its own: a unit at `now` takes the slot at
/// `max(tat, now)` and is admitted only when that slot ends within `B·T` of `now`; slots
/// that `now` passed unused are stranded. `now` is read two ways: counted from when the
/// slice was asked for (never behind the store's clock) for where a slot may start, and
/// from when its answer came (never ahead of it; the decision's stamp) for where it may
/// end. So every unit this server admits has a slot of its own that starts no earlier than
/// the store's clock and the stamp, and ends no later than `B·T` after either, as a
/// request's check gives it: the key's bound (at most `B + r·Δ` in any span `Δ`) holds on
/// the store's clock and on the decisions' stamps, with no term for the lapse or the
/// call's latency.
#[derive(Debug, Clone, Copy)]
struct Slots {
    /// The store's clock when it granted the slice (µs), some time between this server's
    /// `asked` and `received`.
    granted: u64,
    /// The slice's last slot's end: the TAT its commit left.
    end: u64,
    /// The emission interval and the burst's span `B·T` (µs).
    t: u64,
    span: u64,
}

/// What a slice said of a unit asked of it.
#[derive(Debug)]
enum Grab {
    /// Admitted, as units of this commit (a bucket's: the slice's TAT it left).
    Took(Taken, Decision),
    /// A bucket's: its next slot comes later; the refusal a request's check would give.
    Wait(Decision),
    /// Spent (or closed): try the next.
    Spent,
}

impl Slice {
    /// A unit of `cost` at `now`: taken, or (`commit` false) only looked at: what taking it
    /// would say, nothing taken.
    fn try_take(&self, cost: u64, now: u64, limit: u64, commit: bool) -> Grab {
        let Some(slots) = self.slots else {
            let fits = if commit { self.take_units(cost) } else { self.left() >= cost };
            return if fits { Grab::Took(self.taken, self.decision(now, limit)) } else { Grab::Spent };
        };
        // This server's readings of the store's clock: never behind it (counted from when it
        // asked), and never ahead of it (from when the answer came). A unit's slot starts no
        // earlier than the first and ends within B·T of the second: both hold on the
        // store's true clock, whatever the call's latency.
        let hi = slots.granted.saturating_add(now.saturating_sub(self.asked));
        let at = slots.granted.saturating_add(now.saturating_sub(self.received)).min(hi);
        let need = cost.saturating_mul(slots.t);
        if need > slots.span {
            // More than the burst: never admitted; the store says so, with no retry time.
            return Grab::Spent;
        }
        let mut tat = self.left.load(Ordering::Acquire);
        loop {
            if tat & CLOSED != 0 {
                return Grab::Spent;
            }
            let base = tat.max(hi);
            let new = base.saturating_add(need);
            if new > slots.end {
                return Grab::Spent;
            }
            // GCRA's rule: accept iff TAT' - now + c·T <= B·T.
            let used = new - at;
            if used > slots.span {
                let (free, retry) = (0, used - slots.span);
                return Grab::Wait(Decision::reject_units(limit, free, slots.t, used, Some(retry)).at(at));
            }
            let took =
                Grab::Took(Taken { at: new }, Decision::allow_units(limit, slots.span - used, slots.t, used).at(at));
            if !commit {
                return took;
            }
            match self.left.compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if base > tat {
                        self.skipped.fetch_add((base - tat) / slots.t.max(1), Ordering::Relaxed);
                    }
                    return took;
                }
                Err(seen) => tat = seen,
            }
        }
    }

    fn take_units(&self, cost: u64) -> bool {
        let mut cur = self.left.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 || cur < cost {
                return false;
            }
            match self.left.compare_exchange_weak(cur, cur - cost, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// A window slice's decision for a unit at `now`.
    fn decision(&self, now: u64, limit: u64) -> Decision {
        let elapsed = now.saturating_sub(self.asked);
        Decision::from_parts(
            true,
            limit,
            0,
            Duration::from_micros(self.reset_after.saturating_sub(elapsed)),
            Duration::from_micros(self.refill_after.saturating_sub(elapsed)),
            None,
            Duration::ZERO,
        )
        // On this server's reading of the store's clock: it granted the slice at its
        // `taken.at`, which `asked` stands for here.
        .at(self.taken.at.saturating_add(elapsed))
    }

    /// Gives back `cost` units admitted as `taken`, while the slice is open: `false` once
    /// closed (the caller refunds them to the store, as `taken`'s units). A bucket's slice
    /// takes them back as GCRA's refund does, all or nothing: only while its TAT is still
    /// the one they left (no unit admitted since), else they are lost, as a request's
    /// would be.
    pub(crate) fn give_back(&self, cost: u64, taken: Taken) -> bool {
        let mut cur = self.left.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return false;
            }
            let back = match self.slots {
                None => cur + cost,
                Some(_) if cur != taken.at => {
                    // Lost, as a request's refund after another commit: its slot stays used.
                    self.skipped.fetch_add(cost, Ordering::Relaxed);
                    return true;
                }
                Some(slots) => cur.saturating_sub(cost.saturating_mul(slots.t)),
            };
            match self.left.compare_exchange_weak(cur, back, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Closes it: the units it left, the first time (a bucket's: its slots not used yet).
    fn close(&self) -> Option<u64> {
        let was = self.left.swap(CLOSED, Ordering::AcqRel);
        (was & CLOSED == 0).then(|| self.units_left(was))
    }

    fn units_left(&self, v: u64) -> u64 {
        match self.slots {
            None => v,
            Some(slots) => slots.end.saturating_sub(v) / slots.t.max(1),
        }
    }

    fn is_closed(&self) -> bool {
        self.left.load(Ordering::Acquire) & CLOSED != 0
    }

    fn left(&self) -> u64 {
        let v = self.left.load(Ordering::Acquire);
        if v & CLOSED != 0 {
            0
        } else {
            self.units_left(v)
        }
    }

    /// The refund of `units` admitted as `taken` (what a closed slice left: the slice's
    /// own [`Taken`]).
    pub(crate) fn refund(&self, units: u64, taken: Taken) -> Refund {
        let mut check = self.check.clone();
        check.params.cost = units;
        (check.params.ahead_us, check.params.after_us) = (0, 0);
        Refund { check, taken }
    }
}

/// What the slices counted, for the metrics and the bench.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Units given back to the store unused.
    pub(crate) given_back: AtomicU64,
    /// Units left unused when their window ended (or whose slice's outcome is unknown).
    pub(crate) stranded: AtomicU64,
}

struct Entry {
    rule: RuleId,
    key: Key,
    /// This server's demand: units in the current [`PERIOD_US`] (index `period`) and in the
    /// one before.
    period: u64,
    seen: u64,
    seen_before: u64,
    last_seen: u64,
    open: SmallVec<[Arc<Slice>; 2]>,
    fetching: bool,
    /// What the store last said remains, until when that holds (µs), and when the window
    /// of that answer surely had not ended yet (µs; 0: unknown).
    remaining: u64,
    remaining_until: u64,
    window_end: u64,
    /// A bucket's: how far past the burst the key's slots were reserved when the store
    /// last said (µs).
    ahead_of_burst: u64,
    /// No slice is asked for before this (µs): the edge of the quota, a refusal.
    wait_until: u64,
    /// Bumped by a reset or a block of the key here: a slice asked for before it is not
    /// opened when its answer comes after.
    epoch: u64,
}

impl Entry {
    fn demand(&self) -> u64 {
        self.seen.max(self.seen_before)
    }

    /// Units this server may still admit from its open slices at `now`.
    fn held(&self, now: u64) -> u64 {
        self.open.iter().filter(|s| now < s.until).map(|s| s.left()).sum()
    }

    /// Learns what the store said of the key (a slice's grant or refusal, a request's
    /// answer), asked at `asked`.
    fn learn(&mut self, check: &Check, o: &Outcome, asked: u64, now: u64) {
        self.remaining = if o.decision.allowed { o.decision.remaining() } else { 0 };
        if slotted(check.algorithm) {
            // What a slice may still reserve: the burst's free part and [`REACH_US`] past
            // it, less what is reserved there already.
            let p = &check.params;
            let t = p.quota.emission_interval_micros().max(1);
            let span = p.quota.burst_size().saturating_mul(t);
            let used = u64::try_from(o.decision.reset_after().as_micros()).unwrap_or(u64::MAX);
            self.ahead_of_burst = used.saturating_sub(span);
            self.remaining = (span + REACH_US).saturating_sub(used) / t;
            self.remaining_until = now.saturating_add(PERIOD_US);
            return;
        }
        if let Some(taken) = o.taken {
            let period = check.params.quota.period_micros().max(1);
            let to_end = (taken.at / period + 1) * period - taken.at;
            self.window_end = asked.saturating_add(to_end);
        }
        let window = if self.window_end > now { self.window_end } else { u64::MAX };
        self.remaining_until = now.saturating_add(PERIOD_US).min(window);
    }
}

#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
}

/// A unit taken from an open slice: the slice, the unit's decision, and its commit (what
/// gives it back).
#[derive(Debug)]
pub(crate) struct SliceUnit {
    pub(crate) slice: Arc<Slice>,
    pub(crate) decision: Decision,
    pub(crate) taken: Taken,
}

/// What [`Slices::take`] found.
#[derive(Debug, Default)]
pub(crate) struct Take {
    /// The unit taken from an open slice, and its decision.
    pub(crate) unit: Option<SliceUnit>,
    /// A bucket's slice refused it: its next slot comes later (the refusal a request's
    /// check would get from the store, with its `retry_after`).
    pub(crate) wait: Option<Decision>,
    /// A slice of this many units is to be asked for (this caller asks), and the key's
    /// epoch to give [`Slices::install`] with its answer.
    pub(crate) fetch: Option<(u64, u64)>,
    /// A bucket's slice to be asked for: how long after now its first slot is to come at
    /// the earliest, µs. A server that admits slower than the rate uses its run of slots
    /// more slowly than the clock passes them: placed that far ahead, its last unit still
    /// finds its slot ahead of the clock (a slot the clock passed is lost to it).
    pub(crate) after: u64,
}

/// Per (rule, key): this server's open slices and its demand.
pub(crate) struct Slices {
    shards: Sharded<Shard>,
    cap: usize,
    len: AtomicUsize,
    /// Every open slice, for the sweeper (closed ones leave at the next sweep).
    open: Mutex<Vec<Arc<Slice>>>,
    /// Whether the task that gives back lapsed slices runs.
    pub(crate) sweeping: AtomicBool,
    /// Closed for good (`Limiter::close`): no slice is asked for any more.
    shut: AtomicBool,
    pub(crate) stats: Stats,
}

impl std::fmt::Debug for Slices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slices").field("keys", &self.len.load(Ordering::Relaxed)).field("stats", &self.stats).finish()
    }
}

impl Slices {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: Sharded::new(Shard::default),
            cap: capacity.max(1),
            len: AtomicUsize::new(0),
            open: Mutex::default(),
            sweeping: AtomicBool::new(false),
            shut: AtomicBool::new(false),
            stats: Stats::default(),
        }
    }

    fn shard(&self, rule: RuleId, key: &Key) -> (u64, std::sync::MutexGuard<'_, Shard>) {
        self.shards.lock(rule, key)
    }

    /// [`Slices::take_or_look`], taking.
    #[cfg(test)]
    pub(crate) fn take(&self, rule: RuleId, check: &Check, servers: u64, now: u64) -> Take {
        self.take_or_look(rule, check, servers, now, true)
    }

    /// Counts `check` (cost > 0) as this server's demand on its key under rule `rule`, and
    /// takes its cost from an open slice when one has room at `now`; says whether a slice
    /// is to be asked for (`servers`: how many share the store). With `commit` false
    /// (another check of the request was refused already), only looks at what its slices
    /// would say: `Take::unit` then holds that decision, and nothing is taken.
    pub(crate) fn take_or_look(&self, rule: RuleId, check: &Check, servers: u64, now: u64, commit: bool) -> Take {
        let (h, mut shard) = self.shard(rule, &check.key);
        let e = match shard.table.find_mut(h, |e| e.rule == rule && e.key == check.key) {
            Some(e) => e,
            None => {
                if self.len.load(Ordering::Relaxed) >= self.cap {
                    return Take::default();
                }
                self.len.fetch_add(1, Ordering::Relaxed);
                let shards = &self.shards;
                let entry = Entry {
                    rule,
                    key: check.key.clone(),
                    period: now / PERIOD_US,
                    seen: 0,
                    seen_before: 0,
                    last_seen: now,
                    open: SmallVec::new(),
                    fetching: false,
                    remaining: 0,
                    remaining_until: 0,
                    window_end: 0,
                    ahead_of_burst: 0,
                    wait_until: 0,
                    epoch: 0,
                };
                shard.table.insert_unique(h, entry, |e| shards.hash(e.rule, &e.key)).into_mut()
            }
        };
        let cost = check.params.cost;
        let period = now / PERIOD_US;
        if period != e.period {
            e.seen_before = if period == e.period + 1 { e.seen } else { 0 };
            (e.seen, e.period) = (0, period);
        }
        e.seen += cost;
        e.last_seen = now;
        e.open.retain(|s| !s.is_closed());
        let mut take = Take::default();
        let limit = check.params.quota.limit();
        // Oldest first: a bucket's later slice's slots come after the earlier one's.
        for slice in e.open.iter().filter(|s| now < s.until) {
            match slice.try_take(cost, now, limit, commit) {
                Grab::Spent => continue,
                Grab::Wait(decision) => take.wait = Some(decision),
                Grab::Took(taken, decision) => take.unit = Some(SliceUnit { slice: slice.clone(), decision, taken }),
            }
            break;
        }
        let held = e.held(now);
        if let Some(unit) = take.unit.as_mut().filter(|u| u.slice.slots.is_none()) {
            unit.decision.set_remaining(e.remaining.saturating_add(held));
        }
        // Asked for ahead of need: when what is held would last less than an eighth of a
        // period (the store's answer comes well within it). Slices are spent oldest first,
        // so a new one waits for the old to be spent: sized for the rest of its life.
        let demand = e.demand();
        if e.fetching
            || self.shut.load(Ordering::Relaxed)
            || now < e.wait_until
            || demand < MIN_UNITS
            || held >= demand / AHEAD
        {
            return take;
        }
        // What the demand needs until the period ends, or the window does when that is
        // sooner; at most a fair part of what remains.
        let mut k = (demand - demand / AHEAD).max(MIN_UNITS);
        if e.window_end > now {
            let to_end = e.window_end - now;
            k = k.min(u64::try_from(u128::from(demand) * u128::from(to_end) / u128::from(PERIOD_US)).unwrap_or(k));
        }
        let known = now < e.remaining_until;
        let left = if known { e.remaining } else { check.params.quota.limit() };
        k = k.min(left / servers.max(1)).min(check.params.quota.limit());
        if slotted(check.algorithm) && known {
            // A bucket's slice is admitted no earlier than its slots: what this server's
            // demand can use of it before it lapses, from where its first slot came at the
            // last answer (others may have reserved more since: its last units are then
            // stranded).
            let usable = LAPSE_US.saturating_sub(e.ahead_of_burst);
            k = k.min(u64::try_from(u128::from(demand) * u128::from(usable) / u128::from(PERIOD_US)).unwrap_or(k));
        }
        if k < MIN_UNITS {
            // The edge: per-request decisions until what the store said lapses.
            e.wait_until = if known { e.remaining_until } else { now + RETRY_US };
            return take;
        }
        if slotted(check.algorithm) {
            take.after = slots_ahead(&check.params.quota, k, demand);
        }
        e.fetching = true;
        take.fetch = Some((k, e.epoch));
        take
    }

    /// What the store answered a request's check of a sliced rule (asked at `asked`):
    /// what it said remains sizes the next slice.
    pub(crate) fn learn(&self, rule: RuleId, check: &Check, o: &Outcome, asked: u64, now: u64) {
        let (h, mut shard) = self.shard(rule, &check.key);
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == check.key) {
            e.learn(check, o, asked, now);
        }
    }

    /// The store's answer to a slice asked for at `asked` (`check`: its cost is the
    /// slice's size): the slice is open until it lapses, or its units go back at once (a
    /// late answer, the key forgotten meanwhile, a reset or a block of the key here since
    /// it was asked for, `epoch` telling) — the refund to send.
    pub(crate) fn install(
        &self,
        rule: RuleId,
        epoch: u64,
        check: &Check,
        o: &Outcome,
        asked: u64,
        now: u64,
    ) -> Option<Refund> {
        let (h, mut shard) = self.shard(rule, &check.key);
        // An answer to an ask from before a reset or block here: what it says is of the state
        // that was forgotten, and another ask may be under way.
        let found = shard.table.find_mut(h, |e| e.rule == rule && e.key == check.key).filter(|e| e.epoch == epoch);
        let Some(taken) = o.taken else {
            if let Some(e) = found {
                e.learn(check, o, asked, now);
                e.fetching = false;
                e.wait_until = now + RETRY_US;
            }
            return None;
        };
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let (until, ended_by, slots, left) = if slotted(check.algorithm) {
            // Its slots end at the TAT its commit left, `reset_after` after the store's
            // clock then (exact: GCRA's decisions are whole µs).
            let q = check.params.quota;
            let t = q.emission_interval_micros().max(1);
            let granted = taken.at.saturating_sub(micros(o.decision.reset_after()));
            let slots = Slots { granted, end: taken.at, t, span: q.burst_size().saturating_mul(t) };
            let first = taken.at.saturating_sub(check.params.cost.saturating_mul(t));
            (asked.saturating_add(LAPSE_US), u64::MAX, Some(slots), first)
        } else {
            let period = check.params.quota.period_micros().max(1);
            let to_end = (taken.at / period + 1) * period - taken.at;
            (asked.saturating_add(to_end.min(LAPSE_US)), now.saturating_add(to_end), None, check.params.cost)
        };
        let slice = Slice {
            check: check.clone(),
            taken,
            until,
            ended_by,
            asked,
            received: now,
            reset_after: micros(o.decision.reset_after()),
            refill_after: micros(o.decision.refill_after()),
            left: AtomicU64::new(left),
            slots,
            skipped: AtomicU64::new(0),
        };
        crate::metrics::slice_taken(check.rule);
        let shut = self.shut.load(Ordering::Relaxed);
        match found {
            Some(e) if now < until && !shut => {
                e.learn(check, o, asked, now);
                e.fetching = false;
                let slice = Arc::new(slice);
                e.open.push(slice.clone());
                drop(shard);
                self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(slice);
                None
            }
            found => {
                if let Some(e) = found {
                    e.learn(check, o, asked, now);
                    e.fetching = false;
                }
                self.gave_back(check.rule, check.params.cost);
                Some(slice.refund(check.params.cost, taken))
            }
        }
    }

    /// A slice asked for and not granted: `unknown` when the store may have granted it
    /// (sent, outcome unknown): its units are stranded.
    pub(crate) fn not_granted(&self, rule: RuleId, epoch: u64, check: &Check, unknown: bool, now: u64) {
        if unknown {
            self.strand(check.rule, check.params.cost);
        }
        let (h, mut shard) = self.shard(rule, &check.key);
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == check.key && e.epoch == epoch) {
            e.fetching = false;
            e.wait_until = now + PERIOD_US;
        }
    }

    /// Closes the slices that lapsed by `now` (and, when `prune`, forgets keys idle for
    /// long): the refunds of what they left while their window lasts.
    pub(crate) fn sweep(&self, now: u64, prune: bool) -> Vec<Refund> {
        let mut refunds = Vec::new();
        let lapsed: Vec<Arc<Slice>> = {
            let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let (lapsed, kept) = open.drain(..).partition(|s| now >= s.until || s.is_closed());
            *open = kept;
            lapsed
        };
        for s in &lapsed {
            self.closed(s, now, &mut refunds);
        }
        if prune {
            for mut shard in self.shards.each() {
                let mut gone = 0;
                shard.table.retain(|e| {
                    e.open.retain(|s| !s.is_closed());
                    let keep = !e.open.is_empty() || e.fetching || now.saturating_sub(e.last_seen) < IDLE_US;
                    gone += usize::from(!keep);
                    keep
                });
                self.len.fetch_sub(gone, Ordering::Relaxed);
            }
        }
        refunds
    }

    /// Closes every slice of `key` under rule `rule` (a reset, a block): the refunds of
    /// what they left.
    pub(crate) fn void(&self, rule: RuleId, key: &Key, now: u64) -> Vec<Refund> {
        let mut refunds = Vec::new();
        let (h, mut shard) = self.shard(rule, key);
        if let Some(e) = shard.table.find_mut(h, |e| e.rule == rule && e.key == *key) {
            for s in e.open.drain(..) {
                self.closed(&s, now, &mut refunds);
            }
            e.wait_until = now + LAPSE_US;
            e.epoch += 1;
            e.fetching = false;
        }
        refunds
    }

    /// Closes every slice (shutting down): the refunds of what they left.
    pub(crate) fn close_all(&self, now: u64) -> Vec<Refund> {
        self.shut.store(true, Ordering::Relaxed);
        let mut refunds = Vec::new();
        for mut shard in self.shards.each() {
            for e in shard.table.iter_mut() {
                for s in e.open.drain(..) {
                    self.closed(&s, now, &mut refunds);
                }
            }
        }
        refunds
    }

    /// Units this server holds for `key` under rule `rule` at `now` (for `peek`).
    pub(crate) fn held(&self, rule: RuleId, key: &Key, now: u64) -> u64 {
        let (h, shard) = self.shard(rule, key);
        shard.table.find(h, |e| e.rule == rule && e.key == *key).map_or(0, |e| e.held(now))
    }

    /// The sweeper's mark: `sweeping` until dropped (its task ends with its runtime).
    pub(crate) fn sweeper(self: &Arc<Self>) -> Sweeper {
        Sweeper(Arc::downgrade(self))
    }

    /// Closes `s`: what it left goes back while its window lasts, else is stranded.
    fn closed(&self, s: &Slice, now: u64, refunds: &mut Vec<Refund>) {
        let left = s.close();
        let skipped = s.skipped.swap(0, Ordering::Relaxed);
        if skipped > 0 {
            self.strand(s.check.rule, skipped);
        }
        let Some(left) = left.filter(|&l| l > 0) else { return };
        if now >= s.ended_by {
            self.strand(s.check.rule, left);
        } else {
            // A bucket's: its last slots, which the store takes back only while no commit
            // came after this slice's (GCRA's refund); else they are stranded there.
            self.gave_back(s.check.rule, left);
            refunds.push(s.refund(left, s.taken));
        }
    }

    fn gave_back(&self, rule: crate::store::RuleName, units: u64) {
        self.stats.given_back.fetch_add(units, Ordering::Relaxed);
        crate::metrics::slice_units(rule, "given_back", units);
    }

    fn strand(&self, rule: crate::store::RuleName, units: u64) {
        self.stats.stranded.fetch_add(units, Ordering::Relaxed);
        crate::metrics::slice_units(rule, "stranded", units);
    }
}

/// Held by the sweeper's task: `sweeping` is false again when it ends (its runtime shut
/// down), so that another starts.
pub(crate) struct Sweeper(std::sync::Weak<Slices>);

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(slices) = self.0.upgrade() {
            slices.sweeping.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests;
