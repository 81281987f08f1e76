//! Which rule a 429 names while Redis is stalled (SIGSTOP): decided by the fallback (its
//! share of each quota, or of what Redis last said remains) or by the blocked-key cache,
//! the rejection names the rule that makes the client wait longest, and `Retry-After`, the
//! `X-RateLimit-*` and IETF headers and `on_rejected`'s `Rejection` all say that rule.
#![cfg(feature = "redis")]

use crate::support;

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Request, Response, StatusCode};
use tollgate::headers::HeaderStyle;
use tollgate::verdict::DecidedBy;
use tollgate::{key, Algorithm, Quota, RateLimitLayer, RedisStore};
use tower::{Layer, ServiceExt};

use support::redis::RedisServer;

/// A SIGSTOPped server, SIGCONTed when dropped (also by a failed assertion).
struct Stopped<'a>(&'a RedisServer);

impl Stopped<'_> {
    fn new(server: &RedisServer) -> Stopped<'_> {
        server.pause();
        Stopped(server)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// A minute's rule keyed by the API key and an hour's keyed by the account, over Redis
/// (its calls cut after 50 ms, answered late), `servers` sharing it; a 429's body says
/// `"<rule> <key> <who decided>"`.
fn service(
    store: RedisStore,
    per_minute: Quota,
    per_hour: Quota,
    servers: u64,
) -> (
    RateLimitLayer<RedisStore>,
    impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone,
) {
    let layer = RateLimitLayer::builder(store.response_timeout(Duration::from_secs(10)))
        .rule("per-minute", per_minute, key::header("x-api-key"))
        .rule("per-hour", per_hour, key::header("x-account"))
        .algorithm(Algorithm::Gcra)
        .servers(servers)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap()
        .headers(HeaderStyle::Both);
    let svc = layer
        .clone()
        .on_rejected(|r| {
            let said = format!("{} {} {:?}", r.rule, String::from_utf8_lossy(&r.key.as_bytes()), r.decided_by);
            let mut res = Response::new(Body::from(said));
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res
        })
        .layer(tower::service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) }));
    (layer, svc)
}

/// Sends a `GET /` for the API key and account; the status, the body and the headers.
async fn ask<S>(svc: &S, api_key: &str, account: &str) -> (StatusCode, String, HeaderMap)
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    let req = Request::get("/").header("x-api-key", api_key).header("x-account", account).body(Body::empty()).unwrap();
    let res = svc.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = axum::body::to_bytes(body, 1 << 10).await.unwrap();
    (parts.status, String::from_utf8(body.to_vec()).unwrap(), parts.headers)
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

/// A 429's `Retry-After`, `X-RateLimit-Rule`, `X-RateLimit-Limit`, `X-RateLimit-Remaining`
/// and the first member of `RateLimit`, all about `rule`: its `limit` (the rule's quota,
/// also for the fallback) and a wait of `secs`.
#[track_caller]
fn says(h: &HeaderMap, rule: &str, limit: u64, secs: u64) {
    assert_eq!(header(h, "retry-after"), Some(&*secs.to_string()), "{h:?}");
    assert_eq!(header(h, "x-ratelimit-rule"), Some(rule), "{h:?}");
    assert_eq!(header(h, "x-ratelimit-limit"), Some(&*limit.to_string()), "{h:?}");
    assert_eq!(header(h, "x-ratelimit-remaining"), Some("0"), "{h:?}");
    let ietf = header(h, "ratelimit").unwrap_or_default();
    assert!(ietf.starts_with(&format!("\"{rule}\";r=0;t={secs}")), "RateLimit: {ietf:?} for {rule} ({h:?})");
}

