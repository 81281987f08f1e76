//! [`Limiter`]: rules, a store and the runtime protections — everything that decides, and
//! nothing about HTTP. [`RateLimitLayer`](crate::RateLimitLayer) is its HTTP adapter.

mod builder;
mod holders;
mod lease;
mod plan;
mod registry;
mod rules;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use smallvec::{smallvec, SmallVec};
use tokio::time::Instant;

pub(crate) use self::builder::Config;
pub use self::builder::LimiterBuilder;
pub(crate) use self::holders::Holders;
use self::lease::{Exit, Holder, Probe, Unit};
pub(crate) use self::lease::{Held, Lease};
pub(crate) use self::plan::Plan;
pub use self::rules::LimiterHandle;
pub(crate) use self::rules::{Draft, RuleSet, Rules};
use crate::key::Key;
use crate::runtime::Runtime;
use crate::store::{Check, Outcome, Outcomes, Refund, Store};
use crate::verdict::{Decided, DecidedBy, State};
use crate::{Decision, FailMode, Quota, Rule, StoreError, Verdict};

/// Decides whether inputs of type `I` are within their limits: the rules, the store, and
/// the protections that keep a failing store from failing the caller (a deadline and an
/// in-flight cap on every store call, a circuit breaker, the fail mode, an optional
/// fallback limiter, a local cache of blocked keys, metrics).
///
/// Use it directly to limit anything that is not an HTTP request — WebSocket messages,
/// jobs of a queue, outgoing calls; [`RateLimitLayer`](crate::RateLimitLayer) wraps one
/// for HTTP. Rules take their key, quota and cost from the input.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::BuildError> {
/// use std::time::Duration;
/// use tollgate::{Limiter, MemoryStore, Quota};
///
/// struct Message {
///     user: String,
///     bytes: usize,
/// }
///
/// let limiter = Limiter::builder(MemoryStore::new())
///     .rule("messages", Quota::per_second(5), |m: &Message| Some(m.user.clone()))
///     .build()?;
///
/// let msg = Message { user: "ada".into(), bytes: 120 };
/// let verdict = limiter.check(&msg).await;
/// assert!(verdict.is_allowed());
///
/// // Jobs and streams can wait for their turn instead, up to a bound.
/// let verdict = limiter.wait(&msg, Duration::from_secs(2)).await;
/// assert!(verdict.is_allowed());
/// # let _ = msg.bytes;
/// # Ok(()) }
/// ```
pub struct Limiter<St, I: ?Sized> {
    /// The store, and whatever else holds units (the fallback): the one router of
    /// give-backs and charges.
    holders: Arc<Holders<St>>,
    /// The rules, with the algorithm, fail mode and deadline: swappable at run time.
    rules: Arc<Rules<I>>,
    pub(crate) runtime: Runtime,
}

