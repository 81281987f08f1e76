//! The client's own work for a decision on a remote store, with no network: what the
//! layer and `Limiter::check_key` add to the store call they make.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example client_path -- [--runs N] [--only ROW] [--decisions N]
//! # one row and nothing else, for a profiler:
//! perf record -g target/release/examples/client_path --runs 1 --only layer
//! ```
//!
//! The store is `MemoryStore` behind a remote store's interface ([`Remote`]): `as_local`
//! is `None`, so the limiter calls it as it calls `RedisStore` (under the deadline, the
//! in-flight cap and the circuit breaker, the answer awaited), and each call yields to the
//! runtime once before it answers, as a reply read from a socket would. What is measured
//! is therefore everything but Redis and its client: the store row is the decision and
//! that one yield, the others add the limiter's path and the layer's.
//!
//! Rows (GCRA, 100 a minute per key with a burst of 100, 10,000 keys uniform from seed 42,
//! every decision allowed at the default 400,000 decisions; 64 decisions in flight on a current-thread runtime, so the
//! wall time is the client's CPU time):
//! - `store`: `Store::check_one` on [`Remote`];
//! - `check_key`: `Limiter::check_key`, one rule;
//! - `bare`: the same request and service with no layer, and the store row's call: what
//!   the layer row spends outside the layer;
//! - `layer`: `RateLimitLayer` over a service answering at once: the request built with an
//!   `x-api-key` header, called, its response's headers written (the default legacy style).
//!
//! Printed: ns per decision for each row, min–median–max over the runs, and what each adds
//! to the row it builds on, run by run: `check_key` and `bare` to `store`, `layer` to `bare`
//! (the layer's own work).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{HeaderValue, Request, Response, StatusCode};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate::key::{self, Key};
use tollgate::store::{Check, LocalStore, Outcome, Params, Refund, Store};
use tollgate::{Algorithm, Decision, HttpLimiter, MemoryStore, Quota, RateLimitLayer, Rule, StoreError};
use tower::{Layer, Service, ServiceExt};

const IN_FLIGHT: usize = 64;
const KEYS: usize = 10_000;
/// Decisions a row by default (`--decisions N` to change it, e.g. under valgrind).
const DECISIONS: usize = 400_000;
const SEED: u64 = 42;
const HEADER: &str = "x-api-key";
const RULE: &str = "client";

/// `MemoryStore` called as a remote store: no `as_local`, one yield before each answer.
#[derive(Clone, Default)]
struct Remote(MemoryStore);

impl Store for Remote {
    async fn check_one(&self, check: &Check) -> Result<Outcome, StoreError> {
        tokio::task::yield_now().await;
        self.0.check_one_now(check)
    }
    async fn check(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        tokio::task::yield_now().await;
        self.0.check_now(checks)
    }
    async fn refund(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        self.0.refund_now(refunds)
    }
    async fn charge(&self, charges: &[Check]) -> Result<(), StoreError> {
        self.0.charge_now(charges)
    }
    async fn peek(&self, check: &Check) -> Result<Decision, StoreError> {
        self.0.peek_now(check)
    }
    async fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        self.0.reset_now(rule, key, algorithm)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Row {
    Store,
    CheckKey,
    Bare,
    Layer,
}

impl Row {
    const ALL: [Row; 4] = [Row::Store, Row::CheckKey, Row::Bare, Row::Layer];

    fn name(self) -> &'static str {
        match self {
            Row::Store => "store",
            Row::CheckKey => "check_key",
            Row::Bare => "bare",
            Row::Layer => "layer",
        }
    }
}

fn quota() -> Quota {
    Quota::per_minute(100)
}

fn layer(store: Remote) -> RateLimitLayer<Remote> {
    RateLimitLayer::builder(store)
        .add_rule(Rule::new(RULE, quota(), key::header(HEADER)).algorithm(Algorithm::Gcra))
        // A deadline no yield reaches: the row measures the path, not the breaker.
        .timeout(Duration::from_secs(1))
        .build()
        .expect("a valid layer")
}

/// One decision of key `k`: whether it was allowed.
trait Target: Clone + 'static {
    async fn call(&mut self, k: usize) -> bool;
}

#[derive(Clone)]
struct ViaStore {
    store: Remote,
    checks: Arc<[Check]>,
}

impl Target for ViaStore {
    async fn call(&mut self, k: usize) -> bool {
        self.store.check_one(&self.checks[k]).await.is_ok_and(|o| o.decision.allowed)
    }
}

#[derive(Clone)]
struct ViaKey {
    limiter: Arc<HttpLimiter<Remote>>,
    keys: Arc<[Key]>,
}

impl Target for ViaKey {
    async fn call(&mut self, k: usize) -> bool {
        self.limiter.check_key(RULE, self.keys[k].clone(), 1).await.is_allowed()
    }
}

#[derive(Clone)]
struct ViaLayer<S> {
    svc: S,
    keys: Arc<[HeaderValue]>,
}

impl<S> Target for ViaLayer<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + 'static,
{
    async fn call(&mut self, k: usize) -> bool {
        let mut req = Request::new(Body::empty());
        req.headers_mut().insert(HEADER, self.keys[k].clone());
        let Ok(svc) = self.svc.ready().await;
        let Ok(res) = svc.call(req).await;
        res.status() == StatusCode::OK
    }
}

/// The request of `layer`, through the service alone: what the layer's row spends outside
/// the layer (building the request, the task), to take off.
#[derive(Clone)]
struct Bare<S> {
    http: ViaLayer<S>,
    store: ViaStore,
}

