//! The local blocked-key cache on a real Redis: a flood from one client that is over its
//! limit costs about one store call per `retry_after` instead of one per request, answers
//! exactly what the store would (429 with `Retry-After`), is never used for count-by-outcome
//! rules, and blocks no longer than `retry_after`. Store calls are counted by Redis itself
//! (`INFO commandstats`, `cmdstat_evalsha`).
#![cfg(feature = "redis")]

use crate::support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use support::redis::RedisServer;
use tollgate::{key, Algorithm, FailMode, Quota, RateLimitLayer, RedisStore, Rule};
use tower::{Layer, Service, ServiceExt};

/// Requests in each flood.
const N: u64 = 2_000;
/// Five an hour: once over it, `retry_after` is 12 minutes, longer than any test.
const HOURLY: Quota = Quota::per_hour(5);

async fn store_for(server: &RedisServer) -> RedisStore {
    // Generous timeouts: these tests count calls; a slow machine must not add errors.
    let store = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
    store.ping().await.unwrap();
    store
}

/// `calls=` of `cmdstat_evalsha` (0 before the first).
fn evalsha_calls(server: &RedisServer) -> u64 {
    server
        .cmd(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("cmdstat_evalsha:"))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |n| n.parse().unwrap())
}

fn reset_stats(server: &RedisServer) {
    assert_eq!(server.cmd(&["CONFIG", "RESETSTAT"]), "OK");
}

/// `layer` over a service that answers `status` and counts its calls. The layers are
/// built with a 2 s deadline and `FailMode::Closed`: store errors answer 503 (fail closed), so that no error can
/// pass for a decision.
fn service(
    layer: RateLimitLayer<RedisStore>,
    status: StatusCode,
    calls: &Arc<AtomicUsize>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone + Send + 'static {
    let calls = calls.clone();
    let inner = tower::service_fn(move |_req: Request<Body>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut res = Response::new(Body::empty());
        *res.status_mut() = status;
        async move { Ok::<_, Infallible>(res) }
    });
    layer.layer(inner)
}

fn get(key: &str) -> Request<Body> {
    Request::builder().header("x-api-key", key).body(Body::empty()).unwrap()
}

async fn send<S>(svc: &S, key: &str) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    let Ok(res) = svc.clone().oneshot(get(key)).await;
    res
}

fn header(res: &Response<Body>, name: &str) -> Option<u64> {
    res.headers().get(name).map(|v| v.to_str().unwrap().parse().unwrap())
}

/// A rejection as the store makes it for `HOURLY` once used up: 429, `Retry-After` within
/// the 12 minutes, nothing remaining of 5.
fn assert_hourly_rejection(res: &Response<Body>, what: &str) {
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
    let retry = header(res, "retry-after").unwrap_or_else(|| panic!("{what}: no Retry-After"));
    assert!((1..=720).contains(&retry), "{what}: Retry-After {retry} s");
    assert_eq!(header(res, "x-ratelimit-limit"), Some(5), "{what}");
    assert_eq!(header(res, "x-ratelimit-remaining"), Some(0), "{what}");
}

