//! Where time comes from: [`Clock`], [`SystemClock`], and (with `test-util`) [`ManualClock`].

use std::fmt;
#[cfg(any(test, feature = "test-util"))]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(any(test, feature = "test-util"))]
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

mod system;

/// A source of wall-clock time in integer microseconds since the Unix epoch.
///
/// Every algorithm works on integer microseconds, so a store driven by one clock gives
/// the same decisions as any other store driven by the same times.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;
}

/// The system clock: wall-clock time advanced by a monotonic clock (the CPU's time-stamp
/// counter where it is reliable, through `quanta`), re-anchored to the wall clock every
/// second without ever stepping back.
///
/// Reading it costs a few nanoseconds instead of a `clock_gettime` call. It never steps
/// backwards when NTP corrects the wall clock — decisions and TTLs assume time goes
/// forward — yet it follows the wall clock: once a second it compares itself with it and
/// spreads the difference over the next second (running at most twice as fast, or at
/// least half as fast; a difference of more than a second ahead of it is a step forward).
/// So a time-stamp counter that runs fast on some hypervisor, or a wall clock that NTP
/// corrects, stays within a few milliseconds of the wall clock instead of drifting apart
/// over the uptime. It is the default clock of `MemoryStore`; `RedisStore` uses Redis's
/// own `TIME`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

fn wall_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        system_now()
    }
}

/// The system clock's reading (see [`SystemClock`]).
#[inline]
fn system_now() -> u64 {
    static CLOCK: std::sync::OnceLock<system::Disciplined<system::Tsc>> = std::sync::OnceLock::new();
    CLOCK.get_or_init(|| system::Disciplined::new(system::Tsc::new(), system::Tuning::DEFAULT)).now()
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
/// use tollgate::clock::{Clock, ManualClock};
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

/// A shared, type-erased clock: the system's, read with no dynamic call (an in-process
/// decision reads it once), or any other.
#[derive(Clone)]
pub(crate) enum SharedClock {
    System,
    Other(std::sync::Arc<dyn Clock>),
}

impl SharedClock {
    /// `clock`, shared.
    pub(crate) fn new(clock: impl Clock) -> Self {
        Self::Other(std::sync::Arc::new(clock))
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            SharedClock::System => system_now(),
            SharedClock::Other(clock) => clock.now_micros(),
        }
    }
}

impl fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Clock")
    }
}
