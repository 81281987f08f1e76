//! Issue 28's table in one command: `MemoryStore` against governor's keyed limiter
//! (`DefaultKeyedRateLimiter<u64>`), on the issue's workloads, as ratios within one run.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example table            # 3 runs
//! RUNS=5 cargo run --release -p tollgate-bench --example table
//! # one cell, one pass, for a profiler (callgrind):
//! ONLY="GCRA, W1, 1" PASSES=1 RUNS=1 valgrind --tool=callgrind target/release/examples/table
//! ```
//!
//! - **W1**: 10,000 `u64` keys drawn from a fixed-seed sequence, 200,000 decisions a pass,
//!   100 per 60 s with a burst of 100 (every decision is allowed), 25 passes, each on a fresh
//!   store (so W1 times inserts too); one thread, or two splitting the keys by parity.
//! - **W2**: one key, 1,000 per 60 s, 50,000 decisions a pass (25 passes).
//!
//! `ONLY` keeps the cells whose name holds it; `PASSES` sets the passes a cell.
//!
//! tollgate decides a `(rule, key)` check through `LocalStore::check_one` (the path the
//! layer takes: the store's clock, a full `Decision`); governor answers a `bool` from
//! `check_key`. Each run measures every cell once, tollgate and governor back to back; the
//! table gives min–median–max over the runs of checks/s and of the ratio within a run.

use std::time::Instant;

use governor::{DefaultKeyedRateLimiter, Quota as GovQuota, RateLimiter};
use tollgate::key::Key;
use tollgate::store::{Check, LocalStore, Params};
use tollgate::{Algorithm, MemoryStore, Quota};

const W1_KEYS: u64 = 10_000;
const W1_DECISIONS: usize = 200_000;
const W2_DECISIONS: usize = 50_000;
/// Passes per cell (env `PASSES`, default 25).
fn passes() -> usize {
    std::env::var("PASSES").ok().and_then(|p| p.parse().ok()).unwrap_or(25).max(1)
}

/// The two workloads: W1's key sequence (fixed seed) or W2's one key.
#[derive(Clone, Copy)]
enum Workload {
    W1,
    W2,
}

impl Workload {
    fn keys(self) -> Vec<u64> {
        match self {
            Workload::W1 => (0..W1_DECISIONS as u64).map(|i| splitmix(i ^ 0x5eed) % W1_KEYS).collect(),
            Workload::W2 => vec![7; W2_DECISIONS],
        }
    }

