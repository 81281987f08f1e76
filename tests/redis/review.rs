//! A fresh reviewer's attacks on the fallback and its bookkeeping (issue 37's closing
//! effort), against real redis-server processes.
#![cfg(feature = "redis")]

use crate::support;

use std::time::Duration;

use tollgate::{Algorithm, Limiter, Quota, RedisStore};

use support::redis::RedisServer;

/// A check sent to a stalled Redis and dropped before its reply (the caller went away,
/// within the deadline): Redis runs it when it resumes and takes its unit, which nobody
/// uses. The request never went on: the unit must come back, as it does when the deadline
/// cuts the call instead. Fails today: 3 dropped checks leave 3 units in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_dropped_while_redis_is_stalled_leave_no_units_in_redis() {
    let redis = RedisServer::start();
    let store = RedisStore::from_url(&redis.url()).unwrap().response_timeout(Duration::from_secs(10));
    let limiter = Limiter::builder(store)
        .rule("r", Quota::per_hour(10), |k: &str| Some(tollgate::key::Key::from(k)))
        .algorithm(Algorithm::Gcra)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // Warm: the script loaded, the connection up.
    assert!(limiter.check_key("r", "warm", 1).await.is_allowed());
    redis.pause();
    for _ in 0..3 {
        let r = tokio::time::timeout(Duration::from_millis(100), limiter.check_key("r", "k", 1)).await;
        assert!(r.is_err(), "answered while Redis is stopped");
    }
    redis.resume();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let peek = limiter.peek("r", "k").await.unwrap();
    // A peek says what would remain after one more: 10 - used - 1.
    assert_eq!(9 - peek.remaining, 0, "units left in Redis by 3 checks dropped during the stall");
}
