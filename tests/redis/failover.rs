//! Redis that fails over, with real processes: a Sentinel group (one primary, one replica,
//! three sentinels) and a Redis Cluster with a replica behind every master. Under load
//! from several tasks, a fault is injected once every replica is in sync; the tests check
//! that no request waits past the deadline, none fails under `FailMode::Open`, limiting
//! resumes on the new primary in time, and they print what the switch cost in accuracy:
//! the units admitted over the limit because writes to the old primary were lost.
//!
//! The tests take turns (`ONE_AT_A_TIME`): failovers on two busy cores are slow enough.
//! Run with `--nocapture` to see the figures.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::redis::{RedisCluster, RedisServer, CLUSTER_NODE_TIMEOUT_MS};
use support::sentinel::{SentinelGroup, DOWN_AFTER_MS, INFO_PERIOD_MS};
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, FailMode, Limiter, Quota, RedisStore, StoreError};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The limiter's deadline: no check may take (much) longer.
const DEADLINE: Duration = Duration::from_millis(200);
/// What a busy 2-core machine may add to the deadline before a check returns (the timer
/// fires, then the task must be scheduled).
const SCHEDULING_SLACK: Duration = Duration::from_millis(150);
/// GCRA per key: the rate, and the burst (the same).
const RATE: u64 = 20;
/// Load tasks, and keys per task.
const TASKS: usize = 4;
const KEYS_PER_TASK: usize = 3;
/// Each task's pause between checks: about 4 × 500 = 2,000 checks a second in all,
/// ten times what the limit admits.
const PACE: Duration = Duration::from_millis(2);

type KeyLimiter = Limiter<RedisStore, String>;

fn limiter(store: RedisStore) -> Arc<KeyLimiter> {
    limiter_with(store, DEADLINE)
}

/// The limiter's default deadline (50 ms), shorter than the store's response timeout
/// (100 ms): the limiter cuts calls to a hung node off before the store sees them fail.
const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);

fn limiter_with(store: RedisStore, deadline: Duration) -> Arc<KeyLimiter> {
    let builder = Limiter::builder(store)
        .rule("ha", Quota::per_second(RATE), |k: &String| Some(k.clone()))
        .algorithm(Algorithm::Gcra)
        .fail_mode(FailMode::Open);
    // The default is not set: it is what is tested.
    let builder = if deadline == DEFAULT_DEADLINE { builder } else { builder.timeout(deadline) };
    let limiter = builder
        // Every check goes to the store: the cache would answer repeat rejections here.
        .local_cache(false)
        .build()
        .unwrap();
    Arc::new(limiter)
}

#[derive(Debug, Clone)]
struct Sample {
    /// When the check started, since the load started.
    at: Duration,
    took: Duration,
    key: String,
    allowed: bool,
    by: Option<DecidedBy>,
    error: Option<String>,
    /// Whether the error was a timeout (the deadline's, or one node's: `Timeout`,
    /// `NodeTimeout`), not the store refusing the call (`CircuitOpen`, `NotConnected`, …).
    timed_out: bool,
}

/// Tasks that check their keys in a loop until stopped.
struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Sample>>>,
}

impl Load {
    fn start(limiter: &Arc<KeyLimiter>, keys: &[String]) -> Load {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = keys
            .chunks(KEYS_PER_TASK)
            .map(|chunk| {
                let (limiter, stop, keys) = (Arc::clone(limiter), Arc::clone(&stop), chunk.to_vec());
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        for key in &keys {
                            let t = Instant::now();
                            let v = limiter.check(key).await;
                            samples.push(Sample {
                                at: t - started,
                                took: t.elapsed(),
                                key: key.clone(),
                                allowed: v.is_allowed(),
                                by: v.decided_by(),
                                error: v.store_error().map(ToString::to_string),
                                timed_out: matches!(
                                    v.store_error(),
                                    Some(StoreError::Timeout(_) | StoreError::NodeTimeout(_))
                                ),
                            });
                            tokio::time::sleep(PACE).await;
                        }
                    }
                    samples
                })
            })
            .collect();
        Load { started, stop, tasks }
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(task.await.unwrap());
        }
        all.sort_by_key(|s| s.at);
        all
    }
}

/// What a run through a fault showed, for the keys that lost their server.
struct Report {
    checks: usize,
    max_took: Duration,
    errors: usize,
    /// The last failed check of an affected key, after the fault.
    last_error: Option<Duration>,
    /// Units the store admitted over what GCRA allows (burst + rate × time), summed over
    /// the affected keys.
    over: u64,
    admitted: u64,
}

