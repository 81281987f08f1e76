//! Leaky-bucket delays: a delayed request holds its slot only while it waits.

use crate::common::{app, get};
use crate::support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use support::fake::{settle, TokioClock};
use tokio::time::Instant;
use tollgate::key::{self};
use tollgate::{Algorithm, MemoryStore, Quota, RateLimitLayer};
use tower::{Layer, ServiceExt};

fn keyed(path: &str, key: &str) -> Request<Body> {
    Request::get(path).header("x-key", key).body(Body::empty()).unwrap()
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
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(TokioClock::new()))
        .rule("default", Quota::per_second(5).burst(3), key::Global)
        .algorithm(Algorithm::LeakyBucket)
        .build()
        .unwrap()
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

// Probable, confirmed: a leaky-bucket delay held the inner service's readiness, so one
// throttled key starved every other behind a backpressured service.

#[tokio::test(start_paused = true)]
async fn a_delayed_request_does_not_hold_the_inner_services_readiness() {
    let inner = tower::limit::ConcurrencyLimit::new(app(Arc::default()), 1);
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(TokioClock::new()))
        .rule("default", Quota::per_second(1).burst(3), key::header("x-key"))
        .algorithm(Algorithm::LeakyBucket)
        .build()
        .unwrap()
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
