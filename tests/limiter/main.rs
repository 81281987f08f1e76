//! The key-level [`tollgate::Limiter`]: deciding by key and by input, the reference model
//! the layer is checked against, and the in-process store's key cap.

#[path = "../support/mod.rs"]
mod support;

mod by_key;
mod concurrency;
mod contention;
mod keys;
mod max_keys;
mod memory_store;
mod model;
mod quota;
mod review;
mod review_lanes;
mod review_lazy;
