//! What one input asks of the store: the [`Plan`] of its checks.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Limiter, RuleSet};
use crate::key::Key;
use crate::store::Check;
use crate::verdict::{Ruling, Verdict};

/// What one input asks of the store, in one call: each rule that applies, enforced rules
/// first, then shadow ones (each check carries its role, `Params::shadow`). Two checks fit
/// inline: no allocation for most requests. Rule indexes are into `set`, the rules it was
/// planned under: the input is decided and answered under them, whatever a swap does
/// meanwhile.
pub(crate) struct Plan<I: ?Sized> {
    pub(crate) checks: SmallVec<[Check; 2]>,
    /// Each check's rule.
    pub(crate) rules: SmallVec<[usize; 2]>,
    /// How many of the checks, at the front, are enforced.
    pub(crate) enforced: usize,
    pub(crate) set: Arc<RuleSet<I>>,
}

impl<I: ?Sized> Clone for Plan<I> {
    fn clone(&self) -> Self {
        Self { checks: self.checks.clone(), rules: self.rules.clone(), enforced: self.enforced, set: self.set.clone() }
    }
}

impl<I: ?Sized> Plan<I> {
    fn new(set: Arc<RuleSet<I>>) -> Self {
        Self { checks: SmallVec::new(), rules: SmallVec::new(), enforced: 0, set }
    }

    /// Adds the check of rule `rule` (an index into `set`): an enforced one after the
    /// other enforced ones, a shadow one at the end.
    fn push(&mut self, check: Check, rule: usize) {
        if check.params.shadow {
            self.checks.push(check);
            self.rules.push(rule);
        } else {
            self.checks.insert(self.enforced, check);
            self.rules.insert(self.enforced, rule);
            self.enforced += 1;
        }
    }

    /// No rule applies.
    pub(crate) fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }

    /// The enforced checks, with their rules.
    pub(crate) fn enforced(&self) -> impl Iterator<Item = (&Check, usize)> {
        self.checks[..self.enforced].iter().zip(self.rules[..self.enforced].iter().copied())
    }
}

impl<St, I: ?Sized + 'static> Limiter<St, I> {
    /// The one check of `cost` units of `key` under rule `rule` (its base quota), or, with
    /// no such rule, a refused verdict, said once per call.
    #[allow(clippy::result_large_err, reason = "made once per check by key and matched at once")]
    pub(crate) fn plan_key(&self, rule: &str, key: Key, cost: u64) -> Result<Plan<I>, Verdict> {
        let set = self.rules.load();
        let Some((i, r)) = set.find(rule) else {
            tracing::warn!(rule, "tollgate: check by key under a rule this limiter does not have");
            let error = super::unknown(rule);
            let held = set.held();
            return Err(Verdict::empty(Ruling::Failed { error, closed: true }, held));
        };
        let mut plan = Plan::new(set.clone());
        plan.push(set.check(r, key, r.quota, cost), i);
        Ok(plan)
    }

    /// The checks `input` asks for: each rule that applies, with its key, quota and cost.
    pub(crate) fn plan(&self, input: &I) -> Plan<I> {
        let set = self.rules.load();
        let mut plan = Plan::new(set.clone());
        for (i, rule) in set.rules.iter().enumerate() {
            if rule.bypass.as_ref().is_some_and(|f| f(input)) {
                continue;
            }
            let Some(key) = rule.key.extract(input) else {
                rule.watch.saw(false, &rule.name);
                continue;
            };
            let quota = match &rule.quota_fn {
                Some(f) => match f(input) {
                    Some(q) => q,
                    None => {
                        rule.watch.saw(false, &rule.name);
                        continue;
                    }
                },
                None => rule.quota,
            };
            rule.watch.saw(true, &rule.name);
            // A charged rule's check is a probe: within the quota? It takes nothing.
            let cost = if rule.charged { 0 } else { rule.cost.as_ref().map_or(1, |f| f(input).max(1)) };
            plan.push(set.check(rule, key, quota, cost), i);
        }
        plan
    }
}
