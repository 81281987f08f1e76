//! One master of a 3-master Redis Cluster stalled (SIGSTOP) while the others answer, through
//! the public API with the crate's defaults where not said: what the fallback admitted is
//! counted once when the master resumes, and the healthy masters keep deciding.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::redis::RedisCluster;
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, FailMode, Limiter, Quota, RedisStore, Rule};

/// The cluster's masters take turns: two stalled clusters at once on two busy cores would
/// stall more than the node under test.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `n` keys (their own hash tags) whose slot node `node` serves.
fn keys_on(cluster: &RedisCluster, node: usize, base: &str, n: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0.. {
        let key = format!("{base}-{i}");
        let slot: u16 = cluster.node(0).cmd(&["CLUSTER", "KEYSLOT", &format!("{{{key}}}")]).parse().unwrap();
        if cluster.owner_of(slot) == Some(node) {
            keys.push(key);
            if keys.len() == n {
                return keys;
            }
        }
    }
    unreachable!()
}

async fn start_cluster() -> RedisCluster {
    tokio::task::spawn_blocking(|| RedisCluster::start(3)).await.unwrap()
}

/// Checks `keys` with `limiter` every `every` until stopped: how many got no store decision.
struct Busy {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Busy {
    fn start(limiter: &Arc<Limiter<RedisStore, String>>, keys: Vec<String>, every: Duration) -> Busy {
        let (stop, limiter) = (Arc::new(AtomicBool::new(false)), Arc::clone(limiter));
        let s = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut undecided = Vec::new();
            while !s.load(Ordering::Relaxed) {
                for key in &keys {
                    let v = limiter.check(key).await;
                    if v.decided_by() != Some(DecidedBy::Store) {
                        undecided.push(format!("{key}: {:?} {:?}", v.decided_by(), v.store_error()));
                    }
                }
                tokio::time::sleep(every).await;
            }
            undecided
        });
        Busy { stop, task }
    }

    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Issue 37, item 1: a unit the fallback admitted while its master was stalled is counted
/// once when the master resumes. The check, cut by the deadline and then by the cluster
/// connection's own timeout, was sent: its outcome is unknown, so it must not be written
/// back (each write-back, cut the same way, was queued again: about one per 250 ms of the
/// stall, all run by Redis on resume).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_the_fallback_admitted_during_a_master_stall_is_counted_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = start_cluster().await;
    let mut on_0 = keys_on(&cluster, 0, "stalled", 2);
    let (k, warm) = (on_0.remove(0), on_0.remove(0));
    let mut others = keys_on(&cluster, 1, "busy", 2);
    others.extend(keys_on(&cluster, 2, "busy", 2));
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    store.ping().await.unwrap();
    // The crate's defaults: a 50 ms deadline, the fallback, the cluster connection's 250 ms.
    let limiter = Arc::new(
        Limiter::builder(store)
            .rule("hourly", Quota::per_hour(100), |k: &String| k.starts_with("stalled").then(|| k.clone()))
            // The healthy masters' keys, checked all along: never refused.
            .rule("busy", Quota::per_hour(1_000_000), |k: &String| k.starts_with("busy").then(|| k.clone()))
            .algorithm(Algorithm::SlidingWindowLog)
            .build()
            .unwrap(),
    );
    // K's master has run the script before, as a master in service has: else the stalled
    // call, answered `NOSCRIPT` on resume, would count nothing.
    assert_eq!(limiter.check(&warm).await.decided_by(), Some(DecidedBy::Store));
    let busy = Busy::start(&limiter, others, Duration::from_millis(25));
    tokio::time::sleep(Duration::from_millis(300)).await;

    cluster.node(0).pause();
    let stalled = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let v = limiter.check(&k).await;
    assert!(v.is_allowed(), "{:?}", v.store_error());
    assert_eq!(v.decided_by(), Some(DecidedBy::Fallback), "{:?}", v.store_error());
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(stalled.elapsed())).await;
    cluster.node(0).resume();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let undecided = busy.finish().await;

    let peek = limiter.peek("hourly", k.clone()).await.unwrap();
    // `remaining` counts the peek's own unit.
    let counted = 100 - peek.remaining() - 1;
    assert_eq!(counted, 1, "Redis counted the fallback's one unit {counted} times");
    assert!(undecided.is_empty(), "keys of the healthy masters went undecided: {undecided:?}");
}

