//! What a [`Limiter`](crate::Limiter) keeps at run time to protect its callers from the
//! store: the deadline and in-flight cap of every store call, the circuit breaker, the
//! local blocked-key cache, the fallback limiter and its shares, what the fallback
//! admitted that the store never saw, and the rate limiter of its own warnings.
//! [`Runtime::call`] is the guard every remote store call goes through.

mod blocked;
mod breaker;
mod copy;
mod detached;
mod permits;
mod sharded;
mod share;
mod slice;

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use self::blocked::{BlockedCache, Cached, RuleId};
use self::breaker::Breaker;
pub(crate) use self::copy::{Copy, StoreCopy};
use self::detached::owned_ask;
pub(crate) use self::detached::{Late, LateSlots, Lessons, Unsent};
pub(crate) use self::permits::PermitBook;
pub(crate) use self::share::Shares;
pub(crate) use self::slice::{pays, slice_check, slice_id, sliceable, slotted, Slice, SliceUnit, Slices, SLICE_KEYS};
use crate::algorithm::Algorithm;
use crate::decision::{Decision, Longest};
use crate::error::StoreError;
use crate::store::memory::MemoryStore;
use crate::store::{Check, Outcome, Outcomes, Store};

/// The knobs of the runtime protections; a [`Runtime`] is made from them.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_in_flight: usize,
    /// Consecutive failures that open the circuit, and how long it stays open.
    pub(crate) breaker: (u32, Duration),
    /// How many servers share the store, when the application says; else the store's
    /// own count ([`Store::servers`]), else 1.
    pub(crate) servers: Option<u64>,
    /// The fallback's store, when the application gives one.
    pub(crate) fallback: Option<MemoryStore>,
    pub(crate) cache_enabled: bool,
    /// The share of a quota in use from which an allowed decision counts as near the
    /// limit (`tollgate_near_limit_total`).
    pub(crate) near_limit: f64,
    /// Quota slices for the rules that do not say (see `LimiterBuilder::slices`).
    pub(crate) slices: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_in_flight: 1024,
            breaker: (5, Duration::from_secs(1)),
            servers: None,
            fallback: None,
            cache_enabled: true,
            near_limit: 0.8,
            slices: false,
        }
    }
}

/// How long a store call cut by its deadline may still run for its answer: a store's own
/// response timeout ends it sooner (`RedisStore`: 100 ms, 250 ms on a cluster); a store
/// paused longer under a long response timeout still runs it when it resumes, and the
/// answer gives back what the request did not keep (a `count_if` unit of a 200).
pub(crate) const LATE_WAIT: Duration = Duration::from_secs(60);

/// The most keys the fallback limiter, the shares and the unsent list each hold.
const FALLBACK_KEYS: usize = 100_000;

/// How long a key the full fallback cannot count is refused, µs.
const FULL_RETRY_US: u64 = 1_000_000;

/// The least time past a deadline that tells a stalled process: timers fire a millisecond
/// or two late on a running one (more: a fifth of the deadline).
const STALL_SLACK: Duration = Duration::from_millis(5);

/// Checks a near-limit share: in (0, 1].
pub(crate) fn check_near_limit(share: f64) -> Result<(), crate::error::BuildError> {
    if share > 0.0 && share <= 1.0 {
        return Ok(());
    }
    Err(crate::error::BuildError::InvalidConfig {
        rule: String::new(),
        field: "near_limit".into(),
        why: format!("{share} is not a share of the quota: use a number in (0, 1], e.g. 0.8"),
    })
}

