//! Three independent servers (each with its own RedisStore and pool, as three machines
//! would have) share one limit through one Redis — standalone and a 3-node cluster: their
//! HTTP layers, their job loops asking by key (`Limiter::check_key`), and a key blocked
//! by hand on one of them (`Limiter::block`).
#![cfg(feature = "redis")]

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::RequestHead;
use tollgate::{key, Algorithm, FailMode, Limiter, Quota, RateLimitLayer, RedisStore, Rule, StoreError};

use support::redis::{RedisCluster, RedisServer};

/// Starts one server; returns its address.
async fn serve(store: RedisStore, algorithm: Algorithm) -> SocketAddr {
    serve_layer(
        RateLimitLayer::builder(store)
            .rule("default", Quota::per_hour(100), key::header("x-api-key"))
            .algorithm(algorithm)
            .fail_mode(tollgate::FailMode::Closed)
            // Counting is what is tested here: a busy CI machine must not turn a slow
            // answer into a 503 (the default 50 ms deadline is tested in faults.rs).
            .timeout(std::time::Duration::from_secs(2))
            .build()
            .unwrap(),
    )
    .await
}

/// Starts one server behind `layer`; returns its address.
async fn serve_layer(layer: RateLimitLayer<RedisStore>) -> SocketAddr {
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" })).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    addr
}

/// One HTTP/1.1 request; the status code.
async fn status(addr: SocketAddr, api_key: &str) -> u16 {
    response(addr, api_key).await.0
}

/// One HTTP/1.1 request over raw TCP; the status code and the `Retry-After` header.
async fn response(addr: SocketAddr, api_key: &str) -> (u16, Option<u64>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: t\r\nx-api-key: {api_key}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("bad response {text:?}"));
    let retry_after = text
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().parse().unwrap()));
    (status, retry_after)
}

/// Waits until we are not within 10 s of an hour boundary (fixed windows are aligned).
async fn away_from_hour_boundary() {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() % 3600;
    if secs > 3590 {
        tokio::time::sleep(std::time::Duration::from_secs(3601 - secs)).await;
    }
}

