//! The `Limiter` on its own: inputs that are not HTTP requests, the runtime protections
//! (deadline, circuit breaker, fail mode, fallback, blocked-key cache), refunds, and the
//! waiting form.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use support::fake::{Mode, Remote, TokioClock, T0};
use tokio::time::Instant;
use tollgate::key::Key;
use tollgate::store::{Outcome, Refund};
use tollgate::{
    Algorithm, Check, Decision, FailMode, Limiter, ManualClock, MemoryStore, Quota, Rule, Store, StoreError,
};

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
    let left: Vec<(&str, u64)> = v.decisions().map(|d| (d.rule, d.decision.remaining)).collect();
    assert_eq!(left, [("messages", 2), ("bytes", 8)]);
    assert_eq!(v.most_restrictive().unwrap().rule, "messages");

    // Nine bytes do not fit in the eight left: the bytes rule rejects, and the message
    // consumes nothing from the count rule either.
    let v = limiter.check(&msg("ada", "123456789")).await;
    assert!(v.is_rejected() && !v.is_allowed());
    let by = v.rejected_by().unwrap();
    assert_eq!((by.rule, by.quota), ("bytes", Quota::per_minute(10)));
    assert_eq!(v.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(limiter.peek("messages", "ada").await.unwrap().unwrap().remaining, 1);

    // Another user has a budget of their own.
    assert!(limiter.check(&msg("bob", "123456789")).await.is_allowed());
    for _ in 0..2 {
        assert!(limiter.check(&msg("ada", "x")).await.is_allowed());
    }
    let v = limiter.check(&msg("ada", "x")).await;
    assert_eq!(v.rejected_by().unwrap().rule, "messages");
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
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)), 3)
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
    assert!(limiter.reset("jobs", "ada").await.unwrap());
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
    limiter.refund(rejected).await.unwrap(); // took nothing: gives back nothing
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

/// An in-process store that decides at once through `check_one_now` and/or `check_now`
/// as told (or neither), else through its futures.
#[derive(Clone)]
struct AtOnce {
    inner: MemoryStore,
    one: bool,
    many: bool,
}

impl Store for AtOnce {
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        self.inner.check_one(check)
    }
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        self.inner.check(checks)
    }
    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.refund(refunds)
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.inner.peek(check)
    }
    fn reset(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(rule, key, algorithm)
    }
    fn is_local(&self) -> bool {
        true
    }
    fn check_one_now(&self, check: &Check) -> Option<Result<Outcome, StoreError>> {
        if self.one {
            self.inner.check_one_now(check)
        } else if self.many {
            // The default: through check_now.
            self.check_now(std::slice::from_ref(check)).map(|r| r.map(|o| o[0].clone().unwrap()))
        } else {
            None
        }
    }
    fn check_now(&self, checks: &[Check]) -> Option<Result<Vec<Option<Outcome>>, StoreError>> {
        self.many.then(|| self.inner.check_now(checks)).flatten()
    }
}

/// Whatever a local store decides at once (one rule, several, or neither), every rule of
/// a request is decided: one enforced rule and two shadow rules each take their unit. (A
/// store answering one rule at once but not several decided the enforced rule and dropped
/// the shadow ones.)
#[tokio::test]
async fn every_rule_is_decided_whichever_calls_a_local_store_answers_at_once() {
    let user = |u: &str| Some(Key::from(u));
    for (one, many) in [(true, false), (false, true), (true, true), (false, false)] {
        let limiter = Limiter::builder(AtOnce { inner: MemoryStore::new(), one, many })
            .rule("enforced", Quota::per_minute(10), user)
            .add_rule(Rule::new("s1", Quota::per_minute(10), user).shadow(true))
            .add_rule(Rule::new("s2", Quota::per_minute(10), user).shadow(true))
            .build()
            .unwrap();
        assert!(limiter.check("ada").await.is_allowed());
        for rule in ["enforced", "s1", "s2"] {
            // 10 - 1 taken - the peek's own unit.
            assert_eq!(limiter.peek(rule, "ada").await.unwrap().unwrap().remaining, 8, "{rule}: one {one} many {many}");
        }
    }
}
