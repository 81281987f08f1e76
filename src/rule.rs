//! [`Rule`]: one limit of a [`Limiter`](crate::Limiter) or layer, and [`FailMode`].

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::algorithm::Algorithm;
use crate::error::BuildError;
use crate::key::KeyExtractor;
use crate::quota::Quota;
use crate::store::RuleName;

/// What happens when the store cannot decide (error, timeout, open circuit, overload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Decide in this process, each key limited to this server's share of its quota (the
    /// default): the quota divided by the number of servers sharing the store (counted by
    /// the store, see [`Store::servers`](crate::store::Store::servers)), and no more than
    /// that share of what the store last said remains of the key. Over-admission is
    /// bounded; see the README's "When the store is slow or down". What this admitted
    /// while the store was never called is charged to it when it answers again.
    ///
    /// For an in-process store (which fails only when full) this is [`FailMode::Open`].
    #[default]
    Fallback,
    /// Let the request through, unlimited: the limiter is never why a request fails. A
    /// rate-limited warning is logged and `tollgate_fail_open_total` counted.
    Open,
    /// Refuse: the layer answers `503 Service Unavailable` with `Retry-After` (gRPC:
    /// `UNAVAILABLE`); a [`Verdict`](crate::Verdict) says not allowed. For login or
    /// payment routes where an unlimited pass is worse than a refusal.
    Closed,
}

impl FromStr for FailMode {
    type Err = BuildError;

    /// `fallback`, `open` or `closed`, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fallback" => Ok(FailMode::Fallback),
            "open" => Ok(FailMode::Open),
            "closed" => Ok(FailMode::Closed),
            _ => Err(BuildError::InvalidConfig {
                rule: String::new(),
                field: "fail_mode".into(),
                why: format!("unknown fail mode {s:?}: use fallback, open or closed"),
            }),
        }
    }
}

/// A concurrency rule's default hold limit ([`Rule::hold_limit`]).
pub(crate) const DEFAULT_HOLD_LIMIT: Duration = Duration::from_secs(60);

/// The shortest hold limit of a concurrency rule.
const MIN_HOLD_LIMIT: Duration = Duration::from_millis(3);

/// Longest rule name, in bytes.
pub(crate) const MAX_RULE_NAME: usize = 64;

/// Checks a rule name: 1 to [`MAX_RULE_NAME`] bytes.
pub(crate) fn check_rule_name(name: &str) -> Result<(), BuildError> {
    if name.is_empty() || name.len() > MAX_RULE_NAME {
        return Err(BuildError::InvalidRuleName {
            name: name.to_owned(),
            why: format!("a rule name needs 1 to {MAX_RULE_NAME} bytes"),
        });
    }
    Ok(())
}

pub(crate) type Shared<I, T> = Arc<dyn Fn(&I) -> T + Send + Sync>;

/// One limit: a name, a quota, a key extractor, and options. `I` is what is limited: an
/// HTTP request's head ([`RequestHead`](crate::RequestHead)) for the layer, or anything else for a
/// [`Limiter`](crate::Limiter) used directly (a WebSocket message, a job).
///
/// ```
/// use tollgate::{key, Algorithm, Quota, RequestHead, Rule};
///
/// let rule: Rule<RequestHead> = Rule::new("per-ip", Quota::per_minute(100), key::PeerIp)
///     .algorithm(Algorithm::Gcra)
///     .cost(|req: &RequestHead| if req.method() == "POST" { 5 } else { 1 });
/// ```
pub struct Rule<I: ?Sized> {
    pub(crate) name: RuleName,
    pub(crate) public_name: Option<Arc<str>>,
    pub(crate) quota: Quota,
    pub(crate) quota_fn: Option<Shared<I, Option<Quota>>>,
    pub(crate) key: Arc<dyn KeyExtractor<I>>,
    pub(crate) algorithm: Option<Algorithm>,
    pub(crate) cost: Option<Shared<I, u64>>,
    pub(crate) fail_mode: Option<FailMode>,
    pub(crate) max_delay: Duration,
    pub(crate) block: Duration,
    /// Whether the rule's keys can be blocked by hand (`Limiter::block`).
    pub(crate) blockable: bool,
    pub(crate) shadow: bool,
    /// Quota slices for this rule's hot keys: `None` follows the limiter's setting.
    pub(crate) slices: Option<bool>,
    /// Made from a configuration: a reload replaces it.
    pub(crate) from_config: bool,
    /// Takes what responses report (`Charge`), after them.
    pub(crate) charged: bool,
    pub(crate) bypass: Option<Shared<I, bool>>,
    pub(crate) count_if: Option<Arc<dyn Fn(StatusCode) -> bool + Send + Sync>>,
    /// Whether the rule's first inputs gave it a key (and a quota): see [`KeyWatch`].
    pub(crate) watch: Arc<KeyWatch>,
    /// A concurrency rule ([`Rule::concurrent`]): the `n` it was given (0 is refused when
    /// the limiter is built). Its quota is `n` permits per hold limit.
    pub(crate) concurrent: Option<u64>,
    /// A concurrency rule's hold limit as given (checked when the limiter is built; the
    /// quota's period once valid).
    pub(crate) hold: Duration,
}

