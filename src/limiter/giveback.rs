//! Giving units back: each commit to whoever holds its units (the store, or the fallback
//! limiter that decided while the store was down), by the identity of the commit. A
//! [`GiveBack`] owns everything it needs, so it can run detached — and, armed as a
//! [`GiveBackOnDrop`], it runs when the future that would have disarmed it is dropped.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

use crate::runtime::Settings;
#[cfg(feature = "memory")]
use crate::store::Refund;
use crate::store::Store;
use crate::verdict::{Commit, DecidedBy};
use crate::StoreError;

/// Refunds for one store and its fallback limiter.
pub(crate) struct GiveBack<St> {
    store: Arc<St>,
    #[cfg(feature = "memory")]
    fallback: Option<(crate::MemoryStore, u64)>,
    commits: Vec<Commit>,
}

impl<St: Store> GiveBack<St> {
    #[cfg_attr(not(feature = "memory"), allow(unused_variables))]
    pub(crate) fn new(store: Arc<St>, settings: &Settings, commits: Vec<Commit>) -> Self {
        Self {
            store,
            #[cfg(feature = "memory")]
            fallback: settings.fallback.clone(),
            commits,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.commits.is_empty()
    }

    /// Keeps the commits of the rules (by index) that `keep` selects.
    pub(crate) fn retain(&mut self, keep: impl Fn(usize) -> bool) {
        self.commits.retain(|c| keep(c.rule));
    }

    /// Gives everything back: the store's units by one store call, the fallback's at once.
    pub(crate) async fn run(self) -> Result<(), StoreError> {
        let mut store = Vec::new();
        for c in self.commits {
            match c.by {
                DecidedBy::Store => store.push(c.refund),
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
        if store.is_empty() {
            return Ok(());
        }
        self.store.refund(&store).await
    }

    /// Runs in a task of its own, never on the request's future — or at once, for an
    /// in-process store, whose refund needs no I/O: the units are back before the next
    /// request is decided (and no runtime is needed).
    pub(crate) fn spawn(self, what: &'static str) {
        if self.is_empty() {
            return;
        }
        let local = self.store.is_local();
        let mut run = Box::pin(async move {
            if let Err(err) = self.run().await {
                tracing::warn!(error = %err, "tollgate: could not give back the units of {what}");
            }
        });
        if local {
            // Polled once here; a store whose refund is not ready at once finishes in a
            // task (its next poll there registers the task's waker).
            if run.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready() {
                return;
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(run);
            }
            Err(_) => tracing::warn!("tollgate: no tokio runtime to give back the units of {what}"),
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
