//! Where limiter state lives: the [`Store`] trait, [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
//! `RedisStore`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;

pub use self::name::RuleName;
pub use crate::algorithm::Params;

pub mod memory;
mod name;
#[cfg(feature = "redis")]
pub mod redis;

/// The outcomes of one request's rules: inline for one rule, the common case. `None`: a
/// rule the store could not decide while another rejected.
pub(crate) type Outcomes = smallvec::SmallVec<[Option<Outcome>; 1]>;

/// Where a store recorded the units of an allowed, committed check: what a refund needs to
/// refund exactly those units, and nothing else.
///
/// `at` is in µs since the epoch: the time of the decision for the window algorithms (the
/// stored window's start when the clock stepped back before it); the theoretical arrival
/// time the commit left for the token bucket and GCRA (a refund gives back all of the
/// commit's units while the key's TAT is still that one, none once another commit moved
/// it); the timestamp the units were logged under for the sliding window log (the newest
/// entry's, when the clock stepped back); the first slot for the leaky bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Taken {
    /// Where the units were recorded, µs since the epoch.
    pub at: u64,
}

/// What a store answered for one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The decision.
    pub decision: Decision,
    /// Where the units went: `Some` when the check was allowed and committed (every check
    /// of the call accepted), `None` otherwise.
    pub taken: Option<Taken>,
}

/// Units to refund: a check and what its commit took.
#[derive(Debug, Clone)]
pub struct Refund {
    /// The check as it was made (rule, key, algorithm, quota, cost).
    pub check: Check,
    /// What its commit took.
    pub taken: Taken,
}

/// One rule's check of one request.
#[derive(Debug, Clone)]
pub struct Check {
    /// The rule's name (unique per layer and store prefix).
    pub rule: RuleName,
    /// The key the rule limits.
    pub key: Key,
    /// The rule's algorithm.
    pub algorithm: Algorithm,
    /// Quota, cost, and max delay.
    pub params: Params,
}

