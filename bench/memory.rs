//! Nanoseconds per decision through `MemoryStore`, for each algorithm, against governor's
//! keyed limiter (`RateLimiter::keyed`, GCRA on a DashMap) in the same run.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench memory
//! cargo bench -p tollgate-bench --bench memory -- --warm-up-time 3 --measurement-time 10   # steadier numbers
//! ```
//!
//! Every benchmark makes one decision per iteration over 10,000 pre-built keys visited in a
//! fixed pseudo-random order, on 1 thread and on 2 threads (each taking half the decisions;
//! the time is wall time over all decisions, so it is the cost of one decision at that
//! parallelism). Two quotas: 1,000,000 a minute (nearly every decision is allowed) and 10 a
//! minute (after the first few per key, every decision is rejected).
//!
//! Two paths through the store:
//! - `check_one`: `LocalStore::check_one`, the path the layer takes for a request that one
//!   rule applies to: reads the store's clock and decides, synchronously.
//! - `check_one_at`: `MemoryStore::check_one_at` with a caller-supplied time (read once per
//!   criterion sample): the store and algorithm alone.
//!
//! The sliding window log keeps one entry per accepted µs for a period: at 1,000,000 a
//! minute its `Store::check` cost grows with how long the benchmark has run, and its
//! `check_at` (one time per sample) collapses each sample's entries into one.
//!
//! After criterion's own output, a markdown table gives the median of each benchmark and
//! its speed relative to governor (`governor ns / ours ns`: 1.0 is as fast, higher is
//! faster). Targets: GCRA and the token bucket ≥ 1.0, every algorithm ≥ 0.5.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use governor::{Quota as GovQuota, RateLimiter};
use tollgate::clock::{Clock, SystemClock};
use tollgate::store::Check;
use tollgate::store::LocalStore;
use tollgate::store::Params;
use tollgate::{Algorithm, MemoryStore, Quota};

const KEYS: usize = 10_000;
const THREADS: [usize; 2] = [1, 2];

/// One quota, as tollgate and governor spell it.
struct Limit {
    name: &'static str,
    per_minute: u32,
}

const LIMITS: [Limit; 2] =
    [Limit { name: "mostly_allowed", per_minute: 1_000_000 }, Limit { name: "mostly_rejected", per_minute: 10 }];

/// The keys, API-key-like strings, in the fixed pseudo-random order every benchmark uses.
fn keys() -> Vec<String> {
    let mut keys: Vec<String> = (0..KEYS as u64).map(|i| format!("ak_{:016x}", splitmix(i))).collect();
    // Fisher–Yates with a fixed seed: the same order in every run.
    let mut state = 0x5eed_u64;
    for i in (1..keys.len()).rev() {
        state = splitmix(state);
        #[allow(clippy::cast_possible_truncation)]
        let j = (state % (i as u64 + 1)) as usize;
        keys.swap(i, j);
    }
    keys
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `iters` decisions split over `threads` threads and returns the wall time.
/// `decide(thread, n)` makes `n` decisions; threads start together behind a barrier, so
/// spawning them is not timed.
fn run(iters: u64, threads: usize, decide: &(dyn Fn(usize, u64) + Sync)) -> Duration {
    if threads == 1 {
        let start = Instant::now();
        decide(0, iters);
        return start.elapsed();
    }
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let n = iters / threads as u64 + u64::from(t == 0) * (iters % threads as u64);
                s.spawn(move || {
                    barrier.wait();
                    decide(t, n);
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for w in workers {
            w.join().expect("bench thread panicked");
        }
        start.elapsed()
    })
}

/// Visits `n` keys from thread `t`'s starting point (threads start half the keys apart)
/// and counts the allowed decisions.
fn visit(t: usize, threads: usize, n: u64, mut decide: impl FnMut(usize) -> bool) -> u64 {
    let mut i = t * KEYS / threads;
    let mut allowed = 0;
    for _ in 0..n {
        allowed += u64::from(decide(i));
        i += 1;
        if i == KEYS {
            i = 0;
        }
    }
    allowed
}

/// `MemoryStore`'s `LocalStore::check_one`: what the limiter calls for an input with one
/// rule, synchronously, with the store's clock.
fn check_now(store: &MemoryStore, check: &Check) -> bool {
    match LocalStore::check_one_now(store, check) {
        Ok(o) => o.decision.allowed,
        Err(e) => panic!("MemoryStore failed: {e}"),
    }
}

/// Allowed and total decisions per benchmark, to show what each one measured.
#[derive(Default)]
struct Tally {
    allowed: AtomicU64,
    total: AtomicU64,
}

impl Tally {
    fn add(&self, allowed: u64, total: u64) {
        self.allowed.fetch_add(allowed, Ordering::Relaxed);
        self.total.fetch_add(total, Ordering::Relaxed);
    }
}

/// The benchmarks run in this process, in order: (group, function, tally).
type Ran = Mutex<Vec<(String, String, Arc<Tally>)>>;

/// One benchmark: `decide(key index)` per iteration; `before_sample` runs before each
/// criterion sample, outside the timed part.
fn bench(
    g: &mut BenchmarkGroup<'_, WallTime>,
    ran: &Ran,
    (group, id): (&str, &str),
    threads: usize,
    before_sample: impl Fn(),
    decide: impl Fn(usize) -> bool + Sync,
) {
    let tally = Arc::new(Tally::default());
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            before_sample();
            run(iters, threads, &|t, n| {
                let allowed = visit(t, threads, n, |i| black_box(decide(black_box(i))));
                tally.add(allowed, n);
            })
        });
    });
    // A benchmark left out by a filter has no tally, and its estimates are stale.
    if tally.total.load(Ordering::Relaxed) > 0 {
        ran.lock().unwrap().push((group.to_owned(), id.to_owned(), tally));
    }
}

