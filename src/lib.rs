//! Distributed rate limiting for Tower and axum.
//!
//! Put one [`RateLimitLayer`] in front of any Tower service — an axum router, a tonic
//! server, a hyper service — pick a key (client IP, API key, account), a [`Quota`] and an
//! [`Algorithm`], and every server of a cluster shares the limit through Redis
//! (`RedisStore`, feature `redis`). On one machine, [`MemoryStore`] needs no setup.
//!
//! # Quick start
//!
//! ```
//! use std::net::SocketAddr;
//! use tollgate::{MemoryStore, Quota, RateLimitLayer};
//!
//! let app: axum::Router = axum::Router::new()
//!     .route("/api", axum::routing::get(|| async { "ok" }))
//!     .layer(
//!         RateLimitLayer::new(
//!             Quota::per_minute(100),
//!             // A rule sees the request's head, whatever the body type (axum,
//!             // tonic, hyper): annotate it as `&tollgate::RequestHead`.
//!             |req: &tollgate::RequestHead| {
//!                 req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned)
//!             },
//!             MemoryStore::new(),
//!         ),
//!     );
//! // Serve with connect info so `key::PeerIp` can see client addresses:
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # let _ = app;
//! ```
//!
//! A request over the limit gets `429 Too Many Requests` with `Retry-After` and rate-limit
//! headers (legacy `X-RateLimit-*` by default, or the IETF draft `RateLimit` /
//! `RateLimit-Policy`, see [`HeaderStyle`]); a gRPC request gets `RESOURCE_EXHAUSTED`
//! instead. The inner service is not called. Allowed responses carry the headers too, and
//! the handler finds the [`Decision`] in the request's extensions.
//!
//! # Several rules, tiers, cost
//!
//! A layer can hold several [`Rule`]s (per IP, per API key, per account; per minute and
//! per day): all are decided in one store call, and a request rejected by one rule
//! consumes nothing from the others. A rule's quota can be chosen per request
//! ([`Rule::quota_fn`], for tiers), and a request can cost more than one unit
//! ([`Rule::cost`]).
//!
//! # Beyond HTTP: [`Limiter`]
//!
//! The layer is the HTTP adapter of a [`Limiter`] — the rules, the store and the runtime
//! protections, with nothing about HTTP. Use one directly for WebSocket messages, jobs or
//! outgoing calls: [`Limiter::check`] returns a [`Verdict`], [`Limiter::wait`] waits for
//! the input's turn up to a bound.
//!
//! One limiter can serve several callers: build the layer from it
//! ([`RateLimitLayer::from_limiter`], or take a layer's with [`RateLimitLayer::limiter`]),
//! and let a job loop or an admin task ask it by rule name and key
//! ([`Limiter::check_key`], [`Limiter::block`]): they use up the same counts as the
//! layer's requests.
//!
//! # Stores
//!
//! [`MemoryStore`] keeps the state in this process; `RedisStore` (feature `redis`) shares
//! it between servers. An in-process store implements [`store::LocalStore`]
//! (synchronous: an input is decided in the caller's thread, with no future, timer or
//! runtime); a remote one implements [`store::Store`] (async, called under a deadline).
//!
//! # When the store fails
//!
//! A rate limiter must never be why a request fails or hangs, nor silently off. Every
//! store call has a deadline (50 ms by default), the number of calls in flight is capped,
//! and a circuit breaker stops calling a store that keeps failing. When the store cannot
//! decide, an in-process fallback does ([`FailMode::Fallback`], the default), each key
//! limited to this server's share of its quota (the store counts the servers) and of what
//! the store last said remains: the over-admission is bounded (the README's "When Redis
//! fails" states how). [`FailMode::Open`] lets the request through unlimited,
//! [`FailMode::Closed`] answers 503.
//!
//! # Differences from `tower::limit::RateLimit`
//!
//! tower's `RateLimit` keeps one window per service instance, has no keys, and applies
//! backpressure in `poll_ready`. This layer decides per key, shares its state between all
//! clones (and, through Redis, all servers), never waits in `poll_ready`, and answers
//! over-limit requests instead of queueing them (except the leaky bucket, which delays a
//! request until its slot on purpose).
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `axum` | yes | `key::PeerIp` reads axum's `ConnectInfo<SocketAddr>` |
//! | `memory` | yes | [`MemoryStore`] |
//! | `redis` | no | `RedisStore`: standalone Redis, Redis Sentinel and Redis Cluster via deadpool-redis |
//! | `metrics` | no | counters and histograms through the `metrics` facade |
//! | `tonic` | no | `key::PeerIp` reads tonic's `TcpConnectInfo` |
//! | `test-util` | no | `ManualClock`, to test your own limits with controlled time |
//! | `config` | no | `LayerConfig`: rules from TOML or any serde format |
//! | `redis-tls` | no | `rediss://` for `RedisStore` through rustls (ring) |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod algorithm;
mod charge;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod decision;
mod error;
mod future;
mod head;
pub mod headers;
pub mod key;
mod layer;
mod limiter;
mod metrics;
mod notice;
mod quota;
mod report;
pub mod response;
mod rule;
mod runtime;
mod service;
pub mod store;
pub mod verdict;

pub use algorithm::Algorithm;
pub use charge::Charge;
#[cfg(feature = "config")]
pub use config::LayerConfig;
pub use decision::Decision;
pub use error::{BuildError, StoreError};
pub use future::ResponseFuture;
pub use head::RequestHead;
pub use headers::HeaderStyle;
/// The `http` crate, re-exported: its `Request`, `Response` and header types are this
/// crate's (`tollgate::http::Request` in a key extractor of an app that does not name
/// `http` itself).
pub use http;
pub use layer::RateLimitLayer;
pub use limiter::{Limiter, LimiterBuilder, LimiterHandle};
pub use quota::Quota;
pub use rule::{FailMode, Rule};
pub use service::RateLimit;
pub use store::memory::MemoryStore;
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;
pub use verdict::Verdict;

/// The README's Rust examples, compiled (and run where they can) as doctests so the
/// guide cannot drift from the API.
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "memory",
    feature = "redis",
    feature = "config",
    feature = "test-util"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
