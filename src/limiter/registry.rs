//! Which rule names the live limiters of this process use on which store: two limiters
//! over one store with one rule name would share their counts without anyone asking for
//! it (two `RateLimitLayer::new` on two routes, both named `"default"`), so the second one
//! is refused. Clones of one layer share one limiter and one [`Claim`].

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

/// The names one limiter holds on one store, released when the limiter is dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    names: Vec<(usize, Arc<str>)>,
}

type Registry = HashMap<(usize, Arc<str>), Weak<Claim>>;

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Claims `names` on the store of identity `store` (see `Store::identity`), or returns
/// the first name another live limiter holds there.
pub(crate) fn claim<'a>(store: usize, names: impl Iterator<Item = &'a Arc<str>>) -> Result<Arc<Claim>, Arc<str>> {
    let names: Vec<(usize, Arc<str>)> = names.map(|n| (store, n.clone())).collect();
    let mut reg = registry();
    if let Some((_, taken)) = names.iter().find(|k| reg.get(k).is_some_and(|w| w.strong_count() > 0)) {
        return Err(taken.clone());
    }
    let claim = Arc::new(Claim { names });
    for k in &claim.names {
        reg.insert(k.clone(), Arc::downgrade(&claim));
    }
    Ok(claim)
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut reg = registry();
        for k in &self.names {
            // Only our own entry: gone (this claim is being dropped) or already replaced.
            if reg.get(k).is_some_and(|w| w.strong_count() == 0) {
                reg.remove(k);
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
        let first = claim(1, [&a, &b].into_iter()).unwrap();
        assert_eq!(&*claim(1, [&b].into_iter()).unwrap_err(), "b");
        let other_store = claim(2, [&a].into_iter()).unwrap();
        drop(first);
        let again = claim(1, [&a, &b].into_iter()).unwrap();
        drop((again, other_store));
        assert!(registry().keys().all(|(s, _)| *s != 1 && *s != 2));
    }
}
