//! A shard's lock in the bad cases: a panic while it is held, and a holder that keeps it
//! long (a sweep of a large shard) while other threads wait on the same shard.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::table::lock;
use super::{Check, MemoryStore, Probe};
use crate::algorithm::Params;
use crate::key::Key;
use crate::quota::Quota;
use crate::store::LocalStore;
use crate::Algorithm;

const T0: u64 = 1_700_000_000_000_000;

fn check(rule: &str, key: Key) -> Check {
    Check { rule: rule.into(), key, algorithm: Algorithm::Gcra, params: Params::new(Quota::per_second(2)) }
}

/// The shard index of `c`'s state.
fn shard_of(store: &MemoryStore, c: &Check) -> usize {
    store.shard_of(store.inner.hash(c.rule, &Probe::of(&c.key)))
}

/// `n` checks of rule `rule` whose states all live in shard `shard`, from key `from` on.
fn keys_in_shard(store: &MemoryStore, rule: &str, shard: usize, n: usize, from: u64) -> Vec<Check> {
    (from..).map(|k| check(rule, Key::from(k))).filter(|c| shard_of(store, c) == shard).take(n).collect()
}

/// CPU time this thread has run, ns (Linux's schedstat; 0 elsewhere).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|t| t.parse().ok()))
        .unwrap_or(0)
}

/// This thread's id.
fn tid() -> String {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_str().unwrap().to_owned()
}

#[test]
fn a_panic_while_a_shard_is_held_leaves_it_unlocked_and_usable() {
    let store = MemoryStore::new();
    let c = check("held-panic", Key::from("k"));
    assert!(store.check_one_at(&c, T0).unwrap().decision.allowed);
    let i = shard_of(&store, &c);
    // A panic with the guard alive (as one inside an algorithm would be), on another thread.
    let panicked = std::thread::scope(|s| {
        s.spawn(|| {
            let _shard = lock(&store.inner.shards[i]);
            panic!("inside the shard");
        })
        .join()
        .is_err()
    });
    assert!(panicked);
    // Unlocked by the unwinding (a lock left held would hang here: checked from a thread
    // with a deadline), not poisoned, its state intact.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let d = store.check_one_at(&c, T0).unwrap().decision;
            tx.send(d).unwrap();
        });
        let d = rx.recv_timeout(Duration::from_secs(10)).expect("the shard stayed locked after the panic");
        assert!(d.allowed && d.remaining == 0, "{d:?}");
    });
    assert!(!store.check_one_at(&c, T0).unwrap().decision.allowed);
    assert_eq!(store.len(), 1);
    LocalStore::reset(&store, "held-panic", &c.key, Algorithm::Gcra).unwrap();
    assert_eq!(store.len(), 0);
}

/// One thread sweeps a shard of 100,000 expired states while `WAITERS` threads decide on
/// keys of the same shard: how long the sweep takes, how long the waiters waited, and the
/// CPU they burnt waiting. A measurement, not a test (`--ignored --nocapture`).
#[test]
#[ignore = "a measurement: cargo test --release --lib held::a_long_sweep -- --ignored --nocapture"]
fn a_long_sweep_with_waiters_on_its_shard() {
    let n: usize = std::env::var("ENTRIES").ok().and_then(|t| t.parse().ok()).unwrap_or(100_000);
    let hold_ms: u64 = std::env::var("HOLD_MS").ok().and_then(|t| t.parse().ok()).unwrap_or(0);
    let runs: usize = std::env::var("RUNS").ok().and_then(|t| t.parse().ok()).unwrap_or(3);
    for waiters in [0usize, 1, 8, 32] {
        for _ in 0..runs {
            let store = MemoryStore::new();
            let states = keys_in_shard(&store, "sweep", 0, n, 0);
            for c in &states {
                store.check_one_at(c, T0).unwrap();
            }
            let own = keys_in_shard(&store, "sweep-wait", 0, waiters.max(1), 10_000_000);
            // Far past every expiry, without the time-based sweep (it is due far ahead).
            let later = T0 + 3_600_000_000;
            store.inner.next_sweep.store(u64::MAX, Ordering::Relaxed);
            let (waited_ns, cpu_ns, worst_ns) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
            let mut sweep = Duration::ZERO;
            std::thread::scope(|s| {
                // The shard held first; the waiters started while it is.
                let mut shard = lock(&store.inner.shards[0]);
                for c in own.iter().take(waiters) {
                    let (store, waited_ns, cpu_ns, worst_ns) = (&store, &waited_ns, &cpu_ns, &worst_ns);
                    s.spawn(move || {
                        let (cpu, at) = (thread_cpu_ns(), Instant::now());
                        store.check_one_at(c, later).unwrap();
                        let waited = u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        cpu_ns.fetch_add(thread_cpu_ns() - cpu, Ordering::Relaxed);
                        waited_ns.fetch_add(waited, Ordering::Relaxed);
                        worst_ns.fetch_max(waited, Ordering::Relaxed);
                    });
                }
                // `HOLDER_NICE`: the holder at a lower priority than its waiters (renice(1) of
                // this thread alone, once its waiters are started: they would inherit it), as a background thread deciding would be.
                if let Ok(nice) = std::env::var("HOLDER_NICE") {
                    let ok = std::process::Command::new("renice").args(["-n", &nice, "-p", &tid()]).output().unwrap();
                    assert!(ok.status.success(), "renice: {ok:?}");
                    eprintln!("{}", String::from_utf8_lossy(&ok.stdout).trim());
                }
                let at = Instant::now();
                shard.sweep(later, &store.inner);
                // A holder kept longer (preempted, or a far larger shard): `HOLD_MS` of CPU
                // time more with the shard held.
                let until = thread_cpu_ns() + hold_ms * 1_000_000;
                while hold_ms > 0 && thread_cpu_ns() < until {
                    std::hint::black_box((0..1_000u64).sum::<u64>());
                }
                drop(shard);
                sweep = at.elapsed();
                if std::env::var("HOLDER_NICE").is_ok() {
                    // Back to its waiters' priority for the next run (root only).
                    std::process::Command::new("renice").args(["-n", "0", "-p", &tid()]).output().unwrap();
                }
            });
            assert!(store.len() <= waiters);
            let per = |x: &AtomicU64| x.load(Ordering::Relaxed) as f64 / waiters.max(1) as f64 / 1e6;
            println!(
                "{n} entries, +{hold_ms} ms CPU, {waiters:2} waiters: held {:7.2} ms, wait mean {:7.2} ms worst {:7.2} ms, \
                 CPU a waiter {:7.2} ms",
                sweep.as_secs_f64() * 1e3,
                per(&waited_ns),
                worst_ns.load(Ordering::Relaxed) as f64 / 1e6,
                per(&cpu_ns),
            );
        }
    }
}
