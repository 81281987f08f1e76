//! Three independent servers (each with its own RedisStore and pool, as three machines
//! would have) share one limit through one Redis — standalone and a 3-node cluster.
#![cfg(feature = "redis")]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::{key, Algorithm, Quota, RateLimitLayer, RedisStore};

use support::redis::{RedisCluster, RedisServer};

/// Starts one server; returns its address.
async fn serve(store: RedisStore, algorithm: Algorithm) -> SocketAddr {
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" })).layer(
        RateLimitLayer::<_, Body>::new(Quota::per_hour(100), key::header("x-api-key"), store)
            .algorithm(algorithm)
            .fail_mode(tollgate::FailMode::Closed)
            // Counting is what is tested here: a busy CI machine must not turn a slow
            // answer into a 503 (the default 50 ms deadline is tested in faults.rs).
            .timeout(std::time::Duration::from_secs(2)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    addr
}

/// One HTTP/1.1 request; the status code.
async fn status(addr: SocketAddr, api_key: &str) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: t\r\nx-api-key: {api_key}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let line = String::from_utf8_lossy(&buf[..buf.len().min(12)]).into_owned();
    line[9..12].parse().unwrap_or_else(|_| panic!("bad response {line:?}"))
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
