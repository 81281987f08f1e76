//! What users of other rate limiters keep asking for: the near-limit signal, penalties,
//! charges after the response, hashed client keys and limits changed at runtime — through
//! the layer, on `MemoryStore` and on real Redis.
#![cfg(all(feature = "redis", feature = "memory", feature = "metrics"))]

use crate::support;

use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use support::redis::RedisServer;
use support::{counter, llm};
use tollgate::store::Store;
use tollgate::{key, Algorithm, FailMode, MemoryStore, Quota, RateLimitLayer, RedisStore};
use tower::{Layer, Service, ServiceExt};

fn ok() -> impl Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible, Future: Send> + Clone
{
    tower::service_fn(|_req: Request<Body>| async { Ok(Response::new(Body::empty())) })
}

fn get(user: &str) -> Request<Body> {
    Request::get("/").header("x-user", user).body(Body::empty()).unwrap()
}

/// Runs `f` on a current-thread runtime with a Prometheus recorder of its own; returns
/// what `f` returned and the scrape.
fn with_metrics<T>(f: impl std::future::Future<Output = T>) -> (T, String) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let out = metrics::with_local_recorder(&recorder, || rt.block_on(f));
    (out, handle.render())
}

// ---------------------------------------------------------------------------------------
// Near-limit signal

async fn ten_requests<St: Store>(store: St) -> Vec<StatusCode> {
    let layer = RateLimitLayer::builder(store)
        .rule("api", Quota::per_minute(10), key::header("x-user"))
        .rule("half", Quota::per_minute(20), key::header("x-user"))
        .algorithm(Algorithm::Gcra)
        .near_limit(0.5)
        .build()
        .unwrap();
    let svc = layer.layer(ok());
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(svc.clone().oneshot(get("ada")).await.unwrap().status());
    }
    statuses
}

#[test]
fn the_near_limit_metric_counts_admissions_that_leave_the_share_in_use() {
    let server = RedisServer::start();
    for name in ["memory", "redis"] {
        let (statuses, scrape) = with_metrics(async {
            if name == "memory" {
                ten_requests(MemoryStore::new()).await
            } else {
                let redis = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
                ten_requests(redis).await
            }
        });
        assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 10, "{name}: {statuses:?}");
        // Half or more in use: the 5th to 10th of 10 (6), the 10th of 20 (1); the 11th was
        // rejected and counts in neither.
        assert_eq!(counter(&scrape, "tollgate_near_limit_total", &["rule=\"api\""]), 6.0, "{name}:\n{scrape}");
        assert_eq!(counter(&scrape, "tollgate_near_limit_total", &["rule=\"half\""]), 1.0, "{name}:\n{scrape}");
        // Labelled by rule only, never by key.
        assert!(!scrape.contains("ada"), "{name}: a client key in the metrics:\n{scrape}");
    }
}

#[test]
fn a_near_limit_share_outside_zero_to_one_is_refused() {
    for share in [0.0, -0.5, 1.5, f64::NAN] {
        let err = RateLimitLayer::builder(MemoryStore::new())
            .rule("default", Quota::per_minute(10), key::Global)
            .near_limit(share)
            .build()
            .expect_err("refused when built, not at request time");
        assert!(matches!(&err, tollgate::BuildError::InvalidConfig { field, .. } if field == "near_limit"), "{err:?}");
        assert!(err.to_string().contains("use a number in (0, 1]"), "{err}");
    }
    let default = tollgate::Decision::new(true, 10, 2);
    assert!(default.is_near_limit(0.8) && !default.is_near_limit(0.9));
    assert!(!tollgate::Decision::new(false, 10, 2).is_near_limit(0.8), "a rejection is not near");
}

// ---------------------------------------------------------------------------------------
// Client keys not stored in plain text

const SECRET: &str = "0123456789abcdef-application-secret";

async fn statuses<S>(svc: &S, user: &str, n: usize) -> Vec<StatusCode>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(svc.clone().oneshot(get(user)).await.unwrap().status());
    }
    out
}

