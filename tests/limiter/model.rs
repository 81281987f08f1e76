//! A model-based test of the whole layer. proptest generates a configuration (two rules of
//! random algorithms and quotas — one per key, one global that counts only 401s — a shadow
//! rule per key or none, a fail mode, a fallback or none) and a list of commands: requests (a key, a cost, the
//! handler's status and time, a drop of the request's future at some point), store faults
//! and recoveries (failing, hanging), and time steps. They run through the layer over a
//! store that records every commit (with its identity) and every refund, with tokio's clock
//! paused and the store's clock following it. Then, against a small reference built from
//! that record:
//!
//! Half the cases make the per-key rule charged (`Rule::charged`): each response reports
//! its cost as a `Charge`, taken after it, whatever the rule decides (into debt); its
//! admissions take nothing. The reference then counts the charges in every sum, and checks
//! the sums at each admission (a key in debt must have been refused).
//!
//! - exactness: the units the *store* admitted, less what the reference says each refund
//!   refunds, never exceed what the algorithm allows (sliding log: `L` in any window;
//!   fixed window: `L` per aligned window; GCRA and token bucket: `B` plus the refill of
//!   the span, plus what was refunded in it; leaky bucket: slots never shared).
//!   Fail-open passes and fallback decisions are over-admission by design and not in the
//!   record;
//! - every rejection served by the local blocked-key cache is backed by a rejection of the
//!   store still in force (nothing the fallback decided outlives the outage);
//! - with an in-process store that never failed, each handler's `Charge` is taken once, by
//!   the store (half the cases make the per-key rule charged);
//! - once the store is back and the breaker's cool-down has passed, a request reaches the
//!   store and is decided by it (the breaker recovers; nothing is left counted in flight);
//! - nothing panics.
//!
//! On `MemoryStore`, half the cases record it as a remote store (a future per call, with
//! the deadline, breaker and blocked-key cache of a remote store), half as an in-process
//! one (`LocalStore`: decided inside the layer's `call`, with refunds and charges
//! taken at once).
//!
//! `PROPTEST_CASES` sets the number of cases (default: 4,000 on `MemoryStore`, 100 on Redis).

#![cfg(all(feature = "memory", feature = "redis"))]

use crate::support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use support::fake::{settle, TokioClock, T0};
use support::redis::RedisServer;
use tollgate::clock::{Clock, ManualClock};
use tollgate::key::{self, Key};
use tollgate::response::Rejection;
use tollgate::store::{Check, Store};
use tollgate::store::{LocalStore, Outcome, Params, Refund};
use tollgate::verdict::DecidedBy;
use tollgate::RequestHead;
use tollgate::{Algorithm, Decision, FailMode, MemoryStore, Quota, RateLimitLayer, RedisStore, Rule, StoreError};
use tower::{Layer, ServiceExt};

// ---------------------------------------------------------------------------------------
// The recording store

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Up,
    Failing,
    Hanging,
}

#[derive(Debug, Clone)]
enum Event {
    /// A check the store answered at `now`.
    /// `seq`: when the call started, among calls (one connection runs them in that order).
    /// `now` and `seq` are the store's: see [`Core::recorded`].
    Check { now: u64, seq: usize, checks: Vec<Check>, outcomes: Vec<Option<Outcome>> },
    /// A refund the store was asked for at `now`.
    Refund { now: u64, refunds: Vec<Refund> },
    /// A charge (units reported after a response) the store took at `now`.
    Charge { now: u64, seq: usize, checks: Vec<Check> },
}

/// The recording store: remote (a future per call), or in-process (`sync`: the limiter
/// then decides through [`Store::as_local`], synchronously, as for `MemoryStore`).
#[derive(Clone)]
struct Recorder<S> {
    core: Core<S>,
    sync: Option<Core<S>>,
}

impl<S> std::ops::Deref for Recorder<S> {
    type Target = Core<S>;

    fn deref(&self) -> &Core<S> {
        &self.core
    }
}

