//! What `MemoryStore` holds one state for: one identity however its key is spelled (numbers,
//! addresses, long and hashed keys), rule and key kept apart by the table's hash, every
//! state found again through table growth under `max_keys`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::{Check, Params};
use tollgate::{Algorithm, MemoryStore, Quota, StoreError};

const T0: u64 = 1_700_000_000_000_000;

fn check(rule: &str, key: Key, algorithm: Algorithm, quota: Quota) -> Check {
    Check { rule: rule.into(), key, algorithm, params: Params::new(quota) }
}

fn remaining(store: &MemoryStore, rule: &str, key: Key, now: u64) -> u64 {
    let c = check(rule, key, Algorithm::FixedWindow, Quota::per_hour(100));
    store.check_at(&[c], now).unwrap()[0].decision.remaining()
}

/// Every spelling of one identity is one key: they count together.
#[test]
fn spellings_of_one_identity_count_together() {
    let long47 = "x".repeat(47);
    let long129 = "y".repeat(129);
    let groups: Vec<Vec<Key>> = vec![
        vec![Key::from(42u64), Key::from("42"), Key::display(42u64), Key::new(b"42"), Key::from(String::from("42"))],
        vec![Key::from(0u64), Key::from("0"), Key::display(0)],
        vec![Key::from(u64::MAX), Key::from(u64::MAX.to_string()), Key::display(u64::MAX)],
        vec![
            Key::from(IpAddr::V4(Ipv4Addr::new(10, 0, 200, 3))),
            Key::from("10.0.200.3"),
            Key::display(Ipv4Addr::new(10, 0, 200, 3)),
        ],
        vec![Key::from(IpAddr::V4(Ipv4Addr::new(255, 255, 255, 255))), Key::from("255.255.255.255")],
        vec![Key::from(IpAddr::V6(Ipv6Addr::LOCALHOST)), Key::from("::1"), Key::display(Ipv6Addr::LOCALHOST)],
        vec![Key::from(long47.as_str()), Key::display(&long47), Key::new(long47.as_bytes())],
        vec![
            Key::from("z".repeat(46)),
            Key::display("z".repeat(46)),
            Key::display(format_args!("{}{}", "z".repeat(40), "z".repeat(6))),
        ],
        vec![Key::from(long129.as_str()), Key::display(&long129)],
    ];
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    for (g, keys) in groups.iter().enumerate() {
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(k, &keys[0], "group {g}: {k:?} vs {:?}", keys[0]);
            let left = remaining(&store, "spell", k.clone(), clock.now_micros());
            assert_eq!(left, 99 - i as u64, "group {g}, spelling {i} ({k:?}) counted apart");
        }
    }
    // A digest never equals the short key of its bytes.
    let d = Key::from(long129.as_str());
    assert_ne!(Key::new(&d.as_bytes()), d);
}

/// (rule, key) pairs whose concatenations agree are still distinct states.
#[test]
fn rule_and_key_boundaries_stay_apart() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let now = clock.now_micros();
    let pairs = [("ab", "c"), ("a", "bc"), ("abc", ""), ("", "abc"), ("a\0", "bc"), ("a", "\0bc")];
    for (rule, key) in pairs {
        assert_eq!(remaining(&store, rule, Key::from(key), now), 99, "{rule:?}/{key:?} shared a state");
    }
    for (rule, key) in pairs {
        assert_eq!(remaining(&store, rule, Key::from(key), now), 98, "{rule:?}/{key:?}");
    }
    // Same rule and key, another algorithm: another state.
    let c = check("ab", Key::from("c"), Algorithm::Gcra, Quota::per_hour(100));
    assert_eq!(store.check_at(&[c], now).unwrap()[0].decision.remaining(), 99);
    // A 32-byte key, and the digest of a long key with the same 32 bytes.
    let long = Key::from("q".repeat(200));
    let short = Key::new(&long.as_bytes());
    assert_eq!(remaining(&store, "d", long.clone(), now), 99);
    assert_eq!(remaining(&store, "d", short, now), 99);
    assert_eq!(remaining(&store, "d", long, now), 98);
}

/// Many keys through rehash growth, under a bound: each state found again, the bound held.
#[test]
fn many_keys_through_growth_under_max_keys() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone()).max_keys(5_000);
    let now = clock.now_micros();
    for i in 0..5_000u64 {
        let key = if i % 2 == 0 { Key::from(i) } else { Key::from(i.to_string()) };
        assert_eq!(remaining(&store, if i % 3 == 0 { "r" } else { "s" }, key, now), 99, "{i}");
    }
    for i in 0..5_000u64 {
        let key = if i % 2 == 1 { Key::from(i) } else { Key::display(i) };
        assert_eq!(remaining(&store, if i % 3 == 0 { "r" } else { "s" }, key, now), 98, "{i}");
    }
    let c = check("r", Key::from("new"), Algorithm::FixedWindow, Quota::per_hour(100));
    assert!(matches!(store.check_at(&[c], now), Err(StoreError::Full(5_000))));
    // An hour on, every state expired: room again.
    clock.advance(std::time::Duration::from_secs(3_601));
    let now = clock.now_micros();
    for i in 0..5_000u64 {
        assert_eq!(remaining(&store, "t", Key::from(i), now), 99, "{i}");
    }
    assert!(store.len() <= 5_000);
}
