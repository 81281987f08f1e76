//! `RedisStore` (being written).
#![allow(missing_docs)]

/// Placeholder replaced by the Redis store.
#[derive(Debug, Clone)]
pub struct RedisStore;
