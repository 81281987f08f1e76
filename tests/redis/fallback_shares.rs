//! The fallback's shares of what Redis said remains, past many keys (issue 37 item 4):
//! a key spent through Redis is refused by the fallback while Redis is stalled, however
//! many other keys Redis answered for before it.
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tollgate::key::Key;
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, Limiter, Quota, RedisStore};

use support::redis::RedisServer;

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

/// One server (`.servers(1)`), GCRA 10/day, no blocked-key cache (the shares alone
/// decide): key `early` spent through Redis, then 120,000 distinct keys checked once each
/// through Redis, then key `late` spent. Redis stalled: both spent keys are refused by
/// the fallback, for about a day. Before, the shares' 16 shards each held 1/16 of 100,000
/// entries and dropped new keys once full: `late` was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_spent_after_many_others_is_still_refused_by_the_fallback() {
    let server = RedisServer::start();
    let limiter = Limiter::<_, str>::builder(RedisStore::from_url(&server.url()).unwrap())
        .rule("r", Quota::per_day(10), user)
        .algorithm(Algorithm::Gcra)
        .servers(1)
        .timeout(Duration::from_millis(500))
        .local_cache(false)
        .build()
        .unwrap();
    let spend = |key: &'static str| {
        let limiter = &limiter;
        async move {
            for i in 0..10 {
                let v = limiter.check(key).await;
                assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Store), "{key} unit {i}: {v:?}");
            }
        }
    };
    spend("early").await;
    let started = Instant::now();
    let keys: Vec<String> = (0..120_000).map(|i| format!("other-{i}")).collect();
    // Each answered by Redis (its share recorded), but for the odd call cut by the
    // deadline on a loaded machine: a key the fallback decided has no share to record.
    let mut by_redis = 0;
    for chunk in keys.chunks(64) {
        let verdicts = join_all(chunk.iter().map(|k| limiter.check(k))).await;
        by_redis += verdicts.iter().filter(|v| v.decided_by() == Some(DecidedBy::Store)).count();
    }
    eprintln!("120,000 keys, {by_redis} decided by Redis, in {:?}", started.elapsed());
    assert!(by_redis > 119_000, "{by_redis} of 120,000 decided by Redis");
    spend("late").await;
    server.pause();
    let _resume = Resume(&server);
    for key in ["early", "late"] {
        let v = limiter.check(key).await;
        assert!(v.is_rejected(), "{key}: admitted by the fallback, though Redis said 0 remain: {v:?}");
        assert_eq!(v.decided_by(), Some(DecidedBy::Fallback), "{v:?}");
        assert!(v.retry_after() > Some(Duration::from_secs(23 * 3600)), "{key}: {v:?}");
    }
    assert!(limiter.check("never-seen").await.is_allowed(), "a key Redis never saw: the fresh share");
}

/// SIGCONTs a stalled server when dropped (also by a failed assertion).
struct Resume<'a>(&'a RedisServer);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}