impl<St: fmt::Debug, I: ?Sized> fmt::Debug for Limiter<St, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.rules.load();
        f.debug_struct("Limiter")
            .field("store", &self.holders.store)
            .field("rules", &set.rules)
            .field("algorithm", &set.algorithm)
            .field("fail_mode", &set.fail_mode)
            .field("deadline", &set.deadline)
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl<St, I: ?Sized + 'static> Limiter<St, I> {
    /// A builder: add rules, then [`LimiterBuilder::build`].
    pub fn builder(store: St) -> LimiterBuilder<St, I> {
        LimiterBuilder::new(store)
    }

    /// The rules in force (a [`LimiterHandle`] may swap them).
    #[must_use]
    pub fn rules(&self) -> Arc<[Rule<I>]> {
        self.rules.load().rules.clone()
    }

    /// A handle that changes this limiter's rules while it runs: quotas, or the whole rule
    /// set (from a configuration, with feature `config`). Take it once the limiter (or
    /// layer) is fully configured: a layer's builder methods called after this give it
    /// rules of its own.
    #[must_use]
    pub fn handle(&self) -> LimiterHandle<I> {
        LimiterHandle::new(self.rules.clone())
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &St {
        &self.holders.store
    }

    /// The same configuration with fresh runtime state (a layer reconfigured after it was
    /// cloned is a limiter of its own, holding the same rule names).
    pub(crate) fn fresh_copy(&self) -> Self {
        let runtime = Runtime::new(self.runtime.settings.clone());
        Self {
            holders: Arc::new(Holders::new(self.holders.store.clone(), &runtime)),
            rules: Arc::new(self.rules.copy()),
            runtime,
        }
    }

    /// Changes the settings before first use (the layer's builder methods).
    pub(crate) fn configure(&mut self, f: impl FnOnce(&mut Config<'_, I>)) {
        let mut settings = self.runtime.settings.clone();
        if Arc::get_mut(&mut self.rules).is_none() {
            self.rules = Arc::new(self.rules.copy()); // a handle was taken: it keeps the old
        }
        let rules = Arc::get_mut(&mut self.rules).expect("just made unique");
        rules.edit(|draft, cost| {
            f(&mut Config {
                algorithm: &mut draft.algorithm,
                fail_mode: &mut draft.fail_mode,
                deadline: &mut draft.deadline,
                settings: &mut settings,
                cost,
            });
        });
        self.runtime = Runtime::new(settings);
        self.holders = Arc::new(Holders::new(self.holders.store.clone(), &self.runtime));
    }
}

/// What [`Limiter::decide_now`] gives.
#[allow(clippy::large_enum_variant, reason = "returned once per input and matched at once: boxing would allocate")]
pub(crate) enum Now<I: ?Sized> {
    /// Decided, under this rule set.
    Decided(Verdict, Arc<RuleSet<I>>),
    /// The store decides only through a future: the plan back, for [`Limiter::decide`].
    Later(Plan<I>),
}

impl<St: Store, I: ?Sized + 'static> Limiter<St, I> {
    /// Decides `input`: every rule that applies, in one store call (a rejected input
    /// consumes nothing from any rule). A leaky bucket rule's [`Verdict::delay`] is for
    /// the caller to wait; [`Limiter::wait`] waits itself.
    ///
    /// Never fails: a store that cannot decide within the deadline gives a verdict with
    /// [`Verdict::store_error`], allowed or not by the fail mode.
    pub fn check(&self, input: &I) -> impl Future<Output = Verdict> + Send + '_ {
        let plan = self.plan(input);
        self.decide(plan)
    }

    /// Waits until `input` is admitted, or until waiting longer would pass `max_wait`:
    /// after a rejection it sleeps for the [`Verdict::retry_after`] and asks again (other
    /// callers may have taken the units meanwhile), and a leaky bucket's delay is waited
    /// here. Returns the last verdict: allowed, or the rejection that would have made it
    /// wait too long (or that can never be accepted), or a store failure.
    ///
    /// Dropping the future while it waits for a leaky bucket's slot gives the slot back
    /// (while no later input holds the slots after it).
    pub fn wait(&self, input: &I, max_wait: Duration) -> impl Future<Output = Verdict> + Send + '_ {
        self.wait_plan(self.plan(input), max_wait)
    }

    /// Decides `cost` units of `key` under the rule named `rule`, as [`Limiter::check`]
    /// decides an input that rule maps to `key`: the same count, whoever asks — an HTTP
    /// layer over this limiter, a job loop, an admin task — with every protection of
    /// `check` (deadline, in-flight cap, circuit breaker, fail mode, fallback, blocked-key
    /// cache, metrics). The verdict is refundable ([`Limiter::refund`]) and chargeable
    /// ([`Limiter::charge`]) like any other.
    ///
    /// The rule's own quota applies (a [`Rule::quota_fn`] is not asked: there is no
    /// input), and its allow-list does not. A cost of 0 asks whether the key is within its
    /// quota and takes nothing, as a [`Rule::charged`] rule's admission does. A shadow
    /// rule decides and records, and never refuses. A name the limiter has no rule for
    /// gives a refused verdict whose [`Verdict::store_error`] says so
    /// ([`StoreError::Invalid`]), whatever the fail mode.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::BuildError> {
    /// use axum::extract::Request;
    /// use tollgate::{key, Limiter, MemoryStore, Quota, RateLimitLayer};
    ///
    /// // One limiter: the API's requests and the export jobs use up one count per account.
    /// let layer = RateLimitLayer::from_limiter(
    ///     Limiter::builder(MemoryStore::new())
    ///         .rule("per-account", Quota::per_minute(2), key::header("x-account"))
    ///         .build()?,
    /// );
    /// let limiter = layer.limiter().clone(); // for the job loop
    /// let app: axum::Router = axum::Router::new()
    ///     .route("/export", axum::routing::post(|| async { "queued" }))
    ///     .layer(layer);
    ///
    /// assert!(limiter.check_key("per-account", "acme", 1).await.is_allowed());
    /// assert!(limiter.check_key("per-account", "acme", 1).await.is_allowed());
    /// let verdict = limiter.check_key("per-account", "acme", 1).await;
    /// assert!(verdict.is_rejected(), "the API's requests and the jobs share the count");
    /// assert!(verdict.retry_after().is_some());
    /// # let _: axum::Router = app; let _ = std::marker::PhantomData::<Request>;
    /// # Ok(()) }
    /// ```
    pub fn check_key(&self, rule: &str, key: impl Into<Key>, cost: u64) -> impl Future<Output = Verdict> + Send + '_ {
        let plan = self.plan_key(rule, key.into(), cost).map_err(|set| unknown_rule(rule, &set));
        async move {
            match plan {
                Ok(plan) => self.decide(plan).await,
                Err(verdict) => verdict,
            }
        }
    }

    /// [`Limiter::wait`] for `cost` units of `key` under rule `rule` (see
    /// [`Limiter::check_key`]): a job loop that waits its turn on the count an HTTP layer
    /// shares.
    pub fn wait_key(
        &self,
        rule: &str,
        key: impl Into<Key>,
        cost: u64,
        max_wait: Duration,
    ) -> impl Future<Output = Verdict> + Send + '_ {
        let plan = self.plan_key(rule, key.into(), cost).map_err(|set| unknown_rule(rule, &set));
        async move {
            match plan {
                Ok(plan) => self.wait_plan(plan, max_wait).await,
                Err(verdict) => verdict,
            }
        }
    }

    /// Blocks `key` under rule `rule` for `duration` from now, on every server that
    /// shares the store: until then the key is refused outright, with the rest of the
    /// block as its `Retry-After`, as a [`Rule::block_for`] penalty refuses it. A block
    /// replaces the key's earlier one (a penalty's too); `Duration::ZERO` lifts it, and so
    /// does [`Limiter::reset`]. `Ok(false)` when there is no such rule.
    ///
    /// The rule must be able to block: built with [`Rule::blockable`] or
    /// [`Rule::block_for`] (on Redis, its checks then read the key's block).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryStore, Quota, Rule};
    ///
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .add_rule(Rule::new("api", Quota::per_minute(100), |user: &str| Some(user.to_owned())).blockable())
    ///     .build()?;
    /// limiter.block("api", "mallory", Duration::from_secs(24 * 3600)).await?; // a day
    /// let verdict = limiter.check("mallory").await;
    /// assert!(verdict.is_rejected());
    /// assert!(verdict.retry_after() > Some(Duration::from_secs(23 * 3600)));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Invalid`] for a rule that cannot block (neither
    /// [`Rule::blockable`] nor [`Rule::block_for`]), or the store's error (no deadline or
    /// circuit breaker applies here).
    pub async fn block(&self, rule: &str, key: impl Into<Key>, duration: Duration) -> Result<bool, StoreError> {
        let set = self.rules.load();
        let Some((i, r)) = set.find(rule) else { return Ok(false) };
        if !r.params(r.quota, 1).reads_block() {
            return Err(StoreError::Invalid(format!(
                "rule {rule:?} cannot be blocked by hand: build it with Rule::blockable() (or Rule::block_for)"
            )));
        }
        let key = key.into();
        let check =
            Check { rule: r.name.clone(), key, algorithm: r.algorithm_or(set.algorithm), params: r.params(r.quota, 1) };
        let id = set.id(i);
        drop(set);
        self.holders.store.block(&check, duration).await?;
        // A rejection this process cached for the key may end before a new block, or
        // after a lifted one.
        self.runtime.cache.forget(id, &check.key);
        Ok(true)
    }

    /// [`Limiter::wait`] of a plan.
    async fn wait_plan(&self, plan: Plan<I>, max_wait: Duration) -> Verdict {
        let until = Instant::now() + max_wait;
        loop {
            let mut verdict = self.decide(plan.clone()).await;
            match (&verdict.state, verdict.retry_after()) {
                (State::Rejected, Some(retry)) if Instant::now() + retry <= until => {
                    tokio::time::sleep(retry).await;
                }
                (State::Allowed, _) => {
                    self.wait_for_slot(&mut verdict).await;
                    return verdict;
                }
                _ => return verdict,
            }
        }
    }

    /// Sleeps for an allowed verdict's leaky-bucket delay; dropped during the sleep, gives
    /// back everything the verdict took.
    pub(crate) async fn wait_for_slot(&self, verdict: &mut Verdict) {
        let delay = verdict.delay();
        if delay.is_zero() {
            return;
        }
        let lease = self.lease(std::mem::take(&mut verdict.held), "an input dropped before its slot");
        tokio::time::sleep(delay).await;
        verdict.held = lease.keep();
    }

    /// A lease on what an admitted input holds: dropped, it gives everything back.
    pub(crate) fn lease(&self, held: Held, what: &'static str) -> Lease<St> {
        Lease::new(held, self.holders.clone(), what)
    }

    /// Gives back the units an allowed verdict took (work that was not done after all):
    /// exactly those of its commits, to whoever decided them (the store, or the fallback
    /// limiter), and nothing once they have left their window.
    ///
    /// A verdict from before a [`reset`](Limiter::reset) of its key is not told apart from
    /// later ones by every algorithm (the stores keep no trace of a reset): refunded after
    /// it, it may give back up to its own units from requests made since. Do not refund
    /// across a reset.
    ///
    /// Takes the verdict: its units go back at most once (a second refund of the same
    /// commits would give back units of other requests). A verdict is not `Clone` for
    /// the same reason.
    ///
    /// ```
    /// # async fn run(limiter: tollgate::Limiter<tollgate::MemoryStore, str>) {
    /// let verdict = limiter.check("job-7").await;
    /// if verdict.is_allowed() {
    ///     limiter.refund(verdict).await.unwrap(); // the job was cancelled after all
    /// }
    /// # }
    /// ```
    ///
    /// Twice does not compile:
    ///
    /// ```compile_fail,E0382
    /// # async fn run(limiter: tollgate::Limiter<tollgate::MemoryStore, str>) {
    /// let verdict = limiter.check("job-7").await;
    /// limiter.refund(verdict).await.unwrap();
    /// limiter.refund(verdict).await.unwrap();
    /// # }
    /// ```
    ///
    /// Nor does a copy to refund:
    ///
    /// ```compile_fail,E0599
    /// # async fn run(limiter: tollgate::Limiter<tollgate::MemoryStore, str>) {
    /// let verdict = limiter.check("job-7").await;
    /// limiter.refund(verdict.clone()).await.unwrap();
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The store's error (no deadline or circuit breaker applies here). The verdict is
    /// spent either way: after a timeout the store may have given the units back, and
    /// trying again could give them twice.
    pub async fn refund(&self, verdict: Verdict) -> Result<(), StoreError> {
        // A rule set swapped in since may have cached a rejection of its own for the same
        // rule and key: forgotten too (the holders forget the verdict's own set's).
        let current = self.rules.load();
        for u in &verdict.held.units {
            if let Some((i, _)) = current.find(&u.refund.check.rule) {
                self.runtime.cache.forget(current.id(i), &u.refund.check.key);
            }
        }
        drop(current);
        self.holders.give_back_now(verdict.held).await
    }

    /// Takes `units` from the charged rules ([`Rule::charged`]) of an allowed verdict:
    /// what the work it admitted used, known once the work is done (tokens, bytes, rows).
    /// The key may go into debt; its later inputs are then rejected until the debt is paid.
    /// Each rule's units are taken by whoever decided that rule (the store, or the fallback
    /// limiter); a remote store's within the deadline, an in-process store's at once, as
    /// its decisions are (it needs no I/O; see [`LocalStore`](crate::store::LocalStore)).
    /// Nothing happens for a verdict that was not allowed, with no charged rule, or for 0
    /// units.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Limiter, MemoryStore, Quota, Rule};
    ///
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .add_rule(Rule::new("tokens", Quota::per_minute(1_000), |user: &str| Some(user.to_owned())).charged())
    ///     .build()?;
    /// let verdict = limiter.check("ada").await;
    /// assert!(verdict.is_allowed());
    /// let used = 1_500; // known once the job is done
    /// limiter.charge(&verdict, used).await?;
    /// assert!(limiter.check("ada").await.is_rejected(), "500 tokens in debt");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The store's (or the fallback's) error, or [`StoreError::Timeout`] past the deadline
    /// (a remote store).
    pub async fn charge(&self, verdict: &Verdict, units: u64) -> Result<(), StoreError> {
        if units == 0 || !verdict.is_allowed() {
            return Ok(());
        }
        self.holders.charge_now(&verdict.held, units).await
    }

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
        // Taken before the store decides: a give-back while it decides voids the cache's
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
                return (Verdict::empty(State::Failed { error, closed }, held), set);
            }
        };
        let Answered { outcomes, by, fallback } = answered;
        let holder = if by == DecidedBy::Fallback { Holder::Fallback } else { Holder::Store };
        // What each holder decided: the fallback's share of each quota, for the fallback.
        let as_held = fallback.as_deref().unwrap_or(&checks);
        let mut verdict = Verdict::empty(State::Allowed, Held::default());
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
                    verdict.state = State::Rejected;
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
                continue; // units may be given back: a rejection is not final (a block is)
            }
            let quota = check.params.quota;
            if let Some(decision) = self.runtime.cache.blocked(set.id(rule), &check.key, check.params.cost, quota, now)
            {
                crate::metrics::decision(&check.rule, "local_rejected");
                let held = Held { generation: set.generation(), deadline: set.deadline, ..Held::default() };
                let mut verdict = Verdict::empty(State::Rejected, held);
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

    /// What rule `rule` would decide now for one unit of `key`, without consuming
    /// anything ("why is this customer limited?"): `remaining` counts what would be left
    /// after that unit. `Ok(None)` when there is no such rule. Uses the quota given to
    /// [`Rule::new`]: for a rule whose quota is chosen per input ([`Rule::quota_fn`]), use
    /// [`Limiter::peek_with`].
    ///
    /// # Errors
    ///
    /// The store's error (no deadline or circuit breaker applies here).
    pub async fn peek(&self, rule: &str, key: impl Into<Key>) -> Result<Option<Decision>, StoreError> {
        let quota = self.rules.load().find(rule).map(|(_, r)| r.quota);
        match quota {
            Some(quota) => self.peek_with(rule, key, quota).await,
            None => Ok(None),
        }
    }

    /// [`Limiter::peek`] under `quota` (e.g. the key's tier).
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn peek_with(
        &self,
        rule: &str,
        key: impl Into<Key>,
        quota: Quota,
    ) -> Result<Option<Decision>, StoreError> {
        let set = self.rules.load();
        let Some((_, r)) = set.find(rule) else { return Ok(None) };
        let check = Check {
            rule: r.name.clone(),
            key: key.into(),
            algorithm: r.algorithm_or(set.algorithm),
            params: r.params(quota, 1),
        };
        drop(set);
        self.holders.store.peek(&check).await.map(Some)
    }

    /// Forgets the state of `key` under rule `rule`, in the store and in this process's
    /// blocked-key cache: the key starts afresh. `Ok(false)` when there is no such rule.
    /// Other servers' blocked-key caches may still reject the key until their entry runs
    /// out (at most its `Retry-After`).
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn reset(&self, rule: &str, key: impl Into<Key>) -> Result<bool, StoreError> {
        let set = self.rules.load();
        let Some((i, r)) = set.find(rule) else { return Ok(false) };
        let key = key.into();
        self.holders.store.reset(rule, &key, r.algorithm_or(set.algorithm)).await?;
        self.runtime.cache.forget(set.id(i), &key);
        Ok(true)
    }
}

static FAIL_OPEN: crate::notice::Once = crate::notice::Once::new();
static FAIL_CLOSED: crate::notice::Once = crate::notice::Once::new();

/// The verdict of a check by key under a rule the limiter does not have: refused, and
/// said once per call.
fn unknown_rule<I: ?Sized>(rule: &str, set: &RuleSet<I>) -> Verdict {
    tracing::warn!(rule, "tollgate: check by key under a rule this limiter does not have");
    let error = StoreError::Invalid(format!("this limiter has no rule named {rule:?}"));
    let held = Held { generation: set.generation(), deadline: set.deadline, ..Held::default() };
    Verdict::empty(State::Failed { error, closed: true }, held)
}

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
