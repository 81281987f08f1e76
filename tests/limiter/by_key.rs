//! The `Limiter` on its own: inputs that are not HTTP requests, the runtime protections
//! (deadline, circuit breaker, fail mode, fallback, blocked-key cache), refunds, and the
//! waiting form.

use crate::support;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use support::fake::{Mode, Remote, TokioClock, T0};
use tokio::time::Instant;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::Store;
use tollgate::{key, Algorithm, FailMode, Limiter, MemoryStore, Quota, RateLimitLayer, Rule, StoreError};
use tower::{Layer, Service, ServiceExt};

/// A chat message: limited per user by count, and by bytes.
#[derive(Debug)]
struct Message {
    user: String,
    text: String,
}

fn msg(user: &str, text: &str) -> Message {
    Message { user: user.into(), text: text.into() }
}

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

fn per_user(m: &Message) -> Option<String> {
    Some(m.user.clone())
}

#[tokio::test]
async fn a_limiter_decides_inputs_that_are_not_requests() {
    let limiter = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("messages", Quota::per_minute(3), per_user)
        .add_rule(Rule::new("bytes", Quota::per_minute(10), per_user).cost(|m: &Message| m.text.len() as u64))
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
        .unwrap();

    let v = limiter.check(&msg("ada", "hi")).await;
    assert!(v.is_allowed() && !v.is_rejected());
    let left: Vec<(&str, u64)> = v.decisions().map(|d| (d.rule, d.decision.remaining())).collect();
    assert_eq!(left, [("messages", 2), ("bytes", 8)]);
    assert_eq!(v.most_restrictive().unwrap().rule, "messages");

    // Nine bytes do not fit in the eight left: the bytes rule rejects, and the message
    // consumes nothing from the count rule either.
    let v = limiter.check(&msg("ada", "123456789")).await;
    assert!(v.is_rejected() && !v.is_allowed());
    let by = v.rejected_by().unwrap();
    assert_eq!((by.rule, by.quota), ("bytes", Quota::per_minute(10)));
    assert_eq!(v.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(limiter.peek("messages", "ada").await.unwrap().remaining(), 1);

    // Another user has a budget of their own.
    assert!(limiter.check(&msg("bob", "123456789")).await.is_allowed());
    for _ in 0..2 {
        assert!(limiter.check(&msg("ada", "x")).await.is_allowed());
    }
    let v = limiter.check(&msg("ada", "x")).await;
    assert_eq!(v.rejected_by().unwrap().rule, "messages");
}

/// A rule the input can never pass (its cost above the rule's capacity) is the one
/// `rejected_by` names, over one that only makes it wait an hour: no `retry_after` then,
/// and `wait` gives up at once rather than sleeping for the other rule.
#[tokio::test(start_paused = true)]
async fn a_rule_that_can_never_pass_is_the_rejection_and_wait_gives_up_at_once() {
    let limiter = Limiter::builder(MemoryStore::with_clock(TokioClock::new()))
        .rule("messages", Quota::per_hour(1), per_user)
        .add_rule(Rule::new("bytes", Quota::per_minute(4), per_user).cost(|m: &Message| m.text.len() as u64))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    assert!(limiter.check(&msg("ada", "hi")).await.is_allowed());
    // The message rule would take an hour; the byte rule can never take 5 of 4.
    let v = limiter.check(&msg("ada", "12345")).await;
    let by = v.rejected_by().unwrap();
    assert_eq!((by.rule, by.decision.retry_after()), ("bytes", None));
    assert_eq!(v.retry_after(), None);
    assert_eq!(v.most_restrictive().unwrap().rule, "bytes");
    let started = Instant::now();
    let v = limiter.wait(&msg("ada", "12345"), Duration::from_secs(2 * 3600)).await;
    assert_eq!(v.rejected_by().map(|r| r.rule), Some("bytes"));
    assert_eq!(started.elapsed(), Duration::ZERO, "waited for a rule that never lets it through");
}

#[tokio::test]
async fn any_input_type_even_unsized_and_rules_that_do_not_apply() {
    let limiter: Limiter<MemoryStore, str> = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("per-word", Quota::per_hour(2), |s: &str| (!s.is_empty()).then(|| s.to_owned()))
        .add_rule(Rule::new("vip", Quota::per_hour(1), |s: &str| Some(s.to_owned())).bypass_if(|s: &str| s == "root"))
        .build()
        .unwrap();
    assert!(limiter.check("a").await.is_allowed());
    let v = limiter.check("a").await;
    assert!(v.is_rejected(), "vip allows one an hour");
    // No key: the rule does not apply; bypassed: neither. An input no rule applies to is
    // allowed with no decisions.
    let v = limiter.check("").await;
    assert!(v.is_allowed());
    assert_eq!(v.decisions().count(), 1, "only the vip rule applies to the empty word");
    for _ in 0..2 {
        assert!(limiter.check("root").await.is_allowed());
    }
    assert!(limiter.check("root").await.is_rejected(), "per-word still applies to root");
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_costs_the_deadline_then_the_breaker_opens_under_either_fail_mode() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    store.set(Mode::Hanging);
    let limiter = Limiter::builder(store.clone())
        .rule("open", Quota::per_minute(5), user)
        .add_rule(
            Rule::new("closed", Quota::per_minute(5), |u: &str| (u == "pay").then(|| Key::from(u)))
                .fail_mode(FailMode::Closed),
        )
        .fail_mode(FailMode::Open)
        .timeout(Duration::from_millis(40))
        .circuit_breaker(3, Duration::from_secs(2))
        .build()
        .unwrap();
    for i in 0..3 {
        let started = Instant::now();
        let v = limiter.check("ada").await;
        assert_eq!(started.elapsed(), Duration::from_millis(40), "call {i} waited the deadline, no more");
        assert!(matches!(v.store_error(), Some(StoreError::Timeout(_))), "{v:?}");
        assert!(v.is_allowed() && !v.is_rejected(), "fail open: passes");
        assert_eq!(v.decisions().count(), 0, "nothing is known");
    }
    assert_eq!(store.checks(), 3);
    // Open circuit: refused at once, the store is not called.
    let started = Instant::now();
    let v = limiter.check("pay").await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(matches!(v.store_error(), Some(StoreError::CircuitOpen(_))), "{v:?}");
    assert!(!v.is_allowed() && !v.is_rejected(), "a fail-closed rule refuses without a rejection");
    assert_eq!(store.checks(), 3);
    // After the cool-down one probe finds the store back, and the circuit closes.
    store.set(Mode::Up);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(limiter.check("ada").await.is_allowed());
    assert!(limiter.check("ada").await.store_error().is_none());
    assert_eq!(store.checks(), 5);
}

#[tokio::test]
async fn the_fallback_decides_while_the_store_is_down() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    store.set(Mode::Failing);
    let limiter = Limiter::builder(store)
        .rule("jobs", Quota::per_minute(6), user)
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)))
        .servers(3)
        .circuit_breaker(1000, Duration::from_secs(1))
        .build()
        .unwrap();
    // 6 a minute shared by 3 servers: 2 each while the store is down.
    let allowed: Vec<bool> = futures_seq(&limiter, "ada", 4).await;
    assert_eq!(allowed, [true, true, false, false]);
}

