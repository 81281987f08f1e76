//! [`StoreCopy`]: where the store's copy of units the fallback admitted is.

use crate::store::{Check, Refund};

/// The store's copy of units the fallback admitted: the call its deadline cut may still
/// commit them in the store, or a write-back charge them there. A refund of the
/// fallback's units undoes that copy too, while it can: the holder moves with the units.
#[derive(Debug, Default)]
pub(crate) struct StoreCopy(std::sync::Mutex<Copy>);

/// Where the store's copy of a fallback's units is.
#[derive(Debug, Default)]
pub(crate) enum Copy {
    /// Not known yet (the late call runs).
    #[default]
    Unknown,
    /// Kept for good, the store's copy not known yet (the late call runs).
    Kept,
    /// The late call committed them: this refund gives them back.
    Taken(Refund),
    /// To be written back as this check once they are kept: a count-by-outcome rule's
    /// units wait for the response's status.
    Pending(Check),
    /// In the list of what waits to be written back: a refund now keeps them out of it.
    Queued,
    /// Written back (a charge has no identity to refund): a refund reaches the fallback
    /// only, and the store keeps them (fewer admitted, never more).
    Written,
    /// Refunded: nothing of them goes to the store.
    Refunded,
}

impl StoreCopy {
    fn state(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The late call committed the units: `Some` (to refund at once) when the fallback's
    /// were refunded meanwhile.
    pub(crate) fn taken(&self, refund: Refund) -> Option<Refund> {
        let mut s = self.state();
        if matches!(*s, Copy::Refunded) {
            return Some(refund);
        }
        *s = Copy::Taken(refund);
        None
    }

    /// The units wait for their outcome before they are written back as `check`: true
    /// when they were kept already (to write back now).
    pub(crate) fn pending(&self, check: &Check) -> bool {
        let mut s = self.state();
        match *s {
            Copy::Refunded => false,
            Copy::Kept => true,
            _ => {
                *s = Copy::Pending(check.clone());
                false
            }
        }
    }

    /// The units are kept: the check to write back, when they were pending (else, while
    /// the late call runs, the copy remembers they were kept).
    pub(crate) fn kept(&self) -> Option<Check> {
        let mut s = self.state();
        match std::mem::replace(&mut *s, Copy::Queued) {
            Copy::Pending(check) => Some(check),
            Copy::Unknown => {
                *s = Copy::Kept;
                None
            }
            other => {
                *s = other;
                None
            }
        }
    }

    /// They go into the list of what waits to be written back: false when refunded.
    pub(crate) fn queue(&self) -> bool {
        let mut s = self.state();
        if matches!(*s, Copy::Refunded) {
            return false;
        }
        *s = Copy::Queued;
        true
    }

    /// They are about to be written back: false when refunded meanwhile (skip them).
    pub(crate) fn write(&self) -> bool {
        let mut s = self.state();
        if matches!(*s, Copy::Refunded) {
            return false;
        }
        *s = Copy::Written;
        true
    }

    /// The fallback's units are refunded: what of the store's copy to undo.
    pub(crate) fn refund(&self) -> Copy {
        let mut s = self.state();
        match std::mem::replace(&mut *s, Copy::Refunded) {
            // Too late to undo: stays written.
            Copy::Written => std::mem::replace(&mut *s, Copy::Written),
            other => other,
        }
    }
}