pub(crate) struct Runtime {
    pub(crate) settings: Settings,
    breaker: Breaker,
    in_flight: AtomicUsize,
    pub(crate) cache: Arc<BlockedCache>,
    /// Decides the rules that fall back ([`FailMode::Fallback`](crate::FailMode::Fallback))
    /// while the store fails, with this server's share of each quota.
    pub(crate) fallback: MemoryStore,
    pub(crate) shares: Arc<Shares>,
    /// This server's quota slices of hot keys.
    pub(crate) slices: Arc<Slices>,
    /// Calls cut by their deadline and still running (at most `max_in_flight`).
    late: Arc<AtomicUsize>,
    /// What the fallback admitted that the store never saw, to charge it when it answers.
    pub(crate) unsent: Arc<Unsent>,
    warn_at: AtomicU64,
    suppressed: AtomicU64,
    /// This limiter's announcement ([`Store::announce`]), withdrawn when it is dropped.
    pub(crate) announced: crate::store::Announced,
    /// Timeouts in a row not held against the store because this process stalled.
    stalls: AtomicU32,
    base: Mono,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("settings", &self.settings)
            .field("breaker", &self.breaker)
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Runtime {
    pub(crate) fn new(settings: Settings) -> Self {
        let (threshold, cool_down) = settings.breaker;
        let fallback = settings.fallback.clone().unwrap_or_else(|| MemoryStore::new().max_keys(FALLBACK_KEYS));
        Self {
            breaker: Breaker::new(threshold, cool_down),
            settings,
            in_flight: AtomicUsize::new(0),
            cache: Arc::new(BlockedCache::new(100_000)),
            fallback,
            shares: Arc::new(Shares::new(FALLBACK_KEYS)),
            slices: Arc::new(Slices::new(SLICE_KEYS)),
            late: Arc::new(AtomicUsize::new(0)),
            unsent: Arc::default(),
            warn_at: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            stalls: AtomicU32::new(0),
            announced: crate::store::Announced::none(),
            base: Mono(Instant::now()),
        }
    }

    /// Microseconds on this runtime's monotonic clock (tokio's, so paused-time tests work).
    pub(crate) fn mono_us(&self) -> u64 {
        self.base.us()
    }

    /// [`Runtime::mono_us`] of a time read earlier.
    pub(crate) fn us_at(&self, t: Instant) -> u64 {
        self.base.us_at(t)
    }

    /// One call to a remote store, guarded: refused at once while the circuit is open or
    /// too many calls are in flight, and bounded by the deadline. Dropping the future at
    /// any point leaves nothing behind: the in-flight count and the breaker's probe are
    /// handed back by guards. A call the deadline cuts is given back as [`Late`] (unless
    /// too many are already): it still runs, and its answer is the store's decision.
    ///
    /// `started`: when the caller asked (the clock is read once for the breaker, the
    /// deadline and the latency). Also gives back when the call ended, read once.
    pub(crate) async fn call<St: Store>(
        &self,
        store: &Arc<St>,
        checks: &[Check],
        deadline: Duration,
        started: Instant,
    ) -> (Result<Outcomes, StoreError>, Option<Late>, Instant) {
        let s = &self.settings;
        let trial = match self.breaker.admit(self.us_at(started)) {
            Ok(trial) => trial,
            Err(open) => return (Err(StoreError::CircuitOpen(open)), None, started),
        };
        let Some(_in_flight) = Slot::enter(&self.in_flight, s.max_in_flight) else {
            return (Err(StoreError::Overloaded(s.max_in_flight)), None, started);
        };
        // Dropped before its answer (the caller went away), the call may still be sent and
        // committed: the guard lets it finish and gives back what it took.
        let mut asked = Sent { asked: Some(owned_ask(store, checks)), store, checks, runtime: self };
        let slack = (deadline / 5).max(STALL_SLACK);
        let mut answer = tokio::time::timeout_at(after(started, deadline), asked.ask()).await;
        let mut ended = Instant::now();
        // Whether the store then had the slack, with this process running, to answer.
        let mut watched = false;
        if answer.is_err() && ended - started > deadline.saturating_add(slack) {
            // The deadline's timer fired late: this process was stalled (descheduled,
            // CPU-throttled), and the reply may be waiting for the connection's task.
            let looked = ended;
            answer = tokio::time::timeout_at(after(looked, slack), asked.ask()).await;
            ended = Instant::now();
            watched = answer.is_err() && ended - looked <= slack.saturating_mul(2);
        }
        let asked = asked.defuse();
        let cut = answer.is_err();
        let r = answer.unwrap_or_else(|_| Err(store.timed_out(checks, deadline)));
        crate::metrics::store_latency(ended - started);
        // A timeout (this call's, or the connection's own timer, late as well) when this
        // process stalled past the deadline is not held against the store, unless the
        // store then had the slack, with this process running, and still did not answer;
        // and at most `threshold` in a row: a dead store on a throttled host still opens
        // the circuit.
        let stalled =
            matches!(r, Err(StoreError::Timeout(_))) && ended - started > deadline.saturating_add(slack) && !watched;
        let stalled = stalled && self.stalls.fetch_add(1, Ordering::Relaxed) < self.breaker.threshold;
        if stalled {
            crate::metrics::store_stall();
        } else if self.stalls.load(Ordering::Relaxed) != 0 && !matches!(r, Err(StoreError::Timeout(_))) {
            self.stalls.store(0, Ordering::Relaxed);
        }
        match &r {
            Ok(_) => trial.success(),
            // One node failed while the others answer (the breaker would stop the healthy
            // ones too), the call failed at once (nothing to spare), or this process
            // stalled past the deadline (see above): not counted against the store.
            Err(StoreError::NodeUnavailable(_) | StoreError::NodeTimeout(_) | StoreError::NotConnected(_)) => {
                trial.neutral(self.us_at(ended))
            }
            Err(_) if stalled => trial.neutral(self.us_at(ended)),
            Err(_) => trial.failure(self.us_at(ended)),
        }
        // Cut by the deadline, not failed: the call goes on (it may still be running in the
        // store), in a slot of its own.
        let slot = if cut { Slot::enter(Arc::clone(&self.late), s.max_in_flight) } else { None };
        (r, slot.map(|slot| Late { asked, slot }), ended)
    }

    /// Whether the circuit breaker lets calls through (a slice is not asked for while it
    /// is open).
    pub(crate) fn circuit_closed(&self) -> bool {
        self.breaker.is_closed()
    }

    /// The number of servers sharing the store (see [`Settings::servers`]).
    pub(crate) fn servers<St: Store>(&self, store: &St) -> u64 {
        self.settings.servers.or_else(|| store.servers()).unwrap_or(1).max(1)
    }

    /// The fallback limiter's outcomes for the checks `use_it` selects of `checks` (the
    /// others `None`), after the store failed with `err`, and the checks as it decided
    /// them: each quota divided by its `parts` (the `servers` sharing the store, times the
    /// limiters of this process that count into the rule; refunds and charges to the
    /// fallback use these), and each key within this server's share of what the store
    /// last said remains (`ids`: the checks' rules). Each outcome's `limit` is its rule's
    /// quota, its `remaining` what is left of this server's share.
    pub(crate) fn fallback(
        &self,
        err: &StoreError,
        checks: &[Check],
        ids: &[RuleId],
        use_it: &[bool],
        servers: u64,
        parts: &[u64],
    ) -> Option<(Outcomes, Vec<Check>)> {
        crate::metrics::store_error(err);
        self.warn_store_failure(err, FailedThen::Fallback(servers));
        let now = self.mono_us();
        let local: Vec<Check> = checks
            .iter()
            .zip(parts)
            .map(|(c, &parts)| {
                let mut c = c.clone();
                c.params.quota = c.params.quota.divided(parts);
                c
            })
            .collect();
        let picked: Vec<Check> = local.iter().zip(use_it).filter(|&(_, &u)| u).map(|(c, _)| c.clone()).collect();
        // A key past this server's share of what the store said remains: refused, and
        // nothing taken from the others. Of several, the one whose quota is whole last
        // (the last of equals), as the store's rejection names the longest wait: the
        // first would send the client back too soon.
        let mut longest = Longest::new();
        for (j, ((c, &id), _)) in checks.iter().zip(ids).zip(use_it).filter(|&(_, &u)| u).enumerate() {
            // A probe (cost 0: a charged rule's admission) needs room for one unit.
            if let Err(whole_in) = self.shares.fits(id, c, c.params.cost.max(1), now) {
                longest.offer(Some(Duration::from_micros(whole_in)), (j, whole_in));
            }
        }
        let spent = longest.take();
        let decided: Vec<Option<Outcome>> = match spent {
            Some((j, whole_in)) => {
                picked.iter().enumerate().map(|(i, c)| (i == j).then(|| share_spent(c, whole_in))).collect()
            }
            None => match self.fallback.check_at(&picked, self.fallback.now_micros()) {
                Ok(outcomes) => outcomes.into_iter().map(Some).collect(),
                // Full (a flood of new keys while the store fails): a key it cannot count is
                // refused for a second, not let through unlimited.
                Err(_) => {
                    crate::metrics::fallback("full");
                    picked.iter().enumerate().map(|(i, c)| (i == 0).then(|| share_spent(c, FULL_RETRY_US))).collect()
                }
            },
        };
        let mut decided = decided.into_iter();
        let mut outcomes = Outcomes::new();
        for (i, c) in checks.iter().enumerate() {
            let mut o = if use_it[i] { decided.next().flatten() } else { None };
            if let Some(o) = &mut o {
                // The limit the client is under is the rule's quota, as `RateLimit-Policy`
                // says it; the share is this server's approximation of it while the store
                // cannot answer, and `remaining` counts it down: to what this server may
                // still admit of what the store said remains, when that binds (a 200 that
                // says 14 left is followed by 14 more, not by a 429).
                o.decision.limit = c.params.quota.limit();
                if o.taken.is_some() {
                    if let Some(left) = self.shares.take(ids[i], c, c.params.cost, now) {
                        o.decision.set_remaining(o.decision.remaining().min(left));
                    }
                }
                said_of_whole(&mut o.decision, c);
                crate::metrics::fallback(if o.decision.allowed { "allowed" } else { "rejected" });
            }
            outcomes.push(o);
        }
        FALLBACK.tell(false, || {
            format!(
                "tollgate: the rate-limit store failed ({err}): the in-process fallback decides until it answers, \
                 each key limited to this server's share of its quota, 1/{servers} (said once; see \
                 tollgate_fallback_decisions_total)"
            )
        });
        Some((outcomes, local))
    }

    /// This runtime's clock ([`Runtime::mono_us`]), to read from anywhere.
    pub(crate) fn clock(&self) -> Mono {
        self.base
    }

    /// The slots of store calls left running on their own (a late call, a write-back of
    /// what the fallback admitted): at most `max_in_flight` of them.
    pub(crate) fn late_slots(&self) -> LateSlots {
        LateSlots(Arc::clone(&self.late), self.settings.max_in_flight)
    }

    /// What a store's answers teach, for a call that outlives its caller ([`Late`]).
    pub(crate) fn lessons(&self) -> Lessons {
        Lessons {
            cache: self.settings.cache_enabled.then(|| Arc::clone(&self.cache)),
            shares: Arc::clone(&self.shares),
            unsent: Arc::clone(&self.unsent),
            clock: self.base,
        }
    }

    /// Logs a store failure at most once per 10 s, saying what became of the request and
    /// how many were not logged.
    pub(crate) fn warn_store_failure(&self, err: &StoreError, then: FailedThen) {
        let now_ms = self.mono_us() / 1000 + 10_000;
        let last = self.warn_at.load(Ordering::Relaxed);
        if now_ms >= last + 10_000
            && self.warn_at.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            match then {
                FailedThen::Fallback(servers) => tracing::warn!(
                    error = %err,
                    suppressed,
                    "tollgate: rate-limit store failed; request decided by the fallback (this server's share, 1/{servers})"
                ),
                FailedThen::Open => {
                    tracing::warn!(error = %err, suppressed, "tollgate: rate-limit store failed; request passed (fail open)");
                }
                FailedThen::Closed => tracing::warn!(
                    error = %err,
                    suppressed,
                    "tollgate: rate-limit store failed; request refused (fail closed)"
                ),
            }
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What became of a request the store failed to decide, for the warning.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FailedThen {
    /// The fallback decided it, with this server's share (1/N) of each quota.
    Fallback(u64),
    /// It passed unlimited (`FailMode::Open`).
    Open,
    /// It was refused (`FailMode::Closed`).
    Closed,
}

static FALLBACK: crate::notice::Once = crate::notice::Once::new();

/// `d` after `t`, or (past what an `Instant` holds: `.timeout(Duration::MAX)`, no
/// deadline) as far as `tokio::time::timeout` takes one: about 30 years.
fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).unwrap_or_else(|| t + Duration::from_secs(86_400 * 365 * 30))
}

/// A runtime's monotonic clock: microseconds since the runtime was made, on tokio's clock
/// (so that paused-time tests move it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mono(Instant);

impl Mono {
    pub(crate) fn us(self) -> u64 {
        self.us_at(Instant::now())
    }