/// Redis admitted a client's one unit of a minute's and of an hour's rule; then it stalls.
/// Both rules are spent by what Redis said remains: the fallback's 429 must name the hour's
/// (as Redis's would), not the first rule spent, which would send the client back in a
/// minute to be refused again. Redis's own 429, once cached, is answered the same way
/// from the blocked-key cache while it stalls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_429_over_spent_shares_names_the_longest_wait() {
    let server = RedisServer::start();
    let (layer, svc) =
        service(RedisStore::from_url(&server.url()).unwrap(), Quota::per_minute(1), Quota::per_hour(1), 1);
    assert_eq!(ask(&svc, "ak_1", "acct_1").await.0, StatusCode::OK);
    {
        let _stopped = Stopped::new(&server);
        let (status, body, h) = ask(&svc, "ak_1", "acct_1").await;
        assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1 Fallback"));
        says(&h, "per-hour", 1, 3600);
        // Another account: only the minute's rule is spent.
        let (status, body, h) = ask(&svc, "ak_1", "acct_2").await;
        assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-minute ak_1 Fallback"));
        says(&h, "per-minute", 1, 60);
    }
    // Redis's own 429 (both rules reject: the hour's is named), its late answers to the
    // stalled calls too: cached ...
    let started = std::time::Instant::now();
    loop {
        let (status, body, h) = ask(&svc, "ak_1", "acct_1").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        if !body.ends_with("Fallback") {
            assert!(["per-hour acct_1 Store", "per-hour acct_1 LocalCache"].contains(&&*body), "{body}");
            says(&h, "per-hour", 1, 3600);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "Redis never decided again: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... is what the cache answers while Redis stalls.
    let _stopped = Stopped::new(&server);
    let (status, body, h) = ask(&svc, "ak_1", "acct_1").await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1 LocalCache"));
    says(&h, "per-hour", 1, 3600);
    drop(layer);
}

/// Two servers share Redis, which stalls before it saw the client: the fallback decides
/// with this server's half of each quota (1 a minute, 1 an hour). Its 429 names the hour's
/// rule, and every header says that rule and its quota (2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_429_of_its_own_shares_names_the_longest_wait() {
    let server = RedisServer::start();
    let (layer, svc) =
        service(RedisStore::from_url(&server.url()).unwrap(), Quota::per_minute(2), Quota::per_hour(2), 2);
    assert_eq!(layer.limiter().check_key("per-minute", "warm", 1).await.decided_by(), Some(DecidedBy::Store));
    let _stopped = Stopped::new(&server);
    let (status, _, h) = ask(&svc, "ak_1", "acct_1").await;
    assert_eq!(status, StatusCode::OK, "{h:?}");
    let (status, body, h) = ask(&svc, "ak_1", "acct_1").await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1 Fallback"));
    says(&h, "per-hour", 2, 3600);
    let (status, body, h) = ask(&svc, "ak_1", "acct_2").await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-minute ak_1 Fallback"));
    says(&h, "per-minute", 2, 60);
}

/// The limit a fallback's answer shows (issue 37 item 12a): `X-RateLimit-Limit` is the
/// rule's quota, as `RateLimit-Policy` says it (before: this server's share, 33 of 100,
/// beside a policy of 100), and `X-RateLimit-Remaining` and `RateLimit`'s `r` count this
/// server's share down to 0 before its 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_answer_shows_the_rules_quota_as_its_limit() {
    let server = RedisServer::start();
    let (layer, svc) =
        service(RedisStore::from_url(&server.url()).unwrap(), Quota::per_minute(100), Quota::per_hour(1000), 3);
    assert_eq!(layer.limiter().check_key("per-minute", "warm", 1).await.decided_by(), Some(DecidedBy::Store));
    let _stopped = Stopped::new(&server);
    let policy = "\"per-minute\";q=100;w=60, \"per-hour\";q=1000;w=3600";
    // This server's share of the minute's 100: 33.
    for left in (0..33).rev() {
        let (status, _, h) = ask(&svc, "ak_1", "acct_1").await;
        assert_eq!(status, StatusCode::OK, "{h:?}");
        assert_eq!(header(&h, "ratelimit-policy"), Some(policy), "{h:?}");
        assert_eq!(header(&h, "x-ratelimit-rule"), Some("per-minute"), "{h:?}");
        assert_eq!(header(&h, "x-ratelimit-limit"), Some("100"), "the policy's quota: {h:?}");
        assert_eq!(header(&h, "x-ratelimit-remaining"), Some(&*left.to_string()), "{h:?}");
        let ietf = header(&h, "ratelimit").unwrap_or_default();
        assert!(ietf.starts_with(&format!("\"per-minute\";r={left};")), "{ietf}");
    }
    let (status, body, h) = ask(&svc, "ak_1", "acct_1").await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-minute ak_1 Fallback"));
    assert_eq!(header(&h, "ratelimit-policy"), Some(policy), "{h:?}");
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("100"), "the policy's quota: {h:?}");
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("0"), "{h:?}");
}
