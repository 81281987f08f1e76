//! The one place a decision is made: the blocked-key cache, then ONE store call for all
//! the checks of an input (synchronous for an in-process store, guarded for a remote one,
//! the fallback when it fails), then the fail mode, metrics, the cache of rejections, and
//! what the input holds ([`Held`](super::Held)).

use std::sync::Arc;

use smallvec::{smallvec, SmallVec};
use tokio::time::Instant;

use super::held::{Exit, Holder, Probe, Unit};
use super::holders::lost;
use super::{Limiter, Plan, RuleSet};
use crate::decision::{Decision, Longest};
use crate::error::StoreError;
use crate::rule::FailMode;
use crate::runtime::{
    pays, slice_check, slice_id, sliceable, slotted, BlockedCache, Cached, FailedThen, Late, RuleId, Shares, Slice,
    SliceUnit, StoreCopy, LATE_WAIT,
};
use crate::store::{Check, LocalStore, Outcome, Outcomes, Refund, Store};
use crate::verdict::{Decided, DecidedBy, Ruling, Verdict};

impl<St: Store, I: ?Sized + 'static> Limiter<St, I> {
    /// Decides a plan: at once for an in-process store, else the blocked-key cache, then
    /// one guarded store call for every check (shadow checks inside it), the fail mode
    /// when the store cannot decide. Nothing is decided before the first poll.
    ///
    /// The paths borrow the plan: it is held once, in this future (a path taking it by
    /// value would hold a second copy in its own).
    pub(crate) async fn decide(&self, plan: Plan<I>) -> Verdict {
        match self.holders.store.as_local() {
            Some(local) => self.decide_local(local, &plan),
            None => self.decide_remote(&plan).await,
        }
    }

    /// [`Limiter::decide`] by a remote store, the clock read once before it is asked.
    pub(crate) async fn decide_remote(&self, plan: &Plan<I>) -> Verdict {
        let started = Instant::now();
        if self.runtime.settings.cache_enabled {
            if let Some(verdict) = self.blocked(plan, self.runtime.us_at(started)) {
                return verdict;
            }
        }
        let answer = match self.take_slices(plan, started) {
            // A bucket's slice refused it: its next slot comes later.
            Some(sliced) if !sliced.wait.is_empty() => Ok(sliced.refused()),
            // Boxed: the rare path's state would double the size of every decision's future.
            Some(sliced) => Box::pin(self.ask_with(plan, sliced, started)).await,
            None => self.ask(plan, started).await,
        };
        // Timed for the debug event that reports it.
        self.conclude(plan, answer, tracing::enabled!(tracing::Level::DEBUG).then_some(started))
    }

    /// Whether check `i` of `plan` is decided from quota slices: an enforced check of a
    /// window algorithm or a bucket on a rule with slices on, that pays at this many servers
    /// ([`pays`]), on a store on a real clock. Its slices' name, and the servers (times
    /// this process's limiters counting into the rule) it shares the key with.
    fn sliced(&self, plan: &Plan<I>, i: usize) -> Option<(RuleId, u64)> {
        let (check, rule) = (&plan.checks[i], plan.rules[i]);
        let r = &plan.set.rules[rule];
        if i >= plan.enforced || !r.slices.unwrap_or(self.runtime.settings.slices) {
            return None;
        }
        let servers = self.runtime.servers(&*self.holders.store) * plan.set.sharers(rule);
        takes_slices(r, check, true, self.holders.store.real_clock(), servers)
            .then(|| (slice_id(plan.set.share_id(rule), check.params.quota), servers))
    }

    /// The units `plan`'s sliced checks take from this server's open slices (each counts
    /// as demand, and may start a slice's request), when any does.
    fn take_slices(&self, plan: &Plan<I>, started: Instant) -> Option<FromSlices<St>> {
        let rt = &self.runtime;
        let mut units: SliceUnits = SmallVec::new();
        let mut wait: Waits = SmallVec::new();
        for i in 0..plan.checks.len() {
            let Some((id, servers)) = self.sliced(plan, i) else {
                units.push(None);
                continue;
            };
            // Once a check waits for its slot, the request is refused: the later checks'
            // slices are only looked at (their refusals too), nothing taken from them.
            let commit = wait.is_empty();
            let take = rt.slices.take_or_look(id, &plan.checks[i], servers, rt.us_at(started), commit);
            if let Some((k, epoch)) = take.fetch {
                self.ask_slice(plan, i, (id, epoch), (k, take.after), servers);
            }
            if let Some(decision) = take.wait {
                wait.push((i, decision));
            }
            match take.unit {
                Some(looked) if !commit => {
                    wait.push((i, looked.decision));
                    units.push(None);
                }
                unit => units.push(unit),
            }
        }
        (!wait.is_empty() || units.iter().any(Option::is_some)).then(|| FromSlices {
            wait,
            units,
            costs: plan.checks.iter().map(|c| c.params.cost).collect(),
            ids: plan.rules.iter().map(|&r| plan.set.id(r)).collect(),
            holders: self.holders.clone(),
        })
    }

    /// Asks the store for a slice of `k` units of check `i` of `plan`, in a task of its
    /// own: a check of cost `k` through the same script, awaited to its end (a timeout
    /// means "sent, outcome unknown"; nothing is sent twice). Its answer opens the slice,
    /// or gives its units back at once when it came too late to use them; it also tells
    /// the fallback what remains.
    fn ask_slice(&self, plan: &Plan<I>, i: usize, (id, epoch): (RuleId, u64), (k, after): (u64, u64), servers: u64) {
        let rt = &self.runtime;
        let check = slice_check(&plan.checks[i], k, after);
        let rule = plan.rules[i];
        let handle = tokio::runtime::Handle::try_current();
        let slot = rt.late_slots().take();
        let (Ok(handle), Some(slot), true) = (handle, slot, rt.circuit_closed()) else {
            rt.slices.not_granted(id, epoch, &check, false, rt.mono_us());
            return;
        };
        let (slices, store, clock) = (rt.slices.clone(), self.holders.store.clone(), rt.clock());
        let teach =
            (plan.set.fail_mode_of(rule) == FailMode::Fallback).then(|| (rt.shares.clone(), plan.set.share_id(rule)));
        // A bucket's refusal the blocked-key cache holds may have been decided past this
        // very slice's slots (its reservation moved the key's TAT): once it is open, the
        // key is decided from it, not from that refusal.
        let cached =
            (rt.settings.cache_enabled && slotted(check.algorithm)).then(|| (rt.cache.clone(), plan.set.id(rule)));
        self.sweep_slices(&handle);
        drop(handle.spawn(async move {
            let _slot = slot;
            let asked = clock.us();
            let answer = tokio::time::timeout(LATE_WAIT, store.check_one(&check)).await;
            let now = clock.us();
            match answer {
                Ok(Ok(o)) => {
                    if let Some((shares, share_id)) = teach {
                        let remaining = if o.decision.allowed { o.decision.remaining() } else { 0 };
                        let whole_in = u64::try_from(o.decision.reset_after().as_micros()).unwrap_or(u64::MAX);
                        shares.record(share_id, &check, remaining, whole_in, servers, now, asked, false);
                    }
                    match slices.install(id, epoch, &check, &o, asked, now) {
                        Some(refund) => {
                            if let Err(err) = store.refund(std::slice::from_ref(&refund)).await {
                                lost(&[refund], "a quota slice granted too late to use", &err);
                            }
                        }
                        None if o.taken.is_some() => {
                            if let Some((cache, cache_id)) = cached {
                                cache.forget(cache_id, &check.key);
                            }
                        }
                        None => {}
                    }
                }
                Ok(Err(err)) => slices.not_granted(id, epoch, &check, !err.never_sent(), now),
                Err(_) => slices.not_granted(id, epoch, &check, true, now),
            }
        }));
    }

    /// Starts, once, the task that closes lapsed slices and gives back what they left
    /// (ends with the limiter).
    fn sweep_slices(&self, handle: &tokio::runtime::Handle) {
        let rt = &self.runtime;
        if rt.slices.sweeping.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let (slices, store, clock) = (Arc::downgrade(&rt.slices), self.holders.store.clone(), rt.clock());
        drop(handle.spawn(async move {
            // Dropped with its runtime: the next slice asked for starts another.
            let _running = slices.upgrade().map(|s| s.sweeper());
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n: u32 = 0;
            loop {
                tick.tick().await;
                let Some(slices) = slices.upgrade() else { return };
                n = n.wrapping_add(1);
                let refunds = slices.sweep(clock.us(), n.is_multiple_of(PRUNE_EVERY));
                drop(slices);
                if refunds.is_empty() {
                    continue;
                }
                match tokio::time::timeout(LATE_WAIT, store.refund(&refunds)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => lost(&refunds, "quota slices that lapsed", &err),
                    Err(_) => lost(&refunds, "quota slices that lapsed", &"the store did not answer"),
                }
            }
        }));
    }

    /// `plan` decided with the units `sliced` took from slices, and the store (or the
    /// fallback) for the rest: all or nothing, as one store call is — a request the rest
    /// refuses gives the slices' units back.
    async fn ask_with(&self, plan: &Plan<I>, mut sliced: FromSlices<St>, started: Instant) -> Answer {
        let n = plan.checks.len();
        if plan.enforced == n && sliced.units.iter().all(Option::is_some) {
            let mut answered = Answered::new(DecidedBy::Slice);
            for unit in &mut sliced.units {
                let SliceUnit { slice, decision, taken } = unit.take().expect("every check sliced");
                answered.outcomes.push(Some(Outcome { decision, taken: Some(taken) }));
                answered.slices.push(Some(slice));
            }
            return Ok(answered);
        }
        let rest: SmallVec<[usize; 2]> = (0..n).filter(|&i| sliced.units[i].is_none()).collect();
        let sub = Plan {
            checks: rest.iter().map(|&i| plan.checks[i].clone()).collect(),
            rules: rest.iter().map(|&i| plan.rules[i]).collect(),
            enforced: rest.iter().filter(|&&i| i < plan.enforced).count(),
            set: plan.set.clone(),
        };
        // Dropped here, `sliced` gives its units back.
        let answered = self.ask(&sub, started).await?;
        let refused = answered.outcomes[..sub.enforced].iter().any(|o| o.as_ref().is_none_or(|o| !o.decision.allowed));
        let Answered { outcomes, by, fallback, copies, .. } = answered;
        let mut merged = Answered::new(by);
        let mut fallback = fallback.map(Vec::into_iter);
        let (mut outcomes, mut copies) = (outcomes.into_iter(), copies.into_iter());
        let mut as_held = Vec::with_capacity(n);
        for (i, check) in plan.checks.iter().enumerate() {
            match &mut sliced.units[i] {
                Some(SliceUnit { decision, .. }) if refused => {
                    // Refused by another rule: this one's units go back (when `sliced` drops).
                    // Its decision is still the slice's (`conclude` keeps the stamp).
                    let mut decision = *decision;
                    decision.set_decided_by(DecidedBy::Slice);
                    merged.outcomes.push(Some(Outcome { decision, taken: None }));
                    merged.slices.push(None);
                    merged.copies.push(None);
                    as_held.push(check.clone());
                }
                unit @ Some(_) => {
                    let SliceUnit { slice, decision, taken } = unit.take().expect("a sliced unit");
                    merged.outcomes.push(Some(Outcome { decision, taken: Some(taken) }));
                    merged.slices.push(Some(slice));
                    merged.copies.push(None);
                    as_held.push(check.clone());
                }
                None => {
                    merged.outcomes.push(outcomes.next().flatten());
                    merged.slices.push(None);
                    merged.copies.push(copies.next().flatten());
                    as_held.push(fallback.as_mut().and_then(Iterator::next).unwrap_or_else(|| check.clone()));
                }
            }
        }
        merged.fallback = (by == DecidedBy::Fallback).then_some(as_held);
        Ok(merged)
    }

    /// The store's synchronous interface, for an in-process store ([`Store::as_local`]):
    /// [`Limiter::decide_local`] then decides at once, with no future.
    pub(crate) fn local(&self) -> Option<&dyn LocalStore> {
        self.holders.store.as_local()
    }

    /// The verdict of `plan` from an in-process store, decided at once.
    pub(crate) fn decide_local(&self, local: &dyn LocalStore, plan: &Plan<I>) -> Verdict {
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let outcomes = match plan.checks.as_slice() {
            [one] => local.check_one_now(one).map(|o| smallvec![Some(o)]),
            checks => local.check_now(checks).map(Outcomes::from_vec),
        };
        let answer = outcomes.map(|outcomes| Answered { outcomes, ..Answered::new(DecidedBy::Store) });
        self.conclude(plan, answer, started)
    }

    /// The verdict of a plan's store answer: the fail mode for an error, metrics and
    /// events, the blocked-key cache, and what the input holds.
    fn conclude(&self, plan: &Plan<I>, answer: Answer, started: Option<Instant>) -> Verdict {
        let Plan { checks, rules, enforced, set } = plan;
        let enforced = *enforced;
        let mut held = set.held();
        let answered = match answer {
            Ok(answered) => answered,
            Err(error) => {
                crate::metrics::store_error(&error);
                let closed = rules[..enforced].iter().any(|&r| set.fail_mode_of(r) == FailMode::Closed);
                let action = if closed { FailedThen::Closed } else { FailedThen::Open };
                self.runtime.warn_store_failure(&error, action);
                if closed {
                    crate::metrics::fail_closed();
                    FAIL_CLOSED.tell(false, || {
                        format!(
                            "tollgate: the rate-limit store failed ({error}): requests it cannot decide are refused \
                             (fail closed: 503) until it answers (said once; see tollgate_fail_closed_total)"
                        )
                    });
                } else {
                    crate::metrics::fail_open();
                    FAIL_OPEN.tell(false, || {
                        format!(
                            "tollgate: the rate-limit store failed ({error}): requests pass without a limit (fail \
                             open) until it answers; FailMode::Fallback (the default) keeps each server to its share \
                             of every limit meanwhile (said once; see tollgate_fail_open_total)"
                        )
                    });
                    // A charge after a fail-open pass goes to the store.
                    held.probes = probes(set, checks, checks, rules, Holder::Store);
                }
                return Verdict::empty(Ruling::Failed { error, closed }, held);
            }
        };
        let Answered { outcomes, by, fallback, copies, slices } = answered;
        let holder = if by == DecidedBy::Fallback { Holder::Fallback } else { Holder::Store };
        // What each holder decided: the fallback's share of each quota, for the fallback.
        let as_held = fallback.as_deref().unwrap_or(checks);
        // The verdict is written once, at the end, where the caller keeps it (built early
        // and filled in, its 256-byte `held` was copied in twice).
        let mut decided: SmallVec<[Decided; 1]> = SmallVec::new();
        // The rejecting rule that makes the caller wait longest: its index in `decided`, its key.
        let mut worst = Longest::new();
        for (i, (check, &rule)) in checks.iter().zip(rules.iter()).enumerate() {
            let Some(Outcome { decision: d, taken }) = &outcomes[i] else { continue };
            let shadow = i >= enforced;
            let slice = slices.get(i).cloned().flatten();
            // A slice's decision of a request another rule refused holds no slice: stamped.
            let who = if slice.is_some() || d.decided_by() == DecidedBy::Slice { DecidedBy::Slice } else { by };
            record(check, d, shadow, started, who);
            if let Some(taken) = *taken {
                let exit = match &set.rules[rule].count_if {
                    // Issue 42: a concurrency rule's permits go back when the work ends.
                    _ if set.rules[rule].concurrent.is_some() => Exit::Released,
                    Some(counts) => Exit::UnlessCounted(counts.clone()),
                    None => Exit::Kept,
                };
                let refund = Refund { check: as_held[i].clone(), taken };
                let copy = copies.get(i).cloned().flatten();
                // A slice's units are the store's (it counted the slice).
                let holder = if slice.is_some() { Holder::Store } else { holder };
                held.units.push(Unit { refund, rule, id: set.id(rule), holder, exit, copy, slice });
            }
            if !shadow {
                if !d.allowed {
                    worst.offer(d.retry_after(), (decided.len(), &check.key));
                }
                let (quota, cost) = (check.params.quota, check.params.cost);
                let mut decision = *d;
                decision.set_decided_by(who);
                let permits = check.algorithm == crate::algorithm::Algorithm::Concurrent;
                decided.push(Decided { rule, name: check.rule, quota, decision, cost, permits });
            }
        }
        let ruling = match worst.take() {
            Some((worst, key)) => Ruling::Rejected { worst, key: key.clone() },
            None => Ruling::Allowed,
        };
        if matches!(ruling, Ruling::Allowed) {
            held.probes = probes(set, checks, as_held, rules, holder);
            // Near the limit: what this input leaves in use (a rejected one takes nothing).
            // Only counted for the metric (a division a rule, with no metrics to count it).
            for d in decided.iter().filter(|_| cfg!(feature = "metrics")) {
                if d.decision.is_near_limit(self.runtime.settings.near_limit) {
                    crate::metrics::near_limit(d.name);
                }
            }
        } else {
            // A refused input takes nothing: the store committed none of its checks.
            debug_assert!(held.units.is_empty(), "a refused input holds units");
            held.units.clear();
        }
        // No enforced rule (shadow rules only): nothing was decided.
        Verdict { ruling, decided, source: (enforced > 0).then_some(by), held }
    }

    /// One guarded call to a remote store, with the fallback limiter for the rules that
    /// fall back when it fails; its answers, in time or late, teach the blocked-key cache
    /// and the fallback's shares.
    ///
    /// `started`: when the caller began to decide (the clock is read once before the call
    /// and once after it).
    async fn ask(&self, plan: &Plan<I>, started: Instant) -> Answer {
        let rt = &self.runtime;
        // Taken before the store decides: a refund while it decides voids the cache's
        // record of its rejection.
        let epoch = rt.cache.epoch();
        let asked = rt.us_at(started);
        let (answer, late, ended) = rt.call(&self.holders.store, &plan.checks, plan.set.deadline, started).await;
        let now = rt.us_at(ended);
        let servers = rt.servers(&*self.holders.store);
        let err = match answer {
            Ok(outcomes) => {
                let cache = rt.settings.cache_enabled.then_some(&*rt.cache);
                let slices = (rt.settings.slices, self.holders.store.real_clock());
                let teach = Teach { cache, shares: &rt.shares, now, asked, epoch, servers, late: false, slices };
                teach.learn(&plan.set, &plan.checks, &plan.rules[..plan.enforced], &outcomes);
                // What the fallback admitted while the store could not be reached, now that it answers.
                if rt.unsent.any() {
                    self.holders.write_back_detached(rt.unsent.take());
                }
                // What the store said remains sizes the next slice of a sliced key.
                for (i, o) in outcomes.iter().enumerate() {
                    if let (Some((id, _)), Some(o)) = (self.sliced(plan, i), o) {
                        rt.slices.learn(id, &plan.checks[i], o, asked, now);
                    }
                }
                return Ok(Answered { outcomes, ..Answered::new(DecidedBy::Store) });
            }
            Err(err) => err,
        };
        let set = &plan.set;
        let enforced = &plan.rules[..plan.enforced];
        let use_it: SmallVec<[bool; 2]> =
            plan.rules.iter().map(|&r| set.fail_mode_of(r) == FailMode::Fallback).collect();
        let closed = enforced.iter().any(|&r| set.fail_mode_of(r) == FailMode::Closed);
        let decided = if closed || !use_it.contains(&true) {
            None
        } else {
            let ids: SmallVec<[RuleId; 2]> = plan.rules.iter().map(|&r| set.share_id(r)).collect();
            // Each limiter of the process that counts into a rule takes its part of this
            // server's share.
            let parts: SmallVec<[u64; 2]> = plan.rules.iter().map(|&r| servers * set.sharers(r)).collect();
            rt.fallback(&err, &plan.checks, &ids, &use_it, servers, &parts)
        };
        // What the fallback admitted, as the store would count it, each with the store's
        // copy of it: the late call's commit, or what is written back.
        let mut copies: Copies = SmallVec::new();
        if let Some((outcomes, _)) = &decided {
            let taken = |o: &Option<Outcome>| o.as_ref().is_some_and(|o| o.taken.is_some());
            for (c, o) in plan.checks.iter().zip(outcomes) {
                // Issue 42: the fallback's permits are its own, given back to it: no copy.
                let permits = c.algorithm == crate::algorithm::Algorithm::Concurrent;
                copies.push((taken(o) && c.params.cost > 0 && !permits).then(Arc::default));
            }
        }
        // A call cut by its deadline runs on: the store counts what it admits, and its
        // answer is learnt from. A call the store never saw: what the fallback admitted
        // for it is written back.
        match late {
            Some(late) => {
                // Whether the input goes on (admitted by the fallback, or passed open): else
                // what the late call takes is given back. (Shadow rules refuse nothing.)
                let goes_on = match &decided {
                    Some((outcomes, _)) => outcomes[..plan.enforced].iter().flatten().all(|o| o.decision.allowed),
                    None => !closed,
                };
                self.learn_late(late, plan, goes_on, copies.clone(), (epoch, asked), servers);
            }
            None if err.never_sent() => self.write_back_now(plan, &copies),
            None => {}
        }
        match decided {
            Some((outcomes, local)) => {
                Ok(Answered { outcomes, fallback: Some(local), copies, ..Answered::new(DecidedBy::Fallback) })
            }
            None => Err(err),
        }
    }

    /// What the fallback admitted for a call the store never saw, written back: at once
    /// (the charge queues behind the calls the store has yet to answer) for units kept
    /// whatever the outcome; once kept, for those a status may give back (`Rule::count_if`:
    /// they wait for the response's status, see `Holders::kept`).
    fn write_back_now(&self, plan: &Plan<I>, copies: &Copies) {
        let mut now = Vec::new();
        for ((check, &rule), copy) in plan.checks.iter().zip(&plan.rules).zip(copies) {
            let Some(copy) = copy else { continue };
            if plan.set.rules[rule].count_if.is_none() {
                now.push(check.clone());
            } else {
                // Not kept yet: the verdict is still being made.
                copy.pending(check);
            }
        }
        self.holders.write_back_detached(now);
    }

    /// Lets a call cut by its deadline finish, in a task of its own: its answer (the
    /// store's decision) teaches the cache and the shares; what it took is given back
    /// unless the input `goes_on`, else becomes the store's copy of the fallback's units
    /// (`copies`), which their refund undoes; when it fails without the store having seen
    /// it, those units wait to be written back. `asked`: the cache's epoch and the time
    /// (the runtime's clock) when the store was asked.
    fn learn_late(&self, late: Late, plan: &Plan<I>, goes_on: bool, copies: Copies, asked: (u64, u64), servers: u64) {
        let (epoch, asked) = asked;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let slices = (self.runtime.settings.slices, self.holders.store.real_clock());
        let (lessons, holders) = (self.runtime.lessons(), self.holders.clone());
        let (set, checks, rules, enforced) = (plan.set.clone(), plan.checks.clone(), plan.rules.clone(), plan.enforced);
        drop(runtime.spawn(async move {
            match late.answer().await {
                Ok(outcomes) => {
                    let now = lessons.clock.us();
                    let cache = lessons.cache.as_deref();
                    let teach =
                        Teach { cache, shares: &lessons.shares, now, asked, epoch, servers, late: true, slices };
                    teach.learn(&set, &checks, &rules[..enforced], &outcomes);
                    // Refused meanwhile (a 503, the fallback's share): nobody uses them. Else
                    // the store's copy of the fallback's units, unless those went back.
                    let mut refunds = Vec::new();
                    for (i, (c, o)) in checks.iter().zip(&outcomes).enumerate() {
                        let Some(taken) = o.as_ref().and_then(|o| o.taken) else { continue };
                        let refund = Refund { check: c.clone(), taken };
                        match copies.get(i).and_then(Option::as_ref) {
                            _ if !goes_on => refunds.push(refund),
                            Some(copy) => refunds.extend(copy.taken(refund)),
                            // Issue 42: the input holds the fallback's permits: the store's go back.
                            None if c.algorithm == crate::algorithm::Algorithm::Concurrent => refunds.push(refund),
                            None => {}
                        }
                    }
                    if !refunds.is_empty() {
                        if let Err(err) = holders.store.refund(&refunds).await {
                            lost(&refunds, "a call answered after its deadline", &err);
                        }
                    }
                }
                // The store lost it, or never had it: written back at its next answer (a
                // refund meanwhile keeps them out), once kept for a count-by-outcome rule.
                Err(err) if err.never_sent() => {
                    for ((check, &rule), copy) in checks.iter().zip(&rules).zip(&copies) {
                        let Some(copy) = copy else { continue };
                        if set.rules[rule].count_if.is_none() || copy.pending(check) {
                            lessons.unsent.keep_unit(check.clone(), copy.clone());
                        }
                    }
                }
                Err(_) => {}
            }
        }));
    }

    /// A rejection from the blocked-key cache, when one of the enforced keys is blocked:
    /// of several, the one that makes the caller wait longest (one that can never accept
    /// counts as longest; the last of equals), as the store's rejection named it.
    fn blocked(&self, plan: &Plan<I>, now: u64) -> Option<Verdict> {
        let set = &plan.set;
        let mut worst = Longest::new();
        for (check, rule) in plan.enforced() {
            let r = &set.rules[rule];
            if r.count_if.is_some() && r.block.is_zero() {
                continue; // units may be refunded: a rejection is not final (a block is)
            }
            let quota = check.params.quota;
            match self.runtime.cache.lookup(set.id(rule), &check.key, check.params.cost, quota, now) {
                Some(Cached::Blocked(decision)) => worst.offer(decision.retry_after(), (check, rule, decision)),
                // A rejection due to be asked again (a reset elsewhere may have lifted it):
                // the store answers, and names the longest wait itself.
                Some(Cached::Recheck) => return None,
                None => {}
            }
        }
        let (check, rule, mut decision) = worst.take()?;
        decision.set_decided_by(DecidedBy::LocalCache);
        crate::metrics::decision(check.rule, "local_rejected", "cache");
        let mut verdict = Verdict::empty(Ruling::Rejected { worst: 0, key: check.key.clone() }, set.held());
        verdict.source = Some(DecidedBy::LocalCache);
        let (quota, cost) = (check.params.quota, check.params.cost);
        let permits = check.algorithm == crate::algorithm::Algorithm::Concurrent;
        verdict.decided.push(Decided { rule, name: check.rule, quota, decision, cost, permits });
        Some(verdict)
    }
}

