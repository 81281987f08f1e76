//! Nested layers merging their rate-limit headers when the inner one refuses with another
//! status than 429 (gRPC, a custom rejection), or speaks another header style.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate::{key, Algorithm, HeaderStyle, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::ServiceExt;

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn h(res: &Response<Body>, name: &str) -> Option<String> {
    res.headers().get(name).map(|v| v.to_str().unwrap().to_owned())
}

/// Inner: 10 per hour, each request costs 4 (GCRA); outer: 4 per minute, cost 1.
fn weighted_nested(style: HeaderStyle) -> axum::Router {
    let store = MemoryStore::new();
    let inner = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("uploads", Quota::per_hour(10), key::Global).cost(|_| 4))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap()
        .headers(style);
    let outer = RateLimitLayer::builder(store)
        .rule("ip", Quota::per_minute(4), key::Global)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap()
        .headers(style);
    axum::Router::new().route("/", axum::routing::post(|| async { "ok" })).layer(inner).layer(outer)
}

fn grpc() -> Request<Body> {
    Request::post("/").header("content-type", "application/grpc").body(Body::empty()).unwrap()
}

/// An inner layer's gRPC refusal (HTTP 200, grpc-status 8: tollgate's own "429" for gRPC)
/// of a request whose cost does not fit (remaining 2, cost 4): the outer layer, whose
/// `remaining` (1) is lower, took it for an allowed response and overwrote
/// `X-RateLimit-Reset` — contradicting the inner refusal's `Retry-After`.
#[tokio::test]
async fn an_inner_grpc_refusal_is_not_contradicted_by_the_outer_layer() {
    let app = weighted_nested(HeaderStyle::Legacy);
    for _ in 0..2 {
        let res = app.clone().oneshot(grpc()).await.unwrap();
        assert!(res.headers().get("grpc-status").is_none(), "{:?}", res.headers());
    }
    let res = app.clone().oneshot(grpc()).await.unwrap();
    assert_eq!(h(&res, "grpc-status").as_deref(), Some("8"), "the inner layer refuses: {:?}", res.headers());
    let retry: u64 = h(&res, "retry-after").unwrap().parse().unwrap();
    assert!(retry > 600, "Retry-After {retry}");
    let reset: u64 = h(&res, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        reset.abs_diff(unix_now() + retry) <= 1,
        "X-RateLimit-Reset {} s from now contradicts the inner refusal's Retry-After {retry} (rule {:?}, limit {:?})",
        reset as i64 - unix_now() as i64,
        h(&res, "x-ratelimit-rule"),
        h(&res, "x-ratelimit-limit"),
    );
}

/// The same over IETF headers: the inner layer refused, so `RateLimit` lists its rule
/// first.
#[tokio::test]
async fn an_inner_grpc_refusal_comes_first_in_ratelimit() {
    let app = weighted_nested(HeaderStyle::Ietf);
    for _ in 0..2 {
        app.clone().oneshot(grpc()).await.unwrap();
    }
    let res = app.clone().oneshot(grpc()).await.unwrap();
    assert_eq!(h(&res, "grpc-status").as_deref(), Some("8"));
    let limit = h(&res, "ratelimit").unwrap();
    assert!(limit.starts_with("\"uploads\""), "the refusing rule is not first: RateLimit: {limit}");
}

/// A custom rejection with another status than 429 (here 403, as `on_rejected` allows):
/// the same over HTTP.
#[tokio::test]
async fn an_inner_refusal_with_a_custom_status_is_not_contradicted() {
    let store = MemoryStore::new();
    let inner = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("uploads", Quota::per_hour(10), key::Global).cost(|_| 4))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap()
        .on_rejected(|_: &tollgate::response::Rejection<'_>| {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::FORBIDDEN;
            r
        });
    let outer = RateLimitLayer::builder(store)
        .rule("ip", Quota::per_minute(4), key::Global)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let app = axum::Router::new().route("/", axum::routing::post(|| async { "ok" })).layer(inner).layer(outer);
    let post = || Request::post("/").body(Body::empty()).unwrap();
    for _ in 0..2 {
        assert_eq!(app.clone().oneshot(post()).await.unwrap().status(), StatusCode::OK);
    }
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let retry: u64 = h(&res, "retry-after").unwrap().parse().unwrap();
    let reset: u64 = h(&res, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        reset.abs_diff(unix_now() + retry) <= 1,
        "X-RateLimit-Reset {} s from now, Retry-After {retry}; {:?}",
        reset as i64 - unix_now() as i64,
        res.headers()
    );
}

