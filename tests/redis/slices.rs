//! Quota slices (issue 39) on a real Redis: three servers (each its own `RedisStore`, as
//! three machines would have) deciding one hot key mostly in memory, never over the limit
//! in any window; what the slices leave goes back; a reset, a block and `close` reach them.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, Limiter, Quota, RedisStore, Rule, Verdict};

use support::redis::RedisServer;

type Hot = Limiter<RedisStore, str>;

fn limiter(url: &str, algorithm: Algorithm, quota: Quota, slices: bool) -> Hot {
    Limiter::builder(RedisStore::from_url(url).unwrap().response_timeout(Duration::from_secs(2)))
        .add_rule(Rule::new("hot", quota, |k: &str| Some(k.to_owned())).algorithm(algorithm).blockable())
        .slices(slices)
        .fail_mode(tollgate::FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The window an allowed verdict's unit counts in (`period` µs): that of the store's time
/// of its commit (a slice's: when the store granted the slice).
fn window_of(v: &Verdict, period: u64) -> u64 {
    v.decisions().next().unwrap().taken.expect("an allowed verdict's commit").at / period
}

/// Admissions per window and how many came from a slice, from `tasks` tasks per limiter
/// asking as fast as they can for `run`.
async fn hammer(limiters: &[Arc<Hot>], period: u64, run: Duration) -> (BTreeMap<u64, (u64, u64)>, u64, u64) {
    let until = tokio::time::Instant::now() + run;
    let mut tasks = Vec::new();
    for l in limiters {
        for _ in 0..8 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                let (mut windows, mut sliced, mut all) = (BTreeMap::new(), 0, 0);
                while tokio::time::Instant::now() < until {
                    // A decision from a slice never waits: let the connections' tasks run.
                    tokio::task::yield_now().await;
                    let v = l.check("k").await;
                    assert!(v.store_error().is_none(), "{v}");
                    all += 1;
                    if v.is_allowed() {
                        let s = u64::from(v.decided_by() == Some(DecidedBy::Slice));
                        let e = windows.entry(window_of(&v, period)).or_insert((0, 0));
                        e.0 += 1;
                        e.1 += s;
                        sliced += u64::from(v.decided_by() == Some(DecidedBy::Slice));
                    }
                }
                (windows, sliced, all)
            }));
        }
    }
    let (mut windows, mut sliced, mut all) = (BTreeMap::new(), 0, 0);
    for t in tasks {
        let (w, s, a) = t.await.unwrap();
        for (k, (v, s)) in w {
            let e = windows.entry(k).or_insert((0, 0));
            e.0 += v;
            e.1 += s;
        }
        sliced += s;
        all += a;
    }
    (windows, sliced, all)
}

