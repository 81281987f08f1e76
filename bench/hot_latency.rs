//! Tail latency and progress of one hot key: `THREADS` threads (default 2, 8, 32) decide
//! the same (rule, key) in a tight loop for `SECS` seconds (default 1) through
//! `MemoryStore::check_one`; each decision is timed on its own. Prints, per thread count,
//! the decisions of the slowest and fastest thread, and the single-decision latency
//! percentiles (p50, p99, p99.9, p99.99, max) and the longest gap any thread saw between
//! two of its decisions finishing.
//!
//! `cargo run --release -p tollgate-bench --example hot_latency`

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::key::Key;
use tollgate::store::{Check, LocalStore, Params, RuleName};
use tollgate::{Algorithm, MemoryStore, Quota};

/// 0..10 µs by 10 ns, the rest kept exactly.
const FINE: usize = 1_000;

struct Hist {
    fine: Vec<u64>,
    coarse: Vec<u64>,
    n: u64,
    max_gap: u64,
}

impl Hist {
    fn new() -> Self {
        Self { fine: vec![0; FINE], coarse: Vec::new(), n: 0, max_gap: 0 }
    }

    fn add(&mut self, ns: u64) {
        self.n += 1;
        let b = (ns / 10) as usize;
        if b < FINE {
            self.fine[b] += 1;
        } else {
            self.coarse.push(ns);
        }
    }

    fn merge(&mut self, o: &Hist) {
        self.n += o.n;
        for (a, b) in self.fine.iter_mut().zip(&o.fine) {
            *a += b;
        }
        self.coarse.extend_from_slice(&o.coarse);
        self.max_gap = self.max_gap.max(o.max_gap);
    }

    fn quantile(&mut self, q: f64) -> u64 {
        self.coarse.sort_unstable();
        let rank = ((self.n as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (i, c) in self.fine.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return i as u64 * 10 + 10;
            }
        }
        let i = (rank - seen).saturating_sub(1) as usize;
        self.coarse[i.min(self.coarse.len() - 1)]
    }
}

fn run(threads: usize, secs: f64) {
    let store = MemoryStore::new();
    let rule = RuleName::new("hot");
    let params = Params::new(Quota::per_second(1_000_000_000));
    let stop = AtomicBool::new(false);
    let hists: Vec<Hist> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (store, stop) = (&store, &stop);
                s.spawn(move || {
                    let mut h = Hist::new();
                    let check = Check { rule, key: Key::from(7u64), algorithm: Algorithm::Gcra, params };
                    let mut last = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        let ok = store.check_one_now(&check).is_ok();
                        let t1 = Instant::now();
                        assert!(ok);
                        h.add((t1 - t0).as_nanos() as u64);
                        h.max_gap = h.max_gap.max((t1 - last).as_nanos() as u64);
                        last = t1;
                    }
                    h
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let counts: Vec<u64> = hists.iter().map(|h| h.n).collect();
    let mut all = Hist::new();
    for h in &hists {
        all.merge(h);
    }
    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    let (p50, p99, p999, p9999) = (all.quantile(0.5), all.quantile(0.99), all.quantile(0.999), all.quantile(0.9999));
    let maxlat = all.coarse.iter().copied().max().unwrap_or(p9999);
    println!(
        "{threads:>3} threads: {:.1} M/s; per thread min {min} max {max} (ratio {:.2}); latency ns p50 {p50} p99 {p99} p99.9 {p999} p99.99 {p9999} max {maxlat}; longest gap {:.2} ms",
        all.n as f64 / secs / 1e6,
        *max as f64 / (*min).max(1) as f64,
        all.max_gap as f64 / 1e6,
    );
}

fn main() {
    let threads: Vec<usize> = std::env::var("THREADS")
        .ok()
        .map(|t| t.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 8, 32]);
    let secs: f64 = std::env::var("SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    for t in threads {
        run(t, secs);
    }
}
