//! Where time comes from: [`Clock`], [`SystemClock`], and (with `test-util`) [`ManualClock`].

use std::fmt;
#[cfg(any(test, feature = "test-util"))]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(any(test, feature = "test-util"))]
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in integer microseconds since the Unix epoch.
///
/// Every algorithm works on integer microseconds, so a store driven by one clock gives
/// the same decisions as any other store driven by the same times.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;
}

/// The system clock: wall-clock time read once, at first use, then advanced by a
/// monotonic clock (the CPU's time-stamp counter where it is reliable, through `quanta`).
///
/// Reading it costs a few nanoseconds instead of a `clock_gettime` call, and it never
/// steps backwards when NTP corrects the wall clock — what a limiter wants. It is the
/// default clock of `MemoryStore`; `RedisStore` uses Redis's own `TIME`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

fn wall_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The wall-clock time and the raw counter reading taken together at first use.
struct Anchor {
    wall_micros: u64,
    clock: quanta::Clock,
    raw: u64,
}

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        static ANCHOR: std::sync::OnceLock<Anchor> = std::sync::OnceLock::new();
        let a = ANCHOR.get_or_init(|| {
            let clock = quanta::Clock::new();
            Anchor { wall_micros: wall_micros(), raw: clock.raw(), clock }
        });
        // A raw counter read and one scaling: no thread-local or global lookups per call.
        a.wall_micros + a.clock.delta_as_nanos(a.raw, a.clock.raw()) / 1_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_follows_the_wall_clock_and_never_goes_back() {
        let c = SystemClock;
        let a = c.now_micros();
        let wall = wall_micros();
        assert!(a.abs_diff(wall) < 1_000_000, "{a} vs {wall}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = c.now_micros();
        assert!(b >= a + 15_000, "{a} -> {b}");
    }
}

/// A clock that moves only when told to; clones share one time. For tests of limits:
/// `MemoryStore::with_clock(clock.clone())`, then `clock.advance(..)`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000_000);
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now_micros(), 1_005_000);
/// ```
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

#[cfg(any(test, feature = "test-util"))]
impl ManualClock {
    /// A clock standing at `micros` since the Unix epoch.
    #[must_use]
    pub fn new(micros: u64) -> Self {
        Self(Arc::new(AtomicU64::new(micros)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: std::time::Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.0.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the clock to `micros` since the Unix epoch.
    pub fn set(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(any(test, feature = "test-util"))]
impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now_micros()).finish()
    }
}

/// A shared, type-erased clock.
#[cfg_attr(not(any(feature = "memory", feature = "redis")), allow(dead_code))]
#[derive(Clone)]
pub(crate) struct SharedClock(pub(crate) std::sync::Arc<dyn Clock>);

#[cfg_attr(not(any(feature = "memory", feature = "redis")), allow(dead_code))]
impl SharedClock {
    #[cfg_attr(not(feature = "memory"), allow(dead_code))]
    pub(crate) fn system() -> Self {
        Self(std::sync::Arc::new(SystemClock))
    }

    pub(crate) fn now(&self) -> u64 {
        self.0.now_micros()
    }
}

impl fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Clock")
    }
}
