//! The production example's routers, driven request by request with a manual clock:
//! layered limits, tiers, per-route rules, shadow / allow-list / count-by-outcome,
//! metrics and the admin routes.
#![cfg(all(feature = "metrics", feature = "config"))]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http::{Request, Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::headers::{RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_RULE};
use tollgate::key::Key;
use tollgate::store::Params;
use tollgate::store::{Check, Store};
use tollgate::{Algorithm, Decision, LayerConfig, MemoryStore, Quota, StoreError};
use tower::ServiceExt;

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/production.rs"]
mod example;

use example::{Account, Accounts, Limits, Tier};

/// A midnight (UTC): minute and day windows start with the test.
const T0: u64 = 19_676 * 86_400 * 1_000_000;
const TOKEN: &str = "internal-secret";

struct App<St = MemoryStore> {
    public: Router,
    internal: Router,
    limits: Limits<St>,
    clock: ManualClock,
    store: St,
}

/// Accounts by key: `free-1`, `free-2` (one free account), `pro-0`..`pro-99`,
/// `ent-0`..`ent-99`, and `free2-1` (another free account).
fn accounts() -> Accounts {
    let account = |id: &str, tier| Account { id: id.into(), tier };
    let mut keys = vec![
        ("free-1".to_owned(), account("acct-free", Tier::Free)),
        ("free-2".to_owned(), account("acct-free", Tier::Free)),
        ("free2-1".to_owned(), account("acct-free2", Tier::Free)),
    ];
    for i in 0..100 {
        keys.push((format!("pro-{i}"), account("acct-pro", Tier::Pro)));
        keys.push((format!("ent-{i}"), account("acct-ent", Tier::Enterprise)));
    }
    Accounts::new(keys)
}

fn app() -> App {
    let clock = ManualClock::new(T0);
    with_store(MemoryStore::with_clock(clock.clone()), clock)
}

fn with_store<St: Store + Clone>(store: St, clock: ManualClock) -> App<St> {
    let config = LayerConfig::from_toml(example::LIMITS_TOML).expect("the example's config is valid");
    let limits = example::limits(store.clone(), &config, Some(TOKEN.into())).unwrap();
    let public = example::public_router(&limits, accounts());
    let internal = example::internal_router(limits.clone(), example::install_metrics());
    App { public, internal, limits, clock, store }
}

fn from_ip(mut req: Request<Body>, ip: &str) -> Request<Body> {
    req.extensions_mut().insert(ConnectInfo(format!("{ip}:40000").parse::<SocketAddr>().unwrap()));
    req
}

fn api(path: &str, key: Option<&str>, ip: &str) -> Request<Body> {
    let mut b = Request::get(path);
    if let Some(k) = key {
        b = b.header("x-api-key", k);
    }
    from_ip(b.body(Body::empty()).unwrap(), ip)
}

fn form(path: &str, body: &str, ip: &str) -> Request<Body> {
    let req = Request::post(path)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(body.to_owned()))
        .unwrap();
    from_ip(req, ip)
}

fn login(password: &str, ip: &str) -> Request<Body> {
    form("/auth/login", &format!("user=alice&password={password}"), ip)
}

async fn send(router: &Router, req: Request<Body>) -> Response<Body> {
    router.clone().oneshot(req).await.unwrap()
}

async fn body(res: Response<Body>) -> String {
    String::from_utf8(axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap()
}

fn header<'a>(res: &'a Response<Body>, name: &http::HeaderName) -> &'a str {
    res.headers().get(name).unwrap_or_else(|| panic!("no {name} in {:?}", res.headers())).to_str().unwrap()
}

/// A 429 that names `rule` in the legacy and IETF headers, with `Retry-After`.
fn assert_rejected_by(res: &Response<Body>, rule: &str) {
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "expected {rule} to reject: {:?}", res.headers());
    assert_eq!(header(res, &X_RATELIMIT_RULE), rule);
    let ietf = header(res, &RATELIMIT);
    assert!(ietf.starts_with(&format!("\"{rule}\";r=0;t=")), "{ietf}");
    assert!(res.headers().contains_key(http::header::RETRY_AFTER));
}

