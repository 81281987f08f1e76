//! Group commit of releases (issue 42): permits given back while others are on their
//! way go to Redis together, one release script call per cluster slot (`release_main.lua`,
//! the refund script's work for permits, straight-line), as entries go in
//! batches (`batch.rs`). A release names its permit's id, so one call for many is the
//! same as one call each, in any order.
//!
//! - A release waits in the store's queue; one flush task at a time (spawned on the
//!   runtime of the release that found none) yields once, so that the releases woken
//!   with it join, then takes every release waiting and sends them, and goes on while
//!   more arrived meanwhile.
//! - Every release of a call gets that call's answer: a slot that failed fails them all
//!   (each is sent again by its caller, which is safe: a second release of one permit
//!   gives nothing back).
//! - A flush task dropped unfinished (its runtime shut down) answers its releases with
//!   an error (their senders drop), and lets the next release start another.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::call::Inner;
use crate::error::StoreError;
use crate::store::Refund;

/// Releases waiting for their call.
#[derive(Default)]
pub(super) struct Releases {
    waiting: Mutex<Waiting>,
}

/// Where a call's releases hear how their call went.
type Answer = oneshot::Sender<Result<(), StoreError>>;

#[derive(Default)]
struct Waiting {
    entries: Vec<(Vec<Refund>, Answer)>,
    /// Whether a flush task is on its way.
    flushing: bool,
}

impl Releases {
    /// Sends `refunds` (permits only) in the next call; `None` with no tokio runtime to
    /// run the flush task on (the caller sends them itself).
    pub(super) fn release(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        refunds: &[Refund],
    ) -> Option<oneshot::Receiver<Result<(), StoreError>>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut w = self.waiting.lock();
            w.entries.push((refunds.to_vec(), tx));
            !std::mem::replace(&mut w.flushing, true)
        };
        if start {
            let (this, inner) = (self.clone(), inner.clone());
            drop(runtime.spawn(async move { this.flush(&inner).await }));
        }
        Some(rx)
    }

    async fn flush(&self, inner: &Inner) {
        // Dropped unfinished: the next release starts another task.
        struct Done<'a>(&'a Releases);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.waiting.lock().flushing = false;
            }
        }
        let _done = Done(self);
        loop {
            tokio::task::yield_now().await;
            let taken = std::mem::take(&mut self.waiting.lock().entries);
            if taken.is_empty() {
                // `_done` clears the flag with the lock taken: a release that pushed after
                // this `take` found `flushing` set, so it is taken in the next round.
                let mut w = self.waiting.lock();
                if w.entries.is_empty() {
                    w.flushing = false;
                    std::mem::forget(_done);
                    return;
                }
                continue;
            }
            let all: Vec<&Refund> = taken.iter().flat_map(|(r, _)| r.iter()).collect();
            let result =
                inner.per_slot(&all, |r| &r.check.key, |group| async move { inner.run_release(&group).await }).await;
            drop(all);
            for (_, tx) in taken {
                let _ = tx.send(result.clone());
            }
        }
    }
}
