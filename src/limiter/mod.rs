//! [`Limiter`]: rules, a store and the runtime protections — everything that decides, and
//! nothing about HTTP. [`RateLimitLayer`](crate::RateLimitLayer) is its HTTP adapter.

mod builder;
mod decide;
pub(crate) mod held;
mod holders;
mod lease;
mod plan;
mod registry;
mod rules;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use futures_util::FutureExt as _;
use tokio::time::Instant;

pub use self::builder::LimiterBuilder;
pub(crate) use self::held::Held;
pub(crate) use self::holders::Holders;
pub(crate) use self::lease::{Forwarded, Lease};
pub(crate) use self::plan::Plan;
pub use self::rules::LimiterHandle;
pub(crate) use self::rules::{Draft, RuleSet, Rules};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::headers::HeaderStyle;
use crate::key::Key;
use crate::permit::Permit;
use crate::quota::Quota;
use crate::rule::Rule;
use crate::runtime::Runtime;
use crate::store::{LocalStore, Store};
use crate::verdict::{Ruling, Verdict};

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
    /// The store and the fallback: the one router of refunds and charges.
    holders: Arc<Holders<St>>,
    /// The rules, with the algorithm, fail mode and deadline: swappable at run time.
    rules: Arc<Rules<I>>,
    pub(crate) runtime: Runtime,
    /// The header style set on a layer's builder (see `LimiterBuilder::headers`).
    pub(crate) headers: Option<HeaderStyle>,
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
        LimiterBuilder::new(store, "e.g. Limiter::builder(store).rule(\"search\", quota, key)")
    }

    /// The rules in force (a [`LimiterHandle`] may swap them).
    #[must_use]
    pub fn rules(&self) -> Arc<[Rule<I>]> {
        self.rules.load().rules.clone()
    }

    /// A handle that changes this limiter's rules while it runs: quotas, or the whole rule
    /// set (from a configuration, with feature `config`).
    #[must_use]
    pub fn handle(&self) -> LimiterHandle<I> {
        LimiterHandle { rules: self.rules.clone() }
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &St {
        &self.holders.store
    }
}

