//! tollgate (work in progress)
pub mod algorithm;
mod clock;
mod decision;
mod error;
mod future;
pub mod headers;
pub mod key;
mod layer;
mod metrics;
mod quota;
mod runtime;
mod service;
pub mod store;
pub use algorithm::Algorithm;
pub use clock::{Clock, SystemClock};
#[cfg(any(test, feature = "test-util"))]
pub use clock::ManualClock;
pub use decision::Decision;
pub use error::{BuildError, StoreError};
pub use future::ResponseFuture;
pub use headers::HeaderStyle;
pub use layer::{DefaultRejection, MAX_RULE_NAME, FailMode, OnRejected, RateLimitLayer, RateLimitLayerBuilder, Rejection, Rule};
pub use quota::Quota;
pub use service::RateLimit;
pub use store::{Check, Store};
#[cfg(feature = "memory")]
pub use store::memory::MemoryStore;
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;
