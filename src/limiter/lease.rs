//! What one admitted input holds, as values: the units its checks took, each with its
//! holder and its exit fixed when it was decided ([`Held`]), and the stage it is in.
//!
//! - [`Held`] is plain data: a [`Verdict`](crate::Verdict) carries it, and
//!   [`Limiter::refund`](crate::Limiter::refund) consumes it. Dropping it keeps the units
//!   (the caller did the work).
//! - [`Lease`] is an input decided but not yet forwarded (its future unpolled, or waiting
//!   for a leaky bucket's slot): dropping it gives back everything.
//! - [`Lease::forward`] moves it on to [`Forwarded`]: the units that are kept whatever
//!   the outcome are released; those given back unless the response's status counts stay.
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
use crate::store::{Check, Refund, Store, Taken};

/// Who holds a unit, or decides a probe's charge: fixed when the input is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The store.
    Store,
    /// The in-process fallback limiter (its checks carry its share of each quota).
    Fallback,
}

/// A rule's count-by-outcome predicate: does this status count?
pub(crate) type Counts = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// What happens to a unit once the input was forwarded.
#[derive(Clone)]
pub(crate) enum Exit {
    /// Kept, whatever the outcome.
    Kept,
    /// Given back unless the response's status counts (`Rule::count_if`), and when no
    /// response comes.
    UnlessCounted(Counts),
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
}

/// A charged rule's probe: what a charge after the work takes from, by whom.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// As its holder decided it (cost 0: a probe takes nothing).
    pub(crate) check: Check,
    pub(crate) holder: Holder,
}

/// What one input holds, with what settling it needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held {
    pub(crate) units: SmallVec<[Unit; 1]>,
    pub(crate) probes: SmallVec<[Probe; 1]>,
    /// The generation of the rule set the input was decided under (rule indexes are into
    /// it; the blocked-key cache names rules by it).
    pub(crate) generation: u64,
    /// The deadline of remote give-backs and charges.
    pub(crate) deadline: Duration,
}

impl Held {
    /// What the check of rule `rule` took (its units' identity).
    pub(crate) fn taken_by(&self, rule: usize) -> Option<Taken> {
        self.units.iter().find(|u| u.rule == rule).map(|u| u.refund.taken)
    }
}

/// An input decided and admitted, not yet forwarded: dropped, it gives back everything it
/// took, as an input that never happened.
pub(crate) struct Lease<St: Store> {
    held: Held,
    holders: Arc<Holders<St>>,
    what: &'static str,
}

impl<St: Store> Lease<St> {
    /// `what` names the input in the warning a failed give-back logs.
    pub(crate) fn new(held: Held, holders: Arc<Holders<St>>, what: &'static str) -> Self {
        Self { held, holders, what }
    }

    /// The input goes ahead and keeps its units: back to plain data.
    pub(crate) fn keep(mut self) -> Held {
        std::mem::take(&mut self.held)
    }

    /// The input reaches its handler: the units kept whatever the outcome are released;
    /// those a status may give back, and the probes, move on.
    pub(crate) fn forward(mut self) -> Forwarded<St> {
        let mut held = std::mem::take(&mut self.held);
        held.units.retain(|u| matches!(u.exit, Exit::UnlessCounted(_)));
        Forwarded { held, holders: self.holders.clone() }
    }
}

impl<St: Store> Drop for Lease<St> {
    fn drop(&mut self) {
        if !self.held.units.is_empty() {
            self.holders.give_back(std::mem::take(&mut self.held), self.what);
        }
    }
}

/// An input that reached its handler: what its response's status may give back, and what
/// its charge takes from. Dropped with no response, it gives back those units.
pub(crate) struct Forwarded<St: Store> {
    held: Held,
    holders: Arc<Holders<St>>,
}

impl<St: Store> Forwarded<St> {
    /// The response came: gives back the units whose rule does not count `status`, and
    /// takes `charge` units from the charged rules (see [`Charge`](crate::Charge)).
    pub(crate) fn settle(mut self, status: StatusCode, charge: Option<u64>) {
        let mut held = std::mem::take(&mut self.held);
        if let Some(units) = charge.filter(|&n| n > 0) {
            self.holders.charge(&held, units);
        }
        held.units.retain(|u| matches!(&u.exit, Exit::UnlessCounted(counts) if !counts(status)));
        if !held.units.is_empty() {
            self.holders.give_back(held, "a count-by-outcome rule");
        }
    }
}

impl<St: Store> Drop for Forwarded<St> {
    fn drop(&mut self) {
        if !self.held.units.is_empty() {
            self.holders
                .give_back(std::mem::take(&mut self.held), "a count-by-outcome rule whose handler did not answer");
        }
    }
}
