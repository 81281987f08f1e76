//! The response future's states (unpolled, running the inner call, answered) with
//! count-by-outcome, charged and leaky-bucket rules side by side: what each state holds,
//! gives back and charges, whether it is dropped, the handler fails, panics or answers.

use crate::support;

use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use support::fake::{settle, TokioClock};
use tollgate::{key, Algorithm, Charge, Decision, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, Service, ServiceExt};

fn get(path: &str, key: &str) -> Request<Body> {
    Request::get(path).header("x-key", key).body(Body::empty()).unwrap()
}

/// `/hang` never answers, `/fail` is 401, `/panic` panics in its future, `/charge` charges
/// 5, `/err` is an error; each response says whether the handler saw a `Decision`.
fn inner() -> impl Service<Request<Body>, Response = Response<Body>, Error = &'static str, Future: Send> + Clone {
    tower::service_fn(|req: Request<Body>| async move {
        let seen = req.extensions().get::<Decision>().map(|d| d.remaining().to_string()).unwrap_or_default();
        let mut res = Response::builder().header("x-seen", seen).body(Body::empty()).unwrap();
        match req.uri().path() {
            "/hang" => std::future::pending().await,
            "/fail" => *res.status_mut() = StatusCode::UNAUTHORIZED,
            "/panic" => panic!("the handler panicked"),
            "/charge" => drop(res.extensions_mut().insert(Charge(5))),
            "/err" => return Err("the handler failed"),
            _ => {}
        }
        Ok(res)
    })
}

/// Every state of the future, in process: dropped unpolled (nothing taken), dropped
/// during the inner call (counts; the count-by-outcome unit back, no charge), an inner
/// error, a panic, a `Charge`, a 401. The boxed path's tests below run the same.
#[tokio::test(start_paused = true)]
async fn every_state_of_the_future_with_count_if_and_charged_rules() {
    every_state_on(MemoryStore::with_clock(TokioClock::new())).await;
}

