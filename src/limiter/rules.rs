//! The rules a [`Limiter`](super::Limiter) decides by, swappable at run time: each input
//! is planned, decided and answered under one [`RuleSet`] snapshot, and a
//! [`LimiterHandle`] replaces the snapshot atomically (a quota, or the whole set from a
//! configuration). Store state is named by rule, key and algorithm, so it outlives a
//! swap wherever it still applies: a rule that keeps its name and algorithm keeps its
//! counts under its new quota.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::held::Held;
use super::registry::{self, Claim, OnClash, Owner};
use crate::algorithm::Algorithm;
use crate::error::BuildError;
use crate::headers::HeaderStyle;
use crate::key::Key;
use crate::quota::Quota;
use crate::rule::{check_rule_name, FailMode, Rule, Shared};
use crate::runtime::RuleId;
use crate::store::Check;

/// One version of a limiter's rules and the settings that go with them.
pub(crate) struct RuleSet<I: ?Sized> {
    pub(crate) rules: Arc<[Rule<I>]>,
    pub(crate) algorithm: Algorithm,
    pub(crate) fail_mode: FailMode,
    /// The deadline of every store call.
    pub(crate) deadline: Duration,
    /// The header style a reloaded configuration names (`None`: the layer's own).
    pub(crate) headers: Option<HeaderStyle>,
    /// Per rule: the name clients see (empty: hidden).
    pub(crate) names: Box<[Arc<str>]>,
    /// Per rule: its identity ([`identity`]), by which the blocked-key cache and the
    /// fallback's shares name it.
    ids: Box<[RuleId]>,
    /// Per rule: its count's identity ([`count_identity`]), by which the fallback's shares
    /// name it.
    share_ids: Box<[RuleId]>,
    /// The rule names this set holds on its store (see `registry`), released on drop.
    claim: Option<Arc<Claim>>,
}

/// What names a rule in this process's blocked-key cache and the fallback's shares: its
/// name, its algorithm and what else decides how its store state reads (the leaky
/// bucket's longest delay, its blocks), not the rule set it is in. A swap that keeps them
/// keeps what the store taught about the rule's keys (a reload of an unchanged file
/// changes nothing); one that changes them starts the rule afresh, as its store state
/// does. The quota is not part of it: a cached rejection holds only under the quota it
/// was made under, and a share is rescaled to the quota it is read under.
fn identity<I: ?Sized>(rule: &Rule<I>, algorithm: Algorithm) -> RuleId {
    // SipHash with fixed keys: the same rule, the same identity, in every set.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&*rule.name, rule.algorithm_or(algorithm), rule.max_delay, rule.block, rule.blockable).hash(&mut h);
    h.finish()
}

/// What names a rule's count in the fallback's shares: its name and algorithm, as the
/// store names the count's state (`<prefix>:{<key>}:<rule>:<algorithm>:v6`). Its blocks
/// and the leaky bucket's longest delay change how a rejection reads, not what the key
/// used: a swap that only makes a rule blockable, or changes its penalty, keeps the
/// share of what the store said remains (the store keeps counting the same state).
fn count_identity<I: ?Sized>(rule: &Rule<I>, algorithm: Algorithm) -> RuleId {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&*rule.name, rule.algorithm_or(algorithm)).hash(&mut h);
    h.finish()
}

impl<I: ?Sized> RuleSet<I> {
    /// The blocked-key cache's name for rule `index` of this set.
    pub(crate) fn id(&self, index: usize) -> RuleId {
        self.ids[index]
    }

    /// The fallback's shares' name for rule `index` of this set ([`count_identity`]).
    pub(crate) fn share_id(&self, index: usize) -> RuleId {
        self.share_ids[index]
    }

    /// What an input decided under this set holds before its store call.
    pub(crate) fn held(&self) -> Held {
        Held { deadline: self.deadline, ..Held::default() }
    }

    /// How many limiters of this process count into rule `rule`'s state on the store (1
    /// unless `RateLimitLayer::new` joined a name): the fallback's share of this server's
    /// share that each takes.
    pub(crate) fn sharers(&self, rule: usize) -> u64 {
        self.claim.as_ref().map_or(1, |c| c.sharers(rule))
    }

    pub(crate) fn fail_mode_of(&self, rule: usize) -> FailMode {
        self.rules[rule].fail_mode.unwrap_or(self.fail_mode)
    }

    pub(crate) fn find(&self, name: &str) -> Option<(usize, &Rule<I>)> {
        self.rules.iter().enumerate().find(|(_, r)| &*r.name == name)
    }

