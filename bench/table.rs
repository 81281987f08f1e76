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
//! `ONLY` keeps the cells whose name holds it; `PASSES` sets the passes a cell; `OVER=8`
//! runs instead W1 and W2 (GCRA) on 8 threads, more than the machine's cores (how the
//! shards' lock behaves when its holders are preempted).
//!
//! After the table: the heap bytes a key takes at 100,000 keys (one GCRA decision each, a
//! counting allocator around the system's), tollgate's and governor's; and, with
//! `PLOT=docs/img/memory.svg`, GCRA checks/s against live keys (1,000 to 100,000, W1's
//! workload otherwise) on 1 and 2 threads, both crates, medians of `RUNS`, drawn to that
//! file and printed as a table.
//!
//! tollgate decides a `(rule, key)` check through `LocalStore::check_one` (the path the
//! layer takes: the store's clock, a full `Decision`); governor answers a `bool` from
//! `check_key`. Each run measures every cell once, tollgate and governor back to back; the
//! table gives min–median–max over the runs of checks/s and of the ratio within a run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use governor::{DefaultKeyedRateLimiter, Quota as GovQuota, RateLimiter};
use tollgate::key::Key;
use tollgate::store::{Check, LocalStore, Params, RuleName};
use tollgate::{Algorithm, MemoryStore, Quota};

/// The system allocator, counting the bytes it holds: what a table of keys takes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with the same arguments; the counter is only
// bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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
            Workload::W1 => w1_keys(W1_KEYS),
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

