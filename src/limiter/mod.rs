//! [`Limiter`]: rules, a store and the runtime protections — everything that decides, and
//! nothing about HTTP. [`RateLimitLayer`](crate::RateLimitLayer) is its HTTP adapter.

mod builder;
mod charging;
mod giveback;
mod plan;
mod registry;
mod rules;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use smallvec::smallvec;
use tokio::time::Instant;

pub(crate) use self::builder::Config;
pub use self::builder::LimiterBuilder;
pub(crate) use self::charging::Charging;
pub(crate) use self::giveback::{GiveBack, GiveBackOnDrop};
pub(crate) use self::plan::{Checks, Plan};
pub use self::rules::LimiterHandle;
pub(crate) use self::rules::{Draft, RuleSet, Rules};
use crate::key::Key;
use crate::runtime::Runtime;
use crate::store::{Check, Outcome, Outcomes, Store};
use crate::verdict::{Commit, DecidedBy, State};
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
    store: Arc<St>,
    /// The rules, with the algorithm, fail mode and deadline: swappable at run time.
    rules: Arc<Rules<I>>,
    pub(crate) runtime: Runtime,
}

impl<St: fmt::Debug, I: ?Sized> fmt::Debug for Limiter<St, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.rules.load();
        f.debug_struct("Limiter")
            .field("store", &self.store)
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
        &self.store
    }

    /// The same configuration with fresh runtime state (a layer reconfigured after it was
    /// cloned is a limiter of its own, holding the same rule names).
    pub(crate) fn fresh_copy(&self) -> Self {
        Self {
            store: self.store.clone(),
            rules: Arc::new(self.rules.copy()),
            runtime: Runtime::new(self.runtime.settings.clone()),
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
    }
}