/// A place that keeps limiter state and decides: the async interface, for a store
/// reached through I/O (`RedisStore`).
///
/// **Which trait to implement.** A store that needs no I/O (a table in this process)
/// implements [`LocalStore`], the synchronous twin, and gets `Store` from the blanket
/// impl: the limiter then decides in the caller's thread, with no future, no timer and no
/// runtime, and its refunds and charges are taken before the next decision. A store
/// reached over the network implements `Store` itself; the limiter calls it under a
/// deadline, an in-flight cap and a circuit breaker, and sends refunds and charges from
/// a detached task.
///
/// `check` decides every rule of one request in one call: the request is accepted only
/// if every rule accepts it, and a request rejected by any rule consumes nothing from
/// the others. Outcomes come back in the order of `checks`, each allowed one with the
/// [`Taken`] identity of its commit, which [`Store::refund`] takes back.
pub trait Store: Send + Sync + 'static {
    /// Decides one rule: what `check(&[check])` decides, without a `Vec`. The layer calls
    /// this for the (common) requests that one rule applies to. The default calls `check`.
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        let fut = self.check(std::slice::from_ref(check));
        async move { the_one(fut.await?) }
    }

    /// Decides `checks` together; commits them only if all are allowed.
    ///
    /// The checks must name distinct states: a list with one (rule, key, algorithm) twice
    /// is refused with [`StoreError::Invalid`] (both would be decided against the state
    /// before either commits).
    ///
    /// An entry is `None` only when the store could not decide that check but could
    /// decide another that rejected the request (a Redis Cluster slot that failed while
    /// another slot rejected): the request is rejected, and nothing is taken. When no
    /// decided check rejects, a store that cannot decide them all returns an error.
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send;

    /// Gives back the units of earlier commits (count-by-outcome rules, cancelled
    /// requests): exactly what each commit took, and nothing once those units have left
    /// the window.
    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes each check's cost whatever it would decide: units reported after the work
    /// was done (a response's [`Charge`](crate::Charge), for `Rule::charged` rules). The
    /// key may go into debt, and is then rejected until the debt is paid (see
    /// its algorithm's debt). Checks of cost 0 take nothing.
    ///
    /// The default refuses with [`StoreError::Invalid`]: a store that cannot take charges
    /// says so, and the failed charge is logged and counted.
    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let rule = charges.first().map(|c| c.rule.to_string()).unwrap_or_default();
        std::future::ready(Err(StoreError::Invalid(format!("this store takes no charges (rule {rule:?})"))))
    }

    /// What `check` would decide now, without consuming anything (support tooling).
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Renews permits of concurrency rules ([`Rule::concurrent`](crate::Rule::concurrent))
    /// this server holds: each (named by its refund: its check, and its id in
    /// `taken.at`) lives another hold limit (the check's quota period) from now. A permit
    /// the store no longer holds (given back, or lapsed) is not made again.
    ///
    /// The default does nothing: a store whose permits never lapse (in process, where
    /// nothing dies without dropping them).
    fn renew(&self, permits: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = permits;
        std::future::ready(Ok(()))
    }

    /// Forgets the state of one (rule, key, algorithm): the key starts afresh.
    fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm)
        -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Blocks `check`'s key under its rule for `duration` from now (the store's time):
    /// until then, every check of that (rule, key) is refused with the rest of the block as
    /// its `retry_after`, whatever its algorithm would decide, as a [`Rule::block_for`]
    /// penalty is. A block replaces the key's earlier one; `Duration::ZERO` lifts it.
    ///
    /// The default refuses with [`StoreError::Invalid`]: a store that cannot block says so.
    ///
    /// [`Rule::block_for`]: crate::Rule::block_for
    fn block(&self, check: &Check, duration: Duration) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = duration;
        std::future::ready(Err(StoreError::Invalid(format!("this store cannot block keys (rule {:?})", check.rule))))
    }

    /// This store as an in-process one, when it is: the limiter then decides, refunds
    /// and charges synchronously, with no future, timer or runtime. Every [`LocalStore`]
    /// answers `Some(self)` (through the blanket `impl<T: LocalStore> Store for T`); a
    /// remote store keeps the default `None`, and is called through the async methods
    /// under the deadline, the in-flight cap and the circuit breaker.
    fn as_local(&self) -> Option<&dyn LocalStore> {
        None
    }

    /// An identity that clones of this store share and no other live store has: two
    /// limiters over stores of one identity share state, so a rule name may be used by one
    /// of them only. Default `None`: not checked.
    fn identity(&self) -> Option<usize> {
        None
    }

    /// How many limiters (one per server, as a rule) share this store's limits, as the
    /// store last counted them: each limiter's fallback admits each key up to its quota
    /// divided by this while the store fails. `None` (the default): the store does not
    /// count them, and the limiter takes 1 unless told (`LimiterBuilder::servers`).
    ///
    /// `RedisStore` counts the limiters announced in the last few seconds: each server
    /// announces, every second, every limiter built over its store (two layers of one
    /// process over one store count twice: each has its own fallback).
    fn servers(&self) -> Option<u64> {
        None
    }

    /// Starts whatever [`Store::servers`] needs (an announcement of one more limiter):
    /// called once by each limiter built over the store, inside or outside a runtime. The
    /// limiter keeps what this returns, and drops it with itself: the announcement is
    /// withdrawn. The default announces nothing.
    fn announce(&self) -> Announced {
        Announced::none()
    }

    /// Whether this store decides on a real clock that runs at the rate of this process's
    /// own (Redis's `TIME`): only then may a limiter take quota slices from it (a slice
    /// lapses on this process's clock). Default `false`; `RedisStore` answers `true`
    /// unless built with a test clock.
    fn real_clock(&self) -> bool {
        false
    }

    /// The error for a call about `checks` that the caller's `deadline` cut off. The
    /// default is [`StoreError::Timeout`]; a store of several nodes may say that only the
    /// node of these keys did not answer ([`StoreError::NodeTimeout`], which the circuit
    /// breaker does not count). Either way the call was sent: its outcome is unknown.
    fn timed_out(&self, checks: &[Check], deadline: Duration) -> StoreError {
        let _ = checks;
        StoreError::Timeout(deadline)
    }
}

/// What [`Store::announce`] returns: kept by the limiter, dropped with it to withdraw the
/// announcement.
pub struct Announced(#[allow(dead_code, reason = "held for its Drop")] Option<Box<dyn Send + Sync>>);

impl Announced {
    /// Nothing announced, nothing to withdraw.
    #[must_use]
    pub fn none() -> Self {
        Self(None)
    }

    /// An announcement withdrawn by dropping `guard`.
    #[must_use]
    pub fn new(guard: impl Send + Sync + 'static) -> Self {
        Self(Some(Box::new(guard)))
    }
}

impl std::fmt::Debug for Announced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Announced" } else { "Announced(none)" })
    }
}

