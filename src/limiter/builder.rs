//! [`LimiterBuilder`]: every setting of a limiter, made before it is built.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::registry::OnClash;
use super::{Draft, Limiter, Rules};
use crate::algorithm::Algorithm;
use crate::error::BuildError;
use crate::headers::HeaderStyle;
use crate::key::KeyExtractor;
use crate::quota::Quota;
use crate::rule::{FailMode, Rule, Shared};
use crate::runtime::{Runtime, Settings};
use crate::store::Store;

/// Builds a [`Limiter`] (see [`Limiter::builder`]) or, as `Out`, a
/// [`RateLimitLayer`](crate::RateLimitLayer) (see
/// [`RateLimitLayer::builder`](crate::RateLimitLayer::builder)): every setting of a limiter
/// is made here, before it is built; nothing changes a built one but its
/// [`LimiterHandle`](crate::LimiterHandle)'s rule swaps.
pub struct LimiterBuilder<St, I: ?Sized, Out = Limiter<St, I>> {
    store: St,
    /// The rules and their settings (no header style: a layer's is `headers`).
    draft: Draft<I>,
    cost: Option<Shared<I, u64>>,
    settings: Settings,
    /// How this builder is reached, for [`BuildError::RuleInUse`]'s hint.
    on_clash: OnClash,
    /// The layer's header style (a layer's builder only).
    pub(crate) headers: Option<HeaderStyle>,
    out: PhantomData<fn() -> Out>,
}