fn all_keys(cmd: impl Fn(&[&str]) -> String) -> String {
    cmd(&["--scan", "--pattern", "*"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_keys_keep_client_keys_out_of_redis() {
    let server = RedisServer::start();
    let store = || RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
    let layer = |store: RedisStore| {
        RateLimitLayer::builder(store)
            .rule("per-key", Quota::per_minute(3), key::header("x-user"))
            .rule("per-key-daily", Quota::per_day(100), key::header("x-user"))
            .build()
            .unwrap()
    };
    let api_key = "sk_live_51HxLmn0pQ";
    let hashed = layer(store().hash_keys(SECRET).unwrap());
    let svc = hashed.clone().layer(ok());
    let got = statuses(&svc, api_key, 4).await;
    assert_eq!(got, [StatusCode::OK, StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    let names = all_keys(|a| server.cmd(a));
    // One key per rule, beside the servers' announcements (`<prefix>:servers`).
    assert_eq!(names.lines().filter(|n| !n.ends_with(":servers")).count(), 2, "one key per rule: {names}");
    assert!(!names.contains(api_key) && !names.contains("sk_live"), "the key in clear: {names}");
    assert!(names.lines().all(|n| n.starts_with("tollgate:{%K") || n == "tollgate:servers"), "{names}");
    // Nor in the values.
    for name in names.lines() {
        assert!(!server.cmd(&["DUMP", name]).contains("sk_live"), "{name}");
    }
    // Admin calls take the clear key.
    let d = hashed.peek("per-key", api_key).await.unwrap();
    assert!(!d.allowed, "{d:?}");
    hashed.reset("per-key", api_key).await.unwrap();
    assert!(hashed.peek("per-key", api_key).await.unwrap().allowed);
    drop((hashed, svc));

    // Another server with the same secret shares the limit; another secret does not.
    let same = layer(store().hash_keys(SECRET).unwrap()).layer(ok());
    assert_eq!(statuses(&same, api_key, 4).await.last(), Some(&StatusCode::TOO_MANY_REQUESTS));
    drop(same);
    let other = layer(store().hash_keys("another secret, 16+ bytes").unwrap()).layer(ok());
    assert!(statuses(&other, api_key, 3).await.iter().all(|s| *s == StatusCode::OK));
    // A secret too short is refused, saying why.
    let err = store().hash_keys("short").unwrap_err().to_string();
    assert!(err.contains("16 or more"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_keys_keep_one_clients_rules_in_one_cluster_slot() {
    let cluster = support::redis::RedisCluster::start(3);
    let store = RedisStore::cluster(cluster.urls())
        .unwrap()
        .response_timeout(Duration::from_secs(2))
        .hash_keys(SECRET)
        .unwrap();
    store.ping().await.unwrap();
    let layer = RateLimitLayer::builder(store)
        .rule("per-minute", Quota::per_minute(2), key::header("x-user"))
        .rule("per-day", Quota::per_day(100), key::header("x-user"))
        .build()
        .unwrap();
    let svc = layer.clone().layer(ok());
    for user in ["ada", "grace", "sk_live_x"] {
        // Both rules in one script call (one slot): two admitted, the third refused.
        let got = statuses(&svc, user, 3).await;
        assert_eq!(got, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS], "{user}");
        assert_eq!(layer.peek("per-day", user).await.unwrap().remaining(), 97, "{user}");
    }
    let names: String = cluster.cmd_all(&["KEYS", "*"]).concat();
    assert!(!names.contains("ada") && !names.contains("sk_live"), "{names}");
}

// ---------------------------------------------------------------------------------------
// Penalties: block_for

use tollgate::clock::ManualClock;
use tollgate::Rule;

const T0: u64 = 1_700_000_000_000_000;

fn login(path: &str, user: &str) -> Request<Body> {
    Request::post(path).header("x-user", user).body(Body::empty()).unwrap()
}

/// 401 for `/login/wrong`, 200 otherwise.
fn auth(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible, Future: Send> + Clone {
    tower::service_fn(|req: Request<Body>| async move {
        let mut res = Response::new(Body::empty());
        if req.uri().path() == "/login/wrong" {
            *res.status_mut() = StatusCode::UNAUTHORIZED;
        }
        Ok(res)
    })
}

async fn send<S>(svc: &S, path: &str) -> Result<Response<Body>, std::convert::Infallible>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible> + Clone,
{
    svc.clone().oneshot(login(path, "mallory")).await
}

/// Lets the detached count-by-outcome task give its units back (a store call: real time).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn retry_after(res: &Response<Body>) -> Option<u64> {
    res.headers().get("retry-after").map(|v| v.to_str().unwrap().parse().unwrap())
}

/// Five failed logins in fifteen minutes, and the sixth attempt blocks the key for an
/// hour, on every server; a right password does not help meanwhile; the hour ends it.
async fn failed_logins_block_for_an_hour<St: Store + Clone>(store: St, clock: &ManualClock, name: &str) {
    let layer = |store: St| {
        RateLimitLayer::builder(store)
            .add_rule(
                Rule::new("logins", Quota::new(5, Duration::from_secs(15 * 60)), key::header("x-user"))
                    .algorithm(Algorithm::SlidingWindowLog)
                    .count_if(|s| s == StatusCode::UNAUTHORIZED)
                    .block_for(Duration::from_secs(3600)),
            )
            // The store's block is tested here, on the test's clock (the blocked-key cache
            // keeps real time: see the next test).
            .local_cache(false)
            .build()
            .unwrap()
    };
    let server_a = layer(store.clone()).layer(auth());
    for i in 0..5 {
        let res = send(&server_a, "/login/wrong").await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{name}: attempt {i}");
        settle().await;
        clock.advance(Duration::from_secs(60));
        if i == 2 {
            // Successes do not count: a right password goes through, and takes nothing.
            assert_eq!(send(&server_a, "/login/right").await.unwrap().status(), StatusCode::OK, "{name}");
            settle().await;
        }
    }
    // Five failures counted: the next attempt is over the limit, refused, and the key
    // blocked for an hour.
    let res = send(&server_a, "/login/wrong").await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
    assert_eq!(retry_after(&res), Some(3600), "{name}");
    // Twenty minutes on, the window has room again, but the block holds — here, and on
    // another server (its own layer and store).
    clock.advance(Duration::from_secs(20 * 60));
    let res = send(&server_a, "/login/right").await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{name}: the block held");
    assert_eq!(retry_after(&res), Some(40 * 60), "{name}");
    // (One process: the first layer goes before the second may hold its rule name.)
    drop(server_a);
    let server_b = layer(store.clone()).layer(auth());
    let res = send(&server_b, "/login/right").await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{name}: the block is in the store");
    // Another user is not blocked.
    let other = server_b.clone().oneshot(login("/login/right", "alice")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK, "{name}");
    // The hour ends the block.
    clock.advance(Duration::from_secs(40 * 60));
    let res = send(&server_b, "/login/right").await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{name}: the block ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_blocks_the_key_on_every_server() {
    let clock = ManualClock::new(T0);
    failed_logins_block_for_an_hour(MemoryStore::with_clock(clock.clone()), &clock, "memory").await;
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2)).with_clock(clock.clone());
    failed_logins_block_for_an_hour(redis, &clock, "redis").await;
}

/// A block is final: the blocked-key cache answers a blocked key without the store, even
/// for a count-by-outcome rule (whose ordinary rejections it never caches).
#[tokio::test]
async fn the_blocked_key_cache_answers_a_blocked_key() {
    let store = support::fake::Remote::new(MemoryStore::new());
    let svc = RateLimitLayer::builder(store.clone())
        .add_rule(
            Rule::new("logins", Quota::per_minute(2), key::header("x-user"))
                .count_if(|s| s == StatusCode::UNAUTHORIZED)
                .block_for(Duration::from_secs(3600)),
        )
        .build()
        .unwrap()
        .layer(auth());
    for _ in 0..2 {
        assert_eq!(send(&svc, "/login/wrong").await.unwrap().status(), StatusCode::UNAUTHORIZED);
        settle().await;
    }
    let res = send(&svc, "/login/wrong").await.unwrap();
    assert_eq!((res.status(), retry_after(&res)), (StatusCode::TOO_MANY_REQUESTS, Some(3600)));
    let asked = store.checks();
    for path in ["/login/wrong", "/login/right", "/login/right"] {
        let res = send(&svc, path).await.unwrap();
        assert_eq!((res.status(), retry_after(&res)), (StatusCode::TOO_MANY_REQUESTS, Some(3600)));
    }
    assert_eq!(store.checks(), asked, "the cache answered the blocked key");
}

// ---------------------------------------------------------------------------------------
// Limits changed at runtime

use tollgate::RequestHead;
use tollgate::{BuildError, HeaderStyle, LimiterHandle};

const OK: StatusCode = StatusCode::OK;
const NO: StatusCode = StatusCode::TOO_MANY_REQUESTS;

/// A quota changed on a serving layer keeps what each key used.
async fn a_new_quota_keeps_what_was_used<St: Store>(store: St, name: &str) {
    let layer = RateLimitLayer::builder(store)
        .rule("api", Quota::per_minute(3), key::header("x-user"))
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = layer.layer(ok());
    assert_eq!(statuses(&svc, "ada", 4).await, [OK, OK, OK, NO], "{name}");
    // Raised: ada's three still count, so two more, not five. (On Redis her rejection sits
    // in the blocked-key cache under the old rules: it must not answer for the new ones.)
    handle.set_quota("api", Quota::per_minute(5)).unwrap();
    assert_eq!(statuses(&svc, "ada", 3).await, [OK, OK, NO], "{name}");
    let res = svc.clone().oneshot(get("bob")).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "5", "{name}");
    // Lowered: bob used one of two.
    handle.set_quota("api", Quota::per_minute(2)).unwrap();
    assert_eq!(statuses(&svc, "bob", 2).await, [OK, NO], "{name}");
    assert_eq!(handle.rules()[0].quota(), Quota::per_minute(2));
    // A rule that isn't there changes nothing.
    assert_eq!(handle.set_quota("nope", Quota::per_minute(9)), Err(BuildError::UnknownRule("nope".into())));
    assert_eq!(statuses(&svc, "cy", 3).await, [OK, OK, NO], "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_set_at_runtime_keeps_what_each_key_used() {
    a_new_quota_keeps_what_was_used(MemoryStore::new(), "memory").await;
    let server = RedisServer::start();
    let redis = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
    a_new_quota_keeps_what_was_used(redis, "redis").await;
}

/// The blocked-key cache names rules by their rule set: after a swap, the rule at a
/// cached rejection's index is another rule, and must be asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_rule_set_is_not_answered_by_the_old_sets_cache() {
    let server = RedisServer::start();
    let redis = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
    let rule = |name: &str| Rule::new(name, Quota::per_minute(1), key::header("x-user"));
    let layer = RateLimitLayer::builder(redis).add_rule(rule("a")).build().unwrap();
    let (handle, svc) = (layer.handle(), layer.layer(ok()));
    assert_eq!(statuses(&svc, "ada", 2).await, [OK, NO]);
    handle.set_rules(vec![rule("b")]).unwrap();
    assert_eq!(statuses(&svc, "ada", 2).await, [OK, NO], "rule b is new: one unit");
    // Back to a: its state outlived the swaps in Redis.
    handle.set_rules(vec![rule("a")]).unwrap();
    assert_eq!(statuses(&svc, "ada", 1).await, [NO]);
    assert_eq!(layer.peek("a", "ada").await.unwrap().remaining(), 0);
}

/// A refund after a swap also clears the rejection the new rules cached for the key: the
/// store has the unit back, and the key must reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_after_a_swap_clears_the_new_rules_cached_rejection() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2)).with_clock(clock.clone());
    let limiter = tollgate::Limiter::builder(redis)
        .add_rule(Rule::new("r", Quota::per_minute(1), |k: &str| Some(k.to_owned())).algorithm(Algorithm::FixedWindow))
        .build()
        .unwrap();
    let handle = limiter.handle();
    let first = limiter.check("k").await;
    assert!(first.is_allowed());
    handle.set_quota("r", Quota::per_minute(1)).unwrap(); // same quota, new rule set
    assert!(limiter.check("k").await.is_rejected(), "cached under the new rules");
    limiter.refund(first).await.unwrap();
    let again = limiter.check("k").await;
    assert!(again.is_allowed(), "{again:?}");
    assert_eq!(again.decided_by(), Some(tollgate::verdict::DecidedBy::Store));
}

/// Each request is decided and answered under one rule set, while another task swaps
/// the rules as fast as it can: every response's IETF policy (read with a real
/// structured-field parser) is one set's, never a mix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_is_atomic_for_requests_in_flight() {
    let x = || Rule::new("x", Quota::per_minute(10_000), key::header("x-user"));
    let y = || Rule::new("y", Quota::per_minute(20_000), key::header("x-user"));
    let layer = RateLimitLayer::builder(MemoryStore::new()).add_rule(x()).build().unwrap().headers(HeaderStyle::Ietf);
    let handle: LimiterHandle<RequestHead> = layer.handle();
    let svc = layer.layer(ok());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut swaps = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let rules = if swaps.is_multiple_of(2) { vec![y(), x()] } else { vec![x()] };
                handle.set_rules(rules).unwrap();
                swaps += 1;
                tokio::task::yield_now().await;
            }
            swaps
        })
    };
    let mut seen = std::collections::BTreeMap::new();
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut policies = Vec::new();
                for i in 0..500 {
                    let res = svc.clone().oneshot(get(&format!("u{c}-{}", i % 50))).await.unwrap();
                    assert_eq!(res.status(), OK);
                    let policy = support::sf_params(&res.headers()["ratelimit-policy"]);
                    policies.push(policy.iter().map(|(n, p)| format!("{n}:{}", p[0].1)).collect::<Vec<_>>().join(","));
                    // MemoryStore answers at once: yield, or these tasks can starve the swapper.
                    tokio::task::yield_now().await;
                }
                policies
            })
        })
        .collect();
    for c in clients {
        for p in c.await.unwrap() {
            *seen.entry(p).or_insert(0) += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.await.unwrap();
    assert!(swaps > 10, "{swaps} swaps");
    let sets: Vec<&str> = seen.keys().map(String::as_str).collect();
    assert!(sets.iter().all(|s| ["x:10000", "y:20000,x:10000"].contains(s)), "{seen:?}");
    assert_eq!(sets.len(), 2, "both sets answered requests: {seen:?}");
}

/// A swap that can't be built changes nothing and says why; a name another layer over
/// the same store uses is refused, and a name a swap dropped is free again.
#[tokio::test]
async fn a_swap_that_fails_leaves_the_rules_in_force() {
    let store = MemoryStore::new();
    let rule = |name: &str, n| Rule::new(name, Quota::per_minute(n), key::header("x-user"));
    let layer = RateLimitLayer::builder(store.clone()).add_rule(rule("a", 2)).build().unwrap();
    let other = RateLimitLayer::builder(store.clone()).add_rule(rule("taken", 1)).build().unwrap();
    let (handle, svc) = (layer.handle(), layer.layer(ok()));
    for (rules, err) in [
        (vec![rule("b", 5), rule("b", 5)], BuildError::DuplicateRule("b".into())),
        (
            vec![rule("b", 5), rule("taken", 5)],
            BuildError::RuleInUse { rule: "taken".into(), hint: "in the rules given to LimiterHandle" },
        ),
        (
            vec![],
            BuildError::InvalidConfig {
                rule: String::new(),
                field: "rule".into(),
                why: "a limiter needs at least one rule".into(),
            },
        ),
    ] {
        assert_eq!(handle.set_rules(rules), Err(err));
        assert_eq!(handle.rules().iter().map(|r| r.name().to_owned()).collect::<Vec<_>>(), ["a"]);
    }
    assert_eq!(statuses(&svc, "ada", 3).await, [OK, OK, NO], "still a at 2/min");
    // Dropped by a swap, "a" can be used by another layer once no request holds the old set.
    handle.set_rules(vec![rule("b", 5)]).unwrap();
    let again = RateLimitLayer::builder(store).add_rule(rule("a", 1)).build();
    assert!(again.is_ok(), "{again:?}");
    drop(other);
}

const LIMITS_V1: &str = r#"
headers = "ietf"

[[rule]]
name = "per-user"
key = "header:x-user"
quota = "3/min"
"#;

const LIMITS_V2: &str = r#"
[[rule]]
name = "per-user"
key = "header:x-user"
quota = "5/min"

[[rule]]
name = "daily"
key = "header:x-user"
quota = "4/day"
"#;

/// `reload` swaps the configured rules and keeps the rules added in code; a file that
/// fails to build leaves everything as it was.
async fn reloaded_limits<St: Store>(store: St, name: &str) {
    let v1 = tollgate::LayerConfig::from_toml(LIMITS_V1).unwrap();
    let layer = v1
        .builder(store)
        .add_rule(Rule::new("global", Quota::per_minute(100), key::Global).public_name(""))
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = layer.layer(ok());
    assert_eq!(statuses(&svc, "ada", 4).await, [OK, OK, OK, NO], "{name}");

    handle.reload(&tollgate::LayerConfig::from_toml(LIMITS_V2).unwrap()).unwrap();
    let names: Vec<String> = handle.rules().iter().map(|r| r.name().to_owned()).collect();
    assert_eq!(names, ["per-user", "daily", "global"], "{name}: configured rules first, code rules kept");
    // per-user kept ada's 3 of now 5; daily is new: 4. The code rule still counts.
    let res = svc.clone().oneshot(get("ada")).await.unwrap();
    assert_eq!(res.status(), OK, "{name}");
    let policy = support::sf_params(&res.headers()["ratelimit-policy"]);
    let quotas: Vec<(String, i64)> = policy.iter().map(|(n, p)| (n.clone(), p[0].1)).collect();
    assert_eq!(quotas, [("per-user".into(), 5), ("daily".into(), 4), (String::new(), 100)], "{name}: still IETF");
    assert_eq!(statuses(&svc, "ada", 2).await, [OK, NO], "{name}");
    assert_eq!(statuses(&svc, "bob", 5).await, [OK, OK, OK, OK, NO], "{name}: the daily rule");

    // A name clash with the code rule: refused, v2 stays.
    let clash = LIMITS_V2.replace("\"daily\"", "\"global\"");
    let err = handle.reload(&tollgate::LayerConfig::from_toml(&clash).unwrap()).unwrap_err();
    assert_eq!(err, BuildError::DuplicateRule("global".into()), "{name}");
    assert_eq!(statuses(&svc, "cy", 5).await, [OK, OK, OK, OK, NO], "{name}: v2 in force");
}

#[cfg(feature = "config")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_a_configuration_swaps_its_rules_and_keeps_the_codes() {
    reloaded_limits(MemoryStore::new(), "memory").await;
    let server = RedisServer::start();
    let redis = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
    reloaded_limits(redis, "redis").await;
}