/// Where a store's answers are learnt from, and when.
struct Teach<'a> {
    cache: Option<&'a BlockedCache>,
    shares: &'a Shares,
    now: u64,
    /// When the store was asked (µs, the runtime's clock).
    asked: u64,
    /// The cache's epoch when the store was asked (see [`BlockedCache::epoch`]).
    epoch: u64,
    servers: u64,
    /// Whether the answer came after its call's deadline.
    late: bool,
    /// Whether rules take slices unless they say (`LimiterBuilder::slices`), and whether
    /// the store is on a real clock (else none does).
    slices: (bool, bool),
}

impl Teach<'_> {
    /// Learns from the store's `outcomes` for `checks`, of which the first are those of
    /// the enforced `rules` of `set`: each key's share of what remains, for the fallback,
    /// and its rejections, for the blocked-key cache. Only the store's own rejections are
    /// final: the fallback's limits are its own (a share for one server) and end with the
    /// outage.
    fn learn<I: ?Sized>(&self, set: &RuleSet<I>, checks: &[Check], rules: &[usize], outcomes: &Outcomes) {
        for ((check, &rule), o) in checks.iter().zip(rules).zip(outcomes.iter()) {
            let Some(Outcome { decision: d, .. }) = o else { continue };
            // Issue 42: permits come back when work ends, not in time: a concurrency rule
            // teaches neither the fallback's shares nor the blocked-key cache.
            if check.algorithm == crate::algorithm::Algorithm::Concurrent {
                continue;
            }
            let id = set.id(rule);
            // Only a rule that falls back has a share to bound.
            if set.fail_mode_of(rule) == FailMode::Fallback {
                let remaining = if d.allowed { d.remaining() } else { 0 };
                let whole_in = u64::try_from(d.reset_after().as_micros()).unwrap_or(u64::MAX);
                let parts = self.servers * set.sharers(rule);
                self.shares.record(
                    set.share_id(rule),
                    check,
                    remaining,
                    whole_in,
                    parts,
                    self.now,
                    self.asked,
                    self.late,
                );
            }
            let r = &set.rules[rule];
            // A count-by-outcome rule's rejection may end with a refund; a block is final.
            let Some(cache) = self.cache else { continue };
            if d.allowed || d.retry_after().is_none() || (r.count_if.is_some() && r.block.is_zero()) {
                continue;
            }
            // A block refuses every cost: cached as cost 0, which every request reaches.
            let cost = if r.block.is_zero() { check.params.cost } else { 0 };
            // Other servers' slices give back what they leave when they lapse: a key of a
            // sliced rule is asked again as often.
            let (default, real_clock) = self.slices;
            let sliced = takes_slices(r, check, default, real_clock, self.servers * set.sharers(rule));
            let recheck = if sliced { SLICED_RECHECK_US } else { RECHECK_US };
            cache.insert(id, &check.key, cost, check.params.quota, self.now, d, recheck, self.epoch);
        }
    }
}