impl<St: Store, I: ?Sized + 'static> Limiter<St, I> {
    /// A lease on what an admitted input holds: dropped, it gives everything back (`what`
    /// names the input in the warning a failed refund logs).
    pub(crate) fn lease(&self, held: Held, what: &'static str) -> Lease<St> {
        Lease::new(held, self.holders.clone(), what)
    }

    /// Decides `input`: every rule that applies, in one store call (a rejected input
    /// consumes nothing from any rule). A leaky bucket rule's [`Verdict::delay`] is for
    /// the caller to wait; [`Limiter::wait`] waits itself.
    ///
    /// Never fails: a store that cannot decide within the deadline gives a verdict with
    /// [`Verdict::store_error`], allowed or not by the fail mode.
    pub fn check(&self, input: &I) -> impl Future<Output = Verdict> + Send + '_ {
        self.handed(self.plan(input))
    }

    /// [`Limiter::decide`] for a caller of the limiter's API: what the verdict holds is
    /// kept unless refunded (a layer's units wait for the response's status instead).
    fn handed(&self, plan: Plan<I>) -> impl Future<Output = Verdict> + Send + '_ {
        match no_permits(&plan) {
            Some(refused) => Either::Left(std::future::ready(refused)),
            None => Either::Right(self.decide(plan).map(|verdict| {
                self.holders.kept(&verdict.held.units);
                verdict
            })),
        }
    }

    /// Decides `input` as [`Limiter::check`] does, and holds the permits of its
    /// concurrency rules ([`Rule::concurrent`]) in the returned [`Permit`] until it is
    /// dropped (the units of its rate rules are kept, as a verdict's). The call for work
    /// that a concurrency rule limits: [`Limiter::check`] refuses such an input.
    ///
    /// Dropping this future before it completes holds nothing (a store call it left
    /// running gives back what it took).
    pub fn enter(&self, input: &I) -> impl Future<Output = Permit> + Send + '_ {
        self.entered(self.plan(input), None)
    }

    /// [`Limiter::enter`] by key: `cost` permits (or units, for a rate rule) of `key`
    /// under the rule named `rule`, as [`Limiter::check_key`] decides them. The [`Permit`]
    /// gives its permits back when dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::BuildError> {
    /// use tollgate::{Limiter, MemoryStore, Rule};
    ///
    /// let limiter = Limiter::<_, str>::builder(MemoryStore::new())
    ///     .add_rule(Rule::concurrent("renders", 4, |user: &str| Some(user.to_owned())))
    ///     .build()?;
    /// let big = limiter.enter_key("renders", "ada", 3).await; // three permits
    /// assert_eq!(big.permits(), 3);
    /// let refused = limiter.enter_key("renders", "ada", 2).await;
    /// assert!(refused.is_rejected());
    /// assert!(refused.retry_after().is_some(), "the key's median hold time, at least 10 ms");
    /// # Ok(()) }
    /// ```
    pub fn enter_key(&self, rule: &str, key: impl Into<Key>, cost: u64) -> impl Future<Output = Permit> + Send + '_ {
        let plan = self.plan_key(rule, key.into(), cost);
        async move {
            match plan {
                Ok(plan) => self.entered(plan, None).await,
                Err(verdict) => Permit::new(verdict, None),
            }
        }
    }

    /// [`Limiter::enter_key`], waiting its turn as [`Limiter::wait_key`] does: after a
    /// refusal it sleeps for its [`Verdict::retry_after`] (a concurrency rule's: the
    /// key's median hold time) and asks again, until waiting longer would pass
    /// `max_wait`. Returns the last permit: allowed, or the refusal that would have made
    /// it wait too long.
    pub fn wait_enter_key(
        &self,
        rule: &str,
        key: impl Into<Key>,
        cost: u64,
        max_wait: Duration,
    ) -> impl Future<Output = Permit> + Send + '_ {
        let plan = self.plan_key(rule, key.into(), cost);
        async move {
            match plan {
                Ok(plan) => self.entered(plan, Some(Instant::now() + max_wait)).await,
                Err(verdict) => Permit::new(verdict, None),
            }
        }
    }

    /// Decides `plan` (again after each refusal, while its retry time ends before
    /// `until`) and holds its permits in a [`Permit`].
    async fn entered(&self, plan: Plan<I>, until: Option<Instant>) -> Permit {
        loop {
            let mut verdict = self.decide(plan.clone()).await;
            if let (Some(until), Ruling::Rejected { .. }, Some(retry)) = (until, &verdict.ruling, verdict.retry_after())
            {
                if Instant::now() + retry <= until {
                    tokio::time::sleep(retry).await;
                    continue;
                }
            }
            // Dropped from here (a leaky bucket's wait), everything goes back.
            let lease = self.lease(std::mem::take(&mut verdict.held), "an entry dropped before its slot");
            let delay = verdict.delay();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let (held, released) = lease.enter();
            verdict.held = held;
            let release: Option<Box<dyn crate::permit::Held>> =
                (released.permits() > 0).then(|| Box::new(released) as Box<dyn crate::permit::Held>);
            return Permit::new(verdict, release);
        }
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
    /// ([`StoreError::UnknownRule`]), whatever the fail mode.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::BuildError> {
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
    /// # let _: axum::Router = app;
    /// # Ok(()) }
    /// ```
    pub fn check_key(&self, rule: &str, key: impl Into<Key>, cost: u64) -> impl Future<Output = Verdict> + Send + '_ {
        // No `async` block: it would hold the plan beside the future it is moved into.
        match self.plan_key(rule, key.into(), cost) {
            Ok(plan) => Either::Left(self.handed(plan)),
            Err(verdict) => Either::Right(std::future::ready(verdict)),
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
        let plan = self.plan_key(rule, key.into(), cost);
        async move {
            match plan {
                Ok(plan) => self.wait_plan(plan, max_wait).await,
                Err(verdict) => verdict,
            }
        }
    }

    /// [`Limiter::wait`] of a plan.
    async fn wait_plan(&self, plan: Plan<I>, max_wait: Duration) -> Verdict {
        let until = Instant::now() + max_wait;
        loop {
            let mut verdict = self.handed(plan.clone()).await;
            match (&verdict.ruling, verdict.retry_after()) {
                (Ruling::Rejected { .. }, Some(retry)) if Instant::now() + retry <= until => {
                    tokio::time::sleep(retry).await;
                }
                (Ruling::Allowed, _) => {
                    let delay = verdict.delay();
                    if !delay.is_zero() {
                        // Dropped during the sleep, the lease gives back everything the verdict took.
                        let lease = self.lease(std::mem::take(&mut verdict.held), "an input dropped before its slot");
                        tokio::time::sleep(delay).await;
                        verdict.held = lease.keep();
                    }
                    return verdict;
                }
                _ => return verdict,
            }
        }
    }

    /// Gives back the units an allowed verdict took (work that was not done after all):
    /// exactly those of its commits, to whoever decided them (the store, or the fallback
    /// limiter), and nothing once they have left their window. Under GCRA and the token
    /// bucket a refund is all or nothing: all of a commit's units when no commit was made
    /// on the key since, none otherwise. A refund may give back less, never more.
    ///
    /// A verdict from before a [`reset`](Limiter::reset) of its key gives nothing back
    /// under the window algorithms (their state keeps the earliest time a commit into it
    /// recorded). The
    /// token bucket, the leaky bucket, GCRA and the sliding window log do not tell it apart
    /// from later ones: refunded after the reset, it may refund up to its own units from
    /// requests made since. Do not refund across a reset.
    ///
    /// Takes the verdict: its units go back at most once (a second refund of the same
    /// commits would refund units of other requests). A verdict is not `Clone` for
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
        // A rule swapped since under another identity (its blocks changed, say) may have
        // cached a rejection of the same state: forgotten too (the holders forget the
        // units' own rules').
        let current = self.rules.load();
        for u in &verdict.held.units {
            if let Some((i, _)) = current.find(&u.refund.check.rule) {
                self.runtime.cache.forget(current.id(i), &u.refund.check.key);
            }
        }
        drop(current);
        self.holders.refund_now(verdict.held).await
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

    /// Blocks `key` under rule `rule` for `duration` from now, on every server that
    /// shares the store: until then the key is refused outright, with the rest of the
    /// block as its `Retry-After`, as a [`Rule::block_for`](crate::Rule::block_for) penalty refuses it. A block
    /// replaces the key's earlier one (a penalty's too); `Duration::ZERO` lifts it, and so
    /// does [`Limiter::reset`].
    ///
    /// While the store cannot answer, this server's fallback keeps refusing a key it
    /// blocked (and admits one it lifted); another server's fallback knows a block from
    /// the store's answers about the key. A block asked while the store is down fails
    /// with the store's error (no deadline, breaker or retry applies here: a stopped Redis
    /// fails it after the connection's response timeout, 100 ms), and still holds on this
    /// server while the store stays down (its fallback takes it): ask again once the
    /// store is back, for every server to refuse the key.
    ///
    /// The rule must be able to block: built with [`Rule::blockable`](crate::Rule::blockable) or
    /// [`Rule::block_for`](crate::Rule::block_for) (on Redis, its checks then read the key's block).
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
    /// [`StoreError::UnknownRule`] when the limiter has no rule named `rule`,
    /// [`StoreError::Invalid`] for a rule that cannot block (neither
    /// [`Rule::blockable`](crate::Rule::blockable) nor [`Rule::block_for`](crate::Rule::block_for)), or the store's error (no deadline or
    /// circuit breaker applies here).
    pub async fn block(&self, rule: &str, key: impl Into<Key>, duration: Duration) -> Result<(), StoreError> {
        let set = self.rules.load();
        let (i, r) = set.find(rule).ok_or_else(|| unknown(rule))?;
        let (check, id, share_id) = (set.check(r, key.into(), r.quota, 1), set.id(i), set.share_id(i));
        drop(set);
        if !check.params.reads_block() {
            return Err(StoreError::Invalid(format!(
                "rule {rule:?} cannot be blocked by hand: build it with Rule::blockable() (or Rule::block_for)"
            )));
        }
        let stored = self.holders.store.block(&check, duration).await;
        // This server's slices of the key close (what they left goes back); other servers'
        // lapse within 100 ms.
        let refunds = self.runtime.slices.void(
            crate::runtime::slice_id(share_id, check.params.quota),
            &check.key,
            self.runtime.mono_us(),
        );
        if !refunds.is_empty() {
            if let Err(err) = self.holders.store.refund(&refunds).await {
                holders::lost(&refunds, "quota slices of a blocked key", &err);
            }
        }
        // A rejection this process cached for the key may end before a new block, or
        // after a lifted one.
        self.runtime.cache.forget(id, &check.key);
        // The fallback keeps this server's own block (or its lift) while the store cannot
        // answer — also one the store did not take (it is down): the cache holds a block
        // for a second only (a lift elsewhere must reach every server), and nothing else
        // told it. A lift also forgets what the store said remains of the key: that may
        // be the block's zero.
        if let Err(err) = crate::store::LocalStore::block_now(&self.runtime.fallback, &check, duration) {
            tracing::warn!(error = %err, rule, "tollgate: the fallback could not record a block");
        }
        if duration.is_zero() {
            self.runtime.shares.forget(share_id, &check.key);
        }
        if let Err(err) = &stored {
            tracing::warn!(
                error = %err,
                rule,
                "tollgate: the store did not take a block by hand: it holds on this server only while the store \
                 is down; ask again once it is back"
            );
        }
        stored
    }

    /// What rule `rule` would decide now for one unit of `key`, without consuming
    /// anything ("why is this customer limited?"): `remaining` counts what would be left
    /// after that unit. Uses the quota given to
    /// [`Rule::new`](crate::Rule::new): for a rule whose quota is chosen per input ([`Rule::quota_fn`](crate::Rule::quota_fn)), use
    /// [`Limiter::peek_with`].
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownRule`] when the limiter has no rule named `rule`, or the
    /// store's error (no deadline or circuit breaker applies here).
    pub async fn peek(&self, rule: &str, key: impl Into<Key>) -> Result<Decision, StoreError> {
        let quota = self.rules.load().find(rule).map(|(_, r)| r.quota).ok_or_else(|| unknown(rule))?;
        self.peek_with(rule, key, quota).await
    }

    /// [`Limiter::peek`] under `quota` (e.g. the key's tier).
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownRule`] when the limiter has no rule named `rule`, or the
    /// store's error.
    pub async fn peek_with(&self, rule: &str, key: impl Into<Key>, quota: Quota) -> Result<Decision, StoreError> {
        let set = self.rules.load();
        let (_, r) = set.find(rule).ok_or_else(|| unknown(rule))?;
        let (i, _) = set.find(rule).ok_or_else(|| unknown(rule))?;
        let check = set.check(r, key.into(), quota, 1);
        let id = crate::runtime::slice_id(set.share_id(i), quota);
        drop(set);
        let mut decision = self.holders.store.peek(&check).await?;
        // The store counted this server's slices as taken: what they hold is not used yet.
        let held = self.runtime.slices.held(id, &check.key, self.runtime.mono_us());
        decision.set_remaining(decision.remaining().saturating_add(held).min(decision.limit));
        Ok(decision)
    }

    /// Forgets the state of `key` under rule `rule`, in the store and in this process's
    /// blocked-key cache: the key starts afresh. Other servers' blocked-key caches ask the
    /// store again within a second: the reset reaches every server within a second.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnknownRule`] when the limiter has no rule named `rule`, or the
    /// store's error.
    pub async fn reset(&self, rule: &str, key: impl Into<Key>) -> Result<(), StoreError> {
        let set = self.rules.load();
        let (i, r) = set.find(rule).ok_or_else(|| unknown(rule))?;
        let key = key.into();
        let algorithm = r.algorithm_or(set.algorithm);
        self.holders.store.reset(rule, &key, algorithm).await?;
        // This server's slices of the key end with the state they were taken from (given
        // back, they would be taken from the fresh one); other servers' lapse within 100 ms.
        let id = crate::runtime::slice_id(set.share_id(i), r.quota);
        drop(self.runtime.slices.void(id, &key, self.runtime.mono_us()));
        self.runtime.cache.forget(set.id(i), &key);
        // And in the fallback: its counts and block, and its share of what the store said.
        if let Err(err) = crate::store::LocalStore::reset_now(&self.runtime.fallback, rule, &key, algorithm) {
            tracing::warn!(error = %err, rule, "tollgate: the fallback could not reset a key");
        }
        self.runtime.shares.forget(set.share_id(i), &key);
        Ok(())
    }
}

