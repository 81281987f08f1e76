//! Which rule names the live limiters of this process use on which store: two limiters
//! over one store with one rule name would share their counts without anyone asking for
//! it (two `RateLimitLayer::new` on two routes, both named `"default"`), so the second one
//! is refused. Clones of one layer share one limiter and one [`Claim`]. A limiter whose
//! rules are swapped at run time makes a claim per rule set, all with its [`Owner`]: the
//! sets still deciding inputs in flight hold their names without blocking the next set.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

/// Who claims: one limiter, through all its rule sets.
pub(crate) type Owner = u64;

/// A new owner, for a new limiter.
pub(crate) fn new_owner() -> Owner {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The names one rule set of a limiter holds on one store, released when the set is
/// dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    names: Vec<(usize, Arc<str>)>,
}

/// Per (store, name): the owner, and its claims that list the name (several while sets
/// of inputs in flight outlive a swap). Counted, never upgraded: an upgraded claim dropped
/// under the lock would run its `Drop`, which takes the lock.
type Registry = HashMap<(usize, Arc<str>), (Owner, Vec<Weak<Claim>>)>;

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Claims `names` for `owner` on the store of identity `store` (see `Store::identity`),
/// or returns the first name another live limiter holds there. Names the owner's other
/// rule sets hold are taken over.
pub(crate) fn claim<'a>(
    store: usize,
    owner: Owner,
    names: impl Iterator<Item = &'a Arc<str>>,
) -> Result<Arc<Claim>, Arc<str>> {
    let names: Vec<(usize, Arc<str>)> = names.map(|n| (store, n.clone())).collect();
    let mut reg = registry();
    let held_by_other =
        |(by, claims): &(Owner, Vec<Weak<Claim>>)| *by != owner && claims.iter().any(|w| w.strong_count() > 0);
    if let Some((_, taken)) = names.iter().find(|k| reg.get(k).is_some_and(held_by_other)) {
        return Err(taken.clone());
    }
    let claim = Arc::new(Claim { names });
    for k in &claim.names {
        let (by, claims) = reg.entry(k.clone()).or_insert_with(|| (owner, Vec::new()));
        if *by != owner {
            (*by, *claims) = (owner, Vec::new()); // the other owner's claims are all gone
        }
        claims.retain(|w| w.strong_count() > 0);
        claims.push(Arc::downgrade(&claim));
    }
    Ok(claim)
}

/// The live owner of `name` on the store of identity `store`, if any: the limiter that
/// `RateLimitLayer::new` joins when its `"default"` is taken, so that both claim the name
/// as one owner (neither's drop frees it while the other lives, and each may swap it).
pub(crate) fn owner_of(store: usize, name: &Arc<str>) -> Option<Owner> {
    let reg = registry();
    let (by, claims) = reg.get(&(store, name.clone()))?;
    claims.iter().any(|w| w.strong_count() > 0).then_some(*by)
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut reg = registry();
        for k in &self.names {
            // This claim's weak is dead now; the name stays while another claim lists it.
            if let Some((_, claims)) = reg.get_mut(k) {
                claims.retain(|w| w.strong_count() > 0);
                if claims.is_empty() {
                    reg.remove(k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_held_while_its_claim_lives() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let first = claim(1, 101, [&a, &b].into_iter()).unwrap();
        assert_eq!(&*claim(1, 103, [&b].into_iter()).unwrap_err(), "b");
        let other_store = claim(2, 102, [&a].into_iter()).unwrap();
        drop(first);
        let again = claim(1, 101, [&a, &b].into_iter()).unwrap();
        drop((again, other_store));
        assert!(registry().keys().all(|(s, _)| *s != 1 && *s != 2));
    }

    #[test]
    fn a_swap_takes_over_its_own_names_and_releases_the_dropped_ones() {
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("sa".into(), "sb".into(), "sc".into());
        let (me, other_owner) = (new_owner(), new_owner());
        let first = claim(3, me, [&a, &b].into_iter()).unwrap();
        let other = claim(3, other_owner, [&c].into_iter()).unwrap();
        assert_eq!(&*claim(3, me, [&a, &c].into_iter()).unwrap_err(), "sc", "another limiter's name");
        // A set without "sb", then one with it again while the first is still alive (an
        // input in flight holds it): all the owner's own.
        let second = claim(3, me, [&a].into_iter()).unwrap();
        let third = claim(3, me, [&a, &b].into_iter()).unwrap();
        assert_eq!(&*claim(3, other_owner, [&b].into_iter()).unwrap_err(), "sb");
        drop((first, third));
        // "sb" is free once no set of the owner holds it; "sa" is still held by the second.
        let again = claim(3, other_owner, [&b].into_iter()).unwrap();
        assert_eq!(&*claim(3, other_owner, [&a].into_iter()).unwrap_err(), "sa");
        drop((second, other, again));
    }
}
