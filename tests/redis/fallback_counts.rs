//! What a request the fallback decided ends with, in Redis and in the fallback, through the
//! HTTP layer, while Redis is stalled (SIGSTOP: each call is cut by the 50 ms deadline
//! and answers late, after SIGCONT) or down (killed, restarted empty: what the fallback
//! admitted is written back): a plain rule's units are kept, a `count_if` rule's only for
//! a status that counts, a charged rule takes the reported `Charge`; a request dropped
//! while its handler runs gives back only its `count_if` units, one never polled nothing.
#![cfg(feature = "redis")]

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::sync::Notify;
use tollgate::store::{Check, Params, Store};
use tollgate::verdict::DecidedBy;
use tollgate::{key, Algorithm, Charge, MemoryStore, Quota, RateLimitLayer, RedisStore, Rule};
use tower::{Layer, Service, ServiceExt};

use support::redis::RedisServer;

const QUOTA: Quota = Quota::per_hour(100);

/// The login rule's algorithm, whose refunds give back each commit's own units: the late
/// calls of a stall commit one after the other on a key, and their refunds follow in any
/// order; since issue 40 a GCRA refund after another commit on the key gives nothing back.
const LOGIN: Algorithm = Algorithm::SlidingWindowLog;

/// Every key of the scenario, with the units it ends with (in Redis and in the fallback).
const EXPECTED: [(&str, &str, u64); 8] = [
    ("plain", "p-ok", 2),
    ("login", "l-fail", 2),
    ("login", "l-ok", 0),
    ("tokens", "t-charge", 5),
    ("plain", "p-drop", 1),
    ("login", "l-drop", 0),
    ("plain", "p-unpolled", 0),
    ("login", "l-unpolled", 0),
];

/// 200, except `/fail` (401), `/charge` (200 reporting `Charge(5)`) and `/slow`
/// (notifies `entered`, then never answers).
fn app(
    entered: Arc<Notify>,
) -> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(move |req: Request<Body>| {
        let entered = entered.clone();
        async move {
            let mut res = Response::new(Body::empty());
            match req.uri().path() {
                "/fail" => *res.status_mut() = StatusCode::UNAUTHORIZED,
                "/charge" => drop(res.extensions_mut().insert(Charge(5))),
                "/slow" => {
                    entered.notify_one();
                    std::future::pending::<()>().await;
                }
                _ => {}
            }
            Ok(res)
        }
    })
}

/// A plain rule, a login rule counting 401s and a charged rule, each keyed by a header of
/// its own; the fallback's share is the whole quota (one server). The connection waits 10 s
/// for an answer, so a stall's calls are late, not failed.
fn layer(store: RedisStore, fallback: MemoryStore) -> RateLimitLayer<RedisStore> {
    RateLimitLayer::builder(store.response_timeout(Duration::from_secs(10)))
        .add_rule(Rule::new("plain", QUOTA, key::header("x-plain")))
        .add_rule(
            Rule::new("login", QUOTA, key::header("x-login"))
                .count_if(|s| s == StatusCode::UNAUTHORIZED)
                .algorithm(LOGIN),
        )
        .add_rule(Rule::new("tokens", QUOTA, key::header("x-tokens")).charged())
        .algorithm(Algorithm::Gcra)
        .fallback(fallback)
        .servers(1)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .local_cache(false)
        .build()
        .unwrap()
}

fn req(path: &str, rule_header: &str, key: &str) -> Request<Body> {
    Request::get(path).header(rule_header, key).body(Body::empty()).unwrap()
}

/// Units `store` counts for (rule, key) (a peek says what would remain after one more).
async fn used<S: Store>(store: &S, rule: &str, key: &str) -> u64 {
    let algorithm = if rule == "login" { LOGIN } else { Algorithm::Gcra };
    let check = Check { rule: rule.into(), key: key.into(), algorithm, params: Params::new(QUOTA) };
    QUOTA.limit() - 1 - Store::peek(store, &check).await.unwrap().remaining()
}

/// Every key's units in `store`, in the order of [`EXPECTED`].
async fn counts<S: Store>(store: &S) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    for (rule, key, _) in EXPECTED {
        out.push((key, used(store, rule, key).await));
    }
    out
}

