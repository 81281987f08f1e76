//! A failing store: the circuit breaker's probe, and the in-process fallback.

use crate::support;

use std::time::Duration;

use support::fake::{Mode, Remote, TokioClock, T0};
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::verdict::DecidedBy;
use tollgate::{FailMode, Limiter, MemoryStore, Quota};

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

// 1. The circuit breaker stayed open for ever when its half-open probe was dropped.

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_does_not_keep_the_circuit_open() {
    let store = Remote::new(MemoryStore::with_clock(TokioClock::new()));
    let limiter = Limiter::builder(store.clone())
        .rule("r", Quota::per_minute(100), user)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1, Duration::from_secs(1))
        .fail_mode(FailMode::Closed)
        .build()
        .unwrap();
    store.set(Mode::Failing);
    assert!(!limiter.check("a").await.is_allowed());
    tokio::time::advance(Duration::from_secs(1)).await;
    // The probe finds the store slow; its caller gives up before the deadline.
    store.set(Mode::Hanging);
    assert!(tokio::time::timeout(Duration::from_millis(10), limiter.check("a")).await.is_err());
    let calls = store.checks();
    store.set(Mode::Up);
    let v = limiter.check("a").await;
    assert!(v.is_allowed() && v.store_error().is_none(), "the circuit stayed open: {v:?}");
    assert_eq!(store.checks(), calls + 1, "the store was not asked again");
}

// 4 and 5. The fallback limiter's decisions are its own: its rejections never enter the
// blocked-key cache, and its units are given back to it.

pub(crate) fn fallback_limiter(store: Remote, quota: Quota) -> Limiter<Remote, str> {
    Limiter::builder(store)
        .rule("r", quota, user)
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)))
        .servers(2)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap()
}

#[tokio::test]
async fn fallback_rejections_end_with_the_outage() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = fallback_limiter(store.clone(), Quota::per_hour(4));
    store.set(Mode::Failing);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(limiter.check("k").await);
    }
    assert_eq!(got.iter().map(tollgate::Verdict::is_allowed).collect::<Vec<_>>(), [true, true, false]);
    assert_eq!(got[2].decided_by(), Some(DecidedBy::Fallback));
    assert!(got[2].retry_after().is_some_and(|r| r > Duration::from_secs(60)));
    // Redis is back: the key has used nothing there, and the store must be asked.
    store.set(Mode::Up);
    let calls = store.checks();
    let v = limiter.check("k").await;
    assert_eq!(store.checks(), calls + 1, "the fallback's rejection was served from the cache");
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Store), "{v:?}");
}

// 11. The fallback rebuilt quotas with `Quota::burst`, which could panic at request time.

#[tokio::test]
async fn the_fallback_never_panics_on_a_quota_the_builder_accepted() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = fallback_limiter(store.clone(), Quota::per_day(3).try_burst(150_000).unwrap());
    store.set(Mode::Failing);
    let v = limiter.check("k").await;
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
}

/// A stall of this process is not a failure of the store: while the thread is blocked (a
/// descheduled or CPU-throttled process), the store's answer arrives and waits for the
/// connection's task; the deadline's timer fires late. The answer is read, the decision is
/// the store's, and the breaker counts nothing against the store.
#[tokio::test(flavor = "current_thread")]
async fn a_stalled_process_is_not_a_failed_store() {
    let store = Remote::new(MemoryStore::new());
    store.set(Mode::Relayed(Duration::from_millis(5)));
    let limiter = Limiter::<_, str>::builder(store.clone())
        .rule("api", Quota::per_minute(100), user)
        .circuit_breaker(2, Duration::from_secs(60))
        .build()
        .unwrap();
    for i in 0..5 {
        let stall = tokio::spawn(async {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(120));
        });
        let verdict = limiter.check("ada").await;
        assert!(verdict.store_error().is_none(), "stall {i}: {:?}", verdict.store_error());
        assert_eq!(verdict.decided_by(), Some(DecidedBy::Store), "stall {i}");
        stall.await.unwrap();
    }
    // Every call was the store's, and the circuit is closed: a sixth call reaches it.
    store.set(Mode::Up);
    assert!(limiter.check("ada").await.is_allowed());
    assert_eq!(store.checks(), 6);
    let check = tollgate::store::Check {
        rule: "api".into(),
        key: "ada".into(),
        algorithm: tollgate::Algorithm::default(),
        params: tollgate::store::Params::new(Quota::per_minute(100)),
    };
    let left = tollgate::store::Store::peek(&store, &check).await.unwrap();
    assert_eq!(left.remaining(), 93, "six units taken in the store (a peek decides one more)");
}

