//! The circuit breaker: closed; open for `cool_down` after `threshold` consecutive
//! failures; then one probe decides whether it closes or opens again.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

static CIRCUIT_OPEN: crate::notice::Once = crate::notice::Once::new();

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

/// Leave to call the store, from [`Breaker::admit`]. Report the call's end with
/// [`Trial::success`] or [`Trial::failure`]; a trial dropped without either (its future
/// was dropped: a client gone, an outer timeout, a `select!`; or the in-flight cap refused
/// the call) hands the half-open probe back, so the next call after the cool-down probes
/// again.
pub(crate) struct Trial<'a> {
    breaker: &'a Breaker,
    /// Whether this call is the half-open probe, until it is reported.
    probe: bool,
}

impl Trial<'_> {
    pub(crate) fn success(mut self) {
        let (b, probe) = (self.breaker, std::mem::take(&mut self.probe));
        b.failures.store(0, Ordering::Relaxed);
        if probe || b.open_until.load(Ordering::Relaxed) != 0 {
            b.open_until.store(0, Ordering::Release);
            b.probing.store(false, Ordering::Release);
            crate::metrics::circuit_open(false);
            if probe {
                tracing::info!("tollgate: store answered the probe; circuit closed");
            }
        }
    }

    /// A call that failed without costing a wait: not counted, but a probe that finds the
    /// store still without a connection keeps the circuit open.
    pub(crate) fn neutral(self, now_us: u64) {
        if self.probe {
            self.failure(now_us);
        }
    }

    pub(crate) fn failure(mut self, now_us: u64) {
        let (b, probe) = (self.breaker, std::mem::take(&mut self.probe));
        let cool = u64::try_from(b.cool_down.as_micros()).unwrap_or(u64::MAX);
        if probe {
            b.open_until.store(now_us.saturating_add(cool).max(1), Ordering::Release);
            b.probing.store(false, Ordering::Release);
            return;
        }
        let n = b.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= b.threshold && b.open_until.load(Ordering::Relaxed) == 0 {
            b.open_until.store(now_us.saturating_add(cool).max(1), Ordering::Release);
            crate::metrics::circuit_open(true);
            tracing::warn!(failures = n, cool_down = ?b.cool_down, "tollgate: store keeps failing; circuit open");
            CIRCUIT_OPEN.tell(false, || {
                format!(
                    "tollgate: the rate-limit store failed {n} times in a row: its circuit is open, and it is not \
                     called for {:?} at a time until it answers (said once; see tollgate_circuit_open)",
                    b.cool_down
                )
            });
        }
    }
}

impl Drop for Trial<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
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

    /// Whether the circuit is closed (no failures enough to open it, no probe due).
    pub(crate) fn is_closed(&self) -> bool {
        self.open_until.load(Ordering::Acquire) == 0
    }

    /// Leave to call the store, or how long the circuit stays open.
    pub(crate) fn admit(&self, now_us: u64) -> Result<Trial<'_>, Duration> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Ok(Trial { breaker: self, probe: false });
        }
        if now_us < until {
            return Err(Duration::from_micros(until - now_us));
        }
        if self.probing.swap(true, Ordering::AcqRel) {
            return Err(self.cool_down);
        }
        Ok(Trial { breaker: self, probe: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(b: &Breaker, now: u64) -> Option<Trial<'_>> {
        b.admit(now).ok().filter(|p| p.probe)
    }

    #[test]
    fn breaker_opens_probes_and_closes() {
        let b = Breaker::new(3, Duration::from_secs(1));
        for _ in 0..2 {
            b.admit(0).unwrap().failure(0);
        }
        assert!(b.admit(0).is_ok_and(|p| !p.probe));
        b.admit(0).unwrap().failure(0);
        assert_eq!(b.admit(500_000).err(), Some(Duration::from_millis(500)));
        // After the cool-down exactly one caller probes.
        let p = probe(&b, 1_000_000).expect("the probe");
        assert!(b.admit(1_000_001).is_err());
        p.failure(1_000_002);
        assert!(b.admit(1_500_000).is_err());
        probe(&b, 2_000_002).expect("the next probe").success();
        assert!(b.admit(2_000_003).is_ok_and(|p| !p.probe));
    }

    #[test]
    fn an_abandoned_probe_is_handed_back() {
        let b = Breaker::new(1, Duration::from_secs(1));
        b.admit(0).unwrap().failure(0);
        // The probe's future is dropped before the store answers.
        drop(probe(&b, 1_000_000).expect("the probe"));
        // The next caller probes, and closes the circuit.
        probe(&b, 1_000_001).expect("a new probe").success();
        assert!(b.admit(1_000_002).is_ok_and(|p| !p.probe));
        // A plain call dropped unreported changes nothing.
        drop(b.admit(1_000_003).unwrap());
        assert!(b.admit(1_000_004).is_ok_and(|p| !p.probe));
    }

    #[test]
    fn calls_that_fail_at_once_neither_open_nor_close_the_circuit() {
        let b = Breaker::new(2, Duration::from_secs(1));
        // Any number of them between two failures: the count goes on, the circuit stays closed.
        b.admit(0).unwrap().failure(0);
        for _ in 0..100 {
            b.admit(0).unwrap().neutral(0);
        }
        assert!(b.admit(0).is_ok_and(|p| !p.probe));
        b.admit(0).unwrap().failure(0);
        assert!(b.admit(1).is_err(), "two failures open it");
        // A probe that finds the store still not connected keeps it open a cool-down more.
        probe(&b, 1_000_000).expect("the probe").neutral(1_000_000);
        assert_eq!(b.admit(1_500_000).err(), Some(Duration::from_millis(500)));
        probe(&b, 2_000_000).expect("the next probe").success();
        assert!(b.admit(2_000_001).is_ok_and(|p| !p.probe));
    }
}
