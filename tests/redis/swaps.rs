//! Rules swapped while Redis is stalled (SIGSTOP): what the fallback learnt from Redis —
//! each key's share of what remains, and its cached rejections — outlives a swap for every
//! rule whose name and algorithm survive it (issue 37, item 2), rescaled when its quota
//! changes.
#![cfg(feature = "redis")]

use crate::support;

use std::time::Duration;

use tollgate::key::Key;
use tollgate::store::Store;
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, Limiter, Quota, RedisStore};

use support::redis::RedisServer;

type Lim = Limiter<RedisStore, str>;

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

/// A SIGSTOPped server, SIGCONTed when dropped (also by a failed assertion).
struct Stopped<'a>(&'a RedisServer);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// Three servers, each its own `RedisStore` on one Redis, counted as three (up for more
/// than 3 s): rule "r" on `algorithm` with `quota`, a 1 s deadline and a breaker that opens
/// at the first timeout (and stays open through the test).
async fn three_servers(server: &RedisServer, algorithm: Algorithm, quota: Quota, cache: bool) -> Vec<Lim> {
    let limiters: Vec<Lim> = (0..3)
        .map(|_| {
            Limiter::<_, str>::builder(RedisStore::from_url(&server.url()).unwrap())
                .rule("r", quota, user)
                .algorithm(algorithm)
                .timeout(Duration::from_secs(1))
                .circuit_breaker(1, Duration::from_secs(600))
                .local_cache(cache)
                .build()
                .unwrap()
        })
        .collect();
    for l in &limiters {
        assert!(l.check("warm").await.is_allowed());
    }
    tokio::time::sleep(Duration::from_millis(3_500)).await; // no longer young
    let counted: Vec<_> = limiters.iter().map(|l| l.store().servers()).collect();
    assert!(counted.iter().all(|&n| n == Some(3)), "{counted:?}");
    limiters
}

/// Spends key `k` through Redis (`quota.limit()` units, round robin), then each server is
/// refused once by Redis.
async fn spend(limiters: &[Lim], limit: u64) {
    for i in 0..limit {
        let v = limiters[usize::try_from(i).unwrap() % 3].check("k").await;
        assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Store), "unit {i}: {v:?}");
    }
    for l in limiters {
        let v = l.check("k").await;
        assert!(v.is_rejected() && v.decided_by() == Some(DecidedBy::Store), "{v:?}");
    }
}

/// Sends `n` checks of `k` round robin: how many were admitted.
async fn admitted(limiters: &[Lim], n: usize) -> usize {
    let mut admitted = 0;
    for i in 0..n {
        let v = limiters[i % 3].check("k").await;
        assert!(v.store_error().is_some() || v.decided_by() != Some(DecidedBy::Store), "Redis answered: {v:?}");
        admitted += usize::from(v.is_allowed());
    }
    admitted
}