/// 1,000 requests for one key, round-robin over the servers, from 50 concurrent clients.
async fn hammer(servers: &[SocketAddr], api_key: &str) -> (usize, usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let (ok, limited) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let clients: Vec<_> = (0..50)
        .map(|_| {
            let (next, ok, limited, servers, api_key) =
                (next.clone(), ok.clone(), limited.clone(), servers.to_vec(), api_key.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= 1000 {
                        break;
                    }
                    match status(servers[i % servers.len()], &api_key).await {
                        200 => ok.fetch_add(1, Ordering::SeqCst),
                        429 => limited.fetch_add(1, Ordering::SeqCst),
                        other => panic!("unexpected status {other} (a store error under FailMode::Closed?)"),
                    };
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    (ok.load(Ordering::SeqCst), limited.load(Ordering::SeqCst))
}

const EXACT: [Algorithm; 4] =
    [Algorithm::SlidingWindowLog, Algorithm::TokenBucket, Algorithm::Gcra, Algorithm::FixedWindow];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_one_limit_through_redis() {
    let redis = RedisServer::start();
    away_from_hour_boundary().await;
    for algorithm in EXACT {
        let mut servers = Vec::new();
        for _ in 0..3 {
            let store = RedisStore::from_url(&redis.url()).unwrap().response_timeout(std::time::Duration::from_secs(2));
            servers.push(serve(store, algorithm).await);
        }
        let (ok, limited) = hammer(&servers, &format!("key-{algorithm}")).await;
        assert_eq!((ok, limited), (100, 900), "{algorithm}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_one_limit_through_a_cluster() {
    let cluster = RedisCluster::start(3);
    away_from_hour_boundary().await;
    for algorithm in EXACT {
        let mut servers = Vec::new();
        for _ in 0..3 {
            let store =
                RedisStore::cluster(cluster.urls()).unwrap().response_timeout(std::time::Duration::from_secs(2));
            servers.push(serve(store, algorithm).await);
        }
        let (ok, limited) = hammer(&servers, &format!("key-{algorithm}")).await;
        assert_eq!((ok, limited), (100, 900), "{algorithm}");
    }
}

/// Three stores over one standalone Redis or one 3-node cluster, one per server.
fn stores(urls: &[String], cluster: bool) -> Vec<RedisStore> {
    (0..3)
        .map(|_| {
            let store = if cluster { RedisStore::cluster(urls.to_vec()) } else { RedisStore::from_url(&urls[0]) };
            store.unwrap().response_timeout(Duration::from_secs(2))
        })
        .collect()
}

/// Each server's limiter: one per-key rule (blockable), fail closed so that a store error
/// is never counted as an admission.
fn limiter(store: RedisStore, algorithm: Algorithm) -> Limiter<RedisStore, RequestHead> {
    Limiter::builder(store)
        .add_rule(Rule::new("per-key", Quota::per_hour(100), key::header("x-api-key")).blockable())
        .algorithm(algorithm)
        .fail_mode(FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Three servers, each with its HTTP layer and a job loop asking by key on the same
/// limiter: 1,000 requests from 50 clients and 600 jobs at once, for one key — exactly the
/// limit is admitted across all of them.
async fn layers_and_job_loops_share_one_count(urls: &[String], cluster: bool) {
    away_from_hour_boundary().await;
    for algorithm in [Algorithm::Gcra, Algorithm::SlidingWindowLog] {
        let api_key = format!("shared-{algorithm}-{cluster}");
        let (mut servers, mut jobs) = (Vec::new(), Vec::new());
        for store in stores(urls, cluster) {
            let layer = RateLimitLayer::from_limiter(limiter(store, algorithm));
            jobs.push(layer.limiter().clone());
            servers.push(serve_layer(layer).await);
        }
        let loops: Vec<_> = jobs
            .into_iter()
            .map(|limiter| {
                let api_key = api_key.clone();
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..200 {
                        let verdict = limiter.check_key("per-key", api_key.as_str(), 1).await;
                        assert!(verdict.store_error().is_none(), "{verdict:?}");
                        admitted += usize::from(verdict.is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        let (ok, limited) = hammer(&servers, &api_key).await;
        let mut by_jobs = 0;
        for l in loops {
            by_jobs += l.await.unwrap();
        }
        assert_eq!(ok + limited, 1000);
        assert_eq!(ok + by_jobs, 100, "{algorithm}: {ok} requests and {by_jobs} jobs admitted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_layers_and_job_loops_share_one_count_through_redis() {
    let redis = RedisServer::start();
    layers_and_job_loops_share_one_count(&[redis.url()], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_layers_and_job_loops_share_one_count_through_a_cluster() {
    let cluster = RedisCluster::start(3);
    layers_and_job_loops_share_one_count(&cluster.urls(), true).await;
}

/// A key blocked by hand on one server is refused on all three with `Retry-After` of the
/// block's rest; other keys are not.
async fn a_block_holds_on_every_server(urls: &[String], cluster: bool) {
    let (mut servers, mut limiters) = (Vec::new(), Vec::new());
    for store in stores(urls, cluster) {
        let layer = RateLimitLayer::from_limiter(limiter(store, Algorithm::Gcra));
        limiters.push(layer.limiter().clone());
        servers.push(serve_layer(layer).await);
    }
    for &server in &servers {
        assert_eq!(status(server, "mallory").await, 200, "not blocked yet");
    }
    limiters[0].block("per-key", "mallory", Duration::from_secs(600)).await.unwrap();
    for &server in &servers {
        let (status, retry_after) = response(server, "mallory").await;
        assert_eq!(status, 429);
        let retry_after = retry_after.expect("a Retry-After header");
        assert!((595..=600).contains(&retry_after), "Retry-After {retry_after}: the rest of a 600 s block");
        assert_eq!(response(server, "ada").await.0, 200, "another key");
    }
    // By key too, on another server.
    let verdict = limiters[2].check_key("per-key", "mallory", 1).await;
    assert!(verdict.is_rejected() && verdict.retry_after() > Some(Duration::from_secs(590)), "{verdict:?}");
    // Lifted at once where it is lifted; on the others within a second (their
    // blocked-key caches ask the store again after one).
    limiters[1].block("per-key", "mallory", Duration::ZERO).await.unwrap();
    assert_eq!(status(servers[1], "mallory").await, 200, "lifted");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for &server in &servers {
        assert_eq!(status(server, "mallory").await, 200, "lifted on every server within a second");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_blocked_by_hand_is_refused_on_every_server_through_redis() {
    let redis = RedisServer::start();
    a_block_holds_on_every_server(&[redis.url()], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_blocked_by_hand_is_refused_on_every_server_through_a_cluster() {
    let cluster = RedisCluster::start(3);
    a_block_holds_on_every_server(&cluster.urls(), true).await;
}

/// `check_key` on Redis: a cost, a refund, a rule that cannot block, an unknown rule; two
/// rules whose keys live in different cluster slots.
async fn check_key_by_cost_and_refund(urls: &[String], cluster: bool) {
    let store = stores(urls, cluster).remove(0);
    let limiter = Limiter::builder(store)
        .rule("batch", Quota::per_hour(5), |k: &str| Some(k.to_owned()))
        .algorithm(Algorithm::Gcra)
        .fail_mode(FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for key in ["alpha", "beta", "gamma"] {
        let first = limiter.check_key("batch", key, 3).await;
        assert!(first.is_allowed(), "{first:?}");
        assert_eq!(first.decisions().next().unwrap().decision.remaining(), 2);
        let second = limiter.check_key("batch", key, 3).await;
        assert!(second.is_rejected() && second.retry_after().is_some(), "{second:?}");
        assert!(limiter.check("").await.is_allowed(), "another key, by input");
        limiter.refund(first).await.unwrap();
        assert!(limiter.check_key("batch", key, 3).await.is_allowed(), "the refund came back: {key}");
    }
    let err = limiter.block("batch", "alpha", Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert!(limiter.check_key("nope", "alpha", 1).await.store_error().is_some());
}

#[tokio::test]
async fn check_key_through_redis() {
    let redis = RedisServer::start();
    check_key_by_cost_and_refund(&[redis.url()], false).await;
}

#[tokio::test]
async fn check_key_through_a_cluster() {
    let cluster = RedisCluster::start(3);
    check_key_by_cost_and_refund(&cluster.urls(), true).await;
}

/// A request with an enforced and a shadow rule makes one store call: the shadow check
/// rides in the enforced one's script call (`INFO commandstats`), and both count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforced_and_shadow_rules_make_one_store_call() {
    let redis = RedisServer::start();
    let store = stores(&[redis.url()], false).remove(0);
    let limiter = Limiter::builder(store)
        .rule("api", Quota::per_hour(100), key::header("x-api-key"))
        .add_rule(Rule::new("trial", Quota::per_hour(5), key::header("x-api-key")).shadow(true))
        .fail_mode(FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let layer = RateLimitLayer::from_limiter(limiter);
    let limiter = layer.limiter().clone();
    let server = serve_layer(layer).await;
    assert_eq!(status(server, "warm-up").await, 200); // loads the script (EVAL after NOSCRIPT)
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    for _ in 0..10 {
        assert_eq!(status(server, "ada").await, 200, "the shadow rule never refuses");
    }
    let stats = redis.commandstats();
    assert_eq!(stats.get("evalsha"), Some(&10), "one call a request: {stats:?}");
    assert_eq!(stats.get("eval"), None, "{stats:?}");
    assert_eq!(limiter.peek("api", "ada").await.unwrap().remaining(), 89, "10 taken, less the peek's own");
    // The shadow rule took its 5 (no more: a shadow rejection takes nothing).
    assert_eq!(limiter.peek("trial", "ada").await.unwrap().remaining(), 0);
    assert!(!limiter.peek("trial", "ada").await.unwrap().allowed);
}

/// A reset reaches every server (issue 38, item 4): two servers on one Redis, 3 an hour;
/// server B spends the key and is refused (its blocked-key cache keeps the refusal, for
/// most of an hour); server A resets the key ("give this customer a fresh hour"). Within
/// the README's second, server B admits it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_server_reaches_another_servers_cache_within_a_second() {
    let server = RedisServer::start();
    let limiter = || {
        let store = RedisStore::from_url(&server.url()).unwrap();
        Limiter::<_, str>::builder(store)
            .rule("hourly", Quota::per_hour(3), |k: &str| Some(tollgate::key::Key::from(k)))
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let (a, b) = (limiter(), limiter());
    for _ in 0..3 {
        assert!(b.check("acme").await.is_allowed());
    }
    let refused = b.check("acme").await;
    assert!(refused.is_rejected(), "{refused}");
    // Answered from B's cache from now on: no store call, a wait of most of the hour.
    let cached = b.check("acme").await;
    assert_eq!(cached.decided_by(), Some(tollgate::verdict::DecidedBy::LocalCache), "{cached}");
    // The decision itself says so too (the one a handler reads).
    let by = cached.rejected_by().map(|d| d.decision.decided_by());
    assert_eq!(by, Some(tollgate::verdict::DecidedBy::LocalCache), "{cached}");
    assert_eq!(refused.rejected_by().map(|d| d.decision.decided_by()), Some(tollgate::verdict::DecidedBy::Store));
    a.reset("hourly", "acme").await.unwrap();
    let reset_at = std::time::Instant::now();
    loop {
        let v = b.check("acme").await;
        if v.is_allowed() {
            break;
        }
        assert!(reset_at.elapsed() < Duration::from_millis(1_500), "still refused after the reset: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
