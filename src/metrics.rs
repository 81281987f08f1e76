//! Metric emission through the `metrics` facade (feature `metrics`); no-ops without it.
//! The names, kinds and labels are listed in README.md (Observability).

#![allow(unused_variables)]

use std::time::Duration;

use crate::error::StoreError;
use crate::store::RuleName;

/// The rule's interned name is the label, not a copy: a decision allocates nothing here.
/// One enforced or shadow rule's decision; `by`: `store`, `cache` (the blocked-key cache)
/// or `fallback` (the in-process fallback, while the store fails).
pub(crate) fn decision(rule: RuleName, outcome: &'static str, by: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_decisions_total", "rule" => rule.as_str(), "outcome" => outcome, "decided_by" => by)
        .increment(1);
}

/// A quota slice granted (`tollgate_slices_total{rule}`).
pub(crate) fn slice_taken(rule: RuleName) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_slices_total", "rule" => rule.as_str()).increment(1);
}

/// Units of quota slices not admitted: `given_back` to the store, or `stranded` (left
/// when their window ended, or in a slice whose grant is unknown).
pub(crate) fn slice_units(rule: RuleName, outcome: &'static str, units: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_slice_units_total", "rule" => rule.as_str(), "outcome" => outcome).increment(units);
}

/// Permits of a concurrency rule this limiter holds (`tollgate_permits_held{rule}`, a
/// gauge): `delta` more (or fewer, negative).
pub(crate) fn permits_held(rule: RuleName, delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_permits_held", "rule" => rule.as_str()).increment(delta);
}

pub(crate) fn near_limit(rule: RuleName) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_near_limit_total", "rule" => rule.as_str()).increment(1);
}

pub(crate) fn store_error(err: &StoreError) {
    #[cfg(feature = "metrics")]
    {
        let kind = match err {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::NodeUnavailable(_) => "node_unavailable",
            StoreError::NodeTimeout(_) => "node_timeout",
            StoreError::NotConnected(_) => "not_connected",
            StoreError::Overloaded(_) => "overloaded",
            StoreError::CircuitOpen(_) => "circuit_open",
            StoreError::Full(_) => "full",
            StoreError::Backend(_) => "backend",
            StoreError::Invalid(_) => "invalid",
            StoreError::UnknownRule(_) => "unknown_rule",
        };
        metrics::counter!("tollgate_store_errors_total", "kind" => kind).increment(1);
    }
}

pub(crate) fn store_latency(d: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("tollgate_store_latency_seconds").record(d.as_secs_f64());
}

pub(crate) fn store_stall() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_store_stalls_total").increment(1);
}

pub(crate) fn fail_open() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_fail_open_total").increment(1);
}

pub(crate) fn fail_closed() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_fail_closed_total").increment(1);
}

pub(crate) fn fallback(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_fallback_decisions_total", "outcome" => outcome).increment(1);
}

/// Checks the fallback admitted while the store never saw them, as they are charged to
/// it when it answers again: `written`, `unknown` (sent, not answered in time: the store
/// may have taken it), `failed` (the store answered with an error), `dropped` (more were
/// waiting than are kept).
pub(crate) fn write_back(outcome: &'static str, checks: usize) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_write_backs_total", "outcome" => outcome).increment(checks as u64);
}

pub(crate) fn circuit_open(open: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_circuit_open").set(if open { 1.0 } else { 0.0 });
}

pub(crate) fn charge_failed(rule: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_charge_failures_total", "rule" => rule.to_owned()).increment(1);
}

pub(crate) fn refund_failed(rule: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_refund_failures_total", "rule" => rule.to_owned()).increment(1);
}

pub(crate) fn peer_unknown() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_peer_unknown_total").increment(1);
}
