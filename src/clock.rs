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

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
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
#[derive(Clone)]
pub(crate) struct SharedClock(pub(crate) std::sync::Arc<dyn Clock>);

impl SharedClock {
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
