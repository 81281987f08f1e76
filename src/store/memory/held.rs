//! A shard's lock in a bad case: a panic while it is held.

use std::time::Duration;

use super::table::lock;
use super::{Check, MemoryStore, Probe};
use crate::algorithm::Params;
use crate::key::Key;
use crate::quota::Quota;
use crate::store::LocalStore;
use crate::Algorithm;

const T0: u64 = 1_700_000_000_000_000;

fn check(rule: &str, key: Key) -> Check {
    Check { rule: rule.into(), key, algorithm: Algorithm::FixedWindow, params: Params::new(Quota::per_second(2)) }
}

/// The shard index of `c`'s state.
fn shard_of(store: &MemoryStore, c: &Check) -> usize {
    store.shard_of(store.inner.hash(c.rule, &Probe::of(&c.key)))
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
        assert!(d.allowed && d.remaining() == 0, "{d:?}");
    });
    assert!(!store.check_one_at(&c, T0).unwrap().decision.allowed);
    assert_eq!(store.len(), 1);
    LocalStore::reset_now(&store, "held-panic", &c.key, Algorithm::FixedWindow).unwrap();
    assert_eq!(store.len(), 0);
}
