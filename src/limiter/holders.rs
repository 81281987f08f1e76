//! The one router of refunds and charges: each unit to whoever holds it, each probe's
//! charge to whoever decided it — the store, or the in-process fallback limiter that
//! decided while the store was failing — and the blocked-key cache cleared after every
//! refund (a rejection it remembers may not hold once the units are back).
//!
//! In-process work is done at once, in the caller's thread (the fallback always; the
//! store when it is a [`LocalStore`](crate::store::LocalStore)): the units are back, or
//! taken, before the next input is decided, with no runtime needed. A remote store's part
//! goes to one detached task under the deadline, or is awaited by
//! [`Limiter::refund`](crate::Limiter::refund) and
//! [`Limiter::charge`](crate::Limiter::charge).

use std::sync::Arc;

use futures_util::future::join_all;
use smallvec::SmallVec;

use super::held::{Exit, Held, Holder, Unit};
use crate::error::StoreError;
use crate::runtime::{BlockedCache, Copy, LateSlot, LateSlots, Mono, PermitBook, RuleId, Runtime, Shares, Unsent};
use crate::store::{Check, Refund, RuleName, Store};

/// The holders of one limiter's units.
pub(crate) struct Holders<St> {
    pub(crate) store: Arc<St>,
    pub(crate) fallback: crate::store::memory::MemoryStore,
    pub(crate) cache: Arc<BlockedCache>,
    /// What the fallback admitted that the store never saw (see [`write_back`]).
    pub(crate) unsent: Arc<Unsent>,
    /// The fallback's shares, which a charge lowers, and the clock they are kept on.
    shares: Arc<Shares>,
    clock: Mono,
    /// The slots of store calls left running (a write-back takes one).
    late: LateSlots,
    /// The permits of concurrency rules held (issue 42): renewed while held.
    pub(crate) permits: Arc<PermitBook>,
}

/// The store's part of a refund or a charge.
type ToStore<T> = SmallVec<[T; 1]>;

impl<St> Holders<St> {
    pub(crate) fn new(store: Arc<St>, runtime: &Runtime) -> Self {
        let (fallback, cache, unsent) = (runtime.fallback.clone(), runtime.cache.clone(), runtime.unsent.clone());
        let (shares, clock, late) = (runtime.shares.clone(), runtime.clock(), runtime.late_slots());
        Self { store, fallback, cache, unsent, shares, clock, late, permits: Arc::default() }
    }
}

