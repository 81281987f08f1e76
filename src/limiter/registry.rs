//! Which rule names the live limiters of this process use on which store: two limiters
//! over one store with one rule name would share their counts without anyone asking for
//! it (two `RateLimitLayer::new` on two routes, both named `"default"`), so the second one
//! is refused. Clones of one layer share one limiter and one [`Claim`]. A limiter whose
//! rules are swapped at run time makes a claim per rule set, all with its [`Owner`]: the
//! sets still deciding inputs in flight hold their names without blocking the next set.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use smallvec::SmallVec;

use crate::notice::Once;
use crate::store::RuleName;

/// Who claims: one limiter, through all its rule sets.
pub(crate) type Owner = u64;

/// A new owner, for a new limiter.
pub(crate) fn new_owner() -> Owner {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The names one rule set of a limiter holds on one store, released when the set is
/// dropped; with each, how many limiters of the process count into it (see
/// [`Claim::sharers`]).
#[derive(Debug)]
pub(crate) struct Claim {
    names: Vec<(usize, RuleName)>,
    sharers: Vec<Arc<AtomicU64>>,
}

impl Claim {
    /// How many live limiters of this process count into the state of name `i` (in the
    /// order claimed): 1, or more for a name joined with [`OnClash::Share`]. The process
    /// is one server in the store's count; while the store fails, each of these limiters'
    /// fallbacks takes this part of the server's share.
    pub(crate) fn sharers(&self, i: usize) -> u64 {
        self.sharers.get(i).map_or(1, |n| n.load(Ordering::Relaxed).max(1))
    }
}

/// Per (store, name): its owners (one, or several that joined it: see [`OnClash::Share`]),
/// their claims that list the name, with each one's owner (several while sets of inputs in
/// flight outlive a swap), and how many distinct owners have a live claim. Counted, never
/// upgraded: an upgraded claim dropped under the lock would run its `Drop`, which takes
/// the lock.
type Registry = HashMap<(usize, RuleName), Entry>;

#[derive(Default)]
struct Entry {
    by: SmallVec<[Owner; 1]>,
    claims: Vec<(Owner, Weak<Claim>)>,
    sharers: Arc<AtomicU64>,
}

impl Entry {
    /// Drops the dead claims and counts the owners of the live ones.
    fn tidy(&mut self) {
        self.claims.retain(|(_, w)| w.strong_count() > 0);
        let mut owners: SmallVec<[Owner; 2]> = self.claims.iter().map(|(o, _)| *o).collect();
        owners.sort_unstable();
        owners.dedup();
        self.sharers.store(owners.len() as u64, Ordering::Relaxed);
    }
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a claim does with a name another live limiter holds on the store.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OnClash {
    /// Refuses: `BuildError::RuleInUse`, whose hint names the builder the user called.
    Refuse(&'static str),
    /// Joins that name's owners, so that both count into one state and either may swap
    /// it, and says so (`RateLimitLayer::new`, which cannot fail). Only that name: the
    /// other names of either stay theirs.
    Share,
}

/// Claims `names` for `owner` on the store of identity `store` (see `Store::identity`),
/// or returns the first name another live limiter holds there (with [`OnClash::Share`],
/// joins it instead). Names the owner's other rule sets hold are taken over.
pub(crate) fn claim<'a>(
    store: usize,
    owner: Owner,
    names: impl Iterator<Item = &'a RuleName>,
    on_clash: OnClash,
) -> Result<Arc<Claim>, Arc<str>> {
    let names: Vec<(usize, RuleName)> = names.map(|&n| (store, n)).collect();
    let mut reg = registry();
    for k in &names {
        let Some(Entry { by, claims, .. }) = reg.get_mut(k) else { continue };
        if by.contains(&owner) || !claims.iter().any(|(_, w)| w.strong_count() > 0) {
            continue; // free, or already this owner's
        }
        match on_clash {
            OnClash::Refuse(_) => return Err(k.1.as_str().into()),
            OnClash::Share => {
                by.push(owner);
                let notice = format!(
                    "tollgate: RateLimitLayer::new over a store where another live limiter or layer has a rule \
                     named {:?}: the two share one count. Name the rules to count apart: \
                     RateLimitLayer::builder(store).rule(\"search\", quota, key).build()",
                    k.1
                );
                if !SHARED.tell(false, || notice.clone()) {
                    tracing::warn!("{notice}");
                }
            }
        }
    }
    let sharers = names.iter().map(|k| Arc::clone(&reg.entry(*k).or_default().sharers)).collect();
    let claim = Arc::new(Claim { names, sharers });
    for k in &claim.names {
        let entry = reg.entry(*k).or_default();
        if !entry.by.contains(&owner) {
            // The other owners' claims are all gone (else this claim was refused or joined).
            entry.by = SmallVec::from_elem(owner, 1);
        }
        entry.claims.push((owner, Arc::downgrade(&claim)));
        entry.tidy();
    }
    Ok(claim)
}

/// Said once per process; later joins go to `tracing` only (see `notice`).
static SHARED: Once = Once::new();

impl Drop for Claim {
    fn drop(&mut self) {
        let mut reg = registry();
        for k in &self.names {
            // This claim's weak is dead now; the name stays while another claim lists it.
            if let Some(entry) = reg.get_mut(k) {
                entry.tidy();
                if entry.claims.is_empty() {
                    reg.remove(k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSE: OnClash = OnClash::Refuse("");

    #[test]
    fn a_joined_name_is_shared_and_the_others_stay_their_owners() {
        let (d, j, x): (RuleName, RuleName, RuleName) = ("jd".into(), "jj".into(), "jx".into());
        let (limiter, layer, third) = (new_owner(), new_owner(), new_owner());
        let first = claim(4, limiter, [&d, &j].into_iter(), REFUSE).unwrap();
        let joined = claim(4, layer, [&d].into_iter(), OnClash::Share).unwrap();
        // Either may swap the shared name; neither may take the other's other names.
        let swapped = claim(4, layer, [&d, &x].into_iter(), REFUSE).unwrap();
        assert_eq!(&*claim(4, layer, [&j].into_iter(), REFUSE).unwrap_err(), "jj");
        assert_eq!(&*claim(4, limiter, [&x].into_iter(), REFUSE).unwrap_err(), "jx");
        let again = claim(4, limiter, [&d].into_iter(), REFUSE).unwrap();
        // The name stays held while either lives.
        drop((first, again));
        assert_eq!(&*claim(4, third, [&d].into_iter(), REFUSE).unwrap_err(), "jd");
        drop((joined, swapped));
        let free = claim(4, third, [&d, &j, &x].into_iter(), REFUSE).unwrap();
        drop(free);
    }

    /// Issue 37, item 9: a name two limiters of the process count into is shared by two
    /// (each fallback takes half of the server's share); its own names by one; back to one
    /// when the other limiter goes.
    #[test]
    fn a_joined_name_counts_its_sharers() {
        let (d, own): (RuleName, RuleName) = ("hd".into(), "ho".into());
        let (limiter, layer) = (new_owner(), new_owner());
        let first = claim(5, limiter, [&d, &own].into_iter(), REFUSE).unwrap();
        assert_eq!((first.sharers(0), first.sharers(1)), (1, 1));
        let joined = claim(5, layer, [&d].into_iter(), OnClash::Share).unwrap();
        assert_eq!((first.sharers(0), first.sharers(1), joined.sharers(0)), (2, 1, 2));
        // A swap of the first limiter (both its sets alive) is still one sharer.
        let swapped = claim(5, limiter, [&d].into_iter(), REFUSE).unwrap();
        assert_eq!(swapped.sharers(0), 2);
        drop(joined);
        assert_eq!((first.sharers(0), swapped.sharers(0)), (1, 1));
        drop((first, swapped));
    }

    #[test]
    fn a_swap_takes_over_its_own_names_and_releases_the_dropped_ones() {
        let (a, b, c): (RuleName, RuleName, RuleName) = ("sa".into(), "sb".into(), "sc".into());
        let (me, other_owner) = (new_owner(), new_owner());
        let first = claim(3, me, [&a, &b].into_iter(), REFUSE).unwrap();
        let elsewhere = claim(2, other_owner, [&a].into_iter(), REFUSE).unwrap(); // another store's own
        let other = claim(3, other_owner, [&c].into_iter(), REFUSE).unwrap();
        assert_eq!(&*claim(3, me, [&a, &c].into_iter(), REFUSE).unwrap_err(), "sc", "another limiter's name");
        // A set without "sb", then one with it again while the first is still alive (an
        // input in flight holds it): all the owner's own.
        let second = claim(3, me, [&a].into_iter(), REFUSE).unwrap();
        let third = claim(3, me, [&a, &b].into_iter(), REFUSE).unwrap();
        assert_eq!(&*claim(3, other_owner, [&b].into_iter(), REFUSE).unwrap_err(), "sb");
        drop((first, third));
        // "sb" is free once no set of the owner holds it; "sa" is still held by the second.
        let again = claim(3, other_owner, [&b].into_iter(), REFUSE).unwrap();
        assert_eq!(&*claim(3, other_owner, [&a].into_iter(), REFUSE).unwrap_err(), "sa");
        drop((second, other, again, elsewhere));
        assert!(registry().keys().all(|(s, _)| *s != 2 && *s != 3), "nothing is left once every claim is dropped");
    }
}