/// How many of a rule's first inputs may give it no key (or no quota from its
/// `quota_fn`) before the operator is told that the rule limits nothing.
pub(crate) const WATCHED_INPUTS: u32 = 10;

/// Watches a rule's first [`WATCHED_INPUTS`] inputs: when none of them gave it a key (or a
/// quota), the rule limited none of them — most often a key read from a request extension
/// that an auth layer sets, with that layer inside the limiter. Said once, naming the rule.
/// After the first input with a key, or the notice, one relaxed load per input.
#[derive(Debug, Default)]
pub(crate) struct KeyWatch {
    /// Inputs seen with no key so far; [`WATCHED_INPUTS`] once done.
    empty: std::sync::atomic::AtomicU32,
    said: crate::notice::Once,
}

impl KeyWatch {
    /// An input of rule `name` gave it a key and a quota (`applies`), or not.
    #[inline]
    pub(crate) fn saw(&self, applies: bool, name: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.empty.load(Relaxed) >= WATCHED_INPUTS {
            return;
        }
        if applies {
            self.empty.store(WATCHED_INPUTS, Relaxed);
        } else if self.empty.fetch_add(1, Relaxed) + 1 == WATCHED_INPUTS {
            self.said.tell(false, || {
                format!(
                    "tollgate: rule {name:?} got no key (or no quota from its quota_fn) for any of its first \
                     {WATCHED_INPUTS} requests: it limited none of them. A key read from a request extension needs \
                     the layer that sets it (authentication) to run before the limiter: in axum, add that layer \
                     after the rate limit (`.route_layer(limit).route_layer(auth)`: the last added runs first)"
                )
            });
        }
    }
}

impl<I: ?Sized> Clone for Rule<I> {
    fn clone(&self) -> Self {
        Self {
            name: self.name,
            public_name: self.public_name.clone(),
            quota: self.quota,
            quota_fn: self.quota_fn.clone(),
            key: self.key.clone(),
            algorithm: self.algorithm,
            cost: self.cost.clone(),
            fail_mode: self.fail_mode,
            max_delay: self.max_delay,
            block: self.block,
            blockable: self.blockable,
            shadow: self.shadow,
            slices: self.slices,
            from_config: self.from_config,
            charged: self.charged,
            bypass: self.bypass.clone(),
            count_if: self.count_if.clone(),
            watch: self.watch.clone(),
            concurrent: self.concurrent,
            hold: self.hold,
        }
    }
}

impl<I: ?Sized> fmt::Debug for Rule<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("public_name", &self.public_name)
            .field("quota", &self.quota)
            .field("per_request_quota", &self.quota_fn.is_some())
            .field("algorithm", &self.algorithm)
            .field("cost", &self.cost.as_ref().map(|_| "fn"))
            .field("fail_mode", &self.fail_mode)
            .field("max_delay", &self.max_delay)
            .field("block", &self.block)
            .field("blockable", &self.blockable)
            .field("shadow", &self.shadow)
            .field("charged", &self.charged)
            .field("bypass", &self.bypass.as_ref().map(|_| "fn"))
            .field("count_if", &self.count_if.as_ref().map(|_| "fn"))
            .field("concurrent", &self.concurrent)
            .finish_non_exhaustive()
    }
}

impl<I: ?Sized> Rule<I> {
    /// A rule named `name` limiting each key to `quota`.
    pub fn new(name: impl Into<String>, quota: Quota, key: impl KeyExtractor<I>) -> Self {
        Self {
            name: RuleName::new(&name.into()),
            public_name: None,
            quota,
            quota_fn: None,
            key: Arc::new(key),
            algorithm: None,
            cost: None,
            fail_mode: None,
            max_delay: Duration::from_secs(10),
            block: Duration::ZERO,
            blockable: false,
            shadow: false,
            slices: None,
            from_config: false,
            charged: false,
            bypass: None,
            count_if: None,
            watch: Arc::default(),
            concurrent: None,
            hold: DEFAULT_HOLD_LIMIT,
        }
    }

