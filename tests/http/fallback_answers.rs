//! What the fallback tells a client and the handler (issue 37, items 3, 8 and 10, and who
//! decided): a cost above this server's share is not "never", a 200's remaining counts
//! down to the 429, a unit whose status does not count goes back from a call answered
//! late, and the handler sees who decided.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use support::fake::{settle, Mode, Remote, T0};
use tollgate::clock::ManualClock;
use tollgate::key::{self, Key};
use tollgate::store::{Check, Params, Store};
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, Decision, Limiter, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

/// A cost of 40 under GCRA 100 a minute, four servers, the store failing: this server's
/// share (25) cannot take it, but the whole quota can. Refused with a wait (what the whole
/// quota needs to make room for 40: 24 s), never `None` ("can never be accepted"), which
/// leaves a 429 without `Retry-After` and makes `wait_key` give up at once. A cost above
/// the whole quota is still `None`.
#[tokio::test]
async fn a_cost_above_the_share_but_within_the_quota_has_a_retry_after() {
    let q = Quota::per_minute(100);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", q, user)
        .algorithm(Algorithm::Gcra)
        .servers(4)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    store.set(Mode::Failing);
    let v = limiter.check_key("r", "fresh", 40).await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Fallback), "{v:?}");
    assert!(v.is_rejected(), "40 is above this server's share of 25: {v:?}");
    assert_eq!(v.retry_after(), Some(Duration::from_secs(24)), "{v:?}");
    let v = limiter.check_key("r", "fresh", 101).await;
    assert!(v.is_rejected() && v.retry_after().is_none(), "101 can never pass a quota of 100: {v:?}");
}

/// The fallback's 200s say what this server may still admit: its share of what the store
/// last said remains, counted down to 0 before the first 429 (it said 14 left, then
/// refused). And its 429s wait no longer than the rule's window.
#[tokio::test]
async fn the_fallbacks_remaining_counts_down_to_its_429() {
    let q = Quota::per_minute(60);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", q, user)
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    for _ in 0..46 {
        assert!(limiter.check("k").await.is_allowed());
    }
    store.set(Mode::Failing);
    let mut said = Vec::new();
    let rejected = loop {
        let v = limiter.check("k").await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Fallback), "{v:?}");
        if v.is_rejected() {
            break v;
        }
        said.push(v.most_restrictive().unwrap().decision.remaining());
        assert!(said.len() <= 60, "the fallback never refused");
    };
    assert_eq!(said.len(), 14, "the store said 14 remain; the fallback admitted {}", said.len());
    let expected: Vec<u64> = (0..14).rev().collect();
    assert_eq!(said, expected, "each 200's remaining is the number of 200s after it");
    let retry = rejected.retry_after().expect("a wait");
    assert!(retry <= q.period(), "Retry-After {retry:?} past the rule's window");
}