#[derive(Clone)]
struct Core<S> {
    inner: S,
    clock: Arc<dyn Clock>,
    mode: Arc<Mutex<Mode>>,
    attempts: Arc<AtomicUsize>,
    seq: Arc<AtomicUsize>,
    /// Held while a call reads the time, takes its sequence number and starts the inner
    /// store's call (where `RedisStore` reads its clock and queues the script on its one
    /// connection), and while the store's clock moves (`run_case`'s `advance`): so that
    /// the time and order logged are those of the store's decisions.
    order: Arc<Mutex<()>>,
    log: Arc<Mutex<Vec<Event>>>,
    /// In-process: decides with no future (`LocalStore`), as `MemoryStore` does, so the
    /// layer decides inside `call`. It fails, but never hangs.
    local: bool,
}

impl<S: Store + Clone> Recorder<S> {
    fn new(inner: S, clock: Arc<dyn Clock>) -> Self {
        let core = Core {
            inner,
            clock,
            mode: Arc::new(Mutex::new(Mode::Up)),
            attempts: Arc::default(),
            seq: Arc::default(),
            order: Arc::default(),
            log: Arc::default(),
            local: false,
        };
        Self { core, sync: None }
    }

    /// The same, in-process (see `local`).
    fn local(inner: S, clock: Arc<dyn Clock>) -> Self {
        let core = Core { local: true, ..Self::new(inner, clock).core };
        Self { sync: Some(core.clone()), core }
    }
}

impl<S: Store + Clone> Core<S> {
    /// The mode a call meets: an in-process store fails where a remote one hangs.
    fn mode(&self) -> Mode {
        match *self.mode.lock().unwrap() {
            Mode::Hanging if self.local => Mode::Failing,
            mode => mode,
        }
    }

    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Calls the inner store as the mode says (failing, hanging, up), and logs `event` of
    /// what it answered, with the store time and sequence number taken as the call starts
    /// (one connection runs calls in that order).
    ///
    /// Taken under `order`, with the inner call's first poll, where a remote store reads
    /// its clock and queues its command: else a call that took its number and time, then
    /// was held up (its thread descheduled) while another call went to the store, or the
    /// clock moved on, would be logged out of the store's order, or earlier than the store
    /// decided it — a charge logged before an admission that the store decided first, a
    /// commit seconds before the time it was made at — and the reference would see
    /// over-admission the store never did.
    fn recorded<T, Fut>(
        &self,
        call: impl FnOnce(S) -> Fut + Send + 'static,
        event: impl FnOnce(u64, usize, &T) -> Event + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send,
    {
        let mode = self.mode();
        let (inner, clock, log, seq) = (self.inner.clone(), self.clock.clone(), self.log.clone(), self.seq.clone());
        let order = self.order.clone();
        async move {
            match mode {
                Mode::Failing => return Err(StoreError::Unavailable("down".into())),
                Mode::Hanging => std::future::pending::<()>().await,
                Mode::Up => {}
            }
            // Unconstrained: tokio's budget would leave the command unqueued in its first poll.
            let mut call = std::pin::pin!(tokio::task::unconstrained(call(inner)));
            let mut started = None;
            let answer = std::future::poll_fn(|cx| match started {
                Some(_) => call.as_mut().poll(cx),
                None => {
                    let _order = order.lock().unwrap();
                    started = Some((clock.now_micros(), seq.fetch_add(1, Ordering::SeqCst)));
                    call.as_mut().poll(cx)
                }
            })
            .await?;
            let (now, seq) = started.expect("polled");
            log.lock().unwrap().push(event(now, seq, &answer));
            Ok(answer)
        }
    }
}

impl<S: Store + Clone> Store for Recorder<S> {
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let (asked, logged) = (checks.to_vec(), checks.to_vec());
        self.recorded(
            move |inner| async move { inner.check(&asked).await },
            move |now, seq, outcomes: &Vec<Option<Outcome>>| Event::Check {
                now,
                seq,
                checks: logged,
                outcomes: outcomes.clone(),
            },
        )
    }

    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let now = self.clock.now_micros();
        self.log.lock().unwrap().push(Event::Refund { now, refunds: refunds.to_vec() });
        self.inner.refund(refunds)
    }

    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (asked, logged) = (charges.to_vec(), charges.to_vec());
        self.recorded(
            move |inner| async move { inner.charge(&asked).await },
            move |now, seq, (): &()| Event::Charge { now, seq, checks: logged },
        )
    }

    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.inner.peek(check)
    }

    fn as_local(&self) -> Option<&dyn LocalStore> {
        self.sync.as_ref().map(|core| core as &dyn LocalStore)
    }

    fn reset(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(rule, key, algorithm)
    }
}

