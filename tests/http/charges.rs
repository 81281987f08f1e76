//! Charges: units a response reports after the work (`Charge`, for `Rule::charged`
//! rules) and `Limiter::charge`. Each rule's units are taken by whoever decided that rule
//! (the store, or the fallback limiter while the store fails; an enforced and a shadow
//! rule may be decided by different ones); an in-process limiter takes them at once,
//! untimed, with no tokio runtime (or no timer) needed; a remote store's part runs under
//! the deadline; a charge that cannot be taken is logged and counted.
#![cfg(all(feature = "memory", feature = "metrics"))]

use crate::support;

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use support::fake::{settle, Mode, Remote};
use support::{counter, llm, YieldOnce};
use tollgate::key::{self, Key, KeyExtractor};
use tollgate::store::Params;
use tollgate::store::{Check, Store};
use tollgate::store::{Outcome, Refund};
use tollgate::{Algorithm, Decision, Limiter, MemoryStore, Quota, RateLimitLayer, Rule, StoreError};
use tower::{Layer, ServiceExt};

fn prompt(user: &str, tokens: u64) -> Request<Body> {
    Request::post("/").header("x-key", user).header("x-tokens", tokens.to_string()).body(Body::empty()).unwrap()
}

/// Runs `f` with a Prometheus recorder of its own; returns what `f` returned and the scrape.
fn with_metrics<T>(f: impl FnOnce() -> T) -> (T, String) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let out = metrics::with_local_recorder(&recorder, f);
    (out, handle.render())
}

fn failures(scrape: &str, rule: &str) -> f64 {
    counter(scrape, "tollgate_charge_failures_total", &[&format!("rule=\"{rule}\"")])
}

/// What is left of 100 a minute for `rule` and `key` in `store`, one more unit counted.
async fn remaining(store: &MemoryStore, rule: &str, key: &str) -> u64 {
    let check = Check {
        rule: rule.into(),
        key: key.into(),
        algorithm: Algorithm::default(),
        params: Params::new(Quota::per_minute(100)),
    };
    store.peek(&check).await.unwrap().remaining()
}

/// Polls `f` to completion with no runtime (every future here wakes itself).
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000 {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
    }
    panic!("not ready");
}

// ---------------------------------------------------------------------------------------
// Whoever decided a rule takes its charge

/// Only a charged shadow rule applies, and the fallback decides it while the store fails:
/// the fallback takes the charge (it used to go to the failing store, by the verdict's
/// source, which had no enforced rule to be decided by).
#[tokio::test]
async fn a_shadow_rules_charge_goes_to_the_fallback_that_decided_it() {
    let store = Remote::new(MemoryStore::new());
    store.set(Mode::Failing);
    let fallback = MemoryStore::new();
    let limiter = Limiter::builder(store)
        .add_rule(Rule::new("tokens", Quota::per_minute(100), |u: &str| Some(Key::from(u))).charged().shadow(true))
        .fallback(fallback.clone())
        .servers(1)
        .build()
        .unwrap();
    let verdict = limiter.check("ada").await;
    assert!(verdict.is_allowed());
    assert_eq!(verdict.decided_by(), None, "no enforced rule: nothing was decided");
    limiter.charge(&verdict, 30).await.unwrap();
    assert_eq!(remaining(&fallback, "tokens", "ada").await, 69);
}

/// The same through the layer, after a response: taken by the fallback, nothing failed.
#[test]
fn a_shadow_rules_charge_after_a_response_goes_to_the_fallback() {
    let (left, scrape) = with_metrics(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = Remote::new(MemoryStore::new());
            store.set(Mode::Failing);
            let fallback = MemoryStore::new();
            let svc = RateLimitLayer::builder(store)
                .add_rule(Rule::new("tokens", Quota::per_minute(100), key::header("x-key")).charged().shadow(true))
                .fallback(fallback.clone())
                .servers(1)
                .build()
                .unwrap()
                .layer(llm());
            assert_eq!(svc.clone().oneshot(prompt("ada", 30)).await.unwrap().status(), StatusCode::OK);
            settle().await;
            remaining(&fallback, "tokens", "ada").await
        })
    });
    assert_eq!(failures(&scrape, "tokens"), 0.0, "{scrape}");
    assert_eq!(left, 69, "the fallback that decided was not charged");
}