    fn quota(self) -> (Quota, u32) {
        match self {
            Workload::W1 => (Quota::per_minute(100).burst(100), 100),
            Workload::W2 => (Quota::per_minute(1_000), 1_000),
        }
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Workload {
    /// The decisions thread `t` of `threads` makes: W1's keys of its parity, or its part of
    /// W2's decisions on the one key.
    fn share(self, keys: &[u64], threads: usize, t: usize) -> Vec<u64> {
        match self {
            Workload::W1 => keys.iter().copied().filter(|k| usize::try_from(*k).unwrap_or(0) % threads == t).collect(),
            Workload::W2 => keys.iter().copied().skip(t).step_by(threads).collect(),
        }
    }
}

/// Checks per second of `PASSES` passes, each over a fresh limiter from `fresh`, whose
/// `decide` is run on `threads` threads over their share of the workload's decisions; and
/// how many a pass allowed.
fn rate<L: Sync>(
    workload: Workload,
    threads: usize,
    fresh: impl Fn() -> L,
    decide: impl Fn(&L, u64) -> bool + Sync,
) -> (f64, usize) {
    let keys = workload.keys();
    let shares: Vec<Vec<u64>> = (0..threads).map(|t| workload.share(&keys, threads, t)).collect();
    let total: usize = shares.iter().map(Vec::len).sum();
    let mut spent = 0.0;
    let mut allowed = 0usize;
    for _ in 0..passes() {
        let limiter = fresh();
        let started = Instant::now();
        allowed += std::thread::scope(|s| {
            let handles: Vec<_> = shares
                .iter()
                .map(|mine| {
                    let (limiter, decide) = (&limiter, &decide);
                    s.spawn(move || mine.iter().filter(|&&k| decide(limiter, k)).count())
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a bench thread panicked")).sum::<usize>()
        });
        spent += started.elapsed().as_secs_f64();
    }
    ((total * passes()) as f64 / spent, allowed / passes())
}

fn tollgate(workload: Workload, algorithm: Algorithm, threads: usize) -> (f64, usize) {
    let (quota, _) = workload.quota();
    let rule: std::sync::Arc<str> = "api".into();
    let params = Params::new(quota);
    rate(workload, threads, MemoryStore::new, |store, k| {
        let check = Check { rule: rule.clone(), key: Key::from(k), algorithm, params };
        store.check_one(&check).is_ok_and(|o| o.decision.allowed)
    })
}

fn governor(workload: Workload, threads: usize) -> (f64, usize) {
    let (_, per_minute) = workload.quota();
    let n = std::num::NonZeroU32::new(per_minute).expect("a positive quota");
    let fresh = || -> DefaultKeyedRateLimiter<u64> { RateLimiter::keyed(GovQuota::per_minute(n).allow_burst(n)) };
    rate(workload, threads, fresh, |limiter, k| limiter.check_key(&k).is_ok())
}

/// min–median–max of `xs`.
fn spread(mut xs: Vec<f64>, scale: f64, digits: usize) -> String {
    xs.sort_by(f64::total_cmp);
    let at = |i: usize| format!("{:.*}", digits, xs[i] / scale);
    format!("{}–{}–{}", at(0), at(xs.len() / 2), at(xs.len() - 1))
}

fn main() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let cells: [(&str, Workload, Algorithm, usize); 6] = [
        ("`MemoryStore` GCRA, W1, 1 thread", Workload::W1, Algorithm::Gcra, 1),
        ("`MemoryStore` GCRA, W1, 2 threads", Workload::W1, Algorithm::Gcra, 2),
        ("`MemoryStore` GCRA, W2, 1 thread", Workload::W2, Algorithm::Gcra, 1),
        ("`MemoryStore` GCRA, W2, 2 threads", Workload::W2, Algorithm::Gcra, 2),
        ("`MemoryStore` sliding log, W1, 1 thread", Workload::W1, Algorithm::SlidingWindowLog, 1),
        ("`MemoryStore` sliding counter, W1, 1 thread", Workload::W1, Algorithm::SlidingWindowCounter, 1),
    ];
    let mut ours = vec![Vec::new(); cells.len()];
    let mut theirs = vec![Vec::new(); cells.len()];
    for run in 0..runs {
        for (i, &(name, workload, algorithm, threads)) in cells.iter().enumerate() {
            if std::env::var("ONLY").is_ok_and(|only| !name.contains(&only)) {
                continue;
            }
            let (t, t_allowed) = tollgate(workload, algorithm, threads);
            let (g, g_allowed) = governor(workload, threads);
            eprintln!(
                "run {}: {name}: tollgate {:.2}M ({t_allowed} allowed a pass), governor (GCRA) {:.2}M ({g_allowed})",
                run + 1,
                t / 1e6,
                g / 1e6
            );
            ours[i].push(t);
            theirs[i].push(g);
        }
    }
    println!("| where | tollgate, M checks/s | governor, M checks/s | ratio in each run |");
    println!("|---|---:|---:|---:|");
    for (i, (name, ..)) in cells.iter().enumerate().filter(|(i, _)| !ours[*i].is_empty()) {
        let ratios = ours[i].iter().zip(&theirs[i]).map(|(t, g)| t / g).collect();
        println!(
            "| {name} | {} | {} | {} |",
            spread(ours[i].clone(), 1e6, 2),
            spread(theirs[i].clone(), 1e6, 2),
            spread(ratios, 1.0, 2)
        );
    }
    println!("\nmin–median–max of {runs} runs; `cargo run --release -p tollgate-bench --example table`.");
}
