//! What a response says: `Retry-After`, the legacy and IETF headers agree on one moment,
//! a cached refusal repeats the store's, and nested layers describe both.

use crate::common::{app, get};
use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use support::fake::{Remote, T0};
use support::sf_params;
use tokio::sync::Notify;
use tollgate::clock::ManualClock;
use tollgate::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RULE};
use tollgate::key;
use tollgate::{Algorithm, HeaderStyle, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};

// 13 and 15. Header values, read back with a structured-field parser.

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

#[tokio::test]
async fn on_a_429_retry_after_t_and_reset_name_one_moment() {
    let clock = ManualClock::new(T0);
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
        .rule("default", Quota::per_hour(10), key::Global)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap()
        .headers(HeaderStyle::Both)
        .layer(app(Arc::default()));
    for _ in 0..10 {
        assert_eq!(svc.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::OK);
    }
    clock.advance(Duration::from_secs(2));
    let no = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = no.headers();
    let retry: u64 = h[http::header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert_eq!(retry, 358, "one every 360 s; 2 s have passed");
    let t = sf_params(&h["ratelimit"])[0].1.iter().find(|(k, _)| k == "t").unwrap().1;
    assert_eq!(t, 358, "t and Retry-After disagree (t used to be the full reset, 3598)");
    let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert!(reset.abs_diff(unix_now() + 358) <= 1, "X-RateLimit-Reset {reset}");
}

#[tokio::test]
async fn on_a_2xx_t_and_reset_name_when_more_quota_comes() {
    let clock = ManualClock::new(T0);
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(clock.clone()))
        .rule("default", Quota::per_minute(3), key::Global)
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
        .unwrap()
        .headers(HeaderStyle::Both)
        .layer(app(Arc::default()));
    svc.clone().oneshot(get("/")).await.unwrap();
    clock.advance(Duration::from_secs(15));
    let ok = svc.clone().oneshot(get("/")).await.unwrap();
    let h = ok.headers();
    // The first unit leaves the window 45 s from now: one more fits then.
    let params = &sf_params(&h["ratelimit"])[0].1;
    assert_eq!(params, &[("r".to_owned(), 1), ("t".to_owned(), 45)]);
    let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert!(reset.abs_diff(unix_now() + 45) <= 1, "X-RateLimit-Reset {reset}");
}

#[tokio::test]
async fn a_policy_of_a_sub_second_period_states_its_rate() {
    let svc = RateLimitLayer::new(Quota::new(1, Duration::from_millis(250)), key::Global, MemoryStore::new())
        .headers(HeaderStyle::Ietf)
        .layer(app(Arc::default()));
    let ok = svc.oneshot(get("/")).await.unwrap();
    let policy = sf_params(&ok.headers()["ratelimit-policy"]);
    assert_eq!(policy, [("default".to_owned(), vec![("q".to_owned(), 4), ("w".to_owned(), 1)])], "1/250ms was q=1;w=1");
}

// R5. A 429 answered by the blocked-key cache said `remaining: 0` where the store's 429
// for the same request had said 2.

#[tokio::test]
async fn a_cached_429_says_what_the_stores_429_said() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::builder(store.clone())
        .rule("per-user", Quota::per_hour(5), key::Global)
        .cost(|_| 3)
        .build()
        .unwrap()
        .headers(HeaderStyle::Both);
    let svc = layer.layer(app(Arc::new(Notify::new())));
    let mut seen = Vec::new();
    for _ in 0..3 {
        let res = svc.clone().oneshot(get("/")).await.unwrap();
        let h = |n: &str| res.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        seen.push((res.status(), h("x-ratelimit-remaining"), h("retry-after"), h("ratelimit"), h("x-ratelimit-reset")));
    }
    assert_eq!(seen[0].0, StatusCode::OK);
    assert_eq!(seen[1].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.checks(), 2, "the third request was answered by the cache");
    assert_eq!(seen[1].1.as_deref(), Some("2"), "the store's 429: 2 units left, 3 asked");
    assert_eq!(seen[2], seen[1], "the cache's 429 differs from the store's");
}

/// A tier's 429 from the blocked-key cache says the tier's quota, as the store's did (not
/// the rule's own quota, given to `Rule::new`).
#[tokio::test]
async fn a_cached_429_of_a_tier_says_the_tiers_quota() {
    const PRO: Quota = Quota::per_hour(2);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("per-account", Quota::per_hour(1), key::Global).quota_fn(|_| Some(PRO)))
        .build()
        .unwrap()
        .headers(HeaderStyle::Both);
    let svc = layer.layer(app(Arc::new(Notify::new())));
    let mut seen = Vec::new();
    for _ in 0..4 {
        let res = svc.clone().oneshot(get("/")).await.unwrap();
        let h = |n: &str| res.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        seen.push((res.status(), h("x-ratelimit-limit"), h("ratelimit-policy"), h("retry-after"), h("ratelimit")));
    }
    let statuses: Vec<StatusCode> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS]
    );
    assert_eq!(store.checks(), 3, "the fourth request was answered by the cache");
    assert_eq!(seen[2].1, Some(PRO.limit().to_string()), "the store's 429 says the tier's limit");
    assert_eq!(seen[3], seen[2], "the cache's 429 differs from the store's");
}

