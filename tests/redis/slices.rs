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
    hammer_key(limiters, "k", period, run).await
}

/// [`hammer`] on key `key`.
async fn hammer_key(
    limiters: &[Arc<Hot>],
    key: &'static str,
    period: u64,
    run: Duration,
) -> (BTreeMap<u64, (u64, u64)>, u64, u64) {
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
                    let v = l.check(key).await;
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

/// Every admission on key `key`: its reading of the store's clock (the decision's) and
/// who decided it; and how many decisions were made, by 8 tasks per limiter asking as fast
/// as they can for `run`.
async fn stamped(limiters: &[Arc<Hot>], key: &'static str, run: Duration) -> (Vec<(u64, DecidedBy)>, u64) {
    let until = tokio::time::Instant::now() + run;
    let mut tasks = Vec::new();
    for l in limiters {
        for _ in 0..8 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                let (mut at, mut all) = (Vec::new(), 0);
                while tokio::time::Instant::now() < until {
                    tokio::task::yield_now().await;
                    let v = l.check(key).await;
                    all += 1;
                    if v.is_allowed() {
                        let stamp = v.decisions().next().unwrap().decision.decided_at_micros();
                        at.push((stamp, v.decided_by().expect("decided")));
                    }
                }
                (at, all)
            }));
        }
    }
    let (mut at, mut all) = (Vec::new(), 0);
    for t in tasks {
        let (a, n) = t.await.unwrap();
        at.extend(a);
        all += n;
    }
    (at, all)
}

/// [`stamped`] on key "k": the stamps, how many a slice decided, and the decisions.
async fn stamps(limiters: &[Arc<Hot>], run: Duration) -> (Vec<u64>, u64, u64) {
    let (at, all) = stamped(limiters, "k", run).await;
    assert!(at.iter().all(|&(_, by)| by != DecidedBy::Fallback), "the store failed");
    let sliced = at.iter().filter(|&&(_, by)| by == DecidedBy::Slice).count() as u64;
    (at.into_iter().map(|(t, _)| t).collect(), sliced, all)
}

/// How far the worst run of admissions (stamps `t_i <= … <= t_j`) goes past a bucket's
/// bound `B + r·(t_j - t_i)`, in µs of slots: `units·T - (t_j - t_i) - B·T`; at most 0
/// when the bound holds for every run.
fn past_the_bound(stamps: &mut [u64], t: u64, span: u64) -> i128 {
    stamps.sort_unstable();
    let (t, span) = (i128::from(t), i128::from(span));
    let (mut units, mut least, mut worst) = (0i128, i128::MAX, i128::MIN);
    for &at in stamps.iter() {
        let at = i128::from(at);
        least = least.min(units * t - at);
        units += 1;
        worst = worst.max(units * t - at - least - span);
    }
    worst
}

