//! One regression test per bug of the "correct on every path" review (each failed before
//! its fix), over `MemoryStore` and a controllable remote-like store; the Redis and
//! Redis Cluster ones are in `redis_store.rs`, `redis_cluster.rs` and `conformance.rs`.

mod support;

use std::convert::Infallible;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use support::fake::{settle, sliding_log_refund_example, Mode, Remote, TokioClock, T0};
use support::sf_params;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate::key::{self, Key};
use tollgate::{
    Algorithm, BuildError, DecidedBy, FailMode, HeaderStyle, Limiter, ManualClock, MemoryStore, Quota, RateLimitLayer,
    Rule,
};
use tower::{Layer, Service, ServiceExt};

const SEC: u64 = 1_000_000;

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn keyed(path: &str, key: &str) -> Request<Body> {
    Request::get(path).header("x-key", key).body(Body::empty()).unwrap()
}

/// 200, except `/fail` (401) and `/slow` (200 once `go` is notified).
fn app(
    go: Arc<Notify>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(move |req: Request<Body>| {
        let go = go.clone();
        async move {
            let mut res = Response::new(Body::empty());
            match req.uri().path() {
                "/fail" => *res.status_mut() = StatusCode::UNAUTHORIZED,
                "/slow" => go.notified().await,
                _ => {}
            }
            Ok(res)
        }
    })
}

// 1. The circuit breaker stayed open for ever when its half-open probe was dropped.

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_does_not_keep_the_circuit_open() {
    let store = Remote::new(MemoryStore::with_clock(TokioClock::new()));
    let limiter = Limiter::builder(store.clone())
        .rule("r", Quota::per_minute(100), user)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1, Duration::from_secs(1))
        .fail_mode(FailMode::Closed)
        .build()
        .unwrap();
    store.set(Mode::Failing);
    assert!(!limiter.check("a").await.is_allowed());
    tokio::time::advance(Duration::from_secs(1)).await;
    // The probe finds the store slow; its caller gives up before the deadline.
    store.set(Mode::Hanging);
    assert!(tokio::time::timeout(Duration::from_millis(10), limiter.check("a")).await.is_err());
    let calls = store.checks();
    store.set(Mode::Up);
    let v = limiter.check("a").await;
    assert!(v.is_allowed() && v.store_error().is_none(), "the circuit stayed open: {v:?}");
    assert_eq!(store.checks(), calls + 1, "the store was not asked again");
}

// 2. A refund gave back the wrong units: it ran at the time of the refund and did not know
//    what its commit took.

#[tokio::test]
async fn a_refund_after_the_boundary_leaves_the_new_window_alone() {
    let clock = ManualClock::new(T0);
    let edge = (T0 / (60 * SEC) + 1) * 60 * SEC;
    // (algorithm, how many fit 45 s into the new window, how many more after A's refund)
    for (algorithm, fit, more) in [(Algorithm::FixedWindow, 4, 0), (Algorithm::SlidingWindowCounter, 3, 1)] {
        // `k!` is key `k` at cost 2.
        let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .rule("r", Quota::per_minute(4), |u: &str| user(u.trim_end_matches('!')))
            .algorithm(algorithm)
            .cost(|u: &str| if u.ends_with('!') { 2 } else { 1 })
            .build()
            .unwrap();
        clock.set(edge - 10 * SEC);
        let a = limiter.check("k!").await; // 2 units, 10 s before the boundary
        assert!(a.is_allowed());
        clock.set(edge + 45 * SEC);
        // Fixed window: a fresh count of 4. Sliding counter: A's 2 are `prev` now,
        // weighing 2 × 15/60 = 0.5, so 3 fit.
        let mut n = 0;
        while limiter.check("k").await.is_allowed() {
            n += 1;
        }
        assert_eq!(n, fit, "{algorithm}");
        // A is given back now: its units are the old window's (fixed window: nothing to
        // give) or `prev` (sliding counter: the 0.5 goes, one more fits). Taken from the
        // new window's count, as it used to be, 2 more would fit.
        limiter.refund(a).await.unwrap();
        let mut n = 0;
        while limiter.check("k").await.is_allowed() {
            n += 1;
        }
        assert_eq!(n, more, "{algorithm}");
    }
}

