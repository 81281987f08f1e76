//! The layer and service over MemoryStore (and a failing store): what a user sees.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::headers::{RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RULE};
use tollgate::store::{Check, Store};
use tollgate::RequestHead;
use tollgate::{key, Algorithm, Decision, FailMode, HeaderStyle, MemoryStore, Quota, RateLimitLayer, Rule, StoreError};
use tower::{Layer, Service, ServiceExt};

const T0: u64 = 1_700_000_000_000_000;

fn clock() -> ManualClock {
    ManualClock::new(T0)
}

/// An inner service that counts its calls and echoes the `Decision` it was given.
#[derive(Clone, Default)]
struct Counting(Arc<AtomicUsize>);

impl Counting {
    fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Service<Request<Body>> for Counting {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        let mut res = Response::new(Body::empty());
        if let Some(d) = req.extensions().get::<Decision>() {
            res.headers_mut().insert("x-seen-remaining", d.remaining().into());
        }
        if req.uri().path() == "/unauthorized" {
            *res.status_mut() = StatusCode::UNAUTHORIZED;
        }
        std::future::ready(Ok(res))
    }
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn with_header(path: &str, name: &str, value: &str) -> Request<Body> {
    Request::get(path).header(name, value).body(Body::empty()).unwrap()
}

fn from_ip(ip: &str) -> Request<Body> {
    let mut req = get("/");
    req.extensions_mut().insert(axum::extract::ConnectInfo(format!("{ip}:4000").parse::<SocketAddr>().unwrap()));
    req
}

async fn send<S>(svc: &S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    svc.clone().oneshot(req).await.unwrap()
}

#[tokio::test]
async fn clones_share_one_limiter_and_rejections_skip_the_inner_service() {
    let inner = Counting::default();
    let layer = RateLimitLayer::new(Quota::per_minute(5), key::Global, MemoryStore::with_clock(clock()));
    let svc = layer.layer(inner.clone());
    let mut statuses = Vec::new();
    for _ in 0..8 {
        // A fresh clone per request, as axum makes per connection.
        statuses.push(send(&svc.clone(), get("/")).await.status());
    }
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 5);
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count(), 3);
    assert_eq!(inner.calls(), 5, "the inner service ran for a rejected request");
    // Layering again (axum layers each route) still shares the store.
    let other = layer.layer(inner.clone());
    assert_eq!(send(&other, get("/")).await.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn rejection_carries_retry_after_and_legacy_headers() {
    let c = clock();
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(c.clone()))
        .rule("default", Quota::per_minute(2), key::Global)
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap()
        .layer(Counting::default());
    c.set(T0 - T0 % 60_000_000 + 20_000_000); // 20 s into a window
    let ok = send(&svc, get("/")).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()[X_RATELIMIT_LIMIT], "2");
    assert_eq!(ok.headers()[X_RATELIMIT_REMAINING], "1");
    assert_eq!(ok.headers()["x-seen-remaining"], "1", "the Decision reached the handler");
    send(&svc, get("/")).await;
    c.advance(Duration::from_millis(500));
    let no = send(&svc, get("/")).await;
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
    // 39.5 s to the window's end, rounded up.
    assert_eq!(no.headers()[http::header::RETRY_AFTER], "40");
    assert_eq!(no.headers()[X_RATELIMIT_REMAINING], "0");
    assert!(no.headers().get(RATELIMIT).is_none());
}