/// A login rule counting 401s, the store answering 3 s late (a Redis paused with a long
/// response timeout: the late calls run on resume) under a 1 s deadline: two 401s counted
/// through the store, then two successful logins decided by the fallback. Their units,
/// taken in the store by the late calls, go back: the store counts the two 401s only.
#[tokio::test(start_paused = true)]
async fn a_successful_login_decided_by_the_fallback_leaves_nothing_in_the_store() {
    let q = Quota::per_hour(4);
    let store = Remote::new(MemoryStore::with_clock(support::fake::TokioClock::new()));
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(
            Rule::new("login", q, key::header("x-key"))
                .algorithm(Algorithm::Gcra)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .servers(1)
        .timeout(Duration::from_secs(1))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .fallback(MemoryStore::new())
        .build()
        .unwrap();
    let svc = layer.layer(crate::common::app(Default::default()));
    let req = |path: &str| http::Request::get(path).header("x-key", "ada").body(axum::body::Body::empty()).unwrap();
    for _ in 0..2 {
        assert_eq!(svc.clone().oneshot(req("/fail")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
        settle().await;
    }
    let check = Check { rule: "login".into(), key: "ada".into(), algorithm: Algorithm::Gcra, params: Params::new(q) };
    store.set(Mode::Relayed(Duration::from_secs(3)));
    for i in 0..2 {
        let res = svc.clone().oneshot(req("/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "login {i} during the pause");
        assert_eq!(res.extensions().get::<Decision>(), None, "extensions are the request's, not the response's");
        settle().await;
    }
    store.set(Mode::Up);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    // A peek says what one more request would leave: 2 counted, 1 after the next.
    let d = Store::peek(&store, &check).await.unwrap();
    let counted = d.reset_after().as_secs().div_ceil(q.period().as_secs() / 4);
    assert!(d.allowed && d.remaining() == 1, "two failed logins, yet the store counts {counted} units: {d:?}");
}

/// The handler finds who decided in the `Decision`: the store, or the fallback while the
/// store fails.
#[tokio::test]
async fn the_handler_sees_who_decided() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("r", Quota::per_hour(100), key::header("x-key")))
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    // Per request: who decided, as the handler's Decision says.
    type Seen = Vec<Option<DecidedBy>>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let app = {
        let seen = seen.clone();
        tower::service_fn(move |req: http::Request<axum::body::Body>| {
            seen.lock().unwrap().push(req.extensions().get::<Decision>().map(Decision::decided_by));
            async { Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty())) }
        })
    };
    let svc = layer.layer(app);
    let req = || http::Request::get("/").header("x-key", "k").body(axum::body::Body::empty()).unwrap();
    assert_eq!(svc.clone().oneshot(req()).await.unwrap().status(), StatusCode::OK);
    store.set(Mode::Failing);
    assert_eq!(svc.clone().oneshot(req()).await.unwrap().status(), StatusCode::OK);
    assert_eq!(*seen.lock().unwrap(), [Some(DecidedBy::Store), Some(DecidedBy::Fallback)]);
}

/// A block by hand while the store is down (issue 38, item 5): the call fails with the
/// store's error (the operator must ask again), and meanwhile this server refuses the key
/// (its fallback took the block) while letting others through.
#[tokio::test]
async fn a_block_while_the_store_is_down_fails_and_holds_on_this_server() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .add_rule(Rule::new("api", Quota::per_minute(100), user).blockable())
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    store.set(Mode::Failing);
    let err = limiter.block("api", "mallory", Duration::from_secs(3600)).await.unwrap_err();
    assert!(matches!(err, tollgate::StoreError::Unavailable(_)), "{err}");
    let v = limiter.check("mallory").await;
    assert_eq!(v.decided_by(), Some(DecidedBy::Fallback), "{v}");
    assert!(v.is_rejected() && v.retry_after() > Some(Duration::from_secs(3500)), "{v}");
    assert!(limiter.check("ada").await.is_allowed());
}

/// The blocked-key cache answers for a request only when every rejection it holds for the
/// request's rules is fresh: a client over a minute's and an hour's rule whose hour's
/// rejection is due to be asked again (once a second) while the minute's, cached later, is
/// fresh, was told the minute's wait (60 s) from the cache, where the store names the
/// hour's (found as a flake of `fallback_rejections`).
#[tokio::test(start_paused = true)]
async fn the_cache_does_not_answer_with_a_partial_picture() {
    type Pair = (&'static str, &'static str);
    let store = Remote::new(MemoryStore::with_clock(support::fake::TokioClock::new()));
    let limiter = Limiter::<_, Pair>::builder(store.clone())
        .rule("per-minute", Quota::per_minute(1), |p: &Pair| Some(Key::from(p.0)))
        .rule("per-hour", Quota::per_hour(1), |p: &Pair| Some(Key::from(p.1)))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    assert!(limiter.check(&("ak_1", "acct_1")).await.is_allowed());
    // The hour's rule refuses acct_1 (another API key): cached.
    let v = limiter.check(&("ak_2", "acct_1")).await;
    assert_eq!(v.rejected_by().map(|r| r.rule), Some("per-hour"), "{v}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Another account, the first API key: only the minute's refuses; cached 800 ms later.
    let v = limiter.check(&("ak_1", "acct_2")).await;
    assert_eq!(v.rejected_by().map(|r| r.rule), Some("per-minute"), "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The hour's rejection is due to be asked again, the minute's is fresh.
    let v = limiter.check(&("ak_1", "acct_1")).await;
    assert_eq!(v.rejected_by().map(|r| r.rule), Some("per-hour"), "{v}");
    assert!(v.retry_after() > Some(Duration::from_secs(3000)), "{v}");
}