/// Uses up `HOURLY` for `key`: 5 requests, all passed to the inner service.
async fn use_up<S>(svc: &S, key: &str)
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    for i in 0..5 {
        assert_eq!(send(svc, key).await.status(), StatusCode::OK, "{key}: request {i} of 5");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_over_the_limit_costs_one_store_call_per_retry_after_with_the_cache_and_one_per_request_without() {
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let mut calls_per_mode = Vec::new();
    for cache in [true, false] {
        let what = if cache { "cache on" } else { "cache off" };
        let key = format!("flooder-{what}");
        let inner = Arc::new(AtomicUsize::new(0));
        let layer = RateLimitLayer::builder(store.clone())
            .rule("default", HOURLY, key::header("x-api-key"))
            .algorithm(Algorithm::Gcra)
            .local_cache(cache)
            .timeout(Duration::from_secs(2))
            .fail_mode(FailMode::Closed)
            .build()
            .unwrap();
        let svc = service(layer, StatusCode::OK, &inner);
        use_up(&svc, &key).await;

        reset_stats(&server);
        for i in 0..N {
            assert_hourly_rejection(&send(&svc, &key).await, &format!("{what}, request {i}"));
        }
        let calls = evalsha_calls(&server);
        assert_eq!(inner.load(Ordering::SeqCst), 5, "{what}: the inner service saw only the accepted requests");
        calls_per_mode.push(calls);
    }
    let [on, off] = calls_per_mode[..] else { unreachable!() };
    // The first rejection asks the store and is remembered for its 12-minute retry_after.
    assert!(on <= 2, "cache on: {on} store calls for {N} requests of a blocked key");
    assert_eq!(off, N, "cache off: one store call per request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_flood_reaches_the_store_at_most_once_per_request_in_flight() {
    const IN_FLIGHT: u64 = 32;
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let inner = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::builder(store)
        .rule("default", HOURLY, key::header("x-api-key"))
        .algorithm(Algorithm::Gcra)
        .timeout(Duration::from_secs(2))
        .fail_mode(FailMode::Closed)
        .build()
        .unwrap();
    let svc = service(layer, StatusCode::OK, &inner);
    use_up(&svc, "crowd").await;

    reset_stats(&server);
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (svc, next) = (svc.clone(), next.clone());
            tokio::spawn(async move {
                while (next.fetch_add(1, Ordering::SeqCst) as u64) < N {
                    assert_hourly_rejection(&send(&svc, "crowd").await, "concurrent flood");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let calls = evalsha_calls(&server);
    // Only requests sent before the first rejection came back can miss the cache.
    assert!((1..=IN_FLIGHT).contains(&calls), "{calls} store calls for {N} requests, {IN_FLIGHT} in flight");
    assert_eq!(inner.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_if_rules_are_never_served_by_the_cache() {
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let inner = Arc::new(AtomicUsize::new(0));
    // Only failed logins count: each 401 keeps its unit; a rejection is not final, since
    // units may be given back.
    let layer = RateLimitLayer::builder(store)
        .add_rule(
            Rule::new("login", HOURLY, key::header("x-api-key"))
                .algorithm(Algorithm::Gcra)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .timeout(Duration::from_secs(2))
        .fail_mode(FailMode::Closed)
        .build()
        .unwrap();
    let svc = service(layer, StatusCode::UNAUTHORIZED, &inner);
    for i in 0..5 {
        assert_eq!(send(&svc, "guesser").await.status(), StatusCode::UNAUTHORIZED, "attempt {i}");
    }

    reset_stats(&server);
    for i in 0..N {
        assert_hourly_rejection(&send(&svc, "guesser").await, &format!("count_if flood, request {i}"));
    }
    assert_eq!(evalsha_calls(&server), N, "every request of a count_if rule asks the store");
    assert_eq!(inner.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_admits_nothing_itself_and_blocks_no_longer_than_retry_after() {
    // 10 a second, GCRA: once the burst of 10 is used, one unit every 100 ms.
    const EVERY: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let inner = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::builder(store)
        .rule("default", Quota::per_second(10), key::header("x-api-key"))
        .algorithm(Algorithm::Gcra)
        .timeout(Duration::from_secs(2))
        .fail_mode(FailMode::Closed)
        .build()
        .unwrap();
    let svc = service(layer, StatusCode::OK, &inner);

    // Use up the burst: 10 pass (a few more on a slow machine, as units come back).
    let mut passed = 0;
    let rejected_at = loop {
        let res = send(&svc, "burst").await;
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(header(&res, "retry-after"), Some(1), "100 ms, rounded up to a second");
            break Instant::now();
        }
        assert_eq!(res.status(), StatusCode::OK);
        passed += 1;
        assert!(passed < 100, "the limit never rejected");
    };
    assert!(passed >= 10, "the burst of 10 passed: {passed}");

    // While blocked, the cache answers without the store — checked only when this machine
    // got here within the block (no timing is relied on).
    reset_stats(&server);
    let res = send(&svc, "burst").await;
    if rejected_at.elapsed() < EVERY / 2 {
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(evalsha_calls(&server), 0, "a blocked key was answered from the cache");
    }

    // Once retry_after (at most 100 ms) is over, the next request reaches the store and
    // passes: the cache does not block longer than the store would.
    tokio::time::sleep(EVERY * 3).await;
    reset_stats(&server);
    let res = send(&svc, "burst").await;
    assert_eq!(res.status(), StatusCode::OK, "after retry_after the key passes again");
    assert_eq!(evalsha_calls(&server), 1, "the request after retry_after asked the store");

    // A flood: every request that passes was admitted by the store (one store call each),
    // and no more pass than the quota lets through: since the first rejection, one unit per
    // 100 ms (+1 for the part of a unit left then, +1 for the time that rejection took to
    // come back).
    reset_stats(&server);
    let mut admitted = 1u64;
    for _ in 0..500 {
        let res = send(&svc, "burst").await;
        match res.status() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => assert!(res.headers().contains_key("retry-after")),
            other => panic!("unexpected {other}"),
        }
    }
    let since = rejected_at.elapsed();
    let units = u64::try_from(since.as_micros() / EVERY.as_micros()).unwrap() + 2;
    let calls = evalsha_calls(&server);
    assert!(admitted <= units, "{admitted} passed in the {since:?} since the first rejection, at one per 100 ms");
    assert!(calls >= admitted - 1, "{} passed in the flood but the store was asked {calls} times", admitted - 1);
    assert!(calls < 500, "the cache answered some of the flood: {calls} store calls");
}