// ---------------------------------------------------------------------------------------
// Cost known only after the response: Charge

fn prompt(user: &str, org: &str, tokens: Option<u64>) -> Request<Body> {
    let mut b = Request::post("/v1/complete").header("x-user", user).header("x-org", org);
    if let Some(n) = tokens {
        b = b.header("x-tokens", n.to_string());
    }
    b.body(Body::empty()).unwrap()
}

/// Tokens per user and per org (two keys: two cluster slots), counted after each
/// response; requests per user counted as they arrive. Fixed windows on a manual clock:
/// exact counts.
async fn tokens_are_charged_after_the_response<St: Store + Clone>(store: St, clock: &ManualClock, name: &str) {
    let layer = RateLimitLayer::builder(store)
        .add_rule(Rule::new("tokens", Quota::per_minute(100), key::header("x-user")).charged())
        .add_rule(Rule::new("org-tokens", Quota::per_minute(1_000), key::header("x-org")).charged())
        .rule("requests", Quota::per_minute(50), key::header("x-user"))
        .algorithm(Algorithm::FixedWindow)
        .local_cache(false)
        .build()
        .unwrap();
    let svc = layer.clone().layer(llm());
    let send = |req| svc.clone().oneshot(req);
    let remaining = |rule: &'static str, key: &'static str| {
        let layer = layer.clone();
        async move { layer.peek(rule, key).await.unwrap().remaining() }
    };
    // Admitted while within the quota: nothing taken from a charged rule on arrival.
    assert_eq!(send(prompt("ada", "acme", Some(60))).await.unwrap().status(), OK, "{name}");
    settle().await;
    assert_eq!(remaining("tokens", "ada").await, 39, "{name}: 60 charged (peek counts one more)");
    assert_eq!(remaining("org-tokens", "acme").await, 939, "{name}: the other slot too");
    assert_eq!(remaining("requests", "ada").await, 48, "{name}: one request");
    // 40 left: admitted, and charged 50 into debt.
    assert_eq!(send(prompt("ada", "acme", Some(50))).await.unwrap().status(), OK, "{name}");
    settle().await;
    let res = send(prompt("ada", "acme", Some(1))).await.unwrap();
    assert_eq!(res.status(), NO, "{name}: 110 of 100");
    assert_eq!(retry_after(&res), Some(40), "{name}: the window's end (T0 is 20 s into its minute)");
    assert_eq!(remaining("requests", "ada").await, 47, "{name}: the refused request took nothing");
    // No report, or Charge(0): nothing taken.
    assert_eq!(send(prompt("bob", "acme", None)).await.unwrap().status(), OK, "{name}");
    assert_eq!(send(prompt("bob", "acme", Some(0))).await.unwrap().status(), OK, "{name}");
    settle().await;
    assert_eq!(remaining("tokens", "bob").await, 99, "{name}");
    assert_eq!(remaining("org-tokens", "acme").await, 889, "{name}");
    // The debt ends with the window.
    clock.advance(Duration::from_secs(60));
    assert_eq!(send(prompt("ada", "acme", Some(5))).await.unwrap().status(), OK, "{name}");
    settle().await;
    assert_eq!(remaining("tokens", "ada").await, 94, "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_after_the_response_put_a_key_in_debt() {
    let clock = ManualClock::new(T0);
    tokens_are_charged_after_the_response(MemoryStore::with_clock(clock.clone()), &clock, "memory").await;
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2)).with_clock(clock.clone());
    tokens_are_charged_after_the_response(redis, &clock, "redis").await;
    let cluster = support::redis::RedisCluster::start(3);
    let clock = ManualClock::new(T0);
    let store =
        RedisStore::cluster(cluster.urls()).unwrap().response_timeout(Duration::from_secs(2)).with_clock(clock.clone());
    store.ping().await.unwrap();
    tokens_are_charged_after_the_response(store, &clock, "cluster").await;
}