async fn futures_seq<St: Store>(limiter: &Limiter<St, str>, user: &str, n: usize) -> Vec<bool> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(limiter.check(user).await.is_allowed());
    }
    out
}

#[tokio::test]
async fn the_blocked_key_cache_answers_repeat_rejections_without_the_store() {
    let clock = ManualClock::new(T0);
    let store = Remote::new(MemoryStore::with_clock(clock.clone()));
    let limiter = Limiter::builder(store.clone()).rule("jobs", Quota::per_hour(2), user).build().unwrap();
    assert_eq!(futures_seq(&limiter, "ada", 5).await, [true, true, false, false, false]);
    assert_eq!(store.checks(), 3, "the two later rejections came from the cache");
    let v = limiter.check("ada").await;
    assert!(v.is_rejected() && v.retry_after().is_some());
    // Other keys still reach the store.
    assert!(limiter.check("bob").await.is_allowed());
    assert_eq!(store.checks(), 4);
    // A reset forgets the cached rejection too.
    limiter.reset("jobs", "ada").await.unwrap();
    assert!(limiter.check("ada").await.is_allowed());
}

#[tokio::test]
async fn refund_gives_back_what_an_allowed_verdict_took() {
    let limiter = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("jobs", Quota::per_hour(2), user)
        .build()
        .unwrap();
    let a = limiter.check("ada").await;
    let b = limiter.check("ada").await;
    assert!(a.is_allowed() && b.is_allowed());
    let rejected = limiter.check("ada").await;
    assert!(rejected.is_rejected());
    limiter.refund(rejected).await.unwrap(); // took nothing: refunds nothing
    assert!(limiter.check("ada").await.is_rejected());
    limiter.refund(b).await.unwrap();
    assert!(limiter.check("ada").await.is_allowed(), "the refunded unit is usable again");
    assert!(limiter.check("ada").await.is_rejected());
}