    /// A concurrency rule named `name`: at most `n` of a key's inputs **in flight** at
    /// once, on every server that shares the store — not a rate (no period, no
    /// algorithm). Its unit is a *permit*: an admitted input takes one (or its
    /// [`cost`](Rule::cost) in permits) and gives them back when its work ends — the HTTP
    /// layer when the response's body ends or is dropped, a job when the
    /// [`Permit`](crate::Permit) of [`Limiter::enter_key`](crate::Limiter::enter_key) is
    /// dropped. It composes with rate rules in one decision (an input refused by any rule
    /// holds nothing), may be [`shadow`](Rule::shadow), and takes tiers from
    /// [`Rule::permits_fn`].
    ///
    /// A refusal's `retry_after` is the key's recent median hold time, at least 10 ms. A
    /// permit a remote store holds lapses after the [`hold_limit`](Rule::hold_limit)
    /// (default 60 s) unless its server renews it: a server that dies frees its permits
    /// within it.
    ///
    /// ```
    /// use tollgate::{key, Quota, RequestHead, Rule};
    ///
    /// // An LLM-style endpoint: 3 in flight and 60 a minute per API key.
    /// let in_flight: Rule<RequestHead> = Rule::concurrent("llm-in-flight", 3, key::header("x-api-key"));
    /// let per_minute: Rule<RequestHead> = Rule::new("llm-per-minute", Quota::per_minute(60), key::header("x-api-key"));
    /// # let _ = (in_flight, per_minute);
    /// ```
    ///
    /// An `n` of 0 is refused when the limiter is built ([`BuildError::InvalidQuota`]).
    pub fn concurrent(name: impl Into<String>, n: u64, key: impl KeyExtractor<I>) -> Self {
        let mut rule = Self::new(name, Quota::new(n.max(1), DEFAULT_HOLD_LIMIT), key);
        rule.algorithm = Some(Algorithm::Concurrent);
        rule.concurrent = Some(n);
        rule
    }

    /// Whether this is a concurrency rule ([`Rule::concurrent`]).
    #[must_use]
    pub fn is_concurrent(&self) -> bool {
        self.concurrent.is_some()
    }

    /// A concurrency rule: how long a permit held by a remote store lives unless its server
    /// renews it (default 60 s). Each server renews the permits it holds every third of
    /// it, so only a server that died (or could not reach the store for that long) loses
    /// them. Ignored by a rate rule. Shorter than 3 ms (a renewal every third of it would
    /// be below a millisecond) is a build error.
    #[must_use]
    pub fn hold_limit(mut self, hold: Duration) -> Self {
        self.hold = hold;
        if self.concurrent.is_some() && hold >= MIN_HOLD_LIMIT {
            self.quota = Quota::new(self.quota.limit(), hold);
        }
        self
    }

    /// A concurrency rule's hold limit (see [`Rule::hold_limit`]); `None` for a rate rule.
    #[must_use]
    pub fn hold_limit_of(&self) -> Option<Duration> {
        self.concurrent.map(|_| self.quota.period())
    }

    /// A concurrency rule: chooses `n` per input (tiers); `None` means "no limit for this
    /// one", and 0 is taken as 1. Ignored by a rate rule (use [`Rule::quota_fn`]).
    #[must_use]
    pub fn permits_fn(mut self, f: impl Fn(&I) -> Option<u64> + Send + Sync + 'static) -> Self {
        if self.concurrent.is_some() {
            // The period is the rule's hold limit, whenever that is set (see `params`).
            self.quota_fn = Some(Arc::new(move |input: &I| f(input).map(|n| Quota::new(n.max(1), DEFAULT_HOLD_LIMIT))));
        }
        self
    }

    /// The rule's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name clients see in the rate-limit headers (`X-RateLimit-Rule`, the IETF
    /// policy names) and in a [`Rejection`](crate::response::Rejection), instead of the rule's own
    /// name (which stays the one stores and metrics use). An empty name hides the rule:
    /// no `X-RateLimit-Rule`, and `""` in the IETF fields.
    #[must_use]
    pub fn public_name(mut self, name: impl Into<String>) -> Self {
        self.public_name = Some(name.into().into());
        self
    }

    pub(crate) fn public_name_or_name(&self) -> Arc<str> {
        self.public_name.clone().unwrap_or_else(|| self.name.as_str().into())
    }