/// What [`Limiter::decide_now`] gives.
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
        self.store.block(&check, duration).await?;
        // A rejection this process cached for the key may end before a new block, or
        // after a lifted one.
        self.runtime.cache.forget(id, &check.key);
        Ok(true)
    }

    /// [`Limiter::wait`] of a plan.
    async fn wait_plan(&self, plan: Plan<I>, max_wait: Duration) -> Verdict {
        let until = Instant::now() + max_wait;
        loop {
            let verdict = self.decide(plan.clone()).await;
            match (&verdict.state, verdict.retry_after()) {
                (State::Rejected, Some(retry)) if Instant::now() + retry <= until => {
                    tokio::time::sleep(retry).await;
                }
                (State::Allowed, _) => {
                    self.wait_for_slot(&verdict).await;
                    return verdict;
                }
                _ => return verdict,
            }
        }
    }

    /// Sleeps for an allowed verdict's leaky-bucket delay; dropped during the sleep, gives
    /// back everything the verdict took.
    pub(crate) async fn wait_for_slot(&self, verdict: &Verdict) {
        let delay = verdict.delay();
        if delay.is_zero() {
            return;
        }
        let guard = GiveBackOnDrop::new(self.give_back(verdict, |_| true), "a request dropped before its slot");
        tokio::time::sleep(delay).await;
        guard.disarm();
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
        let verdict = &verdict;
        // Units come back: a rejection this process remembers for these keys may no
        // longer hold — under the rules the verdict was decided by, and under the rules
        // in force (a swap since may have cached one of its own for the same rule).
        let current = self.rules.load();
        for (check, &rule) in verdict.checks.iter().zip(&verdict.rules) {
            self.runtime.cache.forget((verdict.generation, rule), &check.key);
            if let Some((i, _)) = current.find(&check.rule) {
                self.runtime.cache.forget(current.id(i), &check.key);
            }
        }
        self.give_back(verdict, |_| true).run().await
    }

    /// Takes `units` from the charged rules ([`Rule::charged`]) of an allowed verdict:
    /// what the work it admitted used, known once the work is done (tokens, bytes, rows).
    /// The key may go into debt; its later inputs are then rejected until the debt is paid.
    /// Each rule's units are taken by whoever decided that rule (the store, or the fallback
    /// limiter); a remote store's within the deadline, an in-process store's at once, as its
    /// decisions are (it needs no I/O; see [`LocalStore`](crate::store::LocalStore)). Nothing happens for a
    /// verdict that was not allowed, with no charged rule, or for 0 units.
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
        match self.charging(verdict, units) {
            Some(charging) => charging.run().await,
            None => Ok(()),
        }
    }

    /// What charging `units` to `verdict` takes: run it, or spawn it after a response.
    pub(crate) fn charging(&self, verdict: &Verdict, units: u64) -> Option<Charging<St>> {
        let deadline = self.rules.load().deadline;
        Charging::new(self.store.clone(), &self.runtime.settings, deadline, verdict, units)
    }

    /// What giving back the commits of `verdict`'s rules (by index in the rule set it was
    /// decided under) that `select` picks takes: run it, spawn it, or arm it for a drop.
    pub(crate) fn give_back(&self, verdict: &Verdict, select: impl Fn(usize) -> bool) -> GiveBack<St> {
        GiveBack::new(self.store.clone(), &self.runtime, verdict.generation, verdict.commits(select))
    }

    /// A refused input did not happen: what its shadow rules took goes back, as an
    /// enforced rule's would (a rejection by one rule consumes nothing from the others).
    /// Detached, like every give-back.
    fn give_back_shadow(&self, verdict: &mut Verdict) {
        let commits = std::mem::take(&mut verdict.shadow);
        GiveBack::new(self.store.clone(), &self.runtime, verdict.generation, commits)
            .spawn("the shadow rules of a refused input");
    }

    /// Decides a plan: the blocked-key cache, then one guarded store call (shadow rules
    /// beside it), the fail mode when the store cannot decide. A refused input keeps
    /// nothing its shadow rules took.
    pub(crate) async fn decide(&self, plan: Plan<I>) -> Verdict {
        let plan = match self.decide_now(plan) {
            Now::Decided(verdict, _) => return verdict,
            Now::Later(plan) => plan,
        };
        if self.runtime.settings.cache_enabled {
            if let Some(verdict) = self.blocked(&plan.set, &plan.enforced) {
                return verdict;
            }
        }
        // Timed only for the debug event that reports it (two clock reads a decision).
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let (enforced, shadow, deadline) = (&plan.enforced, &plan.shadow, plan.set.deadline);
        let (result, shadow_result) = if shadow.is_empty() {
            (self.ask(&enforced.checks, deadline).await, Ok((Outcomes::new(), DecidedBy::Store)))
        } else if enforced.is_empty() {
            (Ok((Outcomes::new(), DecidedBy::Store)), self.ask(&shadow.checks, deadline).await)
        } else {
            // Boxed: inline, the two calls and their answers would grow every request's
            // future, most of which have no shadow rule.
            Box::pin(self.ask_both(plan.set.generation(), enforced, shadow, deadline)).await
        };
        self.conclude(plan, result, shadow_result, started).0
    }

    /// The enforced and the shadow rules' store calls, side by side. What the first to
    /// answer took goes back if the input is dropped before the other answers: it never
    /// reaches its verdict, nor the work the units were for.
    async fn ask_both(
        &self,
        generation: u64,
        enforced: &Checks<2>,
        shadow: &Checks<1>,
        deadline: Duration,
    ) -> (Answer, Answer) {
        let mut first = std::pin::pin!(self.ask(&enforced.checks, deadline));
        let mut second = std::pin::pin!(self.ask(&shadow.checks, deadline));
        let (mut a, mut b): (Option<Answer>, Option<Answer>) = (None, None);
        let mut armed = None;
        let what = "an input dropped while its other store call was on its way";
        std::future::poll_fn(|cx| {
            if a.is_none() {
                if let Poll::Ready(answer) = first.as_mut().poll(cx) {
                    if b.is_none() {
                        armed = Some(GiveBackOnDrop::new(self.give_back_of(generation, enforced, &answer), what));
                    }
                    a = Some(answer);
                }
            }
            if b.is_none() {
                if let Poll::Ready(answer) = second.as_mut().poll(cx) {
                    if a.is_none() {
                        armed = Some(GiveBackOnDrop::new(self.give_back_of(generation, shadow, &answer), what));
                    }
                    b = Some(answer);
                }
            }
            if a.is_some() && b.is_some() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        // Both answered: the verdict decides what is kept.
        armed.map(GiveBackOnDrop::disarm);
        match (a, b) {
            (Some(a), Some(b)) => (a, b),
            _ => unreachable!("both calls answered"),
        }
    }

    /// Giving back what one store answer took.
    fn give_back_of<const N: usize>(&self, generation: u64, checks: &Checks<N>, answer: &Answer) -> GiveBack<St> {
        GiveBack::new(self.store.clone(), &self.runtime, generation, commits_of(checks, answer))
    }

    /// [`Limiter::decide`] at once, with no future, for an in-process store
    /// ([`Store::as_local`]): its answer is synchronous.
    pub(crate) fn decide_now(&self, plan: Plan<I>) -> Now<I> {
        let Some(local) = self.store.as_local() else { return Now::Later(plan) };
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let ask = |checks: &[Check]| -> Answer {
            let outcomes = match checks {
                [] => Ok(Outcomes::new()),
                [one] => local.check_one(one).map(|o| smallvec![Some(o)]),
                _ => local.check(checks).map(Outcomes::from_vec),
            };
            outcomes.map(|o| (o, DecidedBy::Store))
        };
        let result = ask(&plan.enforced.checks);
        let shadow_result = ask(&plan.shadow.checks);
        let (verdict, set) = self.conclude(plan, result, shadow_result, started);
        Now::Decided(verdict, set)
    }

    /// The verdict of a plan's store answers: the fail mode for an error, metrics and
    /// events, the blocked-key cache, and the shadow rules' give-back on a refusal.
    fn conclude(
        &self,
        plan: Plan<I>,
        result: Answer,
        shadow_result: Answer,
        started: Option<Instant>,
    ) -> (Verdict, Arc<RuleSet<I>>) {
        let Plan { enforced, shadow, set } = plan;
        let remote = self.store.as_local().is_none();
        // A charged rule's probe (cost 0): what a charge after the work takes from, from
        // whoever decided it (enforced and shadow rules may be decided by different ones).
        let by_of = |r: &Answer| r.as_ref().map_or(DecidedBy::Store, |(_, by)| *by);
        let (enforced_by, shadow_by) = (by_of(&result), by_of(&shadow_result));
        let probes = |checks: &[Check], by| {
            checks.iter().filter(|c| c.params.cost == 0).map(move |c| (c.clone(), by)).collect::<Vec<_>>()
        };
        let mut charged = probes(&enforced.checks, enforced_by);
        charged.extend(probes(&shadow.checks, shadow_by));
        let shadow_commits = record_shadow(&shadow, &shadow_result);
        let (outcomes, by) = match result {
            Ok(answer) => answer,
            Err(error) => {
                crate::metrics::store_error(&error);
                let closed = enforced.rules.iter().any(|&r| set.fail_mode_of(r) == FailMode::Closed);
                self.runtime.warn_store_failure(&error, !closed);
                if closed {
                    crate::metrics::fail_closed();
                } else {
                    crate::metrics::fail_open();
                }
                let mut verdict = Verdict::empty(State::Failed { error, closed }, set.generation());
                verdict.shadow = shadow_commits;
                verdict.charged = charged;
                if closed {
                    self.give_back_shadow(&mut verdict);
                }
                return (verdict, set);
            }
        };
        for (c, o) in enforced.checks.iter().zip(&outcomes) {
            let Some(Outcome { decision: d, .. }) = o else { continue };
            tracing::debug!(
                rule = %c.rule,
                allowed = d.allowed,
                remaining = d.remaining,
                store_latency_us = started.map_or(0, |t| u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)),
                "tollgate decision"
            );
            crate::metrics::decision(&c.rule, if d.allowed { "allowed" } else { "rejected" });
        }
        let Checks { checks, rules } = enforced;
        let mut verdict = Verdict::decided(checks, rules, outcomes, by, set.generation());
        if verdict.is_allowed() {
            // Near the limit: what this input leaves in use (a rejected one takes nothing).
            for (c, d) in verdict.checks.iter().zip(&verdict.decisions) {
                if d.is_near_limit(self.runtime.settings.near_limit) {
                    crate::metrics::near_limit(&c.rule);
                }
            }
        }
        verdict.shadow = shadow_commits;
        verdict.charged = charged;
        // Only the store's own rejections are final: the fallback's limits are its own
        // (a share for one server) and end with the outage.
        if verdict.is_rejected() && remote && by == DecidedBy::Store && self.runtime.settings.cache_enabled {
            self.remember_rejections(&set, &verdict);
        }
        if verdict.is_rejected() {
            self.give_back_shadow(&mut verdict);
        }
        (verdict, set)
    }

    /// One call to a remote store, guarded, with the fallback limiter when the store
    /// fails (an in-process store is asked in [`Limiter::decide_now`]).
    async fn ask(&self, checks: &[Check], deadline: Duration) -> Answer {
        if checks.is_empty() {
            return Ok((Outcomes::new(), DecidedBy::Store));
        }
        match self.runtime.call(&*self.store, checks, deadline).await {
            Ok(outcomes) => Ok((outcomes, DecidedBy::Store)),
            Err(err) => match self.runtime.fallback(&err, checks) {
                Some(outcomes) => Ok((outcomes, DecidedBy::Fallback)),
                None => Err(err),
            },
        }
    }

    /// A rejection from the blocked-key cache, when one of the enforced keys is blocked.
    fn blocked(&self, set: &RuleSet<I>, enforced: &Checks<2>) -> Option<Verdict> {
        let now = self.runtime.mono_us();
        for (check, &rule) in enforced.checks.iter().zip(&enforced.rules) {
            let r = &set.rules[rule];
            if r.count_if.is_some() && r.block.is_zero() {
                continue; // units may be given back: a rejection is not final (a block is)
            }
            let quota = check.params.quota;
            if let Some(decision) = self.runtime.cache.blocked(set.id(rule), &check.key, check.params.cost, quota, now)
            {
                crate::metrics::decision(&check.rule, "local_rejected");
                let outcome = Outcome { decision, taken: None };
                let (checks, rules) = (smallvec![check.clone()], smallvec![rule]);
                let generation = set.generation();
                return Some(Verdict::decided(
                    checks,
                    rules,
                    smallvec![Some(outcome)],
                    DecidedBy::LocalCache,
                    generation,
                ));
            }
        }
        None
    }

    fn remember_rejections(&self, set: &RuleSet<I>, verdict: &Verdict) {
        let now = self.runtime.mono_us();
        for ((check, &rule), d) in verdict.checks.iter().zip(&verdict.rules).zip(&verdict.decisions) {
            let r = &set.rules[rule];
            // A count-by-outcome rule's rejection may end with a refund; a block is final.
            if d.allowed || d.retry_after.is_none() || (r.count_if.is_some() && r.block.is_zero()) {
                continue;
            }
            // A block refuses every cost: cached as cost 0, which every request reaches.
            let cost = if r.block.is_zero() { check.params.cost } else { 0 };
            self.runtime.cache.insert(set.id(rule), &check.key, cost, check.params.quota, now, d);
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
        self.store.peek(&check).await.map(Some)
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
        self.store.reset(rule, &key, r.algorithm_or(set.algorithm)).await?;
        self.runtime.cache.forget(set.id(i), &key);
        Ok(true)
    }
}

/// Records what shadow rules decided (a metric, a log line when one would reject), and
/// returns what they took, to be given back like the enforced rules' units.
fn record_shadow(shadow: &Checks<1>, answer: &Answer) -> Vec<Commit> {
    let Ok((outcomes, _)) = answer else { return Vec::new() };
    for (check, o) in shadow.checks.iter().zip(outcomes) {
        let Some(Outcome { decision: d, .. }) = o else { continue };
        let outcome = if d.allowed { "allowed" } else { "shadow_rejected" };
        crate::metrics::decision(&check.rule, outcome);
        if !d.allowed {
            tracing::info!(rule = %check.rule, key = ?check.key, "tollgate: shadow rule would reject");
        }
    }
    commits_of(shadow, answer)
}

/// The verdict of a check by key under a rule the limiter does not have: refused, and
/// said once per call.
fn unknown_rule<I: ?Sized>(rule: &str, set: &RuleSet<I>) -> Verdict {
    tracing::warn!(rule, "tollgate: check by key under a rule this limiter does not have");
    let error = StoreError::Invalid(format!("this limiter has no rule named {rule:?}"));
    Verdict::empty(State::Failed { error, closed: true }, set.generation())
}

/// A store call's answer: the outcomes, and who decided them.
type Answer = Result<(Outcomes, DecidedBy), StoreError>;

/// What the commits of one answer took, each with its identity and rule.
fn commits_of<const N: usize>(checks: &Checks<N>, answer: &Answer) -> Vec<Commit> {
    let Ok((outcomes, by)) = answer else { return Vec::new() };
    let taken = checks.checks.iter().zip(&checks.rules).zip(outcomes);
    taken
        .filter_map(|((check, &rule), o)| {
            let taken = o.as_ref()?.taken?;
            Some(Commit { refund: crate::store::Refund { check: check.clone(), taken }, rule, by: *by })
        })
        .collect()
}
