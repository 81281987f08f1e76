//! One limit, several callers: an HTTP API and a background job loop use up one
//! per-account count through one [`tollgate::Limiter`], and an admin task blocks an
//! account by hand — on every server, when the store is Redis.
//!
//! ```text
//! cargo run -p tollgate-examples --example api_and_jobs                                    # in-process store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate-examples --features redis --example api_and_jobs
//! ```
//!
//! The API's `/export` and the nightly export jobs share the rule `per-account`, 20 a
//! minute (sliding window log: exact). 30 requests and 30 jobs for one account arrive
//! together; 20 of the 60 are admitted, whichever asked. The layer is built from the
//! limiter ([`RateLimitLayer::from_limiter`](tollgate::RateLimitLayer::from_limiter)); the
//! jobs ask by key ([`Limiter::check_key`](tollgate::Limiter::check_key)) with no HTTP
//! request to fabricate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::store::Store;
use tollgate::{key, Algorithm, Limiter, Quota, RateLimitLayer, RequestHead, Rule};

/// The one limiter of this server: the API's layer and the job loop both use it.
fn limiter<St: Store>(store: St) -> Result<Limiter<St, RequestHead>, tollgate::BuildError> {
    Limiter::builder(store)
        // `blockable`: the admin task may block an account by hand.
        .add_rule(Rule::new("per-account", Quota::per_minute(20), key::header("x-account")).blockable())
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
}

async fn run<St: Store>(store: St) -> Result<(), Box<dyn std::error::Error>> {
    let layer = RateLimitLayer::from_limiter(limiter(store)?);
    let limiter = layer.limiter().clone(); // for the jobs and the admin task
    let app = axum::Router::new().route("/export", axum::routing::post(|| async { "export started\n" })).layer(layer);
    let port = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    tokio::spawn(async move { axum::serve(listener, app).await });

    // An account of its own per run: a shared Redis may remember earlier runs' counts.
    let account = Arc::new(format!("acme-{}", std::process::id()));
    let jobs = {
        let (limiter, account) = (limiter.clone(), account.clone());
        tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..30 {
                if limiter.check_key("per-account", account.as_str(), 1).await.is_allowed() {
                    admitted += 1; // run the export job
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            admitted
        })
    };
    let mut api = 0;
    for _ in 0..30 {
        if post(addr, &account).await?.0 == 200 {
            api += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let jobs = jobs.await?;
    println!("api admitted {api} of 30");
    println!("jobs admitted {jobs} of 30");
    println!("together: {} of limit 20", api + jobs);

    // The admin task: ban an account for an hour, on every server sharing the store.
    let mallory = format!("mallory-{}", std::process::id());
    limiter.block("per-account", mallory.as_str(), Duration::from_secs(3600)).await?;
    let (status, retry_after) = post(addr, &mallory).await?;
    println!("blocked account: {status}, Retry-After: {}", retry_after.as_deref().unwrap_or("none"));
    Ok(())
}

/// One `POST /export` for `account` over a fresh connection: the status and the
/// `Retry-After` header.
async fn post(addr: SocketAddr, account: &str) -> std::io::Result<(u16, Option<String>)> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let req =
        format!("POST /export HTTP/1.1\r\nHost: {addr}\r\nx-account: {account}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await?;
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let retry_after = text.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after").then(|| value.trim().to_owned())
    });
    Ok((status, retry_after))
}

#[tokio::main]
async fn main() {
    if let Err(err) = start().await {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}

async fn start() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => {
            let store = tollgate::RedisStore::from_url(&url)?;
            store.ping().await?;
            println!("store: Redis at {url}");
            run(store).await
        }
        #[cfg(not(feature = "redis"))]
        Ok(_) => Err("REDIS_URL is set but this build has no Redis support: add --features redis".into()),
        Err(_) => {
            println!("store: in-process (set REDIS_URL to share the limit through Redis)");
            run(tollgate::MemoryStore::new()).await
        }
    }
}