/// A store in this process, with no I/O: the synchronous twin of [`Store`], which every
/// `LocalStore` is through a blanket impl (its futures are ready at once). The limiter
/// takes this path for it: an input is decided in the caller's thread, and a refund or a
/// charge is taken before the call returns — no future, no timer, no tokio runtime.
/// [`MemoryStore`](crate::MemoryStore) is one; implement this trait, not `Store`, for a
/// custom in-process store. The contract of each method is that of its `Store` namesake.
pub trait LocalStore: Send + Sync + 'static {
    /// Decides `checks` together, committing them only if all are allowed (see
    /// [`Store::check`]).
    ///
    /// # Errors
    ///
    /// A check list naming one state twice ([`StoreError::Invalid`]), a full store, …
    fn check_now(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError>;

    /// Decides one rule (see [`Store::check_one`]). The default calls `check`.
    ///
    /// # Errors
    ///
    /// As [`LocalStore::check_now`].
    fn check_one_now(&self, check: &Check) -> Result<Outcome, StoreError> {
        the_one(self.check_now(std::slice::from_ref(check))?)
    }

    /// Gives back the units of earlier commits (see [`Store::refund`]).
    ///
    /// # Errors
    ///
    /// The store's own.
    fn refund_now(&self, refunds: &[Refund]) -> Result<(), StoreError>;

    /// Takes each check's cost whatever it would decide (see [`Store::charge`]). The
    /// default refuses with [`StoreError::Invalid`].
    ///
    /// # Errors
    ///
    /// A store that takes no charges, a full store.
    fn charge_now(&self, charges: &[Check]) -> Result<(), StoreError> {
        let rule = charges.first().map(|c| c.rule.to_string()).unwrap_or_default();
        Err(StoreError::Invalid(format!("this store takes no charges (rule {rule:?})")))
    }

    /// What `check` would decide now, without consuming anything.
    ///
    /// # Errors
    ///
    /// The store's own.
    fn peek_now(&self, check: &Check) -> Result<Decision, StoreError>;

    /// Forgets the state of one (rule, key, algorithm), and its block.
    ///
    /// # Errors
    ///
    /// The store's own.
    fn reset_now(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError>;

    /// Blocks `check`'s key under its rule for `duration` (see [`Store::block`]). The
    /// default refuses with [`StoreError::Invalid`].
    ///
    /// # Errors
    ///
    /// A store that cannot block, a full store.
    fn block_now(&self, check: &Check, duration: Duration) -> Result<(), StoreError> {
        let _ = duration;
        Err(StoreError::Invalid(format!("this store cannot block keys (rule {:?})", check.rule)))
    }

    /// See [`Store::identity`].
    fn identity(&self) -> Option<usize> {
        None
    }
}

impl<T: LocalStore> Store for T {
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        std::future::ready(LocalStore::check_one_now(self, check))
    }
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        std::future::ready(LocalStore::check_now(self, checks))
    }
    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(LocalStore::refund_now(self, refunds))
    }
    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(LocalStore::charge_now(self, charges))
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(LocalStore::peek_now(self, check))
    }
    fn reset(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(LocalStore::reset_now(self, rule, key, algorithm))
    }
    fn block(&self, check: &Check, duration: Duration) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(LocalStore::block_now(self, check, duration))
    }
    fn as_local(&self) -> Option<&dyn LocalStore> {
        Some(self)
    }
    fn identity(&self) -> Option<usize> {
        LocalStore::identity(self)
    }
}

/// A store identity no other store of this process ever had (see [`Store::identity`]): a
/// counter, never an address (which the allocator reuses).
pub(crate) fn new_identity() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The outcome of a call of one check (`check_one`'s default).
fn the_one(outcomes: Vec<Option<Outcome>>) -> Result<Outcome, StoreError> {
    outcomes.into_iter().next().flatten().ok_or_else(|| StoreError::Backend("the store returned no decision".into()))
}

/// Refuses a check list that names one state twice (see [`Store::check`]).
pub(crate) fn distinct(checks: &[Check]) -> Result<(), StoreError> {
    for (i, a) in checks.iter().enumerate() {
        if let Some(b) = checks[..i].iter().find(|b| b.rule == a.rule && b.key == a.key && b.algorithm == a.algorithm) {
            return Err(StoreError::Invalid(format!(
                "rule {:?} ({}) checks key {:?} twice in one call",
                b.rule, b.algorithm, b.key
            )));
        }
    }
    Ok(())
}

impl<S: Store> Store for Arc<S> {
    fn check_one(&self, check: &Check) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        (**self).check_one(check)
    }
    fn check(&self, checks: &[Check]) -> impl Future<Output = Result<Vec<Option<Outcome>>, StoreError>> + Send {
        (**self).check(checks)
    }
    fn refund(&self, refunds: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).refund(refunds)
    }
    fn charge(&self, charges: &[Check]) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).charge(charges)
    }
    fn peek(&self, check: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).peek(check)
    }
    fn renew(&self, permits: &[Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).renew(permits)
    }
    fn reset(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(rule, key, algorithm)
    }
    fn block(&self, check: &Check, duration: Duration) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).block(check, duration)
    }
    fn as_local(&self) -> Option<&dyn LocalStore> {
        (**self).as_local()
    }
    fn identity(&self) -> Option<usize> {
        (**self).identity()
    }
    fn servers(&self) -> Option<u64> {
        (**self).servers()
    }
    fn announce(&self) -> Announced {
        (**self).announce()
    }
    fn timed_out(&self, checks: &[Check], deadline: Duration) -> StoreError {
        (**self).timed_out(checks, deadline)
    }
    fn real_clock(&self) -> bool {
        (**self).real_clock()
    }
}
