//! What one input asks of the store: the [`Plan`] of its checks.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Limiter, RuleSet};
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
    /// No rule applies.
    pub(crate) fn is_empty(&self) -> bool {
        self.enforced.is_empty() && self.shadow.is_empty()
    }
}

impl<St, I: ?Sized + 'static> Limiter<St, I> {
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
            if rule.shadow {
                plan.shadow.checks.push(check);
                plan.shadow.rules.push(i);
            } else {
                plan.enforced.checks.push(check);
                plan.enforced.rules.push(i);
            }
        }
        plan
    }
}