impl<St: Store> Holders<St> {
    /// Gives back what `held` took, without waiting: see the module docs. A failure is
    /// logged, naming `what` gave the units back.
    pub(crate) fn refund(self: &Arc<Self>, held: Held, what: &'static str) {
        self.leave(&held);
        let (refunds, rules) = self.refund_fallback(&held);
        if refunds.is_empty() {
            return;
        }
        if let Some(local) = self.store.as_local() {
            match local.refund_now(&refunds) {
                Ok(()) => self.forget(&refunds, &rules),
                Err(err) => lost(&refunds, what, &err),
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return lost(&refunds, what, &"no tokio runtime to run it");
        };
        let this = self.clone();
        // Dropped unfinished, polled or not (the runtime shut down first): said, not lost
        // silently.
        let unfinished = Unfinished { rules: refunds.iter().map(|r| r.check.rule).collect(), what };
        drop(runtime.spawn(async move {
            match tokio::time::timeout(held.deadline, this.store.refund(&refunds)).await {
                Ok(Ok(())) => this.forget(&refunds, &rules),
                Ok(Err(err)) => this.resend_permits(&refunds, what, err.to_string()).await,
                Err(_) => {
                    this.resend_permits(&refunds, what, "the store did not answer within the deadline".into()).await
                }
            }
            std::mem::forget(unfinished);
        }));
    }

    /// A refund that failed (sent, outcome unknown): the permits of concurrency rules in
    /// it are sent again, twice at most — a release names each permit's id, and one given
    /// back already is not given twice. Other units are not (a second refund could give
    /// back units of other requests): logged as lost. Permits still not released lapse
    /// after their hold limit (they are no longer renewed).
    async fn resend_permits(&self, refunds: &[Refund], what: &str, err: String) {
        let (permits, units): (Vec<Refund>, Vec<Refund>) =
            refunds.iter().cloned().partition(|r| r.check.algorithm == crate::algorithm::Algorithm::Concurrent);
        if !units.is_empty() {
            lost(&units, what, &err);
        }
        if permits.is_empty() {
            return;
        }
        let deadline = permits[0].check.params.quota.period().min(std::time::Duration::from_secs(1));
        for wait in [100, 1_000] {
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            if let Ok(Ok(())) = tokio::time::timeout(deadline, self.store.refund(&permits)).await {
                return;
            }
        }
        lost(&permits, "permits (they lapse after their hold limit)", &err);
    }

    /// Enters the permits `held` took (issue 42): counted, and the store's renewed every
    /// third of their hold limit until they are given back. The renewal task holds the
    /// holders weakly: it ends with the limiter.
    pub(crate) fn hold(self: &Arc<Self>, held: &Held) {
        let mut any = false;
        for u in held.units.iter().filter(|u| matches!(u.exit, Exit::Released)) {
            self.permits.enter(&u.refund, u.holder == Holder::Store);
            any = true;
        }
        if !any || self.store.as_local().is_some() || !self.permits.start_renewing() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.permits.stopped();
            return;
        };
        let this = Arc::downgrade(self);
        drop(runtime.spawn(async move {
            loop {
                let Some(every) = this.upgrade().map(|h| h.permits.due().1) else { return };
                tokio::time::sleep(every).await;
                let Some(holders) = this.upgrade() else { return };
                let (due, _) = holders.permits.due();
                if due.is_empty() {
                    holders.permits.stopped();
                    // Permits entered meanwhile start another task.
                    if holders.permits.start_renewing() {
                        continue;
                    }
                    return;
                }
                // A renewal has a third of the hold limit; no more than a second of it.
                let deadline = every.min(std::time::Duration::from_secs(1));
                match tokio::time::timeout(deadline, holders.store.renew(&due)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        tracing::warn!(error = %err, "tollgate: could not renew the permits this server holds")
                    }
                    Err(_) => tracing::warn!("tollgate: the store did not renew the permits this server holds in time"),
                }
            }
        }));
    }

    /// The permits of `held` are given back: no longer counted nor renewed.
    fn leave(&self, held: &Held) {
        for u in held.units.iter().filter(|u| matches!(u.exit, Exit::Released)) {
            self.permits.leave(&u.refund, u.holder == Holder::Store);
        }
    }

    /// Gives back what `held` took, and waits for the store (no deadline: the caller
    /// asked).
    pub(crate) async fn refund_now(&self, held: Held) -> Result<(), StoreError> {
        self.leave(&held);
        let (refunds, rules) = self.refund_fallback(&held);
        if refunds.is_empty() {
            return Ok(());
        }
        match self.store.as_local() {
            Some(local) => local.refund_now(&refunds)?,
            None => self.store.refund(&refunds).await?,
        }
        self.forget(&refunds, &rules);
        Ok(())
    }

    /// Takes `units` from `held`'s charged rules without waiting (after a response): see
    /// the module docs. A failure is logged and counted.
    pub(crate) fn charge(self: &Arc<Self>, held: &Held, units: u64) {
        let (checks, fallback) = self.charge_fallback(held, units);
        if let Err((err, local)) = fallback {
            failed(&local, &err);
        }
        if checks.is_empty() {
            return;
        }
        if let Some(local) = self.store.as_local() {
            if let Err(err) = local.charge_now(&checks) {
                failed(&checks, &err);
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return failed(&checks, &"no tokio runtime to take a charge");
        };
        let (this, deadline) = (self.clone(), held.deadline);
        drop(runtime.spawn(async move {
            if let Err(err) = this.charge_store(&checks, deadline).await {
                failed(&checks, &err);
            }
        }));
    }

    /// Takes `units` from `held`'s charged rules, and waits: a remote store's part within
    /// the deadline.
    pub(crate) async fn charge_now(&self, held: &Held, units: u64) -> Result<(), StoreError> {
        let (checks, fallback) = self.charge_fallback(held, units);
        let store = match (checks.is_empty(), self.store.as_local()) {
            (true, _) => Ok(()),
            (false, Some(local)) => local.charge_now(&checks),
            (false, None) => self.charge_store(&checks, held.deadline).await,
        };
        fallback.map_err(|(err, _)| err).and(store)
    }

    async fn charge_store(&self, checks: &[Check], deadline: std::time::Duration) -> Result<(), StoreError> {
        tokio::time::timeout(deadline, self.store.charge(checks)).await.unwrap_or(Err(StoreError::Timeout(deadline)))
    }

    /// Gives the fallback its units at once; the store's refunds, with their rules.
    fn refund_fallback(&self, held: &Held) -> (ToStore<Refund>, ToStore<RuleId>) {
        let (mut refunds, mut rules) = (ToStore::new(), ToStore::new());
        for u in &held.units {
            match u.holder {
                Holder::Store => {
                    // Back to its slice while that is open: no store call.
                    if u.slice.as_ref().is_some_and(|s| s.give_back(u.refund.check.params.cost, u.refund.taken)) {
                        continue;
                    }
                    refunds.push(u.refund.clone());
                    rules.push(u.id);
                }
                Holder::Fallback => {
                    self.fallback.refund_at(std::slice::from_ref(&u.refund), self.fallback.now_micros());
                    // The store's copy of them goes too (one waiting to be written back
                    // stays out of the store).
                    if let Some(Copy::Taken(refund)) = u.copy.as_ref().map(|c| c.refund()) {
                        refunds.push(refund);
                        rules.push(u.id);
                    }
                }
            }
        }
        (refunds, rules)
    }

    /// Charges the fallback its probes at once (its error, with its checks); the store's
    /// probes, each of `units`.
    #[allow(clippy::type_complexity, reason = "a private helper's pair")]
    fn charge_fallback(&self, held: &Held, units: u64) -> (ToStore<Check>, Result<(), (StoreError, ToStore<Check>)>) {
        let (mut to_store, mut local, mut written) = (ToStore::new(), ToStore::new(), Vec::new());
        let now = self.clock.us();
        for p in &held.probes {
            let mut check = p.check.clone();
            check.params.cost = units;
            // What the store last said remains, less this: the fallback's share of it (read
            // under the store's quota, not the fallback's part of it).
            self.shares.take(p.id, p.store.as_ref().unwrap_or(&p.check), units, now);
            match p.holder {
                Holder::Store => to_store.push(check),
                Holder::Fallback => {
                    local.push(check);
                    written.extend(p.store.iter().cloned().map(|mut c| {
                        c.params.cost = units;
                        c
                    }));
                }
            }
        }
        // The fallback's charges reach the store too, as what it admits does.
        self.write_back_detached(written);
        if !local.is_empty() {
            if let Err(err) = self.fallback.charge_at(&local, self.fallback.now_micros()) {
                return (to_store, Err((err, local)));
            }
        }
        (to_store, Ok(()))
    }

    /// `units` are kept for good (a response whose status counts, a verdict handed over):
    /// the fallback's that waited for it go to the write-back list.
    pub(crate) fn kept(&self, units: &[Unit]) {
        for u in units {
            if let Some(check) = u.copy.as_ref().and_then(|c| c.kept()) {
                self.unsent.keep_unit(check, u.copy.clone().expect("a copy"));
            }
        }
    }

    /// Writes `checks` (admitted by the fallback) back to the store in a task of its own:
    /// the charge queues behind the calls the store has yet to answer, so the store counts
    /// these units before it decides what comes next. Kept for the store's next answer when
    /// there is no runtime or no slot for a call left running.
    pub(crate) fn write_back_detached(&self, checks: Vec<Check>) {
        if checks.is_empty() {
            return;
        }
        // One slot of `max_in_flight` a call, up to `WRITE_BACK_IN_FLIGHT` calls at once;
        // with no slot free, the store's next answer takes them.
        let (Ok(runtime), Some(slot)) = (tokio::runtime::Handle::try_current(), self.late.take()) else {
            return self.unsent.keep(checks);
        };
        let wanted = checks.len().min(WRITE_BACK_IN_FLIGHT);
        let slots: Vec<LateSlot> =
            std::iter::once(slot).chain(std::iter::from_fn(|| self.late.take())).take(wanted).collect();
        let (store, unsent) = (self.store.clone(), self.unsent.clone());
        drop(runtime.spawn(async move {
            write_back(&*store, &unsent, checks, slots.len()).await;
            drop(slots);
        }));
    }

    /// The store has the units back: the rejections this process cached for their keys
    /// may not hold any more (forgotten after the refund: one cached before it would stay).
    fn forget(&self, refunds: &[Refund], rules: &[RuleId]) {
        for (r, &rule) in refunds.iter().zip(rules) {
            self.cache.forget(rule, &r.check.key);
        }
    }
}