#[tokio::test]
async fn header_styles() {
    for (style, legacy, ietf) in [
        (HeaderStyle::Legacy, true, false),
        (HeaderStyle::Ietf, false, true),
        (HeaderStyle::Both, true, true),
        (HeaderStyle::None, false, false),
    ] {
        let svc = RateLimitLayer::new(Quota::per_minute(1), key::Global, MemoryStore::with_clock(clock()))
            .headers(style)
            .layer(Counting::default());
        let ok = send(&svc, get("/")).await;
        assert_eq!(ok.headers().contains_key(X_RATELIMIT_LIMIT), legacy, "{style:?}");
        assert_eq!(ok.headers().contains_key(RATELIMIT_POLICY), ietf, "{style:?}");
        let no = send(&svc, get("/")).await;
        assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(no.headers().contains_key(http::header::RETRY_AFTER), "{style:?}");
        if ietf {
            assert_eq!(no.headers()[RATELIMIT_POLICY], "\"default\";q=1;w=60");
            assert!(no.headers()[RATELIMIT].to_str().unwrap().starts_with("\"default\";r=0;t="));
        }
    }
}

#[tokio::test]
async fn on_rejected_customises_the_response_and_headers_are_still_added() {
    let svc = RateLimitLayer::new(Quota::per_minute(1), key::Global, MemoryStore::with_clock(clock()))
        .on_rejected(|r| {
            let mut res = Response::new(Body::from(format!("slow down ({})", r.rule)));
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            res
        })
        .layer(Counting::default());
    send(&svc, get("/")).await;
    let no = send(&svc, get("/")).await;
    assert_eq!(no.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(no.headers().contains_key(http::header::RETRY_AFTER));
    assert_eq!(no.headers()[X_RATELIMIT_REMAINING], "0");
    let body = axum::body::to_bytes(no.into_body(), 1024).await.unwrap();
    assert_eq!(&body[..], b"slow down (default)");
}

#[tokio::test]
async fn grpc_requests_get_resource_exhausted() {
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(clock()))
        .rule("default", Quota::per_second(1), key::Global)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap()
        .layer(Counting::default());
    let grpc = || with_header("/pkg.Svc/Call", "content-type", "application/grpc+proto");
    assert_eq!(send(&svc, grpc()).await.status(), StatusCode::OK);
    let no = send(&svc, grpc()).await;
    assert_eq!(no.status(), StatusCode::OK, "gRPC errors travel in grpc-status");
    assert_eq!(no.headers()["grpc-status"], "8");
    assert_eq!(no.headers()["content-type"], "application/grpc");
    assert!(no.headers().contains_key("grpc-message"));
    assert_eq!(no.headers()["grpc-retry-pushback-ms"], "1000");
}

