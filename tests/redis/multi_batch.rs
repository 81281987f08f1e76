//! Group commit of multi-checks on Redis (issue 42: "a rate rule plus a concurrency rule is
//! a multi-check call", group-committed as single-rule checks are): multi-checks that arrive
//! together go as one script call per slot, each decided all or nothing, as one call each.
//!
//! - a model: random rounds of concurrent multi-checks (a rate rule of each algorithm, now
//!   and then in shadow, and a concurrency rule, on one key or two), some dropped before
//!   their batch leaves, time steps, against `MemoryStore` deciding them one by one at the
//!   same time (both batch scripts: the straight-line one, and the generic one that shadow
//!   rules take);
//! - one script call and one `TIME` per batch, from the server's command statistics; off
//!   with `max_batch(1)`;
//! - a multi-check refused by one rule takes nothing from the others, inside a batch;
//! - one that fails (a key of another type) fails alone; a replica fails the whole call;
//! - a caller gone before its batch leaves takes nothing; a limiter's entry dropped after
//!   its batch left gives its permit back (not after the hold limit);
//! - a sliding window log past the head of its log goes alone, and the batch stays bounded;
//! - on a cluster, per slot; a multi-check across slots keeps its own path.
#![cfg(all(feature = "redis", feature = "memory"))]

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;
use support::fake::T0;
use support::poll_once;
use support::redis::{RedisCluster, RedisServer};
use tollgate::clock::{Clock, ManualClock};
use tollgate::store::{Check, Outcome, Params, Store};
use tollgate::{Algorithm, FailMode, Limiter, MemoryStore, Quota, RedisStore, Rule, StoreError};

type Outcomes = Result<Vec<Option<Outcome>>, StoreError>;
type Many<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Outcomes> + Send + 'a>>;

fn check(rule: &str, key: &str, algorithm: Algorithm, quota: Quota) -> Check {
    let mut params = Params::new(quota);
    if algorithm == Algorithm::LeakyBucket {
        params.max_delay_us = 0;
    }
    Check { rule: rule.into(), key: key.into(), algorithm, params }
}

/// A rate rule (`algorithm`, 3 a minute) on `rate_key` and a concurrency rule (n = 2, hold
/// limit an hour: longer than a model case's time steps, as `MemoryStore`'s permits never
/// lapse and Redis's do) on `conc_key`.
fn entry(algorithm: Algorithm, rate_key: &str, conc_key: &str) -> Vec<Check> {
    vec![
        check(&format!("rate-{}", algorithm.name()), rate_key, algorithm, Quota::per_minute(3)),
        check("in-flight", conc_key, Algorithm::Concurrent, Quota::new(2, Duration::from_secs(3600))),
    ]
}

const RATE: [Algorithm; 6] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::Gcra,
];

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn prefix() -> String {
    static CASE: AtomicUsize = AtomicUsize::new(0);
    format!("multi{}", CASE.fetch_add(1, Ordering::SeqCst))
}

fn store_on(url: &str, max_batch: usize) -> RedisStore {
    RedisStore::from_url(url).unwrap().response_timeout(Duration::from_secs(2)).max_batch(max_batch).unwrap()
}