/// A user (enforced rule) and a second key (`other`'s rule, enforced or shadow), each its
/// own client key.
type Pair = (String, String);

/// A limiter under `FailMode::Closed` (every other setting at its default) with an
/// enforced rule per user, first, and a rule per `other` key, a shadow one if `shadow`.
fn closed_limiter(store: RedisStore, shadow: bool) -> Arc<Limiter<RedisStore, Pair>> {
    let other = Rule::new("other", Quota::per_hour(1_000_000), |p: &Pair| Some(p.1.clone())).shadow(shadow);
    let limiter = Limiter::builder(store)
        .rule("user", Quota::per_hour(1_000_000), |p: &Pair| Some(p.0.clone()))
        .add_rule(other)
        .fail_mode(FailMode::Closed)
        .build()
        .unwrap();
    Arc::new(limiter)
}

/// Issue 37, item 5: a stalled master that holds only a shadow rule's key neither fails nor
/// delays the request: the enforced rule's slot answered, so the request is decided (a
/// shadow rule never vetoes), and the breaker stays shut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_holding_only_a_shadow_key_fails_no_request() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = start_cluster().await;
    let users = keys_on(&cluster, 1, "user", 4);
    let ips = keys_on(&cluster, 0, "ip", 2);
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    store.ping().await.unwrap();
    let limiter = closed_limiter(store, true);
    // Both masters have run the script.
    let v = limiter.check(&(users[0].clone(), ips[0].clone())).await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Store), "{:?}", v.store_error());

    cluster.node(0).pause();
    let mut failed = Vec::new();
    for i in 0..8 {
        let (user, ip) = (users[i % users.len()].clone(), ips[i % ips.len()].clone());
        let v = limiter.check(&(user, ip)).await;
        if !v.is_allowed() || v.decided_by() != Some(DecidedBy::Store) {
            failed.push(format!("{:?} {:?}", v.decided_by(), v.store_error()));
        }
    }
    // A user alone: the breaker did not open.
    let alone = limiter.check(&(users[0].clone(), users[1].clone())).await;
    cluster.node(0).resume();
    assert!(failed.is_empty(), "{} of 8 requests the enforced rule admits failed: {failed:?}", failed.len());
    assert!(alone.is_allowed(), "{:?}", alone.store_error());
}

/// Issue 37, item 6: requests whose rules sit on a healthy and a stalled master, cut by the
/// deadline, are that one node's timeouts (refused under `FailMode::Closed`), not the
/// store's: after more than the breaker's five, requests touching only healthy masters are
/// still decided by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stalled_master_does_not_stop_the_healthy_ones() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = start_cluster().await;
    let users = keys_on(&cluster, 1, "user", 4);
    let orgs = keys_on(&cluster, 0, "org", 2);
    let healthy = keys_on(&cluster, 2, "team", 4);
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    store.ping().await.unwrap();
    let limiter = closed_limiter(store, false);
    let v = limiter.check(&(users[0].clone(), orgs[0].clone())).await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Store), "{:?}", v.store_error());

    cluster.node(0).pause();
    let mut cut = Vec::new();
    for i in 0..8 {
        // The user's rule first: its healthy slot answers first.
        let v = limiter.check(&(users[i % users.len()].clone(), orgs[i % orgs.len()].clone())).await;
        assert!(!v.is_allowed(), "the stalled master's rule went undecided under FailMode::Closed");
        cut.push(v.store_error().map(ToString::to_string));
    }
    let mut refused = Vec::new();
    for i in 0..4 {
        let v = limiter.check(&(users[i].clone(), healthy[i].clone())).await;
        if !v.is_allowed() || v.decided_by() != Some(DecidedBy::Store) {
            refused.push(format!("{:?}", v.store_error()));
        }
    }
    cluster.node(0).resume();
    assert!(
        refused.is_empty(),
        "{} of 4 requests touching only healthy masters were refused: {refused:?}\n(the cut ones said: {cut:?})",
        refused.len()
    );
}
