//! The fallback (issue 26), as a fresh reviewer tried to break it: what it admits and
//! charges reaches the store, a refund of its units reaches the store's copy of them, a
//! shadow rule never lifts an enforced limit, a full fallback refuses rather than passes,
//! and a write-back that fails on one node charges the others once.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::fake::{settle, Mode, Remote, T0};
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{Check, Outcome, Params, Refund, Store};
use tollgate::verdict::DecidedBy;
use tollgate::{Algorithm, Decision, Limiter, MemoryStore, Quota, Rule, StoreError};

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

/// What the store says remains of (rule, key) under `quota` (GCRA).
async fn remaining<S: Store>(store: &S, rule: &str, key: &str, quota: Quota) -> u64 {
    let check =
        Check { rule: rule.into(), key: key.into(), algorithm: Algorithm::default(), params: Params::new(quota) };
    Store::peek(store, &check).await.unwrap().remaining()
}

/// A late call the store admitted holds the store's copy of the fallback's units: the
/// refund of the request gives both back.
#[tokio::test(start_paused = true)]
async fn a_refund_after_a_late_admission_reaches_the_store() {
    let q = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", q, user)
        .servers(1)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let fresh = remaining(&store, "r", "k", q).await;
    store.set(Mode::Relayed(Duration::from_millis(100)));
    for _ in 0..5 {
        let v = limiter.check("k").await;
        assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
        tokio::time::sleep(Duration::from_millis(200)).await; // the late answer comes
        limiter.refund(v).await.unwrap();
    }
    let left = remaining(&store, "r", "k", q).await;
    assert_eq!(left, fresh, "5 requests refunded, but the store still counts {} of them", fresh - left);
}

/// A shadow rule that the fallback rejects refuses nothing: the late call's units of the
/// enforced rule stay in the store (they were given back when any rejection counted).
#[tokio::test(start_paused = true)]
async fn a_shadow_rejection_does_not_refund_the_enforced_rule() {
    let q = Quota::per_hour(100);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", q, user)
        .add_rule(Rule::new("s", Quota::per_hour(1), user).shadow(true))
        .servers(1)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let fresh = remaining(&store, "r", "k", q).await;
    store.set(Mode::Relayed(Duration::from_millis(100)));
    let mut admitted = 0;
    for _ in 0..5 {
        let v = limiter.check("k").await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Fallback));
        if v.is_allowed() {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(admitted, 5, "a shadow rule never refuses");
    let used = fresh - remaining(&store, "r", "k", q).await;
    assert_eq!(
        used,
        5,
        "5 admitted, the store counts {used} for the enforced rule; refunds: {:?}",
        store.refunds().iter().map(|r| (r.check.rule.to_string(), r.check.params.cost)).collect::<Vec<_>>()
    );
}

/// A charged rule: what the fallback charged after the response reaches the store too,
/// once it answers (the first decision after the outage may not see it yet: it is
/// written back with the store's first answer).
#[tokio::test]
async fn charges_taken_by_the_fallback_reach_the_store() {
    let q = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .add_rule(Rule::new("tokens", q, user).charged())
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)))
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    store.set(Mode::Failing);
    let v = limiter.check("k").await;
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
    limiter.charge(&v, 10).await.unwrap();
    settle().await;
    store.set(Mode::Up);
    assert_eq!(limiter.check("k").await.decided_by(), Some(DecidedBy::Store));
    settle().await;
    let v = limiter.check("k").await;
    let left = v.decisions().next().map(|d| d.decision.remaining());
    assert_eq!(left, Some(0), "the fallback's 10 tokens reached the store: {v:?}");
}

/// A charged rule: the store said 10 remain, this server charged 10 to the store, then
/// the store fails: the charge lowered the fallback's share of what remains, and the
/// fallback admits no more.
#[tokio::test]
async fn a_share_counts_the_charges_after_it() {
    let q = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .add_rule(Rule::new("tokens", q, user).charged())
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)))
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let mut used = 0;
    let v = limiter.check("k").await;
    assert!(v.is_allowed());
    limiter.charge(&v, 10).await.unwrap();
    used += 10;
    store.set(Mode::Failing);
    let v = limiter.check("k").await;
    if v.is_allowed() {
        limiter.charge(&v, 10).await.unwrap();
        used += 10;
    }
    assert!(used <= 11, "{used} tokens admitted for a limit of 10 an hour on one server ({v:?})");
}