    pub(crate) fn us_at(self, t: Instant) -> u64 {
        // Whole seconds and µs apart: no 128-bit arithmetic (read several times a decision).
        let d = t.saturating_duration_since(self.0);
        d.as_secs().saturating_mul(1_000_000).saturating_add(u64::from(d.subsec_micros()))
    }
}

/// The fallback's refusal of `check` (of this server's share): its key is past its share
/// of what the store said remains, until the store's quota is whole again.
fn share_spent(check: &Check, whole_in: u64) -> Outcome {
    let wait = Duration::from_micros(whole_in);
    let decision = Decision::from_parts(false, check.params.quota.limit(), 0, wait, wait, Some(wait), Duration::ZERO);
    Outcome { decision, taken: None }
}

/// What the fallback limiter's own decision of `check` (with this server's share of its
/// quota) tells a client, said of the whole quota the store decides by once it answers
/// again: a cost above this server's share but within the whole quota waits as long as the
/// whole quota needs to make room for it (not "never": `retry_after` is `None` only for a
/// cost the whole quota can never admit); and no wait is longer than the rule's window,
/// past which what the share counted says nothing (the store decides again) — but for a
/// rule whose keys can be blocked, whose block lasts as long as the store said.
fn said_of_whole(d: &mut Decision, check: &Check) {
    let whole = check.params.quota;
    let window = whole.period().max(Duration::from_micros(
        whole.burst_size().saturating_mul(whole.emission_interval_micros()).min(u64::MAX / 2),
    ));
    if !d.allowed && d.retry_after().is_none() && check.params.cost <= capacity(check) {
        let room = check.params.cost.saturating_mul(whole.emission_interval_micros());
        d.set_retry_after(Some(Duration::from_micros(room).min(window)));
    }
    if check.params.reads_block() {
        return;
    }
    d.set_retry_after(d.retry_after().map(|r| r.min(window)));
    d.set_reset_after(d.reset_after().min(window));
    d.set_refill_after(d.refill_after().min(window));
}

/// The most units one check of `check`'s algorithm can ever admit under its whole quota:
/// the limit of a window, the burst of a bucket (one more for the leaky bucket's unit that
/// is leaving).
fn capacity(check: &Check) -> u64 {
    let q = check.params.quota;
    match check.algorithm {
        Algorithm::FixedWindow
        | Algorithm::SlidingWindowLog
        | Algorithm::SlidingWindowCounter
        | Algorithm::Concurrent => q.limit(),
        Algorithm::TokenBucket | Algorithm::Gcra => q.burst_size(),
        Algorithm::LeakyBucket => q.burst_size().saturating_add(1),
    }
}

/// A store call on its way, while its caller waits for the answer: dropped before that
/// (the caller went away at this `.await`), the call may have been sent and the store
/// commit it (Redis runs what it read before a stall once it resumes). Nobody goes on
/// with its units: the call runs on in a task of its own (in a late call's slot, up to
/// [`LATE_WAIT`]) and what it took is given back. Never sent again. It borrows what the
/// call was made of, and copies it only when dropped unanswered: an answered call (the
/// common case) copies nothing more than the call itself did.
struct Sent<'a, St: Store> {
    asked: Option<detached::Asked>,
    store: &'a Arc<St>,
    checks: &'a [Check],
    runtime: &'a Runtime,
}