#[tokio::test]
async fn sliding_log_refund_gives_back_its_own_units_only() {
    let clock = ManualClock::new(T0);
    sliding_log_refund_example(MemoryStore::with_clock(clock.clone()), &clock).await;
}

#[tokio::test]
async fn a_slow_handlers_refund_after_the_boundary_keeps_later_failures_counted() {
    // A login limit counting failures only: 2 a minute, fixed window.
    let clock = ManualClock::new(T0);
    let edge = (T0 / (60 * SEC) + 1) * 60 * SEC;
    let go = Arc::new(Notify::new());
    let svc = RateLimitLayer::<_, Body>::builder(MemoryStore::with_clock(clock.clone()))
        .add_rule(
            Rule::new("login", Quota::per_minute(2), key::Global)
                .algorithm(Algorithm::FixedWindow)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap()
        .layer(app(go.clone()));
    clock.set(edge - SEC);
    // A successful login whose handler is slow: it answers after the boundary.
    let slow = tokio::spawn(svc.clone().oneshot(get("/slow")));
    settle().await;
    clock.set(edge + SEC);
    assert_eq!(svc.clone().oneshot(get("/fail")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    go.notify_one();
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
    settle().await;
    // The slow request's unit belonged to the old window: the failure after the
    // boundary still counts, so only one more failure fits.
    assert_eq!(svc.clone().oneshot(get("/fail")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    settle().await;
    assert_eq!(svc.clone().oneshot(get("/fail")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

// 4 and 5. The fallback limiter's decisions are its own: its rejections never enter the
// blocked-key cache, and its units are given back to it.

fn fallback_limiter(store: Remote, quota: Quota) -> Limiter<Remote, str> {
    Limiter::builder(store)
        .rule("r", quota, user)
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)), 2)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap()
}

#[tokio::test]
async fn fallback_rejections_end_with_the_outage() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = fallback_limiter(store.clone(), Quota::per_hour(4));
    store.set(Mode::Failing);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(limiter.check("k").await);
    }
    assert_eq!(got.iter().map(tollgate::Verdict::is_allowed).collect::<Vec<_>>(), [true, true, false]);
    assert_eq!(got[2].decided_by(), Some(DecidedBy::Fallback));
    assert!(got[2].retry_after().is_some_and(|r| r > Duration::from_secs(60)));
    // Redis is back: the key has used nothing there, and the store must be asked.
    store.set(Mode::Up);
    let calls = store.checks();
    let v = limiter.check("k").await;
    assert_eq!(store.checks(), calls + 1, "the fallback's rejection was served from the cache");
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Store), "{v:?}");
}

#[tokio::test]
async fn a_fallback_decision_is_refunded_to_the_fallback() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = fallback_limiter(store.clone(), Quota::per_hour(2));
    store.set(Mode::Failing);
    let a = limiter.check("k").await;
    assert!(a.is_allowed() && a.decided_by() == Some(DecidedBy::Fallback));
    assert!(limiter.check("k").await.is_rejected(), "1 an hour for each of 2 servers");
    limiter.refund(a).await.unwrap();
    assert!(store.refunds().is_empty(), "the store was refunded units it never took: {:?}", store.refunds());
    assert!(limiter.check("k").await.is_allowed(), "the fallback did not get its unit back");
}

// 7. Two layers over one store with one rule name shared their counts.