#[tokio::test]
async fn a_key_extractor_returning_none_skips_the_rule() {
    let inner = Counting::default();
    let svc = RateLimitLayer::new(
        Quota::per_minute(1),
        |req: &RequestHead| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned),
        MemoryStore::with_clock(clock()),
    )
    .layer(inner.clone());
    for _ in 0..5 {
        let res = send(&svc, get("/")).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT), "an unlimited request has no headers");
    }
    assert_eq!(send(&svc, with_header("/", "x-api-key", "k")).await.status(), StatusCode::OK);
    assert_eq!(send(&svc, with_header("/", "x-api-key", "k")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&svc, with_header("/", "x-api-key", "other")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn peer_ip_keys_each_client() {
    let svc = RateLimitLayer::new(Quota::per_minute(1), key::PeerIp, MemoryStore::with_clock(clock()))
        .layer(Counting::default());
    assert_eq!(send(&svc, from_ip("1.1.1.1")).await.status(), StatusCode::OK);
    assert_eq!(send(&svc, from_ip("1.1.1.1")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&svc, from_ip("[::ffff:1.1.1.1]")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&svc, from_ip("2.2.2.2")).await.status(), StatusCode::OK);
    // Spoofing X-Forwarded-For changes nothing for PeerIp.
    let mut spoof = from_ip("1.1.1.1");
    spoof.headers_mut().insert("x-forwarded-for", "9.9.9.9".parse().unwrap());
    assert_eq!(send(&svc, spoof).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // No connect info at all: limited under one shared key, not unlimited.
    assert_eq!(send(&svc, get("/")).await.status(), StatusCode::OK);
    assert_eq!(send(&svc, get("/")).await.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn several_rules_in_one_layer() {
    let inner = Counting::default();
    let store = MemoryStore::with_clock(clock());
    let layer = RateLimitLayer::builder(store.clone())
        .rule("ip", Quota::per_minute(4), key::PeerIp)
        .rule("api-key", Quota::per_minute(2), key::header("x-api-key"))
        .build()
        .unwrap()
        .headers(HeaderStyle::Both);
    let svc = layer.layer(inner.clone());
    let req = |k: &str| {
        let mut r = from_ip("1.1.1.1");
        r.headers_mut().insert("x-api-key", k.parse().unwrap());
        r
    };
    assert_eq!(send(&svc, req("a")).await.status(), StatusCode::OK);
    let ok = send(&svc, req("a")).await;
    assert_eq!(ok.headers()[RATELIMIT_POLICY], "\"ip\";q=4;w=60, \"api-key\";q=2;w=60");
    // The api-key rule rejects; the ip rule is not charged for it.
    let no = send(&svc, req("a")).await;
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(no.headers()[X_RATELIMIT_RULE], "api-key", "the headers name the rule that rejected");
    for _ in 0..3 {
        send(&svc, req("a")).await;
    }
    // ip has used 2 of 4: two more pass with another key, then ip rejects.
    assert_eq!(send(&svc, req("b")).await.status(), StatusCode::OK);
    assert_eq!(send(&svc, req("b")).await.status(), StatusCode::OK);
    let no = send(&svc, req("c")).await;
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(no.headers()[X_RATELIMIT_RULE], "ip");
    assert_eq!(inner.calls(), 4);
}

#[test]
fn duplicate_rule_names_and_bad_quotas_are_build_errors() {
    let err = RateLimitLayer::builder(MemoryStore::new())
        .rule("a", Quota::per_minute(1), key::Global)
        .rule("a", Quota::per_hour(1), key::PeerIp)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("duplicate rule name \"a\""), "{err}");
    let err =
        RateLimitLayer::builder(MemoryStore::new()).rule("", Quota::per_minute(1), key::Global).build().unwrap_err();
    assert!(err.to_string().contains("invalid rule name"), "{err}");
    assert!("0/min".parse::<Quota>().unwrap_err().to_string().contains("limit is 0"));
}

#[tokio::test]
async fn tiers_choose_the_quota_per_request() {
    #[derive(Clone, Copy)]
    enum Tier {
        Free,
        Pro,
        Enterprise,
    }
    let tier_of = |req: &RequestHead| match req.headers().get("x-tier").map(|v| v.as_bytes()) {
        Some(b"pro") => Tier::Pro,
        Some(b"enterprise") => Tier::Enterprise,
        _ => Tier::Free,
    };
    let rule =
        Rule::new("account", Quota::per_minute(2), key::header("x-account")).quota_fn(move |req: &RequestHead| {
            match tier_of(req) {
                Tier::Free => Some(Quota::per_minute(2)),
                Tier::Pro => Some(Quota::per_minute(5)),
                Tier::Enterprise => None,
            }
        });
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(clock()))
        .add_rule(rule)
        .build()
        .unwrap()
        .layer(Counting::default());
    let req = |account: &str, tier: &str| {
        Request::get("/").header("x-account", account).header("x-tier", tier).body(Body::empty()).unwrap()
    };
    let count = |account: &'static str, tier: &'static str| {
        let svc = svc.clone();
        async move {
            let mut ok = 0;
            for _ in 0..10 {
                if send(&svc, req(account, tier)).await.status() == StatusCode::OK {
                    ok += 1;
                }
            }
            ok
        }
    };
    assert_eq!(count("f", "free").await, 2);
    assert_eq!(count("p", "pro").await, 5);
    assert_eq!(count("e", "enterprise").await, 10);
}

#[tokio::test]
async fn request_cost() {
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(clock()))
        .rule("default", Quota::per_minute(10), key::Global)
        .cost(|req: &RequestHead| if req.method() == http::Method::POST { 4 } else { 1 })
        .build()
        .unwrap()
        .layer(Counting::default());
    let post = || Request::post("/").body(Body::empty()).unwrap();
    assert_eq!(send(&svc, post()).await.headers()[X_RATELIMIT_REMAINING], "6");
    assert_eq!(send(&svc, post()).await.headers()[X_RATELIMIT_REMAINING], "2");
    assert_eq!(send(&svc, post()).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&svc, get("/")).await.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_shapes_requests() {
    // DESIGN.md: 5/s, burst 3, six at once → forwarded at 0, 200, 400, 600 ms; two rejected.
    let started = tokio::time::Instant::now();
    let forwarded = Arc::new(std::sync::Mutex::new(Vec::new()));
    let f = forwarded.clone();
    let inner = tower::service_fn(move |_req: Request<Body>| {
        f.lock().unwrap().push(started.elapsed().as_millis());
        async { Ok::<_, Infallible>(Response::new(Body::empty())) }
    });
    let svc = RateLimitLayer::builder(MemoryStore::with_clock(clock()))
        .rule("default", Quota::per_second(5).burst(3), key::Global)
        .algorithm(Algorithm::LeakyBucket)
        .build()
        .unwrap()
        .layer(inner);
    let all = futures_join_all((0..6).map(|_| svc.clone().oneshot(get("/"))).collect()).await;
    let statuses: Vec<StatusCode> = all.iter().map(|r| r.as_ref().unwrap().status()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 4);
    for r in all.iter().map(|r| r.as_ref().unwrap()).filter(|r| r.status() == StatusCode::TOO_MANY_REQUESTS) {
        assert_eq!(r.headers()[http::header::RETRY_AFTER], "1");
    }
    let mut times = forwarded.lock().unwrap().clone();
    times.sort_unstable();
    assert_eq!(times, [0, 200, 400, 600]);
}

/// Runs futures concurrently on this task (avoids a dependency for `join_all`).
async fn futures_join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let handles: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out = Vec::new();
    let mut pending: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(results.into_iter().map(Option::unwrap));
    out
}

/// A store that always fails, or never answers.
#[derive(Clone, Default)]
struct BrokenStore {
    hang: bool,
    calls: Arc<AtomicUsize>,
}

impl Store for BrokenStore {
    fn check(
        &self,
        _: &[Check],
    ) -> impl Future<Output = Result<Vec<Option<tollgate::store::Outcome>>, StoreError>> + Send {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hang = self.hang;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Err(StoreError::Unavailable("connection refused".into()))
        }
    }
    fn refund(&self, _: &[tollgate::store::Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
    fn peek(&self, _: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(Err(StoreError::Unavailable("down".into())))
    }
    fn reset(
        &self,
        _: &str,
        _: &tollgate::key::Key,
        _: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn store_failures_fall_back_by_default_pass_when_open_and_refuse_when_closed() {
    let inner = Counting::default();
    // The default: this server's share of the quota, decided in process.
    let fallback = RateLimitLayer::new(Quota::per_minute(1), key::Global, BrokenStore::default()).layer(inner.clone());
    let res = send(&fallback, get("/")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[X_RATELIMIT_LIMIT], "1", "the fallback's share");
    assert_eq!(send(&fallback, get("/")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(inner.calls(), 1);
    let open = RateLimitLayer::builder(BrokenStore::default())
        .rule("default", Quota::per_minute(1), key::Global)
        .fail_mode(FailMode::Open)
        .build()
        .unwrap()
        .layer(inner.clone());
    for _ in 0..2 {
        let res = send(&open, get("/")).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT), "a fail-open pass knows no quota");
    }
    assert_eq!(inner.calls(), 3);
    let closed = RateLimitLayer::builder(BrokenStore::default())
        .rule("default", Quota::per_minute(1), key::Global)
        .fail_mode(FailMode::Closed)
        .build()
        .unwrap()
        .layer(inner.clone());
    let res = send(&closed, get("/")).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key(http::header::RETRY_AFTER));
    assert_eq!(inner.calls(), 3);
}

#[tokio::test]
async fn a_hanging_store_costs_at_most_the_deadline_and_then_the_breaker_opens() {
    let store = BrokenStore { hang: true, ..Default::default() };
    let svc = RateLimitLayer::builder(store.clone())
        .rule("default", Quota::per_minute(1), key::Global)
        .fail_mode(FailMode::Open)
        .timeout(Duration::from_millis(30))
        .circuit_breaker(3, Duration::from_secs(60))
        .build()
        .unwrap()
        .layer(Counting::default());
    for i in 0..10 {
        let started = std::time::Instant::now();
        let res = send(&svc, get("/")).await;
        let took = started.elapsed();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(took < Duration::from_millis(500), "request {i} took {took:?}");
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 3, "the open breaker still called the store");
}

#[tokio::test]
async fn fallback_limits_while_the_store_is_down() {
    let fallback = MemoryStore::with_clock(clock());
    let svc = RateLimitLayer::builder(BrokenStore::default())
        .rule("default", Quota::per_minute(6), key::Global)
        .fallback(fallback)
        .servers(3)
        .build()
        .unwrap()
        .layer(Counting::default());
    let mut ok = 0;
    for _ in 0..10 {
        if send(&svc, get("/")).await.status() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 2, "6 per minute split over 3 instances");
}

#[tokio::test]
async fn shadow_rules_decide_but_never_reject() {
    let store = MemoryStore::with_clock(clock());
    let layer = RateLimitLayer::builder(store.clone())
        .rule("real", Quota::per_minute(5), key::Global)
        .add_rule(Rule::new("trial", Quota::per_minute(1), key::Global).shadow(true))
        .build()
        .unwrap();
    let svc = layer.layer(Counting::default());
    for _ in 0..5 {
        assert_eq!(send(&svc, get("/")).await.status(), StatusCode::OK);
    }
    assert_eq!(send(&svc, get("/")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // The shadow rule did decide: its state says it is spent.
    let check = Check {
        rule: "trial".into(),
        key: "global".into(),
        algorithm: Algorithm::default(),
        params: tollgate::store::Params::new(Quota::per_minute(1)),
    };
    assert!(!store.peek(&check).await.unwrap().allowed);
}

#[tokio::test]
async fn bypass_and_count_by_outcome() {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(clock()))
        .add_rule(
            Rule::new("login", Quota::per_minute(2), key::Global)
                .bypass_if(|req: &RequestHead| req.headers().contains_key("x-internal"))
                .count_if(|status| status == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let svc = layer.layer(Counting::default());
    // Successful requests are given back: never limited.
    for _ in 0..5 {
        assert_eq!(send(&svc, get("/ok")).await.status(), StatusCode::OK);
        tokio::task::yield_now().await; // let the spawned refund run
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Failed logins count.
    assert_eq!(send(&svc, get("/unauthorized")).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(send(&svc, get("/unauthorized")).await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(send(&svc, get("/unauthorized")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // The allow-list bypasses the rule.
    assert_eq!(send(&svc, with_header("/ok", "x-internal", "1")).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn works_inside_an_axum_router() {
    let app: axum::Router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hi" }))
        .route("/other", axum::routing::get(|| async { "there" }))
        .layer(RateLimitLayer::new(Quota::per_minute(3), key::Global, MemoryStore::with_clock(clock())));
    let mut codes = Vec::new();
    for path in ["/", "/other", "/", "/other"] {
        codes.push(app.clone().oneshot(get(path)).await.unwrap().status());
    }
    assert_eq!(codes, [StatusCode::OK, StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}
