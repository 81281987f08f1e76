//! A fresh reviewer's attacks on `MemoryStore`'s lanes (GCRA and the token bucket, one
//! word a key), its `max_keys` bound, blocks beside the lane, and keys held as numbers.

use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::{Check, LocalStore, Params};
use tollgate::{Algorithm, MemoryStore, Quota};

const T0: u64 = 1_700_000_000_000_000;

fn check(rule: &str, key: impl Into<Key>, algorithm: Algorithm, quota: Quota, cost: u64) -> Check {
    let mut params = Params::new(quota);
    params.cost = cost;
    Check { rule: rule.into(), key: key.into(), algorithm, params }
}

/// A charge of two rules on a full store: the first (a lane key that has a state) is
/// taken, the second needs a new state and finds the store full; `charge_at` then makes
/// room everywhere (an expired lane word elsewhere goes) and runs the whole charge again,
/// taking the first rule's units a second time. `limiter.charge(&verdict, 3)` takes 6.
#[test]
fn review_a_charge_retried_for_room_takes_each_rule_once() {
    let run = |max_keys: Option<usize>| {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let store = match max_keys {
            Some(n) => store.max_keys(n),
            None => store,
        };
        let a = check("charged", "a", Algorithm::Gcra, Quota::per_hour(10), 1);
        // A state that expires in a second: room a full sweep can make, in another lane.
        let z = check("short", "z", Algorithm::Gcra, Quota::per_second(1), 1);
        assert!(store.check_one_at(&a, T0).unwrap().decision.allowed);
        assert!(store.check_one_at(&z, T0).unwrap().decision.allowed);
        clock.set(T0 + 1_500_000);
        let now = clock.now_micros();
        let charges = [
            check("charged", "a", Algorithm::Gcra, Quota::per_hour(10), 3),
            check("other", "b", Algorithm::FixedWindow, Quota::per_hour(10), 1),
        ];
        store.charge_at(&charges, now).unwrap();
        LocalStore::peek_now(&store, &a).unwrap().remaining()
    };
    let unbounded = run(None);
    assert_eq!(unbounded, 5, "10 - 1 checked - 3 charged - 1 peeked");
    assert_eq!(run(Some(2)), unbounded, "the full store charged the lane key's 3 units twice");
}

/// A lane key that has a state, rejected by a rule with `block_for` on a full store: the
/// block needs a state of its own beside the lane (the old tables), finds no room, and is
/// dropped, so the key is admitted again as soon as GCRA refills, 58 s before its block
/// ends. The same rule under a window algorithm (the block in the key's own state) stays
/// blocked: `max_keys` says a key that has a state keeps being limited exactly.
#[test]
fn review_a_penalised_lane_key_stays_blocked_on_a_full_store() {
    let blocked_after_2s = |algorithm: Algorithm| {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(2);
        let mut p = check("penalised", "k", algorithm, Quota::per_second(1), 1);
        p.params.block_us = 60_000_000;
        let filler = check("filler", "f", Algorithm::Gcra, Quota::per_hour(10), 1);
        assert!(store.check_one_at(&p, T0).unwrap().decision.allowed);
        assert!(store.check_one_at(&filler, T0).unwrap().decision.allowed);
        let d = store.check_one_at(&p, T0).unwrap().decision;
        assert!(!d.allowed);
        assert!(d.retry_after() > Some(Duration::from_secs(59)), "{algorithm}: the block's retry: {d:?}");
        clock.set(T0 + 2_000_000);
        let d = store.check_one_at(&p, clock.now_micros()).unwrap().decision;
        !d.allowed
    };
    assert!(blocked_after_2s(Algorithm::FixedWindow), "control: a window rule's block holds");
    assert!(blocked_after_2s(Algorithm::Gcra), "the GCRA key's block_for was dropped on a full store");
}

/// A lane key blocked by hand (or penalised by `block_for`, its word since dropped for
/// room: the block outlives the word) on a full store, in a call of two rules: the call
/// makes a word for every lane rule before it reads any block, finds no room, and fails
/// with `Full` — which a limiter failing open passes unlimited — where the same key
/// checked alone is refused by its block with no word made.
#[test]
fn review_a_blocked_lane_key_is_refused_in_a_call_of_several_rules_on_a_full_store() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone()).max_keys(3);
    let mut g = check("blocked-g", "k", Algorithm::Gcra, Quota::per_hour(100), 1);
    g.params.blockable = true;
    let w = check("window-w", "k", Algorithm::FixedWindow, Quota::per_hour(100), 1);
    assert!(store.check_one_at(&w, T0).unwrap().decision.allowed);
    LocalStore::block_now(&store, &g, Duration::from_secs(600)).unwrap();
    let filler = check("filler-f", "f", Algorithm::Gcra, Quota::per_hour(100), 1);
    assert!(store.check_one_at(&filler, T0).unwrap().decision.allowed);
    // Alone: refused by the block.
    let alone = store.check_one_at(&g, T0).unwrap().decision;
    assert!(!alone.allowed && alone.retry_after() > Some(Duration::from_secs(500)), "{alone:?}");
    // With the window rule: the same refusal, nothing taken.
    match store.check_at(&[g.clone(), w.clone()], T0) {
        Ok(os) => {
            assert!(!os[0].decision.allowed, "{:?}", os[0].decision);
            assert!(os.iter().all(|o| o.taken.is_none()));
        }
        Err(e) => panic!("the blocked key's call of two rules failed: {e} (a limiter failing open passes it)"),
    }
}