/// The in-process twin: decided at once, and logged as the async calls log.
impl<S: Store + Clone> LocalStore for Core<S> {
    fn check_now(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.mode() != Mode::Up {
            return Err(StoreError::Unavailable("down".into()));
        }
        let now = self.clock.now_micros();
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let outcomes = self.local_inner().check_now(checks)?;
        let event = Event::Check { now, seq, checks: checks.to_vec(), outcomes: outcomes.clone() };
        self.log.lock().unwrap().push(event);
        Ok(outcomes)
    }

    fn refund_now(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        let now = self.clock.now_micros();
        self.log.lock().unwrap().push(Event::Refund { now, refunds: refunds.to_vec() });
        self.local_inner().refund_now(refunds)
    }

    fn charge_now(&self, charges: &[Check]) -> Result<(), StoreError> {
        if self.mode() != Mode::Up {
            return Err(StoreError::Unavailable("down".into()));
        }
        let now = self.clock.now_micros();
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        self.local_inner().charge_now(charges)?;
        self.log.lock().unwrap().push(Event::Charge { now, seq, checks: charges.to_vec() });
        Ok(())
    }

    fn peek_now(&self, check: &Check) -> Result<Decision, StoreError> {
        self.local_inner().peek_now(check)
    }

    fn reset_now(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        self.local_inner().reset_now(rule, key, algorithm)
    }
}

impl<S: Store> Core<S> {
    fn local_inner(&self) -> &dyn LocalStore {
        self.inner.as_local().expect("an in-process inner store")
    }
}

// ---------------------------------------------------------------------------------------
// Configurations and commands

#[derive(Debug, Clone)]
struct Config {
    per_key: (Algorithm, Quota),
    global: (Algorithm, Quota),
    global_fail_mode: FailMode,
    fallback: bool,
    /// The per-key rule is charged: it takes what each response reports (its cost).
    charged: bool,
    /// A shadow rule per key ("s"): decided in the enforced rules' store call, committed
    /// only when they all accept.
    shadow: Option<(Algorithm, Quota)>,
}

#[derive(Debug, Clone)]
enum Op {
    /// One request; `drop_after`: its future is dropped after this many ms;
    /// `background`: the next commands do not wait for it.
    Send {
        key: u8,
        cost: u8,
        status: u16,
        handler_ms: u16,
        drop_after: Option<u16>,
        background: bool,
    },
    Fault(Mode),
    Advance(u32),
}

fn algorithm(leaky: bool) -> impl Strategy<Value = Algorithm> {
    let mut all = vec![Algorithm::SlidingWindowLog, Algorithm::FixedWindow, Algorithm::Gcra, Algorithm::TokenBucket];
    if leaky {
        all.push(Algorithm::LeakyBucket);
    }
    prop::sample::select(all)
}

fn quota() -> impl Strategy<Value = Quota> {
    (2u64..6, 1u64..6, prop_oneof![Just(2u64), Just(5), Just(10)])
        .prop_map(|(limit, burst, secs)| Quota::new(limit, Duration::from_secs(secs)).burst(burst.min(limit)))
}

fn config(leaky: bool) -> impl Strategy<Value = Config> {
    let shadow = prop::option::of((algorithm(false), quota()));
    let rules = ((algorithm(leaky), quota()), (algorithm(leaky), quota()), shadow);
    (rules, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |((per_key, global, shadow), closed, fallback, charged)| Config {
            // A charge's leaky-bucket slot is not known outside the store: the reference
            // checks charged rules of the other algorithms.
            per_key: match per_key {
                (Algorithm::LeakyBucket, q) if charged => (Algorithm::Gcra, q),
                other => other,
            },
            global,
            global_fail_mode: if closed { FailMode::Closed } else { FailMode::Open },
            fallback,
            charged,
            shadow,
        },
    )
}

