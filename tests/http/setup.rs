//! The traps a newcomer met in their first hour, each with a test: header names from
//! configuration, a forgotten `into_make_service_with_connect_info`, custom rejections
//! (type inference, the request's head, JSON and text bodies, the fail-closed 503),
//! `http` re-exported, and rule names kept private.

use std::process::Command;

use axum::body::Body;
use http::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::headers::{RATELIMIT_POLICY, X_RATELIMIT_RULE};
use tollgate::RequestHead;
use tollgate::{key, response, FailMode, HeaderStyle, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};

const T0: u64 = 1_700_000_000_000_000;

fn ok() -> axum::Router {
    axum::Router::new().route("/", axum::routing::get(|| async { "ok" }))
}

async fn body(res: Response<Body>) -> String {
    String::from_utf8(axum::body::to_bytes(res.into_body(), 4096).await.unwrap().to_vec()).unwrap()
}

fn get() -> axum::extract::Request {
    http::Request::get("/").body(Body::empty()).unwrap()
}

#[tokio::test]
async fn a_header_name_from_configuration_in_any_case() {
    let name: String = "X-Api-Key".into(); // as read from a file
    let app = ok().layer(RateLimitLayer::new(Quota::per_minute(1), key::header(&name), MemoryStore::new()));
    let req = || http::Request::get("/").header("x-api-key", "k").body(Body::empty()).unwrap();
    assert_eq!(app.clone().oneshot(req()).await.unwrap().status(), StatusCode::OK);
    assert_eq!(app.oneshot(req()).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    let err = key::try_header("X Api Key").unwrap_err();
    assert!(err.to_string().contains("not a valid HTTP header name"), "{err}");
}

/// Run as a child process (see below): one request without connect info, twice.
#[tokio::test]
async fn child_without_connect_info() {
    if std::env::var_os("TOLLGATE_CHILD").is_none() {
        return;
    }
    let app = ok().layer(RateLimitLayer::new(Quota::per_minute(10), key::PeerIp, MemoryStore::new()));
    for _ in 0..2 {
        assert_eq!(app.clone().oneshot(get()).await.unwrap().status(), StatusCode::OK);
    }
}

#[test]
fn a_forgotten_connect_info_is_said_once_on_stderr() {
    // In a process of its own, with no tracing subscriber: what a new user would see.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "setup::child_without_connect_info", "--nocapture", "--test-threads=1"])
        .env("TOLLGATE_CHILD", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("into_make_service_with_connect_info").count(), 1, "{stderr}");
    assert!(stderr.contains("\"unknown\""), "{stderr}");
}

#[tokio::test]
async fn on_rejected_infers_its_closure_and_sees_the_request() {
    // No annotation on `r`: its type comes from `on_rejected`.
    let layer = RateLimitLayer::new(Quota::per_minute(1), key::Global, MemoryStore::new()).on_rejected(|r| {
        let html = r.headers.get(ACCEPT).is_some_and(|a| a.as_bytes().starts_with(b"text/html"));
        let wait = r.decision.retry_after_secs().unwrap();
        let body = if html { format!("<p>{} on {}: {wait} s</p>", r.rule, r.uri.path()) } else { format!("{wait}") };
        let mut res = Response::new(Body::from(body));
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        res
    });
    let app = ok().layer(layer);
    app.clone().oneshot(get()).await.unwrap();
    let html = http::Request::get("/").header(ACCEPT, "text/html").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(html).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry = res.headers()[RETRY_AFTER].to_str().unwrap().to_owned();
    assert_eq!(body(res).await, format!("<p>default on /: {retry} s</p>"));
    let res = app.oneshot(get()).await.unwrap();
    let retry = res.headers()[RETRY_AFTER].to_str().unwrap().to_owned();
    assert_eq!(body(res).await, retry, "the body agrees with Retry-After");
}

#[tokio::test]
async fn ready_made_json_and_text_rejections() {
    let clock = ManualClock::new(T0);
    let app = ok().layer(
        RateLimitLayer::new(Quota::per_minute(2), key::Global, MemoryStore::with_clock(clock.clone()))
            .on_rejected(response::json()),
    );
    for _ in 0..2 {
        app.clone().oneshot(get()).await.unwrap();
    }
    clock.advance(std::time::Duration::from_millis(500));
    let res = app.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()[CONTENT_TYPE], "application/json");
    let retry: u64 = res.headers()[RETRY_AFTER].to_str().unwrap().parse().unwrap();
    let json: serde_json::Value = serde_json::from_str(&body(res).await).unwrap();
    assert_eq!(json["error"], "rate_limited");
    assert_eq!(json["rule"], "default");
    assert_eq!((json["limit"].as_u64(), json["remaining"].as_u64()), (Some(2), Some(0)));
    assert_eq!(json["retry_after"].as_u64(), Some(retry), "the body and Retry-After disagree");

    // A rule name that needs escaping, and a cost that never fits (no Retry-After).
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .add_rule(Rule::new("say \"hi\"\n", Quota::per_minute(2), key::Global).cost(|_: &RequestHead| 5))
        .build()
        .unwrap()
        .on_rejected(response::json());
    let res = ok().layer(layer).oneshot(get()).await.unwrap();
    assert!(res.headers().get(RETRY_AFTER).is_none());
    let json: serde_json::Value = serde_json::from_str(&body(res).await).unwrap();
    assert_eq!(json["rule"], "say \"hi\"\n");
    assert!(json["retry_after"].is_null());

    let app = ok().layer(
        RateLimitLayer::new(Quota::per_minute(1), key::Global, MemoryStore::new()).on_rejected(response::text()),
    );
    app.clone().oneshot(get()).await.unwrap();
    let res = app.oneshot(get()).await.unwrap();
    assert_eq!(res.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
    let retry = res.headers()[RETRY_AFTER].to_str().unwrap().to_owned();
    assert_eq!(body(res).await, format!("Too many requests: retry in {retry} s.\n"));
}

#[derive(Clone, Default)]
struct Down;

impl tollgate::store::Store for Down {
    fn check(
        &self,
        _: &[tollgate::store::Check],
    ) -> impl std::future::Future<Output = Result<Vec<Option<tollgate::store::Outcome>>, tollgate::StoreError>> + Send
    {
        std::future::ready(Err(tollgate::StoreError::Unavailable("down".into())))
    }
    fn refund(
        &self,
        _: &[tollgate::store::Refund],
    ) -> impl std::future::Future<Output = Result<(), tollgate::StoreError>> + Send {
        std::future::ready(Ok(()))
    }
    fn peek(
        &self,
        _: &tollgate::store::Check,
    ) -> impl std::future::Future<Output = Result<tollgate::Decision, tollgate::StoreError>> + Send {
        std::future::ready(Err(tollgate::StoreError::Unavailable("down".into())))
    }
    fn reset(
        &self,
        _: &str,
        _: &tollgate::key::Key,
        _: tollgate::Algorithm,
    ) -> impl std::future::Future<Output = Result<(), tollgate::StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn the_fail_closed_503_can_be_customised() {
    let app = ok().layer(
        RateLimitLayer::builder(Down)
            .rule("default", Quota::per_minute(1), key::Global)
            .fail_mode(FailMode::Closed)
            .build()
            .unwrap()
            .on_unavailable(|u| {
                let mut res = Response::new(Body::from(format!("limiter down: {}", u.error)));
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                res
            }),
    );
    let res = app.oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[RETRY_AFTER], "1");
    assert_eq!(body(res).await, "limiter down: store unavailable: down");
}

#[tokio::test]
async fn http_is_reexported_for_key_closures() {
    // An app that names no `http` of its own writes tollgate::http.
    let key = |req: &RequestHead| req.headers().get("x-user").map(|v| v.as_bytes().to_vec());
    let app = ok().layer(RateLimitLayer::new(Quota::per_minute(1), key, MemoryStore::new()));
    let req = || http::Request::get("/").header("x-user", "u").body(Body::empty()).unwrap();
    app.clone().oneshot(req()).await.unwrap();
    assert_eq!(app.oneshot(req()).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn rule_names_can_be_kept_private() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .add_rule(Rule::new("fraud-score-v3", Quota::per_minute(1), key::Global).public_name("api"))
        .add_rule(Rule::new("internal-burst", Quota::per_hour(100), key::Global).public_name(""))
        .build()
        .unwrap()
        .headers(HeaderStyle::Both);
    let svc = layer.layer(ok());
    let res = svc.clone().oneshot(get()).await.unwrap();
    let policy = res.headers()[RATELIMIT_POLICY].to_str().unwrap().to_owned();
    assert!(!policy.contains("fraud") && !policy.contains("internal"), "{policy}");
    assert!(policy.starts_with("\"api\";q=1;w=60, \"\";q=100;w=3600"), "{policy}");
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.headers()[X_RATELIMIT_RULE], "api");
}

/// Run as a child process (see below): three `RateLimitLayer::new` over one store.
#[test]
fn child_with_two_new_layers_over_one_store() {
    if std::env::var_os("TOLLGATE_CHILD").is_none() {
        return;
    }
    let store = MemoryStore::new();
    let _search = RateLimitLayer::new(Quota::per_minute(10), key::PeerIp, store.clone());
    let _upload = RateLimitLayer::new(Quota::per_minute(5), key::PeerIp, store.clone());
    let _export = RateLimitLayer::new(Quota::per_minute(5), key::PeerIp, store);
}

#[test]
fn a_shared_default_rule_name_is_said_on_stderr() {
    // `RateLimitLayer::new` cannot fail: the second layer shares the first's count, and
    // a new user, with no tracing subscriber, is told so and how to name the rules.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "setup::child_with_two_new_layers_over_one_store", "--nocapture", "--test-threads=1"])
        .env("TOLLGATE_CHILD", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("share one count").count(), 1, "said once per process: {stderr}");
    assert!(stderr.contains("\"default\"") && stderr.contains("RateLimitLayer::builder(store).rule("), "{stderr}");
}