/// A charge the store does not take is logged and counted; the response was sent anyway.
#[test]
fn a_failed_charge_is_counted() {
    let ((), scrape) = with_metrics(async {
        let store = support::fake::Remote::new(MemoryStore::new());
        let svc = RateLimitLayer::builder(store.clone())
            .add_rule(Rule::new("tokens", Quota::per_minute(100), key::header("x-user")).charged())
            .fail_mode(FailMode::Open)
            .build()
            .unwrap()
            .layer(llm());
        // Admitted by the store; the store fails before the charge.
        let res = svc.clone().oneshot(prompt("ada", "acme", Some(30))).await.unwrap();
        assert_eq!(res.status(), OK);
        settle().await;
        store.set(support::fake::Mode::Failing);
        let res = svc.clone().oneshot(prompt("ada", "acme", Some(30))).await.unwrap();
        assert_eq!(res.status(), OK, "fail open");
        settle().await;
        store.set(support::fake::Mode::Up);
        let check = tollgate::store::Check {
            rule: "tokens".into(),
            key: "ada".into(),
            algorithm: Algorithm::default(),
            params: tollgate::store::Params::new(Quota::per_minute(100)),
        };
        assert_eq!(store.inner.peek(&check).await.unwrap().remaining(), 69, "the first charge was taken");
    });
    assert_eq!(counter(&scrape, "tollgate_charge_failures_total", &["rule=\"tokens\""]), 1.0, "{scrape}");
}