fn ops(slow: bool) -> impl Strategy<Value = Vec<Op>> {
    let handler = if slow { 0u16..3_000 } else { 0u16..1 };
    let send = (
        0u8..3,
        1u8..4,
        prop::sample::select(vec![200u16, 401]),
        handler,
        prop::option::weighted(0.25, 1u16..300),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(key, cost, status, handler_ms, drop_after, background)| Op::Send {
            key,
            cost,
            status,
            handler_ms,
            drop_after,
            background,
        });
    let op = prop_oneof![
        12 => send,
        1 => prop::sample::select(vec![Mode::Up, Mode::Failing, Mode::Hanging]).prop_map(Op::Fault),
        2 => Just(Op::Fault(Mode::Up)),
        4 => (1u32..4_000).prop_map(Op::Advance),
    ];
    prop::collection::vec(op, 1..60)
}

// ---------------------------------------------------------------------------------------
// Running a case

/// What the layer did, seen from outside.
#[derive(Default)]
struct Seen {
    /// Rejections served from the local cache: (store time, rule, key).
    cached: Vec<(u64, String, Vec<u8>)>,
    /// The key and the `Charge` of every handler that answered (its request's cost).
    answered: Vec<(Vec<u8>, u64)>,
}

fn request(key: u8, cost: u8, status: u16, handler_ms: u16) -> Request<Body> {
    Request::get("/")
        .header("x-key", format!("k{key}"))
        .header("x-cost", cost.to_string())
        .header("x-status", status.to_string())
        .header("x-sleep", handler_ms.to_string())
        .body(Body::empty())
        .unwrap()
}

fn header<B>(req: &Request<B>, name: &str) -> u64 {
    req.headers().get(name).and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1)
}

