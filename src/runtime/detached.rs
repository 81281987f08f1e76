//! What outlives a request: a store call its deadline cut ([`Late`]), what store answers
//! teach the process from a task of their own ([`Lessons`]), and what the fallback
//! admitted that the store never saw ([`Unsent`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{BlockedCache, LateSlot, Mono, Shares, Slot, StoreCopy, FALLBACK_KEYS, LATE_WAIT};
use crate::error::StoreError;
use crate::store::{Check, Outcomes, Store};

/// What a store's answers teach this process: rejections for the blocked-key cache (when
/// it is on), what remains for the fallback's shares; and where what the store never saw
/// waits.
pub(crate) struct Lessons {
    pub(crate) cache: Option<Arc<BlockedCache>>,
    pub(crate) shares: Arc<Shares>,
    pub(crate) unsent: Arc<Unsent>,
    pub(crate) clock: Mono,
}

/// What the fallback admitted that the store never saw (the circuit was open, the
/// connection down): charged to the store when it answers again, but for the units (with
/// the store's copy of them) refunded meanwhile.
#[derive(Default)]
pub(crate) struct Unsent {
    checks: Mutex<Vec<(Check, Option<Arc<StoreCopy>>)>>,
    any: AtomicBool,
}

impl Unsent {
    /// Keeps `checks` to charge the store with when it answers again. Bounded: past
    /// [`FALLBACK_KEYS`] checks, the rest is dropped.
    pub(crate) fn keep(&self, checks: impl IntoIterator<Item = Check>) {
        let mut unsent = self.lock();
        for c in checks {
            if unsent.len() >= FALLBACK_KEYS {
                crate::metrics::write_back("dropped", 1);
                continue;
            }
            // The same key again (the common case: one busy key): one check of both costs.
            let same =
                unsent.iter_mut().rev().take(64).find(|(u, copy)| copy.is_none() && u.rule == c.rule && u.key == c.key);
            match same {
                Some((u, _)) => u.params.cost = u.params.cost.saturating_add(c.params.cost),
                None => unsent.push((c, None)),
            }
            self.any.store(true, Ordering::Release);
        }
    }

    /// Keeps one unit's `check`, with the store's copy of it (a refund before the
    /// write-back keeps it out).
    pub(crate) fn keep_unit(&self, check: Check, copy: Arc<StoreCopy>) {
        if !copy.queue() {
            return;
        }
        let mut unsent = self.lock();
        if unsent.len() >= FALLBACK_KEYS {
            crate::metrics::write_back("dropped", 1);
            return;
        }
        unsent.push((check, Some(copy)));
        self.any.store(true, Ordering::Release);
    }

    /// What was kept, taken to charge the store with (the refunded units left out).
    pub(crate) fn take(&self) -> Vec<Check> {
        let taken = {
            let mut unsent = self.lock();
            self.any.store(false, Ordering::Release);
            std::mem::take(&mut *unsent)
        };
        taken.into_iter().filter(|(_, copy)| copy.as_ref().is_none_or(|c| c.write())).map(|(c, _)| c).collect()
    }

    /// Whether anything waits to be charged (no lock: asked after every store answer).
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Check, Option<Arc<StoreCopy>>)>> {
        self.checks.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A store call cut by its deadline and still running: its answer, when it comes within
/// [`LATE_WAIT`], is the store's decision.
pub(crate) struct Late {
    pub(super) asked: Asked,
    pub(super) slot: LateSlot,
}

impl Late {
    /// The store's answer, or its error: [`StoreError::Timeout`] after [`LATE_WAIT`].
    pub(crate) async fn answer(self) -> Result<Outcomes, StoreError> {
        let _slot = self.slot;
        tokio::time::timeout(LATE_WAIT, self.asked).await.unwrap_or(Err(StoreError::Timeout(LATE_WAIT)))
    }
}

pub(super) type Asked = Pin<Box<dyn Future<Output = Result<Outcomes, StoreError>> + Send>>;

/// One store call that owns what it needs, boxed: it can outlive its caller ([`Late`]).
/// `check_one` for one rule (no `Vec`), else `check`.
pub(super) fn owned_ask<St: Store>(store: &Arc<St>, checks: &[Check]) -> Asked {
    let (store, checks) = (Arc::clone(store), smallvec::SmallVec::<[Check; 2]>::from(checks));
    Box::pin(async move {
        match &checks[..] {
            [one] => store.check_one(one).await.map(|o| smallvec::smallvec![Some(o)]),
            _ => store.check(&checks).await.map(Outcomes::from_vec),
        }
    })
}

/// The late calls' counter and its cap: a slot for each store call left running.
#[derive(Clone)]
pub(crate) struct LateSlots(pub(super) Arc<AtomicUsize>, pub(super) usize);

impl LateSlots {
    pub(crate) fn take(&self) -> Option<LateSlot> {
        Slot::enter(Arc::clone(&self.0), self.1)
    }
}
