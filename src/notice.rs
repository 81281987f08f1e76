//! Telling the operator once: a setup slip or an outage that changes what the limiter
//! does (no peer address, a proxy header ignored, the first fail-open pass, the circuit
//! opening, the switch to the fallback) is said once per process on stderr, beside the
//! `tracing` warning — unless a `tracing` subscriber shows warnings already (then once is
//! enough). Later occurrences go to `tracing` (rate-limited) and the metrics only.

use std::sync::atomic::{AtomicBool, Ordering};

/// One thing to say once per process.
#[derive(Debug, Default)]
pub(crate) struct Once(AtomicBool);

impl Once {
    pub(crate) const fn new() -> Self {
        Self(AtomicBool::new(false))
    }

    /// Says `message` if it was not said before: as a `tracing` warning, and on stderr
    /// when no subscriber shows warnings (`debug_only`: only in a debug build, for setup
    /// hints that a release build leaves to `tracing`). Returns whether it was said now.
    pub(crate) fn tell(&self, debug_only: bool, message: impl FnOnce() -> String) -> bool {
        if self.0.load(Ordering::Relaxed) || self.0.swap(true, Ordering::Relaxed) {
            return false;
        }
        let message = message();
        tracing::warn!("{message}");
        if (!debug_only || cfg!(debug_assertions)) && !tracing::enabled!(tracing::Level::WARN) {
            eprintln!("{message}");
        }
        true
    }
}