fn tokio_store() -> MemoryStore {
    MemoryStore::with_clock(TokioClock::new())
}

#[tokio::test(start_paused = true)]
async fn wait_sleeps_until_admitted_or_gives_up_when_the_wait_is_too_long() {
    // GCRA 2/s, burst 1: one every 500 ms.
    let limiter = Limiter::builder(tokio_store())
        .rule("jobs", Quota::per_second(2).burst(1), user)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let started = Instant::now();
    assert!(limiter.wait("ada", Duration::from_secs(5)).await.is_allowed());
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(limiter.wait("ada", Duration::from_secs(5)).await.is_allowed());
    assert_eq!(started.elapsed(), Duration::from_millis(500), "waited for its turn");
    // A bound shorter than the turn: the rejection comes back at once.
    let v = limiter.wait("ada", Duration::from_millis(100)).await;
    assert!(v.is_rejected());
    assert_eq!(v.retry_after(), Some(Duration::from_millis(500)));
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    // Never acceptable: no waiting at all.
    let huge = Limiter::builder(tokio_store())
        .rule("jobs", Quota::per_second(2).burst(1), user)
        .cost(|_: &str| 5)
        .build()
        .unwrap();
    let v = huge.wait("ada", Duration::from_secs(60)).await;
    assert!(v.is_rejected() && v.retry_after().is_none());
    assert_eq!(started.elapsed(), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn wait_takes_turns_among_concurrent_waiters_and_waits_a_leaky_buckets_delay() {
    let limiter = Arc::new(
        Limiter::builder(tokio_store())
            .rule("shaped", Quota::per_second(5).burst(3), user)
            .algorithm(Algorithm::LeakyBucket)
            .build()
            .unwrap(),
    );
    let started = Instant::now();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let v = limiter.wait("ada", Duration::from_secs(10)).await;
                (v.is_allowed(), started.elapsed().as_millis())
            })
        })
        .collect();
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    got.sort_unstable();
    assert!(got.iter().all(|(ok, _)| *ok), "{got:?}");
    let times: Vec<u128> = got.iter().map(|(_, t)| *t).collect();
    // A slot every 200 ms; the queue holds 3 besides the one leaving: the last two wait
    // for room in the queue (their retry) and then for their slot.
    assert_eq!(times, [0, 200, 400, 600, 800, 1000], "{got:?}");
}

/// An in-process store decides every rule of an input, enforced and shadow: one enforced
/// rule and two shadow rules each take their unit.
#[tokio::test]
async fn every_rule_is_decided_by_a_local_store() {
    let user = |u: &str| Some(Key::from(u));
    let limiter = Limiter::builder(MemoryStore::new())
        .rule("enforced", Quota::per_minute(10), user)
        .add_rule(Rule::new("s1", Quota::per_minute(10), user).shadow(true))
        .add_rule(Rule::new("s2", Quota::per_minute(10), user).shadow(true))
        .build()
        .unwrap();
    assert!(limiter.check("ada").await.is_allowed());
    for rule in ["enforced", "s1", "s2"] {
        // 10 - 1 taken - the peek's own unit.
        assert_eq!(limiter.peek(rule, "ada").await.unwrap().remaining(), 8, "{rule}");
    }
}

// ---------------------------------------------------------------------------------------
// Asking by key: one count, whoever asks