fn benches(c: &mut Criterion, ran: &Ran) {
    let keys = keys();
    for limit in &LIMITS {
        let ours = Quota::per_minute(u64::from(limit.per_minute));
        let theirs = GovQuota::per_minute(NonZeroU32::new(limit.per_minute).expect("non-zero"));
        for threads in THREADS {
            let group = format!("{}/{}t", limit.name, threads);
            let mut g = c.benchmark_group(&group);
            g.throughput(Throughput::Elements(1));

            // The baseline: governor's keyed limiter, with its default DashMap store and clock.
            let governor = RateLimiter::keyed(theirs);
            bench(&mut g, ran, (&group, "governor"), threads, || {}, |i| governor.check_key(&keys[i]).is_ok());
            drop(governor);

            for algorithm in Algorithm::ALL {
                let checks: Vec<Check> = keys
                    .iter()
                    .map(|k| Check {
                        rule: "bench".into(),
                        key: k.as_str().into(),
                        algorithm,
                        params: Params::new(ours),
                    })
                    .collect();

                let store = MemoryStore::new();
                let id = format!("{algorithm}/check_one");
                bench(&mut g, ran, (&group, &id), threads, || {}, |i| check_now(&store, &checks[i]));
                drop(store);

                let store = MemoryStore::new();
                let now = AtomicU64::new(0);
                let id = format!("{algorithm}/check_one_at");
                bench(
                    &mut g,
                    ran,
                    (&group, &id),
                    threads,
                    || now.store(SystemClock.now_micros(), Ordering::Relaxed),
                    |i| store.check_one_at(&checks[i], now.load(Ordering::Relaxed)).is_ok_and(|o| o.decision.allowed),
                );
                drop(store);
            }
            g.finish();
        }
    }
}

/// Where criterion writes its estimates (its own lookup, without `cargo metadata`).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("..").join("criterion")
}

/// The median time per iteration (ns) criterion estimated for one benchmark.
fn median_ns(group: &str, id: &str) -> Option<f64> {
    // criterion's directory names: these characters become `_` (names here are short ASCII).
    let safe = |s: &str| s.replace(['?', '"', '/', '\\', '*', '<', '>', ':', '|', '^'], "_");
    let path = criterion_dir().join(safe(group)).join(safe(id)).join("new").join("estimates.json");
    let json = std::fs::read_to_string(path).ok()?;
    // {"mean":{…,"point_estimate":x,…},"median":{…,"point_estimate":x,…},…}
    let after = &json[json.find("\"median\"")?..];
    let after = &after[after.find("\"point_estimate\":")? + "\"point_estimate\":".len()..];
    let end = after.find([',', '}'])?;
    after[..end].trim().parse().ok()
}

fn table(ran: &Ran) {
    let ran = ran.lock().unwrap();
    let mut groups: BTreeMap<&str, Vec<(&str, &Tally)>> = BTreeMap::new();
    let mut order = Vec::new();
    for (g, id, tally) in ran.iter() {
        if !groups.contains_key(g.as_str()) {
            order.push(g.as_str());
        }
        groups.entry(g).or_default().push((id, tally));
    }
    println!();
    println!("## MemoryStore vs governor (median ns per decision; speed = governor ns / ours ns)");
    for g in order {
        let rows = &groups[g];
        let ran_here = |id: &str| rows.iter().find(|(r, _)| *r == id).map(|(_, t)| *t);
        let median = |id: &str| ran_here(id).and_then(|_| median_ns(g, id));
        let Some(base) = median("governor") else { continue };
        let allowed = |id: &str| {
            ran_here(id).map_or_else(String::new, |t| {
                let total = t.total.load(Ordering::Relaxed).max(1);
                #[allow(clippy::cast_precision_loss)]
                let pct = 100.0 * t.allowed.load(Ordering::Relaxed) as f64 / total as f64;
                format!("{pct:.1}%")
            })
        };
        let cell = |ns: Option<f64>| ns.map_or_else(|| "—".to_owned(), |ns| format!("{ns:.1}"));
        let speed = |ns: Option<f64>| ns.map_or_else(|| "—".to_owned(), |ns| format!("{:.2}", base / ns));
        println!();
        println!("### {g}: governor {base:.1} ns/decision, {} allowed", allowed("governor"));
        println!();
        println!("| algorithm | `Store::check_one` ns | speed vs governor | `check_one_at` ns | speed vs governor | allowed | target | status |");
        println!("|---|---:|---:|---:|---:|---:|---|---|");
        for algorithm in Algorithm::ALL {
            let name = algorithm.name();
            let (check_id, at_id) = (format!("{name}/check_one"), format!("{name}/check_one_at"));
            let (check, at) = (median(&check_id), median(&at_id));
            if check.is_none() && at.is_none() {
                continue;
            }
            let target = if matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket) { 1.0 } else { 0.5 };
            let status = match check {
                Some(ns) if base / ns >= target => "met",
                Some(_) => "MISSED",
                None => "—",
            };
            println!(
                "| {name} | {} | {} | {} | {} | {} | ≥ {target:.1} | {status} |",
                cell(check),
                speed(check),
                cell(at),
                speed(at),
                allowed(&check_id),
            );
        }
    }
    println!();
    println!("Status is judged on `Store::check_one` (the layer's path).");
}

fn main() {
    let ran = Ran::default();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
        // The table below is the report; plotting 52 benchmarks would add minutes.
        .without_plots()
        .configure_from_args();
    benches(&mut c, &ran);
    c.final_summary();
    table(&ran);
}
