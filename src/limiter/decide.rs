//! The one place a decision is made: the blocked-key cache, then ONE store call for all
//! the checks of an input (synchronous for an in-process store, guarded for a remote one,
//! the fallback when it fails), then the fail mode, metrics, the cache of rejections, and
//! what the input holds ([`Held`]).

use std::sync::Arc;
use std::time::Duration;

use smallvec::{smallvec, SmallVec};
use tokio::time::Instant;

use super::held::{Exit, Held, Holder, Probe, Unit};
use super::{Limiter, Plan, RuleSet};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::rule::FailMode;
use crate::store::{Check, Outcome, Outcomes, Refund, Store};
use crate::verdict::Verdict;
use crate::verdict::{Decided, DecidedBy, Ruling};

/// What [`Limiter::decide_now`] gives.
#[allow(clippy::large_enum_variant, reason = "returned once per input and matched at once: boxing would allocate")]
pub(crate) enum Now<I: ?Sized> {
    /// Decided, under this rule set.
    Decided(Verdict, Arc<RuleSet<I>>),
    /// The store decides only through a future: the plan back, for [`Limiter::decide`].
    Later(Plan<I>),
}

impl<St: Store, I: ?Sized + 'static> Limiter<St, I> {
    /// Decides a plan: the blocked-key cache, then one guarded store call for every check
    /// (shadow checks inside it), the fail mode when the store cannot decide.
    pub(crate) async fn decide(&self, plan: Plan<I>) -> Verdict {
        let plan = match self.decide_now(plan) {
            Now::Decided(verdict, _) => return verdict,
            Now::Later(plan) => plan,
        };
        if self.runtime.settings.cache_enabled {
            if let Some(verdict) = self.blocked(&plan) {
                return verdict;
            }
        }
        // Timed only for the debug event that reports it (two clock reads a decision).
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        // Taken before the store decides: a refund while it decides voids the cache's
        // record of its rejection.
        let epoch = self.runtime.cache.epoch();
        let answer = self.ask(&plan.checks, plan.set.deadline).await;
        let (verdict, set) = self.conclude(plan, answer, started);
        // Only the store's own rejections are final: the fallback's limits are its own
        // (a share for one server) and end with the outage.
        if verdict.is_rejected() && verdict.source == Some(DecidedBy::Store) && self.runtime.settings.cache_enabled {
            self.remember_rejections(&set, &verdict, epoch);
        }
        verdict
    }

    /// [`Limiter::decide`] at once, with no future, for an in-process store
    /// ([`Store::as_local`]): its answer is synchronous.
    pub(crate) fn decide_now(&self, plan: Plan<I>) -> Now<I> {
        let Some(local) = self.holders.store.as_local() else { return Now::Later(plan) };
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let outcomes = match plan.checks.as_slice() {
            [one] => local.check_one(one).map(|o| smallvec![Some(o)]),
            checks => local.check(checks).map(Outcomes::from_vec),
        };
        let answer = outcomes.map(|outcomes| Answered { outcomes, by: DecidedBy::Store, fallback: None });
        let (verdict, set) = self.conclude(plan, answer, started);
        Now::Decided(verdict, set)
    }

    /// The verdict of a plan's store answer: the fail mode for an error, metrics and
    /// events, the blocked-key cache, and what the input holds.
    fn conclude(&self, plan: Plan<I>, answer: Answer, started: Option<Instant>) -> (Verdict, Arc<RuleSet<I>>) {
        let Plan { checks, rules, enforced, set } = plan;
        let mut held = Held { generation: set.generation(), deadline: set.deadline, ..Held::default() };
        let answered = match answer {
            Ok(answered) => answered,
            Err(error) => {
                crate::metrics::store_error(&error);
                let closed = rules[..enforced].iter().any(|&r| set.fail_mode_of(r) == FailMode::Closed);
                self.runtime.warn_store_failure(&error, !closed);
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
                             open) until it answers; .fallback(MemoryStore::new(), servers) keeps an approximate limit \
                             meanwhile (said once; see tollgate_fail_open_total)"
                        )
                    });
                    // A charge after a fail-open pass goes to the store.
                    held.probes = probes(&set, &checks, &rules, Holder::Store);
                }
                return (Verdict::empty(Ruling::Failed { error, closed }, held), set);
            }
        };
        let Answered { outcomes, by, fallback } = answered;
        let holder = if by == DecidedBy::Fallback { Holder::Fallback } else { Holder::Store };
        // What each holder decided: the fallback's share of each quota, for the fallback.
        let as_held = fallback.as_deref().unwrap_or(&checks);
        let mut verdict = Verdict::empty(Ruling::Allowed, Held::default());
        // No enforced rule (shadow rules only): nothing was decided.
        verdict.source = (enforced > 0).then_some(by);
        for (i, (check, &rule)) in checks.iter().zip(&rules).enumerate() {
            let Some(Outcome { decision: d, taken }) = &outcomes[i] else { continue };
            let shadow = i >= enforced;
            record(check, d, shadow, started);
            if let Some(taken) = *taken {
                let exit = match &set.rules[rule].count_if {
                    Some(counts) => Exit::UnlessCounted(counts.clone()),
                    None => Exit::Kept,
                };
                let refund = Refund { check: as_held[i].clone(), taken };
                held.units.push(Unit { refund, rule, holder, exit });
            }
            if !shadow {
                if !d.allowed {
                    verdict.ruling = Ruling::Rejected;
                }
                verdict.decided.push(Decided { check: check.clone(), rule, decision: d.clone() });
            }
        }
        if verdict.is_allowed() {
            held.probes = probes(&set, as_held, &rules, holder);
            // Near the limit: what this input leaves in use (a rejected one takes nothing).
            for d in &verdict.decided {
                if d.decision.is_near_limit(self.runtime.settings.near_limit) {
                    crate::metrics::near_limit(&d.check.rule);
                }
            }
        } else {
            // A refused input takes nothing: the store committed none of its checks.
            debug_assert!(held.units.is_empty(), "a refused input holds units");
            held.units.clear();
        }
        verdict.held = held;
        (verdict, set)
    }

    /// One call to a remote store, guarded, with the fallback limiter when the store
    /// fails (an in-process store is asked in [`Limiter::decide_now`]).
    async fn ask(&self, checks: &[Check], deadline: Duration) -> Answer {
        match self.runtime.call(&*self.holders.store, checks, deadline).await {
            Ok(outcomes) => Ok(Answered { outcomes, by: DecidedBy::Store, fallback: None }),
            Err(err) => match self.runtime.fallback(&err, checks) {
                Some((outcomes, local)) => Ok(Answered { outcomes, by: DecidedBy::Fallback, fallback: Some(local) }),
                None => Err(err),
            },
        }
    }

    /// A rejection from the blocked-key cache, when one of the enforced keys is blocked.
    fn blocked(&self, plan: &Plan<I>) -> Option<Verdict> {
        let now = self.runtime.mono_us();
        let set = &plan.set;
        for (check, rule) in plan.enforced() {
            let r = &set.rules[rule];
            if r.count_if.is_some() && r.block.is_zero() {
                continue; // units may be refunded: a rejection is not final (a block is)
            }
            let quota = check.params.quota;
            if let Some(decision) = self.runtime.cache.blocked(set.id(rule), &check.key, check.params.cost, quota, now)
            {
                crate::metrics::decision(&check.rule, "local_rejected");
                let held = Held { generation: set.generation(), deadline: set.deadline, ..Held::default() };
                let mut verdict = Verdict::empty(Ruling::Rejected, held);
                verdict.source = Some(DecidedBy::LocalCache);
                verdict.decided.push(Decided { check: check.clone(), rule, decision });
                return Some(verdict);
            }
        }
        None
    }

    fn remember_rejections(&self, set: &RuleSet<I>, verdict: &Verdict, epoch: u64) {
        let now = self.runtime.mono_us();
        for Decided { check, rule, decision: d } in &verdict.decided {
            let r = &set.rules[*rule];
            // A count-by-outcome rule's rejection may end with a refund; a block is final.
            if d.allowed || d.retry_after.is_none() || (r.count_if.is_some() && r.block.is_zero()) {
                continue;
            }
            // A block refuses every cost: cached as cost 0, which every request reaches.
            let cost = if r.block.is_zero() { check.params.cost } else { 0 };
            // A rule whose blocks can be lifted or shortened by hand (`Limiter::block`) is
            // asked again after a second: the lift reaches every server within it.
            let max_age = if check.params.reads_block() { BLOCK_RECHECK_US } else { u64::MAX };
            self.runtime.cache.insert(set.id(*rule), &check.key, cost, check.params.quota, now, d, max_age, epoch);
        }
    }
}