static FAIL_OPEN: crate::notice::Once = crate::notice::Once::new();
static FAIL_CLOSED: crate::notice::Once = crate::notice::Once::new();

/// How long this process answers a refused key from its blocked-key cache before it asks
/// the store again, µs: a lift or a reset on another server (`Limiter::block`, `reset`)
/// reaches every server within this. At most one store call a second per refused key and
/// server, however many requests it sends.
const RECHECK_US: u64 = 1_000_000;

/// [`RECHECK_US`] for a key of a rule that takes slices: the lapse of other servers'
/// slices, whose leftovers then go back to the store.
const SLICED_RECHECK_US: u64 = 100_000;

/// A store call's answer: the outcomes, who decided them, and for the fallback its checks
/// (its share of each quota) and the store's copy of each one's units; per check, the
/// quota slice that decided it.
struct Answered {
    outcomes: Outcomes,
    by: DecidedBy,
    fallback: Option<Vec<Check>>,
    copies: Copies,
    slices: SmallVec<[Option<Arc<Slice>>; 2]>,
}

impl Answered {
    fn new(by: DecidedBy) -> Self {
        Self { outcomes: Outcomes::new(), by, fallback: None, copies: SmallVec::new(), slices: SmallVec::new() }
    }
}

/// Whether a check of rule `r` takes slices (`default`: the limiter's setting), on a store
/// on a real clock or not, shared by `servers`: a window algorithm or a bucket, not charged, with no
/// penalty block (a refused slice would start it), a cost, and a quota that pays.
fn takes_slices<I: ?Sized>(
    r: &crate::rule::Rule<I>,
    check: &Check,
    default: bool,
    real_clock: bool,
    servers: u64,
) -> bool {
    r.slices.unwrap_or(default)
        && real_clock
        && sliceable(check.algorithm)
        && !r.charged
        && r.block.is_zero()
        && check.params.cost > 0
        && pays(check.params.quota, servers)
}