// Nested layers (issue 27): the README's `.route_layer(login)` inside `.layer(api)`. The
// outer layer's headers used to overwrite the inner one's: a login 429 said `ip` 86/100
// and a reset ten seconds away while `Retry-After` said an hour.

/// An axum app: `/login` answers 401 (a failed login) behind a login limit of 5 that
/// counts 401s and blocks for an hour; every route behind a per-IP limit of 100.
fn nested(style: HeaderStyle) -> axum::Router {
    let store = MemoryStore::new();
    let login = RateLimitLayer::builder(store.clone())
        .add_rule(
            Rule::new("login", Quota::per_minute(5), key::Global)
                .count_if(|status| status == StatusCode::UNAUTHORIZED)
                .block_for(Duration::from_secs(3600)),
        )
        .build()
        .unwrap()
        .headers(style);
    let api = RateLimitLayer::builder(store)
        .rule("ip", Quota::per_minute(100), key::Global)
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
        .unwrap()
        .headers(style);
    axum::Router::new()
        .route("/login", axum::routing::post(|| async { StatusCode::UNAUTHORIZED }))
        .route_layer(login)
        .route("/items", axum::routing::get(|| async { "items" }))
        .layer(api)
}

fn post(path: &str) -> Request<Body> {
    Request::post(path).body(Body::empty()).unwrap()
}

fn unix_header(h: &http::HeaderMap, name: &str) -> u64 {
    h[name].to_str().unwrap().parse().unwrap()
}

/// The legacy headers describe the most restrictive rule of both layers; an inner 429's
/// `Retry-After` and `X-RateLimit-Reset` are never contradicted.
#[tokio::test]
async fn nested_layers_describe_the_most_restrictive_rule_of_both() {
    let app = nested(HeaderStyle::Legacy);
    // A 401 from /login: login has 4 of 5 left, ip 99 of 100 — login is the tighter one.
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let h = res.headers();
    assert_eq!(h["x-ratelimit-remaining"], "4");
    assert_eq!(h["x-ratelimit-limit"], "5");
    // The login layer has one rule, so it names none; the outer one never names its own
    // over headers it did not write.
    assert!(h.get("x-ratelimit-rule").is_none(), "{h:?}");
    // /items has only the ip rule: its own headers, as before.
    let res = app.clone().oneshot(get("/items")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "98");
    for _ in 0..4 {
        app.clone().oneshot(post("/login")).await.unwrap();
    }
    // The sixth failed login: refused by the inner layer and blocked for an hour.
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = res.headers();
    let retry = unix_header(h, "retry-after");
    assert!((3590..=3600).contains(&retry), "Retry-After {retry}");
    assert!(h.get("x-ratelimit-rule").is_none(), "the outer layer named its own rule over a 429: {h:?}");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    let reset = unix_header(h, "x-ratelimit-reset");
    assert!(reset.abs_diff(unix_now() + retry) <= 1, "X-RateLimit-Reset {reset} contradicts Retry-After {retry}");
    // The outer rule is the tighter one: its headers, naming it.
    let app = nested(HeaderStyle::Legacy);
    for _ in 0..98 {
        app.clone().oneshot(get("/items")).await.unwrap();
    }
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    let h = res.headers();
    assert_eq!(h["x-ratelimit-rule"], "ip");
    assert_eq!(h["x-ratelimit-remaining"], "1");
    assert_eq!(h["x-ratelimit-limit"], "100");
}

/// The IETF headers of nested layers: `RateLimit-Policy` lists every policy of both,
/// `RateLimit` both rules, the most restrictive first (read with a structured-field
/// parser).
#[tokio::test]
async fn nested_layers_list_every_policy_and_the_tightest_rule_first() {
    let app = nested(HeaderStyle::Ietf);
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    let h = res.headers();
    let names = |v| sf_params(v).into_iter().map(|(name, _)| name).collect::<Vec<_>>();
    assert_eq!(names(&h["ratelimit-policy"]), ["login", "ip"]);
    let limits = sf_params(&h["ratelimit"]);
    assert_eq!(limits.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["login", "ip"]);
    assert_eq!(limits[0].1[0], ("r".to_owned(), 4));
    assert_eq!(limits[1].1[0], ("r".to_owned(), 99));
    // A route with the outer layer only: one policy, as before.
    let res = app.clone().oneshot(get("/items")).await.unwrap();
    assert_eq!(names(&res.headers()["ratelimit-policy"]), ["ip"]);
    // When the outer layer is the tighter one, it comes first.
    for _ in 0..97 {
        app.clone().oneshot(get("/items")).await.unwrap();
    }
    let res = app.clone().oneshot(post("/login")).await.unwrap();
    let limits = sf_params(&res.headers()["ratelimit"]);
    assert_eq!(limits.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["ip", "login"], "{limits:?}");
    assert_eq!(limits[0].1[0], ("r".to_owned(), 0));
}