static FAIL_OPEN: crate::notice::Once = crate::notice::Once::new();
static FAIL_CLOSED: crate::notice::Once = crate::notice::Once::new();

/// How long this process answers a key blocked under a rule that reads blocks from its
/// blocked-key cache before it asks the store again, µs: a lifted or shortened block
/// (`Limiter::block`, `reset`) reaches every server within this.
const BLOCK_RECHECK_US: u64 = 1_000_000;

/// A store call's answer: the outcomes, who decided them, and for the fallback the checks
/// as it decided them (its share of each quota).
struct Answered {
    outcomes: Outcomes,
    by: DecidedBy,
    fallback: Option<Vec<Check>>,
}

type Answer = Result<Answered, StoreError>;

/// Records one check's decision: a debug event and a metric; a shadow rule that would
/// reject is logged.
fn record(check: &Check, d: &Decision, shadow: bool, started: Option<Instant>) {
    if shadow {
        crate::metrics::decision(&check.rule, if d.allowed { "allowed" } else { "shadow_rejected" });
        if !d.allowed {
            tracing::info!(rule = %check.rule, key = ?check.key, "tollgate: shadow rule would reject");
        }
        return;
    }
    tracing::debug!(
        rule = %check.rule,
        allowed = d.allowed,
        remaining = d.remaining,
        store_latency_us = started.map_or(0, |t| u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)),
        "tollgate decision"
    );
    crate::metrics::decision(&check.rule, if d.allowed { "allowed" } else { "rejected" });
}

/// The checks of the charged rules (`Rule::charged`) among `checks` (of `rules`), as
/// probes held by `holder`: what a charge after the work takes from. A check by key of a
/// charged rule may take units now too; a check of cost 0 of another rule is no probe.
fn probes<I: ?Sized>(set: &RuleSet<I>, checks: &[Check], rules: &[usize], holder: Holder) -> SmallVec<[Probe; 1]> {
    let charged = checks.iter().zip(rules).filter(|&(_, &rule)| set.rules[rule].charged);
    charged.map(|(c, _)| Probe { check: c.clone(), holder }).collect()
}