impl<St: Store> Sent<'_, St> {
    fn ask(&mut self) -> &mut detached::Asked {
        self.asked.as_mut().expect("asked until defused")
    }

    /// The caller has the answer, or takes the call on ([`Late`]).
    fn defuse(mut self) -> detached::Asked {
        self.asked.take().expect("defused once")
    }
}

impl<St: Store> Drop for Sent<'_, St> {
    fn drop(&mut self) {
        let Some(asked) = self.asked.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let Some(slot) = self.runtime.late_slots().take() else { return };
        let (store, checks) = (Arc::clone(self.store), smallvec::SmallVec::<[Check; 2]>::from(self.checks));
        drop(runtime.spawn(async move {
            let _slot = slot;
            let Ok(Ok(outcomes)) = tokio::time::timeout(LATE_WAIT, asked).await else { return };
            let refunds: Vec<crate::store::Refund> = checks
                .iter()
                .zip(&outcomes)
                .filter_map(|(c, o)| o.as_ref()?.taken.map(|taken| crate::store::Refund { check: c.clone(), taken }))
                .collect();
            if !refunds.is_empty() {
                if let Err(err) = store.refund(&refunds).await {
                    for r in &refunds {
                        crate::metrics::refund_failed(&r.check.rule);
                    }
                    tracing::warn!(error = %err, "tollgate: could not refund the units of a call whose caller went away");
                }
            }
        }));
    }
}

