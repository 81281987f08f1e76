//! What a client reads in a refusal's body (issue 38, item 6): the JSON 503 of a request
//! refused because the store failed under `FailMode::Closed` says why and when to retry,
//! as the JSON 429 does, and its `retry_after` agrees with `Retry-After`.

use crate::support;

use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use support::fake::{Mode, Remote, T0};
use tollgate::clock::ManualClock;
use tollgate::{key, response, FailMode, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};

#[tokio::test]
async fn a_fail_closed_503_has_a_json_body_that_agrees_with_retry_after() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("login", Quota::per_minute(5), key::header("x-key")).fail_mode(FailMode::Closed))
        .circuit_breaker(1, Duration::from_secs(3))
        .build()
        .unwrap()
        .on_rejected(response::json())
        .on_unavailable(response::json_unavailable());
    let svc = layer.layer(crate::common::app(Default::default()));
    let req = || http::Request::get("/").header("x-key", "k").body(axum::body::Body::empty()).unwrap();
    store.set(Mode::Failing);
    let _ = svc.clone().oneshot(req()).await.unwrap(); // opens the circuit
    let res = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["content-type"], "application/json");
    let retry: u64 = res.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"], "unavailable", "{json}");
    assert_eq!(json["retry_after"].as_u64(), Some(retry), "{json} vs Retry-After {retry}");
    assert!((2..=3).contains(&retry), "the circuit's cool-down: {retry}");
}

/// A login rule counting only 401s: a successful login took nothing, and its headers say
/// so (it said one unit fewer, though the unit went back); a failed one took its unit.
#[tokio::test]
async fn a_response_whose_status_does_not_count_says_its_unit_is_back() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .add_rule(
            Rule::new("login", Quota::per_minute(5), key::header("x-key")).count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let svc = layer.layer(crate::common::app(Default::default()));
    let req = |path: &str| http::Request::get(path).header("x-key", "ada").body(axum::body::Body::empty()).unwrap();
    let remaining = |res: &http::Response<axum::body::Body>| res.headers()["x-ratelimit-remaining"].clone();
    let ok = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(remaining(&ok), "5", "a 200 counts nothing: all 5 remain");
    let failed = svc.clone().oneshot(req("/fail")).await.unwrap();
    assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(remaining(&failed), "4", "a 401 took its unit");
    let ok = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(remaining(&ok), "4", "one failure counted, this success nothing");
}

/// A penalty block says so (a 429 that looked like any other): a login rule of 2 a minute
/// that blocks for an hour on its first rejection answers `"blocked":true` with the
/// block's rest, and an ordinary rule's 429 says `"blocked":false`.
#[tokio::test]
async fn a_penalty_block_says_blocked() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .add_rule(Rule::new("login", Quota::per_minute(2), key::header("x-key")).block_for(Duration::from_secs(3600)))
        .add_rule(Rule::new("api", Quota::per_minute(1), key::header("x-api")))
        .build()
        .unwrap()
        .on_rejected(response::json());
    let svc = layer.layer(crate::common::app(Default::default()));
    let body_of = |res: http::Response<axum::body::Body>| async move {
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
    };
    let login = || http::Request::get("/").header("x-key", "eve").body(axum::body::Body::empty()).unwrap();
    for _ in 0..2 {
        assert_eq!(svc.clone().oneshot(login()).await.unwrap().status(), StatusCode::OK);
    }
    for _ in 0..2 {
        let res = svc.clone().oneshot(login()).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let json = body_of(res).await;
        assert_eq!(json["blocked"], true, "{json}");
        assert!(json["retry_after"].as_u64().unwrap() > 3500, "the block's rest: {json}");
    }
    let api = || http::Request::get("/").header("x-api", "bob").body(axum::body::Body::empty()).unwrap();
    assert_eq!(svc.clone().oneshot(api()).await.unwrap().status(), StatusCode::OK);
    let json = body_of(svc.clone().oneshot(api()).await.unwrap()).await;
    assert_eq!(json["blocked"], false, "{json}");
}