/// A refund the runtime dropped unfinished (shutting down): the rules of its units.
struct Unfinished {
    rules: ToStore<RuleName>,
    what: &'static str,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        for rule in &self.rules {
            crate::metrics::refund_failed(rule);
        }
        let what = self.what;
        tracing::warn!("tollgate: the runtime shut down before the store took back the units of {what}");
    }
}

/// Units not refunded: logged, and counted per rule.
pub(crate) fn lost(refunds: &[Refund], what: &str, err: &dyn std::fmt::Display) {
    for r in refunds {
        crate::metrics::refund_failed(&r.check.rule);
    }
    tracing::warn!(error = %err, "tollgate: could not refund the units of {what}");
}

/// A charge not taken: logged, and counted per rule.
fn failed<'a>(checks: impl IntoIterator<Item = &'a Check>, err: &dyn std::fmt::Display) {
    let rules: Vec<&str> = checks.into_iter().map(|c| &*c.rule).collect();
    for rule in &rules {
        crate::metrics::charge_failed(rule);
    }
    tracing::warn!(error = %err, ?rules, "tollgate: a charge reported after a response was not taken");
}

/// Charges `store` with `checks`, admitted by the fallback while it never saw it, one
/// check a call (on a cluster, a call fails when one of its slots does: the others would
/// be charged again with it), `in_flight` calls at a time, each within [`LATE_WRITE`].
/// What fails unsent is kept for the store's next answer; one that timed out (within
/// [`LATE_WRITE`] or not) was sent, its outcome unknown: never sent again (the store may
/// run it still, as a stalled node does on resume), and all that follows its round is
/// kept for the store's next answer.
pub(crate) async fn write_back<St: Store>(store: &St, unsent: &Unsent, checks: Vec<Check>, in_flight: usize) {
    let mut again = Vec::new();
    let mut checks = checks.into_iter();
    loop {
        let round: Vec<Check> = checks.by_ref().take(in_flight.max(1)).collect();
        if round.is_empty() {
            break;
        }
        let answers =
            join_all(round.iter().map(|c| tokio::time::timeout(LATE_WRITE, store.charge(std::slice::from_ref(c)))))
                .await;
        let mut late = false;
        for (check, answer) in round.into_iter().zip(answers) {
            let outcome = WriteBack::of(&answer.unwrap_or(Err(StoreError::Timeout(LATE_WRITE))));
            match outcome {
                WriteBack::Unsent => again.push(check),
                WriteBack::Unknown => late = true,
                WriteBack::Written | WriteBack::Failed => {}
            }
            if let Some(label) = outcome.label() {
                crate::metrics::write_back(label, 1);
            }
        }
        if late {
            // The rest waits for the store's next answer.
            again.extend(checks);
            break;
        }
    }
    if !again.is_empty() {
        unsent.keep(again);
    }
}