/// A remote store whose calls naming the rule "tokens" fail (its node is down) and whose
/// other calls are answered: a cluster with one node down.
#[derive(Clone)]
struct OneNodeDown(MemoryStore);

impl OneNodeDown {
    fn down(checks: &[Check]) -> bool {
        checks.iter().any(|c| &*c.rule == "tokens")
    }
}

impl Store for OneNodeDown {
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        std::future::ready(if Self::down(checks) {
            Err(StoreError::Unavailable("node down".into()))
        } else {
            self.0.check_at(checks, self.0.now_micros()).map(|os| os.into_iter().map(Some).collect())
        })
    }
    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(if Self::down(charges) {
            Err(StoreError::Unavailable("node down".into()))
        } else {
            self.0.charge_at(charges, self.0.now_micros())
        })
    }
    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.refund(refunds)
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.0.peek(check)
    }
    fn reset(&self, rule: &str, key: &Key, a: Algorithm) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.reset(rule, key, a)
    }
}

/// The enforced rule's node is down: the one call of the enforced and the shadow rule
/// fails, and the fallback decides both; each rule's charge goes to the fallback, once,
/// and none to the store.
#[tokio::test]
async fn a_charge_goes_to_whoever_decided_each_rule() {
    let (inner, fallback) = (MemoryStore::new(), MemoryStore::new());
    let limiter = Limiter::builder(OneNodeDown(inner.clone()))
        .add_rule(Rule::new("tokens", Quota::per_minute(100), |u: &str| Some(Key::from(u))).charged())
        .add_rule(
            Rule::new("shadow-tokens", Quota::per_minute(100), |u: &str| Some(Key::from(u))).charged().shadow(true),
        )
        .fallback(fallback.clone())
        .servers(1)
        .build()
        .unwrap();
    let verdict = limiter.check("ada").await;
    assert!(verdict.is_allowed());
    assert_eq!(verdict.decided_by(), Some(tollgate::verdict::DecidedBy::Fallback));
    limiter.charge(&verdict, 30).await.unwrap();
    assert_eq!(remaining(&inner, "shadow-tokens", "ada").await, 99, "the store decided nothing");
    assert_eq!(remaining(&fallback, "tokens", "ada").await, 69, "the fallback decided the enforced rule");
    assert_eq!(remaining(&fallback, "shadow-tokens", "ada").await, 69, "and the shadow rule, in the same call");
}

// ---------------------------------------------------------------------------------------
// In-process charges: at once and untimed; remote ones under the deadline; never lost
// silently

/// A remote store deciding through `MemoryStore` whose charge needs one more poll, or,
/// with `hang`, never answers.
#[derive(Clone)]
struct LazyCharge {
    inner: MemoryStore,
    hang: bool,
}

impl Store for LazyCharge {
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        self.inner.check(checks)
    }
    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.refund(refunds)
    }
    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (inner, charges, hang) = (self.inner.clone(), charges.to_vec(), self.hang);
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            YieldOnce(false).await;
            inner.charge(&charges).await
        }
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.inner.peek(check)
    }
    fn reset(&self, rule: &str, key: &Key, a: Algorithm) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(rule, key, a)
    }
}

fn tokens<I: ?Sized>(key: impl KeyExtractor<I>) -> Rule<I> {
    Rule::new("tokens", Quota::per_minute(100), key).charged()
}

/// `Limiter::charge` to a remote store ends at the deadline.
#[tokio::test(start_paused = true)]
async fn limiter_charge_keeps_its_deadline() {
    let remote = LazyCharge { inner: MemoryStore::new(), hang: true };
    let limiter = Limiter::builder(remote)
        .add_rule(tokens(|u: &str| Some(Key::from(u))))
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let verdict = limiter.check("ada").await;
    let r = tokio::time::timeout(Duration::from_secs(5), limiter.charge(&verdict, 10)).await;
    assert!(matches!(r, Ok(Err(StoreError::Timeout(_)))), "{r:?}");
}