/// Issue 37 item 2's scenario: GCRA 100/day, the key's 100 through Redis, Redis stalled,
/// 30 requests all refused; then `set_quota` with the same quota on each server (a reload
/// of an unchanged file) and 120 more: before the fix the swap made a new rule-set
/// generation, the shares and the cached rejections were lost, and each fallback admitted
/// its fresh third of the quota (99 in all).
async fn a_swap_of_the_same_quota_keeps_what_redis_said(cache: bool) {
    let server = RedisServer::start();
    let quota = Quota::per_day(100);
    let limiters = three_servers(&server, Algorithm::Gcra, quota, cache).await;
    spend(&limiters, 100).await;
    server.pause();
    let _stopped = Stopped(&server);
    assert_eq!(admitted(&limiters, 30).await, 0, "before the swap");
    for l in &limiters {
        l.handle().set_quota("r", quota).unwrap();
    }
    let after = admitted(&limiters, 120).await;
    assert_eq!(after, 0, "admitted after a swap to the same quota, while Redis said 0 remain (cache: {cache})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_of_the_same_quota_keeps_the_cached_rejections_and_shares() {
    a_swap_of_the_same_quota_keeps_what_redis_said(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_of_the_same_quota_keeps_the_shares() {
    a_swap_of_the_same_quota_keeps_what_redis_said(false).await;
}

/// A swap that changes the quota of GCRA 100/day, or of a sliding log's, to `to` while
/// Redis is stalled, the key's 100 spent through Redis: how many of 150 requests round
/// robin the three fallbacks admit after it (none before it).
async fn admitted_after_a_swap_to(algorithm: Algorithm, to: Quota) -> usize {
    let server = RedisServer::start();
    let limiters = three_servers(&server, algorithm, Quota::per_day(100), true).await;
    spend(&limiters, 100).await;
    server.pause();
    let _stopped = Stopped(&server);
    assert_eq!(admitted(&limiters, 30).await, 0, "before the swap");
    for l in &limiters {
        l.handle().set_quota("r", to).unwrap();
    }
    admitted(&limiters, 150).await
}

/// The fallback reads what Redis said under the new quota: what the key used stays used,
/// as in Redis, neither reused as it was nor dropped for a fresh share. GCRA keeps time: a
/// key that spent its day is spent at 200 a day too (dropped, each server would admit a
/// fresh third of 200: 198).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_to_another_quota_keeps_spent_time_spent() {
    let admitted = admitted_after_a_swap_to(Algorithm::Gcra, Quota::per_day(200)).await;
    assert_eq!(admitted, 0, "GCRA 100/day spent, raised to 200/day: Redis would refuse");
}

/// A sliding log counts units: 100 used of 130 leaves 30, a third on each server (a stale
/// share of 0 would refuse them all; a fresh one admit 129).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_to_another_quota_frees_what_a_raise_adds() {
    let admitted = admitted_after_a_swap_to(Algorithm::SlidingWindowLog, Quota::per_day(130)).await;
    assert_eq!(admitted, 30, "sliding log 100/day spent, raised to 130/day: 30 remain in Redis");
}

/// A key blocked by hand on Redis, then Redis stalls (issue 37 item 12b): the server that
/// blocked it keeps refusing it in its fallback for the rest of the block — at once, with
/// no check of the key between the block and the stall, and after the blocked-key cache's
/// one second (blocks are re-read from Redis after a second, so that a lift elsewhere
/// reaches every server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_servers_fallback_keeps_a_block_by_hand() {
    use tollgate::Rule;
    let server = RedisServer::start();
    let limiter = Limiter::<_, str>::builder(RedisStore::from_url(&server.url()).unwrap())
        .add_rule(Rule::new("r", Quota::per_hour(100), user).blockable())
        .algorithm(Algorithm::Gcra)
        .servers(1)
        .timeout(Duration::from_millis(200))
        .circuit_breaker(1, Duration::from_secs(600))
        .build()
        .unwrap();
    for key in ["k", "j", "m"] {
        assert_eq!(limiter.check(key).await.decided_by(), Some(DecidedBy::Store));
    }
    // "m" is also refused once by Redis after its block: its share learns the block.
    limiter.block("r", "m", Duration::from_secs(3600)).await.unwrap();
    let v = limiter.check("m").await;
    assert!(v.is_rejected() && v.decided_by() == Some(DecidedBy::Store), "{v:?}");
    limiter.block("r", "k", Duration::from_secs(3600)).await.unwrap();
    server.pause();
    let stopped = Stopped(&server);
    let started = std::time::Instant::now();
    let mut refused = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        for key in ["k", "m"] {
            let v = limiter.check(key).await;
            assert!(v.is_rejected(), "{key} {:?} after the stall: admitted ({v:?})", started.elapsed());
            assert!(v.retry_after() > Some(Duration::from_secs(3_500)), "{v:?}");
        }
        refused += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused > 10);
    assert!(limiter.check("j").await.is_allowed(), "another key: the fallback's share");
    // Lifted while Redis answers, then stalled again: the fallback admits the keys (the
    // circuit is still open: the checks go straight to the fallback), "m" too, though
    // its share had learnt the block's zero from Redis.
    drop(stopped);
    for key in ["k", "m"] {
        limiter.block("r", key, Duration::ZERO).await.unwrap();
    }
    server.pause();
    let _stopped = Stopped(&server);
    for key in ["k", "m"] {
        let v = limiter.check(key).await;
        assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{key} lifted: {v:?}");
    }
}