#[test]
fn two_layers_over_one_store_cannot_share_a_rule_name() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let search = RateLimitLayer::<_, Body>::new(Quota::per_minute(3), key::Global, store.clone());
    let err = catch_unwind(AssertUnwindSafe(|| {
        RateLimitLayer::<_, Body>::new(Quota::per_minute(100), key::Global, store.clone())
    }))
    .expect_err("a second layer named \"default\" on the same store");
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("\"default\"") && msg.contains("builder(store).rule("), "{msg}");
    let err = RateLimitLayer::<_, Body>::builder(store.clone()).rule("default", Quota::per_day(1), key::Global).build();
    let err = err.unwrap_err();
    assert!(matches!(&err, BuildError::RuleInUse { rule, .. } if rule == "default"), "{err}");
    assert!(err.to_string().contains("RateLimitLayer::builder(store)"), "the hint names what was built: {err}");
    // A limiter's hint names the limiter's builder, not the layer's.
    let err =
        tollgate::Limiter::<_, str>::builder(store.clone()).rule("default", Quota::per_day(1), key::Global).build();
    let err = err.unwrap_err().to_string();
    assert!(err.contains("Limiter::builder(store)") && !err.contains("RateLimitLayer::builder"), "{err}");
    // Clones of one layer share its limiter; other stores and other names are fine.
    let _again = search.clone().layer(app(Arc::default()));
    let _other = RateLimitLayer::<_, Body>::new(Quota::per_minute(3), key::Global, MemoryStore::new());
    let upload = RateLimitLayer::<_, Body>::builder(store.clone()).rule("upload", Quota::per_minute(100), key::Global);
    assert!(upload.build().is_ok());
    // Once a layer is gone, its names are free again.
    drop((search, _again));
    let _ = RateLimitLayer::<_, Body>::new(Quota::per_minute(3), key::Global, store);
}