    /// The quota given to [`Rule::new`].
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The algorithm (default: the limiter's, itself defaulting to the sliding window counter).
    /// A concurrency rule ([`Rule::concurrent`]) has none: setting one is a build error.
    #[must_use]
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = Some(algorithm);
        self
    }

    /// Chooses the quota per input (tiers): `None` means "no limit for this one".
    /// The quota given to [`Rule::new`] is used for the headers' policy when this returns
    /// the same, and as documentation otherwise.
    #[must_use]
    pub fn quota_fn(mut self, f: impl Fn(&I) -> Option<Quota> + Send + Sync + 'static) -> Self {
        self.quota_fn = Some(Arc::new(f));
        self
    }

    /// The units an input consumes (default 1; 0 counts as 1).
    #[must_use]
    pub fn cost(mut self, f: impl Fn(&I) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(f));
        self
    }

    /// What to do when the store fails, for this rule (default: the limiter's).
    #[must_use]
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = Some(mode);
        self
    }

    /// Leaky bucket: the longest a request may wait for its slot (default 10 s).
    ///
    /// The queue holds `burst` waiting requests only while they fit in `max_delay`: at
    /// 100/min (a slot every 0.6 s) at most 17 can wait by default, and at 100/hour
    /// (a slot every 36 s) none can. Shaping is meant for per-second rates; raise
    /// `max_delay` deliberately for slower ones.
    #[must_use]
    pub fn max_delay(mut self, max: Duration) -> Self {
        self.max_delay = max;
        self
    }

    /// Shadow (dry-run) mode: decide and record (log, metric), but never reject and send
    /// no rate-limit headers — to roll out a new limit safely. It counts what it would
    /// count enforced: a request refused by an enforced rule (429, or 503 failing closed)
    /// takes nothing from it.
    #[must_use]
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Quota slices for this rule's hot keys, on or off (default: the limiter's setting,
    /// [`LimiterBuilder::slices`](crate::LimiterBuilder::slices)). A server that decides
    /// a key of this rule often takes a slice of its quota from the store — the
    /// algorithm's own check of `k` units, in the same script — and decides that key in
    /// memory until the slice is spent, its window ends, or it lapses (100 ms): never more
    /// than the limit in a window, at the cost of units left unused where a server did not
    /// need them. The fixed window, the sliding window counter, GCRA and the token bucket
    /// take slices (a bucket's slice is a run of future emission slots, each unit admitted
    /// no earlier than its slot: the bucket's bound holds exactly), only on a store on a
    /// real clock (`RedisStore`), and only for an enforced rule; see the README's "Quota
    /// slices".
    #[must_use]
    pub fn slices(mut self, on: bool) -> Self {
        self.slices = Some(on);
        self
    }

    /// Counts what the work used, reported after it ([`Charge`](crate::Charge) in the
    /// response's extensions, or [`Limiter::charge`](crate::Limiter::charge)): LLM tokens,
    /// bytes, rows. The rule takes nothing when a request arrives — it admits the request
    /// while the key is within its quota — and takes the reported units after the
    /// response; a key may so go into debt, and is then refused until the debt is paid.
    /// What debt means per algorithm: the windows count past the limit (the fixed window
    /// until it ends, the sliding ones until the units leave the window); the token
    /// bucket, leaky bucket and GCRA push their time forward. A [`Rule::cost`] does not
    /// apply to a charged rule.
    #[must_use]
    pub fn charged(mut self) -> Self {
        self.charged = true;
        self
    }

    /// Penalty: a key this rule rejects is then refused outright for `block` (the block
    /// lives in the store, so every server enforces it). Blocked requests consume nothing
    /// and are told to retry when the block ends; a rejection during the block does not
    /// extend it. With [`count_if`](Rule::count_if), the classic: five failed logins in
    /// fifteen minutes, and the sixth attempt blocks the key for an hour.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{key, Quota, Rule};
    ///
    /// let logins: Rule<tollgate::RequestHead> = Rule::new("logins", Quota::new(5, Duration::from_secs(15 * 60)), key::PeerIp)
    ///     .count_if(|status| status == 401)
    ///     .block_for(Duration::from_secs(3600));
    /// # let _ = logins;
    /// ```
    ///
    /// The blocked-key cache answers a blocked key in-process until the block ends, even
    /// for a `count_if` rule (a block is final: no refund lifts it); `reset` lifts it.
    /// `Duration::ZERO` (the default): no block.
    #[must_use]
    pub fn block_for(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Lets [`Limiter::block`](crate::Limiter::block) block this rule's keys by hand
    /// ("ban this key for a day", from an admin task, on every server at once). A rule
    /// with [`Rule::block_for`] can always be blocked; any other needs this. It costs
    /// nothing in process; on Redis every check of the rule reads one more key (the
    /// key's block), so it is off by default.
    ///
    /// ```
    /// use tollgate::{key, Quota, Rule};
    ///
    /// let api: Rule<tollgate::RequestHead> =
    ///     Rule::new("api", Quota::per_minute(100), key::header("x-api-key")).blockable();
    /// # let _ = api;
    /// ```
    #[must_use]
    pub fn blockable(mut self) -> Self {
        self.blockable = true;
        self
    }

    /// Inputs for which `f` returns true bypass this rule (health checks, partners).
    #[must_use]
    pub fn bypass_if(mut self, f: impl Fn(&I) -> bool + Send + Sync + 'static) -> Self {
        self.bypass = Some(Arc::new(f));
        self
    }

    /// Count by outcome (HTTP layer): a request's unit is taken before the call as usual,
    /// and refunded afterwards unless `f(status)` is true — e.g. `|s| s == 401` so only
    /// failed logins count. With a [`Limiter`](crate::Limiter) used directly, give units
    /// back with [`Limiter::refund`](crate::Limiter::refund) instead.
    #[must_use]
    pub fn count_if(mut self, f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.count_if = Some(Arc::new(f));
        self
    }

    /// The algorithm this rule decides with, given the limiter's default.
    pub(crate) fn algorithm_or(&self, default: Algorithm) -> Algorithm {
        self.algorithm.unwrap_or(default)
    }

    /// What is wrong with this rule as a concurrency rule, or with a rate rule given the
    /// concurrency rules' algorithm: checked when a limiter is built.
    pub(crate) fn check_kind(&self) -> Result<(), BuildError> {
        let bad = |why: &str| Err(BuildError::InvalidQuota(format!("rule {:?}: {why}", &*self.name)));
        match self.concurrent {
            None if self.algorithm == Some(Algorithm::Concurrent) => {
                bad("Algorithm::Concurrent is not a rate: build a concurrency rule with Rule::concurrent")
            }
            None => Ok(()),
            Some(0) => {
                bad("a concurrency rule needs n of at least 1 permit in flight (Rule::concurrent(name, n, key))")
            }
            Some(_) if self.hold < MIN_HOLD_LIMIT => {
                bad(&format!("a hold limit needs at least 3 ms (renewed every third of it), got {:?}", self.hold))
            }
            Some(_) if self.algorithm != Some(Algorithm::Concurrent) => {
                bad("a concurrency rule has no algorithm (it is not a rate): remove .algorithm(..)")
            }
            Some(_) if self.charged => bad("a concurrency rule cannot be charged: permits are given back, not spent"),
            Some(_) if self.count_if.is_some() => {
                bad("a concurrency rule cannot count by outcome: every permit is given back when its work ends")
            }
            Some(_) if self.block > Duration::ZERO || self.blockable => {
                bad("a concurrency rule cannot block keys: a refusal lasts until a permit is given back")
            }
            Some(_) => Ok(()),
        }
    }

    /// The parameters of a check of this rule.
    pub(crate) fn params(&self, quota: Quota, cost: u64) -> crate::algorithm::Params {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        // A concurrency rule's tier sets n; the period is always its hold limit.
        let quota = match self.concurrent {
            Some(_) => Quota::new(quota.limit(), self.quota.period()),
            None => quota,
        };
        crate::algorithm::Params {
            quota,
            cost,
            max_delay_us: micros(self.max_delay),
            ahead_us: 0,
            after_us: 0,
            block_us: micros(self.block),
            blockable: self.blockable,
            shadow: self.shadow,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Rule;

    #[test]
    fn a_tier_of_a_concurrency_rule_keeps_its_hold_limit_whatever_the_order() {
        let user = |u: &str| Some(u.to_owned());
        let hold = Duration::from_millis(300);
        for rule in [
            Rule::<str>::concurrent("jobs", 1, user).permits_fn(|_| Some(5)).hold_limit(hold),
            Rule::<str>::concurrent("jobs", 1, user).hold_limit(hold).permits_fn(|_| Some(5)),
        ] {
            let tier = (rule.quota_fn.as_ref().unwrap())("ada").unwrap();
            let p = rule.params(tier, 1);
            assert_eq!((p.quota.limit(), p.quota.period()), (5, hold));
            assert_eq!(rule.hold_limit_of(), Some(hold));
        }
    }
}