/// A login rule counting only 401s (`count_if`): while the circuit is open, 10
/// successful logins (200) are admitted by the fallback; each 200 gives its unit back,
/// also out of what waits to be written back to the store. When the store is back, a
/// user with no failed login is not locked out.
#[tokio::test(start_paused = true)]
async fn successful_logins_during_an_outage_do_not_lock_the_user_out() {
    use http::StatusCode;
    use tollgate::{key, RateLimitLayer};
    use tower::{Layer, ServiceExt};
    let store = Remote::new(MemoryStore::with_clock(support::fake::TokioClock::new()));
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(
            Rule::new("login", Quota::per_hour(3), key::header("x-key")).count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .servers(1)
        .circuit_breaker(1, Duration::from_secs(2))
        .build()
        .unwrap();
    let svc = layer.layer(crate::common::app(Default::default()));
    let req = |k: &str| http::Request::get("/").header("x-key", k).body(axum::body::Body::empty()).unwrap();
    store.set(Mode::Failing);
    let _ = svc.clone().oneshot(req("opener")).await.unwrap();
    store.set(Mode::Up);
    for i in 0..10 {
        let res = svc.clone().oneshot(req("ada")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "login {i} during the outage");
        settle().await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // the circuit closes
    let res = svc.clone().oneshot(req("ada")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "no login of ada ever failed, yet she is locked out");
}

/// A full fallback (a flood of new keys while the store fails) refuses a key it cannot
/// count, rather than pass it unlimited.
#[tokio::test]
async fn a_full_fallback_does_not_pass_a_key_unlimited() {
    let q = Quota::per_hour(5);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", q, user)
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)).max_keys(32))
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    store.set(Mode::Failing);
    for i in 0..64 {
        let _ = limiter.check(&format!("spray{i}")).await;
    }
    let mut admitted = 0;
    for _ in 0..50 {
        let v = limiter.check("victim").await;
        if v.is_allowed() {
            admitted += 1;
        }
    }
    assert!(admitted <= 5, "{admitted} of 50 admitted for a limit of 5");
}

/// A store of several nodes (a Redis Cluster) with the node of some keys down: a call
/// about them fails with `NodeUnavailable`, a charge is taken slot by slot (what
/// `RedisStore::charge` does: `per_slot`, each slot on its own) and fails if any slot
/// does.
#[derive(Clone)]
struct Slotted {
    inner: MemoryStore,
    dead: std::sync::Arc<std::sync::Mutex<Vec<Key>>>,
}

impl Slotted {
    fn dead(&self, checks: &[Check]) -> bool {
        let dead = self.dead.lock().unwrap();
        checks.iter().any(|c| dead.contains(&c.key))
    }
}

impl Store for Slotted {
    async fn check(&self, checks: &[Check]) -> Result<Vec<Option<tollgate::store::Outcome>>, tollgate::StoreError> {
        if self.dead(checks) {
            return Err(tollgate::StoreError::NodeUnavailable("node down".into()));
        }
        Store::check(&self.inner, checks).await
    }
    async fn refund(&self, refunds: &[tollgate::store::Refund]) -> Result<(), tollgate::StoreError> {
        Store::refund(&self.inner, refunds).await
    }
    async fn charge(&self, charges: &[Check]) -> Result<(), tollgate::StoreError> {
        let live: Vec<Check> = charges.iter().filter(|c| !self.dead(std::slice::from_ref(c))).cloned().collect();
        Store::charge(&self.inner, &live).await?;
        if live.len() < charges.len() {
            return Err(tollgate::StoreError::NodeUnavailable("node down".into()));
        }
        Ok(())
    }
    async fn peek(&self, check: &Check) -> Result<tollgate::Decision, tollgate::StoreError> {
        Store::peek(&self.inner, check).await
    }
    async fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), tollgate::StoreError> {
        Store::reset(&self.inner, rule, key, algorithm).await
    }
}

