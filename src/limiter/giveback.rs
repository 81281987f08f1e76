//! Giving units back: each commit to whoever holds its units (the store, or the fallback
//! limiter that decided while the store was down), by the identity of the commit. A
//! [`GiveBack`] owns everything it needs, so it can run detached — and, armed as a
//! [`GiveBackOnDrop`], it runs when the future that would have disarmed it is dropped.

use std::sync::Arc;

use crate::runtime::{BlockedCache, Runtime};
use crate::store::{Refund, Store};
use crate::verdict::{Commit, DecidedBy};
use crate::StoreError;

/// Refunds for one store and its fallback limiter.
pub(crate) struct GiveBack<St> {
    store: Arc<St>,
    #[cfg(feature = "memory")]
    fallback: Option<(crate::MemoryStore, u64)>,
    commits: Vec<Commit>,
    /// The blocked-key cache and the generation of the rule set the commits were decided
    /// under: a rejection cached for one of their keys may not hold once the store has the
    /// units back.
    cache: (Arc<BlockedCache>, u64),
}

impl<St: Store> GiveBack<St> {
    #[cfg_attr(not(feature = "memory"), allow(unused_variables))]
    pub(crate) fn new(store: Arc<St>, runtime: &Runtime, generation: u64, commits: Vec<Commit>) -> Self {
        Self {
            store,
            #[cfg(feature = "memory")]
            fallback: runtime.settings.fallback.clone(),
            commits,
            cache: (runtime.cache.clone(), generation),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.commits.is_empty()
    }

    /// Keeps the commits of the rules (by index) that `keep` selects.
    pub(crate) fn retain(&mut self, keep: impl Fn(usize) -> bool) {
        self.commits.retain(|c| keep(c.rule));
    }

    /// Gives everything back: the fallback's units at once, the store's by one store call
    /// (then the cached rejections of their keys are forgotten).
    pub(crate) async fn run(self) -> Result<(), StoreError> {
        self.split().run().await
    }

    /// Gives back without waiting: at once for the fallback limiter and an in-process
    /// store (no I/O: the units are back before the next input is decided, with no
    /// runtime needed), in a task of its own for a remote store — never on the future of
    /// the request that was dropped.
    pub(crate) fn spawn(self, what: &'static str) {
        let to_store = self.split();
        if to_store.refunds.is_empty() {
            return;
        }
        if let Some(local) = to_store.store.as_local() {
            let result = local.refund(&to_store.refunds).map(|()| to_store.forget());
            if let Err(err) = result {
                tracing::warn!(error = %err, "tollgate: could not give back the units of {what}");
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("tollgate: no tokio runtime to give back the units of {what}");
            return;
        };
        drop(runtime.spawn(async move {
            if let Err(err) = to_store.run().await {
                tracing::warn!(error = %err, "tollgate: could not give back the units of {what}");
            }
        }));
    }

    /// Gives the fallback limiter its units at once; what is left goes to the store.
    fn split(self) -> ToStore<St> {
        let mut refunds = Vec::new();
        let mut rules = Vec::new();
        for c in self.commits {
            match c.by {
                DecidedBy::Store => {
                    rules.push(c.rule);
                    refunds.push(c.refund);
                }
                #[cfg(feature = "memory")]
                DecidedBy::Fallback => {
                    if let Some((fallback, instances)) = &self.fallback {
                        let local = Refund {
                            check: crate::runtime::local_check(&c.refund.check, *instances),
                            taken: c.refund.taken,
                        };
                        fallback.refund_at(std::slice::from_ref(&local), fallback.now_micros());
                    }
                }
                _ => {} // the cache takes nothing
            }
        }
        ToStore { store: self.store, refunds, rules, cache: self.cache }
    }
}

/// The store's part of a give-back.
struct ToStore<St> {
    store: Arc<St>,
    refunds: Vec<Refund>,
    /// The rule (index) of each refund.
    rules: Vec<usize>,
    cache: (Arc<BlockedCache>, u64),
}

impl<St: Store> ToStore<St> {
    async fn run(self) -> Result<(), StoreError> {
        if self.refunds.is_empty() {
            return Ok(());
        }
        match self.store.as_local() {
            Some(local) => local.refund(&self.refunds)?,
            None => self.store.refund(&self.refunds).await?,
        }
        self.forget();
        Ok(())
    }

    /// Only the store's rejections are cached, and they may not hold now that it has the
    /// units back (forgotten after the refund: one cached before it would stay).
    fn forget(&self) {
        let (cache, generation) = &self.cache;
        for (r, &rule) in self.refunds.iter().zip(&self.rules) {
            cache.forget((*generation, rule), &r.check.key);
        }
    }
}

/// Gives back in a detached task when dropped, unless disarmed: for work that a dropped
/// future (a client gone, an outer timeout) must undo.
pub(crate) struct GiveBackOnDrop<St: Store> {
    armed: Option<GiveBack<St>>,
    what: &'static str,
}

impl<St: Store> GiveBackOnDrop<St> {
    pub(crate) fn new(give_back: GiveBack<St>, what: &'static str) -> Self {
        Self { armed: (!give_back.is_empty()).then_some(give_back), what }
    }

    /// The work is done: nothing to give back on drop.
    pub(crate) fn disarm(mut self) -> Option<GiveBack<St>> {
        self.armed.take()
    }
}

impl<St: Store> Drop for GiveBackOnDrop<St> {
    fn drop(&mut self) {
        if let Some(g) = self.armed.take() {
            g.spawn(self.what);
        }
    }
}