fn expected() -> Vec<(&'static str, u64)> {
    EXPECTED.iter().map(|&(_, key, n)| (key, n)).collect()
}

/// Sends the scenario's requests while the store cannot answer (each must be decided at
/// once by the fallback: within 2 s, while Redis is stopped or dead).
async fn requests<S>(svc: &S, entered: &Notify)
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let send = |r: Request<Body>| {
        let svc = svc.clone();
        async move {
            let started = Instant::now();
            let res = svc.oneshot(r).await.unwrap();
            assert!(started.elapsed() < Duration::from_secs(2), "not decided by the fallback");
            res.status()
        }
    };
    // Never polled: nothing decided, nothing taken.
    for (header, key) in [("x-plain", "p-unpolled"), ("x-login", "l-unpolled")] {
        let mut svc = svc.clone();
        let fut = svc.ready().await.unwrap().call(req("/", header, key));
        drop(fut);
    }
    // Dropped while the handler runs: the plain unit is kept, the login's given back.
    for (header, key) in [("x-plain", "p-drop"), ("x-login", "l-drop")] {
        let running = tokio::spawn(svc.clone().oneshot(req("/slow", header, key)));
        tokio::time::timeout(Duration::from_secs(2), entered.notified()).await.expect("the handler runs");
        running.abort();
        assert!(running.await.unwrap_err().is_cancelled());
    }
    for _ in 0..2 {
        assert_eq!(send(req("/", "x-login", "l-ok")).await, StatusCode::OK);
        assert_eq!(send(req("/fail", "x-login", "l-fail")).await, StatusCode::UNAUTHORIZED);
        assert_eq!(send(req("/", "x-plain", "p-ok")).await, StatusCode::OK);
    }
    assert_eq!(send(req("/charge", "x-tokens", "t-charge")).await, StatusCode::OK);
}

/// Checks a key of its own every 50 ms until the store decides (within 10 s).
async fn until_the_store_decides(layer: &RateLimitLayer<RedisStore>) {
    let started = Instant::now();
    while layer.limiter().check_key("plain", "probe", 1).await.decided_by() != Some(DecidedBy::Store) {
        assert!(started.elapsed() < Duration::from_secs(10), "the store never decided again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (up to 10 s) until Redis counts what it should, then a little more: the counts
/// must stay exact (no late call, refund or write-back still on its way changes them).
async fn redis_settles_on(store: &RedisStore, want: &[(&'static str, u64)]) {
    let started = Instant::now();
    while counts(store).await != want && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counts(store).await, want, "Redis's counts (the fallback's were exact)");
}

/// A SIGSTOPped server, SIGCONTed when dropped (also by a failed assertion).
struct Stopped<'a>(&'a RedisServer);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// SIGSTOP while the requests are sent: each call is cut by the deadline and answers
/// after SIGCONT; the late call's units are the store's copy of the fallback's, kept or
/// given back with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_ends_with_what_each_fallback_decision_kept() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let fallback = MemoryStore::new();
    let layer = layer(store.clone(), fallback.clone());
    let entered = Arc::new(Notify::new());
    let svc = layer.clone().layer(app(entered.clone()));
    until_the_store_decides(&layer).await;
    server.pause();
    let stopped = Stopped(&server);
    requests(&svc, &entered).await;
    drop(stopped);
    assert_eq!(counts(&fallback).await, expected(), "the fallback's counts");
    until_the_store_decides(&layer).await;
    redis_settles_on(&store, &expected()).await;
    assert_eq!(counts(&fallback).await, expected(), "the fallback's counts, once Redis answered");
}

/// Redis killed while the requests are sent, then restarted empty: what the fallback kept
/// is written back, and only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_down_ends_with_what_each_fallback_decision_kept_written_back() {
    let mut server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let fallback = MemoryStore::new();
    let layer = layer(store.clone(), fallback.clone());
    let entered = Arc::new(Notify::new());
    let svc = layer.clone().layer(app(entered.clone()));
    until_the_store_decides(&layer).await;
    server.kill();
    requests(&svc, &entered).await;
    assert_eq!(counts(&fallback).await, expected(), "the fallback's counts");
    server.restart();
    until_the_store_decides(&layer).await;
    redis_settles_on(&store, &expected()).await;
    assert_eq!(counts(&fallback).await, expected(), "the fallback's counts, once Redis answered");
}