/// Issue 43: three servers on a bucket's hot key, at the edge most of the time (the burst
/// is a tenth of a second's rate, gone at once): every admission's stamp keeps GCRA's bound
/// exactly, most are decided from slices at their slots, and little of the rate is lost.
async fn bucket_bound(algorithm: Algorithm) {
    let redis = RedisServer::start();
    // T = 250 µs, B·T = 100 ms.
    let quota = Quota::per_second(4_000).burst(400);
    let limiters: Vec<Arc<Hot>> = (0..3).map(|_| Arc::new(limiter(&redis.url(), algorithm, quota, true))).collect();
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    let (mut at, sliced, all) = stamps(&limiters, Duration::from_millis(2_500)).await;
    let calls = redis.commandstats().get("evalsha").copied().unwrap_or(0);
    let admitted = at.len() as u64;
    let past = past_the_bound(&mut at, 250, 100_000);
    let span = at.last().unwrap() - at.first().unwrap();
    // What an exact GCRA admits at most in that span: B + r·Δ.
    let most = 400 + span / 250;
    eprintln!("{algorithm}: {admitted} admitted ({sliced} from slices) of {all} decisions, at most {most}; {calls} EVALSHA; worst run {past} µs");
    assert!(past <= 0, "a run of admissions is {past} µs of slots past B + r·Δ");
    // 99–99.5 % on a quiet machine; the margin is for a loaded one.
    assert!(admitted * 100 >= most * 80, "{admitted} admitted of the {most} an exact GCRA would");
    assert!(sliced * 10 >= admitted * 8, "{sliced} of {admitted} from slices");
    assert!(calls * 20 <= all, "{calls} store calls for {all} decisions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_keep_gcras_bound_with_slices() {
    bucket_bound(Algorithm::Gcra).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_keep_the_token_buckets_bound_with_slices() {
    bucket_bound(Algorithm::TokenBucket).await;
}

/// Three limiters (each its own `RedisStore`) of one sliced rule "hot" on `cluster`, with
/// a 100 ms deadline.
fn cluster_limiters(cluster: &support::redis::RedisCluster, quota: Quota, algorithm: Algorithm) -> Vec<Arc<Hot>> {
    let build = || {
        let store = RedisStore::cluster(cluster.urls()).unwrap().response_timeout(Duration::from_millis(250));
        Arc::new(
            Limiter::builder(store)
                .add_rule(Rule::new("hot", quota, |k: &str| Some(k.to_owned())).algorithm(algorithm))
                .slices(true)
                .timeout(Duration::from_millis(100))
                .build()
                .unwrap(),
        )
    };
    (0..3).map(|_| build()).collect()
}

/// The master that holds `key`'s state: the one whose key count grows when the store (not
/// the fallback of a cluster still settling) decides a request of it.
async fn node_of(cluster: &support::redis::RedisCluster, l: &Hot, key: &str) -> usize {
    let sizes = || -> Vec<u64> { (0..3).map(|i| cluster.node(i).cmd(&["DBSIZE"]).trim().parse().unwrap()).collect() };
    let before = sizes();
    for _ in 0..100 {
        assert!(l.check(key).await.is_allowed());
        let after = sizes();
        if let Some(node) = (0..3).find(|&i| after[i] > before[i]) {
            return node;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no master holds {key:?}");
}

/// Issue 43 on a 3-master cluster, the key's master stalled for 300 ms (three slices'
/// lives) in the middle: the slices held admit at their slots, then the fallback decides
/// (its stated share, beside the bound; how much of it depends on how the tasks are
/// scheduled during the stall, so it is printed, not asserted); every admission the store
/// and the slices decided keeps GCRA's bound exactly, before, during and after the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_slices_keep_the_bound_on_a_cluster_with_the_keys_master_stalled() {
    let cluster = support::redis::RedisCluster::start(3);
    let quota = Quota::per_second(4_000).burst(400);
    let limiters = cluster_limiters(&cluster, quota, Algorithm::Gcra);
    let node = node_of(&cluster, &limiters[0], "k").await;
    let run = {
        let limiters = limiters.clone();
        tokio::spawn(async move { stamped(&limiters, "k", Duration::from_millis(2_500)).await })
    };
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.node(node).pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.node(node).resume();
    let (at, all) = run.await.unwrap();
    let count = |by: DecidedBy| at.iter().filter(|&&(_, b)| b == by).count();
    let (sliced, fallback) = (count(DecidedBy::Slice), count(DecidedBy::Fallback));
    let mut exact: Vec<u64> = at.iter().filter(|&&(_, b)| b != DecidedBy::Fallback).map(|&(t, _)| t).collect();
    let past = past_the_bound(&mut exact, 250, 100_000);
    eprintln!("{} admitted: {sliced} from slices, {fallback} by the fallback, of {all}; worst run {past} µs", at.len());
    assert!(past <= 0, "a run of the store's and the slices' admissions is {past} µs of slots past B + r·Δ");
    assert!(sliced * 10 > at.len() * 6, "{sliced} of {} from slices", at.len());
}

/// Jobs that wait their turn (`Limiter::wait_key`) on a bucket's key at its edge, on three
/// servers with slices: a request before its slot is told when its slot comes (the slice's
/// `retry_after`, as the store's), so every job is admitted by waiting, mostly from slices,
/// and the admissions keep the bucket's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_waiting_their_turn_on_bucket_slices_keep_the_bound() {
    let redis = RedisServer::start();
    let quota = Quota::per_second(4_000).burst(400);
    let limiters: Vec<Arc<Hot>> =
        (0..3).map(|_| Arc::new(limiter(&redis.url(), Algorithm::Gcra, quota, true))).collect();
    let until = tokio::time::Instant::now() + Duration::from_millis(2_000);
    let mut tasks = Vec::new();
    for l in &limiters {
        for _ in 0..8 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                let (mut at, mut sliced, mut refused) = (Vec::new(), 0, 0);
                while tokio::time::Instant::now() < until {
                    let v = l.wait_key("hot", "k", 1, Duration::from_secs(1)).await;
                    if v.is_allowed() {
                        at.push(v.decisions().next().unwrap().decision.decided_at_micros());
                        sliced += u64::from(v.decided_by() == Some(DecidedBy::Slice));
                    } else {
                        refused += 1;
                    }
                }
                (at, sliced, refused)
            }));
        }
    }
    let (mut at, mut sliced, mut refused) = (Vec::new(), 0, 0);
    for t in tasks {
        let (a, s, r) = t.await.unwrap();
        at.extend(a);
        sliced += s;
        refused += r;
    }
    let admitted = at.len() as u64;
    let past = past_the_bound(&mut at, 250, 100_000);
    eprintln!("{admitted} admitted by waiting ({sliced} from slices), {refused} refused; worst run {past} µs");
    assert!(past <= 0, "a run of admissions is {past} µs of slots past B + r·Δ");
    assert_eq!(refused, 0, "a job waited past its second");
    assert!(admitted > 4_000, "{admitted} admitted in 2 s at 4,000 a second");
    assert!(sliced * 10 >= admitted * 5, "{sliced} of {admitted} from slices");
}

