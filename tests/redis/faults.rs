//! Never the reason a request fails or hangs: the layer against real redis-server
//! processes that are killed, paused, restarted, flushed and overloaded.
//!
//! Each test prints the worst request latency it saw (`--nocapture` shows them).
#![cfg(feature = "redis")]

use crate::support;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate::{key, Algorithm, FailMode, Quota, RateLimitLayer, RedisStore, StoreError};
use tower::{Layer, ServiceExt};

use support::redis::{RedisCluster, RedisServer};

const DEADLINE: Duration = Duration::from_millis(50);
/// Scheduling slack on a busy 2-core machine.
const MARGIN: Duration = Duration::from_millis(150);

type Svc = tollgate::RateLimit<
    tower::util::ServiceFn<fn(Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>>>,
    RedisStore,
    tollgate::response::DefaultRejection,
>;

fn ok(_: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
    std::future::ready(Ok(Response::new(Body::empty())))
}

fn service(store: RedisStore, quota: Quota, mode: FailMode) -> Svc {
    RateLimitLayer::builder(store)
        .rule("default", quota, key::header("x-api-key"))
        .algorithm(Algorithm::Gcra)
        .fail_mode(mode)
        .timeout(DEADLINE)
        .circuit_breaker(3, Duration::from_millis(500))
        .local_cache(false)
        .build()
        .unwrap()
        .layer(tower::service_fn(ok as fn(_) -> _))
}

fn req(key: &str) -> Request<Body> {
    Request::get("/").header("x-api-key", key).body(Body::empty()).unwrap()
}

/// Sends one request; its status and how long it took.
async fn timed(svc: &Svc, key: &str) -> (StatusCode, Duration) {
    let started = Instant::now();
    let res = svc.clone().oneshot(req(key)).await.unwrap();
    (res.status(), started.elapsed())
}

/// Sends `n` requests; the statuses and the worst latency.
async fn burst(svc: &Svc, key: &str, n: usize) -> (Vec<StatusCode>, Duration) {
    let mut worst = Duration::ZERO;
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let (s, took) = timed(svc, key).await;
        worst = worst.max(took);
        statuses.push(s);
    }
    (statuses, worst)
}

fn count(statuses: &[StatusCode], code: StatusCode) -> usize {
    statuses.iter().filter(|s| **s == code).count()
}