/// Runs `ops` through a layer over `store` (inside a `LocalSet`: requests in the
/// background are local tasks). Time steps move tokio's (paused) clock, which
/// the store follows, or, with `manual` (Redis: tokio's clock is real there), the store's.
/// Returns the store's record and what was seen.
async fn run_case<S: Store + Clone>(
    cfg: &Config,
    ops: &[Op],
    store: Recorder<S>,
    cool_down: Duration,
    cache: bool,
    manual: Option<&ManualClock>,
) -> (Vec<Event>, Seen) {
    let order = store.order.clone();
    let advance = |d: Duration| {
        let order = order.clone();
        async move {
            match manual {
                // Not while a call starts (see `Core::recorded`).
                Some(clock) => {
                    let _order = order.lock().unwrap();
                    clock.advance(d);
                }
                None => tokio::time::sleep(d).await,
            }
        }
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let now = store.clock.clone();
    let record = seen.clone();
    let mut rules = RateLimitLayer::builder(store.clone())
        .add_rule({
            let rule = Rule::new("k", cfg.per_key.1, key::header("x-key")).algorithm(cfg.per_key.0);
            if cfg.charged {
                rule.charged()
            } else {
                rule
            }
        })
        .add_rule(
            Rule::new("g", cfg.global.1, key::Global)
                .algorithm(cfg.global.0)
                .fail_mode(cfg.global_fail_mode)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        );
    if let Some((algorithm, quota)) = cfg.shadow {
        rules = rules.add_rule(Rule::new("s", quota, key::header("x-key")).algorithm(algorithm).shadow(true));
    }
    let mut rules = rules
        .cost(|req: &RequestHead| header(req, "x-cost"))
        .timeout(Duration::from_millis(50))
        .max_in_flight(2)
        .circuit_breaker(2, cool_down)
        .local_cache(cache);
    rules = if cfg.fallback {
        rules.fallback(MemoryStore::with_clock(TokioClockOr(now.clone()))).servers(2)
    } else {
        // The rules without a fail mode of their own pass while the store fails.
        rules.fail_mode(FailMode::Open)
    };
    let layer = rules.build().unwrap().on_rejected(move |r: &Rejection<'_>| {
        if r.decided_by == DecidedBy::LocalCache {
            record.lock().unwrap().cached.push((now.now_micros(), r.rule.to_string(), r.key.as_bytes().to_vec()));
        }
        let mut res = Response::new(Body::empty());
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        res
    });
    let answered = seen.clone();
    let inner = tower::service_fn(move |req: Request<Body>| {
        let answered = answered.clone();
        async move {
            let ms = header(&req, "x-sleep");
            if ms > 1 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let status = StatusCode::from_u16(u16::try_from(header(&req, "x-status")).unwrap()).unwrap();
            // What the work "used", for a charged rule (no charged rule: ignored).
            let units = header(&req, "x-cost");
            let key = req.headers()["x-key"].as_bytes().to_vec();
            answered.lock().unwrap().answered.push((key, units));
            let res = Response::builder().status(status).extension(tollgate::Charge(units));
            Ok::<_, Infallible>(res.body(Body::empty()).unwrap())
        }
    });
    let svc = layer.layer(inner);
    let mut background = Vec::new();
    for op in ops {
        match *op {
            Op::Send { key, cost, status, handler_ms, drop_after, background: in_background } => {
                let fut = svc.clone().oneshot(request(key, cost, status, handler_ms));
                let fut = async move {
                    match drop_after {
                        Some(ms) => drop(tokio::time::timeout(Duration::from_millis(u64::from(ms)), fut).await),
                        None => drop(fut.await),
                    }
                };
                if in_background {
                    background.push(tokio::task::spawn_local(fut));
                } else {
                    fut.await;
                }
            }
            Op::Fault(mode) => *store.mode.lock().unwrap() = mode,
            Op::Advance(ms) => advance(Duration::from_millis(u64::from(ms))).await,
        }
        settle().await;
    }
    // Let the requests still running finish (a hanging store ends them at the deadline,
    // leaky delays at their slot).
    *store.mode.lock().unwrap() = Mode::Up;
    for task in background {
        task.await.unwrap();
    }
    // Recovery: the store is back; after the cool-down, a request of a new key must reach
    // it and be decided by it.
    *store.mode.lock().unwrap() = Mode::Up;
    tokio::time::sleep(cool_down).await;
    advance(cool_down).await;
    settle().await;
    let before = store.attempts();
    let res = svc.clone().oneshot(request(9, 1, 200, 0)).await.unwrap();
    assert!(store.attempts() > before, "after recovery the store was not asked (breaker or in-flight stuck)");
    // Decided by the store: a 429 (the global rule may be spent), or a 200 with headers
    // (a fail-open pass has none).
    let decided = res.status() == StatusCode::TOO_MANY_REQUESTS || res.headers().contains_key("x-ratelimit-limit");
    assert!(decided, "not decided by the store after recovery: {res:?}");
    settle().await;
    let events = store.log.lock().unwrap().clone();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (events, seen)
}

/// A clock shared with the store (the fallback follows the same time).
#[derive(Clone)]
struct TokioClockOr(Arc<dyn Clock>);

impl Clock for TokioClockOr {
    fn now_micros(&self) -> u64 {
        self.0.now_micros()
    }
}

// ---------------------------------------------------------------------------------------
// The reference

/// One commit of one (rule, key): where its units went, how many, and when it was made.
/// A charge is `forced` (taken whatever the decision: it may exceed the quota); a charged
/// rule's admission is a commit of cost 0 (a point where the key must have been within
/// its quota, charges included).
#[derive(Debug, Clone)]
struct Commit {
    at: u64,
    cost: u64,
    made: u64,
    seq: usize,
    forced: bool,
}

/// One refund: of the commit at `at` of `cost`, asked at `when`.
#[derive(Debug, Clone)]
struct Undo {
    at: u64,
    cost: u64,
    when: u64,
}

type Id = (String, Vec<u8>, Algorithm, Quota);

fn id(c: &Check) -> Id {
    (c.rule.to_string(), c.key.as_bytes().to_vec(), c.algorithm, c.params.quota)
}

