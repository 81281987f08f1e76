//! `MemoryStore` on its own, through its public API with explicit times: exact under
//! contention, idle keys swept without help, `max_keys`, tiers, blocks, charges.

use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::{Check, LocalStore, Params, Refund, RuleName, Taken};
use tollgate::{Algorithm, MemoryStore, Quota, StoreError};

const T0: u64 = 1_700_000_000_000_000;

fn check(rule: &str, key: &str, algorithm: Algorithm, quota: Quota) -> Check {
    Check { rule: rule.into(), key: key.into(), algorithm, params: Params::new(quota) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammering_one_key_accepts_exactly_the_limit() {
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::LeakyBucket {
            continue; // shapes rather than counts; covered by the service tests
        }
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let c = check("r", "hot", algorithm, Quota::per_hour(100));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (store, c) = (store.clone(), c.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    for _ in 0..50 {
                        if store.check_one_now(&c).unwrap().decision.allowed {
                            n += 1;
                        }
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
        assert_eq!(total, 100, "{algorithm}");
    }
}

#[test]
fn idle_keys_are_dropped_without_help() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let q = Quota::per_second(10);
    for i in 0..20_000 {
        store.check_at(&[check("r", &format!("k{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
    }
    assert!(store.len() >= 20_000);
    // Long after every state expired, new traffic sweeps the old keys out.
    clock.advance(Duration::from_secs(5));
    for i in 0..20_000 {
        store.check_at(&[check("r", &format!("n{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
    }
    let len = store.len();
    assert!(len < 30_000, "expired keys were kept: {len}");
}

#[test]
fn recently_expired_keys_are_kept_for_a_second() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let q = Quota::per_second(10); // a GCRA state expires 100 ms after one request
    for i in 0..20_000 {
        store.check_at(&[check("r", &format!("k{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
    }
    clock.advance(Duration::from_millis(200));
    for i in 0..20_000 {
        store.check_at(&[check("r", &format!("n{i}"), Algorithm::Gcra, q)], clock.now_micros()).unwrap();
    }
    // Every shard swept at least once, and kept the states expired 100 ms ago.
    assert_eq!(store.len(), 40_000);
}

/// A charged rule's probe (cost 0) is decided and takes nothing, alone or beside a
/// rule that takes; a charge takes its units whatever the decision.
#[test]
fn a_probe_takes_nothing_and_a_charge_takes_past_the_limit() {
    let store = MemoryStore::new();
    for a in Algorithm::ALL {
        let mut probe = check("tokens", "k", a, Quota::per_minute(3));
        probe.params.cost = 0;
        let other = check("requests", "k", a, Quota::per_minute(3));
        for _ in 0..5 {
            assert!(store.check_at(std::slice::from_ref(&probe), T0).unwrap()[0].taken.is_none(), "{a}");
            let both = store.check_at(&[probe.clone(), other.clone()], T0).unwrap();
            assert!(both[0].taken.is_none(), "{a}");
        }
        let left = |c: &Check| {
            let mut one = c.clone();
            one.params.cost = 1;
            store.check_at(std::slice::from_ref(&one), T0).unwrap()[0].decision.allowed
        };
        assert!(left(&probe), "{a}: five probes took nothing");
        let mut charge = probe.clone();
        charge.params.cost = 7;
        store.charge_at(std::slice::from_ref(&charge), T0).unwrap();
        assert!(!store.check_at(std::slice::from_ref(&probe), T0).unwrap()[0].decision.allowed, "{a}: in debt");
    }
}

#[test]
fn a_rejected_rule_consumes_nothing_from_the_others() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let wide = check("wide", "k", Algorithm::SlidingWindowLog, Quota::per_minute(10));
    let narrow = check("narrow", "k", Algorithm::FixedWindow, Quota::per_minute(2));
    let both = [wide.clone(), narrow.clone()];
    let got: Vec<bool> =
        (0..5).map(|_| store.check_at(&both, T0).unwrap().iter().all(|o| o.decision.allowed)).collect();
    assert_eq!(got, [true, true, false, false, false]);
    // Only the two accepted requests were taken from the wide rule.
    assert_eq!(store.check_at(&[wide], T0).unwrap()[0].decision.remaining(), 7);
}

#[tokio::test]
async fn peek_and_reset() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let c = check("r", "k", Algorithm::TokenBucket, Quota::per_minute(3));
    for _ in 0..3 {
        store.check_now(std::slice::from_ref(&c)).unwrap();
    }
    let d = store.peek_now(&c).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.remaining(), 0);
    assert!(!store.peek_now(&c).unwrap().allowed, "peek consumed something");
    store.reset_now("r", &c.key, c.algorithm).unwrap();
    assert_eq!(store.peek_now(&c).unwrap().remaining(), 2);
    store.refund_now(&[Refund { check: c.clone(), taken: Taken { at: T0 } }]).unwrap();
}

#[test]
fn a_spike_of_keys_is_swept_by_time_under_light_traffic() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let q = Quota::per_minute(10);
    for i in 0..200_000 {
        store.check_one_at(&check("r", &format!("k{i}"), Algorithm::Gcra, q), clock.now_micros()).unwrap();
    }
    assert_eq!(store.len(), 200_000);
    // An hour later, light traffic: a single request (on one shard) sweeps them all.
    clock.advance(Duration::from_secs(3600));
    store.check_one_at(&check("r", "one", Algorithm::Gcra, q), clock.now_micros()).unwrap();
    assert_eq!(store.len(), 1, "the spike outlived its expiry");
}

#[test]
fn max_keys_bounds_the_states_and_keeps_every_known_key_exact() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone()).max_keys(1_000);
    let cap = 1_000;
    let q = Quota::per_hour(3);
    let mut full = 0;
    for i in 0..5_000 {
        match store.check_one_at(&check("r", &format!("k{i}"), Algorithm::FixedWindow, q), T0) {
            Ok(o) => assert!(o.decision.allowed),
            Err(StoreError::Full(1_000)) => full += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(store.len() <= cap, "{} states for a bound of {cap}", store.len());
    assert!(full >= 5_000 - cap, "{full} refused");
    // A key that has a state is still limited exactly while the store is full.
    let known = (0..5_000)
        .map(|i| check("r", &format!("k{i}"), Algorithm::FixedWindow, q))
        .find(|c| store.check_one_at(c, T0).is_ok())
        .unwrap();
    let allowed: Vec<bool> = (0..3).map(|_| store.check_one_at(&known, T0).unwrap().decision.allowed).collect();
    assert_eq!(allowed, [true, false, false], "1 + 1 taken above, of 3");
    // Once states expire, new keys get room again.
    clock.advance(Duration::from_secs(3600));
    assert!(store.check_one_at(&check("r", "late", Algorithm::FixedWindow, q), clock.now_micros()).is_ok());
}

#[test]
fn a_tier_with_a_shorter_period_does_not_shorten_a_longer_ones_state() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let daily = check("r", "acct", Algorithm::SlidingWindowLog, Quota::per_day(2));
    let minute = check("r", "acct", Algorithm::SlidingWindowLog, Quota::per_minute(1000));
    assert!(store.check_one_at(&daily, T0).unwrap().decision.allowed);
    assert!(store.check_one_at(&minute, T0).unwrap().decision.allowed);
    // The per-minute commit asked for a short life; the daily units must still count
    // once it has passed, also across a sweep.
    clock.advance(Duration::from_secs(120));
    store
        .check_one_at(&check("r", "other", Algorithm::SlidingWindowLog, Quota::per_day(2)), clock.now_micros())
        .unwrap();
    let d = store.check_one_at(&daily, clock.now_micros()).unwrap().decision;
    assert!(!d.allowed, "the daily state was forgotten early: {d:?}");
}

/// A block needs a state; its lift does not make one, and a lifted block no longer
/// keeps its key's state alive in a full store (it used to, until the block's end).
#[test]
fn a_lifted_block_takes_no_room_in_a_full_store() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone()).max_keys(1);
    let q = Quota::per_minute(10);
    let key = |i: usize| check("r", &format!("k{i}"), Algorithm::Gcra, q);
    let (a, b) = (key(0), key(1));
    LocalStore::block_now(&store, &a, Duration::from_secs(86_400)).unwrap();
    assert!(matches!(LocalStore::check_one_now(&store, &b), Err(StoreError::Full(1))), "the block holds the room");
    LocalStore::block_now(&store, &b, Duration::ZERO).expect("a lift of a key with no state is a no-op");
    LocalStore::block_now(&store, &a, Duration::ZERO).unwrap();
    clock.advance(Duration::from_secs(2));
    assert!(LocalStore::check_one_now(&store, &b).unwrap().decision.allowed, "the lifted block still held the room");
}

/// `max_keys(n)` refuses the first new state at `n`, whatever the hash seed (it used to
/// split `n` over the shards, and one full shard refused at 39–70 % of `n`).
#[test]
fn max_keys_refuses_first_at_n_whatever_the_seed() {
    for seed in 0..6 {
        let store = MemoryStore::with_clock(ManualClock::new(T0)).max_keys(320);
        let q = Quota::per_hour(3);
        let held = (0..10_000)
            .take_while(|i| store.check_one_at(&check("r", &format!("s{seed}-{i}"), Algorithm::Gcra, q), T0).is_ok())
            .count();
        assert_eq!(held, 320, "store {seed}: the first refusal came at {held}");
        assert_eq!(store.len(), 320);
    }
}

/// A check of two new rules on a full store is refused whole: neither keeps a unit (a
/// state made for the first was dropped to make room for the second, then made again
/// to commit it).
#[test]
fn a_multi_rule_check_on_a_full_store_takes_nothing() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone()).max_keys(1);
    let q = Quota::per_hour(3);
    let (a, b) = (check("a", "k1", Algorithm::Gcra, q), check("b", "k2", Algorithm::Gcra, q));
    let err = store.check_at(&[a.clone(), b.clone()], T0).unwrap_err();
    assert!(matches!(err, StoreError::Full(1)), "{err}");
    assert_eq!(store.len(), 0, "a refused call made a state");
    let d = store.check_one_at(&a, T0).unwrap().decision;
    assert_eq!(d.remaining(), 2, "the refused call kept a unit of rule a");
    // With room for both, both are decided together.
    let store = MemoryStore::with_clock(clock).max_keys(2);
    let outcomes = store.check_at(&[a, b], T0).unwrap();
    assert!(outcomes.iter().all(|o| o.taken.is_some()));
}

/// Keys on both sides of the table's lines: inline up to 22 bytes, out of line beyond,
/// digests (over 128 bytes) beside plain keys of the same 32 bytes.
fn boundary_keys() -> Vec<Key> {
    let mut keys: Vec<Key> = Vec::new();
    for len in [1, 21, 22, 23, 24, 46, 47, 128, 129, 200] {
        for (first, last) in [('a', 'a'), ('b', 'a'), ('a', 'b')] {
            let mut s = "x".repeat(len);
            s.replace_range(0..1, &first.to_string());
            s.replace_range(len - 1..len, &last.to_string());
            let key = Key::from(s.as_str());
            if key.is_hashed() {
                keys.push(Key::new(&key.as_bytes())); // the plain twin of the digest
            }
            keys.push(key);
        }
    }
    keys.dedup();
    keys
}

proptest::proptest! {
    /// Every (rule, algorithm, key) is its own state, whatever side of the table's lines
    /// its key falls on: each admits exactly its quota at one instant, a peek takes
    /// nothing, a reset gives it all back, and nothing else moves. Against a map of counts.
    #[test]
    fn every_rule_algorithm_and_key_is_its_own_state(
        ops in proptest::collection::vec((0..3usize, 0..5usize, 0..64usize, 0..10u8), 1..400),
    ) {
        const LIMIT: u64 = 3;
        let algorithms = [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowLog,
            Algorithm::SlidingWindowCounter,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ];
        let keys = boundary_keys();
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let mut counts: std::collections::HashMap<(usize, usize, usize), u64> = Default::default();
        for (rule, algorithm, key, op) in ops {
            let key = key % keys.len();
            let name = format!("boundary-{rule}");
            let c = Check {
                rule: name.as_str().into(),
                key: keys[key].clone(),
                algorithm: algorithms[algorithm],
                params: Params::new(Quota::per_hour(LIMIT)),
            };
            let count = counts.entry((rule, algorithm, key)).or_default();
            match op {
                8 => {
                    let d = store.peek_now(&c).unwrap();
                    proptest::prop_assert_eq!(d.allowed, *count < LIMIT, "peek of {:?}", c);
                }
                9 => {
                    LocalStore::reset_now(&store, &name, &c.key, c.algorithm).unwrap();
                    *count = 0;
                }
                _ => {
                    let allowed = store.check_one_now(&c).unwrap().decision.allowed;
                    proptest::prop_assert_eq!(allowed, *count < LIMIT, "check of {:?}", c);
                    *count += u64::from(allowed);
                }
            }
        }
    }
}

#[test]
fn resetting_a_name_no_rule_used_is_a_no_op_that_interns_nothing() {
    let store = MemoryStore::new();
    let name = "a-name-no-rule-or-check-of-this-process-uses";
    LocalStore::reset_now(&store, name, &Key::from("k"), Algorithm::Gcra).unwrap();
    assert_eq!(RuleName::existing(name), None);
}

/// Keys that differ only where the table's compact form could lose it (a trailing NUL,
/// the empty key, the 22/23, 46/47 and 128/129 byte lines, a digest beside its 32 bytes),
/// and keys made in different ways that are the same key (`display`, numbers, addresses):
/// the store shares a state exactly between keys that are `==`, under names interned on
/// other threads, in every algorithm's table, through one-rule and multi-rule checks.
#[test]
fn keys_share_a_state_exactly_when_they_are_equal() {
    let mut keys: Vec<Key> = vec![
        Key::new(b""),
        Key::new(b"\0"),
        Key::new(b"a"),
        Key::new(b"a\0"),
        Key::new(b"a\0\0"),
        Key::new(b"\0a"),
        Key::display("a"),
        Key::from(7u64),
        Key::from("7"),
        Key::from("1.2.3.4".parse::<std::net::IpAddr>().unwrap()),
        Key::from("1.2.3.4"),
        Key::from("::1".parse::<std::net::IpAddr>().unwrap()),
        Key::display("::1"),
    ];
    for len in [21, 22, 23, 45, 46, 47, 127, 128, 129] {
        let k = vec![b'k'; len];
        keys.push(Key::new(&k));
        let mut nul = vec![b'k'; len - 1];
        nul.push(0);
        keys.push(Key::new(&nul)); // same length, a NUL last
        keys.push(Key::new(&k[..len - 1])); // one shorter: `k` without its last byte
        let hashed = Key::new(&k);
        if hashed.is_hashed() {
            keys.push(Key::new(&hashed.as_bytes())); // the digest's 32 bytes, as a plain key
        }
        keys.push(Key::display(String::from_utf8(k).unwrap()));
    }
    keys.push(Key::new(&[0; 32]));
    keys.push(Key::new(&[0; 22]));
    keys.push(Key::new(&[0; 23]));
    // The same names, interned first on other threads.
    let names: Vec<RuleName> = std::thread::scope(|s| {
        ["same-key-a", "same-key-b"].map(|n| s.spawn(move || RuleName::new(n))).map(|h| h.join().unwrap()).to_vec()
    });
    for multi in [false, true] {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        for algorithm in Algorithm::ALL {
            for (i, key) in keys.iter().enumerate() {
                let seen = keys[..i].iter().any(|k| k == key);
                let one = |rule: &str| Check {
                    rule: rule.into(),
                    key: key.clone(),
                    algorithm,
                    params: Params::new(Quota::per_hour(1).burst(1)),
                };
                let allowed: Vec<bool> = if multi {
                    let cs = [one("same-key-a"), one("same-key-b")];
                    store.check_at(&cs, T0).unwrap().iter().map(|o| o.decision.allowed).collect()
                } else {
                    ["same-key-a", "same-key-b"]
                        .map(|r| store.check_one_at(&one(r), T0).unwrap().decision.allowed)
                        .to_vec()
                };
                assert_eq!(allowed, [!seen, !seen], "{algorithm} key {i} {key:?} (seen before: {seen})");
            }
        }
        let distinct = keys.iter().enumerate().filter(|(i, k)| !keys[..*i].contains(k)).count();
        assert_eq!(store.len(), distinct * 2 * Algorithm::ALL.len(), "one state per (rule, algorithm, key)");
        for (n, name) in names.iter().enumerate() {
            assert_eq!(*name, RuleName::new(["same-key-a", "same-key-b"][n]));
            // A reset by text finds what the checks made under the other thread's name.
            for key in &keys {
                LocalStore::reset_now(&store, name, key, Algorithm::Gcra).unwrap();
            }
        }
        assert_eq!(store.len(), distinct * 2 * (Algorithm::ALL.len() - 1), "reset dropped each GCRA state once");
    }
}

/// A block by hand stays through a swap that changes the rule's algorithm, as on Redis
/// (whose block is the key's under its rule, whatever the algorithm): before, the
/// in-process store kept the block in the old algorithm's state and admitted the key.
#[tokio::test]
async fn a_block_outlives_a_swap_to_another_algorithm() {
    use tollgate::{Limiter, Rule};
    let rule =
        |a: Algorithm| Rule::new("api", Quota::per_minute(100), |u: &str| Some(u.to_owned())).algorithm(a).blockable();
    let limiter = Limiter::builder(MemoryStore::new()).add_rule(rule(Algorithm::Gcra)).build().unwrap();
    assert!(limiter.check("mallory").await.is_allowed());
    limiter.block("api", "mallory", Duration::from_secs(3600)).await.unwrap();
    limiter.handle().set_rules(vec![rule(Algorithm::SlidingWindowLog)]).unwrap();
    let v = limiter.check("mallory").await;
    assert!(v.is_rejected(), "the block was lifted by a swap of algorithm: {v:?}");
    assert!(v.retry_after() > Some(Duration::from_secs(3590)), "{v:?}");
    assert!(limiter.check("ada").await.is_allowed(), "another key");
    // Lifted under the new algorithm, and swapped back: lifted under both.
    limiter.block("api", "mallory", Duration::ZERO).await.unwrap();
    assert!(limiter.check("mallory").await.is_allowed());
    limiter.handle().set_rules(vec![rule(Algorithm::Gcra)]).unwrap();
    assert!(limiter.check("mallory").await.is_allowed(), "the old algorithm's state kept the lifted block");
}
