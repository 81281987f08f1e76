//! `MemoryStore` with more threads than cores (the shards' locks with their holders
//! preempted): exact counts on one key and on many, multi-rule checks taken all or
//! nothing, refunds, and no deadlock among checks, charges, resets, blocks, sweeps and
//! `len` on a full store. Every scenario runs under a watchdog: a lock that is never
//! released fails the test instead of hanging it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::{Check, LocalStore, Params, Refund};
use tollgate::{Algorithm, MemoryStore, Quota};

const T0: u64 = 1_700_000_000_000_000;

fn check(rule: &str, key: &str, algorithm: Algorithm, quota: Quota) -> Check {
    Check { rule: rule.into(), key: key.into(), algorithm, params: Params::new(quota) }
}

/// Runs `f` on a thread of its own and fails if it takes longer than `limit` (a deadlock,
/// or a lock never released).
fn within(limit: Duration, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        // A panic in `f` drops the sender: report the panic, not a timeout.
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: not done in {limit:?} (deadlock?)"),
    }
}

#[test]
fn oversubscribed_threads_on_one_key_admit_exactly_the_limit() {
    within(Duration::from_secs(120), "one key", || {
        for threads in [8, 32] {
            for algorithm in Algorithm::ALL {
                if algorithm == Algorithm::LeakyBucket {
                    continue; // shapes rather than counts
                }
                let store = MemoryStore::with_clock(ManualClock::new(T0));
                let c = check("over-one", "hot", algorithm, Quota::per_hour(1_000));
                let admitted = AtomicUsize::new(0);
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| {
                            for _ in 0..2_000 / threads + 20 {
                                if store.check_one_at(&c, T0).unwrap().decision.allowed {
                                    admitted.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        });
                    }
                });
                assert_eq!(admitted.into_inner(), 1_000, "{algorithm}, {threads} threads");
                assert_eq!(store.len(), 1);
            }
        }
    });
}