/// A stall does not hide a dead store, and a dead store is not blamed for a stall. In
/// paused time, a stall is a task that moves the clock while the call waits (its timers
/// then fire late); the store hangs throughout.
/// - One stall before the deadline, then the call runs through the slack: the store had
///   it and did not answer, so the breaker counts it (two open the circuit).
/// - A second stall during the slack: nothing is known against the store; the circuit
///   stays closed, for up to the breaker's threshold of such timeouts in a row, after
///   which they count (a dead store on a throttled host still opens it).
/// - A 2 ms deadline on a process that runs on time: timers a tick late are no stall.
#[tokio::test(start_paused = true)]
async fn a_stall_neither_hides_nor_blames_a_dead_store() {
    let limiter = |store: &Remote, deadline| {
        store.set(Mode::Hanging);
        Limiter::<_, str>::builder(store.clone())
            .rule("api", Quota::per_minute(100), user)
            .fail_mode(FailMode::Open)
            .timeout(Duration::from_millis(deadline))
            .circuit_breaker(2, Duration::from_secs(60))
            .build()
            .unwrap()
    };
    // Moves the clock by `by` once the clock reads `at` (ms from now; 0: at once).
    let stall = |at: u64, by: u64| {
        let at = tokio::time::Instant::now() + Duration::from_millis(at);
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            tokio::time::advance(Duration::from_millis(by)).await;
        })
    };
    let open =
        |verdict: &tollgate::Verdict| matches!(verdict.store_error(), Some(tollgate::StoreError::CircuitOpen(_)));
    let timed_out =
        |verdict: &tollgate::Verdict| matches!(verdict.store_error(), Some(tollgate::StoreError::Timeout(_)));

    let store = Remote::new(MemoryStore::new());
    let dead = limiter(&store, 20);
    for _ in 0..2 {
        let s = stall(0, 60);
        assert!(timed_out(&dead.check("ada").await));
        s.await.unwrap();
    }
    let before = store.checks();
    assert!(open(&dead.check("ada").await), "one stall and then the slack: the store failed");
    assert_eq!(store.checks(), before, "an open circuit asks nothing");

    let store = Remote::new(MemoryStore::new());
    let throttled = limiter(&store, 20);
    for i in 0..4 {
        // One stall before the deadline, one during the slack that follows it.
        let (first, second) = (stall(0, 60), stall(21, 60));
        let verdict = throttled.check("ada").await;
        assert!(timed_out(&verdict), "stall {i}: {:?}", verdict.store_error());
        first.await.unwrap();
        second.await.unwrap();
    }
    assert!(open(&throttled.check("ada").await), "two stalled timeouts are let go, the next two count");

    let store = Remote::new(MemoryStore::new());
    let quick = limiter(&store, 2);
    for _ in 0..2 {
        assert!(timed_out(&quick.check("ada").await));
    }
    assert!(open(&quick.check("ada").await), "a 2 ms deadline's timeouts count");
}

/// On a process that runs on time, a timer fires a tick (a millisecond or two) late: with
/// a small deadline that is no stall, and a hanging store's timeouts count (found by
/// review: with the slack a fifth of a 2 ms deadline, every timeout looked stalled and the
/// circuit never opened). Real time, as a paused clock fires timers exactly.
#[tokio::test(flavor = "current_thread")]
async fn a_small_deadline_late_by_a_tick_is_not_a_stall() {
    let store = Remote::new(MemoryStore::new());
    store.set(Mode::Hanging);
    let limiter = Limiter::<_, str>::builder(store.clone())
        .rule("api", Quota::per_minute(100), user)
        .fail_mode(FailMode::Open)
        .timeout(Duration::from_millis(2))
        .circuit_breaker(2, Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..2 {
        assert!(matches!(limiter.check("ada").await.store_error(), Some(tollgate::StoreError::Timeout(_))));
    }
    let verdict = limiter.check("ada").await;
    assert!(matches!(verdict.store_error(), Some(tollgate::StoreError::CircuitOpen(_))), "{:?}", verdict.store_error());
}

/// A call dropped while it waits out the stall's slack (its client gone) leaves nothing
/// behind: its in-flight slot is free (with `max_in_flight(1)`, the next call reaches the
/// store) and the breaker holds nothing against the store.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_in_the_stall_slack_leaves_nothing_behind() {
    let store = Remote::new(MemoryStore::new());
    store.set(Mode::Hanging);
    let limiter = std::sync::Arc::new(
        Limiter::<_, str>::builder(store.clone())
            .rule("api", Quota::per_minute(100), user)
            .timeout(Duration::from_millis(20))
            .max_in_flight(1)
            .circuit_breaker(1, Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    let call = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.check("ada").await }
    });
    support::fake::settle().await; // the call waits for its deadline
    tokio::time::advance(Duration::from_millis(60)).await; // a stall: the deadline fires late
    support::fake::settle().await; // the call now waits out the slack
    assert!(!call.is_finished(), "still in the slack");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    store.set(Mode::Up);
    let before = store.checks();
    let verdict = limiter.check("ada").await;
    assert_eq!(verdict.decided_by(), Some(DecidedBy::Store), "{:?}", verdict.store_error());
    assert_eq!(store.checks(), before + 1);
}

// Bounded degradation (issue 26): what the fallback admits reaches the store, and what
// the store answers after a deadline teaches the fallback.

/// A limiter over `store` of `quota` per user, each server's share for one server, with a
/// 20 ms deadline and a breaker that opens after `failures`.
fn degrading(store: &Remote, quota: Quota, failures: u32) -> Limiter<Remote, str> {
    Limiter::builder(store.clone())
        .rule("r", quota, user)
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)))
        .servers(1)
        .timeout(Duration::from_millis(20))
        .circuit_breaker(failures, Duration::from_secs(60))
        .build()
        .unwrap()
}