/// Commits and refunds by (rule, key), each in time order; and the store's rejections.
type Record = (HashMap<Id, Vec<Commit>>, HashMap<Id, Vec<Undo>>, Vec<(u64, Id, Decision)>);

/// `charged`: whether the per-key rule is charged (its charges are the handlers'). Any
/// other charge is a write-back of what the fallback admitted while the store never saw
/// it: units the store holds beyond the reference's, which can only make it admit less.
/// They are left out (the fallback's limit is approximate by design).
fn split(events: &[Event], charged: bool) -> Record {
    let (mut commits, mut undos, mut rejections) =
        (HashMap::<Id, Vec<Commit>>::new(), HashMap::<Id, Vec<Undo>>::new(), Vec::new());
    for e in events {
        match e {
            Event::Check { now, seq, checks, outcomes } => {
                for (c, o) in checks.iter().zip(outcomes) {
                    let Some(o) = o else { continue };
                    if let Some(t) = o.taken {
                        let commit = Commit { at: t.at, cost: c.params.cost, made: *now, seq: *seq, forced: false };
                        commits.entry(id(c)).or_default().push(commit);
                    } else if o.decision.allowed && c.params.cost == 0 {
                        let admitted = Commit { at: *now, cost: 0, made: *now, seq: *seq, forced: false };
                        commits.entry(id(c)).or_default().push(admitted);
                    } else if !o.decision.allowed {
                        rejections.push((*now, id(c), o.decision));
                    }
                }
            }
            Event::Charge { now, seq, checks } => {
                for c in checks.iter().filter(|c| charged && &*c.rule == "k") {
                    let charge = Commit { at: *now, cost: c.params.cost, made: *now, seq: *seq, forced: true };
                    commits.entry(id(c)).or_default().push(charge);
                }
            }
            Event::Refund { now, refunds } => {
                for r in refunds {
                    undos.entry(id(&r.check)).or_default().push(Undo {
                        at: r.taken.at,
                        cost: r.check.params.cost,
                        when: *now,
                    });
                }
            }
        }
    }
    // Tasks on other threads may log out of order.
    commits.values_mut().for_each(|l| l.sort_by_key(|c| (c.made, c.seq)));
    undos.values_mut().for_each(|l| l.sort_by_key(|u| u.when));
    (commits, undos, rejections)
}