/// Lets spawned count-by-outcome refunds run.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// What each API rule would decide now for the account / key / address.
async fn peek_all(a: &App, ip: &str, key: &str, account: &str, tier: Tier) -> Vec<Option<Decision>> {
    let api = &a.limits.api;
    let mut out = vec![Some(api.peek("ip", ip).await.unwrap()), Some(api.peek("api-key", key).await.unwrap())];
    for (rule, quota) in [("account-minute", tier.per_minute()), ("account-day", tier.per_day())] {
        out.push(match quota {
            Some(q) => Some(api.peek_with(rule, account, q).await.unwrap()),
            None => None,
        });
    }
    out
}

#[tokio::test]
async fn each_api_rule_rejects_on_its_own() {
    let a = app();
    // ip: 600 a minute per address. An enterprise account (no account limit) with a new
    // key every 50 requests (under the key limit of 100).
    for i in 0..600 {
        let res = send(&a.public, api("/api/me", Some(&format!("ent-{}", i / 50)), "1.1.1.1")).await;
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
    }
    assert_rejected_by(&send(&a.public, api("/api/me", Some("ent-99"), "1.1.1.1")).await, "ip");
    assert_eq!(send(&a.public, api("/api/me", Some("ent-99"), "1.1.1.2")).await.status(), StatusCode::OK);
    // Unauthenticated requests meet the per-address limit too (and then the handler's 401).
    // (Only one rule applied to it, so only the IETF header names it.)
    let res = send(&a.public, api("/api/me", None, "1.1.1.1")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&res, &RATELIMIT).starts_with("\"ip\";r=0;"));

    // api-key: 100 a minute per key, whatever the address.
    for i in 0..100 {
        let res = send(&a.public, api("/api/me", Some("ent-50"), &format!("2.2.2.{i}"))).await;
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
    }
    assert_rejected_by(&send(&a.public, api("/api/orders/1", Some("ent-50"), "2.2.3.1")).await, "api-key");
    assert_eq!(send(&a.public, api("/api/me", Some("ent-51"), "2.2.3.1")).await.status(), StatusCode::OK);

    // account-minute: a free account has 60 a minute, shared by all its keys.
    for i in 0..60 {
        let key = if i % 2 == 0 { "free-1" } else { "free-2" };
        assert_eq!(send(&a.public, api("/api/me", Some(key), "3.3.3.3")).await.status(), StatusCode::OK);
    }
    assert_rejected_by(&send(&a.public, api("/api/me", Some("free-1"), "3.3.3.3")).await, "account-minute");
    assert_rejected_by(&send(&a.public, api("/api/me", Some("free-2"), "3.3.3.4")).await, "account-minute");
    // Another free account is not affected.
    assert_eq!(send(&a.public, api("/api/me", Some("free2-1"), "3.3.3.3")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_request_rejected_by_one_rule_consumes_nothing_from_the_others() {
    let a = app();
    // A pro key spends its 100 from many addresses; the 101st is rejected by api-key.
    for i in 0..100 {
        assert_eq!(
            send(&a.public, api("/api/me", Some("pro-0"), &format!("4.4.4.{i}"))).await.status(),
            StatusCode::OK
        );
    }
    let before = peek_all(&a, "4.4.5.5", "pro-0", "acct-pro", Tier::Pro).await;
    assert_rejected_by(&send(&a.public, api("/api/me", Some("pro-0"), "4.4.5.5")).await, "api-key");
    let after = peek_all(&a, "4.4.5.5", "pro-0", "acct-pro", Tier::Pro).await;
    assert_eq!(before, after, "the rejected request changed another rule's state");
    // Exactly the 100 accepted requests were counted (a peek answers as if one more came).
    let remaining: Vec<u64> = after.iter().map(|d| d.as_ref().unwrap().remaining()).collect();
    assert_eq!(remaining, [599, 0, 6_000 - 101, 100_000 - 101]);

    // The same through the store itself: the address of the rejected request is untouched.
    let check = Check {
        rule: "ip".into(),
        key: Key::from("4.4.5.5"),
        algorithm: Algorithm::SlidingWindowCounter,
        params: Params::new(Quota::per_minute(600)),
    };
    assert_eq!(a.store.peek(&check).await.unwrap().remaining(), 599);

    // And the other way round: rejected by account-minute, the key and the address keep
    // their budgets.
    for _ in 0..60 {
        assert_eq!(send(&a.public, api("/api/me", Some("free-1"), "4.4.6.6")).await.status(), StatusCode::OK);
    }
    let before = peek_all(&a, "4.4.6.6", "free-2", "acct-free", Tier::Free).await;
    assert_rejected_by(&send(&a.public, api("/api/me", Some("free-2"), "4.4.6.6")).await, "account-minute");
    assert_eq!(before, peek_all(&a, "4.4.6.6", "free-2", "acct-free", Tier::Free).await);
    assert_eq!(a.limits.api.peek("api-key", "free-2").await.unwrap().remaining(), 99, "free-2 unspent");
}

#[tokio::test]
async fn free_tier_gets_60_a_minute_and_1000_a_day() {
    let a = app();
    let mut accepted = 0;
    for minute in 0..17 {
        let expected = (1_000 - accepted).min(60);
        for i in 0..expected {
            let res = send(&a.public, api("/api/me", Some("free-1"), "5.5.5.5")).await;
            assert_eq!(res.status(), StatusCode::OK, "minute {minute}, request {i}");
        }
        accepted += expected;
        let no = send(&a.public, api("/api/me", Some("free-1"), "5.5.5.5")).await;
        assert_rejected_by(&no, if accepted < 1_000 { "account-minute" } else { "account-day" });
        if accepted == 1_000 {
            // The day limit says to come back tomorrow, not in a minute.
            let retry: u64 = header(&no, &http::header::RETRY_AFTER).parse().unwrap();
            assert!(retry > 80_000, "Retry-After {retry}");
            assert_eq!(header(&no, &RATELIMIT_POLICY), POLICY_FREE);
        }
        // Two minutes: the sliding window's previous minute no longer weighs.
        a.clock.advance(Duration::from_secs(120));
    }
    assert_eq!(accepted, 1_000);
    let next = send(&a.public, api("/api/me", Some("free-2"), "5.5.5.6")).await;
    assert_rejected_by(&next, "account-day");
}

const POLICY_FREE: &str =
    "\"ip\";q=600;w=60, \"api-key\";q=100;w=60, \"account-minute\";q=60;w=60, \"account-day\";q=1000;w=86400";

#[tokio::test]
async fn pro_tier_gets_6000_a_minute_and_100000_a_day() {
    let a = app();
    // 6,000 requests spread over 67 keys and 12 addresses, so only the account limit can bite.
    for i in 0..6_000 {
        let req = api("/api/me", Some(&format!("pro-{}", i / 90)), &format!("6.6.{}.1", i / 500));
        let res = send(&a.public, req).await;
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        if i == 0 {
            assert_eq!(
                header(&res, &RATELIMIT_POLICY),
                "\"ip\";q=600;w=60, \"api-key\";q=100;w=60, \"account-minute\";q=6000;w=60, \
                 \"account-day\";q=100000;w=86400"
            );
        }
    }
    assert_rejected_by(&send(&a.public, api("/api/me", Some("pro-99"), "6.6.99.1")).await, "account-minute");
    let day = a.limits.api.peek_with("account-day", "acct-pro", Quota::per_day(100_000)).await.unwrap();
    assert_eq!(day.remaining(), 100_000 - 6_001, "6,000 of the day's 100,000 are spent");
    // A minute later the pro account goes on.
    a.clock.advance(Duration::from_secs(120));
    assert_eq!(send(&a.public, api("/api/me", Some("pro-99"), "6.6.99.1")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn enterprise_tier_has_no_account_limit() {
    let a = app();
    // More than the pro minute, from one account; keys and addresses spread as above.
    for i in 0..7_000 {
        let req = api("/api/me", Some(&format!("ent-{}", i / 90)), &format!("7.7.{}.1", i / 500));
        let res = send(&a.public, req).await;
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        if i == 6_999 {
            // The account rules did not apply at all: only the IP and key rules are listed.
            assert_eq!(header(&res, &RATELIMIT_POLICY), "\"ip\";q=600;w=60, \"api-key\";q=100;w=60");
        }
    }
    // The per-key and per-address limits still hold for enterprise keys.
    for _ in 0..10 {
        send(&a.public, api("/api/me", Some("ent-0"), "7.7.99.1")).await;
    }
    assert_rejected_by(&send(&a.public, api("/api/me", Some("ent-0"), "7.7.99.1")).await, "api-key");
}

#[tokio::test]
async fn login_counts_only_failures_per_route_and_address() {
    let a = app();
    // Successful logins are given back: never limited.
    for i in 0..20 {
        assert_eq!(send(&a.public, login("wonderland", "8.8.8.8")).await.status(), StatusCode::OK, "login {i}");
        settle().await;
    }
    for i in 0..10 {
        let res = send(&a.public, login("guess", "8.8.8.8")).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "failure {i}");
        settle().await;
    }
    let no = send(&a.public, login("guess", "8.8.8.8")).await;
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&no, &RATELIMIT).starts_with("\"login\";r=0;"));
    // Once blocked, even the right password waits: the handler is not reached.
    assert_eq!(send(&a.public, login("wonderland", "8.8.8.8")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // The key is the route (MatchedPath) and the address: /auth/token has its own budget,
    // and so has another address.
    let token = form("/auth/token", "client_id=cli&client_secret=wrong", "8.8.8.8");
    assert_eq!(send(&a.public, token).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(send(&a.public, login("guess", "8.8.8.9")).await.status(), StatusCode::UNAUTHORIZED);
    let d = a.limits.auth.peek("login", "/auth/login 8.8.8.8").await.unwrap();
    assert!(!d.allowed, "the key is the route template and the address: {d:?}");
}

#[tokio::test]
async fn a_404_spends_no_quota_and_health_is_never_limited() {
    let a = app();
    for _ in 0..700 {
        // route_layer: unmatched paths never reach the limits.
        assert_eq!(send(&a.public, api("/api/nope", Some("free-1"), "9.9.9.9")).await.status(), StatusCode::NOT_FOUND);
        assert_eq!(send(&a.public, api("/nowhere", Some("free-1"), "9.9.9.9")).await.status(), StatusCode::NOT_FOUND);
        let health = send(&a.public, api("/health", Some("free-1"), "9.9.9.9")).await;
        assert_eq!(health.status(), StatusCode::OK);
        assert!(!health.headers().contains_key(X_RATELIMIT_LIMIT), "/health is outside every limit");
    }
    let fresh = peek_all(&a, "9.9.9.9", "free-1", "acct-free", Tier::Free).await;
    let remaining: Vec<u64> = fresh.iter().map(|d| d.as_ref().unwrap().remaining()).collect();
    assert_eq!(remaining, [599, 99, 59, 999], "nothing was spent");
    let res = send(&a.public, api("/api/me", Some("free-1"), "9.9.9.9")).await;
    // The handler sees the most restrictive rule's decision: account-minute, 59 left.
    assert_eq!(body(res).await, "account acct-free (Free), 59 requests left\n");
}

/// A store that is down.
#[derive(Clone, Default)]
struct DownStore(Arc<AtomicUsize>);

impl Store for DownStore {
    fn check(
        &self,
        _: &[Check],
    ) -> impl Future<Output = Result<Vec<Option<tollgate::store::Outcome>>, StoreError>> + Send {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Err(StoreError::Unavailable("connection refused".into())))
    }
    fn refund(&self, _: &[tollgate::store::Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Err(StoreError::Unavailable("connection refused".into())))
    }
    fn peek(&self, _: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(Err(StoreError::Unavailable("connection refused".into())))
    }
    fn reset(&self, _: &str, _: &Key, _: Algorithm) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Err(StoreError::Unavailable("connection refused".into())))
    }
}

#[tokio::test]
async fn with_the_store_down_login_fails_closed_and_the_api_falls_back() {
    let store = DownStore::default();
    let a = with_store(store.clone(), ManualClock::new(T0));
    let res = send(&a.public, api("/api/me", Some("free-1"), "10.0.0.1")).await;
    assert_eq!(res.status(), StatusCode::OK, "paying customers keep working");
    // The account limit falls back (the default): this server's share, all of it here.
    assert_eq!(body(res).await, "account acct-free (Free), 59 requests left\n");
    let res = send(&a.public, login("wonderland", "10.0.0.1")).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "fail-closed: no unlimited password guessing");
    assert!(res.headers().contains_key(http::header::RETRY_AFTER));
    assert_eq!(send(&a.public, api("/health", None, "10.0.0.1")).await.status(), StatusCode::OK);
    assert!(store.0.load(Ordering::SeqCst) >= 2, "the store was asked");
    // The admin routes report the outage instead of guessing.
    let res = send(&a.internal, Request::get("/admin/limits/ip/10.0.0.1").body(Body::empty()).unwrap()).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn shadow_rule_records_but_never_rejects() {
    let a = app();
    // ip-strict (120 a minute, shadow) would reject from the 121st request; nothing is rejected.
    for i in 0..200 {
        let res = send(&a.public, api("/api/me", Some(&format!("ent-{}", i / 50)), "11.1.1.1")).await;
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        assert!(!header(&res, &RATELIMIT_POLICY).contains("ip-strict"), "a shadow rule sends no headers");
    }
    let d = a.limits.api.peek("ip-strict", "11.1.1.1").await.unwrap();
    assert!(!d.allowed, "the shadow rule did decide, and is spent: {d:?}");
    // What it would have rejected is in the metrics, for the roll-out decision.
    let metrics = body(send(&a.internal, Request::get("/metrics").body(Body::empty()).unwrap()).await).await;
    assert!(sample(&metrics, "ip-strict", "shadow_rejected") >= 80.0, "{metrics}");
}

#[tokio::test]
async fn internal_callers_with_the_token_pass_the_api_limits() {
    let a = app();
    let internal = |token: &str| {
        let mut req = api("/api/me", Some("free-1"), "12.1.1.1");
        req.headers_mut().insert(example::INTERNAL_HEADER, token.parse().unwrap());
        req
    };
    for i in 0..700 {
        assert_eq!(send(&a.public, internal(TOKEN)).await.status(), StatusCode::OK, "request {i}");
    }
    // Bypassed requests were not counted: the free account still has its whole minute.
    for i in 0..60 {
        assert_eq!(send(&a.public, internal("wrong")).await.status(), StatusCode::OK, "request {i}");
    }
    assert_rejected_by(&send(&a.public, internal("wrong")).await, "account-minute");
}

/// The value of `tollgate_decisions_total{rule, outcome}` in a Prometheus scrape.
fn sample(scrape: &str, rule: &str, outcome: &str) -> f64 {
    let labels = [format!("rule=\"{rule}\""), format!("outcome=\"{outcome}\"")];
    scrape
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{") && labels.iter().all(|x| l.contains(x.as_str())))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test]
async fn metrics_endpoint_exposes_decisions_by_rule_and_outcome() {
    let a = app();
    for _ in 0..11 {
        send(&a.public, login("guess", "13.1.1.1")).await;
        settle().await;
    }
    let res = send(&a.internal, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(header(&res, &http::header::CONTENT_TYPE).starts_with("text/plain"));
    let scrape = body(res).await;
    assert!(scrape.contains("# TYPE tollgate_decisions_total counter"), "{scrape}");
    assert!(sample(&scrape, "login", "allowed") >= 10.0, "{scrape}");
    assert!(sample(&scrape, "login", "rejected") >= 1.0, "{scrape}");
    // Who decided: the store (in process here) for every one of them.
    let by_store = scrape
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{") && l.contains("rule=\"login\""))
        .all(|l| l.contains("decided_by=\"store\""));
    assert!(by_store, "{scrape}");
}

async fn admin(a: &App, method: &str, path: &str) -> (StatusCode, String) {
    let res = send(&a.internal, Request::builder().method(method).uri(path).body(Body::empty()).unwrap()).await;
    (res.status(), body(res).await)
}

#[tokio::test]
async fn admin_routes_peek_and_reset_a_key() {
    let a = app();
    for _ in 0..60 {
        send(&a.public, api("/api/me", Some("free-1"), "14.1.1.1")).await;
    }
    assert_rejected_by(&send(&a.public, api("/api/me", Some("free-1"), "14.1.1.1")).await, "account-minute");

    let (status, json) = admin(&a, "GET", "/admin/limits/account-minute/acct-free").await;
    assert_eq!(status, StatusCode::OK);
    assert!(json.starts_with("{\"allowed\":false,\"limit\":60,\"remaining\":0,"), "{json}");
    assert!(!json.contains("\"retry_after_ms\":null"), "{json}");
    let (_, json) = admin(&a, "GET", "/admin/limits/ip/14.1.1.1").await;
    assert!(json.starts_with("{\"allowed\":true,\"limit\":600,\"remaining\":539,"), "{json}");
    // Tier rules under the account's own quota.
    let (_, json) = admin(&a, "GET", "/admin/limits/account-minute/acct-pro?quota=6000/min").await;
    assert!(json.starts_with("{\"allowed\":true,\"limit\":6000,\"remaining\":5999,"), "{json}");
    assert_eq!(admin(&a, "GET", "/admin/limits/account-minute/x?quota=lots").await.0, StatusCode::BAD_REQUEST);
    assert_eq!(admin(&a, "GET", "/admin/limits/no-such-rule/x").await.0, StatusCode::NOT_FOUND);
    assert_eq!(admin(&a, "DELETE", "/admin/limits/no-such-rule/x").await.0, StatusCode::NOT_FOUND);

    // "Unblock this customer".
    assert_eq!(admin(&a, "DELETE", "/admin/limits/account-minute/acct-free").await.0, StatusCode::NO_CONTENT);
    assert_eq!(send(&a.public, api("/api/me", Some("free-1"), "14.1.1.1")).await.status(), StatusCode::OK);
    let (_, json) = admin(&a, "GET", "/admin/limits/account-minute/acct-free").await;
    assert!(json.starts_with("{\"allowed\":true,\"limit\":60,\"remaining\":58,"), "{json}");

    // Rules of the other layer too; a key with '/' and ' ' is percent-encoded in the path.
    for _ in 0..11 {
        send(&a.public, login("guess", "14.2.2.2")).await;
        settle().await;
    }
    assert_eq!(send(&a.public, login("guess", "14.2.2.2")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    let key = "/admin/limits/login/%2Fauth%2Flogin%2014.2.2.2";
    assert!(admin(&a, "GET", key).await.1.starts_with("{\"allowed\":false,"));
    assert_eq!(admin(&a, "DELETE", key).await.0, StatusCode::NO_CONTENT);
    assert_eq!(send(&a.public, login("guess", "14.2.2.2")).await.status(), StatusCode::UNAUTHORIZED);
}

/// A reloaded limits file keeps the internal callers' pass on its rules, and the account
/// rules (defined in code) stay.
#[tokio::test]
async fn a_reloaded_limits_file_keeps_the_internal_pass_and_the_code_rules() {
    let a = app();
    let config = LayerConfig::from_toml("[[rule]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"3/min\"\n").unwrap();
    a.limits.reload(&config).unwrap();
    let names: Vec<String> = a.limits.api.rules().iter().map(|r| r.name().to_owned()).collect();
    assert_eq!(names, ["ip", "account-minute", "account-day"]);
    let internal = |token: &str| {
        let mut req = api("/api/me", Some("free-1"), "14.1.1.1");
        req.headers_mut().insert(example::INTERNAL_HEADER, token.parse().unwrap());
        req
    };
    for i in 0..10 {
        assert_eq!(send(&a.public, internal(TOKEN)).await.status(), StatusCode::OK, "request {i}");
    }
    for _ in 0..3 {
        assert_eq!(send(&a.public, internal("wrong")).await.status(), StatusCode::OK);
    }
    assert_rejected_by(&send(&a.public, internal("wrong")).await, "ip");
}

/// Issue 42: `POST /api/completions` holds at most 3 of an API key's completions in
/// flight; the fourth is a 429 with `Retry-After` whose headers describe the per-minute
/// rule; once they end, the key may send again.
#[tokio::test]
async fn completions_hold_three_in_flight_per_api_key() {
    let a = app();
    let post = |key: &str| {
        let req = Request::post("/api/completions").header("x-api-key", key).body(Body::empty()).unwrap();
        from_ip(req, "203.0.113.7")
    };
    let running: Vec<_> = (0..3).map(|_| tokio::spawn(a.public.clone().oneshot(post("pro-1")))).collect();
    tokio::time::sleep(example::COMPLETION_TIME / 4).await;
    let refused = send(&a.public, post("pro-1")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key(http::header::RETRY_AFTER));
    assert_eq!(header(&refused, &X_RATELIMIT_LIMIT), "60", "the headers describe the per-minute rule");
    assert_eq!(send(&a.public, post("pro-2")).await.status(), StatusCode::OK, "another key is not held back");
    assert_eq!(permits_held(&a).await, 3.0, "the gauge counts the permits held");
    for r in running {
        let res = r.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(body(res).await, "Once upon a time…\n");
    }
    assert_eq!(send(&a.public, post("pro-1")).await.status(), StatusCode::OK);
    assert_eq!(permits_held(&a).await, 0.0, "every permit went back");
}

/// `tollgate_permits_held` of the completions' concurrency rule, scraped.
async fn permits_held(a: &App) -> f64 {
    let scrape = body(send(&a.internal, Request::get("/metrics").body(Body::empty()).unwrap()).await).await;
    let line = scrape.lines().find(|l| l.starts_with("tollgate_permits_held{rule=\"completions-in-flight\"}"));
    line.and_then(|l| l.rsplit(' ').next()).map_or_else(|| panic!("no gauge in {scrape}"), |v| v.parse().unwrap())
}