/// One request on two keys, one of them on a dead node, admitted by the fallback: its
/// write-back charges the live key once (check by check), and keeps only the dead one.
#[tokio::test]
async fn a_partly_failed_write_back_does_not_charge_the_live_keys_again() {
    let q = Quota::per_hour(100);
    let store = Slotted { inner: MemoryStore::with_clock(ManualClock::new(T0)), dead: Default::default() };
    store.dead.lock().unwrap().push(Key::from("ada"));
    let limiter = Limiter::builder(store.clone())
        .rule("per-ip", q, |_: &str| Some(Key::from("10.0.0.1")))
        .rule("per-user", q, user)
        .servers(1)
        .build()
        .unwrap();
    let v = limiter.check("ada").await;
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
    settle().await;
    for _ in 0..20 {
        let v = limiter.check("bob").await;
        assert_eq!(v.decided_by(), Some(DecidedBy::Store));
        settle().await;
    }
    let check = Check {
        rule: "per-ip".into(),
        key: "10.0.0.1".into(),
        algorithm: Algorithm::default(),
        params: Params::new(q),
    };
    let left = Store::peek(&store, &check).await.unwrap().remaining();
    // 21 admitted on the IP (one by the fallback, 20 by the store); a peek decides one more.
    assert_eq!(100 - left - 1, 21, "the store counts {} for 21 requests on the IP", 100 - left - 1);
}

/// The same as an over-admission: enforced L = 10 an hour on one server, a stricter
/// shadow rule (1 an hour) being trialled; the store slow (answers after 100 ms, deadline
/// 50 ms) for 30 requests, then fast for 30 more.
#[tokio::test(start_paused = true)]
async fn a_shadow_rule_in_trial_does_not_lift_the_enforced_limit() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", Quota::per_hour(10), user)
        .add_rule(Rule::new("s", Quota::per_hour(1), user).shadow(true))
        .servers(1)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let (admitted, slow) = slow_then_fast(&limiter, &store).await;
    assert!(admitted <= 11, "{admitted} admitted ({slow} while slow) for a limit of 10 an hour on one server");
}