/// A charge to an in-process limiter is taken before the next request is decided, with
/// no task to wait for: a local store's, and the fallback limiter's while the store
/// fails (no yield between the two requests here, on one thread).
#[tokio::test]
async fn a_local_charge_counts_for_the_very_next_request() {
    async fn charged_then_next<St: Store>(layer: RateLimitLayer<St>, name: &str) {
        let svc = layer.layer(llm());
        assert_eq!(svc.clone().oneshot(prompt("ada", "acme", Some(101))).await.unwrap().status(), OK, "{name}");
        let res = svc.clone().oneshot(prompt("ada", "acme", Some(1))).await.unwrap();
        assert_eq!(res.status(), NO, "{name}: the 101 tokens were not yet taken");
    }
    let tokens = || Rule::new("tokens", Quota::per_minute(100), key::header("x-user")).charged();
    let local = RateLimitLayer::builder(MemoryStore::new()).add_rule(tokens()).build().unwrap();
    charged_then_next(local, "a local store").await;
    let store = support::fake::Remote::new(MemoryStore::new());
    store.set(support::fake::Mode::Failing);
    let failing = RateLimitLayer::builder(store).add_rule(tokens()).fallback(MemoryStore::new()).servers(1);
    charged_then_next(failing.build().unwrap(), "the fallback").await;
}