#[tokio::test]
async fn named_rules_on_two_routes_keep_their_own_counts() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let layer = |name: &str, q| {
        RateLimitLayer::<_, Body>::builder(store.clone())
            .rule(name, q, key::Global)
            .build()
            .unwrap()
            .layer(app(Arc::default()))
    };
    let (upload, search) = (layer("upload", Quota::per_minute(100)), layer("search", Quota::per_minute(3)));
    for _ in 0..5 {
        assert_eq!(upload.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(
            search.clone().oneshot(get("/")).await.unwrap().status(),
            StatusCode::OK,
            "/upload used /search's limit"
        );
    }
    assert_eq!(search.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

// 9. A delayed leaky-bucket request that was cancelled kept its slot.

#[tokio::test(start_paused = true)]
async fn a_cancelled_delayed_request_gives_back_its_slot() {
    let started = Instant::now();
    let forwarded = Arc::new(Mutex::new(Vec::new()));
    let f = forwarded.clone();
    let inner = tower::service_fn(move |req: Request<Body>| {
        f.lock().unwrap().push((req.uri().path().to_owned(), started.elapsed().as_millis()));
        async { Ok::<_, Infallible>(Response::new(Body::empty())) }
    });
    let svc =
        RateLimitLayer::new(Quota::per_second(5).burst(3), key::Global, MemoryStore::with_clock(TokioClock::new()))
            .algorithm(Algorithm::LeakyBucket)
            .layer(inner);
    assert_eq!(svc.clone().oneshot(get("/a")).await.unwrap().status(), StatusCode::OK); // slot 0
    let b = tokio::spawn(svc.clone().oneshot(get("/b"))); // slot 200 ms
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.abort(); // the client left while waiting
    let _ = b.await;
    settle().await;
    assert_eq!(svc.clone().oneshot(get("/c")).await.unwrap().status(), StatusCode::OK);
    let times = forwarded.lock().unwrap().clone();
    assert_eq!(times, [("/a".to_owned(), 0), ("/c".to_owned(), 200)], "C got a slot after B's ghost");
}

// 11. The fallback rebuilt quotas with `Quota::burst`, which could panic at request time.

#[tokio::test]
async fn the_fallback_never_panics_on_a_quota_the_builder_accepted() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = fallback_limiter(store.clone(), Quota::per_day(3).try_burst(150_000).unwrap());
    store.set(Mode::Failing);
    let v = limiter.check("k").await;
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
}

// 12. `count_if` on a shadow rule was ignored.

#[tokio::test]
async fn count_if_applies_to_shadow_rules_too() {
    let layer = RateLimitLayer::<_, Body>::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .add_rule(
            Rule::new("trial", Quota::per_minute(1), key::Global)
                .shadow(true)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let svc = layer.clone().layer(app(Arc::default()));
    for _ in 0..3 {
        assert_eq!(svc.clone().oneshot(get("/ok")).await.unwrap().status(), StatusCode::OK);
        settle().await;
    }
    let d = layer.peek("trial", "global").await.unwrap().unwrap();
    assert!(d.allowed, "successes were counted by the shadow rule: {d:?}");
    assert_eq!(svc.clone().oneshot(get("/fail")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    settle().await;
    assert!(!layer.peek("trial", "global").await.unwrap().unwrap().allowed, "the failure counts");
}

// 13 and 15. Header values, read back with a structured-field parser.

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

#[tokio::test]
async fn on_a_429_retry_after_t_and_reset_name_one_moment() {
    let clock = ManualClock::new(T0);
    let svc = RateLimitLayer::new(Quota::per_hour(10), key::Global, MemoryStore::with_clock(clock.clone()))
        .algorithm(Algorithm::Gcra)
        .headers(HeaderStyle::Both)
        .layer(app(Arc::default()));
    for _ in 0..10 {
        assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::OK);
    }
    clock.advance(Duration::from_secs(2));
    let no = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = no.headers();
    let retry: u64 = h[http::header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert_eq!(retry, 358, "one every 360 s; 2 s have passed");
    let t = sf_params(&h["ratelimit"])[0].1.iter().find(|(k, _)| k == "t").unwrap().1;
    assert_eq!(t, 358, "t and Retry-After disagree (t used to be the full reset, 3598)");
    let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert!(reset.abs_diff(unix_now() + 358) <= 1, "X-RateLimit-Reset {reset}");
}

#[tokio::test]
async fn on_a_2xx_t_and_reset_name_when_more_quota_comes() {
    let clock = ManualClock::new(T0);
    let svc = RateLimitLayer::new(Quota::per_minute(3), key::Global, MemoryStore::with_clock(clock.clone()))
        .algorithm(Algorithm::SlidingWindowLog)
        .headers(HeaderStyle::Both)
        .layer(app(Arc::default()));
    svc.clone().oneshot(get("/")).await.unwrap();
    clock.advance(Duration::from_secs(15));
    let ok = svc.clone().oneshot(get("/")).await.unwrap();
    let h = ok.headers();
    // The first unit leaves the window 45 s from now: one more fits then.
    let params = &sf_params(&h["ratelimit"])[0].1;
    assert_eq!(params, &[("r".to_owned(), 1), ("t".to_owned(), 45)]);
    let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert!(reset.abs_diff(unix_now() + 45) <= 1, "X-RateLimit-Reset {reset}");
}

#[tokio::test]
async fn a_policy_of_a_sub_second_period_states_its_rate() {
    let svc = RateLimitLayer::new(Quota::new(1, Duration::from_millis(250)), key::Global, MemoryStore::new())
        .headers(HeaderStyle::Ietf)
        .layer(app(Arc::default()));
    let ok = svc.oneshot(get("/")).await.unwrap();
    let policy = sf_params(&ok.headers()["ratelimit-policy"]);
    assert_eq!(policy, [("default".to_owned(), vec![("q".to_owned(), 4), ("w".to_owned(), 1)])], "1/250ms was q=1;w=1");
}

// Probable, confirmed: a leaky-bucket delay held the inner service's readiness, so one
// throttled key starved every other behind a backpressured service.

#[tokio::test(start_paused = true)]
async fn a_delayed_request_does_not_hold_the_inner_services_readiness() {
    let inner = tower::limit::ConcurrencyLimit::new(app(Arc::default()), 1);
    let svc = RateLimitLayer::new(
        Quota::per_second(1).burst(3),
        key::header("x-key"),
        MemoryStore::with_clock(TokioClock::new()),
    )
    .algorithm(Algorithm::LeakyBucket)
    .layer(inner);
    let started = Instant::now();
    svc.clone().oneshot(keyed("/", "slow")).await.unwrap();
    let delayed = tokio::spawn(svc.clone().oneshot(keyed("/", "slow"))); // waits 1 s for its slot
    settle().await;
    let other = tokio::time::timeout(Duration::from_millis(500), svc.clone().oneshot(keyed("/", "fast")))
        .await
        .expect("another key waited for the delayed one's readiness")
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::ZERO, "another key waited for the delayed one");
    assert_eq!(delayed.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

// Probable, confirmed: a count-by-outcome rule kept its unit when the handler failed or
// its future was dropped (there is no status to count).

#[tokio::test(start_paused = true)]
async fn count_if_units_come_back_when_the_handler_fails_or_is_dropped() {
    let inner = tower::service_fn(|req: Request<Body>| async move {
        match req.uri().path() {
            "/hang" => std::future::pending().await,
            "/err" => Err(std::io::Error::other("handler failed")),
            "/fail" => Ok(Response::builder().status(StatusCode::UNAUTHORIZED).body(Body::empty()).unwrap()),
            _ => Ok(Response::new(Body::empty())),
        }
    });
    let svc = RateLimitLayer::<_, Body>::builder(MemoryStore::with_clock(TokioClock::new()))
        .add_rule(Rule::new("login", Quota::per_minute(2), key::Global).count_if(|s| s == StatusCode::UNAUTHORIZED))
        .build()
        .unwrap()
        .layer(inner);
    for _ in 0..3 {
        assert!(tokio::time::timeout(Duration::from_millis(10), svc.clone().oneshot(get("/hang"))).await.is_err());
        settle().await;
        assert!(svc.clone().oneshot(get("/err")).await.is_err());
        settle().await;
    }
    settle().await;
    let statuses: Vec<StatusCode> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(svc.clone().oneshot(get("/fail")).await.unwrap().status());
            settle().await;
        }
        v
    };
    assert_eq!(statuses, [StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS]);
}

// The second review (one test per finding; each failed before its fix).

// R2. A token bucket's or GCRA's refund after the bucket had refilled gave the tokens a
// second time: more than the burst at one instant.

#[tokio::test]
async fn a_late_bucket_refund_never_lets_more_than_the_burst_through() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let clock = ManualClock::new(T0);
        let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .rule("jobs", Quota::per_minute(1).burst(2), user)
            .algorithm(algorithm)
            .build()
            .unwrap();
        let a = limiter.check("ada").await;
        assert!(a.is_allowed());
        clock.advance(Duration::from_secs(60)); // a's token has refilled
        let mut at_once = 0;
        while limiter.check("ada").await.is_allowed() {
            at_once += 1;
        }
        assert_eq!(at_once, 2, "{algorithm}: the burst");
        limiter.refund(a).await.unwrap();
        assert!(limiter.check("ada").await.is_rejected(), "{algorithm}: a third request at one instant, burst 2");

        // A refund in time gives back what its commit still holds back. With no commit
        // since (d comes at the same instant as b), all of it, even 20 s later (a slow
        // handler's count-by-outcome refund).
        let (b, c) = (limiter.check("bob").await, limiter.check("bob").await);
        assert!(b.is_allowed() && c.is_allowed() && limiter.check("bob").await.is_rejected());
        limiter.refund(c).await.unwrap();
        assert!(limiter.check("bob").await.is_allowed(), "{algorithm}: an immediate refund gave nothing back");
        clock.advance(Duration::from_secs(20));
        limiter.refund(b).await.unwrap();
        assert!(limiter.check("bob").await.is_allowed(), "{algorithm}: a late refund gave too little back");
        let v = limiter.check("bob").await;
        assert_eq!(v.retry_after(), Some(Duration::from_secs(40)), "{algorithm}: b's whole token came back");

        // A commit made 20 s after e bounds e's refund to the 40 s of cells e still held
        // back then: without e, f and g fill the bucket, and the next one is a minute
        // away (the whole token back would make it 40 s).
        let e = limiter.check("carol").await;
        clock.advance(Duration::from_secs(20));
        assert!(limiter.check("carol").await.is_allowed(), "{algorithm}: f");
        limiter.refund(e).await.unwrap();
        assert!(limiter.check("carol").await.is_allowed(), "{algorithm}: g");
        let v = limiter.check("carol").await;
        assert_eq!(v.retry_after(), Some(Duration::from_secs(60)), "{algorithm}: a partial refund gave too much back");
    }
}

// R3. Shadow rules kept what they took for requests another rule refused: a shadow rule
// counting only 401s was charged for 429s, and a plain one counted requests that never
// happened (an enforced rule in its place would have taken nothing).

#[tokio::test]
async fn a_refused_request_takes_nothing_from_shadow_rules() {
    let layer = RateLimitLayer::<_, Body>::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("strict", Quota::per_minute(1), key::Global)
        .add_rule(
            Rule::new("logins", Quota::per_minute(3), key::Global)
                .shadow(true)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .add_rule(Rule::new("candidate", Quota::per_minute(10), key::Global).shadow(true))
        .build()
        .unwrap();
    let svc = layer.clone().layer(app(Arc::new(Notify::new())));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(svc.clone().oneshot(get("/ok")).await.unwrap().status());
        settle().await;
    }
    assert_eq!(statuses[0], StatusCode::OK);
    assert!(statuses[1..].iter().all(|&s| s == StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
    // No 401: the 401 counter holds nothing (a peek reports the room after one more).
    let logins = layer.peek("logins", "global").await.unwrap().unwrap();
    assert_eq!(logins.remaining, 2, "the shadow 401-counter was charged: {logins:?}");
    // One request happened: the candidate limit counted it alone.
    let candidate = layer.peek("candidate", "global").await.unwrap().unwrap();
    assert_eq!(candidate.remaining, 8, "the shadow rule counted refused requests: {candidate:?}");
}

// R4. A clock step back of 2 ms across a window boundary wiped a fixed window's and a
// sliding counter's state (their stored window was "in the future"): 15 and 10 admitted
// within 3 ms at 5/min.

#[tokio::test]
async fn a_small_step_back_across_a_boundary_keeps_the_counts() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog] {
        let edge = (T0 / 60_000_000 + 1) * 60_000_000;
        let clock = ManualClock::new(edge + 1_000);
        let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
            .rule("r", Quota::per_minute(5), user)
            .algorithm(algorithm)
            .build()
            .unwrap();
        let mut admitted = 0;
        for t in [edge + 1_000, edge - 1_000, edge + 2_000] {
            clock.set(t);
            while limiter.check("k").await.is_allowed() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5, "{algorithm}: admitted within 3 ms at 5/min");
    }
}

// R5. A 429 answered by the blocked-key cache said `remaining: 0` where the store's 429
// for the same request had said 2.

#[tokio::test]
async fn a_cached_429_says_what_the_stores_429_said() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::<_, Body>::builder(store.clone())
        .rule("per-user", Quota::per_hour(5), key::Global)
        .build()
        .unwrap()
        .cost(|_| 3)
        .headers(HeaderStyle::Both);
    let svc = layer.layer(app(Arc::new(Notify::new())));
    let mut seen = Vec::new();
    for _ in 0..3 {
        let res = svc.clone().oneshot(get("/")).await.unwrap();
        let h = |n: &str| res.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        seen.push((res.status(), h("x-ratelimit-remaining"), h("retry-after"), h("ratelimit"), h("x-ratelimit-reset")));
    }
    assert_eq!(seen[0].0, StatusCode::OK);
    assert_eq!(seen[1].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.checks(), 2, "the third request was answered by the cache");
    assert_eq!(seen[1].1.as_deref(), Some("2"), "the store's 429: 2 units left, 3 asked");
    assert_eq!(seen[2], seen[1], "the cache's 429 differs from the store's");
}