/// How often lapsed slices are closed and given back.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(10);
/// Every this many sweeps, keys idle for long are forgotten too.
const PRUNE_EVERY: u32 = 100;

/// Per check, the unit it took from a quota slice, with its decision.
type SliceUnits = SmallVec<[Option<SliceUnit>; 2]>;

/// Units a request took from quota slices while the rest of its checks are decided: what
/// is still in it when dropped (the request refused, the future dropped at the `.await`)
/// goes back to its slice, or to the store once the slice closed.
/// The checks a bucket's slice refused (their next slot comes later), with their refusals,
/// and the decisions of those looked at after the first refusal.
type Waits = SmallVec<[(usize, Decision); 1]>;

struct FromSlices<St: Store> {
    /// The checks a bucket's slice refused, and those looked at after the first (`Waits`).
    wait: Waits,
    units: SliceUnits,
    /// Each check's cost.
    costs: SmallVec<[u64; 2]>,
    /// The checks' rules' identities (the blocked-key cache's names).
    ids: SmallVec<[RuleId; 2]>,
    holders: Arc<super::Holders<St>>,
}

impl<St: Store> FromSlices<St> {
    /// The answer when a bucket's slice refused a check: refused with no store call, its
    /// refusal the slice's; the units other checks took go back (when `self` drops).
    fn refused(mut self) -> Answered {
        let mut answered = Answered::new(DecidedBy::Slice);
        let waits = std::mem::take(&mut self.wait);
        for (i, unit) in self.units.iter().enumerate() {
            let waited = waits.iter().find(|(w, _)| *w == i).map(|&(_, d)| d);
            let decision = waited.or_else(|| unit.as_ref().map(|u| u.decision)).map(|mut d| {
                d.set_decided_by(DecidedBy::Slice);
                d
            });
            answered.outcomes.push(decision.map(|decision| Outcome { decision, taken: None }));
            answered.slices.push(None);
            answered.copies.push(None);
        }
        answered
    }
}