/// A job loop asking by key and an HTTP layer over the same limiter use up one count per
/// key: what the jobs took, the requests cannot take, and the other way round.
#[tokio::test]
async fn jobs_asking_by_key_and_requests_share_one_count() {
    let limiter = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("per-account", Quota::per_minute(5), key::header("x-account"))
        .build()
        .unwrap();
    let layer = RateLimitLayer::from_limiter(limiter);
    let jobs = layer.limiter().clone();
    let svc = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    let request = |account: &str| Request::builder().header("x-account", account).body(Body::empty()).unwrap();

    let job = jobs.check_key("per-account", "acme", 2).await;
    assert!(job.is_allowed());
    assert_eq!(job.decisions().next().unwrap().decision.remaining(), 3);
    for _ in 0..3 {
        assert_eq!(svc.clone().oneshot(request("acme")).await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(svc.clone().oneshot(request("acme")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    let refused = jobs.check_key("per-account", "acme", 1).await;
    assert!(refused.is_rejected());
    assert_eq!(refused.rejected_by().unwrap().rule, "per-account");
    // A refund by key comes back for the requests too.
    jobs.refund(job).await.unwrap();
    assert_eq!(svc.clone().oneshot(request("acme")).await.unwrap().status(), StatusCode::OK);
    // Another account has its own count.
    assert!(jobs.check_key("per-account", "globex", 5).await.is_allowed());
    assert!(jobs.check_key("per-account", "globex", 1).await.is_rejected());
}

/// A check by key (or of an input) decides when first polled, as any future does: one made
/// and dropped unpolled takes nothing, on an in-process store too (which decides at once
/// when polled), and one polled decides, whoever decided.
#[tokio::test]
async fn a_check_never_polled_takes_nothing() {
    let limiter = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("per-account", Quota::per_minute(2), key::header("x-account"))
        .build()
        .unwrap();
    for _ in 0..5 {
        drop(limiter.check_key("per-account", "acme", 1));
        drop(limiter.check(&Request::builder().header("x-account", "acme").body(()).unwrap()));
    }
    let first = limiter.check_key("per-account", "acme", 1).await;
    assert!(first.is_allowed(), "{first}");
    assert_eq!(first.decisions().next().unwrap().decision.remaining(), 1, "the unpolled checks took nothing");
    assert_eq!(first.decisions().next().unwrap().decision.decided_by(), tollgate::verdict::DecidedBy::Store);
}

/// Asking by key under a rule the limiter lacks refuses, and says so, whatever the fail
/// mode; a cost above the capacity is refused with no retry; a shadow rule never refuses.
#[tokio::test]
async fn check_key_refuses_an_unknown_rule_and_lets_a_shadow_rule_pass() {
    let limiter = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("jobs", Quota::per_minute(3), user)
        .add_rule(Rule::new("trial", Quota::per_minute(1), user).shadow(true))
        .fail_mode(FailMode::Open)
        .build()
        .unwrap();
    let v = limiter.check_key("jbos", "ada", 1).await;
    assert!(!v.is_allowed());
    assert!(matches!(v.store_error(), Some(StoreError::UnknownRule(name)) if name == "jbos"), "{v:?}");
    let v = limiter.check_key("jobs", "ada", 4).await;
    assert!(v.is_rejected() && v.retry_after().is_none(), "4 never fit in 3: {v:?}");
    for _ in 0..3 {
        assert!(limiter.check_key("trial", "ada", 1).await.is_allowed(), "a shadow rule never refuses");
    }
    assert!(!limiter.peek("trial", "ada").await.unwrap().allowed, "but it counts");
}

/// A key blocked by hand is refused with the rest of the block, under every cost; a
/// shorter block replaces it, zero lifts it; a rule that cannot block says so.
#[tokio::test]
async fn a_key_blocked_by_hand_is_refused_until_the_block_ends() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .add_rule(Rule::new("api", Quota::per_minute(100), user).blockable())
        .rule("plain", Quota::per_minute(100), user)
        .build()
        .unwrap();
    limiter.block("api", "mallory", Duration::from_secs(3600)).await.unwrap();
    clock.advance(Duration::from_secs(600));
    let v = limiter.check_key("api", "mallory", 1).await;
    assert!(v.is_rejected());
    assert_eq!(v.retry_after(), Some(Duration::from_secs(3000)), "the rest of the block");
    assert!(limiter.check("mallory").await.is_rejected(), "by input too");
    assert!(limiter.check_key("api", "ada", 1).await.is_allowed(), "only that key");
    limiter.block("api", "mallory", Duration::from_secs(10)).await.unwrap();
    assert_eq!(limiter.check_key("api", "mallory", 1).await.retry_after(), Some(Duration::from_secs(10)));
    limiter.block("api", "mallory", Duration::ZERO).await.unwrap();
    assert!(limiter.check("mallory").await.is_allowed(), "lifted");
    let err = limiter.block("plain", "mallory", Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(&err, StoreError::Invalid(why) if why.contains("blockable")), "{err}");
    // An unknown rule is an error, everywhere (it was a silent Ok(false)).
    let unknown = |r: Result<_, StoreError>| matches!(r, Err(StoreError::UnknownRule(n)) if n == "nope");
    assert!(unknown(limiter.block("nope", "mallory", Duration::from_secs(1)).await), "block");
    assert!(unknown(limiter.reset("nope", "mallory").await), "reset");
    assert!(unknown(limiter.peek("nope", "mallory").await.map(drop)), "peek");
    assert!(unknown(limiter.peek_with("nope", "mallory", Quota::per_minute(1)).await.map(drop)), "peek_with");
    let v = limiter.check_key("nope", "mallory", 1).await;
    assert!(!v.is_allowed() && matches!(v.store_error(), Some(StoreError::UnknownRule(_))), "{v}");
}

/// Polls `fut` once with a waker that does nothing: an in-process answer needs no second
/// poll, no runtime and no timer.
fn at_once<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-process limiter's future was not ready at its first poll"),
    }
}

/// On a bare thread with no tokio runtime (and so no timer), every call of an in-process
/// limiter — decide by input and by key, refund, charge, block, peek, reset — and a
/// layer's refusal and admission are answered at their first poll.
#[test]
fn an_in_process_limiter_needs_no_runtime() {
    assert!(tokio::runtime::Handle::try_current().is_err());
    let limiter = Limiter::builder(MemoryStore::new())
        .add_rule(Rule::new("jobs", Quota::per_minute(2), user).blockable())
        .add_rule(Rule::new("tokens", Quota::per_minute(100), user).charged())
        .build()
        .unwrap();
    let first = at_once(limiter.check("ada"));
    assert!(first.is_allowed());
    assert!(at_once(limiter.check_key("jobs", "ada", 1)).is_allowed());
    assert!(at_once(limiter.check("ada")).is_rejected());
    at_once(limiter.refund(first)).unwrap();
    let again = at_once(limiter.wait_key("jobs", "ada", 1, Duration::from_secs(1)));
    assert!(again.is_allowed(), "the refund was taken at once");
    let carol = at_once(limiter.check("carol"));
    at_once(limiter.charge(&carol, 150)).unwrap();
    assert!(!at_once(limiter.peek("tokens", "carol")).unwrap().allowed, "the charge was taken at once");
    at_once(limiter.reset("tokens", "carol")).unwrap();
    assert!(at_once(limiter.peek("tokens", "carol")).unwrap().allowed, "reset at once");
    at_once(limiter.block("jobs", "bob", Duration::from_secs(60))).unwrap();
    assert!(at_once(limiter.check_key("jobs", "bob", 1)).is_rejected());

    let layer = RateLimitLayer::new(Quota::per_minute(1), key::header("x-key"), MemoryStore::new());
    let mut svc = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    let get = || Request::builder().header("x-key", "a").body(Body::empty()).unwrap();
    at_once(std::future::poll_fn(|cx| svc.poll_ready(cx))).unwrap();
    assert_eq!(at_once(svc.call(get())).unwrap().status(), StatusCode::OK);
    at_once(std::future::poll_fn(|cx| svc.poll_ready(cx))).unwrap();
    assert_eq!(at_once(svc.call(get())).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A check by key of a charged rule may take units now, and a charge after it still goes
/// to that rule; a check of cost 0 of a rule that is not charged is no probe: a charge
/// takes nothing from it.
#[tokio::test]
async fn a_charge_after_a_check_by_key_goes_to_charged_rules_only() {
    let limiter = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .add_rule(Rule::new("tokens", Quota::per_minute(100), user).charged())
        .rule("plain", Quota::per_minute(10), user)
        .build()
        .unwrap();
    let v = limiter.check_key("tokens", "ada", 1).await;
    limiter.charge(&v, 500).await.unwrap();
    assert!(!limiter.peek("tokens", "ada").await.unwrap().allowed, "in debt after the charge");
    let v = limiter.check_key("plain", "ada", 0).await;
    assert!(v.is_allowed());
    limiter.charge(&v, 7).await.unwrap();
    assert_eq!(limiter.peek("plain", "ada").await.unwrap().remaining(), 9, "nothing charged");
}

/// A `LimiterHandle` kept after its limiter and store are gone holds their rule names: a
/// brand-new store must not be taken for the dropped one (identities came from addresses,
/// which the allocator reuses).
#[test]
fn a_new_store_is_never_taken_for_a_dropped_one() {
    let mut handles = Vec::new();
    for i in 0..200 {
        let limiter = Limiter::builder(MemoryStore::new()).rule("jobs", Quota::per_minute(5), user).build();
        let limiter: Limiter<MemoryStore, str> = limiter.unwrap_or_else(|e| panic!("store {i}: {e}"));
        handles.push(limiter.handle());
    }
    #[cfg(feature = "redis")]
    for i in 0..200 {
        let store = tollgate::RedisStore::from_url("redis://127.0.0.1:1").unwrap();
        let limiter = Limiter::builder(store).rule("jobs", Quota::per_minute(5), user).build();
        let limiter: Limiter<_, str> = limiter.unwrap_or_else(|e| panic!("redis store {i}: {e}"));
        handles.push(limiter.handle());
    }
}

/// A remote store whose checks wait for a gate (once armed) after deciding.
#[derive(Clone)]
struct Gated {
    inner: MemoryStore,
    gate: Arc<tokio::sync::Notify>,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl Store for Gated {
    fn check(
        &self,
        checks: &[tollgate::store::Check],
    ) -> impl Future<Output = Result<Vec<Option<tollgate::store::Outcome>>, StoreError>> + Send {
        let answer = tollgate::store::LocalStore::check_now(&self.inner, checks);
        let (gate, armed) = (self.gate.clone(), self.armed.swap(false, std::sync::atomic::Ordering::SeqCst));
        async move {
            if armed {
                gate.notified().await;
            }
            answer
        }
    }
    fn refund(&self, refunds: &[tollgate::store::Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(tollgate::store::LocalStore::refund_now(&self.inner, refunds))
    }
    fn peek(
        &self,
        check: &tollgate::store::Check,
    ) -> impl Future<Output = Result<tollgate::Decision, StoreError>> + Send {
        std::future::ready(tollgate::store::LocalStore::peek_now(&self.inner, check))
    }
    fn reset(&self, rule: &str, key: &Key, a: Algorithm) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(tollgate::store::LocalStore::reset_now(&self.inner, rule, key, a))
    }
}

/// A rejection the store made while units were being refunded is not recorded in the
/// blocked-key cache: recorded after the refund forgot the key, it outlived the units'
/// return, and the key was refused from the cache though it had room (a race found by
/// reading, proven here).
#[tokio::test]
async fn a_rejection_racing_a_refund_is_not_cached() {
    let store = Gated { inner: MemoryStore::new(), gate: Arc::default(), armed: Arc::default() };
    let limiter = Arc::new(
        Limiter::builder(store.clone())
            .rule("one", Quota::per_minute(1), user)
            .algorithm(Algorithm::Gcra)
            .build()
            .unwrap(),
    );
    let first: tollgate::Verdict = limiter.check("ada").await;
    assert!(first.is_allowed());
    // The second is decided (rejected: the first holds the unit), and its answer waits.
    store.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.check("ada").await }
    });
    tokio::task::yield_now().await;
    // Meanwhile the first is refunded (and the cache forgets the key)…
    limiter.refund(first).await.unwrap();
    // …then the rejection arrives.
    store.gate.notify_one();
    assert!(second.await.unwrap().is_rejected());
    let third = limiter.check("ada").await;
    assert!(third.is_allowed(), "refused by a stale cached rejection: {third:?}");
    assert_eq!(third.decided_by(), Some(tollgate::verdict::DecidedBy::Store));
}

/// A refund of units taken before a reset, made after requests since: the window
/// algorithms give nothing back (the units were in the state the reset forgot; giving
/// them back would let the fresh window admit more than its limit).
#[tokio::test]
async fn a_refund_from_before_a_reset_gives_nothing_back_to_a_window() {
    for algorithm in [tollgate::Algorithm::FixedWindow, tollgate::Algorithm::SlidingWindowCounter] {
        let clock = tollgate::clock::ManualClock::new(1_700_000_000_000_000);
        let limiter = tollgate::Limiter::builder(tollgate::MemoryStore::with_clock(clock.clone()))
            .add_rule(
                tollgate::Rule::new("r", tollgate::Quota::per_minute(5), |k: &str| Some(k.to_owned()))
                    .algorithm(algorithm),
            )
            .build()
            .unwrap();
        let before = limiter.check("k").await;
        clock.advance(std::time::Duration::from_secs(1));
        limiter.reset("r", "k").await.unwrap();
        clock.advance(std::time::Duration::from_secs(1));
        for _ in 0..5 {
            assert!(limiter.check("k").await.is_allowed());
        }
        limiter.refund(before).await.unwrap();
        assert!(limiter.check("k").await.is_rejected(), "{algorithm}: a sixth unit in the window after a reset");
    }
}
