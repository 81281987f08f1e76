//! What one admitted input holds and its stages:
//!
//! - [`Held`] is plain data: the units its checks took, each with its holder and its exit
//!   fixed when it was decided, and the probes of its charged rules. A
//!   [`Verdict`](crate::Verdict) carries it, and [`Limiter::refund`](crate::Limiter::refund)
//!   consumes it; dropping it keeps the units (the caller did the work).
//! - [`Lease`] is an input decided but not yet forwarded (its future unpolled, or waiting
//!   for a leaky bucket's slot): dropping it refunds everything.
//! - [`Lease::forward`] moves it on to [`Forwarded`]: the units that are kept whatever
//!   the outcome are released; those refunded unless the response's status counts stay.
//!   Dropping a `Forwarded` (no response: the handler never answered) gives those back;
//!   [`Forwarded::settle`] consumes it with the status and the [`Charge`](crate::Charge).
//!
//! There are no flags: each stage is a type, each move consumes the last, and each `Drop`
//! undoes exactly what its stage owes, through the one router ([`Holders`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use smallvec::SmallVec;

use super::holders::Holders;
use super::Limiter;
use crate::runtime::StoreCopy;
use crate::store::{Check, Refund, Store};

/// Who holds a unit, or decides a probe's charge: fixed when the input is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The store.
    Store,
    /// The in-process fallback limiter (its checks carry its share of each quota).
    Fallback,
}

/// What happens to a unit once the input was forwarded.
#[derive(Clone)]
pub(crate) enum Exit {
    /// Kept, whatever the outcome.
    Kept,
    /// Given back unless the response's status counts (`Rule::count_if`), and when no
    /// response comes.
    UnlessCounted(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>),
}

impl fmt::Debug for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Exit::Kept => "Kept",
            Exit::UnlessCounted(_) => "UnlessCounted",
        })
    }
}

/// Units one check took.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    /// The check as its holder decided it (the fallback's share of the quota, for the
    /// fallback), and where its units went.
    pub(crate) refund: Refund,
    /// The rule's index in the rule set the input was decided under.
    pub(crate) rule: usize,
    pub(crate) holder: Holder,
    pub(crate) exit: Exit,
    /// For the fallback's units, the store's copy of them, if it may have one.
    pub(crate) copy: Option<Arc<StoreCopy>>,
}

/// A charged rule's probe: what a charge after the work takes from, by whom.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// As its holder decided it (cost 0: a probe takes nothing).
    pub(crate) check: Check,
    pub(crate) holder: Holder,
    /// For the fallback's probe, the check as the store decides it: a charge the fallback
    /// takes is written back to the store too.
    pub(crate) store: Option<Check>,
    /// The rule's index in the rule set the input was decided under (a charge lowers the
    /// fallback's share of it).
    pub(crate) rule: usize,
}

/// What one input holds, with what settling it needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held {
    pub(crate) units: SmallVec<[Unit; 1]>,
    /// Only charged rules have probes: a `Vec`, empty without allocating, keeps what a
    /// request moves around small (a probe inline is 272 bytes).
    pub(crate) probes: Vec<Probe>,
    /// The generation of the rule set the input was decided under (rule indexes are into
    /// it; the blocked-key cache names rules by it).
    pub(crate) generation: u64,
    /// The deadline of remote refunds and charges.
    pub(crate) deadline: Duration,
}

/// An input decided and admitted, not yet forwarded: dropped, it refunds everything it
/// took, as an input that never happened.
pub(crate) struct Lease<St: Store> {
    held: Held,
    holders: Arc<Holders<St>>,
    what: &'static str,
}

impl<St: Store, I: ?Sized + 'static> Limiter<St, I> {
    /// A lease on what an admitted input holds: dropped, it gives everything back (`what`
    /// names the input in the warning a failed refund logs).
    pub(crate) fn lease(&self, held: Held, what: &'static str) -> Lease<St> {
        Lease { held, holders: self.holders.clone(), what }
    }
}

impl<St: Store> Lease<St> {
    /// The input goes ahead and keeps its units: back to plain data (a refund by its
    /// caller may still give them back).
    pub(crate) fn keep(mut self) -> Held {
        self.holders.kept(&self.held.units);
        std::mem::take(&mut self.held)
    }

    /// The input reaches its handler: the units kept whatever the outcome are released;
    /// those a status may refund, and the probes, move on.
    pub(crate) fn forward(mut self) -> Forwarded<St> {
        let mut held = std::mem::take(&mut self.held);
        held.units.retain(|u| matches!(u.exit, Exit::UnlessCounted(_)));
        Forwarded { held, holders: self.holders.clone() }
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
    pub(crate) fn settle(mut self, status: StatusCode, charge: Option<u64>) {
        let mut held = std::mem::take(&mut self.held);
        if let Some(units) = charge.filter(|&n| n > 0) {
            self.holders.charge(&held, units);
        }
        let (refunded, kept): (SmallVec<[Unit; 1]>, SmallVec<[Unit; 1]>) = std::mem::take(&mut held.units)
            .into_iter()
            .partition(|u| matches!(&u.exit, Exit::UnlessCounted(counts) if !counts(status)));
        self.holders.kept(&kept);
        held.units = refunded;
        if !held.units.is_empty() {
            self.holders.refund(held, "a count-by-outcome rule");
        }
    }
}

impl<St: Store> Drop for Forwarded<St> {
    fn drop(&mut self) {
        if !self.held.units.is_empty() {
            self.holders.refund(std::mem::take(&mut self.held), "a count-by-outcome rule whose handler did not answer");
        }
    }
}