#[test]
fn oversubscribed_threads_on_many_keys_admit_exactly_the_limit_of_each() {
    within(Duration::from_secs(120), "many keys", || {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let keys = 500;
        let admitted: Vec<AtomicUsize> = (0..keys).map(|_| AtomicUsize::new(0)).collect();
        std::thread::scope(|s| {
            for t in 0..32usize {
                let (store, admitted) = (&store, &admitted);
                s.spawn(move || {
                    // Every thread asks every key 4 times (limit 100: 128 asks), in its own order.
                    for round in 0..4 {
                        for i in 0..keys {
                            let k = (i * 7 + t * 31 + round * 13) % keys;
                            let c = check("over-many", &k.to_string(), Algorithm::Gcra, Quota::per_hour(100));
                            if store.check_one_at(&c, T0).unwrap().decision.allowed {
                                admitted[k].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        for (k, n) in admitted.iter().enumerate() {
            assert_eq!(n.load(Ordering::Relaxed), 100, "key {k}");
        }
        assert_eq!(store.len(), keys);
    });
}

/// Two rules on one key, checked together by 32 threads which give back every third
/// admission: the narrow rule admits exactly its limit of net admissions, and the wide
/// rule was taken from exactly as often (never by a call the narrow rule refused).
#[test]
fn multi_rule_checks_and_refunds_stay_atomic_when_oversubscribed() {
    within(Duration::from_secs(120), "multi-rule", || {
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowLog, Algorithm::Gcra, Algorithm::TokenBucket]
        {
            let store = MemoryStore::with_clock(ManualClock::new(T0));
            let wide = check("over-wide", "k", algorithm, Quota::per_hour(1_000));
            let narrow = check("over-narrow", "k", algorithm, Quota::per_hour(300));
            let both = [wide.clone(), narrow.clone()];
            let (admitted, refunded) = (AtomicUsize::new(0), AtomicUsize::new(0));
            std::thread::scope(|s| {
                for _ in 0..32 {
                    s.spawn(|| {
                        for i in 0..40 {
                            let outcomes = store.check_at(&both, T0).unwrap();
                            let allowed: Vec<bool> = outcomes.iter().map(|o| o.decision.allowed).collect();
                            let taken: Vec<bool> = outcomes.iter().map(|o| o.taken.is_some()).collect();
                            assert!(allowed[0], "{algorithm}: the wide rule refused");
                            // All or nothing: both taken, or neither.
                            assert_eq!(taken, [allowed[1]; 2], "{algorithm}");
                            if !allowed[1] {
                                continue;
                            }
                            admitted.fetch_add(1, Ordering::Relaxed);
                            if i % 3 == 0 {
                                let refunds: Vec<Refund> = both
                                    .iter()
                                    .zip(outcomes)
                                    .map(|(c, o)| Refund { check: c.clone(), taken: o.taken.unwrap() })
                                    .collect();
                                store.refund_at(&refunds, T0);
                                refunded.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            let (admitted, refunded) = (admitted.into_inner(), refunded.into_inner());
            let net = admitted - refunded;
            let remaining = |c: &Check| LocalStore::peek_now(&store, c).unwrap().remaining();
            if matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket) {
                // One word a key: a refund gives back all of its commit when no commit came
                // since, none otherwise, so with refunds racing commits the narrow rule
                // admits fewer than its limit of net admissions — never more. Each rule
                // holds what the admitted calls took less at most what they gave back: a
                // call the narrow rule refused took nothing from the wide one.
                assert!(net <= 300, "{algorithm}: {net} net admissions, over the limit of 300");
                for (c, limit) in [(&narrow, 300), (&wide, 1_000)] {
                    let used = limit - remaining(c);
                    assert!(
                        (net..=admitted).contains(&(used as usize)),
                        "{algorithm} {}: {used} units held, {admitted} admitted, {refunded} given back",
                        c.rule
                    );
                }
                continue;
            }
            assert_eq!(net, 300, "{algorithm}: net admissions");
            assert_eq!(remaining(&narrow), 0, "{algorithm}");
            // The wide rule as 300 admissions on one thread leave it.
            let reference = MemoryStore::with_clock(ManualClock::new(T0));
            for _ in 0..300 {
                assert!(reference.check_one_at(&wide, T0).unwrap().decision.allowed);
            }
            let want = LocalStore::peek_now(&reference, &wide).unwrap().remaining();
            assert_eq!(remaining(&wide), want, "{algorithm}: the wide rule taken from by refused calls");
        }
    });
}

/// 32 threads over 2 cores doing everything at once to a store bound by `max_keys`, with
/// time moving (sweeps by time, by doubling, and for room in every shard): no deadlock,
/// the bound is never passed, `len` stays within it, and when the dust settles a fresh
/// key is still limited exactly.
#[test]
fn everything_at_once_on_a_full_store_never_deadlocks() {
    within(Duration::from_secs(120), "everything at once", || {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(200);
        let algorithms = Algorithm::ALL;
        let fulls = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..32u64 {
                let (store, clock, fulls) = (&store, &clock, &fulls);
                s.spawn(move || {
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    let mut next = || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for _ in 0..3_000 {
                        let r = next();
                        let c = |r: u64| Check {
                            rule: ["all-a", "all-b", "all-c"][(r % 3) as usize].into(),
                            key: Key::from(r / 3 % 400),
                            algorithm: algorithms[(r / 1_200 % algorithms.len() as u64) as usize],
                            params: Params::new(Quota::per_second(5)),
                        };
                        let now = clock.now_micros();
                        let result = match r >> 59 {
                            0..=9 => store.check_one_at(&c(r), now).map(drop),
                            // Two to four distinct rules of random keys: several shards, locked in order.
                            10..=17 => {
                                let mut cs = vec![c(r)];
                                for _ in 0..(r >> 40) % 3 + 1 {
                                    let n = c(next());
                                    if !cs.iter().any(|o| o.rule == n.rule && o.key == n.key) {
                                        cs.push(n);
                                    }
                                }
                                store.check_at(&cs, now).map(drop)
                            }
                            18..=20 => store.charge_at(&[c(r), c(next())], now),
                            21 => LocalStore::block_now(store, &c(r), Duration::from_millis(r % 3 * 400)),
                            22 => LocalStore::reset_now(store, "all-a", &Key::from(r % 400), Algorithm::Gcra),
                            // Locks every shard in turn (not a snapshot: states come and go
                            // behind it, so it may count a reset state and its successor).
                            23 => {
                                std::hint::black_box(store.len());
                                Ok(())
                            }
                            // Time moves: sweeps by time, and expiries that make room.
                            24..=26 => {
                                clock.advance(Duration::from_millis(r % 900));
                                Ok(())
                            }
                            _ => LocalStore::peek_now(store, &c(r)).map(drop),
                        };
                        if result.is_err() {
                            fulls.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert!(store.len() <= 200, "len over max_keys: {}", store.len());
        // Past every expiry: a fresh key gets exactly its quota.
        clock.advance(Duration::from_secs(3_600));
        let now = clock.now_micros();
        let fresh = check("all-fresh", "k", Algorithm::FixedWindow, Quota::per_hour(3));
        let got: Vec<bool> = (0..5).map(|_| store.check_one_at(&fresh, now).unwrap().decision.allowed).collect();
        assert_eq!(got, [true, true, true, false, false]);
    });
}

/// Tokio worker threads outnumbering the cores, tasks outnumbering the workers, through the
/// async `Store` interface: exactly the limit.
#[test]
fn tokio_workers_outnumbering_the_cores_admit_exactly_the_limit() {
    within(Duration::from_secs(120), "tokio", || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(8).build().unwrap();
        rt.block_on(async {
            let store = MemoryStore::with_clock(ManualClock::new(T0));
            let c = check("over-tokio", "hot", Algorithm::SlidingWindowCounter, Quota::per_hour(500));
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (store, c) = (store.clone(), c.clone());
                    tokio::spawn(async move {
                        let mut n = 0;
                        for _ in 0..20 {
                            let o = tollgate::store::Store::check(&store, std::slice::from_ref(&c)).await.unwrap();
                            n += usize::from(o[0].as_ref().unwrap().decision.allowed);
                            tokio::task::yield_now().await;
                        }
                        n
                    })
                })
                .collect();
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap();
            }
            assert_eq!(total, 500);
        });
    });
}
