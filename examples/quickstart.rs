//! An axum server with a per-IP limit and a per-API-key limit.
//!
//! ```text
//! cargo run -p tollgate-examples --example quickstart                                   # in-process store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate-examples --features redis --example quickstart
//! ```
//!
//! Then `curl -i http://127.0.0.1:3000/` eleven times within a minute: the eleventh answer
//! is `429 Too Many Requests` with `Retry-After`.

use std::net::SocketAddr;

use axum::routing::get;
use axum::{Extension, Router};
use tollgate::store::Store;
use tollgate::{key, Algorithm, Decision, Quota, RateLimitLayer};

fn app<St: Store>(store: St) -> Router {
    let limits = RateLimitLayer::builder(store)
        // Everyone: 10 requests a minute per client address.
        .rule("per-ip", Quota::per_minute(10), key::PeerIp)
        // Callers with an API key: 5 a minute per key on top (requests without the header
        // are not limited by this rule).
        .rule("per-api-key", Quota::per_minute(5), key::header("x-api-key"))
        .algorithm(Algorithm::SlidingWindowCounter)
        .build()
        .expect("rule names are unique");
    Router::new()
        .route("/", get(|| async { "hello from tollgate\n" }))
        .route(
            "/api",
            get(|Extension(d): Extension<Decision>| async move { format!("api ok, {} left this minute\n", d.remaining()) }),
        )
        // `route_layer`: the routes above only, so a request for a path that does not
        // exist (a 404) uses up no quota. `.layer(limits)` would limit those too.
        .route_layer(limits)
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
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(3000);
    let router = match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => {
            let store = tollgate::RedisStore::from_url(&url)?;
            if let Err(e) = store.ping().await {
                eprintln!(
                    "warning: Redis at {url} is not answering yet ({e}); this server limits in process until it does"
                );
            }
            println!("store: Redis at {url} (limits shared by every server using it)");
            app(store)
        }
        #[cfg(not(feature = "redis"))]
        Ok(_) => {
            return Err("REDIS_URL is set but this build has no Redis support: add --features redis".into());
        }
        Err(_) => {
            println!("store: in-process (set REDIS_URL to share limits through Redis)");
            app(tollgate::MemoryStore::new())
        }
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("try:  for i in $(seq 11); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/; done");
    println!("      curl -i -H 'x-api-key: demo' http://{addr}/api");
    // Connect info lets key::PeerIp see the client address.
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