/// Issue 37, item 11: a write-back of what the fallback admitted that the store does not
/// answer in time was sent, its outcome unknown: `tollgate_write_backs_total{outcome=
/// "unknown"}`, not `failed` (the store answered with an error), and it is not sent again.
#[test]
fn a_write_back_not_answered_in_time_is_counted_unknown_not_failed() {
    use support::fake::{Mode, Remote};
    use tollgate::verdict::DecidedBy;
    let (calls_after, scrape) = with_metrics(async {
        // Paused: the write-back's own time limit passes at once.
        tokio::time::pause();
        let store = Remote::new(MemoryStore::new());
        let limiter = tollgate::Limiter::builder(store.clone())
            .rule("api", Quota::per_minute(100), |k: &String| Some(k.clone()))
            .servers(1)
            .local_cache(false)
            .build()
            .unwrap();
        store.set(Mode::Failing);
        let v = limiter.check(&"ada".to_owned()).await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Fallback), "{:?}", v.store_error());
        // Its write-back fails unsent (connection refused): kept for the store's next answer.
        tokio::time::sleep(Duration::from_millis(10)).await;
        store.set(Mode::Up);
        assert_eq!(limiter.check(&"bob".to_owned()).await.decided_by(), Some(DecidedBy::Store));
        // The write-back that answer starts (not run yet: one thread) hangs.
        store.set(Mode::Hanging);
        tokio::time::sleep(Duration::from_secs(5)).await;
        store.set(Mode::Up);
        let before = store.checks();
        assert_eq!(limiter.check(&"carol".to_owned()).await.decided_by(), Some(DecidedBy::Store));
        tokio::time::sleep(Duration::from_secs(5)).await;
        store.checks() - before
    });
    let write_backs =
        |outcome: &str| counter(&scrape, "tollgate_write_backs_total", &[&format!("outcome=\"{outcome}\"")]);
    assert_eq!(write_backs("unknown"), 1.0, "{scrape}");
    assert_eq!(write_backs("failed"), 0.0, "{scrape}");
    assert_eq!(write_backs("written"), 0.0, "{scrape}");
    assert_eq!(calls_after, 1, "the write-back that timed out was sent again");
}
