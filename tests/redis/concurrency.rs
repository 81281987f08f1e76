//! Issue 42 on Redis: concurrency rules shared by servers (each its own `RedisStore`) on
//! standalone Redis and a 3-node Cluster; a release sent twice gives back once; a held
//! permit is renewed past its hold limit; a server killed with `kill -9` holding permits
//! loses them within the hold limit.
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use tollgate::{FailMode, Limiter, Quota, RedisStore, Rule};

use support::redis::{RedisCluster, RedisServer};
use support::sentinel::SentinelGroup;

fn user(u: &str) -> Option<String> {
    Some(u.to_owned())
}

/// A server's limiter: `n` in flight per user (hold limit `hold`), and 1000 a minute.
fn limiter(store: RedisStore, n: u64, hold: Duration) -> Limiter<RedisStore, str> {
    Limiter::builder(store)
        .add_rule(Rule::new("per-minute", Quota::per_minute(1000), user))
        .add_rule(Rule::concurrent("in-flight", n, user).hold_limit(hold))
        .fail_mode(FailMode::Closed)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn store(url: &str) -> RedisStore {
    RedisStore::from_url(url).unwrap().response_timeout(Duration::from_secs(2))
}

/// Three servers share `n` = 5 permits of one key: the sixth entry anywhere is refused,
/// and a permit dropped on one server makes room on another.
async fn three_servers_share_n(stores: Vec<RedisStore>) {
    let servers: Vec<_> = stores.into_iter().map(|s| limiter(s, 5, Duration::from_secs(60))).collect();
    let mut held = Vec::new();
    for i in 0..5 {
        let p = servers[i % 3].enter("ada").await;
        assert!(p.is_allowed(), "{p:?}");
        assert_eq!(p.permits(), 1);
        held.push(p);
    }
    for s in &servers {
        let refused = s.enter("ada").await;
        assert!(refused.is_rejected(), "{refused:?}");
        assert_eq!(refused.rejected_by().unwrap().rule, "in-flight");
        assert!(refused.retry_after().unwrap() >= Duration::from_millis(10));
    }
    drop(held.remove(0)); // on server 0
                          // The release is sent from a task: it lands within a few ms.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = servers[2].enter("ada").await;
    assert!(again.is_allowed(), "a permit released on one server is free on another at once: {again:?}");
    assert!(servers[1].enter("ada").await.is_rejected());
    // A refusal by permits is not put in the blocked-key cache: with a median hold of
    // 600 ms, a cached refusal would answer server 2 for 600 ms after a release.
    let bob = servers[0].enter("bob").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    drop(bob);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let held_bob: Vec<_> = [
        servers[0].enter("bob").await,
        servers[0].enter("bob").await,
        servers[0].enter("bob").await,
        servers[0].enter("bob").await,
        servers[0].enter("bob").await,
    ]
    .into();
    assert!(held_bob.iter().all(|p| p.is_allowed()));
    let refused = servers[2].enter("bob").await;
    assert!(refused.retry_after().unwrap() >= Duration::from_millis(500), "{refused:?}");
    drop(held_bob);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(servers[2].enter("bob").await.is_allowed(), "asked the store again, not a cached refusal");
    // Refused entries took no rate units: 6 admitted, of 1000.
    let left = servers[0].peek("per-minute", "ada").await.unwrap().remaining();
    assert_eq!(left, 1000 - 6 - 1, "peek counts the unit it would take");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_n_permits_on_standalone_redis() {
    let redis = RedisServer::start();
    three_servers_share_n((0..3).map(|_| store(&redis.url())).collect()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_n_permits_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let stores =
        (0..3).map(|_| RedisStore::cluster(cluster.urls()).unwrap().response_timeout(Duration::from_secs(2))).collect();
    three_servers_share_n(stores).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_n_permits_through_sentinel() {
    let group = tokio::task::spawn_blocking(|| SentinelGroup::start(Some("s3cret"), None)).await.unwrap();
    let stores = (0..3)
        .map(|_| RedisStore::from_url(&group.url()).unwrap().response_timeout(Duration::from_secs(2)))
        .collect::<Vec<_>>();
    stores[0].ping().await.unwrap();
    three_servers_share_n(stores).await;
}

/// An entry dropped while its store call is on its way (Redis stalled): the call runs on
/// when Redis resumes, and the permit it took is given back — nothing leaks at that await.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_dropped_while_the_store_decides_holds_nothing() {
    let redis = RedisServer::start();
    let l = limiter(store(&redis.url()), 1, Duration::from_secs(60));
    drop(l.enter("warm").await);
    redis.pause();
    let gone = tokio::time::timeout(Duration::from_millis(100), l.enter("ada")).await;
    assert!(gone.is_err(), "the entry was still waiting on the store");
    redis.resume();
    let started = Instant::now();
    loop {
        let p = l.enter("ada").await;
        if p.is_allowed() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "the dropped entry's permit was never given back: {p:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_twice_gives_back_once() {
    use tollgate::store::{Check, Params, Refund, Store, Taken};
    let redis = RedisServer::start();
    let s = store(&redis.url());
    let check = Check {
        rule: tollgate::store::RuleName::new("twice"),
        key: "ada".into(),
        algorithm: tollgate::Algorithm::Concurrent,
        params: Params::new(Quota::new(2, Duration::from_secs(60))),
    };
    let a = s.check(std::slice::from_ref(&check)).await.unwrap()[0].clone().unwrap();
    let b = s.check(std::slice::from_ref(&check)).await.unwrap()[0].clone().unwrap();
    let (ta, tb) = (a.taken.unwrap(), b.taken.unwrap());
    assert_ne!(ta, tb, "each permit has its own id");
    let full = s.check(std::slice::from_ref(&check)).await.unwrap()[0].clone().unwrap();
    assert!(!full.decision.allowed);
    let release = Refund { check: check.clone(), taken: ta };
    s.refund(std::slice::from_ref(&release)).await.unwrap();
    s.refund(std::slice::from_ref(&release)).await.unwrap(); // resent: "sent, outcome unknown"
    let c = s.check(std::slice::from_ref(&check)).await.unwrap()[0].clone().unwrap();
    assert!(c.decision.allowed, "the first release made room");
    let d = s.check(std::slice::from_ref(&check)).await.unwrap()[0].clone().unwrap();
    assert!(!d.decision.allowed, "the second gave nothing back: b and c hold both permits");
    let _ = Taken { at: 0 };
    assert!(tb.at > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_permit_is_renewed_past_its_hold_limit() {
    let redis = RedisServer::start();
    renewed(store(&redis.url()), store(&redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_permit_is_renewed_past_its_hold_limit_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let on = || RedisStore::cluster(cluster.urls()).unwrap().response_timeout(Duration::from_secs(2));
    renewed(on(), on()).await;
}

/// One server holds a permit (n = 1, hold limit 300 ms) for a second: renewed every
/// 100 ms, the other server is refused all along; released, the other gets it.
async fn renewed(a: RedisStore, b: RedisStore) {
    let holder = limiter(a, 1, Duration::from_millis(300));
    let other = limiter(b, 1, Duration::from_millis(300));
    let p = holder.enter("ada").await;
    assert!(p.is_allowed());
    tokio::time::sleep(Duration::from_millis(1_000)).await; // over three hold limits
    assert!(other.enter("ada").await.is_rejected(), "renewed every 100 ms: still held");
    drop(p);
    let started = Instant::now();
    while other.enter("ada").await.is_rejected() {
        assert!(started.elapsed() < Duration::from_secs(2), "the release did not land");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The child process of [`a_server_killed_holding_permits_loses_them_within_the_hold_limit`]:
/// with `TOLLGATE_CHILD_REDIS` set, it takes 3 permits, says so, and waits to be killed.
/// Without it (any ordinary test run) it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holding_permits() {
    let Ok(url) = std::env::var("TOLLGATE_CHILD_REDIS") else { return };
    let l = limiter(store(&url), 3, Duration::from_millis(600));
    let held = [l.enter("ada").await, l.enter("ada").await, l.enter("ada").await];
    assert!(held.iter().all(|p| p.is_allowed()));
    println!("HOLDING");
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_holding_permits_loses_them_within_the_hold_limit() {
    use std::io::BufRead;
    let redis = RedisServer::start();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "concurrency::child_holding_permits", "--nocapture", "--test-threads=1"])
        .env("TOLLGATE_CHILD_REDIS", redis.url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.contains("HOLDING"))), "the child never held its permits");
    let me = limiter(store(&redis.url()), 3, Duration::from_millis(600));
    // Held and renewed (every 200 ms) while the child lives, past a hold limit.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(me.enter("ada").await.is_rejected(), "the child's permits are renewed while it lives");
    let killed = std::process::Command::new("kill").args(["-9", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let _ = child.wait();
    let dead = Instant::now();
    let back = loop {
        let p = me.enter("ada").await;
        if p.is_allowed() {
            break p;
        }
        assert!(dead.elapsed() < Duration::from_secs(2), "the dead server's permits never came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(dead.elapsed() <= Duration::from_millis(600 + 100), "back within the hold limit: {:?}", dead.elapsed());
    let more = [me.enter("ada").await, me.enter("ada").await];
    assert!(more.iter().all(|p| p.is_allowed()), "all three came back");
    drop(back);
}

/// While the store is down, each server holds at most ⌊n ÷ N⌋ permits of a key beyond
/// those it holds in the store (N the servers sharing it), given back to the fallback
/// when dropped; a refusal is not cached: a permit given back is usable at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_store_is_down_each_server_holds_its_share_of_n() {
    let mut redis = RedisServer::start();
    let l = Limiter::builder(store(&redis.url()))
        .add_rule(Rule::concurrent("in-flight", 7, user))
        .servers(3)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let in_store = l.enter("ada").await;
    assert!(in_store.is_allowed());
    assert_eq!(in_store.decided_by(), Some(tollgate::verdict::DecidedBy::Store));
    redis.kill();
    let mut held = Vec::new();
    for _ in 0..2 {
        let p = l.enter("ada").await;
        assert!(p.is_allowed(), "{p:?}");
        assert_eq!(p.decided_by(), Some(tollgate::verdict::DecidedBy::Fallback));
        held.push(p);
    }
    let refused = l.enter("ada").await;
    assert!(refused.is_rejected(), "⌊7 ÷ 3⌋ = 2 permits beyond the one in the store: {refused:?}");
    assert!(refused.retry_after().is_some());
    drop(held.pop());
    assert!(l.enter("ada").await.is_allowed(), "given back to the fallback, and not cached as refused");
    drop(in_store);
}

/// Entries of a concurrency rule alone are group-committed as single-rule checks are:
/// 40 entries at once, at most 16 a call, are 3 script calls; 20 releases at once are one
/// call, and give every permit back.
#[tokio::test(flavor = "current_thread")]
async fn entries_are_group_committed() {
    use tollgate::store::{Check, Params, Refund, RuleName, Store};
    let server = RedisServer::start();
    let s =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2)).max_batch(16).unwrap();
    let check = |key: String| Check {
        rule: RuleName::new("in-flight"),
        key: key.into(),
        algorithm: tollgate::Algorithm::Concurrent,
        params: Params::new(Quota::new(1, Duration::from_secs(60))),
    };
    let checks: Vec<Check> = (0..40).map(|i| check(format!("user-{}", i % 20))).collect();
    // Loads the script (EVAL after NOSCRIPT).
    s.check_one(&check("warm".into())).await.unwrap();
    server.cmd(&["CONFIG", "RESETSTAT"]);
    let outcomes = futures_util::future::join_all(checks.iter().map(|c| s.check_one(c))).await;
    let stats = server.commandstats();
    assert_eq!(stats.get("evalsha"), Some(&3), "{stats:?}");
    // Each of the 20 keys: its first entry admitted, its second refused (n = 1).
    let admitted: Vec<Refund> = checks
        .iter()
        .zip(&outcomes)
        .filter_map(|(c, o)| o.as_ref().unwrap().taken.map(|taken| Refund { check: c.clone(), taken }))
        .collect();
    assert_eq!(admitted.len(), 20);
    // Releases too: 20 given back at once (each its own call, as 20 requests ending
    // together) are one script call. (The refund script loaded first.)
    let warm = s.check_one(&check("warm-release".into())).await.unwrap();
    s.refund(&[Refund { check: check("warm-release".into()), taken: warm.taken.unwrap() }]).await.unwrap();
    server.cmd(&["CONFIG", "RESETSTAT"]);
    let released = futures_util::future::join_all(admitted.iter().map(|r| s.refund(std::slice::from_ref(r)))).await;
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    let stats = server.commandstats();
    assert_eq!((stats.get("evalsha"), stats.get("eval")), (Some(&1), None), "{stats:?}");
    for i in 0..20 {
        let o = s.check_one(&check(format!("user-{i}"))).await.unwrap();
        assert!(o.decision.allowed, "user-{i}'s permit went back");
    }
}

/// Renewals are one call per server (and cluster slot) per renewal period, however many
/// keys it holds permits on: 10 keys held for a second with a 300 ms hold limit are about
/// 10 calls, not 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_one_call_per_period() {
    let redis = RedisServer::start();
    let l = limiter(store(&redis.url()), 1, Duration::from_millis(300));
    let mut held = Vec::new();
    for i in 0..10 {
        let p = l.enter(&format!("user-{i}")).await;
        assert!(p.is_allowed());
        held.push(p);
    }
    // The renew script is loaded by the first renewal.
    tokio::time::sleep(Duration::from_millis(250)).await;
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = redis.commandstats();
    let calls = stats.get("evalsha").copied().unwrap_or(0);
    assert!((5..=12).contains(&calls), "{calls} renewal calls in a second: {stats:?}");
    drop(held);
}
