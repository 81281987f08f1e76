//! A store that behaves like a remote one (not local: the layer guards it with the
//! deadline, the breaker and the blocked-key cache) and fails, hangs or decides on
//! demand, deciding through a `MemoryStore` while up; and a clock that follows tokio's.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::{Check, Store};
use tollgate::store::{Outcome, Refund};
use tollgate::{Algorithm, Decision, Limiter, MemoryStore, Quota, StoreError};

/// 2023-11-14T22:13:20Z, in µs.
pub const T0: u64 = 1_700_000_000_000_000;

/// What a [`Remote`] does with the next calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decides through its `MemoryStore`.
    Up,
    /// Fails at once.
    Failing,
    /// Never answers.
    Hanging,
    /// Answers through another task after this long, as a connection's task hands over a
    /// reply it read from the socket.
    Relayed(std::time::Duration),
}

/// A remote-like store over a `MemoryStore`; clones share everything.
#[derive(Clone)]
pub struct Remote {
    pub inner: MemoryStore,
    mode: Arc<Mutex<Mode>>,
    checks: Arc<AtomicUsize>,
    refunds: Arc<Mutex<Vec<Refund>>>,
}

impl Remote {
    pub fn new(inner: MemoryStore) -> Self {
        Self { inner, mode: Arc::new(Mutex::new(Mode::Up)), checks: Arc::default(), refunds: Arc::default() }
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Check calls that reached the store (in any mode).
    pub fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    /// Every refund the store was asked for.
    pub fn refunds(&self) -> Vec<Refund> {
        self.refunds.lock().unwrap().clone()
    }

    fn answer<T: Send + 'static>(
        &self,
        up: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        self.checks.fetch_add(1, Ordering::SeqCst);
        let mode = *self.mode.lock().unwrap();
        async move {
            match mode {
                Mode::Up => up.await,
                Mode::Failing => Err(StoreError::Unavailable("connection refused".into())),
                Mode::Hanging => std::future::pending().await,
                Mode::Relayed(after) => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = tx.send(up.await);
                    });
                    rx.await.unwrap_or_else(|_| Err(StoreError::Unavailable("the relay was dropped".into())))
                }
            }
        }
    }
}

impl Store for Remote {
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        let (inner, check) = (self.inner.clone(), check.clone());
        self.answer(async move { inner.check_one(&check).await })
    }

    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        let (inner, checks) = (self.inner.clone(), checks.to_vec());
        self.answer(async move { inner.check(&checks).await })
    }

    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.refunds.lock().unwrap().extend_from_slice(refunds);
        self.inner.refund(refunds)
    }

    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.inner.peek(check)
    }

    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (inner, charges) = (self.inner.clone(), charges.to_vec());
        self.answer(async move { inner.charge(&charges).await })
    }

    fn reset(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(rule, key, algorithm)
    }

    fn block(
        &self,
        check: &Check,
        duration: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (inner, check) = (self.inner.clone(), check.clone());
        self.answer(async move { inner.block(&check, duration).await })
    }
}

/// A store clock that follows tokio's (paused) clock from `T0`, so sleeps move it too.
#[derive(Clone)]
pub struct TokioClock(Instant);

impl TokioClock {
    pub fn new() -> Self {
        Self(Instant::now())
    }
}

impl Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        T0 + u64::try_from(self.0.elapsed().as_micros()).unwrap()
    }
}

/// Lets spawned work (refunds run detached) finish: a few turns of the scheduler.
pub async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// The issue's example: L = 2/min; A at 0 s, B at 72 s, C at 78 s; A's refund at 90 s
/// (its unit left the window at 60 s) must refund nothing, so D at 96 s is rejected:
/// B and C are in (36 s, 96 s].
pub async fn sliding_log_refund_example<St: Store>(store: St, clock: &ManualClock) {
    const SEC: u64 = 1_000_000;
    let user = |u: &str| Some(Key::from(u));
    let limiter = Limiter::builder(store)
        .rule("r", Quota::per_minute(2), user)
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
        .unwrap();
    let at = |s: u64| clock.set(T0 + s * SEC);
    at(0);
    let a = limiter.check("k").await;
    at(72);
    let b = limiter.check("k").await;
    at(78);
    let c = limiter.check("k").await;
    assert!(a.is_allowed() && b.is_allowed() && c.is_allowed());
    at(90);
    limiter.refund(a).await.unwrap();
    at(96);
    assert!(limiter.check("k").await.is_rejected(), "three units in (36 s, 96 s]");
    // Giving back C's unit (still in the window) frees exactly one.
    limiter.refund(c).await.unwrap();
    assert!(limiter.check("k").await.is_allowed());
    assert!(limiter.check("k").await.is_rejected());
}
