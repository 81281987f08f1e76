//! Shared helpers for integration tests (`mod support;`).
#![allow(dead_code, unreachable_pub)]

pub mod fake;
pub mod redis;