impl<St: Store, I: ?Sized + 'static> Limiter<St, I> {
    /// Gives back what this server's quota slices hold (see
    /// [`Rule::slices`](crate::Rule::slices)), for a graceful shutdown: other servers may
    /// use those units at once, instead of when the slices lapse. No slice is taken after
    /// it: the limiter decides every request with the store until it is dropped. A limiter dropped without it leaves its slices' units
    /// unused until their window ends (at most one window of each sliced key).
    ///
    /// # Errors
    ///
    /// The store's error (no deadline or circuit breaker applies here).
    pub async fn close(&self) -> Result<(), StoreError> {
        let refunds = self.runtime.slices.close_all(self.runtime.mono_us());
        if refunds.is_empty() {
            return Ok(());
        }
        self.holders.store.refund(&refunds).await
    }
}

impl<St: LocalStore, I: ?Sized + 'static> Limiter<St, I> {
    /// [`Limiter::check_key`] at once, for an in-process store ([`MemoryStore`], any
    /// [`LocalStore`]): the same decision, count and verdict, with no future and no
    /// runtime — a job loop or a synchronous caller decides in its own thread.
    ///
    /// ```
    /// use tollgate::{Limiter, MemoryStore, Quota};
    ///
    /// let limiter = Limiter::<_, str>::builder(MemoryStore::new())
    ///     .rule("exports", Quota::per_hour(2), |account: &str| Some(account.to_owned()))
    ///     .build()
    ///     .unwrap();
    /// assert!(limiter.check_key_now("exports", 42u64, 1).is_allowed());
    /// assert!(limiter.check_key_now("exports", 42u64, 1).is_allowed());
    /// assert!(limiter.check_key_now("exports", "42", 1).is_rejected(), "42 and \"42\" are one key");
    /// ```
    ///
    /// [`MemoryStore`]: crate::MemoryStore
    pub fn check_key_now(&self, rule: &str, key: impl Into<Key>, cost: u64) -> Verdict {
        let plan = match self.plan_key(rule, key.into(), cost) {
            Ok(plan) => plan,
            Err(verdict) => return verdict,
        };
        if let Some(refused) = no_permits(&plan) {
            return refused;
        }
        let verdict = self.decide_local(&*self.holders.store, &plan);
        self.holders.kept(&verdict.held.units);
        verdict
    }
}

/// A check (not an entry) of an input a concurrency rule applies to: refused, saying
/// what to call instead (a verdict would keep its permits for ever).
fn no_permits<I: ?Sized>(plan: &Plan<I>) -> Option<Verdict> {
    let c = plan.checks.iter().find(|c| c.algorithm == crate::algorithm::Algorithm::Concurrent)?;
    let error = StoreError::Invalid(format!(
        "rule {:?} limits work in flight (Rule::concurrent): a check would hold its permits for ever; use \
         Limiter::enter or Limiter::enter_key, whose Permit gives them back when dropped",
        &*c.rule
    ));
    Some(Verdict::empty(Ruling::Failed { error, closed: true }, plan.set.held()))
}

/// The error of an admin call or a check by key under a rule name the limiter lacks.
pub(crate) fn unknown(rule: &str) -> StoreError {
    StoreError::UnknownRule(rule.to_owned())
}
