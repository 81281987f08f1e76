//! A fresh reviewer's attacks on the fallback's bookkeeping (issue 37's closing effort),
//! in process with paused time.

use crate::support;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::fake::TokioClock;
use tollgate::key::Key;
use tollgate::store::{Check, Outcome, Refund, Store};
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, Decision, Limiter, MemoryStore, Quota, StoreError};

/// A remote-like store that decides each call the moment it is made (as Redis runs a
/// command as soon as it reads it) and hands the reply over after a delay of its own (the
/// next of `delays`, else at once), as a loaded process reads and wakes its callers late
/// and in any order; or fails at once while `down`.
#[derive(Clone)]
struct Decided {
    inner: MemoryStore,
    delays: Arc<Mutex<VecDeque<Duration>>>,
    down: Arc<AtomicBool>,
}

impl Store for Decided {
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        let answer = (!self.down.load(Ordering::SeqCst)).then(|| self.inner.check_at(checks, self.inner.now_micros()));
        let delay = self.delays.lock().unwrap().pop_front().unwrap_or_default();
        async move {
            let Some(answer) = answer else { return Err(StoreError::Unavailable("connection refused".into())) };
            tokio::time::sleep(delay).await;
            answer.map(|os| os.into_iter().map(Some).collect())
        }
    }
    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.refund(refunds)
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.inner.peek(check)
    }
    fn reset(&self, rule: &str, key: &Key, a: Algorithm) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(rule, key, a)
    }
}

/// One server (`.servers(1)`: its share is what the store says remains), GCRA 10/hour, a
/// 50 ms deadline. The store decides call X (5 of 10 used: 4 remain after it) and hands
/// its reply over 40 ms later, within the deadline; meanwhile 4 more calls are decided and
/// answered at once (0 remain). X's reply, the oldest news, comes last and is recorded in
/// time: it replaces the fresher 0 with 4. The store then fails: the fallback admits 4
/// more, 14 in the hour for L = 10 (the README's bound for a busy key: max(1.1 x L, L + N)
/// = 11; the store's latest word was 0 remain). Fails today.
///
/// This is what the cluster degradation test's 102-106 (bound 110 at L = 100) showed under
/// a doubled load: replies read 20-30 ms after Redis made them, one server hearing "76
/// remain" at 137 ms, after it had heard lower figures.
#[tokio::test(start_paused = true)]
async fn an_old_answer_heard_last_does_not_raise_the_share() {
    let store =
        Decided { inner: MemoryStore::with_clock(TokioClock::new()), delays: Arc::default(), down: Arc::default() };
    let limiter = Arc::new(
        Limiter::<_, str>::builder(store.clone())
            .rule("r", Quota::per_hour(10), |k: &str| Some(Key::from(k)))
            .algorithm(Algorithm::Gcra)
            .servers(1)
            .timeout(Duration::from_millis(50))
            .circuit_breaker(1_000, Duration::from_secs(1))
            .local_cache(false)
            .build()
            .unwrap(),
    );
    let mut admitted = 0;
    for _ in 0..5 {
        let v = limiter.check_key("r", "k", 1).await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Store));
        admitted += usize::from(v.is_allowed());
    }
    store.delays.lock().unwrap().push_back(Duration::from_millis(40));
    let l = Arc::clone(&limiter);
    let x = tokio::spawn(async move { l.check_key("r", "k", 1).await });
    tokio::time::sleep(Duration::from_millis(1)).await;
    for _ in 0..4 {
        let v = limiter.check_key("r", "k", 1).await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Store));
        admitted += usize::from(v.is_allowed());
    }
    let x = x.await.unwrap();
    assert_eq!(x.decided_by(), Some(DecidedBy::Store), "X answered in time");
    admitted += usize::from(x.is_allowed());
    assert_eq!(admitted, 10, "the store's 10");
    store.down.store(true, Ordering::SeqCst);
    let mut fallback = 0;
    for _ in 0..20 {
        let v = limiter.check_key("r", "k", 1).await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Fallback));
        fallback += usize::from(v.is_allowed());
    }
    assert_eq!(fallback, 0, "admitted by the fallback after the store's latest answer said 0 remain");
}
