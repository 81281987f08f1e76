//! Three servers on three ports share one limit through one Redis.
//!
//! ```text
//! redis-server --port 6379 &        # or point REDIS_URL at any Redis
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate-examples --features redis --example three_servers
//! ```
//!
//! Each server has its own `RedisStore` (its own pool and connections), as three machines
//! would. The example then sends 30 requests for one API key round-robin across the three
//! and prints who answered what: 10 pass in total, not 10 per server.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::{key, Algorithm, Quota, RateLimitLayer, RedisStore};

async fn start_server(redis_url: &str) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let store = RedisStore::from_url(redis_url)?;
    store.ping().await?;
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok\n" })).layer(
        RateLimitLayer::builder(store)
            .rule("default", Quota::per_hour(10), key::header("x-api-key"))
            .algorithm(Algorithm::SlidingWindowLog)
            .build()
            .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await;
    });
    Ok(addr)
}

/// A bare HTTP/1.1 GET; the status line.
async fn get(addr: SocketAddr, api_key: &str) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET / HTTP/1.1\r\nHost: x\r\nx-api-key: {api_key}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf).lines().next().unwrap_or_default().to_owned())
}

/// Errors are printed as their message (`error: …`), not their `Debug` form.
#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(start_server(&url).await?);
    }
    println!("three servers sharing {url}: {servers:?}; limit 10/hour per API key");
    // A fresh key per run, so repeated runs each show the whole limit.
    let api_key = format!("demo-{}", std::process::id());
    let mut passed = [0usize; 3];
    for i in 0..30 {
        let status = get(servers[i % 3], &api_key).await?;
        if status.contains(" 200 ") {
            passed[i % 3] += 1;
        }
        println!("request {:>2} -> server {} : {status}", i + 1, i % 3 + 1);
    }
    println!(
        "passed per server: {passed:?}; total {} (the limit is shared, not per server)",
        passed.iter().sum::<usize>()
    );
    Ok(())
}