fn report(samples: &[Sample], affected: &[String], fault: Duration, deadline: Duration) -> Report {
    for s in samples {
        assert!(s.took <= deadline + SCHEDULING_SLACK, "a check took {:?} (deadline {deadline:?}): {s:?}", s.took);
        // Under FailMode::Open a failure lets the request through; only the store rejects.
        assert!(s.allowed || s.by == Some(DecidedBy::Store), "a request failed: {s:?}");
    }
    let mine: Vec<&Sample> = samples.iter().filter(|s| affected.contains(&s.key)).collect();
    let last_error = mine.iter().filter(|s| s.error.is_some() && s.at >= fault).map(|s| s.at + s.took).max();
    let (mut over, mut admitted) = (0, 0);
    for key in affected {
        let by_store: Vec<&&Sample> = mine.iter().filter(|s| &s.key == key && s.by == Some(DecidedBy::Store)).collect();
        let (Some(first), Some(last)) = (by_store.first(), by_store.last()) else { continue };
        let span = (last.at + last.took).saturating_sub(first.at).as_secs_f64();
        let allowed = by_store.iter().filter(|s| s.allowed).count() as u64;
        // One unit of slack: the span is measured here, the times are the server's.
        let bound = RATE + (RATE as f64 * span).floor() as u64 + 1;
        over += allowed.saturating_sub(bound);
        admitted += allowed;
    }
    Report {
        checks: samples.len(),
        max_took: samples.iter().map(|s| s.took).max().unwrap_or_default(),
        errors: samples.iter().filter(|s| s.error.is_some()).count(),
        last_error,
        over,
        admitted,
    }
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Waits (blocking) until `done`, checking every 50 ms, for at most `max`.
async fn wait_for(max: Duration, mut done: impl FnMut() -> bool + Send + 'static) -> bool {
    tokio::task::spawn_blocking(move || {
        let until = Instant::now() + max;
        while Instant::now() < until {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })
    .await
    .unwrap()
}

/// `EVALSHA` calls a server has answered (not counting what it replicated).
fn evalsha_calls(node: &support::redis::RedisServer) -> u64 {
    let stats = node.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SentinelFault {
    /// SIGKILL of the primary.
    Kill,
    /// `SENTINEL FAILOVER`: the old primary stays up.
    Failover,
    /// `REPLICAOF <replica>` sent to the primary: it keeps its clients, and answers
    /// writes with `READONLY`.
    Replicaof,
}

async fn sentinel_case(fault: SentinelFault) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut group = tokio::task::spawn_blocking(|| SentinelGroup::start(Some("s3cret"), None)).await.unwrap();
    let old = group.named_primary(0).unwrap();
    let new = group.other_than(old).port();
    let store = RedisStore::from_url(&group.url()).unwrap();
    store.ping().await.unwrap();
    let limiter = limiter(store);
    let keys = keys("sentinel", TASKS * KEYS_PER_TASK);
    let load = Load::start(&limiter, &keys);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let fault_at = load.now();
    match fault {
        SentinelFault::Kill => group.node_at(old).kill(),
        SentinelFault::Failover => drop(group.sentinel_cmd(0, &["SENTINEL", "FAILOVER", support::sentinel::MASTER])),
        SentinelFault::Replicaof => {
            let reply = group.node_at(old).cmd(&["REPLICAOF", "127.0.0.1", &new.to_string()]);
            assert_eq!(reply, "OK");
        }
    }
    // The sentinels act after down-after; a primary that says it is a replica is thought
    // down only after down-after + 2 INFO periods. The client then has 5 s.
    let acts = match fault {
        SentinelFault::Replicaof => DOWN_AFTER_MS + 2 * INFO_PERIOD_MS,
        _ => DOWN_AFTER_MS,
    };
    let bound = Duration::from_millis(acts) + Duration::from_secs(5);
    let group = Arc::new(group);
    let g = Arc::clone(&group);
    let named =
        wait_for(bound + Duration::from_secs(10), move || (0..3).all(|s| g.named_primary(s) == Some(new))).await;
    let named_at = load.now() - fault_at;
    assert!(named, "the sentinels did not name the replica within {bound:?}");
    // The store has moved when the new primary answers its scripts.
    let g = Arc::clone(&group);
    let new_node = move || evalsha_calls(g.other_than(old)) > 0;
    let moved = wait_for(bound, new_node).await;
    let moved_at = load.now() - fault_at;
    // Two more seconds of load on the new primary.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let samples = load.finish().await;
    let r = report(&samples, &keys, fault_at, DEADLINE);
    println!(
        "sentinel {fault:?}: {} checks, {} failed (fail-open), slowest {:?}; sentinels named the new primary \
         after {named_at:?}, the store used it after {moved_at:?}; last failure {:?} after the fault; \
         {} units admitted, {} over the limit",
        r.checks,
        r.errors,
        r.max_took,
        r.last_error.map(|e| e.saturating_sub(fault_at)),
        r.admitted,
        r.over,
    );
    assert!(moved && moved_at <= bound, "the store did not use the new primary within {bound:?} ({moved_at:?})");
    if let Some(last) = r.last_error {
        assert!(last - fault_at <= bound, "checks still failed {:?} after the fault", last - fault_at);
    }
    // Limiting goes on on the new primary: it rejects, and the store decided every check
    // of the last second.
    let tail: Vec<&Sample> =
        samples.iter().filter(|s| s.at + Duration::from_secs(1) >= samples.last().unwrap().at).collect();
    assert!(tail.iter().all(|s| s.by == Some(DecidedBy::Store)), "{:?}", tail.iter().find(|s| s.by.is_none()));
    assert!(tail.iter().any(|s| !s.allowed), "nothing was rejected on the new primary");
    // Lost writes set a key back to an earlier state: at worst one burst each.
    assert!(r.over <= RATE * keys.len() as u64, "{} units over the limit", r.over);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_killed_primary() {
    sentinel_case(SentinelFault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_command() {
    sentinel_case(SentinelFault::Failover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_replicaof_on_the_primary() {
    sentinel_case(SentinelFault::Replicaof).await;
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ClusterFault {
    /// SIGKILL of a master: its connections reset.
    Kill,
    /// SIGSTOP of a master: a hung host, no reset, nothing answered.
    Stop,
}

async fn cluster_case(fault: ClusterFault, deadline: Duration) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(3, false)).await.unwrap();
    // Four keys on each master; the first master fails.
    let masters: Vec<usize> =
        (0..cluster.nodes().len()).filter(|&i| cluster.node(i).cmd(&["ROLE"]).starts_with("master")).collect();
    assert_eq!(masters.len(), 3);
    let (mut affected, mut others) = (Vec::new(), Vec::new());
    let mut per_master = [0; 3];
    for key in keys("cluster", 200) {
        let slot: u16 = cluster.node(0).cmd(&["CLUSTER", "KEYSLOT", &key]).parse().unwrap();
        let m = masters.iter().position(|&i| Some(i) == cluster.owner_of(slot)).unwrap();
        if per_master[m] < 4 {
            per_master[m] += 1;
            if m == 0 {
                affected.push(key)
            } else {
                others.push(key)
            }
        }
        if per_master.iter().all(|&n| n == 4) {
            break;
        }
    }
    // Each task gets keys of every master.
    let mut keys = Vec::new();
    for i in 0..4 {
        keys.push(affected[i].clone());
        keys.push(others[2 * i].clone());
        keys.push(others[2 * i + 1].clone());
    }
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    store.ping().await.unwrap();
    let limiter = limiter_with(store, deadline);
    let load = Load::start(&limiter, &keys);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let victim = masters[0];
    let fault_at = load.now();
    match fault {
        ClusterFault::Kill => cluster.node_mut(victim).kill(),
        ClusterFault::Stop => cluster.node(victim).pause(),
    }
    let bound = Duration::from_millis(CLUSTER_NODE_TIMEOUT_MS) + Duration::from_secs(5);
    // The replica takes over after the node timeout; then the keys must work within 5 s.
    let slot: u16 = cluster.node(masters[1]).cmd(&["CLUSTER", "KEYSLOT", &affected[0]]).parse().unwrap();
    let cluster = Arc::new(cluster);
    let c = Arc::clone(&cluster);
    let promoted =
        wait_for(Duration::from_secs(20), move || c.owner_of(slot).is_some_and(|owner| owner != victim)).await;
    let promoted_at = load.now() - fault_at;
    assert!(promoted, "no replica took over");
    // Until the affected keys have worked for 2 s on end, or the bound and 2 s more.
    let until = fault_at + bound + Duration::from_secs(2);
    while load.now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let samples = load.finish().await;
    let r = report(&samples, &affected, fault_at, deadline);
    let others_failed: Vec<&Sample> = samples.iter().filter(|s| others.contains(&s.key) && s.error.is_some()).collect();
    println!(
        "cluster {fault:?} (deadline {deadline:?}): {} checks, {} failed (fail-open), {} of them on the other masters, slowest {:?}; \
         replica promoted after {promoted_at:?}; last failure on the failed master's keys {:?} after the fault; \
         {} units admitted there, {} over the limit",
        r.checks,
        r.errors,
        others_failed.len(),
        r.max_took,
        r.last_error.map(|e| e.saturating_sub(fault_at)),
        r.admitted,
        r.over,
    );
    if fault == ClusterFault::Stop {
        cluster.node(victim).resume();
    }
    if let (Some(first), Some(last)) = (others_failed.first(), others_failed.last()) {
        let mut kinds: Vec<String> = others_failed.iter().filter_map(|s| s.error.clone()).collect();
        kinds.sort();
        kinds.dedup();
        // A check may fail before the fault too (saturating: not a panic that hides it).
        let since = |s: &Sample| format!("{}{:?}", if s.at < fault_at { "-" } else { "" }, s.at.abs_diff(fault_at));
        println!("others failed from {} to {} after the fault: {kinds:?}", since(first), since(last));
    }
    // The other masters' keys all along; the failed master's once the bound has passed.
    stays_up(samples.iter().filter(|s| others.contains(&s.key)), "the other masters' keys");
    let after: Vec<&Sample> =
        samples.iter().filter(|s| affected.contains(&s.key) && s.at >= fault_at + bound).collect();
    assert!(!after.is_empty(), "no check of the failed master's keys after {bound:?}");
    stays_up(after, &format!("the failed master's keys, {bound:?} after the fault"));
    let end = samples.last().unwrap().at;
    for key in &affected {
        let decided = samples
            .iter()
            .any(|s| &s.key == key && s.at + Duration::from_secs(1) >= end && s.by == Some(DecidedBy::Store));
        assert!(decided, "{key} was not decided by the store in the last second");
    }
    assert!(r.over <= RATE * affected.len() as u64, "{} units over the limit", r.over);
}

/// Keys that work: none refused by the store as a whole (the breaker open, the connection
/// lost or replaced: `CircuitOpen`, `NotConnected`, `Unavailable`, …), at most 1% of their
/// checks timed out, and no run of failures as long as the breaker's cool-down (1 s) or a
/// node still failing would make. Their node may miss the 50 ms default deadline now and
/// then on two busy cores: seen before the fault as much as after it (on every master at
/// once), and around the cluster's own reconfiguration (the failed master marked FAIL, its
/// replica promoted); a timeout, rare and short, is no failure to serve.
fn stays_up<'a>(samples: impl IntoIterator<Item = &'a Sample>, what: &str) {
    let samples: Vec<&Sample> = samples.into_iter().collect();
    let failed: Vec<&&Sample> = samples.iter().filter(|s| s.error.is_some()).collect();
    let refused: Vec<&&&Sample> = failed.iter().filter(|s| !s.timed_out).collect();
    assert!(refused.is_empty(), "{what} were refused: {:?}", refused.first());
    assert!(
        failed.len() * 100 <= samples.len(),
        "{what}: {} of {} checks timed out (over 1%): {:?}",
        failed.len(),
        samples.len(),
        failed.first()
    );
    // Runs of failures: those less than 100 ms apart.
    let mut run: Option<(Duration, Duration)> = None;
    let mut longest = Duration::ZERO;
    for s in failed {
        run = match run {
            Some((from, to)) if s.at <= to + Duration::from_millis(100) => Some((from, s.at + s.took)),
            _ => Some((s.at, s.at + s.took)),
        };
        longest = longest.max(run.map_or(Duration::ZERO, |(from, to)| to - from));
    }
    assert!(longest < Duration::from_secs(1), "{what} failed for {longest:?} on end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_killed_master() {
    cluster_case(ClusterFault::Kill, DEADLINE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_stopped_master() {
    // The default deadline, shorter than the store's response timeout: the store must
    // notice the hung node from calls the limiter cut off.
    cluster_case(ClusterFault::Stop, DEFAULT_DEADLINE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_credentials_are_the_sentinels_own_and_never_shown() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let group = tokio::task::spawn_blocking(|| SentinelGroup::start(Some("s3cret"), Some("watchword"))).await.unwrap();
    let shown = |e: &dyn std::fmt::Display| {
        let text = e.to_string();
        assert!(!text.contains("s3cret") && !text.contains("watchword"), "a password shows: {text}");
        text
    };

    // Sentinels that require a password, asked without one: the error names them.
    let store = RedisStore::from_url(&group.url()).unwrap();
    let err = shown(&store.ping().await.unwrap_err());
    assert!(err.contains("sentinel") && err.contains("password"), "{err}");

    // With their password, the primary's from the URL: connected, and deciding.
    let store = RedisStore::from_url(&group.url()).unwrap().sentinel_credentials(None, "watchword").unwrap();
    store.ping().await.unwrap();
    shown(&format_args!("{store:?}"));
    assert!(format!("{store:?}").contains("sentinel"));
    let limiter = limiter(store);
    let v = limiter.check(&"k".to_owned()).await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Store), "{v:?}");

    // A wrong password for the primary: said so, after the sentinels answered.
    let url = group.url().replace(":s3cret@", ":wrong@");
    let store = RedisStore::from_url(&url).unwrap().sentinel_credentials(None, "watchword").unwrap();
    let err = shown(&store.ping().await.unwrap_err());
    assert!(err.contains("authentication failed") || err.contains("WRONGPASS"), "{err}");

    // Only a sentinel store takes sentinel credentials.
    let plain = RedisStore::from_url("redis://127.0.0.1:1").unwrap();
    let err = plain.sentinel_credentials(None, "watchword").unwrap_err().to_string();
    assert!(err.contains("not a redis+sentinel"), "{err}");
}

/// The least-privilege ACL of docs/redis.md, with `extra` permissions.
fn documented_acl(extra: &[&'static str]) -> Vec<&'static str> {
    let docs = include_str!("../../docs/redis.md");
    let line =
        docs.lines().find(|l| l.starts_with("ACL SETUSER limiter on >PASSWORD")).expect("the ACL in docs/redis.md");
    let mut acl: Vec<&str> = line.split(' ').skip(3).filter(|w| *w != ">PASSWORD").collect();
    acl.extend(extra);
    acl
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_an_acl_user_needs_role_besides_the_documented_acl() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut args = vec!["--user", "limiter", ">limiter-pw"];
    args.extend(documented_acl(&[]));
    args.extend(["--user", "roles", ">roles-pw"]);
    args.extend(documented_acl(&["+role"]));
    let group =
        tokio::task::spawn_blocking(move || SentinelGroup::start_with(Some("s3cret"), None, &args)).await.unwrap();
    let url = |user: &str, pw: &str| group.url().replace(":s3cret@", &format!("{user}:{pw}@"));

    // The documented ACL alone: the client cannot tell the server is the primary.
    let store = RedisStore::from_url(&url("limiter", "limiter-pw")).unwrap();
    let err = store.ping().await.unwrap_err().to_string();
    assert!(err.contains("NOPERM") || err.contains("permission"), "{err}");

    // With `+role`, as docs/redis.md says: connected, and every check decided.
    let store = RedisStore::from_url(&url("roles", "roles-pw")).unwrap();
    store.ping().await.unwrap();
    let limiter = limiter(store);
    for _ in 0..RATE {
        let v = limiter.check(&"acl".to_owned()).await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Store), "{v:?}");
    }
    assert!(limiter.check(&"acl".to_owned()).await.is_rejected());
}

/// A `redis+sentinel://` URL naming `ports`, in that order.
fn sentinel_url(ports: &[u16]) -> String {
    support::sentinel::url(Some("s3cret"), ports)
}

/// Checks `key` for `d`: how many checks the store decided, and the errors.
async fn checks_for(limiter: &KeyLimiter, key: &str, d: Duration) -> (usize, Vec<String>) {
    let until = Instant::now() + d;
    let (mut decided, mut errors) = (0, Vec::new());
    while Instant::now() < until {
        let v = limiter.check(&key.to_owned()).await;
        match v.store_error() {
            Some(e) => errors.push(e.to_string()),
            None => decided += 1,
        }
        tokio::time::sleep(PACE).await;
    }
    (decided, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sentinel_first_in_the_url_costs_only_its_vote() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let group = tokio::task::spawn_blocking(|| SentinelGroup::start(Some("s3cret"), None)).await.unwrap();
    let ports: Vec<u16> = group.sentinels.iter().map(|s| s.port()).collect();
    group.sentinels[0].pause();
    let store = RedisStore::from_url(&sentinel_url(&ports)).unwrap();
    let started = Instant::now();
    store.ping().await.unwrap();
    let took = started.elapsed();
    let limiter = limiter(store);
    let (decided, errors) = checks_for(&limiter, "hung", Duration::from_secs(2)).await;
    group.sentinels[0].resume();
    println!(
        "with the first sentinel stopped: connected in {took:?}; {decided} checks decided, {} failed",
        errors.len()
    );
    assert!(errors.is_empty() && decided > 0, "{:?}", errors.first());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_that_names_a_stale_primary_moves_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let group = tokio::task::spawn_blocking(|| SentinelGroup::start(Some("s3cret"), None)).await.unwrap();
    // A fourth sentinel, alone, watching the name at an address where nothing listens:
    // it can never fail over, and keeps naming that address.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let conf = format!("sentinel monitor {} 127.0.0.1 {dead} 2\n", support::sentinel::MASTER);
    let rogue = tokio::task::spawn_blocking(move || RedisServer::builder().sentinel(&conf).start()).await.unwrap();
    let mut ports = vec![rogue.port()];
    ports.extend(group.sentinels.iter().map(|s| s.port()));
    let store = RedisStore::from_url(&sentinel_url(&ports)).unwrap();
    store.ping().await.unwrap();
    let limiter = limiter(store);
    let (decided, errors) = checks_for(&limiter, "stale", Duration::from_secs(3)).await;
    println!("with a stale sentinel first: {decided} checks decided, {} failed", errors.len());
    // Before, the watch believed the first answer and dropped the connection every 250 ms.
    assert!(errors.is_empty() && decided > 0, "{} errors, first {:?}", errors.len(), errors.first());

    // Two real sentinels gone: the stale one and the last real one tie, one vote each. A
    // new store asks both named servers and takes the one that is a primary.
    let mut group = group;
    group.sentinels[1].kill();
    group.sentinels[2].kill();
    let store = RedisStore::from_url(&sentinel_url(&ports)).unwrap();
    store.ping().await.unwrap();
    let limiter = limiter_with(store, DEADLINE);
    let (decided, errors) = checks_for(&limiter, "tie", Duration::from_secs(1)).await;
    assert!(errors.is_empty() && decided > 0, "{} errors, first {:?}", errors.len(), errors.first());
}

/// A stopped master whose keys are spread over many slots, each slot called rarely (every
/// 1.5 s): the store still notices, from the number of slots failing, and its keys work
/// again once the replica took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_stopped_master_with_keys_over_many_slots() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(3, false)).await.unwrap();
    let master = (0..cluster.nodes().len()).find(|&i| cluster.node(i).cmd(&["ROLE"]).starts_with("master")).unwrap();
    // Ten keys of that master, in ten slots.
    let mut victims: Vec<(String, u16)> = Vec::new();
    for key in keys("spread", 2_000) {
        let slot: u16 = cluster.node(0).cmd(&["CLUSTER", "KEYSLOT", &key]).parse().unwrap();
        if cluster.owner_of(slot) == Some(master) && victims.iter().all(|(_, s)| *s != slot) {
            victims.push((key, slot));
        }
        if victims.len() == 10 {
            break;
        }
    }
    assert_eq!(victims.len(), 10);
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    store.ping().await.unwrap();
    let limiter = limiter_with(store, DEFAULT_DEADLINE);
    // Busy keys on the other masters: their successes must not hide the failing one.
    let other = keys("busy", 2_000)
        .into_iter()
        .find(|k| {
            let slot: u16 = cluster.node(0).cmd(&["CLUSTER", "KEYSLOT", k]).parse().unwrap();
            cluster.owner_of(slot).is_some_and(|o| o != master)
        })
        .unwrap();
    let busy = Load::start(&limiter, &[other]);
    cluster.node(master).pause();
    let fault = Instant::now();
    let bound = Duration::from_millis(CLUSTER_NODE_TIMEOUT_MS) + Duration::from_secs(5);
    let mut last_failure = None;
    let mut round = 0;
    while fault.elapsed() < bound + Duration::from_secs(2) {
        let key = &victims[round % victims.len()].0;
        round += 1;
        if limiter.check(key).await.store_error().is_some() {
            last_failure = Some(fault.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    cluster.node(master).resume();
    let busy = busy.finish().await;
    // The fault does not spread to the other masters (their node's own rare miss of the
    // 50 ms deadline on a busy host is no spread: see `stays_up`).
    stays_up(&busy, "checks of a key on a healthy master");
    println!("keys over ten slots of a stopped master: last failure {last_failure:?} after the fault");
    let last = last_failure.expect("the stopped master's keys failed at first");
    assert!(last <= bound, "still failing {last:?} after the fault");
}