/// Inner layer IETF-only, outer legacy-only: the inner rule has 0 left (the next request
/// is refused); the legacy headers must not say 99 (they said the outer rule's).
#[tokio::test]
async fn mixed_styles_inner_ietf_outer_legacy() {
    let store = MemoryStore::new();
    let inner = RateLimitLayer::builder(store.clone())
        .rule("login", Quota::per_minute(1), key::Global)
        .build()
        .unwrap()
        .headers(HeaderStyle::Ietf);
    let outer = RateLimitLayer::builder(store)
        .rule("ip", Quota::per_minute(100), key::Global)
        .build()
        .unwrap()
        .headers(HeaderStyle::Legacy);
    let app = axum::Router::new().route("/", axum::routing::post(|| async { "ok" })).layer(inner).layer(outer);
    let post = || Request::post("/").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let next = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
    // The outer legacy layer cannot state the inner rule's limit: it says nothing rather
    // than a looser rule's.
    assert_eq!(h(&res, "x-ratelimit-remaining"), None, "{:?}", res.headers());
    assert!(h(&res, "ratelimit").unwrap().contains("r=0"));
}

/// The outer layer on a remote store (its decision and its request's life in the boxed
/// future) answers as the same layer on an in-process store: the same headers on the inner
/// layer's refusals and on allowed responses, and the same units kept and given back by
/// its count-by-outcome rule.
#[tokio::test(start_paused = true)]
async fn an_outer_layer_on_a_remote_store_answers_as_on_an_in_process_one() {
    use crate::support::fake::{settle, Remote, TokioClock};
    use tollgate::store::Store;

    async fn run<St: Store + Clone>(outer_store: St) -> Vec<(u16, Vec<(String, String)>, u64, u64)> {
        let inner = RateLimitLayer::builder(MemoryStore::with_clock(TokioClock::new()))
            .rule("inner", Quota::per_minute(3), key::header("x-key"))
            .build()
            .unwrap();
        let outer = RateLimitLayer::builder(outer_store)
            .rule("outer", Quota::per_minute(6), key::header("x-key"))
            .add_rule(
                Rule::new("login", Quota::per_minute(5), key::header("x-key"))
                    .count_if(|s| s == StatusCode::UNAUTHORIZED || s == StatusCode::TOO_MANY_REQUESTS),
            )
            .build()
            .unwrap();
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { (StatusCode::UNAUTHORIZED, "no") }))
            .layer(inner)
            .layer(outer.clone());
        let mut out = Vec::new();
        for _ in 0..5 {
            let req = Request::get("/").header("x-key", "a").body(Body::empty()).unwrap();
            let res = app.clone().oneshot(req).await.unwrap();
            settle().await;
            let mut hs: Vec<(String, String)> = res
                .headers()
                .iter()
                .filter(|(n, _)| n.as_str().contains("ratelimit") || n.as_str() == "retry-after")
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                .collect();
            hs.sort();
            let o = outer.peek("outer", "a").await.unwrap().remaining();
            let l = outer.peek("login", "a").await.unwrap().remaining();
            out.push((res.status().as_u16(), hs, o, l));
        }
        out
    }
    let local = run(MemoryStore::with_clock(TokioClock::new())).await;
    let remote = run(Remote::new(MemoryStore::with_clock(TokioClock::new()))).await;
    assert_eq!(local, remote);
    assert_eq!(local.last().unwrap().0, 429, "{local:#?}");
}

/// An inner layer of two rules names its rule (`X-RateLimit-Rule: uploads`); the outer
/// layer's rule is tighter, and its name cannot be a header value (a control character).
/// Over the outer layer's
/// numbers the inner layer's name is removed (it would say they are the inner rule's);
/// when the inner layer refuses, its 429 keeps its name and its numbers.
#[tokio::test]
async fn an_inner_rule_name_is_removed_under_the_outer_numbers_and_kept_on_its_refusal() {
    let store = MemoryStore::new();
    let inner = RateLimitLayer::builder(store.clone())
        .rule("uploads", Quota::per_hour(100), key::Global)
        .rule("bytes", Quota::per_hour(1_000), key::Global)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let outer = RateLimitLayer::builder(store)
        .rule("ip\u{7f}", Quota::per_minute(3), key::Global)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let app =
        axum::Router::new().route("/", axum::routing::post(|| async { "ok" })).route_layer(inner.clone()).layer(outer);
    let post = || Request::post("/").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!((h(&res, "x-ratelimit-limit"), h(&res, "x-ratelimit-remaining")), (Some("3".into()), Some("2".into())));
    assert_eq!(h(&res, "x-ratelimit-rule"), None, "the outer layer's numbers under the inner rule's name");
    // The inner layer refuses (its uploads rule spent): its 429, its rule, untouched.
    while inner.limiter().check_key("uploads", "global", 1).await.is_allowed() {}
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        (h(&res, "x-ratelimit-rule"), h(&res, "x-ratelimit-limit")),
        (Some("uploads".into()), Some("100".into()))
    );
}
