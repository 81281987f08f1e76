//! `MemoryStore::max_keys(n)`: one count for the store, exact under concurrent mixed
//! operations, and room found by every path that makes a state (checks, charges, blocks).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::Check;
use tollgate::store::Params;
use tollgate::store::{LocalStore, Refund};
use tollgate::{Algorithm, MemoryStore, Quota, StoreError};

const T0: u64 = 1_700_000_000_000_000;

fn check(rule: &str, key: &str, alg: Algorithm, q: Quota, cost: u64) -> Check {
    let mut p = Params::new(q);
    p.cost = cost;
    Check { rule: rule.into(), key: Key::from(key), algorithm: alg, params: p }
}

/// Fills the store with `n` long-lived fresh keys at `now` (after everything else has
/// expired): exactly `n` must fit, and the next must not.
fn exactly_n_fit(store: &MemoryStore, n: usize, now: u64, tag: &str) {
    let q = Quota::per_hour(100);
    let mut ok = 0;
    for i in 0..n + 5 {
        match store.check_one_at(&check("final", &format!("{tag}-{i}"), Algorithm::Gcra, q, 1), now) {
            Ok(_) => ok += 1,
            Err(StoreError::Full(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ok, n, "{tag}: {ok} new keys fit under max_keys({n}) on an all-expired store (len {})", store.len());
    assert!(store.len() <= n, "{tag}: len {} > {n}", store.len());
}

/// Many operations from two threads (checks of one and several rules, probes, charges,
/// refunds, resets, blocks and lifts, impossible costs), keys expiring as the clock moves:
/// `live` must stay the number of entries.
#[test]
fn live_never_drifts_under_concurrent_mixed_operations() {
    for round in 0..3u64 {
        let n = 64;
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(n);
        let now = Arc::new(AtomicU64::new(T0));
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (store, now, clock) = (store.clone(), now.clone(), clock.clone());
                std::thread::spawn(move || {
                    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (t + 1) ^ (round << 8);
                    let mut rnd = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let algs = [
                        Algorithm::FixedWindow,
                        Algorithm::SlidingWindowLog,
                        Algorithm::SlidingWindowCounter,
                        Algorithm::TokenBucket,
                        Algorithm::LeakyBucket,
                        Algorithm::Gcra,
                    ];
                    for _ in 0..40_000 {
                        let r = rnd();
                        let t_now = if t == 0 && r % 50 == 0 {
                            let v = now.fetch_add(7_000 + r % 300_000, Ordering::Relaxed) + 7_000 + r % 300_000;
                            clock.set(v);
                            v
                        } else {
                            now.load(Ordering::Relaxed)
                        };
                        let alg = algs[(r >> 8) as usize % algs.len()];
                        let q =
                            if r & 1 == 0 { Quota::per_second(3) } else { Quota::new(2, Duration::from_millis(50)) };
                        let k = format!("k{}", (r >> 16) % 200);
                        let cost = match (r >> 24) % 10 {
                            0 => 0,
                            1 => 50, // never fits
                            _ => 1,
                        };
                        let c = check("a", &k, alg, q, cost);
                        match (r >> 32) % 8 {
                            0 | 1 => {
                                let _ = store.check_one_at(&c, t_now);
                            }
                            2 => {
                                let d = check("b", &k, alg, q, 1);
                                let e = check("c", &format!("k{}", (r >> 40) % 200), alg, q, 1);
                                if let Ok(os) = store.check_at(&[c.clone(), d, e.clone()], t_now) {
                                    if let Some(taken) = os[0].taken {
                                        store.refund_at(&[Refund { check: c, taken }], t_now + 1);
                                    }
                                }
                            }
                            3 => {
                                let _ = store.charge_at(&[check("a", &k, alg, q, 1 + r % 3)], t_now);
                            }
                            4 => {
                                let _ = LocalStore::reset_now(&store, "a", &Key::from(k.as_str()), alg);
                            }
                            5 => {
                                let _ = LocalStore::block_now(&store, &c, Duration::from_millis(r % 200));
                            }
                            6 => {
                                let _ = LocalStore::block_now(&store, &c, Duration::ZERO);
                            }
                            _ => {
                                if let Ok(o) = store.check_one_at(&c, t_now) {
                                    if let Some(taken) = o.taken {
                                        store.refund_at(&[Refund { check: c, taken }], t_now);
                                    }
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(store.len() <= n, "len {} > max_keys {n}", store.len());
        let later = now.load(Ordering::Relaxed) + 3_600_000_000;
        clock.set(later);
        exactly_n_fit(&store, n, later, &format!("round{round}"));
    }
}

/// The store holds one state, expired (past its expiry, inside the sweeps' second of
/// grace): a new key has room — for a check, and for a charge or a block too (they swept
/// only their own shard, and a charge to a new key was lost). Several fresh stores, so
/// that a lucky shard cannot hide it.
#[test]
fn a_charge_or_block_of_a_new_key_finds_the_room_a_check_finds() {
    let q = Quota::per_second(1);
    let mut failures = Vec::new();
    for seed in 0..6 {
        for what in ["check", "charge", "block"] {
            let clock = ManualClock::new(T0);
            let store = MemoryStore::with_clock(clock.clone()).max_keys(1);
            store.check_one_at(&check("r", &format!("old-{seed}"), Algorithm::Gcra, q, 1), T0).unwrap();
            // 1.5 s later: the old state expired 0.5 s ago; nothing live is held.
            let now = T0 + 1_500_000;
            clock.set(now);
            let new = check("r", &format!("new-{seed}"), Algorithm::Gcra, q, 1);
            let r = match what {
                "check" => store.check_one_at(&new, now).map(drop),
                "charge" => store.charge_at(&[new], now),
                _ => LocalStore::block_now(&store, &new, Duration::from_secs(60)),
            };
            if let Err(e) = r {
                failures.push(format!("seed {seed}: {what}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "refused with no live state held: {failures:#?}");
}
