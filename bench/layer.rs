//! Nanoseconds per request through the layer's service, with no network: what
//! `RateLimitLayer` adds to a request, against the bare service and tower_governor in the
//! same run.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench layer
//! cargo bench -p tollgate-bench --bench layer -- --warm-up-time 1 --measurement-time 3 'allowed'
//! # one configuration, 100,000 requests and no criterion, for a profiler (callgrind):
//! PROFILE=allowed/tollgate/gcra valgrind --tool=callgrind target/release/deps/layer-<hash> --bench
//! ```
//!
//! Each iteration builds a request carrying one of 10,000 `x-api-key` values (round
//! robin), calls the service and polls its future once: the inner service answers at once,
//! and so does `MemoryStore`, so the future must be ready (the benchmark panics if not).
//! The service is `http_bench`'s axum router (one route answering "hello"), bare or with
//! the layer; `http_bench` measures the same over real TCP, where the kernel's share
//! dilutes the layer's, and this one shows the layer's own cost.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{HeaderValue, Request, Response};
use tollgate::{key, Algorithm, MemoryStore, Quota, RateLimitLayer};
use tollgate_bench::http::{hello, tower_governor};
use tower::Service;

const KEYS: usize = 10_000;

fn keys() -> Vec<HeaderValue> {
    (0..KEYS).map(|i| HeaderValue::try_from(format!("ak_{i:016x}")).expect("ascii")).collect()
}

/// Calls `svc` once with key `i` and returns the status; the future must be ready.
fn once<S>(svc: &mut S, keys: &[HeaderValue], i: usize) -> u16
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut req = Request::new(Body::empty());
    req.headers_mut().insert("x-api-key", keys[i % KEYS].clone());
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready(), "the service is always ready");
    let mut fut = pin!(svc.call(req));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(res) => res.expect("infallible").status().as_u16(),
        Poll::Pending => panic!("the in-process path must answer at once"),
    }
}

fn run<S>(c: &mut Criterion, group: &str, name: &str, mut svc: S, expect: u16)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let keys = keys();
    if let Ok(only) = std::env::var("PROFILE") {
        if only == format!("{group}/{name}") {
            for i in 0..100_000 {
                black_box(once(&mut svc, &keys, i));
            }
        }
        return;
    }
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    let mut i = 0;
    // Warm every key (the low quota's keys are then rejected throughout).
    for k in 0..KEYS {
        once(&mut svc, &keys, k);
    }
    assert_eq!(once(&mut svc, &keys, 0), expect, "{group}/{name}");
    g.bench_function(name, |b| {
        b.iter(|| {
            i += 1;
            black_box(once(&mut svc, &keys, i))
        });
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let paths = [("allowed", Quota::per_minute(1_000_000_000), 200), ("rejected", Quota::per_minute(1), 429)];
    for (group, quota, status) in paths {
        if status == 200 {
            run(c, group, "bare", hello(), 200);
        }
        for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::Gcra] {
            let layer = RateLimitLayer::builder(MemoryStore::new())
                .rule("default", quota, key::header("x-api-key"))
                .algorithm(algorithm)
                .build()
                .unwrap();
            run(c, group, &format!("tollgate/{algorithm}"), hello().layer(layer), status);
        }
        run(c, group, "tower_governor", hello().layer(tower_governor(quota).expect("a valid quota")), status);
    }
}

criterion_group!(layer, benches);
criterion_main!(layer);