    /// The check of `cost` units of `key` under `rule`, one of this set's, with `quota`.
    pub(crate) fn check(&self, rule: &Rule<I>, key: Key, quota: Quota, cost: u64) -> Check {
        Check { rule: rule.name, key, algorithm: rule.algorithm_or(self.algorithm), params: rule.params(quota, cost) }
    }
}

/// What a set is made of, before it is checked.
pub(crate) struct Draft<I: ?Sized> {
    pub(crate) rules: Vec<Rule<I>>,
    pub(crate) algorithm: Algorithm,
    pub(crate) fail_mode: FailMode,
    pub(crate) deadline: Duration,
    pub(crate) headers: Option<HeaderStyle>,
}

impl<I: ?Sized> Draft<I> {
    /// Checks the rules (at least one, valid unique names) and claims their names for
    /// `owner` on the store `store` (see `Store::identity`).
    pub(crate) fn check(
        self,
        store: Option<usize>,
        owner: Owner,
        cost: Option<&Shared<I, u64>>,
        on_clash: OnClash,
    ) -> Result<RuleSet<I>, BuildError> {
        if self.rules.is_empty() {
            return Err(BuildError::InvalidConfig {
                rule: String::new(),
                field: "rule".into(),
                why: "a limiter needs at least one rule".into(),
            });
        }
        if self.algorithm == Algorithm::Concurrent {
            return Err(BuildError::InvalidConfig {
                rule: String::new(),
                field: "algorithm".into(),
                why: "Algorithm::Concurrent is not a rate: it cannot be the limiter's default algorithm (build a \
                      concurrency rule with Rule::concurrent)"
                    .into(),
            });
        }
        for (i, r) in self.rules.iter().enumerate() {
            check_rule_name(&r.name)?;
            r.check_kind()?;
            if self.rules[..i].iter().any(|o| o.name == r.name) {
                return Err(BuildError::DuplicateRule(r.name.to_string()));
            }
        }
        let claim = store
            .map(|id| registry::claim(id, owner, self.rules.iter().map(|r| &r.name), on_clash))
            .transpose()
            .map_err(|n| {
                let hint = if let OnClash::Refuse(hint) = on_clash { hint } else { "" };
                BuildError::RuleInUse { rule: n.to_string(), hint }
            })?;
        // `cost` for the rules that have none.
        let mut rules = self.rules;
        if let Some(cost) = cost {
            for r in &mut rules {
                r.cost.get_or_insert_with(|| cost.clone());
            }
        }
        Ok(RuleSet {
            names: rules.iter().map(Rule::public_name_or_name).collect(),
            ids: rules.iter().map(|r| identity(r, self.algorithm)).collect(),
            share_ids: rules.iter().map(|r| count_identity(r, self.algorithm)).collect(),
            rules: rules.into(),
            algorithm: self.algorithm,
            fail_mode: self.fail_mode,
            deadline: self.deadline,
            headers: self.headers,
            claim,
        })
    }
}

/// A limiter's current rule set, and what a swap needs.
pub(crate) struct Rules<I: ?Sized> {
    current: ArcSwap<RuleSet<I>>,
    /// One swap at a time: each builds on the set the last one left.
    swap: Mutex<()>,
    /// The store's identity and this limiter's, for the rule-name registry.
    store: Option<usize>,
    owner: Owner,
    /// The cost of rules that have none of their own, for rules added by a swap.
    cost: Option<Shared<I, u64>>,
}

impl<I: ?Sized> Rules<I> {
    pub(crate) fn new(set: RuleSet<I>, store: Option<usize>, owner: Owner, cost: Option<Shared<I, u64>>) -> Self {
        Self { current: ArcSwap::from_pointee(set), swap: Mutex::new(()), store, owner, cost }
    }

    /// The current set: an input is decided under one snapshot from plan to answer.
    pub(crate) fn load(&self) -> Arc<RuleSet<I>> {
        self.current.load_full()
    }

    /// Replaces the set with what `f` makes of the current one; on an error the current
    /// set stays in force.
    fn swap(&self, f: impl FnOnce(&mut Draft<I>) -> Result<(), BuildError>) -> Result<(), BuildError> {
        let _one_at_a_time = self.swap.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let set = self.load();
        let mut draft = Draft {
            rules: set.rules.to_vec(),
            algorithm: set.algorithm,
            fail_mode: set.fail_mode,
            deadline: set.deadline,
            headers: set.headers,
        };
        f(&mut draft)?;
        let hint = OnClash::Refuse("in the rules given to LimiterHandle");
        let next = draft.check(self.store, self.owner, self.cost.as_ref(), hint)?;
        tracing::info!(rules = ?next.rules.iter().map(|r| (r.name(), r.quota())).collect::<Vec<_>>(), "tollgate: rules swapped");
        self.current.store(Arc::new(next));
        Ok(())
    }
}

