//! Review of 1df216c..df03ee0: `check`/`check_key` are futures, and futures are lazy — one
//! built and dropped without a poll (a `select!` branch not taken, a `biased` select whose
//! first branch was ready) must take nothing.

use tollgate::clock::ManualClock;
use tollgate::{Limiter, MemoryStore, Quota};

use crate::support::fake::T0;

#[tokio::test]
async fn an_unpolled_check_key_takes_nothing() {
    let limiter: Limiter<MemoryStore, str> = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("r", Quota::per_minute(2), |s: &str| Some(s.to_owned()))
        .build()
        .unwrap();
    // Built, never polled, dropped.
    drop(limiter.check_key("r", "k", 1));
    drop(limiter.check_key("r", "k", 1));
    let v = limiter.check_key("r", "k", 1).await;
    assert!(v.is_allowed(), "two futures never polled took the quota: {v:?}");
    assert_eq!(v.most_restrictive().unwrap().decision.remaining(), 1, "{v:?}");
}

#[tokio::test]
async fn an_unpolled_check_takes_nothing() {
    let limiter: Limiter<MemoryStore, str> = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("r", Quota::per_minute(1), |s: &str| Some(s.to_owned()))
        .build()
        .unwrap();
    drop(limiter.check("k"));
    assert!(limiter.check("k").await.is_allowed(), "a future never polled took the quota");
}

/// The everyday form of it: a `biased` select whose first branch is ready never polls
/// the check, yet the check took its unit.
#[tokio::test]
async fn a_check_in_a_select_branch_not_taken_takes_nothing() {
    let limiter: Limiter<MemoryStore, str> = Limiter::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("r", Quota::per_minute(1), |s: &str| Some(s.to_owned()))
        .build()
        .unwrap();
    tokio::select! {
        biased;
        () = std::future::ready(()) => {}
        _ = limiter.check_key("r", "k", 1) => panic!("the first branch is ready"),
    }
    assert!(limiter.check_key("r", "k", 1).await.is_allowed(), "the branch not taken took the quota");
}

/// `.timeout(Duration::MAX)` (no deadline) on a remote store: the call's deadline is
/// `started + deadline`, which overflows the `Instant` and panics (`tokio::time::timeout`,
/// used before, takes a deadline past the end of time as "never").
#[tokio::test]
async fn a_deadline_of_duration_max_does_not_panic() {
    use crate::support::fake::Remote;
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter: Limiter<Remote, str> = Limiter::builder(store)
        .rule("r", Quota::per_minute(2), |s: &str| Some(s.to_owned()))
        .timeout(std::time::Duration::MAX)
        .build()
        .unwrap();
    let v = limiter.check_key("r", "k", 1).await;
    assert!(v.is_allowed() && v.store_error().is_none(), "{v:?}");
}