/// `Store::check` of every multi-check, queued together in this order
/// ([`support::queued_together`]).
async fn together(store: &RedisStore, lists: &[Vec<Check>]) -> Vec<Outcomes> {
    support::queued_together(lists.iter().map(|l| Box::pin(store.check(l)) as Many<'_>).collect()).await
}

fn admitted(o: &Outcomes) -> bool {
    o.as_ref().is_ok_and(|v| v.iter().all(|o| o.as_ref().is_some_and(|o| o.decision.allowed)))
}

/// The permits held on `key`'s concurrency state (`in-flight`), by a peek: its `remaining`
/// counts the one permit it would take.
async fn permits(store: &RedisStore, key: &str, n: u64) -> u64 {
    let probe = check("in-flight", key, Algorithm::Concurrent, Quota::new(n, Duration::from_secs(60)));
    let d = store.peek(&probe).await.unwrap();
    if d.allowed {
        n - 1 - d.remaining()
    } else {
        n
    }
}

// ---------------------------------------------------------------------------------------
// Model

#[derive(Debug, Clone)]
struct Ask {
    algorithm: usize,
    rate_key: u8,
    conc_key: u8,
    dropped: bool,
    /// The rate rule in shadow: decided, never refusing (the generic batch script).
    shadow: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Round(Vec<Ask>),
    Advance(u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let ask = (0..RATE.len(), 0..3u8, 0..3u8, prop::bool::weighted(0.15), prop::bool::weighted(0.3)).prop_map(
        |(algorithm, rate_key, conc_key, dropped, shadow)| Ask { algorithm, rate_key, conc_key, dropped, shadow },
    );
    let op = prop_oneof![
        4 => prop::collection::vec(ask, 1..12).prop_map(Op::Round),
        1 => (1u64..30_000_000).prop_map(Op::Advance),
    ];
    prop::collection::vec(op, 1..8)
}

fn lists_of(asks: &[Ask]) -> Vec<Vec<Check>> {
    asks.iter()
        .map(|a| {
            let mut l = entry(RATE[a.algorithm], &format!("k{}", a.rate_key), &format!("k{}", a.conc_key));
            // A shadow rule goes after the enforced ones, as a plan puts it.
            if a.shadow {
                l[0].params.shadow = true;
                l.swap(0, 1);
            }
            l
        })
        .collect()
}

async fn run_case(ops: &[Op], max_batch: usize) -> Result<(), String> {
    let prefix = prefix();
    let clock = ManualClock::new(T0);
    let store = store_on(&redis().url(), max_batch).prefix(&prefix).unwrap().with_clock(clock.clone());
    store.ping().await.map_err(|e| e.to_string())?;
    // The scripts loaded first (a batch retried after NOSCRIPT goes after the batches
    // sent meanwhile).
    // Both batch scripts: a shadow rule takes the generic one.
    for a in RATE {
        let warm = entry(a, "warm", "warm");
        let mut shadow = entry(a, "warm-shadow", "warm-shadow");
        shadow[0].params.shadow = true;
        shadow.swap(0, 1);
        store.check(&warm).await.map_err(|e| e.to_string())?;
        together(&store, &[warm.clone(), warm]).await;
        together(&store, &[shadow.clone(), shadow]).await;
    }
    let model = MemoryStore::with_clock(clock.clone());
    for (step, op) in ops.iter().enumerate() {
        let now = clock.now_micros();
        match op {
            Op::Advance(us) => clock.advance(Duration::from_micros(*us)),
            Op::Round(asks) => {
                let lists = lists_of(asks);
                let mut futures: Vec<Option<Many<'_>>> =
                    lists.iter().map(|l| Some(Box::pin(store.check(l)) as Many<'_>)).collect();
                let mut early = Vec::new();
                for f in &mut futures {
                    early.push(poll_once(f.as_mut().unwrap()).await);
                }
                for (i, a) in asks.iter().enumerate() {
                    if a.dropped && max_batch > 1 {
                        futures[i] = None;
                    }
                }
                for (i, ((a, l), f)) in asks.iter().zip(&lists).zip(futures).enumerate() {
                    let what = format!("step {step}, entry {i} {a:?}");
                    let Some(f) = f else { continue };
                    let got = match early[i].take() {
                        Some(r) => r,
                        None => f.await,
                    }
                    .map_err(|e| format!("{what}: redis: {e}"))?;
                    let want = model.check_at(l, now).map_err(|e| format!("{what}: model: {e}"))?;
                    let got: Vec<Outcome> = got.into_iter().map(|o| o.expect("decided")).collect();
                    for (g, w) in got.iter().zip(&want) {
                        // Permit ids differ between the stores; the decisions do not.
                        if g.decision != w.decision || g.taken.is_some() != w.taken.is_some() {
                            return Err(format!("{what}: redis {got:?}, one by one {want:?}"));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(24), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn batched_multi_checks_decide_as_one_by_one(ops in ops(), max_batch in prop_oneof![Just(1usize), 2..7usize]) {
        current_thread().block_on(run_case(&ops, max_batch)).map_err(TestCaseError::fail)?;
    }
}

// ---------------------------------------------------------------------------------------
// Examples

/// 40 entries of a rate rule and a concurrency rule, at most 16 a call: 3 script calls and
/// 3 `TIME`s (one call each with batching off), each entry decided all or nothing.
#[test]
fn multi_checks_are_one_script_call_a_batch() {
    current_thread().block_on(async {
        let server = RedisServer::start();
        let store = store_on(&server.url(), 16);
        // 20 keys, two entries each: n = 1, so the second is refused by the concurrency
        // rule, and takes no rate unit.
        let lists: Vec<Vec<Check>> = (0..40)
            .map(|i| {
                let key = format!("user-{}", i % 20);
                vec![
                    check("per-minute", &key, Algorithm::Gcra, Quota::per_minute(100)),
                    check("in-flight", &key, Algorithm::Concurrent, Quota::new(1, Duration::from_secs(60))),
                ]
            })
            .collect();
        // Loads the script (EVAL after NOSCRIPT).
        let warm: Vec<Check> = lists[0].iter().map(|c| Check { key: "warm".into(), ..c.clone() }).collect();
        together(&store, &[warm.clone(), warm.clone()]).await;
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let answers = together(&store, &lists).await;
        let stats = server.commandstats();
        assert_eq!((stats.get("evalsha"), stats.get("eval")), (Some(&3), None), "{stats:?}");
        assert_eq!(stats.get("time"), Some(&3), "{stats:?}");
        for (i, a) in answers.iter().enumerate() {
            assert_eq!(admitted(a), i < 20, "entry {i}: {a:?}");
        }
        for i in 0..20 {
            let key = format!("user-{i}");
            assert_eq!(permits(&store, &key, 1).await, 1, "{key}");
            let rate = check("per-minute", &key, Algorithm::Gcra, Quota::per_minute(100));
            assert_eq!(
                store.peek(&rate).await.unwrap().remaining(),
                98,
                "{key}: one unit taken (a peek counts its own)"
            );
        }
        // Batching off: one call each.
        let off = store.clone().max_batch(1).unwrap();
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let answers = together(&off, &lists).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(server.commandstats().get("evalsha"), Some(&40));
    });
}

/// Inside one batch: an entry refused by its rate rule holds no permit, and one refused by
/// its concurrency rule takes no rate unit.
#[test]
fn an_entry_refused_by_one_rule_in_a_batch_holds_nothing() {
    current_thread().block_on(async {
        let store = store_on(&redis().url(), 64).prefix(&prefix()).unwrap();
        store.ping().await.unwrap();
        let both = |key: &str, rate: u64, n: u64| {
            vec![
                check("per-minute", key, Algorithm::FixedWindow, Quota::per_minute(rate)),
                check("in-flight", key, Algorithm::Concurrent, Quota::new(n, Duration::from_secs(60))),
            ]
        };
        // bob: 1 a minute, 5 in flight; ada: 100 a minute, 1 in flight.
        let lists = vec![both("bob", 1, 5), both("ada", 100, 1), both("bob", 1, 5), both("ada", 100, 1)];
        let answers = together(&store, &lists).await;
        assert!(admitted(&answers[0]) && admitted(&answers[1]), "{answers:?}");
        let refused_by = |a: &Outcomes| -> Vec<bool> {
            a.as_ref().unwrap().iter().map(|o| o.as_ref().unwrap().decision.allowed).collect()
        };
        assert_eq!(refused_by(&answers[2]), vec![false, true], "bob's second: refused by the rate rule");
        assert_eq!(refused_by(&answers[3]), vec![true, false], "ada's second: refused by permits");
        assert!(answers[2..].iter().flat_map(|a| a.as_ref().unwrap()).all(|o| o.as_ref().unwrap().taken.is_none()));
        assert_eq!(permits(&store, "bob", 5).await, 1, "bob's refused entry holds no permit");
        let ada_rate = check("per-minute", "ada", Algorithm::FixedWindow, Quota::per_minute(100));
        assert_eq!(store.peek(&ada_rate).await.unwrap().remaining(), 98, "ada's refused entry took no unit");
    });
}

/// A multi-check whose key is of another type fails alone; the others of its batch are
/// decided and committed.
#[test]
fn one_bad_key_fails_only_its_own_multi_check() {
    current_thread().block_on(async {
        let prefix = prefix();
        let store = store_on(&redis().url(), 64).prefix(&prefix).unwrap();
        store.ping().await.unwrap();
        let lists: Vec<Vec<Check>> = ["a", "bad", "b"].iter().map(|k| entry(Algorithm::TokenBucket, k, k)).collect();
        let bad = format!("{prefix}:{{bad}}:in-flight:conc:v6");
        redis().cmd(&["SET", &bad, "not a hash"]);
        let answers = together(&store, &lists).await;
        assert!(admitted(&answers[0]) && admitted(&answers[2]), "{answers:?}");
        match &answers[1] {
            Err(StoreError::Backend(e)) => assert!(e.contains("WRONGTYPE"), "{e}"),
            other => panic!("the bad key answered {other:?}"),
        }
        // The bad entry's rate rule took nothing (every read comes before any write).
        let rate = check("rate-tb", "bad", Algorithm::TokenBucket, Quota::per_minute(3));
        assert_eq!(store.peek(&rate).await.unwrap().remaining(), 2);
        assert_eq!(redis().cmd(&["GET", &bad]), "not a hash");
        assert_eq!(permits(&store, "a", 2).await, 1);
    });
}

/// A batch of multi-checks that meets a replica fails whole, and the store drops the
/// connection, as a single call's would.
#[test]
fn a_multi_check_batch_on_a_replica_fails_whole() {
    let primary = RedisServer::start();
    let other = RedisServer::start();
    current_thread().block_on(async {
        let store = store_on(&primary.url(), 64);
        store.ping().await.unwrap();
        let lists: Vec<Vec<Check>> =
            (0..3).map(|i| entry(Algorithm::Gcra, &format!("k{i}"), &format!("k{i}"))).collect();
        assert!(together(&store, &lists).await.iter().all(Result::is_ok));
        primary.cmd(&["REPLICAOF", "127.0.0.1", &other.port().to_string()]);
        let answers = together(&store, &lists).await;
        for a in &answers {
            match a {
                Err(StoreError::Unavailable(e)) => assert!(e.to_lowercase().contains("readonly"), "{e}"),
                other => panic!("a batch on a replica answered {other:?}: {answers:?}"),
            }
        }
        let next = store.check(&lists[0]).await;
        assert!(matches!(next, Err(StoreError::NotConnected(_) | StoreError::Unavailable(_))), "{next:?}");
    });
}

/// A multi-check whose caller left before its batch was taken takes nothing: no rate unit,
/// no permit.
#[test]
fn a_multi_check_dropped_before_its_batch_leaves_takes_nothing() {
    current_thread().block_on(async {
        let store = store_on(&redis().url(), 64).prefix(&prefix()).unwrap();
        store.ping().await.unwrap();
        let list = entry(Algorithm::Gcra, "ada", "ada");
        for _ in 0..3 {
            let mut f: Many<'_> = Box::pin(store.check(&list));
            assert!(poll_once(&mut f).await.is_none(), "queued, not answered");
            drop(f);
        }
        let o = store.check(&list).await.unwrap();
        assert!(o.iter().all(|o| o.as_ref().unwrap().decision.allowed));
        assert_eq!(o[0].as_ref().unwrap().decision.remaining(), 2, "dropped entries took rate units");
        assert_eq!(permits(&store, "ada", 2).await, 1, "dropped entries hold permits");
    });
}

/// Entries of a limiter (a rate rule and a concurrency rule) dropped while their batch is
/// on its way (Redis stalled): the calls run on when Redis resumes, and every permit they
/// took comes back at once, not after the hold limit (60 s); the rate units too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_dropped_after_their_batch_left_give_their_permits_back() {
    let server = RedisServer::start();
    let store = store_on(&server.url(), 64);
    let l: Limiter<RedisStore, str> = Limiter::builder(store.clone())
        .add_rule(Rule::new("per-minute", Quota::per_minute(1000), |u: &str| Some(u.to_owned())))
        .add_rule(Rule::concurrent("in-flight", 1, |u: &str| Some(u.to_owned())).hold_limit(Duration::from_secs(60)))
        .fail_mode(FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    drop(l.enter("warm").await);
    server.pause();
    let entries = (0..20).map(|i| {
        let l = &l;
        async move { tokio::time::timeout(Duration::from_millis(100), l.enter(&format!("user-{i}"))).await }
    });
    let gone = futures_util::future::join_all(entries).await;
    assert!(gone.iter().all(Result::is_err), "every entry was still waiting on the store");
    server.resume();
    let started = std::time::Instant::now();
    for i in 0..20 {
        let key = format!("user-{i}");
        loop {
            let p = l.enter(&key).await;
            if p.is_allowed() {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(3), "{key}'s dropped permit was never given back: {p:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The rate units of the dropped entries came back too: one taken, by the entry above
    // (a peek counts the unit it would take).
    for i in 0..20 {
        let rate = check("per-minute", &format!("user-{i}"), Algorithm::SlidingWindowCounter, Quota::per_minute(1000));
        assert_eq!(store.peek(&rate).await.unwrap().remaining(), 1000 - 1 - 1, "user-{i}");
    }
}

/// A multi-check that would read a long expired log (1,000 members) goes on its own, with
/// the later entry sharing its key; the batch around it stays bounded; every answer is the
/// one-by-one answer.
#[test]
fn a_long_log_in_a_multi_check_goes_alone() {
    current_thread().block_on(async {
        let server = RedisServer::start();
        let clock = ManualClock::new(T0);
        let store = store_on(&server.url(), 64).with_clock(clock.clone());
        let model = MemoryStore::with_clock(clock.clone());
        let l = 1_000;
        let big_log = check("log", "big", Algorithm::SlidingWindowLog, Quota::per_minute(l));
        for _ in 0..l {
            clock.advance(Duration::from_micros(50));
            let now = clock.now_micros();
            assert!(store.check_one(&big_log).await.unwrap().decision.allowed);
            assert!(model.check_one_at(&big_log, now).unwrap().decision.allowed);
        }
        let with_permit = |key: &str, log: Check| {
            vec![log, check("in-flight", key, Algorithm::Concurrent, Quota::new(5, Duration::from_secs(600)))]
        };
        let mut lists: Vec<Vec<Check>> = (0..10)
            .map(|i| {
                let key = format!("small-{i}");
                with_permit(&key, check("log", &key, Algorithm::SlidingWindowLog, Quota::per_minute(5)))
            })
            .collect();
        lists.insert(0, with_permit("big", big_log.clone()));
        // A later entry on big's concurrency key alone: it waits for the one that went alone.
        lists.insert(
            3,
            vec![
                check("in-flight", "big", Algorithm::Concurrent, Quota::new(5, Duration::from_secs(600))),
                check("log", "other", Algorithm::SlidingWindowLog, Quota::per_minute(5)),
            ],
        );
        // Loads the scripts (the one an entry sent on its own runs, too), then the same
        // entries on both stores, at one time (the big log is full: refused, nothing taken).
        let unbatched = store.clone().max_batch(1).unwrap();
        unbatched
            .check(&with_permit("warm", check("log", "warm", Algorithm::SlidingWindowLog, Quota::per_minute(5))))
            .await
            .unwrap();
        let filled = clock.now_micros();
        let warm = [lists[1].clone(), lists[2].clone()];
        together(&store, &warm).await;
        store.check(&lists[0]).await.unwrap();
        for l in warm.iter().chain([&lists[0]]) {
            model.check_at(l, filled).unwrap();
        }
        clock.advance(Duration::from_secs(61));
        let now = clock.now_micros();
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let answers = together(&store, &lists).await;
        for (i, (list, got)) in lists.iter().zip(answers).enumerate() {
            let want = model.check_at(list, now).unwrap();
            let got: Vec<Outcome> = got.unwrap().into_iter().map(Option::unwrap).collect();
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.decision, w.decision, "entry {i}");
            }
        }
        // 12 entries: two batches (half the outstanding each), then big's two alone.
        let stats = server.commandstats();
        let calls = stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0);
        assert_eq!(calls, 4, "{stats:?}");
        // Its expired members dropped: one member and two marks left.
        assert_eq!(server.cmd(&["ZCARD", "tollgate:{big}:log:swl:v6"]), "3");
    });
}

/// On a cluster (batching turned on), multi-checks go in one call per slot, each decided
/// exactly; one whose rules' keys are in two slots keeps its own path.
#[test]
fn batched_multi_checks_on_a_cluster_go_per_slot() {
    let cluster = RedisCluster::start(3);
    current_thread().block_on(async {
        let store = RedisStore::cluster(cluster.urls())
            .unwrap()
            .response_timeout(Duration::from_secs(2))
            .max_batch(64)
            .unwrap();
        store.ping().await.unwrap();
        // Keys whose slots are on different nodes: found by asking which node owns each.
        let mut keys: Vec<String> = Vec::new();
        let mut owners = Vec::new();
        for i in 0..200 {
            let k = format!("acct-{i}");
            let slot = cluster.node(0).cmd(&["CLUSTER", "KEYSLOT", &k]).parse::<u16>().unwrap();
            let owner = cluster.owner_of(slot);
            if !owners.contains(&owner) {
                owners.push(owner);
                keys.push(k);
            }
            if keys.len() == 3 {
                break;
            }
        }
        assert_eq!(keys.len(), 3);
        let both = |k: &str| {
            vec![
                check("per-minute", k, Algorithm::Gcra, Quota::per_minute(100)),
                check("in-flight", k, Algorithm::Concurrent, Quota::new(3, Duration::from_secs(60))),
            ]
        };
        cluster.cmd_all(&["CONFIG", "RESETSTAT"]);
        let lists: Vec<Vec<Check>> = (0..30).map(|i| both(&keys[i % 3])).collect();
        let answers = together(&store, &lists).await;
        let admitted_per_key: Vec<usize> =
            (0..3).map(|k| answers.iter().skip(k).step_by(3).filter(|a| admitted(a)).count()).collect();
        assert_eq!(admitted_per_key, vec![3, 3, 3], "{answers:?}");
        let evalsha: u64 = cluster
            .cmd_all(&["INFO", "commandstats"])
            .iter()
            .filter_map(|info| {
                info.lines()
                    .filter_map(|l| l.strip_prefix("cmdstat_evalsha:calls=").or(l.strip_prefix("cmdstat_eval:calls=")))
                    .map(|r| r.split(',').next().unwrap().parse::<u64>().unwrap())
                    .reduce(|a, b| a + b)
            })
            .sum();
        // EVAL too: the script is loaded on each node by its first call (NOSCRIPT).
        assert!(evalsha <= 12, "30 entries on 3 slots in {evalsha} calls: not batched");
        // Across slots: the rate rule on one node's key, the permits on another's.
        let across = vec![
            check("per-minute", &keys[0], Algorithm::Gcra, Quota::per_minute(100)),
            check("in-flight", &keys[1], Algorithm::Concurrent, Quota::new(5, Duration::from_secs(60))),
        ];
        let o = store.check(&across).await.unwrap();
        assert!(o.iter().all(|o| o.as_ref().unwrap().decision.allowed), "{o:?}");
    });
}

/// Releases go through the straight-line release script (group commit), which gives back
/// exactly what the generic refund script gives back (the path with batching off): the
/// permit, once, and its hold time among the key's 8 newest.
#[test]
fn the_release_script_gives_back_as_the_refund_script_does() {
    use tollgate::store::Refund;
    current_thread().block_on(async {
        let prefix = prefix();
        let batched = store_on(&redis().url(), 64).prefix(&prefix).unwrap();
        let unbatched = batched.clone().max_batch(1).unwrap();
        batched.ping().await.unwrap();
        let permit =
            |key: &str| check("in-flight", key, Algorithm::Concurrent, Quota::new(20, Duration::from_secs(60)));
        let mut hashes = Vec::new();
        for (store, key) in [(&batched, "a"), (&unbatched, "b")] {
            let mut held = Vec::new();
            for _ in 0..10 {
                let o = store.check_one(&permit(key)).await.unwrap();
                held.push(Refund { check: permit(key), taken: o.taken.unwrap() });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            for r in &held {
                store.refund(std::slice::from_ref(r)).await.unwrap();
            }
            // Sent again (a timeout's retry): gives back nothing more.
            store.refund(&held[..2]).await.unwrap();
            assert_eq!(permits(store, key, 20).await, 0, "{key}");
            let name = format!("{prefix}:{{{key}}}:in-flight:conc:v6");
            let mut fields: Vec<String> =
                redis().cmd(&["HKEYS", &name]).lines().map(str::to_owned).filter(|l| !l.is_empty()).collect();
            fields.sort();
            let h = redis().cmd(&["HGET", &name, "h"]);
            let holds: Vec<u64> = h.trim().split(',').map(|p| p.parse().unwrap()).collect();
            assert_eq!(holds.len(), 8, "{key}: the 8 newest hold times: {h}");
            assert!(holds.iter().all(|&us| us >= 5_000), "{key}: held 5 ms or more: {h}");
            hashes.push(fields);
        }
        assert_eq!(hashes[0], hashes[1]);
        assert_eq!(hashes[0], vec!["h".to_owned(), "last".to_owned()]);
    });
}