/// Changes a running [`Limiter`](crate::Limiter)'s (or
/// [`RateLimitLayer`](crate::RateLimitLayer)'s) rules without a restart: from
/// [`Limiter::handle`](crate::Limiter::handle) or
/// [`RateLimitLayer::handle`](crate::RateLimitLayer::handle). Clones change the same
/// limiter.
///
/// A swap is atomic: each input is decided entirely under the rules before it or
/// entirely under the rules after it. State in the store is named by rule, key and
/// algorithm, so a rule that keeps its name and algorithm keeps its state under a new
/// quota; a rule whose algorithm changes starts afresh, as a new rule does. The window
/// algorithms keep counts of units: a key that used 80 a minute of 100 has 20 left, or
/// 120 after a raise to 200. The token bucket, the leaky bucket and GCRA keep time (how
/// far ahead the key's use has pushed it), which the new quota reads at its own rate: the
/// 80 units' time is 160 units at 200 a minute, leaving 40 — the rate in use carries over,
/// not the count. What this process learnt from the store goes the same way: the
/// rejections it caches and, while the store cannot answer, the fallback's share of what
/// the store said remains are kept for a rule that keeps its name and algorithm (read
/// under its new quota as the store reads its state). A change that cannot be built
/// changes nothing and says why.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::BuildError> {
/// use tollgate::{Limiter, MemoryStore, Quota};
///
/// let limiter = Limiter::builder(MemoryStore::new())
///     .rule("jobs", Quota::per_minute(1), |user: &str| Some(user.to_owned()))
///     .build()?;
/// let handle = limiter.handle();
/// assert!(limiter.check("ada").await.is_allowed());
/// assert!(limiter.check("ada").await.is_rejected());
///
/// handle.set_quota("jobs", Quota::per_minute(2))?; // the unit taken still counts
/// assert!(limiter.check("ada").await.is_allowed());
/// assert!(limiter.check("ada").await.is_rejected());
/// assert!(handle.set_quota("no-such-rule", Quota::per_minute(2)).is_err());
/// # Ok(()) }
/// ```
pub struct LimiterHandle<I: ?Sized> {
    pub(super) rules: Arc<Rules<I>>,
}

impl<I: ?Sized> Clone for LimiterHandle<I> {
    fn clone(&self) -> Self {
        Self { rules: self.rules.clone() }
    }
}

impl<I: ?Sized> fmt::Debug for LimiterHandle<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterHandle").field("rules", &self.rules.load().rules).finish()
    }
}

impl<I: ?Sized> LimiterHandle<I> {
    /// The rules in force.
    #[must_use]
    pub fn rules(&self) -> Arc<[Rule<I>]> {
        self.rules.load().rules.clone()
    }

    /// Sets the quota of rule `rule` (for a rule with [`Rule::quota_fn`], the quota used
    /// when the function gives the same as before, and by `peek`).
    ///
    /// # Errors
    ///
    /// [`BuildError::UnknownRule`] when there is no rule of that name.
    pub fn set_quota(&self, rule: &str, quota: Quota) -> Result<(), BuildError> {
        self.rules.swap(|draft| {
            let r = draft.rules.iter_mut().find(|r| &*r.name == rule);
            r.map(|r| r.quota = quota).ok_or_else(|| BuildError::UnknownRule(rule.to_owned()))
        })
    }

    /// Replaces the rule set with what `f` makes of the current one (a configuration's
    /// reload); on an error the rules in force stay.
    #[cfg(feature = "config")]
    pub(crate) fn swap(&self, f: impl FnOnce(&mut Draft<I>) -> Result<(), BuildError>) -> Result<(), BuildError> {
        self.rules.swap(f)
    }

    /// Replaces every rule. Rules keep their state by name and algorithm, as above.
    ///
    /// # Errors
    ///
    /// As [`LimiterBuilder::build`](crate::LimiterBuilder::build): no rule, a duplicate
    /// or invalid name, or a name another live limiter over the same store uses.
    pub fn set_rules(&self, rules: Vec<Rule<I>>) -> Result<(), BuildError> {
        self.rules.swap(|draft| {
            draft.rules = rules;
            Ok(())
        })
    }
}