/// 30 checks of one key while `store` answers after 100 ms (200 ms apart), then 30 while it
/// answers at once: how many were admitted, and how many of them while it was slow.
async fn slow_then_fast(limiter: &Limiter<Remote, str>, store: &Remote) -> (usize, usize) {
    let mut admitted = 0;
    store.set(Mode::Relayed(Duration::from_millis(100)));
    for _ in 0..30 {
        admitted += usize::from(limiter.check("k").await.is_allowed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let slow = admitted;
    store.set(Mode::Up);
    for _ in 0..30 {
        admitted += usize::from(limiter.check("k").await.is_allowed());
    }
    (admitted, slow)
}

/// The same without the shadow rule: a slow store's late answers keep one server within
/// its limit.
#[tokio::test(start_paused = true)]
async fn a_slow_store_keeps_one_server_within_its_limit() {
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .rule("r", Quota::per_hour(10), user)
        .servers(1)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let (admitted, slow) = slow_then_fast(&limiter, &store).await;
    assert!(admitted <= 11, "{admitted} admitted ({slow} while slow) for a limit of 10 an hour on one server");
}

/// A login rule counting 401s: Ada's slow logins are admitted by the fallback while the
/// store fails; the store comes back (another user's request is decided by it, and what
/// waits is written back) while her logins still run; then they succeed (200). Her units
/// waited for their status: none reached the store.
#[tokio::test(start_paused = true)]
async fn a_count_if_refund_after_the_write_back_reaches_the_store() {
    use http::StatusCode;
    use tokio::sync::Notify;
    use tollgate::{key, RateLimitLayer};
    use tower::{Layer, ServiceExt};
    let q = Quota::per_hour(3);
    let store = Remote::new(MemoryStore::with_clock(support::fake::TokioClock::new()));
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("login", q, key::header("x-key")).count_if(|s| s == StatusCode::UNAUTHORIZED))
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(2))
        .build()
        .unwrap();
    let go = Arc::new(Notify::new());
    let svc = layer.layer(crate::common::app(go.clone()));
    let req =
        |path: &str, k: &str| http::Request::get(path).header("x-key", k).body(axum::body::Body::empty()).unwrap();
    let fresh = remaining(&store, "login", "ada", q).await;
    store.set(Mode::Failing);
    // Three slow logins of ada, admitted by the fallback (share 3 of 3).
    let mut running = Vec::new();
    for _ in 0..3 {
        let svc = svc.clone();
        let r = req("/slow", "ada");
        running.push(tokio::spawn(async move { svc.oneshot(r).await.unwrap().status() }));
        settle().await;
    }
    store.set(Mode::Up);
    let res = svc.clone().oneshot(req("/", "bob")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    settle().await; // the write-back of ada's three units runs
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Her three logins succeed: 200, nothing counts.
    go.notify_waiters();
    for r in running {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    settle().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let left = remaining(&store, "login", "ada", q).await;
    let res = svc.clone().oneshot(req("/", "ada")).await.unwrap();
    assert_eq!(
        left,
        fresh,
        "no login of ada failed, yet the store counts (at least) {} of her units (next login: {})",
        fresh - left,
        res.status()
    );
}

/// A count-by-outcome unit the fallback admitted, refunded before the store comes back:
/// it never reaches the store (the write-back skips it).
#[tokio::test]
async fn a_refund_before_the_write_back_keeps_the_unit_out_of_the_store() {
    let q = Quota::per_hour(10);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .add_rule(Rule::new("login", q, user).count_if(|s| s.as_u16() == 401))
        .servers(1)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let fresh = remaining(&store, "login", "ada", q).await;
    store.set(Mode::Failing);
    let v = limiter.check("ada").await;
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
    limiter.refund(v).await.unwrap();
    let kept = limiter.check("ada").await;
    assert!(kept.is_allowed() && kept.decided_by() == Some(DecidedBy::Fallback), "{kept:?}");
    store.set(Mode::Up);
    assert_eq!(limiter.check("bob").await.decided_by(), Some(DecidedBy::Store));
    settle().await; // what waits is written back: the kept unit, not the refunded one
    let left = remaining(&store, "login", "ada", q).await;
    assert_eq!(fresh - left, 1, "the store counts {} unit(s) for one kept", fresh - left);
}

/// What a [`Dropping`] store does with the next calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum M {
    Up,
    /// Answers nothing for this long, then the connection drops: `Unavailable`
    /// (a Redis connection reset while the command sat in the socket buffer).
    DropsAfter(Duration),
}

/// A remote-like store whose calls may hang and then fail with a connection error.
#[derive(Clone)]
struct Dropping {
    inner: MemoryStore,
    mode: Arc<Mutex<M>>,
}

impl Dropping {
    fn new() -> Self {
        Self { inner: MemoryStore::with_clock(ManualClock::new(T0)), mode: Arc::new(Mutex::new(M::Up)) }
    }
    fn set(&self, m: M) {
        *self.mode.lock().unwrap() = m;
    }
    async fn gate(&self) -> Result<(), StoreError> {
        let m = *self.mode.lock().unwrap();
        match m {
            M::Up => Ok(()),
            M::DropsAfter(d) => {
                tokio::time::sleep(d).await;
                Err(StoreError::Unavailable("connection reset by peer".into()))
            }
        }
    }
}

impl Store for Dropping {
    async fn check_one(&self, check: &Check) -> Result<Outcome, StoreError> {
        self.gate().await?;
        Store::check_one(&self.inner, check).await
    }
    async fn check(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        self.gate().await?;
        Store::check(&self.inner, checks).await
    }
    async fn refund(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        Store::refund(&self.inner, refunds).await
    }
    async fn charge(&self, charges: &[Check]) -> Result<(), StoreError> {
        self.gate().await?;
        Store::charge(&self.inner, charges).await
    }
    async fn peek(&self, check: &Check) -> Result<Decision, StoreError> {
        Store::peek(&self.inner, check).await
    }
    async fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        Store::reset(&self.inner, rule, key, algorithm).await
    }
}