/// A bucket's slice takes back the unit last admitted from it (GCRA's refund, with no store
/// call: the next request gets that very slot again), and a reset or a block closes it.
#[tokio::test]
async fn a_bucket_slice_takes_back_its_last_unit_and_a_reset_or_block_closes_it() {
    let redis = RedisServer::start();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let l = limiter(&redis.url(), algorithm, hot_quota(), true);
        let sliced = until_sliced(&l).await.pop().unwrap();
        let slot = sliced.decisions().next().unwrap().taken.expect("its commit");
        let before = redis.commandstats().get("evalsha").copied().unwrap_or(0);
        l.refund(sliced).await.unwrap();
        assert_eq!(redis.commandstats().get("evalsha").copied().unwrap_or(0), before, "{algorithm}: a store call");
        let again = l.check("k").await;
        assert_eq!(again.decided_by(), Some(DecidedBy::Slice), "{algorithm}");
        assert_eq!(again.decisions().next().unwrap().taken, Some(slot), "{algorithm}: the unit's slot came back");
        l.reset("hot", "k").await.unwrap();
        assert_eq!(l.check("k").await.decided_by(), Some(DecidedBy::Store), "{algorithm}: a slice survived the reset");
        until_sliced(&l).await;
        l.block("hot", "k", Duration::from_secs(60)).await.unwrap();
        assert!(l.check("k").await.is_rejected(), "{algorithm}: a slice admitted a blocked key");
        l.close().await.unwrap();
        redis.cmd(&["FLUSHALL"]);
    }
}

/// 6,000 a second in windows of 10 s: a test that reads the store's count has seconds
/// before its window ends, even on a loaded machine.
fn hot_quota() -> Quota {
    Quota::new(60_000, WINDOW)
}

const WINDOW: Duration = Duration::from_secs(10);

