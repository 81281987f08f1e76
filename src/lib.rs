#![doc = include_str!("../docs/crate.md")]
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
pub mod hold;
pub mod key;
mod layer;
mod limiter;
mod metrics;
mod notice;
mod permit;
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
pub use hold::HoldPermitsLayer;
/// The `http` crate, re-exported: its `Request`, `Response` and header types are this
/// crate's (`tollgate::http::Request` in a key extractor of an app that does not name
/// `http` itself).
pub use http;
pub use layer::RateLimitLayer;
pub use limiter::{Limiter, LimiterBuilder, LimiterHandle};

/// The limiter of an HTTP layer ([`RateLimitLayer::limiter`],
/// [`RateLimitLayer::from_limiter`]): its rules read a request's head. The name to write in
/// an application's state or a job loop's signature, as `Arc<HttpLimiter<RedisStore>>`.
pub type HttpLimiter<St> = Limiter<St, RequestHead>;
pub use permit::Permit;
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