// Nested layers (issue 27): the README's `.route_layer(login)` inside `.layer(api)`. The
// outer layer's headers used to overwrite the inner one's: a login 429 said `ip` 86/100
// and a reset ten seconds away while `Retry-After` said an hour.

/// An axum app: `/login` answers 401 (a failed login) behind a login limit of 5 that
/// counts 401s and blocks for an hour; every route behind a per-IP limit of 100.
fn nested(style: HeaderStyle) -> axum::Router {
    let store = MemoryStore::new();
    let login = RateLimitLayer::builder(store.clone())
        .add_rule(
            Rule::new("login", Quota::per_minute(5), key::Global)
                .count_if(|status| status == StatusCode::UNAUTHORIZED)
                .block_for(Duration::from_secs(3600)),
        )
        .build()
        .unwrap()
        .headers(style);
    let api = RateLimitLayer::builder(store)
        .rule("ip", Quota::per_minute(100), key::Global)
        .build()
        .unwrap()
        .algorithm(Algorithm::SlidingWindowLog)
        .headers(style);
    axum::Router::new()
        .route("/login", axum::routing::post(|| async { StatusCode::UNAUTHORIZED }))
        .route_layer(login)
        .route("/items", axum::routing::get(|| async { "items" }))
        .layer(api)
}