/// What became of one write-back call (`tollgate_write_backs_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteBack {
    /// The store took it: `written`.
    Written,
    /// It never reached the store: kept for its next answer (no label yet).
    Unsent,
    /// Sent and not answered in time: the store may have taken it, or may still (a
    /// stalled node on resume): `unknown`, and never sent again.
    Unknown,
    /// The store answered with an error: `failed`.
    Failed,
}

impl WriteBack {
    pub(crate) fn of(answer: &Result<(), StoreError>) -> Self {
        match answer {
            Ok(()) => Self::Written,
            Err(err) if err.never_sent() => Self::Unsent,
            Err(err) if err.is_timeout() => Self::Unknown,
            Err(_) => Self::Failed,
        }
    }

    /// The metric's label (none for what is kept to be sent later).
    pub(crate) fn label(self) -> Option<&'static str> {
        match self {
            Self::Written => Some("written"),
            Self::Unsent => None,
            Self::Unknown => Some("unknown"),
            Self::Failed => Some("failed"),
        }
    }
}

/// The most calls one write-back runs at once (each holds a slot of `max_in_flight`).
const WRITE_BACK_IN_FLIGHT: usize = 64;

/// How long a write-back of what the fallback admitted may take.
const LATE_WRITE: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::WriteBack;
    use crate::error::StoreError;
    use std::time::Duration;

    /// Issue 37: a write-back that timed out was sent, its outcome unknown — neither sent
    /// again (the store may run it on resume) nor counted as `failed` (the store answered
    /// with an error).
    #[test]
    fn a_timed_out_write_back_is_unknown_not_unsent_nor_failed() {
        let of = |e: StoreError| WriteBack::of(&Err(e));
        assert_eq!(WriteBack::of(&Ok(())), WriteBack::Written);
        assert_eq!(of(StoreError::Timeout(Duration::from_secs(1))), WriteBack::Unknown);
        assert_eq!(of(StoreError::NodeTimeout("slot 1".into())), WriteBack::Unknown);
        assert_eq!(of(StoreError::Backend("WRONGTYPE".into())), WriteBack::Failed);
        assert_eq!(of(StoreError::Full(1)), WriteBack::Failed);
        for unsent in [
            StoreError::NodeUnavailable("slot 1".into()),
            StoreError::Unavailable("reset".into()),
            StoreError::NotConnected("down".into()),
            StoreError::CircuitOpen(Duration::from_secs(1)),
            StoreError::Overloaded(1),
        ] {
            assert_eq!(of(unsent.clone()), WriteBack::Unsent, "{unsent}");
        }
        let labels: Vec<_> =
            [WriteBack::Written, WriteBack::Unknown, WriteBack::Failed, WriteBack::Unsent].map(WriteBack::label).into();
        assert_eq!(labels, [Some("written"), Some("unknown"), Some("failed"), None]);
    }
}
