//! Refunds: units come back to the window or bucket that took them, never to a later
//! one, whoever decided (store or fallback).

use crate::common::{app, get};
use crate::outage::fallback_limiter;
use crate::support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use support::fake::{settle, sliding_log_refund_example, Mode, Remote, TokioClock, T0};
use tokio::sync::Notify;
use tollgate::clock::ManualClock;
use tollgate::key::{self, Key};
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, Limiter, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};

const SEC: u64 = 1_000_000;

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
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
        // A is refunded now: its units are the old window's (fixed window: nothing to
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
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
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
// blocked-key cache, and its units are refunded to it.

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
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(TokioClock::new()))
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
// second time: more than the burst at one instant. (Since issue 40 such a refund is all
// or nothing.)

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

        // All or nothing (issue 40): a refund gives back all of its commit's units when no
        // commit was made on the key since, even 20 s later (a slow handler's
        // count-by-outcome refund), none otherwise.
        let (b, c) = (limiter.check("bob").await, limiter.check("bob").await);
        assert!(b.is_allowed() && c.is_allowed() && limiter.check("bob").await.is_rejected());
        limiter.refund(c).await.unwrap();
        let d = limiter.check("bob").await;
        assert!(d.is_allowed(), "{algorithm}: an immediate refund gave nothing back");
        clock.advance(Duration::from_secs(20));
        limiter.refund(d).await.unwrap();
        assert!(
            limiter.check("bob").await.is_allowed(),
            "{algorithm}: a late refund, no commit since, gave too little back"
        );
        // b's commit has others since: its refund gives nothing (it used to give back the
        // 40 s of cells b still held back, less the time to the latest commit).
        limiter.refund(b).await.unwrap();
        let v = limiter.check("bob").await;
        assert_eq!(
            v.retry_after(),
            Some(Duration::from_secs(40)),
            "{algorithm}: a refund after later commits gave something back"
        );

        // e, then f 20 s later: e's refund gives nothing back, so g is refused until the
        // cells of e and f have drained to one free token, 40 s on (the old partial
        // refund gave back the 40 s e still held back, and admitted g).
        let e = limiter.check("carol").await;
        clock.advance(Duration::from_secs(20));
        assert!(limiter.check("carol").await.is_allowed(), "{algorithm}: f");
        limiter.refund(e).await.unwrap();
        let g = limiter.check("carol").await;
        assert_eq!(
            g.retry_after(),
            Some(Duration::from_secs(40)),
            "{algorithm}: a refund after another commit gave something back"
        );
    }
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