fn post(path: &str) -> Request<Body> {
    Request::post(path).body(Body::empty()).unwrap()
}

fn unix_header(h: &http::HeaderMap, name: &str) -> u64 {
    h[name].to_str().unwrap().parse().unwrap()
}

/// The legacy headers describe the most restrictive rule of both layers; an inner 429's
/// `Retry-After` and `X-RateLimit-Reset` are never contradicted.
#[tokio::test]
async fn nested_layers_describe_the_most_restrictive_rule_of_both() {
    let app = nested(HeaderStyle::Legacy);
    // A 401 from /login: login has 4 of 5 left, ip 99 of 100 — login is the tighter one.
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let h = res.headers();
    assert_eq!(h["x-ratelimit-remaining"], "4");
    assert_eq!(h["x-ratelimit-limit"], "5");
    // The login layer has one rule, so it names none; the outer one never names its own
    // over headers it did not write.
    assert!(h.get("x-ratelimit-rule").is_none(), "{h:?}");
    // /items has only the ip rule: its own headers, as before.
    let res = app.clone().oneshot(get("/items")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "98");
    for _ in 0..4 {
        app.clone().oneshot(post("/login")).await.unwrap();
    }
    // The sixth failed login: refused by the inner layer and blocked for an hour.
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = res.headers();
    let retry = unix_header(h, "retry-after");
    assert!((3590..=3600).contains(&retry), "Retry-After {retry}");
    assert!(h.get("x-ratelimit-rule").is_none(), "the outer layer named its own rule over a 429: {h:?}");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    let reset = unix_header(h, "x-ratelimit-reset");
    assert!(reset.abs_diff(unix_now() + retry) <= 1, "X-RateLimit-Reset {reset} contradicts Retry-After {retry}");
    // The outer rule is the tighter one: its headers, naming it.
    let app = nested(HeaderStyle::Legacy);
    for _ in 0..98 {
        app.clone().oneshot(get("/items")).await.unwrap();
    }
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    let h = res.headers();
    assert_eq!(h["x-ratelimit-rule"], "ip");
    assert_eq!(h["x-ratelimit-remaining"], "1");
    assert_eq!(h["x-ratelimit-limit"], "100");
}