/// What the store would leave of `key` under rule "r" after one more unit (a peek).
async fn left(store: &Remote, quota: Quota, key: &str) -> u64 {
    let check = tollgate::store::Check {
        rule: "r".into(),
        key: key.into(),
        algorithm: tollgate::Algorithm::default(),
        params: tollgate::store::Params::new(quota),
    };
    tollgate::store::Store::peek(store, &check).await.unwrap().remaining()
}

/// The store unreachable: what the fallback admits is charged to the store when it
/// answers again (else the store would admit the whole quota on top).
#[tokio::test]
async fn what_the_fallback_admits_while_the_store_is_unreachable_is_charged_when_it_answers() {
    let quota = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = degrading(&store, quota, 1_000);
    store.set(Mode::Failing);
    for _ in 0..3 {
        let v = limiter.check("ada").await;
        assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
    }
    support::fake::settle().await;
    assert_eq!(left(&store, quota, "ada").await, 9, "nothing reached the store yet");
    store.set(Mode::Up);
    assert_eq!(limiter.check("ada").await.decided_by(), Some(DecidedBy::Store));
    support::fake::settle().await;
    assert_eq!(left(&store, quota, "ada").await, 5, "the fallback's 3 and the store's own 1");
}

/// The circuit open on a store that would answer: what the fallback admits is charged at
/// once (it queues behind what the store has yet to answer), not after the cool-down.
#[tokio::test]
async fn what_the_fallback_admits_while_the_circuit_is_open_is_charged_at_once() {
    let quota = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = degrading(&store, quota, 1);
    store.set(Mode::Failing);
    assert!(limiter.check("ada").await.is_allowed(), "the fallback admits; the circuit opens");
    // Its charge fails too, and waits for the store's next answer.
    support::fake::settle().await;
    store.set(Mode::Up);
    let calls = store.checks();
    for _ in 0..2 {
        let v = limiter.check("ada").await;
        assert!(v.is_allowed() && matches!(v.decided_by(), Some(DecidedBy::Fallback)), "{v:?}");
    }
    support::fake::settle().await;
    // Two charges, no check: the circuit is open for 60 s.
    assert_eq!(store.checks(), calls + 2);
    assert_eq!(left(&store, quota, "ada").await, 7, "the two admitted while the circuit was open");
}

/// A call cut by its deadline still runs: its rejection, when it comes, enters the
/// blocked-key cache (the store is not asked again for the key), and nothing it took
/// stays taken.
#[tokio::test(start_paused = true)]
async fn a_late_rejection_enters_the_blocked_key_cache() {
    let quota = Quota::per_hour(2);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = degrading(&store, quota, 1_000);
    for _ in 0..2 {
        assert_eq!(limiter.check("ada").await.decided_by(), Some(DecidedBy::Store));
    }
    store.set(Mode::Relayed(Duration::from_millis(100)));
    let v = limiter.check("ada").await;
    assert!(v.is_rejected() && v.decided_by() == Some(DecidedBy::Fallback), "nothing left: {v:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.set(Mode::Hanging);
    let calls = store.checks();
    let v = limiter.check("ada").await;
    assert!(v.is_rejected() && v.decided_by() == Some(DecidedBy::LocalCache), "{v:?}");
    assert_eq!(store.checks(), calls, "the late rejection answered");
}

/// What a late answer says remains bounds the fallback: 7 of 10 were taken elsewhere, so
/// after its late answer this server admits 2 more, not its fresh share of 10.
#[tokio::test(start_paused = true)]
async fn a_late_answer_lowers_the_fallbacks_share() {
    let quota = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let elsewhere = degrading(&store, quota, 1_000);
    for _ in 0..7 {
        assert!(elsewhere.check("ada").await.is_allowed());
    }
    let limiter = degrading(&store, quota, 1_000);
    store.set(Mode::Relayed(Duration::from_millis(100)));
    let v = limiter.check("ada").await;
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.set(Mode::Hanging);
    let mut admitted = 0;
    for _ in 0..5 {
        let v = limiter.check("ada").await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Fallback), "{v:?}");
        admitted += usize::from(v.is_allowed());
    }
    assert_eq!(admitted, 2, "the store said 2 remain (10 - 7 - the late call's 1)");
}

/// Refused while its call was cut (a 503 under `FailMode::Closed`): what the late call
/// takes in the store is given back.
#[tokio::test(start_paused = true)]
async fn a_late_admission_of_a_refused_request_is_given_back() {
    let quota = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", quota, user)
        .fail_mode(FailMode::Closed)
        .timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    store.set(Mode::Relayed(Duration::from_millis(100)));
    let v = limiter.check("ada").await;
    assert!(!v.is_allowed() && v.store_error().is_some(), "{v:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.refunds().len(), 1, "the late unit was given back");
    assert_eq!(left(&store, quota, "ada").await, 9, "all 10 left");
}