/// The header style is the layer's: set on its builder or its configuration, a later
/// `RateLimitLayer::headers` replaces it, and a reloaded configuration that names none
/// keeps it (found by review: the builder's style used to win over a later one).
#[tokio::test]
async fn the_last_header_style_set_on_a_layer_wins() {
    use tollgate::headers::{RATELIMIT_POLICY, X_RATELIMIT_LIMIT};
    let answer = |layer: RateLimitLayer<MemoryStore>| async move {
        let res = layer.layer(app(Arc::default())).oneshot(get("/")).await.unwrap();
        (res.headers().contains_key(X_RATELIMIT_LIMIT), res.headers().contains_key(RATELIMIT_POLICY))
    };
    let built = |style| {
        RateLimitLayer::builder(MemoryStore::new()).rule("api", Quota::per_minute(10), key::Global).headers(style)
    };
    assert_eq!(answer(built(HeaderStyle::Ietf).build().unwrap()).await, (false, true));
    let replaced = built(HeaderStyle::Ietf).build().unwrap().headers(HeaderStyle::None);
    assert_eq!(answer(replaced).await, (false, false), "the layer's later style wins");

    let toml = "headers = \"ietf\"\n[[rule]]\nname = \"api\"\nkey = \"global\"\nquota = \"10/min\"";
    let config = tollgate::LayerConfig::from_toml(toml).unwrap();
    let from_file = config.build(MemoryStore::new()).unwrap();
    assert_eq!(answer(from_file.clone()).await, (false, true));
    assert_eq!(answer(from_file.headers(HeaderStyle::Legacy)).await, (true, false), "and over a file's");

    let layer = built(HeaderStyle::Ietf).build().unwrap();
    let no_style = "[[rule]]\nname = \"other\"\nkey = \"global\"\nquota = \"10/min\"";
    layer.handle().reload(&tollgate::LayerConfig::from_toml(no_style).unwrap()).unwrap();
    assert_eq!(answer(layer.clone()).await, (false, true), "a reload naming no style keeps the layer's");
    let legacy = no_style.replace("[[rule]]", "headers = \"legacy\"\n[[rule]]");
    layer.handle().reload(&tollgate::LayerConfig::from_toml(&legacy).unwrap()).unwrap();
    assert_eq!(answer(layer).await, (true, false), "a reload naming one overrides it");
}

/// A request with `x-key: key`.
fn keyed(key: &str) -> Request<Body> {
    Request::get("/").header("x-key", key).body(Body::empty()).unwrap()
}

/// Two layers with different limits of 10,000 and more, interleaved on one thread: each
/// response says its own limit (the per-thread cache never shows another layer's).
#[tokio::test]
async fn interleaved_layers_each_say_their_own_limit() {
    let ok = || tower::service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(http::Response::new(Body::empty())) });
    let layer = |n| RateLimitLayer::new(Quota::per_minute(n), key::header("x-key"), MemoryStore::new());
    let (a, b, c) = (layer(10_000).layer(ok()), layer(25_000).layer(ok()), layer(7).layer(ok()));
    for i in 0..5u64 {
        for (svc, limit) in [(&a, 10_000u64), (&b, 25_000), (&a, 10_000), (&c, 7), (&c, 7), (&b, 25_000)] {
            let res = svc.clone().oneshot(keyed("k")).await.unwrap();
            assert_eq!(res.headers()[X_RATELIMIT_LIMIT], limit.to_string().as_str(), "round {i}");
        }
    }
    let res = b.clone().oneshot(keyed("k")).await.unwrap();
    assert_eq!(res.headers()[X_RATELIMIT_REMAINING], "24989");
}

/// A response that already carries an `X-RateLimit-Rule` of its own (a proxied upstream's,
/// whose `X-RateLimit-Remaining` is not a number this crate reads) under a one-rule layer:
/// the layer writes its own limit, remaining and reset; a rule name left there says they
/// are that other rule's. The layer removes it (a change that kept it was caught in review).
#[tokio::test]
async fn a_foreign_rule_name_is_not_left_over_the_layers_headers() {
    let upstream = tower::service_fn(|_: Request<Body>| async {
        let res = http::Response::builder()
            .header("x-ratelimit-rule", "upstream-daily")
            .header("x-ratelimit-remaining", "unlimited")
            .body(Body::empty())
            .unwrap();
        Ok::<_, Infallible>(res)
    });
    let svc = RateLimitLayer::new(Quota::per_minute(10), key::header("x-key"), MemoryStore::new()).layer(upstream);
    let res = svc.oneshot(keyed("k")).await.unwrap();
    let h = res.headers();
    assert_eq!(h[X_RATELIMIT_LIMIT], "10");
    assert_eq!(h[X_RATELIMIT_REMAINING], "9");
    assert_eq!(h.get(X_RATELIMIT_RULE), None, "the layer's numbers under another rule's name: {h:?}");
}