/// A limiter of one sliced fixed-window rule "hot" ([`hot_quota`]).
fn hot(url: &str) -> Hot {
    limiter(url, Algorithm::FixedWindow, hot_quota(), true)
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

/// Waits to be at least 5 s before the end of the current window of [`hot_quota`]
/// (fixed windows are aligned on Unix time).
async fn early_in_a_window() {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let window = WINDOW.as_micros();
    let left = Duration::from_micros(u64::try_from(window - now.as_micros() % window).unwrap());
    if left < Duration::from_secs(5) {
        tokio::time::sleep(left + Duration::from_millis(5)).await;
    }
}

/// A refund of a sliced verdict goes back to the slice, with no store call, while the
/// slice is open; what the slice left goes back to the store when the limiter closes, and
/// the store's count is then what was kept.
#[tokio::test]
async fn a_refund_returns_to_the_slice_and_close_gives_back_what_is_left() {
    // A slice lapses 100 ms after it was asked for: an attempt in which a loaded machine
    // spent half of that before the next decision says nothing, and is made again.
    for attempt in 0.. {
        let redis = RedisServer::start();
        let l = hot(&redis.url());
        early_in_a_window().await;
        let mut verdicts = until_sliced(&l).await;
        let opened = std::time::Instant::now();
        let sliced = verdicts.pop().unwrap();
        let kept = verdicts.len() as u64 + 1;
        let before = redis.commandstats().get("evalsha").copied().unwrap_or(0);
        l.refund(sliced).await.unwrap();
        let after = redis.commandstats().get("evalsha").copied().unwrap_or(0);
        // The slice holds the refunded unit: the next decision takes it.
        let again = l.check("k").await;
        if opened.elapsed() > Duration::from_millis(50) && attempt < 4 {
            continue;
        }
        assert_eq!(after, before, "a store call for a refund to an open slice");
        assert_eq!(again.decided_by(), Some(DecidedBy::Slice));
        let in_store = stored(&redis);
        assert!(in_store > kept, "the store counted the slice: {in_store} for {kept} kept");
        l.close().await.unwrap();
        assert_eq!(stored(&redis), kept, "close gave back all the slice did not admit");
        // After close, no slice: every decision asks the store.
        for _ in 0..50 {
            assert_eq!(l.check("k").await.decided_by(), Some(DecidedBy::Store));
        }
        return;
    }
}

/// A unit given back after its slice closed goes to the store, as a refund of the slice's
/// commit: the count is exact either way.
#[tokio::test]
async fn a_refund_after_the_slice_lapsed_goes_to_the_store() {
    let redis = RedisServer::start();
    let l = hot(&redis.url());
    early_in_a_window().await;
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
    early_in_a_window().await;
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

/// A limiter of "hot" (sliced, 6,000 a second) and "cold" (`cold` a minute, never sliced),
/// both on the input: a request of both is decided by a slice and the store together.
fn mixed(url: &str, cold: u64, deadline: Duration, fail_mode: tollgate::FailMode) -> Hot {
    Limiter::builder(RedisStore::from_url(url).unwrap().response_timeout(Duration::from_secs(2)))
        .add_rule(Rule::new("hot", hot_quota(), |k: &str| Some(k.to_owned())).slices(true))
        .add_rule(Rule::new("cold", Quota::per_minute(cold), |k: &str| Some(k.to_owned())).slices(false))
        .algorithm(Algorithm::FixedWindow)
        .fail_mode(fail_mode)
        .timeout(deadline)
        .build()
        .unwrap()
}

/// A request whose other rule refuses it takes nothing from the slice: after `close`, the
/// store's count of the sliced rule is exactly the requests admitted.
#[tokio::test]
async fn a_request_another_rule_refuses_gives_its_slice_unit_back() {
    let redis = RedisServer::start();
    let l = mixed(&redis.url(), 300, Duration::from_secs(2), tollgate::FailMode::Closed);
    early_in_a_window().await;
    let (mut admitted, mut sliced_refused) = (0, 0);
    for _ in 0..400 {
        let v = l.check("k").await;
        assert!(v.store_error().is_none(), "{v}");
        if v.is_allowed() {
            admitted += 1;
        } else if v.decisions().any(|d| d.rule == "hot" && d.decision.allowed) {
            sliced_refused += 1;
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    assert_eq!(admitted, 300);
    assert!(sliced_refused > 0, "no refused request had a unit of the slice");
    l.close().await.unwrap();
    assert_eq!(stored(&redis), admitted, "the slice's units of refused requests were not given back");
}

/// A request dropped while its other rule waits for the store (the store stalled): the
/// unit it took from the slice goes back.
#[tokio::test]
async fn a_request_dropped_while_the_store_decides_its_other_rule_gives_its_slice_unit_back() {
    let redis = RedisServer::start();
    let l = mixed(&redis.url(), 100_000, Duration::from_secs(2), tollgate::FailMode::Closed);
    early_in_a_window().await;
    let mut admitted = 0;
    // Until the hot rule's decisions come from a slice.
    loop {
        let v = l.check("k").await;
        assert!(v.is_allowed(), "{v}");
        admitted += 1;
        if v.decisions().next().is_some_and(|d| d.taken.is_some()) && admitted > 40 {
            break;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    redis.pause();
    for _ in 0..5 {
        assert!(tokio::time::timeout(Duration::from_millis(10), l.check("k")).await.is_err(), "decided while stalled");
    }
    redis.resume();
    l.close().await.unwrap();
    // What the dropped requests took from the store may still come (a call the caller
    // left runs on, and gives back what it took): wait for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored(&redis), admitted, "units of dropped requests stayed taken");
}

/// While the store is stalled, a server first spends the slices it holds (a bucket's at
/// their slots), then the fallback decides: never a pass without a limit.
async fn a_stalled_store_leaves_the_slices_held_then_the_fallback_of(algorithm: Algorithm) {
    let redis = RedisServer::start();
    let l = Limiter::builder(RedisStore::from_url(&redis.url()).unwrap())
        .add_rule(Rule::new("hot", hot_quota(), |k: &str| Some(k.to_owned())).slices(true))
        .algorithm(algorithm)
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    if algorithm == Algorithm::FixedWindow {
        early_in_a_window().await;
    }
    until_sliced(&l).await;
    redis.pause();
    let mut by = Vec::new();
    for _ in 0..40 {
        let v = l.check("k").await;
        by.push(v.decided_by());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    redis.resume();
    assert_eq!(by[0], Some(DecidedBy::Slice), "{algorithm}: {by:?}");
    assert!(by.iter().all(|b| matches!(b, Some(DecidedBy::Slice | DecidedBy::Fallback))), "{algorithm}: {by:?}");
    assert!(by.contains(&Some(DecidedBy::Fallback)), "{algorithm}: the slice outlived its lapse: {by:?}");
}

#[tokio::test]
async fn a_stalled_store_leaves_the_slices_held_then_the_fallback() {
    a_stalled_store_leaves_the_slices_held_then_the_fallback_of(Algorithm::FixedWindow).await;
}

#[tokio::test]
async fn a_stalled_store_leaves_the_bucket_slices_held_then_the_fallback() {
    a_stalled_store_leaves_the_slices_held_then_the_fallback_of(Algorithm::Gcra).await;
}

/// Through the HTTP layer, a count-by-outcome rule's unit that a 200 gives back returns to
/// its slice (no store call), and a 401 keeps it: after `close`, the store counted the
/// 401s only.
#[tokio::test]
async fn a_status_that_does_not_count_gives_the_unit_back_to_its_slice() {
    use axum::body::Body;
    use http::{Request, Response, StatusCode};
    use tower::{Layer, ServiceExt};

    let redis = RedisServer::start();
    let layer = tollgate::RateLimitLayer::builder(
        RedisStore::from_url(&redis.url()).unwrap().response_timeout(Duration::from_secs(2)),
    )
    .add_rule(
        Rule::new("hot", hot_quota(), tollgate::key::Global)
            .algorithm(Algorithm::FixedWindow)
            .count_if(|s| s == StatusCode::UNAUTHORIZED),
    )
    .slices(true)
    .build()
    .unwrap();
    let limiter = layer.limiter().clone();
    let svc = layer.layer(tower::service_fn(|req: Request<Body>| async move {
        let mut res = Response::new(Body::empty());
        if req.uri().path() == "/wrong" {
            *res.status_mut() = StatusCode::UNAUTHORIZED;
        }
        Ok::<_, std::convert::Infallible>(res)
    }));
    early_in_a_window().await;
    let (mut wrong, mut sliced) = (0, 0);
    for i in 0..300 {
        let path = if i % 10 == 0 { "/wrong" } else { "/" };
        let mut req = Request::get(path).body(Body::empty()).unwrap();
        req.extensions_mut().insert(std::net::SocketAddr::from(([127, 0, 0, 1], 1)));
        let res = svc.clone().oneshot(req).await.unwrap();
        assert!(res.status() != StatusCode::TOO_MANY_REQUESTS);
        wrong += u64::from(res.status() == StatusCode::UNAUTHORIZED);
        sliced += u64::from(res.headers().contains_key("x-ratelimit-remaining"));
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    assert!(sliced > 200);
    // The units the 200s gave back to the store (before a slice, or after one closed)
    // travel in tasks of their own.
    tokio::time::sleep(Duration::from_millis(100)).await;
    limiter.close().await.unwrap();
    assert_eq!(stored(&redis), wrong, "the store counted what the 200s gave back");
}

/// On a 3-master cluster, two hot keys on two masters: each never over its limit in a
/// window, mostly decided from slices; while one master is stalled, its key's decisions
/// come from the slices held, then the fallback, and the other key's go on from slices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_with_one_master_stalled() {
    let cluster = support::redis::RedisCluster::start(3);
    let limiters = cluster_limiters(&cluster, Quota::per_second(3_000), Algorithm::FixedWindow);
    // Two keys whose state lives on two masters.
    let mut keys: Vec<(&'static str, usize)> = Vec::new();
    for key in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
        let node = node_of(&cluster, &limiters[0], key).await;
        if keys.iter().all(|&(_, n)| n != node) {
            keys.push((key, node));
        }
        if keys.len() == 2 {
            break;
        }
    }
    let [(healthy, _), (stalled, stalled_node)] = keys[..] else { panic!("two masters: {keys:?}") };
    let (a, b) = (limiters.clone(), limiters.clone());
    let healthy_run =
        tokio::spawn(async move { hammer_key(&a, healthy, 1_000_000, Duration::from_millis(2_500)).await });
    let stalled_run = tokio::spawn(async move {
        let (mut by, until) = (Vec::new(), tokio::time::Instant::now() + Duration::from_millis(2_500));
        while tokio::time::Instant::now() < until {
            let v = b[0].check(stalled).await;
            by.push((tokio::time::Instant::now(), v.decided_by()));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        by
    });
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let paused_at = tokio::time::Instant::now();
    cluster.node(stalled_node).pause();
    tokio::time::sleep(Duration::from_millis(600)).await;
    cluster.node(stalled_node).resume();
    let (windows, sliced, _) = healthy_run.await.unwrap();
    let by = stalled_run.await.unwrap();
    for (w, (n, _)) in &windows {
        assert!(*n <= 3_000, "window {w} admitted {n} > 3000: {windows:?}");
    }
    let admitted: u64 = windows.values().map(|v| v.0).sum();
    assert!(sliced * 10 > admitted * 7, "{sliced} of {admitted} from slices on the healthy master");
    let during: Vec<_> = by
        .iter()
        .filter(|(t, _)| *t > paused_at && *t < paused_at + Duration::from_millis(500))
        .map(|(_, b)| *b)
        .collect();
    assert!(during.contains(&Some(DecidedBy::Fallback)), "{during:?}");
    assert!(
        during.iter().all(|b| matches!(b, Some(DecidedBy::Slice | DecidedBy::Fallback | DecidedBy::Store))),
        "{during:?}"
    );
}

/// A swap that keeps the rule's quota keeps its slices; one to another quota leaves the
/// old slices to lapse and go back, and the new quota's come from the store: after
/// `close`, the store counted exactly what was admitted.
#[tokio::test]
async fn a_swap_keeps_slices_of_the_same_quota_and_gives_back_the_others() {
    let redis = RedisServer::start();
    let l = hot(&redis.url());
    early_in_a_window().await;
    let mut admitted = until_sliced(&l).await.len() as u64;
    l.handle().set_quota("hot", hot_quota()).unwrap();
    let v = l.check("k").await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Slice), "the same quota lost its slice");
    admitted += 1;
    l.handle().set_quota("hot", Quota::new(80_000, WINDOW)).unwrap();
    let v = l.check("k").await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Store), "a slice of the old quota decided under the new one");
    admitted += 1;
    admitted += until_sliced(&l).await.len() as u64;
    l.close().await.unwrap();
    // The old quota's slice went back when it lapsed (the sweeper), the new one's at close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(stored(&redis), admitted);
}

// ---------------------------------------------------------------------------------------
// Found by reviews: attacks on the promise.
// ---------------------------------------------------------------------------------------

/// What the store counted for key `k` under rule "hot" in its current fixed window (the
/// state key, not a block key beside it).
fn stored_state(redis: &RedisServer) -> u64 {
    let keys = redis.cmd(&["KEYS", "*hot*"]);
    let key = keys.lines().map(str::trim).find(|k| !k.is_empty() && !k.contains("block")).expect("the key").to_owned();
    let value = redis.cmd(&["GET", &key]);
    value.trim().split(':').nth(1).expect("window:count").parse().unwrap()
}

/// A reset on another server (here a limiter without slices) forgets the key's state,
/// in which this server's open slice was counted: what the slice leaves, given back when
/// it lapses, must not come off the fresh count (a review found it did, and the window
/// admitted 12,015 of 12,000). The state says when it was first written, and a refund of
/// a commit from before then gives nothing back.
#[tokio::test]
async fn a_slice_lapsing_after_a_reset_elsewhere_gives_nothing_back_to_the_fresh_count() {
    let redis = RedisServer::start();
    let quota = Quota::new(12_000, WINDOW);
    let a = limiter(&redis.url(), Algorithm::FixedWindow, quota, true);
    let c = limiter(&redis.url(), Algorithm::FixedWindow, quota, false);
    early_in_a_window().await;
    until_sliced(&a).await;
    // A holds an open slice (it took one unit of it). Another server resets the key.
    c.reset("hot", "k").await.unwrap();
    // The fresh window: C admits half the limit at once.
    let mut admitted = 0;
    let v = c.check_key("hot", "k", 6_000).await;
    assert!(v.is_allowed(), "{v}");
    admitted += 6_000;
    // A's slice lapses; the sweeper gives back what it left (to the fresh state).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counted = stored_state(&redis);
    let v = c.check_key("hot", "k", 6_000).await;
    assert!(v.is_allowed(), "{v}");
    admitted += 6_000;
    // The limit is reached: nothing more may be admitted in this window.
    for _ in 0..2_000 {
        if c.check("k").await.is_allowed() {
            admitted += 1;
        } else {
            break;
        }
    }
    assert!(
        admitted <= 12_000,
        "after the reset the store admitted {admitted} > 12000 in one window (its count read {counted} after \
         admitting 6000: a slice taken before the reset was refunded into the fresh state)"
    );
}

/// A limiter of one sliced fixed-window rule "hot" of `quota` with a penalty block
/// (`Rule::block_for`) of 60 s.
fn penalised(url: &str, quota: Quota, slices: bool) -> Hot {
    Limiter::builder(RedisStore::from_url(url).unwrap().response_timeout(Duration::from_secs(2)))
        .add_rule(
            Rule::new("hot", quota, |k: &str| Some(k.to_owned()))
                .algorithm(Algorithm::FixedWindow)
                .block_for(Duration::from_secs(60)),
        )
        .slices(slices)
        .fail_mode(tollgate::FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// A rule with a penalty (`block_for`) takes no slices: a slice is asked for as a check of
/// cost k through the same script, and its refusal near the end of a quota would block the
/// key for the penalty though no request was refused and units remain (a review found it
/// did).
#[tokio::test]
async fn a_rule_with_a_penalty_is_never_blocked_by_a_refused_slice() {
    let redis = RedisServer::start();
    let quota = Quota::new(12_000, WINDOW);
    let a = penalised(&redis.url(), quota, true);
    // Another server, without slices and without the penalty (its checks never block).
    let c = limiter(&redis.url(), Algorithm::FixedWindow, quota, false);
    early_in_a_window().await;
    // Demand enough for slices: none is taken.
    for _ in 0..200 {
        let v = a.check("k").await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Store), "a rule with a penalty took a slice");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    // The other server uses all but 10 units of the window: A's next 10 requests pass.
    let used = stored_state(&redis);
    assert!(c.check_key("hot", "k", 12_000 - used - 10).await.is_allowed());
    for i in 0..10 {
        let v = a.check("k").await;
        assert!(v.is_allowed(), "request {i} refused with units left: {v} (retry after {:?})", v.retry_after());
    }
}

/// (Found by a review.) a rule that takes no slices — one with a penalty
/// (`block_for`, fd3116f), or one whose quota is too small for slices to pay — has its
/// cached rejection asked again after 100 ms when the limiter's slices are on
/// (`Teach::learn` asks only `Rule::slices` and the algorithm, not `Limiter::sliced`'s
/// conditions), where it waits a second with slices off. No slice of another server
/// gives back into such a key (and a block is final): a refused client costs the store
/// ten times the calls the blocked-key cache lets through.
#[tokio::test]
async fn a_rejection_of_a_rule_without_slices_is_not_asked_again_sooner_with_slices_on() {
    let redis = RedisServer::start();
    let big = Quota::new(12_000, WINDOW);
    let mut by = Vec::new();
    for case in ["penalised, pays", "no penalty, does not pay"] {
        for slices in [false, true] {
            let key: &'static str = Box::leak(format!("{case}/{slices}").into_boxed_str());
            // Not near a window's end: the rejection holds past the sleep below.
            early_in_a_window().await;
            let a = if case.starts_with("penalised") {
                // Another server without slices takes the whole window first.
                let c = limiter(&redis.url(), Algorithm::FixedWindow, big, false);
                assert!(c.check_key("hot", key, 12_000).await.is_allowed());
                penalised(&redis.url(), big, slices)
            } else {
                let a = limiter(&redis.url(), Algorithm::FixedWindow, Quota::new(3, WINDOW), slices);
                for _ in 0..3 {
                    assert!(a.check(key).await.is_allowed());
                }
                a
            };
            let v = a.check(key).await;
            assert!(!v.is_allowed() && v.decided_by() == Some(DecidedBy::Store), "{case}: {v}");
            assert_eq!(a.check(key).await.decided_by(), Some(DecidedBy::LocalCache), "{case}");
            // Well within the second a cached rejection holds, past 100 ms.
            tokio::time::sleep(Duration::from_millis(250)).await;
            let v = a.check(key).await;
            assert!(!v.is_allowed(), "{case}: {v}");
            by.push((case, slices, v.decided_by()));
        }
    }
    let want: Vec<_> = by.iter().map(|&(case, slices, _)| (case, slices, Some(DecidedBy::LocalCache))).collect();
    assert_eq!(by, want, "250 ms after a rejection (a 60 s block; a 10 s window): who decided");
}

/// Review of 1df216c..df03ee0 (`Decision::decided_by`): a sliced rule's decision taken from
/// this server's slice says `Slice`, also when another rule (decided by the store) refuses
/// the request: its numbers are the slice's, not the store's.
#[tokio::test]
async fn a_slice_decision_refused_by_another_rule_says_it_came_from_the_slice() {
    let redis = RedisServer::start();
    let base = |s: &str| Some(s.trim_end_matches('!').to_owned());
    let l: Hot = Limiter::builder(RedisStore::from_url(&redis.url()).unwrap().response_timeout(Duration::from_secs(2)))
        .add_rule(Rule::new("hot", hot_quota(), base).slices(true))
        // "k!" costs the whole of "cold": refused by the store once anything was counted.
        .add_rule(Rule::new("cold", Quota::per_minute(300), base).slices(false).cost(|s: &str| {
            if s.ends_with('!') {
                300
            } else {
                1
            }
        }))
        .algorithm(Algorithm::FixedWindow)
        .fail_mode(tollgate::FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    early_in_a_window().await;
    let mut found = false;
    for _ in 0..2_000 {
        let v = l.check("k").await;
        assert!(v.is_allowed(), "{v}");
        let hot = v.decisions().find(|d| d.rule == "hot").unwrap().decision.decided_by();
        if hot != DecidedBy::Slice {
            tokio::time::sleep(Duration::from_micros(200)).await;
            continue;
        }
        // The slice decides "hot" now: "cold" refuses the next request.
        let refused = l.check("k!").await;
        assert!(refused.is_rejected(), "{refused}");
        let hot = refused.decisions().find(|d| d.rule == "hot").unwrap();
        assert!(hot.decision.allowed, "{refused}");
        assert_eq!(refused.rejected_by().unwrap().rule, "cold", "{refused}");
        assert_eq!(
            hot.decision.decided_by(),
            DecidedBy::Slice,
            "the slice's decision says {:?}: {refused}",
            hot.decision.decided_by()
        );
        found = true;
        break;
    }
    assert!(found, "no decision from a slice");
}