async fn never_over(algorithm: Algorithm) {
    let redis = RedisServer::start();
    let quota = Quota::per_second(3_000);
    let limiters: Vec<Arc<Hot>> = (0..3).map(|_| Arc::new(limiter(&redis.url(), algorithm, quota, true))).collect();
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    let (windows, sliced, all) = hammer(&limiters, 1_000_000, Duration::from_millis(3_500)).await;
    let calls = redis.commandstats().get("evalsha").copied().unwrap_or(0);
    for (w, (n, _)) in &windows {
        assert!(*n <= 3_000, "window {w} admitted {n} > 3000: {windows:?}");
    }
    let admitted: u64 = windows.values().map(|v| v.0).sum();
    // The whole windows in the middle were full: the slices' units went to requests.
    let full: Vec<_> = windows.values().skip(1).take(windows.len().saturating_sub(2)).collect();
    assert!(full.iter().all(|&&(n, _)| n >= 2_700), "{windows:?}");
    eprintln!(
        "{algorithm}: {windows:?}; {sliced} of {admitted} admitted from slices; {all} decisions, {calls} EVALSHA"
    );
    // A counter held at its limit has little room at a time (the previous window weighs
    // on): most of it is decided at the store, at the edge.
    if algorithm == Algorithm::FixedWindow {
        assert!(sliced * 10 > admitted * 8, "{sliced} of {admitted} from slices");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_never_admit_more_than_the_limit_in_a_fixed_window() {
    never_over(Algorithm::FixedWindow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_never_admit_more_than_the_limit_in_a_sliding_window_counter() {
    never_over(Algorithm::SlidingWindowCounter).await;
}

/// A limiter of one sliced fixed-window rule "hot", 6,000 a second, as one of `servers`.
fn hot(url: &str) -> Hot {
    limiter(url, Algorithm::FixedWindow, Quota::per_second(6_000), true)
}

/// What the store counted for key `k` under rule "hot" in its current fixed window.
fn stored(redis: &RedisServer) -> u64 {
    let keys = redis.cmd(&["KEYS", "*hot*"]);
    let key = keys.lines().next().expect("the key").trim().to_owned();
    let value = redis.cmd(&["GET", &key]);
    value.trim().split(':').nth(1).expect("window:count").parse().unwrap()
}

/// Decides until a decision comes from a slice (the first ones ask the store and start a
/// slice's request); the verdicts.
async fn until_sliced(l: &Hot) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for _ in 0..2_000 {
        let v = l.check("k").await;
        assert!(v.is_allowed(), "{v}");
        let sliced = v.decided_by() == Some(DecidedBy::Slice);
        verdicts.push(v);
        if sliced {
            return verdicts;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    panic!("no decision from a slice");
}

/// Waits to be at least `margin` before the end of the current second (fixed windows of
/// a second are aligned).
async fn early_in_a_second(margin: Duration) {
    let into = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_micros();
    let left = Duration::from_micros(1_000_000 - u64::from(into));
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(5)).await;
    }
}

/// A refund of a sliced verdict goes back to the slice, with no store call, while the
/// slice is open; what the slice left goes back to the store when the limiter closes, and
/// the store's count is then what was kept.
#[tokio::test]
async fn a_refund_returns_to_the_slice_and_close_gives_back_what_is_left() {
    let redis = RedisServer::start();
    let l = hot(&redis.url());
    early_in_a_second(Duration::from_millis(600)).await;
    let mut verdicts = until_sliced(&l).await;
    let sliced = verdicts.pop().unwrap();
    let kept = verdicts.len() as u64 + 1;
    let before = redis.commandstats().get("evalsha").copied().unwrap_or(0);
    l.refund(sliced).await.unwrap();
    assert_eq!(redis.commandstats().get("evalsha").copied().unwrap_or(0), before, "a store call for a refund to an open slice");
    // The slice holds the refunded unit: the next decision takes it.
    let again = l.check("k").await;
    assert_eq!(again.decided_by(), Some(DecidedBy::Slice));
    let in_store = stored(&redis);
    assert!(in_store > kept, "the store counted the slice: {in_store} for {kept} kept");
    l.close().await.unwrap();
    assert_eq!(stored(&redis), kept, "close gave back all the slice did not admit");
    // After close, no slice: every decision asks the store.
    for _ in 0..50 {
        assert_eq!(l.check("k").await.decided_by(), Some(DecidedBy::Store));
    }
}

/// A unit given back after its slice closed goes to the store, as a refund of the slice's
/// commit: the count is exact either way.
#[tokio::test]
async fn a_refund_after_the_slice_lapsed_goes_to_the_store() {
    let redis = RedisServer::start();
    let l = hot(&redis.url());
    early_in_a_second(Duration::from_millis(600)).await;
    let mut verdicts = until_sliced(&l).await;
    let sliced = verdicts.pop().unwrap();
    let kept = verdicts.len() as u64;
    // The slice lapses (100 ms) and the sweeper gives back what it left.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(stored(&redis), kept + 1, "the lapsed slice's units went back, but the one admitted");
    l.refund(sliced).await.unwrap();
    assert_eq!(stored(&redis), kept, "the unit went back to the store");
}

/// A reset closes this server's slices without giving them back (they were taken from
/// the state the reset forgot); a block closes them and gives back what they left.
#[tokio::test]
async fn a_reset_and_a_block_close_this_servers_slices() {
    let redis = RedisServer::start();
    let l = hot(&redis.url());
    early_in_a_second(Duration::from_millis(600)).await;
    until_sliced(&l).await;
    l.reset("hot", "k").await.unwrap();
    let v = l.check("k").await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Store), "a slice survived the reset");
    assert_eq!(stored(&redis), 1, "the reset's fresh count holds only the request after it");
    until_sliced(&l).await;
    l.block("hot", "k", Duration::from_secs(60)).await.unwrap();
    let v = l.check("k").await;
    assert!(v.is_rejected(), "a slice admitted a blocked key: {v}");
}