/// Checks every commit against the reference of its algorithm.
fn check_exact(commits: &HashMap<Id, Vec<Commit>>, undos: &HashMap<Id, Vec<Undo>>) -> Result<(), String> {
    for (id, list) in commits {
        let (rule, _, algorithm, q) = id;
        let none = Vec::new();
        let undo = undos.get(id).unwrap_or(&none);
        let (l, w, t, b) = (q.limit(), q.period_micros(), q.emission_interval_micros(), q.burst_size());
        let fail =
            |what: String| Err(format!("rule {rule} ({algorithm}, {q:?}): {what}; commits {list:?}, undos {undo:?}"));
        match algorithm {
            Algorithm::SlidingWindowLog => {
                // At each commit: units logged in (made - W, made], less what refunds made
                // before it gave back (only while the units were still in the window).
                // (By position in the record, not time: an admission and the charge after
                // it may share a µs.)
                for (i, c) in list.iter().enumerate().filter(|(_, c)| !c.forced) {
                    let mut per_at: HashMap<u64, u64> = HashMap::new();
                    for d in list[..=i].iter().filter(|d| d.at + w > c.made) {
                        *per_at.entry(d.at).or_default() += d.cost;
                    }
                    for u in undo.iter().filter(|u| u.when <= c.made && u.at + w > u.when) {
                        if let Some(n) = per_at.get_mut(&u.at) {
                            *n -= u.cost.min(*n);
                        }
                    }
                    let units: u64 = per_at.values().sum();
                    if units > l {
                        return fail(format!("{units} units in the window ending at {}", c.made));
                    }
                }
            }
            Algorithm::FixedWindow => {
                for (i, c) in list.iter().enumerate().filter(|(_, c)| !c.forced) {
                    let window = c.at / w;
                    let taken: u64 = list[..=i].iter().filter(|d| d.at / w == window).map(|d| d.cost).sum();
                    let given: u64 = undo
                        .iter()
                        .filter(|u| u.at / w == window && u.when <= c.made && u.when / w == window)
                        .map(|u| u.cost)
                        .sum();
                    if taken.saturating_sub(given) > l {
                        return fail(format!("{} units in window {window}", taken - given));
                    }
                }
            }
            Algorithm::Gcra | Algorithm::TokenBucket => {
                // Each refund removes its own commit (matched by identity, in time order).
                // At every commit, the commits still standing (made by then, not refunded
                // by then) must fit the bucket: in any span ending there, at most the
                // burst plus the span's refill. A refund may refund less than its
                // commit holds (conservative), never more: so this must hold.
                let mut refunded_at: Vec<Option<u64>> = vec![None; list.len()];
                for u in undo {
                    let found = list.iter().enumerate().find(|(i, d)| {
                        refunded_at[*i].is_none() && d.at == u.at && d.cost == u.cost && d.made <= u.when
                    });
                    if let Some((i, _)) = found {
                        refunded_at[i] = Some(u.when);
                    }
                }
                for (i, c) in list.iter().enumerate().filter(|(_, c)| !c.forced) {
                    let standing: Vec<&Commit> = list[..=i]
                        .iter()
                        .zip(&refunded_at)
                        .filter(|(_, r)| r.is_none_or(|when| when > c.made))
                        .map(|(d, _)| d)
                        .collect();
                    for first in &standing {
                        let span = c.made - first.made;
                        let taken: u64 = standing.iter().filter(|d| d.made >= first.made).map(|d| d.cost).sum();
                        if u128::from(taken) * u128::from(t) > u128::from(b) * u128::from(t) + u128::from(span) {
                            return fail(format!("{taken} units standing in the {span} µs before {}", c.made));
                        }
                    }
                }
            }
            Algorithm::LeakyBucket => {
                // Slots are never shared, but with a request refunded before.
                for (i, c) in list.iter().enumerate() {
                    if c.at < c.made {
                        return fail(format!("slot {} before its request at {}", c.at, c.made));
                    }
                    for d in &list[..i] {
                        let overlap = c.at < d.at + d.cost * t && d.at < c.at + c.cost * t;
                        let given_back = undo.iter().any(|u| u.at == d.at && u.when <= c.made);
                        if overlap && !given_back {
                            return fail(format!("slots {} and {} overlap", d.at, c.at));
                        }
                    }
                }
            }
            other => return fail(format!("no reference for {other}")),
        }
    }
    Ok(())
}

/// Every cached rejection of (rule, key) must be backed by a store rejection of that rule
/// and key still in force.
fn check_cache(seen: &Seen, rejections: &[(u64, Id, Decision)]) -> Result<(), String> {
    for (at, rule, key) in &seen.cached {
        let backed = rejections.iter().any(|(when, id, d)| {
            &id.0 == rule
                && &id.1 == key
                && d.retry_after().is_some_and(|r| *when + u64::try_from(r.as_micros()).unwrap() > *at)
        });
        if !backed {
            return Err(format!(
                "rule {rule}, key {:?}: rejected from the cache at {at} without a store rejection in force; \
                 store rejections: {rejections:?}",
                String::from_utf8_lossy(key)
            ));
        }
    }
    Ok(())
}

/// Every handler that answered reported a charge, and the store took exactly those: one
/// charge of the same units per answer, to the charged rule and the answer's key (for a
/// store that decided every request: no fault, no fail-open pass, no fallback).
fn check_charges(seen: &Seen, events: &[Event]) -> Result<(), String> {
    let mut answered = seen.answered.clone();
    let mut taken: Vec<(Vec<u8>, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Charge { checks, .. } => Some(checks.iter().map(|c| {
                assert_eq!(&*c.rule, "k", "only the per-key rule is charged");
                (c.key.as_bytes().to_vec(), c.params.cost)
            })),
            _ => None,
        })
        .flatten()
        .collect();
    answered.sort_unstable();
    taken.sort_unstable();
    if answered == taken {
        Ok(())
    } else {
        Err(format!("handlers reported charges {answered:?}, the store took {taken:?}"))
    }
}