/// W1's decisions over `n` keys (fixed seed).
fn w1_keys(n: u64) -> Vec<u64> {
    (0..W1_DECISIONS as u64).map(|i| splitmix(i ^ 0x5eed) % n).collect()
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
/// `decide` is run on `threads` threads over their share of the decisions `keys`; and
/// how many a pass allowed.
fn rate_over<L: Sync>(
    keys: &[u64],
    workload: Workload,
    threads: usize,
    fresh: impl Fn() -> L,
    decide: impl Fn(&L, u64) -> bool + Sync,
) -> (f64, usize) {
    let keys = keys.to_vec();
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

fn tollgate(workload: Workload, algorithm: Algorithm, threads: usize, way: Way) -> (f64, usize) {
    let keys = workload.keys();
    let (quota, _) = workload.quota();
    match way {
        Way::Store => tollgate_over(&keys, workload, algorithm, threads),
        Way::Reads => {
            let rule = RuleName::new("api");
            let params = Params::new(quota);
            rate_over(&keys, workload, threads, MemoryStore::new, |store, k| {
                let check = Check { rule, key: Key::from(k), algorithm, params };
                store.check_one_now(&check).is_ok_and(|o| {
                    let d = o.decision;
                    std::hint::black_box((d.remaining(), d.reset_secs()));
                    d.allowed
                })
            })
        }
        Way::CheckKey => {
            use futures_util::FutureExt;
            rate_over(
                &keys,
                workload,
                threads,
                || limiter(quota, algorithm),
                |limiter, k| {
                    limiter.check_key("api", k, 1).now_or_never().expect("in process: ready at once").is_allowed()
                },
            )
        }
        Way::CheckKeyNow => rate_over(
            &keys,
            workload,
            threads,
            || limiter(quota, algorithm),
            |limiter, k| limiter.check_key_now("api", k, 1).is_allowed(),
        ),
    }
}

/// A limiter of one rule named `api` over a fresh `MemoryStore`.
fn limiter(quota: Quota, algorithm: Algorithm) -> tollgate::Limiter<MemoryStore, u64> {
    tollgate::Limiter::builder(MemoryStore::new())
        .rule("api", quota, |k: &u64| Some(*k))
        .algorithm(algorithm)
        .build()
        .expect("a valid rule")
}

fn peer(workload: Workload, algorithm: Algorithm, threads: usize, way: Way) -> (f64, usize) {
    match way {
        Way::Store => governor(workload, threads),
        Way::Reads => {
            let (_, per_minute) = workload.quota();
            let n = std::num::NonZeroU32::new(per_minute).expect("a positive quota");
            let fresh = || {
                RateLimiter::keyed(GovQuota::per_minute(n).allow_burst(n))
                    .with_middleware::<governor::middleware::StateInformationMiddleware>()
            };
            rate_over(&workload.keys(), workload, threads, fresh, |limiter, k| match limiter.check_key(&k) {
                Ok(snapshot) => {
                    std::hint::black_box(snapshot.remaining_burst_capacity());
                    true
                }
                Err(_) => false,
            })
        }
        Way::CheckKey | Way::CheckKeyNow => tollgate_over(&workload.keys(), workload, algorithm, threads),
    }
}

fn tollgate_over(keys: &[u64], workload: Workload, algorithm: Algorithm, threads: usize) -> (f64, usize) {
    let (quota, _) = workload.quota();
    let rule = RuleName::new("api");
    let params = Params::new(quota);
    rate_over(keys, workload, threads, MemoryStore::new, |store, k| {
        let check = Check { rule, key: Key::from(k), algorithm, params };
        store.check_one_now(&check).is_ok_and(|o| o.decision.allowed)
    })
}

fn governor(workload: Workload, threads: usize) -> (f64, usize) {
    governor_over(&workload.keys(), workload, threads)
}

fn governor_limiter(workload: Workload) -> DefaultKeyedRateLimiter<u64> {
    let (_, per_minute) = workload.quota();
    let n = std::num::NonZeroU32::new(per_minute).expect("a positive quota");
    RateLimiter::keyed(GovQuota::per_minute(n).allow_burst(n))
}

fn governor_over(keys: &[u64], workload: Workload, threads: usize) -> (f64, usize) {
    rate_over(keys, workload, threads, || governor_limiter(workload), |limiter, k| limiter.check_key(&k).is_ok())
}

/// Heap bytes a key takes: each of `n` keys decided once (GCRA, W1's quota), tollgate's
/// `MemoryStore` then governor's keyed limiter.
fn bytes_per_key(n: u64) -> (f64, f64) {
    let per_key = |held: usize| held as f64 / n as f64;
    let before = LIVE.load(Ordering::Relaxed);
    let store = MemoryStore::new();
    let params = Params::new(Workload::W1.quota().0);
    let rule = RuleName::new("api");
    for k in 0..n {
        let check = Check { rule, key: Key::from(k), algorithm: Algorithm::Gcra, params };
        assert!(store.check_one_now(&check).is_ok_and(|o| o.decision.allowed));
    }
    let ours = per_key(LIVE.load(Ordering::Relaxed) - before);
    drop(store);
    let before = LIVE.load(Ordering::Relaxed);
    let limiter = governor_limiter(Workload::W1);
    for k in 0..n {
        assert!(limiter.check_key(&k).is_ok());
    }
    let theirs = per_key(LIVE.load(Ordering::Relaxed) - before);
    (ours, theirs)
}

/// Heap bytes a key takes in tollgate's `MemoryStore` with 16-byte string keys (GCRA).
fn bytes_per_string_key(n: u64) -> f64 {
    let before = LIVE.load(Ordering::Relaxed);
    let store = MemoryStore::new();
    let params = Params::new(Workload::W1.quota().0);
    let rule = RuleName::new("api");
    for k in 0..n {
        let check = Check { rule, key: Key::from(format!("key-{k:012}")), algorithm: Algorithm::Gcra, params };
        assert!(store.check_one_now(&check).is_ok_and(|o| o.decision.allowed));
    }
    (LIVE.load(Ordering::Relaxed) - before) as f64 / n as f64
}

/// GCRA checks/s against live keys, 1 and 2 threads, both crates: medians of `runs`,
/// printed and drawn to `path`.
fn plot(path: &str, runs: usize) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    const KEYS: [u64; 5] = [1_000, 3_000, 10_000, 30_000, 100_000];
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    /// One line of the figure: label, colour, dashed (2 threads), points.
    type Line = (String, RGBColor, bool, Vec<(f64, f64)>);
    let mut lines: Vec<Line> = Vec::new();
    println!("\n| keys | threads | tollgate, M checks/s | governor, M checks/s | ratio |\n|---:|---:|---:|---:|---:|");
    for threads in [1, 2] {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for n in KEYS {
            let keys = w1_keys(n);
            let (mut t, mut g) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                t.push(tollgate_over(&keys, Workload::W1, Algorithm::Gcra, threads).0 / 1e6);
                g.push(governor_over(&keys, Workload::W1, threads).0 / 1e6);
            }
            let (t, g) = (median(t), median(g));
            println!("| {n} | {threads} | {t:.2} | {g:.2} | {:.2} |", t / g);
            ours.push((n as f64, t));
            theirs.push((n as f64, g));
        }
        lines.push((format!("tollgate, {threads} thread(s)"), RGBColor(31, 119, 180), threads == 2, ours));
        lines.push((format!("governor, {threads} thread(s)"), RGBColor(214, 39, 40), threads == 2, theirs));
    }
    let top = lines.iter().flat_map(|l| l.3.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "GCRA in process: checks/s against live keys (W1: 200,000 decisions a pass, fresh store), medians",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d((1_000f64..100_000f64).log_scale(), 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("live keys")
        .y_desc("million checks/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .light_line_style(WHITE)
        .draw()?;
    for (label, colour, dashed, points) in lines {
        let style = ShapeStyle::from(&colour).stroke_width(2);
        let series = if dashed {
            chart.draw_series(DashedLineSeries::new(points, 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(points, style))?
        };
        series.label(label).legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    root.present()?;
    println!("\nDrawn to {path}.");
    Ok(())
}

/// min–median–max of `xs`.
fn spread(mut xs: Vec<f64>, scale: f64, digits: usize) -> String {
    xs.sort_by(f64::total_cmp);
    let at = |i: usize| format!("{:.*}", digits, xs[i] / scale);
    format!("{}–{}–{}", at(0), at(xs.len() / 2), at(xs.len() - 1))
}

/// How a cell decides, and whom it is compared with.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    /// `LocalStore::check_one`, reading `allowed`, against governor's `check_key`.
    Store,
    /// The same, reading `remaining` and the reset seconds too (what the layer's headers
    /// read), against governor with its state-information middleware reading its
    /// remaining burst.
    Reads,
    /// `Limiter::check_key` (its future polled once), against `LocalStore::check_one`
    /// on the same rule.
    CheckKey,
    /// `Limiter::check_key_now`, against `LocalStore::check_one` on the same rule.
    CheckKeyNow,
}

type Cell = (&'static str, Workload, Algorithm, usize, Way);

fn cells() -> Vec<Cell> {
    use Algorithm::*;
    use Workload::*;
    let mut cells: Vec<Cell> = Vec::new();
    for (name, algorithm) in [
        ("GCRA", Gcra),
        ("token bucket", TokenBucket),
        ("fixed window", FixedWindow),
        ("sliding counter", SlidingWindowCounter),
        ("sliding log", SlidingWindowLog),
    ] {
        for (w, workload) in [("W1", W1), ("W2", W2)] {
            for threads in [1, 2] {
                let label =
                    format!("`MemoryStore` {name}, {w}, {threads} thread{}", if threads > 1 { "s" } else { "" });
                cells.push((Box::leak(label.into_boxed_str()), workload, algorithm, threads, Way::Store));
            }
        }
    }
    cells.push(("GCRA reading remaining and reset, W1, 1 thread", W1, Gcra, 1, Way::Reads));
    cells.push(("GCRA reading remaining and reset, W1, 2 threads", W1, Gcra, 2, Way::Reads));
    cells.push(("GCRA reading remaining and reset, W2, 1 thread", W2, Gcra, 1, Way::Reads));
    cells.push(("token bucket reading remaining and reset, W1, 1 thread", W1, TokenBucket, 1, Way::Reads));
    cells.push(("`Limiter::check_key`, GCRA, W1, 1 thread", W1, Gcra, 1, Way::CheckKey));
    cells.push(("`Limiter::check_key_now`, GCRA, W1, 1 thread", W1, Gcra, 1, Way::CheckKeyNow));
    cells
}

fn main() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let over: usize = std::env::var("OVER").ok().and_then(|t| t.parse().ok()).unwrap_or(0);
    let cells: Vec<Cell> = if over > 0 {
        vec![
            ("W1 over", Workload::W1, Algorithm::Gcra, over, Way::Store),
            ("W2 over", Workload::W2, Algorithm::Gcra, over, Way::Store),
        ]
    } else {
        cells()
    };
    let only = std::env::var("ONLY").ok();
    let cells: Vec<Cell> =
        cells.into_iter().filter(|c| only.as_ref().is_none_or(|o| c.0.contains(o.as_str()))).collect();
    let mut ours = vec![Vec::new(); cells.len()];
    let mut theirs = vec![Vec::new(); cells.len()];
    for run in 0..runs {
        for (i, &(name, workload, algorithm, threads, way)) in cells.iter().enumerate() {
            let (t, t_allowed) = tollgate(workload, algorithm, threads, way);
            let (g, g_allowed) = peer(workload, algorithm, threads, way);
            eprintln!(
                "run {}: {name}: tollgate {:.2}M ({t_allowed} allowed a pass), {} {:.2}M ({g_allowed})",
                run + 1,
                t / 1e6,
                peer_name(way),
                g / 1e6
            );
            ours[i].push(t);
            theirs[i].push(g);
        }
    }
    println!("| where | tollgate, M checks/s | peer | peer, M checks/s | ratio in each run |");
    println!("|---|---:|---|---:|---:|");
    for (i, (name, _, _, threads, way)) in cells.iter().enumerate() {
        // Governor's two-thread rate has two modes on a 2-core machine: a two-thread cell
        // is taken against governor's fastest run of the sitting.
        let fastest = theirs[i].iter().copied().fold(0.0, f64::max);
        let ratios = ours[i]
            .iter()
            .zip(&theirs[i])
            .map(|(t, g)| if *threads > 1 && *way != Way::CheckKey { t / fastest } else { t / g })
            .collect();
        println!(
            "| {name} | {} | {} | {} | {} |",
            spread(ours[i].clone(), 1e6, 2),
            peer_name(*way),
            spread(theirs[i].clone(), 1e6, 2),
            spread(ratios, 1.0, 2)
        );
    }
    println!(
        "\nmin–median–max of {runs} runs; two-thread cells against the peer's fastest run; \
         `cargo run --release -p tollgate-bench --example table`."
    );
    if only.is_none() || std::env::var("MEMORY").is_ok() {
        memory();
    }
    if let Ok(path) = std::env::var("PLOT") {
        if let Err(e) = plot(&path, runs) {
            eprintln!("the plot failed: {e}");
            std::process::exit(1);
        }
    }
}

fn peer_name(way: Way) -> &'static str {
    match way {
        Way::Store => "governor (GCRA)",
        Way::Reads => "governor + state information",
        Way::CheckKey | Way::CheckKeyNow => "`LocalStore::check_one`",
    }
}

/// Heap bytes a live key takes, averaged over 50,000–200,000 and 0.5–2 million keys, with
/// `u64` keys (tollgate's and governor's) and with 16-byte string keys (tollgate's).
fn memory() {
    for (label, sizes) in
        [("50,000–200,000", [50_000u64, 100_000, 200_000]), ("0.5–2 million", [500_000, 1_000_000, 2_000_000])]
    {
        let (mut ours, mut theirs, mut strings) = (0.0, 0.0, 0.0);
        for n in sizes {
            let (o, t) = bytes_per_key(n);
            ours += o / 3.0;
            theirs += t / 3.0;
            strings += bytes_per_string_key(n) / 3.0;
        }
        println!(
            "\nHeap bytes a live key, {label} keys (GCRA, one decision each, averaged): tollgate {ours:.1}, governor \
             {theirs:.1} ({:.2}×); tollgate with 16-byte keys {strings:.1}.",
            ours / theirs
        );
    }
}
