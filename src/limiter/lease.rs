//! The stages of what an admitted input holds ([`Held`], plain data in `held.rs`):
//!
//! - [`Lease`] is an input decided but not yet forwarded (its future unpolled, or waiting
//!   for a leaky bucket's slot): dropping it refunds everything.
//! - [`Lease::forward`] moves it on to [`Forwarded`]: the units that are kept whatever
//!   the outcome are released; those refunded unless the response's status counts stay.
//!   Dropping a `Forwarded` (no response: the handler never answered) gives those back;
//!   [`Forwarded::settle`] consumes it with the status and the [`Charge`](crate::Charge).
//!
//! - A concurrency rule's permits (issue 42) outlive the response: [`Forwarded::settle`]
//!   and [`Lease::enter`] move them on to [`Released`], whose drop gives them back (the
//!   HTTP layer's when the response's body ends, a job's [`Permit`](crate::Permit)).
//!
//! There are no flags: each stage is a type, each move consumes the last, and each `Drop`
//! undoes exactly what its stage owes, through the one router ([`Holders`]).

use std::sync::Arc;

use http::StatusCode;
use smallvec::SmallVec;

use super::held::{Exit, Held, Unit};
use super::holders::Holders;
use crate::store::Store;

/// An input decided and admitted, not yet forwarded: dropped, it refunds everything it
/// took, as an input that never happened.
pub(crate) struct Lease<St: Store> {
    held: Held,
    holders: Arc<Holders<St>>,
    what: &'static str,
}

impl<St: Store> Lease<St> {
    /// `held`, given back through `holders` if dropped (`what` names the input in the
    /// warning a failed refund logs).
    pub(crate) fn new(held: Held, holders: Arc<Holders<St>>, what: &'static str) -> Self {
        holders.hold(&held);
        Self { held, holders, what }
    }

    /// A job's input goes ahead: its units are kept, and its permits (issue 42) move on
    /// to what releases them when the job's [`Permit`](crate::Permit) is dropped.
    pub(crate) fn enter(mut self) -> (Held, Released<St>) {
        let mut held = std::mem::take(&mut self.held);
        let (permits, kept): (SmallVec<[Unit; 1]>, SmallVec<[Unit; 1]>) =
            std::mem::take(&mut held.units).into_iter().partition(|u| matches!(u.exit, Exit::Released));
        self.holders.kept(&kept);
        let released = Released {
            held: Held { units: permits, probes: Vec::new(), deadline: held.deadline },
            holders: self.holders.clone(),
        };
        held.units = kept;
        (held, released)
    }

    /// The input goes ahead and keeps its units: back to plain data (a refund by its
    /// caller may still give them back).
    pub(crate) fn keep(mut self) -> Held {
        self.holders.kept(&self.held.units);
        std::mem::take(&mut self.held)
    }

    /// The input reaches its handler: the units kept whatever the outcome are released;
    /// those a status may refund, and the probes, move on — `None` when there are none (the
    /// common request: nothing waits for its response).
    pub(crate) fn forward(mut self) -> Option<Forwarded<St>> {
        // Released in place: what moves on is taken only when there is some (the common
        // request moves nothing, and the lease drops holding no units).
        self.held.units.retain(|u| matches!(u.exit, Exit::UnlessCounted(_) | Exit::Released));
        (!self.held.units.is_empty() || !self.held.probes.is_empty())
            .then(|| Forwarded { held: std::mem::take(&mut self.held), holders: self.holders.clone() })
    }
}

impl<St: Store> Drop for Lease<St> {
    fn drop(&mut self) {
        if !self.held.units.is_empty() {
            self.holders.refund(std::mem::take(&mut self.held), self.what);
        }
    }
}

/// An input that reached its handler: what its response's status may refund, and what
/// its charge takes from. Dropped with no response, it refunds those units.
pub(crate) struct Forwarded<St: Store> {
    held: Held,
    holders: Arc<Holders<St>>,
}

impl<St: Store> Forwarded<St> {
    /// The response came: refunds the units whose rule does not count `status`, and
    /// takes `charge` units from the charged rules (see [`Charge`](crate::Charge)).
    ///
    /// The permits of concurrency rules (issue 42) move on: released when what is
    /// returned is dropped (the HTTP layer when the response's body ends); `None` when
    /// there are none.
    pub(crate) fn settle(mut self, status: StatusCode, charge: Option<u64>) -> Option<Released<St>> {
        let mut held = std::mem::take(&mut self.held);
        if let Some(units) = charge.filter(|&n| n > 0) {
            self.holders.charge(&held, units);
        }
        let (permits, units): (SmallVec<[Unit; 1]>, SmallVec<[Unit; 1]>) =
            std::mem::take(&mut held.units).into_iter().partition(|u| matches!(u.exit, Exit::Released));
        let (refunded, kept): (SmallVec<[Unit; 1]>, SmallVec<[Unit; 1]>) =
            units.into_iter().partition(|u| matches!(&u.exit, Exit::UnlessCounted(counts) if !counts(status)));
        self.holders.kept(&kept);
        let deadline = held.deadline;
        held.units = refunded;
        if !held.units.is_empty() {
            self.holders.refund(held, "a count-by-outcome rule");
        }
        (!permits.is_empty()).then(|| Released {
            held: Held { units: permits, probes: Vec::new(), deadline },
            holders: self.holders.clone(),
        })
    }
}

impl<St: Store> Drop for Forwarded<St> {
    fn drop(&mut self) {
        if !self.held.units.is_empty() {
            self.holders.refund(std::mem::take(&mut self.held), "a count-by-outcome rule whose handler did not answer");
        }
    }
}

/// Permits of concurrency rules (issue 42) whose work has not ended: dropped, they are
/// given back (once: the drop consumes them).
pub(crate) struct Released<St: Store> {
    held: Held,
    holders: Arc<Holders<St>>,
}

impl<St: Store> Released<St> {
    /// How many permits this holds (over every concurrency rule).
    pub(crate) fn permits(&self) -> u64 {
        self.held.units.iter().map(|u| u.refund.check.params.cost).sum()
    }
}

impl<St: Store> Drop for Released<St> {
    fn drop(&mut self) {
        if !self.held.units.is_empty() {
            self.holders.refund(std::mem::take(&mut self.held), "permits whose work ended");
        }
    }
}

/// A [`Permit`](crate::Permit)'s stage: the permits a `Released` gives back when dropped.
impl<St: Store> crate::permit::Held for Released<St> {
    fn permits(&self) -> u64 {
        Released::permits(self)
    }
}
