//! The permits this process holds (issue 42, `Rule::concurrent`): what a remote store's
//! permits need renewed before they lapse, and the gauge of permits held per rule.
//!
//! A permit is entered when its input is admitted (a lease, or a job's `Permit`) and
//! left when it is given back, whoever holds it. Only the store's permits are renewed;
//! the fallback's live in this process and never lapse.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::store::{Refund, RuleName};

/// The permits held, by (rule, key, id).
#[derive(Debug, Default)]
pub(crate) struct PermitBook {
    held: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    /// The store's permits, to renew: each with the refund that names it.
    store: HashMap<(RuleName, crate::key::Key, u64), Refund>,
    /// Whether a renewal task runs for them.
    renewing: bool,
}

impl PermitBook {
    /// Permits admitted: `refund` names them; `store`: whether the store holds them (and
    /// they need renewing).
    pub(crate) fn enter(&self, refund: &Refund, store: bool) {
        crate::metrics::permits_held(refund.check.rule, refund.check.params.cost as f64);
        if store {
            let c = &refund.check;
            self.held.lock().store.insert((c.rule, c.key.clone(), refund.taken.at), refund.clone());
        }
    }

    /// Permits given back (or about to be: no renewal keeps them alive after this).
    pub(crate) fn leave(&self, refund: &Refund, store: bool) {
        crate::metrics::permits_held(refund.check.rule, -(refund.check.params.cost as f64));
        if store {
            let c = &refund.check;
            self.held.lock().store.remove(&(c.rule, c.key.clone(), refund.taken.at));
        }
    }

    /// Whether a renewal task must start now (the first time the store holds permits).
    pub(crate) fn start_renewing(&self) -> bool {
        let mut book = self.held.lock();
        !book.store.is_empty() && !std::mem::replace(&mut book.renewing, true)
    }

    /// The renewal task ended (its limiter went away): the next permit starts another.
    pub(crate) fn stopped(&self) {
        self.held.lock().renewing = false;
    }

    /// The store's permits to renew now, and how long until the next renewal: a third of
    /// the shortest hold limit among them (1 s when none is held).
    pub(crate) fn due(&self) -> (Vec<Refund>, Duration) {
        let book = self.held.lock();
        let every = book.store.values().map(|r| r.check.params.quota.period() / 3).min();
        (book.store.values().cloned().collect(), every.unwrap_or(Duration::from_secs(1)))
    }
}