// ---------------------------------------------------------------------------------------
// The properties

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(4_000), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_layer_over_memory_store_keeps_every_promise(cfg in config(true), ops in ops(true), local in any::<bool>()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let (events, seen) = rt.block_on(tokio::task::LocalSet::new().run_until(async {
            let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
            // Half the cases as a remote store would answer (a future per call), half as an
            // in-process one (decided inside the layer's `call`).
            let inner = MemoryStore::with_clock(TokioClockOr(clock.clone()));
            let store = if local { Recorder::local(inner, clock) } else { Recorder::new(inner, clock) };
            run_case(&cfg, &ops, store, Duration::from_millis(500), true, None).await
        }));
        let (commits, undos, rejections) = split(&events, cfg.charged);
        check_exact(&commits, &undos).map_err(TestCaseError::fail)?;
        check_cache(&seen, &rejections).map_err(TestCaseError::fail)?;
        // An in-process store that never failed decided every request (it has no
        // in-flight cap to overflow): each answer's charge was taken, once.
        let faults = ops.iter().any(|op| matches!(op, Op::Fault(Mode::Failing | Mode::Hanging)));
        if local && cfg.charged && !faults {
            check_charges(&seen, &events).map_err(TestCaseError::fail)?;
        }
    }
}

/// One server for every Redis case; each case has a key prefix of its own.
fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// Has the server load the scripts of the calls a case makes (a check of several rules,
/// a charge, a refund) before the case: a script it does not know yet is sent again
/// (`EVAL` after `NOSCRIPT`), at a later time and behind the calls queued meanwhile, out
/// of the order and time the recording store logged (see `Core::recorded`).
async fn load_scripts(redis: &RedisStore) {
    let check = |rule: &str| Check {
        rule: rule.into(),
        key: "scripts".into(),
        algorithm: Algorithm::Gcra,
        params: Params::new(Quota::per_minute(5)),
    };
    let checks = [check("load1"), check("load2")];
    let outcomes = redis.check(&checks).await.unwrap();
    redis.charge(&checks).await.unwrap();
    let refunds: Vec<Refund> = checks
        .iter()
        .zip(&outcomes)
        .filter_map(|(c, o)| Some(Refund { check: c.clone(), taken: o.as_ref()?.taken? }))
        .collect();
    assert_eq!(refunds.len(), 2, "{outcomes:?}");
    redis.refund(&refunds).await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(100), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_layer_over_redis_keeps_every_promise(cfg in config(false), ops in ops(false)) {
        static CASE: AtomicUsize = AtomicUsize::new(0);
        let prefix = format!("model{}", CASE.fetch_add(1, Ordering::SeqCst));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (events, seen) = rt.block_on(tokio::task::LocalSet::new().run_until(async {
            let manual = ManualClock::new(T0);
            let clock: Arc<dyn Clock> = Arc::new(manual.clone());
            let redis = RedisStore::from_url(&redis().url())
                .unwrap()
                .prefix(&prefix)
                .unwrap()
                .response_timeout(Duration::from_secs(1))
                .with_clock(manual.clone())
                // One call per check: this model dates a decision at the store call
                // (`made`), which a batched check is not (it is decided when its batch
                // runs, after refunds sent meanwhile, and on the clock read then). Every
                // check here has two rules or more, which group commit now batches too
                // (`tests/redis/multi_batch.rs` checks those against `MemoryStore`).
                .max_batch(1)
                .unwrap();
            redis.ping().await.unwrap();
            load_scripts(&redis).await;
            let store = Recorder::new(redis, clock);
            // Redis runs on real time: no cache (its entries would time out in real time
            // while the store's clock jumps), a short cool-down.
            run_case(&cfg, &ops, store, Duration::from_millis(30), false, Some(&manual)).await
        }));
        let (commits, undos, rejections) = split(&events, cfg.charged);
        check_exact(&commits, &undos).map_err(TestCaseError::fail)?;
        check_cache(&seen, &rejections).map_err(TestCaseError::fail)?;
    }
}