/// Sends requests until one gets `code` (limiting has resumed), up to `within`.
async fn until_status(svc: &Svc, key: &str, code: StatusCode, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if timed(svc, key).await.0 == code {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "no {code} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fails_open_within_the_deadline_or_closed_with_503() {
    let mut redis = RedisServer::start();
    let open = service(RedisStore::from_url(&redis.url()).unwrap(), Quota::per_minute(5), FailMode::Open);
    let closed = service(RedisStore::from_url(&redis.url()).unwrap(), Quota::per_minute(5), FailMode::Closed);
    let (s, _) = burst(&open, "a", 7).await;
    assert_eq!(count(&s, StatusCode::TOO_MANY_REQUESTS), 2, "limiting works before the fault");
    redis.kill();
    let (s, worst) = burst(&open, "a", 50).await;
    assert_eq!(count(&s, StatusCode::OK), 50, "fail-open passes every request");
    assert!(worst < DEADLINE + MARGIN, "worst {worst:?}");
    let (s, worst_closed) = burst(&closed, "a", 20).await;
    assert_eq!(count(&s, StatusCode::SERVICE_UNAVAILABLE), 20);
    assert!(worst_closed < DEADLINE + MARGIN, "worst {worst_closed:?}");
    eprintln!("FAULT redis killed: worst latency fail-open {worst:?}, fail-closed {worst_closed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_never_hangs_and_limiting_resumes_after_sigcont() {
    let redis = RedisServer::start();
    let svc = service(RedisStore::from_url(&redis.url()).unwrap(), Quota::per_minute(3), FailMode::Open);
    assert_eq!(count(&burst(&svc, "p", 5).await.0, StatusCode::TOO_MANY_REQUESTS), 2);
    redis.pause();
    let (s, worst) = burst(&svc, "p", 30).await;
    assert_eq!(count(&s, StatusCode::OK), 30);
    assert!(worst < DEADLINE + MARGIN, "worst {worst:?}");
    // The breaker is open now: requests pay no store latency at all.
    let (_, worst_open) = burst(&svc, "p", 100).await;
    assert!(worst_open < Duration::from_millis(20), "open circuit still costs {worst_open:?}");
    redis.resume();
    let resumed = until_status(&svc, "p", StatusCode::TOO_MANY_REQUESTS, Duration::from_secs(5)).await;
    eprintln!(
        "FAULT redis paused: worst latency {worst:?} before the breaker opened, {worst_open:?} while open; \
         limiting resumed {resumed:?} after SIGCONT"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_on_the_same_port_and_script_flush() {
    let mut redis = RedisServer::start();
    let svc = service(RedisStore::from_url(&redis.url()).unwrap(), Quota::per_minute(3), FailMode::Closed);
    assert_eq!(count(&burst(&svc, "r", 5).await.0, StatusCode::TOO_MANY_REQUESTS), 2);
    // SCRIPT FLUSH: the next EVALSHA gets NOSCRIPT; no request may fail.
    redis.cmd(&["SCRIPT", "FLUSH"]);
    let (s, _) = burst(&svc, "r2", 5).await;
    assert_eq!((count(&s, StatusCode::OK), count(&s, StatusCode::TOO_MANY_REQUESTS)), (3, 2), "{s:?}");
    // Restart: empty state, scripts gone, connections broken.
    redis.restart();
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    loop {
        let (s, took) = timed(&svc, "r3").await;
        worst = worst.max(took);
        if s == StatusCode::OK {
            break;
        }
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() < Duration::from_secs(5), "no recovery after a restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = started.elapsed();
    let (s, _) = burst(&svc, "r3", 4).await;
    assert_eq!(count(&s, StatusCode::TOO_MANY_REQUESTS), 2, "limiting resumed: {s:?}");
    eprintln!("FAULT redis restarted: answered again after {recovered:?}, worst latency meanwhile {worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_bounded_then_fails_open() {
    // DEBUG SLEEP needs the debug command, off by default since Redis 7.
    let redis = RedisServer::start_with_args(&["--enable-debug-command", "yes"]);
    let store = RedisStore::from_url(&redis.url()).unwrap();
    let svc = RateLimitLayer::builder(store)
        .rule("default", Quota::per_minute(1_000_000), key::header("x-api-key"))
        .timeout(DEADLINE)
        .max_in_flight(8)
        .circuit_breaker(1_000_000, Duration::from_millis(1))
        .build()
        .unwrap()
        .layer(tower::service_fn(ok as fn(_) -> _));
    assert_eq!(svc.clone().oneshot(req("warm")).await.unwrap().status(), StatusCode::OK);
    // Redis busy for 300 ms: every store call would wait.
    let sleeper = std::thread::spawn({
        let port = redis.port();
        move || {
            std::process::Command::new("redis-cli").args(["-p", &port.to_string(), "DEBUG", "SLEEP", "0.3"]).output()
        }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let res = svc.oneshot(req(&format!("k{i}"))).await.unwrap();
                (res.status(), t.elapsed())
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    for t in tasks {
        let (s, took) = t.await.unwrap();
        assert_eq!(s, StatusCode::OK);
        worst = worst.max(took);
    }
    let all = started.elapsed();
    sleeper.join().unwrap().unwrap();
    assert!(worst < DEADLINE + MARGIN, "a request waited {worst:?}");
    assert!(all < Duration::from_millis(250), "500 requests took {all:?}: they queued");
    eprintln!(
        "FAULT overload (500 concurrent, cap 8, Redis asleep 300 ms): worst latency {worst:?}, all done in {all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_restarted_keeps_serving_and_limiting_resumes() {
    // A 3-master cluster without replicas; one master is killed and restarted.
    let mut cluster = RedisCluster::start(3);
    let svc = service(RedisStore::cluster(cluster.urls()).unwrap(), Quota::per_minute(3), FailMode::Open);
    // Keys on every master.
    let keys: Vec<String> = (0..12).map(|i| format!("user-{i}")).collect();
    for k in &keys {
        assert_eq!(count(&burst(&svc, k, 4).await.0, StatusCode::TOO_MANY_REQUESTS), 1, "{k}");
    }
    cluster.node_mut(0).kill();
    let mut worst = Duration::ZERO;
    for k in &keys {
        let (s, w) = burst(&svc, &format!("{k}-down"), 5).await;
        worst = worst.max(w);
        assert!(s.iter().all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS));
        assert!(count(&s, StatusCode::OK) >= 3, "requests were refused during the outage: {s:?}");
    }
    assert!(worst < DEADLINE + MARGIN + Duration::from_millis(100), "worst {worst:?}");
    cluster.restart_node(0);
    let started = Instant::now();
    for k in &keys {
        until_status(&svc, &format!("{k}-after"), StatusCode::TOO_MANY_REQUESTS, Duration::from_secs(10)).await;
    }
    eprintln!(
        "FAULT cluster master killed: worst latency {worst:?} during the outage; limiting on every master \
         again {:?} after restart",
        started.elapsed()
    );
}

/// Without the layer's deadline, the store's own response timeout bounds a call to a
/// paused Redis: for a store built from a URL and for one given the application's pool
/// (whose connections have redis's default 500 ms timeout until the store sets its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_times_out_on_its_own_whatever_the_pool() {
    const RESPONSE: Duration = Duration::from_millis(120);
    let redis = RedisServer::start();
    let pool =
        deadpool_redis::Config::from_url(redis.url()).create_pool(Some(deadpool_redis::Runtime::Tokio1)).unwrap();
    let stores = [
        ("url", RedisStore::from_url(&redis.url()).unwrap().response_timeout(RESPONSE)),
        ("pool", RedisStore::new(pool).response_timeout(RESPONSE)),
    ];
    let check = tollgate::store::Check {
        rule: "t".into(),
        key: "k".into(),
        algorithm: Algorithm::Gcra,
        params: tollgate::store::Params::new(Quota::per_minute(10)),
    };
    for (_, store) in &stores {
        store.ping().await.unwrap();
        assert!(tollgate::store::Store::check_one(store, &check).await.unwrap().decision.allowed);
    }
    redis.pause();
    for (origin, store) in &stores {
        let started = Instant::now();
        let err = tollgate::store::Store::check_one(store, &check).await.unwrap_err();
        let took = started.elapsed();
        assert!(matches!(err, tollgate::StoreError::Timeout(t) if t == RESPONSE), "{origin}: {err}");
        assert!(took >= RESPONSE && took < RESPONSE + MARGIN, "{origin}: answered after {took:?}");
    }
    redis.resume();
}

/// This process stalls (its only thread blocked, as a descheduled or CPU-throttled
/// container is) while a healthy Redis answers at once: the reply waits in the socket for
/// the connection's task, and the deadline's timer fires late.
/// - An 80 ms stall (past the 50 ms deadline, within the connection's 100 ms response
///   timeout): the reply is read and decides, ten times in a row.
/// - A 150 ms stall: the connection's own response timer has fired too and dropped the
///   reply, so the call is a timeout (handled by the fail mode); but the breaker holds
///   none of them against Redis, up to its threshold (5) in a row: after four, the next
///   call is decided by Redis.
#[tokio::test(flavor = "current_thread")]
async fn a_stalled_client_is_not_a_failed_redis() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    store.ping().await.unwrap();
    let limiter = tollgate::Limiter::<_, str>::builder(store)
        .rule("stall", Quota::per_hour(100), |s: &str| Some(s.to_owned()))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let stalled = |ms| {
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(ms));
        })
    };
    for i in 0..10 {
        let stall = stalled(80);
        let verdict = limiter.check("k").await;
        assert!(verdict.store_error().is_none(), "80 ms stall {i}: {:?}", verdict.store_error());
        assert!(verdict.is_allowed(), "80 ms stall {i}");
        stall.await.unwrap();
    }
    for i in 0..4 {
        let stall = stalled(150);
        let verdict = limiter.check("k").await;
        let error = verdict.store_error();
        assert!(error.is_none() || matches!(error, Some(StoreError::Timeout(_))), "150 ms stall {i}: {error:?}");
        stall.await.unwrap();
    }
    let verdict = limiter.check("k").await;
    assert!(verdict.store_error().is_none(), "the circuit stayed closed: {:?}", verdict.store_error());
}