/// Units a verdict of `rule` (limit `q`, key "ada") kept, admitted by the fallback while
/// the store's call was cut by the deadline and later failed with a connection error, as
/// the store counts them once it answers again.
async fn written_back_after_a_dropped_late_call(rule: Rule<str>, q: Quota) -> u64 {
    let store = Dropping::new();
    let limiter = Limiter::builder(store.clone())
        .add_rule(rule)
        .servers(1)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let fresh = remaining(&store, "login", "ada", q).await;
    store.set(M::DropsAfter(Duration::from_millis(100)));
    let v = limiter.check("ada").await;
    assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
    // The verdict is kept (never refunded). The late call fails after 100 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    settle().await;
    store.set(M::Up);
    assert_eq!(limiter.check("bob").await.decided_by(), Some(DecidedBy::Store));
    settle().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    settle().await;
    fresh - remaining(&store, "login", "ada", q).await
}

/// `check()` of a count_if rule, handed to its caller (kept), while the store's call is
/// cut by the deadline and later fails with a connection error: the fallback's unit must
/// be written back once the store answers again.
#[tokio::test(start_paused = true)]
async fn a_kept_count_if_unit_whose_late_call_fails_is_written_back() {
    let q = Quota::per_hour(10);
    let counted =
        written_back_after_a_dropped_late_call(Rule::new("login", q, user).count_if(|s| s.as_u16() == 401), q).await;
    assert_eq!(counted, 1, "a kept count_if unit admitted by the fallback: the store counts {counted}");
}

/// The same through the layer: a 401 (counts) answered before the late call fails.
#[tokio::test(start_paused = true)]
async fn a_counted_response_whose_late_call_fails_is_written_back() {
    use http::StatusCode;
    use tollgate::{key, RateLimitLayer};
    use tower::{Layer, ServiceExt};
    let q = Quota::per_hour(10);
    let store = Dropping::new();
    let layer = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new("login", q, key::header("x-key")).count_if(|s| s == StatusCode::UNAUTHORIZED))
        .servers(1)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let svc = layer.layer(crate::common::app(Default::default()));
    let req =
        |path: &str, k: &str| http::Request::get(path).header("x-key", k).body(axum::body::Body::empty()).unwrap();
    let fresh = remaining(&store, "login", "ada", q).await;
    store.set(M::DropsAfter(Duration::from_millis(100)));
    for _ in 0..3 {
        let res = svc.clone().oneshot(req("/fail", "ada")).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    settle().await;
    store.set(M::Up);
    let res = svc.clone().oneshot(req("/", "bob")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    settle().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    settle().await;
    let left = remaining(&store, "login", "ada", q).await;
    assert_eq!(fresh - left, 3, "3 failed logins (401) admitted by the fallback: the store counts {}", fresh - left);
}

/// The same for a plain rule.
#[tokio::test(start_paused = true)]
async fn a_plain_unit_whose_late_call_fails_is_written_back() {
    let q = Quota::per_hour(10);
    let counted = written_back_after_a_dropped_late_call(Rule::new("login", q, user), q).await;
    assert_eq!(counted, 1, "the store counts {counted}");
}

/// Charges after fallback-admitted work, while the store hangs with its circuit open:
/// their write-backs take the slots of calls left running (at most `max_in_flight`); the
/// rest waits for the store's next answer.
#[tokio::test(start_paused = true)]
async fn write_backs_of_the_fallbacks_charges_take_a_slot() {
    use support::fake::{Mode, Remote};
    let q = Quota::per_hour(1_000_000);
    let store = Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let limiter = Limiter::builder(store.clone())
        .add_rule(Rule::new("tokens", q, user).charged())
        .servers(1)
        .timeout(Duration::from_millis(50))
        .max_in_flight(2)
        .circuit_breaker(1, Duration::from_secs(60))
        .build()
        .unwrap();
    store.set(Mode::Hanging);
    let v = limiter.check("ada").await; // times out: the circuit opens
    assert_eq!(v.decided_by(), Some(DecidedBy::Fallback));
    let before = store.checks();
    for _ in 0..500 {
        let v = limiter.check("ada").await;
        assert!(v.is_allowed() && v.decided_by() == Some(DecidedBy::Fallback), "{v:?}");
        limiter.charge(&v, 1).await.unwrap();
    }
    settle().await;
    let calls = store.checks() - before;
    assert!(calls <= 2, "{calls} store calls to a hanging store whose circuit is open (max_in_flight 2)");
}
