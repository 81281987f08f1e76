//! The HTTP layer in process: what a request gets (status, headers), what it holds and
//! gives back, rules, charges, configuration, and the store failing under it. One binary;
//! the Redis-backed behaviour is in `tests/redis`.

#[path = "../support/mod.rs"]
mod support;

mod cancellation;
mod charges;
mod client_bodies;
mod common;
mod concurrency;
mod config;
mod delays;
mod fallback;
mod fallback_answers;
mod grpc;
mod headers;
mod layer;
mod nested_layers;
mod outage;
mod production;
mod proxies;
mod refunds;
mod response_future;
mod rules;
mod setup;
mod silent_rules;
