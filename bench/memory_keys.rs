//! How `MemoryStore`'s cost per decision grows with the number of live keys, against
//! governor's keyed limiter on the same keys: GCRA, 1 thread, 1,000,000/min (every decision
//! allowed), keys visited round robin.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example memory_keys               # 100, 1,000, 10,000 and 100,000 keys
//! cargo run --release -p tollgate-bench --example memory_keys -- 30000000   # decisions per measurement (default 10 M)
//! ```
//!
//! Each key count is measured for tollgate then governor, twice, interleaved; the table
//! shows ns per decision (the better of the two) and governor ns / tollgate ns. Wall-clock
//! timing on a shared machine: compare the two columns of one run, not runs.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tollgate::store::Params;
use tollgate::store::{Check, Store};
use tollgate::{Algorithm, MemoryStore, Quota};

const PER_MINUTE: u32 = 1_000_000;

fn tollgate_ns(keys: &[String], decisions: usize) -> f64 {
    let store = MemoryStore::new();
    let quota = Quota::per_minute(u64::from(PER_MINUTE));
    let checks: Vec<Check> = keys
        .iter()
        .map(|k| Check {
            rule: "bench".into(),
            key: k.as_str().into(),
            algorithm: Algorithm::Gcra,
            params: Params::new(quota),
        })
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    let mut decide = |c: &Check| match pin!(store.check_one(black_box(c))).poll(&mut cx) {
        Poll::Ready(Ok(o)) => o.decision.allowed,
        other => panic!("MemoryStore answered {other:?}"),
    };
    checks.iter().for_each(|c| assert!(decide(c)));
    let started = Instant::now();
    let allowed = (0..decisions).filter(|i| decide(&checks[i % checks.len()])).count();
    let ns = started.elapsed().as_nanos() as f64 / decisions as f64;
    assert_eq!(allowed, decisions, "every decision is allowed at this quota");
    ns
}

fn governor_ns(keys: &[String], decisions: usize) -> f64 {
    let quota = governor::Quota::per_minute(NonZeroU32::new(PER_MINUTE).expect("non-zero"));
    let limiter = governor::RateLimiter::keyed(quota);
    keys.iter().for_each(|k| assert!(limiter.check_key(k).is_ok()));
    let started = Instant::now();
    let allowed = (0..decisions).filter(|i| limiter.check_key(black_box(&keys[i % keys.len()])).is_ok()).count();
    let ns = started.elapsed().as_nanos() as f64 / decisions as f64;
    assert_eq!(allowed, decisions, "every decision is allowed at this quota");
    ns
}

fn main() {
    let decisions: usize = std::env::args().nth(1).map_or(10_000_000, |s| s.parse().expect("a number of decisions"));
    println!("| keys | tollgate ns / decision | governor ns / decision | speed vs governor |");
    println!("|---:|---:|---:|---:|");
    for n in [100u64, 1_000, 10_000, 100_000] {
        // API-key-like keys, as in bench/memory.rs.
        let keys: Vec<String> = (0..n).map(|i| format!("ak_{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))).collect();
        let (mut ours, mut theirs) = (f64::MAX, f64::MAX);
        for _ in 0..2 {
            ours = ours.min(tollgate_ns(&keys, decisions));
            theirs = theirs.min(governor_ns(&keys, decisions));
        }
        println!("| {n} | {ours:.1} | {theirs:.1} | {:.2} |", theirs / ours);
    }
}
