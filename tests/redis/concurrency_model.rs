//! Issue 42's model-based test: random entries, releases (some sent twice), renewals,
//! kills and the passing of time, by three servers (each its own `RedisStore`, on one
//! Redis, on one manual clock) on one key, against a small reference model: a permit is
//! held from its entry until it is released or, unless renewed, for its hold limit; a dead
//! server neither renews nor releases. Every entry's decision must be the model's. The
//! same operations on a `MemoryStore`, where nothing lapses, follow the model too.
#![cfg(feature = "redis")]

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::ManualClock;
use tollgate::store::{Check, Params, Refund, RuleName, Store};
use tollgate::{Algorithm, Quota, RedisStore};

use support::redis::RedisServer;

const T0: u64 = 1_700_000_000_000_000;
/// The hold limit: its keys live two of them in Redis's own (real) time.
const HOLD: Duration = Duration::from_secs(10);

fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

#[derive(Debug, Clone)]
enum Op {
    Enter { server: usize, cost: u64 },
    Release { pick: usize, twice: bool },
    Renew { server: usize },
    Kill { server: usize },
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..=3u64).prop_map(|(server, cost)| Op::Enter { server, cost }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, twice)| Op::Release { pick, twice }),
        2 => (0..3usize).prop_map(|server| Op::Renew { server }),
        1 => (0..3usize).prop_map(|server| Op::Kill { server }),
        3 => (0..7_000u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// One permit as the model holds it.
#[derive(Debug)]
struct Held {
    server: usize,
    units: u64,
    lapse: u64,
    refund: Refund,
}

fn run(n: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    static CASE: AtomicUsize = AtomicUsize::new(0);
    let prefix = format!("concmodel{}", CASE.fetch_add(1, Ordering::SeqCst));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let clock = ManualClock::new(T0);
        let stores: Vec<RedisStore> = (0..3)
            .map(|_| {
                RedisStore::from_url(&redis().url())
                    .unwrap()
                    .prefix(&prefix)
                    .unwrap()
                    .response_timeout(Duration::from_secs(2))
                    .with_clock(clock.clone())
            })
            .collect();
        drive(n, ops, &stores, &clock, true).await
    })
}

/// The same on one `MemoryStore` shared by the three servers (in process nothing lapses:
/// the model's permits live until released).
fn run_in_memory(n: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let clock = ManualClock::new(T0);
        let store = tollgate::MemoryStore::with_clock(clock.clone());
        drive(n, ops, &[store.clone(), store.clone(), store], &clock, false).await
    })
}

/// Runs `ops` on `stores` (one per server) against the model; `lapses`: whether a
/// permit not renewed lapses after the hold limit.
async fn drive<S: Store>(
    n: u64,
    ops: &[Op],
    stores: &[S],
    clock: &ManualClock,
    lapses: bool,
) -> Result<(), TestCaseError> {
    {
        let check = |cost| Check {
            rule: RuleName::new("in-flight"),
            key: "acme".into(),
            algorithm: Algorithm::Concurrent,
            params: Params::new(Quota::new(n, HOLD)).cost(cost),
        };
        let (mut now, mut alive, mut held) = (T0, [true; 3], Vec::<Held>::new());
        let w = if lapses { u64::try_from(HOLD.as_micros()).unwrap() } else { 1 << 60 };
        for (step, op) in ops.iter().enumerate() {
            // Lapsed permits are gone.
            held.retain(|h| h.lapse > now);
            match *op {
                Op::Enter { server, cost } if alive[server] => {
                    let c = check(cost);
                    let o = stores[server].check(std::slice::from_ref(&c)).await.unwrap()[0].clone().unwrap();
                    let used: u64 = held.iter().map(|h| h.units).sum();
                    let admit = used + cost <= n;
                    prop_assert_eq!(o.decision.allowed, admit, "step {} {:?}: {} held of {}", step, op, used, n);
                    if admit {
                        prop_assert_eq!(o.decision.remaining(), n - used - cost);
                        let refund = Refund { check: c, taken: o.taken.unwrap() };
                        held.push(Held { server, units: cost, lapse: now + w, refund });
                    } else {
                        prop_assert_eq!(o.decision.retry_after().is_some(), cost <= n);
                    }
                }
                Op::Release { pick, twice } if !held.is_empty() => {
                    let h = held.remove(pick % held.len());
                    if alive[h.server] {
                        let r = std::slice::from_ref(&h.refund);
                        stores[h.server].refund(r).await.unwrap();
                        if twice {
                            stores[h.server].refund(r).await.unwrap();
                        }
                    } else {
                        held.push(h); // a dead server releases nothing
                    }
                }
                Op::Renew { server } if alive[server] => {
                    let mine: Vec<Refund> =
                        held.iter().filter(|h| h.server == server).map(|h| h.refund.clone()).collect();
                    if !mine.is_empty() {
                        stores[server].renew(&mine).await.unwrap();
                    }
                    for h in held.iter_mut().filter(|h| h.server == server) {
                        h.lapse = now + w;
                    }
                }
                Op::Kill { server } => alive[server] = false,
                Op::Advance { ms } => {
                    now += ms * 1_000;
                    clock.set(now);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn permits_on_redis_follow_the_reference_model(n in 1..6u64, ops in prop::collection::vec(op(), 1..60)) {
        run(n, &ops)?;
    }

    #[test]
    fn permits_in_memory_follow_the_reference_model(n in 1..6u64, ops in prop::collection::vec(op(), 1..60)) {
        run_in_memory(n, &ops)?;
    }
}
