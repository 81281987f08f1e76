//! What one admitted input holds, as plain data ([`Held`]): the units its checks took,
//! each with its holder and its exit fixed when it was decided, and the probes of its
//! charged rules. A [`Verdict`](crate::Verdict) carries it, and
//! [`Limiter::refund`](crate::Limiter::refund) consumes it; dropping it keeps the units
//! (the caller did the work). Its stages, whose drops undo, are in `lease.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use smallvec::SmallVec;

use crate::runtime::{RuleId, Slice, StoreCopy};
use crate::store::{Check, Refund};

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
    /// Given back when the input's work ends, whatever its outcome: a concurrency rule's
    /// permits (`Rule::concurrent`), held past the response until its body ends.
    Released,
}

impl fmt::Debug for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Exit::Kept => "Kept",
            Exit::UnlessCounted(_) => "UnlessCounted",
            Exit::Released => "Released",
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
    /// The rule's identity (see `RuleSet::id`): the blocked-key cache's name for it, which
    /// outlives a swap that keeps the rule.
    pub(crate) id: RuleId,
    pub(crate) holder: Holder,
    pub(crate) exit: Exit,
    /// For the fallback's units, the store's copy of them, if it may have one.
    pub(crate) copy: Option<Arc<StoreCopy>>,
    /// For units taken from a quota slice (held by the store, which counted the slice):
    /// the slice, which takes them back while it is open (`refund`: a refund of the
    /// slice's commit, after).
    pub(crate) slice: Option<Arc<Slice>>,
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
    /// The rule's count's identity (see `RuleSet::share_id`): a charge lowers the
    /// fallback's share of it.
    pub(crate) id: RuleId,
}

/// What one input holds, with what settling it needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held {
    pub(crate) units: SmallVec<[Unit; 1]>,
    /// Only charged rules have probes: a `Vec`, empty without allocating, keeps what a
    /// request moves around small (a probe inline is 272 bytes).
    pub(crate) probes: Vec<Probe>,
    /// The deadline of remote refunds and charges.
    pub(crate) deadline: Duration,
}