/// A leaky bucket (the boxed path) next to in-process rules, count_if included.
#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_beside_count_if_rules() {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(TokioClock::new()))
        .add_rule(Rule::new("shape", Quota::per_second(5).burst(4), key::Global).algorithm(Algorithm::LeakyBucket))
        .add_rule(
            Rule::new("login", Quota::per_minute(3), key::header("x-key")).count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let svc = layer.clone().layer(inner());
    assert_eq!(svc.clone().oneshot(get("/fail", "a")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    // Waits 200 ms for its slot, then hangs in the handler: dropped at 300 ms.
    let r = tokio::time::timeout(Duration::from_millis(300), svc.clone().oneshot(get("/hang", "a"))).await;
    assert!(r.is_err());
    settle().await;
    assert_eq!(layer.peek("login", "a").await.unwrap().remaining(), 1);
    let res = svc.clone().oneshot(get("/fail", "a")).await.unwrap();
    assert_eq!(res.headers()["x-seen"], "1");
    settle().await;
    assert_eq!(layer.peek("login", "a").await.unwrap().remaining(), 0);
}

// ---------------------------------------------------------------------------------------
// The boxed path: the same states behind a remote store's decision, and behind a leaky
// bucket's slot on a remote store.

use support::fake::{Mode, Remote};
use tollgate::store::Store;

/// Three rules of one key: `count` counts every request, `login` only 401s, `tokens` is
/// charged (100 a minute).
fn three_rules_on<St: Store>(store: St) -> RateLimitLayer<St> {
    RateLimitLayer::builder(store)
        .rule("count", Quota::per_minute(3), key::header("x-key"))
        .add_rule(
            Rule::new("login", Quota::per_minute(3), key::header("x-key")).count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .add_rule(Rule::new("tokens", Quota::per_minute(100), key::header("x-key")).charged())
        .build()
        .unwrap()
}

async fn left_on<St: Store>(layer: &RateLimitLayer<St>, key: &str) -> (u64, u64, u64) {
    let r = |rule| async move { layer.peek(rule, key).await.unwrap().remaining() };
    (r("count").await, r("login").await, r("tokens").await)
}

/// Lets detached refunds and charges finish, a relayed store's too (it answers within 1 ms).
async fn relayed() {
    settle().await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    settle().await;
}

async fn every_state_on<St: Store + Clone>(store: St) -> RateLimitLayer<St> {
    let layer = three_rules_on(store);
    let mut svc = layer.clone().layer(inner());
    assert_eq!(left_on(&layer, "a").await, (2, 2, 99));
    // Dropped before its first poll: nothing kept (in process the lease gives its units
    // back; on the boxed path the store was not even asked).
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    drop(svc.call(get("/charge", "a")));
    relayed().await;
    assert_eq!(left_on(&layer, "a").await, (2, 2, 99), "dropped unpolled");
    let r = tokio::time::timeout(Duration::from_millis(10), svc.clone().oneshot(get("/hang", "a"))).await;
    assert!(r.is_err());
    relayed().await;
    assert_eq!(left_on(&layer, "a").await, (1, 2, 99), "dropped in the inner call");
    assert_eq!(svc.clone().oneshot(get("/err", "a")).await.unwrap_err(), "the handler failed");
    relayed().await;
    assert_eq!(left_on(&layer, "a").await, (0, 2, 99), "an inner error");
    let panicked = tokio::spawn(svc.clone().oneshot(get("/panic", "b"))).await;
    assert!(panicked.unwrap_err().is_panic());
    relayed().await;
    assert_eq!(left_on(&layer, "b").await, (1, 2, 99), "a panic in the handler");
    let res = svc.clone().oneshot(get("/charge", "c")).await.unwrap();
    assert_eq!(res.headers()["x-seen"], "2");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    relayed().await;
    assert_eq!(left_on(&layer, "c").await, (1, 2, 94), "a charge");
    let res = svc.clone().oneshot(get("/fail", "c")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    relayed().await;
    assert_eq!(left_on(&layer, "c").await, (0, 1, 94), "a 401");
    layer
}

#[tokio::test(start_paused = true)]
async fn every_state_of_the_boxed_future_on_a_remote_store() {
    let store = Remote::new(MemoryStore::with_clock(TokioClock::new()));
    every_state_on(store.clone()).await;
    assert!(store.checks() >= 6, "decided by the store: {}", store.checks());
}

#[tokio::test(start_paused = true)]
async fn every_state_of_the_boxed_future_on_a_relayed_remote_store() {
    let store = Remote::new(MemoryStore::with_clock(TokioClock::new()));
    store.set(Mode::Relayed(Duration::from_millis(1)));
    every_state_on(store).await;
}

#[tokio::test(start_paused = true)]
async fn every_state_of_the_future_behind_an_arc() {
    every_state_on(std::sync::Arc::new(MemoryStore::with_clock(TokioClock::new()))).await;
    every_state_on(std::sync::Arc::new(Remote::new(MemoryStore::with_clock(TokioClock::new())))).await;
}

/// A leaky bucket on a remote store with count_if and charged rules: the decision and the
/// slot are both waited in the boxed future.
#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_beside_count_if_and_charged_rules_on_a_remote_store() {
    let store = Remote::new(MemoryStore::with_clock(TokioClock::new()));
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("shape", Quota::per_second(5).burst(4), key::Global).algorithm(Algorithm::LeakyBucket))
        .add_rule(
            Rule::new("login", Quota::per_minute(3), key::header("x-key")).count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .add_rule(Rule::new("tokens", Quota::per_minute(100), key::header("x-key")).charged())
        .build()
        .unwrap();
    let svc = layer.clone().layer(inner());
    let peek = |rule: &'static str| {
        let layer = layer.clone();
        async move { layer.peek(rule, "a").await.unwrap().remaining() }
    };
    assert_eq!(svc.clone().oneshot(get("/fail", "a")).await.unwrap().status(), StatusCode::UNAUTHORIZED); // slot 0
    settle().await;
    assert_eq!(peek("login").await, 1);
    // Slot at 200 ms; dropped while waiting for it at 100 ms: everything back.
    let r = tokio::time::timeout(Duration::from_millis(100), svc.clone().oneshot(get("/fail", "a"))).await;
    assert!(r.is_err());
    settle().await;
    assert_eq!(peek("login").await, 1, "dropped during the slot wait");
    // Its slot is free again: the next leaves at 200 ms (100 ms from now), charges 5.
    let started = tokio::time::Instant::now();
    let res = svc.clone().oneshot(get("/charge", "a")).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(res.headers()["x-seen"], "1");
    settle().await;
    assert_eq!(peek("login").await, 1, "a 200 is not counted by login");
    assert_eq!(peek("tokens").await, 94, "charged 5");
    // Slot at 400 ms; hangs in the handler: dropped at 250 ms of waiting. Login's unit back.
    let r = tokio::time::timeout(Duration::from_millis(250), svc.clone().oneshot(get("/hang", "a"))).await;
    assert!(r.is_err());
    settle().await;
    assert_eq!(peek("login").await, 1, "dropped in the inner call after the slot");
    let res = svc.clone().oneshot(get("/fail", "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    settle().await;
    assert_eq!(peek("login").await, 0);
}

/// A remote store that fails: the fallback decides, on the boxed path, and holds the
/// units — each state gives back and keeps as the store's own decision would.
#[tokio::test(start_paused = true)]
async fn every_state_of_the_boxed_future_while_the_fallback_decides() {
    let store = Remote::new(MemoryStore::with_clock(TokioClock::new()));
    store.set(Mode::Failing);
    let layer = three_rules_on(store.clone());
    let fallback_left = |key: &'static str| {
        let layer = layer.clone();
        async move {
            // One more request's headers say what the fallback leaves (peek asks the store).
            let res = layer.clone().layer(inner()).oneshot(get("/", key)).await.unwrap();
            relayed().await;
            res.headers()["x-ratelimit-remaining"].to_str().unwrap().parse::<u64>().unwrap()
        }
    };
    let svc = layer.clone().layer(inner());
    let r = tokio::time::timeout(Duration::from_millis(10), svc.clone().oneshot(get("/hang", "a"))).await;
    assert!(r.is_err());
    relayed().await;
    // `count` kept its unit (1 + this one of 3 leaves 1).
    assert_eq!(fallback_left("a").await, 1, "dropped in the inner call");
    let res = svc.clone().oneshot(get("/fail", "b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "2");
    relayed().await;
    assert_eq!(fallback_left("b").await, 1);
    assert_eq!(svc.clone().oneshot(get("/err", "c")).await.unwrap_err(), "the handler failed");
    relayed().await;
    assert_eq!(fallback_left("c").await, 1);
}
