//! The circuit breaker: closed; open for `cool_down` after `threshold` consecutive
//! failures; then one probe decides whether it closes or opens again.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub(crate) struct Breaker {
    pub(crate) threshold: u32,
    pub(crate) cool_down: Duration,
    failures: AtomicU32,
    /// Monotonic µs until which the circuit is open; 0 when closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("threshold", &self.threshold)
            .field("cool_down", &self.cool_down)
            .field("open", &(self.open_until.load(Ordering::Relaxed) != 0))
            .finish()
    }
}

/// Whether a call may go to the store, and if it is the half-open probe.
pub(crate) enum Admit {
    Call { probe: bool },
    Refuse(Duration),
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    pub(crate) fn admit(&self, now_us: u64) -> Admit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Admit::Call { probe: false };
        }
        if now_us < until {
            return Admit::Refuse(Duration::from_micros(until - now_us));
        }
        if self.probing.swap(true, Ordering::AcqRel) {
            return Admit::Refuse(self.cool_down);
        }
        Admit::Call { probe: true }
    }

    pub(crate) fn success(&self, probe: bool) {
        self.failures.store(0, Ordering::Relaxed);
        if probe || self.open_until.load(Ordering::Relaxed) != 0 {
            self.open_until.store(0, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            crate::metrics::circuit_open(false);
            if probe {
                tracing::info!("tollgate: store answered the probe; circuit closed");
            }
        }
    }

    pub(crate) fn failure(&self, probe: bool, now_us: u64) {
        let cool = u64::try_from(self.cool_down.as_micros()).unwrap_or(u64::MAX);
        if probe {
            self.open_until.store(now_us.saturating_add(cool).max(1), Ordering::Release);
            self.probing.store(false, Ordering::Release);
            return;
        }
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.threshold && self.open_until.load(Ordering::Relaxed) == 0 {
            self.open_until.store(now_us.saturating_add(cool).max(1), Ordering::Release);
            crate::metrics::circuit_open(true);
            tracing::warn!(failures = n, cool_down = ?self.cool_down, "tollgate: store keeps failing; circuit open");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_probes_and_closes() {
        let b = Breaker::new(3, Duration::from_secs(1));
        for _ in 0..2 {
            b.failure(false, 0);
        }
        assert!(matches!(b.admit(0), Admit::Call { probe: false }));
        b.failure(false, 0);
        assert!(matches!(b.admit(500_000), Admit::Refuse(d) if d == Duration::from_millis(500)));
        // After the cool-down exactly one caller probes.
        assert!(matches!(b.admit(1_000_000), Admit::Call { probe: true }));
        assert!(matches!(b.admit(1_000_001), Admit::Refuse(_)));
        b.failure(true, 1_000_002);
        assert!(matches!(b.admit(1_500_000), Admit::Refuse(_)));
        assert!(matches!(b.admit(2_000_002), Admit::Call { probe: true }));
        b.success(true);
        assert!(matches!(b.admit(2_000_003), Admit::Call { probe: false }));
    }
}