impl<St: fmt::Debug, I: ?Sized, Out> fmt::Debug for LimiterBuilder<St, I, Out> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("store", &self.store)
            .field("rules", &self.draft.rules)
            .field("algorithm", &self.draft.algorithm)
            .field("fail_mode", &self.draft.fail_mode)
            .field("deadline", &self.draft.deadline)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<St, I: ?Sized, Out> LimiterBuilder<St, I, Out> {
    /// `hint`, for [`BuildError::RuleInUse`], names the builder the user called.
    pub(crate) fn new(store: St, hint: &'static str) -> Self {
        Self {
            store,
            draft: Draft {
                rules: Vec::new(),
                algorithm: Algorithm::default(),
                fail_mode: FailMode::default(),
                deadline: Duration::from_millis(50),
                headers: None,
            },
            cost: None,
            settings: Settings::default(),
            on_clash: OnClash::Refuse(hint),
            headers: None,
            out: PhantomData,
        }
    }

    /// `RateLimitLayer::new`'s builder: its rule shares a count it cannot claim.
    pub(crate) fn sharing(mut self) -> Self {
        self.on_clash = OnClash::Share;
        self
    }

    /// Adds a rule with default options.
    #[must_use]
    pub fn rule(self, name: impl Into<String>, quota: Quota, key: impl KeyExtractor<I>) -> Self {
        self.add_rule(Rule::new(name, quota, key))
    }

    /// Adds a configured [`Rule`].
    #[must_use]
    pub fn add_rule(mut self, rule: Rule<I>) -> Self {
        self.draft.rules.push(rule);
        self
    }

    /// The algorithm of every rule that does not choose its own
    /// (default: [`Algorithm::SlidingWindowCounter`]).
    #[must_use]
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.draft.algorithm = algorithm;
        self
    }

    /// What happens when the store fails, for rules that do not choose
    /// (default: [`FailMode::Fallback`]).
    #[must_use]
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.draft.fail_mode = mode;
        self
    }

    /// The cost of an input for every rule that has none of its own (default 1).
    #[must_use]
    pub fn cost(mut self, f: impl Fn(&I) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(f));
        self
    }

    /// The deadline of every store call (default 50 ms): a store that has not answered by
    /// then is an error, handled by the fail mode.
    #[must_use]
    pub fn timeout(mut self, deadline: Duration) -> Self {
        self.draft.deadline = deadline;
        self
    }

    /// The most store calls in flight at once (default 1024); beyond it a call is a store
    /// error at once, never queued.
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.settings.max_in_flight = n.max(1);
        self
    }

    /// Circuit breaker: after `failures` consecutive store errors, stop calling the store
    /// for `cool_down`, then let one call probe it (default: 5 failures, 1 s).
    #[must_use]
    pub fn circuit_breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.settings.breaker = (failures, cool_down);
        self
    }

    /// The in-process store the fallback ([`FailMode::Fallback`], the default) decides in
    /// while the store fails (default: a [`MemoryStore`](crate::MemoryStore) of at most
    /// 100,000 keys): one with a bound or a clock of your own.
    #[must_use]
    pub fn fallback(mut self, store: crate::store::memory::MemoryStore) -> Self {
        self.settings.fallback = Some(store);
        self
    }

    /// How many servers share the store (default: the store counts them, see
    /// [`Store::servers`]; 1 for a store that does not): while the store fails, the
    /// fallback ([`FailMode::Fallback`], the default) admits each key up to its quota
    /// divided by this. Give it for a custom store that cannot count.
    #[must_use]
    pub fn servers(mut self, n: u64) -> Self {
        self.settings.servers = Some(n.max(1));
        self
    }

    /// Turns the local blocked-key cache on or off (default on): once a key is rejected
    /// with `retry_after = d`, this process rejects the same key and cost for `d` without
    /// asking the store, but for one call a second (a reset or a lift of a block on another
    /// server reaches this one within a second). Exact, because other servers can only
    /// consume more.
    #[must_use]
    pub fn local_cache(mut self, on: bool) -> Self {
        self.settings.cache_enabled = on;
        self
    }

    /// Quota slices for hot keys, for every rule that does not say otherwise
    /// ([`Rule::slices`](crate::Rule::slices)); default off. See the README's "Quota
    /// slices": a server that decides a key often decides it in memory from a slice of its
    /// quota taken from the store, never over the limit.
    #[must_use]
    pub fn slices(mut self, on: bool) -> Self {
        self.settings.slices = on;
        self
    }

    /// The share of a quota in use from which an allowed decision counts as near the
    /// limit, in the metric `tollgate_near_limit_total{rule}` (default 0.8: at most a fifth
    /// left; see [`Decision::is_near_limit`](crate::Decision::is_near_limit)). An alert on
    /// it warns before clients are rejected.
    ///
    /// A share outside (0, 1] is refused by [`LimiterBuilder::build`].
    #[must_use]
    pub fn near_limit(mut self, share: f64) -> Self {
        self.settings.near_limit = share;
        self
    }

    /// The limiter (or layer).
    ///
    /// # Errors
    ///
    /// [`BuildError::DuplicateRule`] when two rules share a name,
    /// [`BuildError::InvalidRuleName`] for an empty or over-long name, and
    /// [`BuildError::InvalidConfig`] when there is no rule at all, and
    /// [`BuildError::RuleInUse`] when another live limiter (or layer) over this store
    /// (or a clone of it) already uses one of the rule names: the two would share their
    /// counts. Clones of one layer share one limiter, and are fine.
    /// [`BuildError::InvalidConfig`] also for a [`LimiterBuilder::near_limit`] share outside
    /// (0, 1].
    pub fn build(self) -> Result<Out, BuildError>
    where
        St: Store,
        Out: From<Limiter<St, I>>,
    {
        crate::runtime::check_near_limit(self.settings.near_limit)?;
        let identity = self.store.identity();
        let owner = super::registry::new_owner();
        let set = self.draft.check(identity, owner, self.cost.as_ref(), self.on_clash)?;
        let mut runtime = Runtime::new(self.settings);
        // A remote store counts the limiters sharing it from now on (the fallback's share),
        // until this one is dropped.
        if self.store.as_local().is_none() {
            runtime.announced = self.store.announce();
        }
        Ok(Limiter {
            holders: Arc::new(super::Holders::new(Arc::new(self.store), &runtime)),
            rules: Arc::new(Rules::new(set, identity, owner, self.cost)),
            runtime,
            headers: self.headers,
        }
        .into())
    }
}
