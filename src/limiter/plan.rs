//! What one input asks of the store: the [`Plan`] of its checks.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Limiter, RuleSet};
use crate::key::Key;
use crate::store::Check;

/// The checks of one input for one kind of rule (enforced or shadow), with each one's rule
/// index. Up to `N` are kept inline: no allocation per request.
#[derive(Clone, Default)]
pub(crate) struct Checks<const N: usize> {
    pub(crate) checks: SmallVec<[Check; N]>,
    pub(crate) rules: SmallVec<[usize; N]>,
}

impl<const N: usize> Checks<N> {
    pub(crate) fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

/// What one input asks of the store: two enforced rules (say per IP and per key) and one
/// shadow rule fit inline. Rule indexes are into `set`, the rules it was planned under:
/// the input is decided and answered under them, whatever a swap does meanwhile.
pub(crate) struct Plan<I: ?Sized> {
    pub(crate) enforced: Checks<2>,
    pub(crate) shadow: Checks<1>,
    pub(crate) set: Arc<RuleSet<I>>,
}

impl<I: ?Sized> Clone for Plan<I> {
    fn clone(&self) -> Self {
        Self { enforced: self.enforced.clone(), shadow: self.shadow.clone(), set: self.set.clone() }
    }
}

impl<I: ?Sized> Plan<I> {
    /// Adds the check of rule `rule` (an index into `set`).
    fn push(&mut self, check: Check, rule: usize, shadow: bool) {
        if shadow {
            self.shadow.checks.push(check);
            self.shadow.rules.push(rule);
        } else {
            self.enforced.checks.push(check);
            self.enforced.rules.push(rule);
        }
    }

    /// No rule applies.
    pub(crate) fn is_empty(&self) -> bool {
        self.enforced.is_empty() && self.shadow.is_empty()
    }
}

impl<St, I: ?Sized + 'static> Limiter<St, I> {
    /// The one check of `cost` units of `key` under rule `rule` (its base quota), or the
    /// name back when there is no such rule.
    pub(crate) fn plan_key(&self, rule: &str, key: Key, cost: u64) -> Result<Plan<I>, Arc<RuleSet<I>>> {
        let set = self.rules.load();
        let Some((i, r)) = set.find(rule) else { return Err(set) };
        let check = Check {
            rule: r.name.clone(),
            key,
            algorithm: r.algorithm_or(set.algorithm),
            params: r.params(r.quota, cost),
        };
        let mut plan = Plan { enforced: Checks::default(), shadow: Checks::default(), set: set.clone() };
        plan.push(check, i, r.shadow);
        Ok(plan)
    }

    /// The checks `input` asks for: each rule that applies, with its key, quota and cost.
    pub(crate) fn plan(&self, input: &I) -> Plan<I> {
        let set = self.rules.load();
        let mut plan = Plan { enforced: Checks::default(), shadow: Checks::default(), set: set.clone() };
        for (i, rule) in set.rules.iter().enumerate() {
            if rule.bypass.as_ref().is_some_and(|f| f(input)) {
                continue;
            }
            let Some(key) = rule.key.extract(input) else { continue };
            let quota = match &rule.quota_fn {
                Some(f) => match f(input) {
                    Some(q) => q,
                    None => continue,
                },
                None => rule.quota,
            };
            // A charged rule's check is a probe: within the quota? It takes nothing.
            let cost = if rule.charged { 0 } else { rule.cost.as_ref().map_or(1, |f| f(input).max(1)) };
            let check = Check {
                rule: rule.name.clone(),
                key,
                algorithm: rule.algorithm_or(set.algorithm),
                params: rule.params(quota, cost),
            };
            plan.push(check, i, rule.shadow);
        }
        plan
    }
}