impl<St: Store> Drop for FromSlices<St> {
    fn drop(&mut self) {
        let mut held = super::Held::default();
        for (i, unit) in self.units.iter_mut().enumerate() {
            let Some(SliceUnit { slice, taken, .. }) = unit.take() else { continue };
            // Back to the slice at once while it is open; else a refund of its commit.
            if slice.give_back(self.costs[i], taken) {
                continue;
            }
            let refund = slice.refund(self.costs[i], taken);
            let (id, exit, copy) = (self.ids[i], Exit::Kept, None);
            held.units.push(Unit { refund, rule: 0, id, holder: Holder::Store, exit, copy, slice: None });
        }
        if !held.units.is_empty() {
            held.deadline = LATE_WAIT;
            self.holders.refund(held, "units of a quota slice a refused request took");
        }
    }
}

/// Per check, the store's copy of what the fallback admitted for it.
type Copies = SmallVec<[Option<Arc<StoreCopy>>; 2]>;

type Answer = Result<Answered, StoreError>;

/// Records one check's decision: a debug event, a metric, a log line for a shadow rejection.
fn record(check: &Check, d: &Decision, shadow: bool, started: Option<Instant>, by: DecidedBy) {
    let by = by.label();
    if shadow {
        crate::metrics::decision(check.rule, if d.allowed { "allowed" } else { "shadow_rejected" }, by);
        if !d.allowed {
            tracing::info!(rule = %check.rule, key = ?check.key, "tollgate: shadow rule would reject");
        }
        return;
    }
    tracing::debug!(
        rule = %check.rule,
        allowed = d.allowed,
        remaining = d.remaining(),
        decided_by = by,
        store_latency_us = started.map_or(0, |t| u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)),
        "tollgate decision"
    );
    crate::metrics::decision(check.rule, if d.allowed { "allowed" } else { "rejected" }, by);
}

/// The checks of the charged rules (`Rule::charged`) among `checks` (of `rules`), as
/// probes held by `holder`, which decided them as `as_held`: what a charge after the work
/// takes from. A check by key of a charged rule may take units now too; a check of cost 0
/// of another rule is no probe.
fn probes<I: ?Sized>(
    set: &RuleSet<I>,
    checks: &[Check],
    as_held: &[Check],
    rules: &[usize],
    holder: Holder,
) -> Vec<Probe> {
    let charged = checks.iter().zip(as_held).zip(rules).filter(|&(_, &rule)| set.rules[rule].charged);
    charged
        .map(|((c, held), &rule)| Probe {
            check: held.clone(),
            holder,
            store: (holder == Holder::Fallback).then(|| c.clone()),
            id: set.share_id(rule),
        })
        .collect()
}