/// One place in a capped count of store calls (in flight, or left running late), given
/// back on drop; `enter` is `None` when the cap is reached.
pub(crate) struct Slot<C: Deref<Target = AtomicUsize>>(C);

/// A slot of the late calls ([`Runtime::late_slots`]), which outlives its caller.
pub(crate) type LateSlot = Slot<Arc<AtomicUsize>>;

impl<C: Deref<Target = AtomicUsize>> Slot<C> {
    pub(crate) fn enter(counter: C, cap: usize) -> Option<Self> {
        if counter.fetch_add(1, Ordering::AcqRel) >= cap {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self(counter))
    }
}

impl<C: Deref<Target = AtomicUsize>> Drop for Slot<C> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Params;
    use crate::quota::Quota;

    #[tokio::test(start_paused = true)]
    async fn a_probe_refused_by_the_in_flight_cap_is_handed_back() {
        let rt =
            Runtime::new(Settings { max_in_flight: 1, breaker: (1, Duration::from_secs(1)), ..Settings::default() });
        let store = Arc::new(crate::store::memory::MemoryStore::new());
        let check = Check {
            rule: "r".into(),
            key: "k".into(),
            algorithm: Algorithm::Gcra,
            params: Params::new(Quota::per_minute(5)),
        };
        rt.breaker.admit(rt.mono_us()).unwrap().failure(rt.mono_us());
        tokio::time::advance(Duration::from_secs(1)).await;
        // The cap is full when the probe comes: it is refused, and must be handed back.
        let full = Slot::enter(&rt.in_flight, 1).unwrap();
        assert!(matches!(
            rt.call(&store, std::slice::from_ref(&check), Duration::from_millis(50), Instant::now()).await.0,
            Err(StoreError::Overloaded(1))
        ));
        drop(full);
        assert!(
            rt.call(&store, std::slice::from_ref(&check), Duration::from_millis(50), Instant::now()).await.0.is_ok(),
            "the circuit stayed open"
        );
        assert_eq!(rt.in_flight.load(Ordering::Relaxed), 0);
    }

    /// The fallback's own refusal under a sliding window counter may wait past its window
    /// (the previous window weighs on); said of the whole rule, it waits at most its window,
    /// but a blockable rule's wait is what the store said.
    #[test]
    fn the_fallbacks_wait_is_at_most_the_rules_window() {
        let q = Quota::per_minute(60);
        let mut check = Check {
            rule: "r".into(),
            key: "k".into(),
            algorithm: Algorithm::SlidingWindowCounter,
            params: Params::new(q),
        };
        let long = Duration::from_secs(106);
        let refused = Decision::from_parts(false, 60, 0, long, long, Some(long), Duration::ZERO);
        let mut d = refused;
        said_of_whole(&mut d, &check);
        assert_eq!((d.retry_after(), d.reset_after()), (Some(q.period()), q.period()));
        check.params.blockable = true;
        let mut d = refused;
        said_of_whole(&mut d, &check);
        assert_eq!(d.retry_after(), Some(long), "a block lasts as the store said");
    }

    #[test]
    fn in_flight_is_capped() {
        let c = AtomicUsize::new(0);
        let a = Slot::enter(&c, 2).unwrap();
        let _b = Slot::enter(&c, 2).unwrap();
        assert!(Slot::enter(&c, 2).is_none());
        drop(a);
        assert!(Slot::enter(&c, 2).is_some());
        assert_eq!(c.load(Ordering::Relaxed), 1);
    }
}