impl<S> Target for Bare<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + 'static,
{
    async fn call(&mut self, k: usize) -> bool {
        // The request through the bare service, then the store's answer as the store row takes it.
        let ok = self.http.call(k).await;
        self.store.call(k).await && ok
    }
}

async fn caller<T: Target>(mut target: T, seq: Arc<[u32]>, next: Arc<AtomicUsize>) -> usize {
    let mut allowed = 0;
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(&k) = seq.get(i) else { break };
        allowed += usize::from(target.call(k as usize).await);
    }
    allowed
}

/// ns per decision of `seq` through `target`, 64 in flight.
async fn drive<T: Target>(target: &T, seq: &Arc<[u32]>) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> =
        (0..IN_FLIGHT).map(|_| tokio::task::spawn_local(caller(target.clone(), seq.clone(), next.clone()))).collect();
    let mut allowed = 0;
    for t in tasks {
        allowed += t.await.expect("a caller panicked");
    }
    let ns = started.elapsed().as_nanos() as f64 / seq.len() as f64;
    assert_eq!(allowed, seq.len(), "every decision of the row is allowed (100 a minute, 40 a key)");
    ns
}

/// A fresh store and target for `row`, measured over `seq`.
async fn measure(row: Row, names: &[String], seq: &Arc<[u32]>) -> f64 {
    let store = Remote::default();
    let checks = || -> Arc<[Check]> {
        names
            .iter()
            .map(|n| Check {
                rule: RULE.into(),
                key: Key::from(n.as_str()),
                algorithm: Algorithm::Gcra,
                params: Params::new(quota()),
            })
            .collect()
    };
    let inner = tower::service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let header_keys =
        || -> Arc<[HeaderValue]> { names.iter().map(|n| HeaderValue::from_str(n).expect("ascii")).collect() };
    match row {
        Row::Store => drive(&ViaStore { store, checks: checks() }, seq).await,
        Row::Bare => {
            let (http, store) = (ViaLayer { svc: inner, keys: header_keys() }, ViaStore { store, checks: checks() });
            drive(&Bare { http, store }, seq).await
        }
        Row::CheckKey => {
            let limiter = layer(store).limiter().clone();
            let keys: Vec<Key> = names.iter().map(|n| Key::from(n.as_str())).collect();
            drive(&ViaKey { limiter, keys: keys.into() }, seq).await
        }
        Row::Layer => drive(&ViaLayer { svc: layer(store).layer(inner), keys: header_keys() }, seq).await,
    }
}

fn main() {
    let mut runs = 5;
    let mut only: Option<String> = None;
    let mut decisions = DECISIONS;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).expect("--runs needs a number"),
            "--only" => only = args.next(),
            "--decisions" => decisions = args.next().and_then(|n| n.parse().ok()).expect("--decisions needs a number"),
            other => panic!("unknown argument {other:?}; see the top of bench/client_path.rs"),
        }
    }
    if std::env::var_os("SIZES").is_some() {
        let l = layer(Remote::default());
        let lim = l.limiter().clone();
        let f = lim.check_key(RULE, Key::from("a"), 1);
        println!(
            "check_key future: {} bytes; Verdict {} bytes",
            std::mem::size_of_val(&f),
            std::mem::size_of::<tollgate::Verdict>()
        );
        let inner =
            tower::service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
        let mut svc = l.layer(inner);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async {
            let mut req = Request::new(Body::empty());
            req.headers_mut().insert(HEADER, HeaderValue::from_static("a"));
            let f = svc.call(req);
            println!("layer future: {} bytes", std::mem::size_of_val(&f));
        });
        drop(f);
        return;
    }
    let names: Vec<String> = (0..KEYS).map(|i| format!("user-{i}")).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let seq: Arc<[u32]> = (0..decisions).map(|_| rng.random_range(0..KEYS as u32)).collect();
    let rows: Vec<Row> = Row::ALL.into_iter().filter(|r| only.as_deref().is_none_or(|o| r.name() == o)).collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let local = tokio::task::LocalSet::new();
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    println!("client_path: {decisions} decisions a row, {KEYS} keys, seed {SEED}, {IN_FLIGHT} in flight, {runs} runs");
    for run in 1..=runs {
        for (i, &row) in rows.iter().enumerate() {
            let v = local.block_on(&rt, measure(row, &names, &seq));
            println!("run {run} {:<9} {v:7.0} ns/decision", row.name());
            ns[i].push(v);
        }
    }
    let mmm = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        (s[0], s[s.len() / 2], s[s.len() - 1])
    };
    // What each row adds to the one it builds on, run by run (the same sitting).
    let base = |row: Row| match row {
        Row::Store => None,
        Row::CheckKey | Row::Bare => Some(Row::Store),
        Row::Layer => Some(Row::Bare),
    };
    println!("\n| row | ns/decision (min–median–max) | added to | added, ns (min–median–max) |\n|---|---:|---|---:|");
    for (i, &row) in rows.iter().enumerate() {
        let (lo, med, hi) = mmm(&ns[i]);
        let added = base(row).and_then(|b| rows.iter().position(|&r| r == b)).map(|j| {
            let d: Vec<f64> = ns[i].iter().zip(&ns[j]).map(|(a, b)| a - b).collect();
            let (lo, med, hi) = mmm(&d);
            (rows[j].name(), format!("{lo:.0}–{med:.0}–{hi:.0}"))
        });
        let (to, d) = added.unwrap_or(("—", "—".into()));
        println!("| {} | {lo:.0}–{med:.0}–{hi:.0} | {to} | {d} |", row.name());
    }
}