/// After a response, a remote store's hanging charge ends at the deadline and is counted.
#[test]
fn a_hanging_charge_after_a_response_is_counted() {
    let ((), scrape) = with_metrics(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(async {
            let remote = LazyCharge { inner: MemoryStore::new(), hang: true };
            let svc = RateLimitLayer::builder(remote)
                .add_rule(tokens(key::header("x-key")))
                .timeout(Duration::from_millis(50))
                .build()
                .unwrap()
                .layer(llm());
            assert_eq!(svc.oneshot(prompt("ada", 30)).await.unwrap().status(), StatusCode::OK);
            tokio::time::sleep(Duration::from_secs(1)).await;
            settle().await;
        });
    });
    assert_eq!(failures(&scrape, "tokens"), 1.0, "{scrape}");
}

/// `MemoryStore` charges need no runtime, through `Limiter::charge` and after a response.
#[test]
fn a_memory_store_charge_needs_no_runtime() {
    let limiter = Limiter::builder(MemoryStore::new()).add_rule(tokens(|u: &str| Some(Key::from(u)))).build().unwrap();
    let verdict = block_on(limiter.check("ada"));
    block_on(limiter.charge(&verdict, 101)).unwrap();
    assert!(block_on(limiter.check("ada")).is_rejected());

    let layer = RateLimitLayer::builder(MemoryStore::new()).add_rule(tokens(key::header("x-key"))).build().unwrap();
    let svc = layer.layer(llm());
    assert_eq!(block_on(svc.clone().oneshot(prompt("ada", 101))).unwrap().status(), StatusCode::OK);
    assert_eq!(block_on(svc.oneshot(prompt("ada", 1))).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A runtime built without timers (no `enable_time`) still takes `MemoryStore` charges:
/// an in-process charge ready at once builds no timer.
#[test]
fn a_memory_store_charge_needs_no_timer() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let limiter =
            Limiter::builder(MemoryStore::new()).add_rule(tokens(|u: &str| Some(Key::from(u)))).build().unwrap();
        let verdict = limiter.check("ada").await;
        limiter.charge(&verdict, 101).await.unwrap();
        assert!(limiter.check("ada").await.is_rejected());

        let layer = RateLimitLayer::builder(MemoryStore::new()).add_rule(tokens(key::header("x-key"))).build().unwrap();
        let svc = layer.layer(llm());
        let first = tokio::spawn(svc.clone().oneshot(prompt("ada", 101))).await;
        assert_eq!(first.expect("the request panicked").unwrap().status(), StatusCode::OK);
        assert_eq!(svc.oneshot(prompt("ada", 1)).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    });
}

/// A refund to a remote store that the runtime drops before the store answers (it shut
/// down) is counted and logged, not lost without a word.
#[test]
fn a_give_back_dropped_by_a_runtime_shutdown_is_counted() {
    let ((), scrape) = with_metrics(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = HangingRefund(MemoryStore::new());
        let limiter = Limiter::builder(store)
            .rule("queue", Quota::per_second(1), |_: &str| Some(Key::from("k")))
            .algorithm(Algorithm::LeakyBucket)
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(limiter.check("first").await.is_allowed());
            // The second waits a second for its slot; dropped while it waits, it gives
            // its slot back, in a task, to a store that now hangs.
            let waited =
                tokio::time::timeout(Duration::from_millis(10), limiter.wait("second", Duration::from_secs(5))).await;
            assert!(waited.is_err());
            tokio::task::yield_now().await;
        });
        drop(rt);
    });
    let lost = counter(&scrape, "tollgate_refund_failures_total", &["rule=\"queue\""]);
    assert_eq!(lost, 1.0, "{scrape}");
}

/// A remote store whose refunds never answer.
#[derive(Clone)]
struct HangingRefund(MemoryStore);

impl Store for HangingRefund {
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        std::future::ready(tollgate::store::LocalStore::check_now(&self.0, checks))
    }
    fn refund(&self, _: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::pending()
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.0.peek(check)
    }
    fn reset(&self, rule: &str, key: &Key, a: Algorithm) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.reset(rule, key, a)
    }
}