/// The IETF headers of nested layers: `RateLimit-Policy` lists every policy of both,
/// `RateLimit` both rules, the most restrictive first (read with a structured-field
/// parser).
#[tokio::test]
async fn nested_layers_list_every_policy_and_the_tightest_rule_first() {
    let app = nested(HeaderStyle::Ietf);
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    let h = res.headers();
    let names = |v| sf_params(v).into_iter().map(|(name, _)| name).collect::<Vec<_>>();
    assert_eq!(names(&h["ratelimit-policy"]), ["login", "ip"]);
    let limits = sf_params(&h["ratelimit"]);
    assert_eq!(limits.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["login", "ip"]);
    assert_eq!(limits[0].1[0], ("r".to_owned(), 4));
    assert_eq!(limits[1].1[0], ("r".to_owned(), 99));
    // A route with the outer layer only: one policy, as before.
    let res = app.clone().oneshot(get("/items")).await.unwrap();
    assert_eq!(names(&res.headers()["ratelimit-policy"]), ["ip"]);
    // When the outer layer is the tighter one, it comes first.
    for _ in 0..97 {
        app.clone().oneshot(get("/items")).await.unwrap();
    }
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    let limits = sf_params(&res.headers()["ratelimit"]);
    assert_eq!(limits.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["ip", "login"], "{limits:?}");
    assert_eq!(limits[0].1[0], ("r".to_owned(), 0));
}
