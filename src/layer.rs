//! [`RateLimitLayer`], its [`Rule`]s and its builder: all configuration lives here.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower_layer::Layer;

use crate::algorithm::Params;
use crate::headers::HeaderStyle;
use crate::key::{Key, KeyExtractor};
use crate::runtime::{Breaker, Runtime};
use crate::service::RateLimit;
use crate::store::{Check, Store};
use crate::{Algorithm, BuildError, Decision, Quota, StoreError};

/// What happens when the store cannot decide (error, timeout, open circuit, overload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Let the request through (the default): the limiter is never why a request fails.
    /// A rate-limited warning is logged and `tollgate_fail_open_total` counted.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` with `Retry-After` (gRPC: `UNAVAILABLE`): for
    /// login or payment routes where an unlimited pass is worse than a refusal.
    Closed,
}

type Shared<B, T> = Arc<dyn Fn(&Request<B>) -> T + Send + Sync>;

/// One limit of a layer: a name, a quota, a key extractor, and options.
///
/// ```
/// use tollgate::{key, Algorithm, Quota, Rule};
///
/// let rule: Rule<axum::body::Body> = Rule::new("per-ip", Quota::per_minute(100), key::PeerIp)
///     .algorithm(Algorithm::Gcra)
///     .cost(|req: &http::Request<axum::body::Body>| if req.method() == "POST" { 5 } else { 1 });
/// ```
pub struct Rule<B> {
    pub(crate) name: Arc<str>,
    pub(crate) quota: Quota,
    pub(crate) quota_fn: Option<Shared<B, Option<Quota>>>,
    pub(crate) key: Arc<dyn KeyExtractor<B>>,
    pub(crate) algorithm: Option<Algorithm>,
    pub(crate) cost: Option<Shared<B, u64>>,
    pub(crate) fail_mode: Option<FailMode>,
    pub(crate) max_delay: Duration,
    pub(crate) shadow: bool,
    pub(crate) bypass: Option<Shared<B, bool>>,
    pub(crate) count_if: Option<Arc<dyn Fn(StatusCode) -> bool + Send + Sync>>,
}

impl<B> Clone for Rule<B> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            quota: self.quota,
            quota_fn: self.quota_fn.clone(),
            key: self.key.clone(),
            algorithm: self.algorithm,
            cost: self.cost.clone(),
            fail_mode: self.fail_mode,
            max_delay: self.max_delay,
            shadow: self.shadow,
            bypass: self.bypass.clone(),
            count_if: self.count_if.clone(),
        }
    }
}

impl<B> fmt::Debug for Rule<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("per_request_quota", &self.quota_fn.is_some())
            .field("algorithm", &self.algorithm)
            .field("cost", &self.cost.as_ref().map(|_| "fn"))
            .field("fail_mode", &self.fail_mode)
            .field("max_delay", &self.max_delay)
            .field("shadow", &self.shadow)
            .field("bypass", &self.bypass.as_ref().map(|_| "fn"))
            .field("count_if", &self.count_if.as_ref().map(|_| "fn"))
            .finish_non_exhaustive()
    }
}

impl<B> Rule<B> {
    /// A rule named `name` limiting each key to `quota`.
    pub fn new(name: impl Into<String>, quota: Quota, key: impl KeyExtractor<B>) -> Self {
        Self {
            name: name.into().into(),
            quota,
            quota_fn: None,
            key: Arc::new(key),
            algorithm: None,
            cost: None,
            fail_mode: None,
            max_delay: Duration::from_secs(10),
            shadow: false,
            bypass: None,
            count_if: None,
        }
    }

    /// The rule's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The algorithm (default: the layer's, itself defaulting to the sliding window counter).
    #[must_use]
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = Some(algorithm);
        self
    }

    /// Chooses the quota per request (tiers): `None` means "no limit for this request".
    /// The quota given to [`Rule::new`] is used for the headers' policy when this returns
    /// the same, and as documentation otherwise.
    #[must_use]
    pub fn quota_fn(mut self, f: impl Fn(&Request<B>) -> Option<Quota> + Send + Sync + 'static) -> Self {
        self.quota_fn = Some(Arc::new(f));
        self
    }

    /// The units a request consumes (default 1; 0 counts as 1).
    #[must_use]
    pub fn cost(mut self, f: impl Fn(&Request<B>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(f));
        self
    }

    /// What to do when the store fails, for this rule (default: the layer's).
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
    /// no rate-limit headers — to roll out a new limit safely.
    #[must_use]
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Requests for which `f` returns true bypass this rule (health checks, partners).
    #[must_use]
    pub fn bypass_if(mut self, f: impl Fn(&Request<B>) -> bool + Send + Sync + 'static) -> Self {
        self.bypass = Some(Arc::new(f));
        self
    }

    /// Count by outcome: a request's unit is taken before the call as usual, and given
    /// back afterwards unless `f(status)` is true — e.g. `|s| s == 401` so only failed
    /// logins count.
    #[must_use]
    pub fn count_if(mut self, f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.count_if = Some(Arc::new(f));
        self
    }
}

/// Details of a rejection, for [`RateLimitLayer::on_rejected`].
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The rule that rejected.
    pub rule: Arc<str>,
    /// Its decision (`retry_after`, `limit`, …).
    pub decision: Decision,
}

/// Builds the response of a rejected request. The middleware adds `Retry-After` and the
/// rate-limit headers to whatever it returns.
pub trait OnRejected<ResBody>: Send + Sync + 'static {
    /// The response for a rejected request.
    fn response(&self, rejection: &Rejection) -> Response<ResBody>;
}

/// The default rejection: `429 Too Many Requests` with an empty body.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRejection;

impl<ResBody: Default> OnRejected<ResBody> for DefaultRejection {
    fn response(&self, _: &Rejection) -> Response<ResBody> {
        let mut res = Response::new(ResBody::default());
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        res
    }
}

impl<F, ResBody> OnRejected<ResBody> for F
where
    F: Fn(&Rejection) -> Response<ResBody> + Send + Sync + 'static,
{
    fn response(&self, rejection: &Rejection) -> Response<ResBody> {
        self(rejection)
    }
}

/// Options of a layer that are not per rule.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) algorithm: Algorithm,
    pub(crate) headers: HeaderStyle,
    pub(crate) fail_mode: FailMode,
}

/// A [`tower_layer::Layer`] that limits requests by key, through a shared store.
///
/// Unlike `tower::limit::RateLimitLayer` — one window per service instance, no keys, and
/// backpressure in `poll_ready` — this layer decides per key, shares one limiter among
/// every clone of the service (and, with `RedisStore`, every server), never waits in
/// `poll_ready`, and answers over-limit requests with `429` (gRPC: `RESOURCE_EXHAUSTED`).
///
/// ```
/// use tollgate::{key, Algorithm, MemoryStore, Quota, RateLimitLayer};
///
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "hello" }))
///     .layer(
///         RateLimitLayer::new(Quota::per_minute(100), key::PeerIp, MemoryStore::new())
///             .algorithm(Algorithm::Gcra),
///     );
/// ```
///
/// Several rules, decided in one store call (a request rejected by one rule consumes
/// nothing from the others):
///
/// ```
/// use tollgate::{key, MemoryStore, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::<_, axum::body::Body>::builder(MemoryStore::new())
///     .rule("ip", Quota::per_minute(300), key::PeerIp)
///     .rule("api-key", Quota::per_minute(100), key::header("x-api-key"))
///     .rule("api-key-daily", Quota::per_day(10_000), key::header("x-api-key"))
///     .build()
///     .expect("rule names are unique");
/// # let _ = layer;
/// ```
pub struct RateLimitLayer<St, B, R = DefaultRejection> {
    pub(crate) store: Arc<St>,
    pub(crate) rules: Arc<[Rule<B>]>,
    pub(crate) options: Options,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) on_rejected: Arc<R>,
    _body: PhantomData<fn(B)>,
}

impl<St, B, R> Clone for RateLimitLayer<St, B, R> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            rules: self.rules.clone(),
            options: self.options.clone(),
            runtime: self.runtime.clone(),
            on_rejected: self.on_rejected.clone(),
            _body: PhantomData,
        }
    }
}

impl<St: fmt::Debug, B, R> fmt::Debug for RateLimitLayer<St, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("store", &self.store)
            .field("rules", &self.rules)
            .field("options", &self.options)
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl<St, B> RateLimitLayer<St, B> {
    /// One rule, named `"default"`: each key may use `quota`.
    pub fn new(quota: Quota, key: impl KeyExtractor<B>, store: St) -> Self {
        Self::from_parts(store, vec![Rule::new("default", quota, key)], Runtime::default())
    }

    /// A builder for several rules.
    pub fn builder(store: St) -> RateLimitLayerBuilder<St, B> {
        RateLimitLayerBuilder { store, rules: Vec::new(), runtime: Runtime::default() }
    }

    fn from_parts(store: St, rules: Vec<Rule<B>>, runtime: Runtime) -> Self {
        Self {
            store: Arc::new(store),
            rules: rules.into(),
            options: Options {
                algorithm: Algorithm::default(),
                headers: HeaderStyle::default(),
                fail_mode: FailMode::default(),
            },
            runtime: Arc::new(runtime),
            on_rejected: Arc::new(DefaultRejection),
            _body: PhantomData,
        }
    }
}

impl<St, B, R> RateLimitLayer<St, B, R> {
    /// The algorithm of every rule that does not choose its own
    /// (default: [`Algorithm::SlidingWindowCounter`]).
    #[must_use]
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.options.algorithm = algorithm;
        self
    }

    /// Which rate-limit headers responses carry (default: legacy `X-RateLimit-*`).
    #[must_use]
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.options.headers = style;
        self
    }

    /// What happens when the store fails, for rules that do not choose
    /// (default: [`FailMode::Open`]).
    #[must_use]
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.options.fail_mode = mode;
        self
    }

    /// The cost of a request for every rule that has none of its own (default 1).
    #[must_use]
    pub fn cost(mut self, f: impl Fn(&Request<B>) -> u64 + Send + Sync + 'static) -> Self {
        let f: Shared<B, u64> = Arc::new(f);
        let rules: Vec<Rule<B>> = self
            .rules
            .iter()
            .cloned()
            .map(|mut r| {
                r.cost.get_or_insert_with(|| f.clone());
                r
            })
            .collect();
        self.rules = rules.into();
        self
    }

    /// Builds rejections with `f` (status, body…); `Retry-After` and the rate-limit
    /// headers are still added.
    pub fn on_rejected<R2>(self, f: R2) -> RateLimitLayer<St, B, R2> {
        RateLimitLayer {
            store: self.store,
            rules: self.rules,
            options: self.options,
            runtime: self.runtime,
            on_rejected: Arc::new(f),
            _body: PhantomData,
        }
    }

    /// The deadline of every store call (default 50 ms): a store that has not answered by
    /// then is an error, handled by the fail mode.
    #[must_use]
    pub fn timeout(mut self, deadline: Duration) -> Self {
        self.runtime_mut().deadline = deadline;
        self
    }

    /// The most store calls in flight at once (default 1024); beyond it a request is a
    /// store error at once, never queued.
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.runtime_mut().max_in_flight = n.max(1);
        self
    }

    /// Circuit breaker: after `failures` consecutive store errors, stop calling the store
    /// for `cool_down`, then let one request probe it (default: 5 failures, 1 s).
    #[must_use]
    pub fn circuit_breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.runtime_mut().breaker = Breaker::new(failures, cool_down);
        self
    }

    /// An in-process limiter used while the store is failing, so fail-open is not
    /// "unlimited": each rule's limit is divided by `instances` (the expected number of
    /// servers; at least 1 unit per period).
    #[cfg(feature = "memory")]
    #[must_use]
    pub fn fallback(mut self, store: crate::MemoryStore, instances: u64) -> Self {
        self.runtime_mut().fallback = Some((store, instances.max(1)));
        self
    }

    /// Turns the local blocked-key cache on or off (default on): once a key is rejected
    /// with `retry_after = d`, this process rejects the same key and cost for `d` without
    /// asking the store. Exact, because other servers can only consume more.
    #[must_use]
    pub fn local_cache(mut self, on: bool) -> Self {
        self.runtime_mut().cache_enabled = on;
        self
    }

    fn runtime_mut(&mut self) -> &mut Runtime {
        if Arc::get_mut(&mut self.runtime).is_none() {
            self.runtime = Arc::new(self.runtime.fresh_copy());
        }
        Arc::get_mut(&mut self.runtime).expect("just made unique")
    }

    /// The layer's rules.
    #[must_use]
    pub fn rules(&self) -> &[Rule<B>] {
        &self.rules
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &St {
        &self.store
    }
}

/// Support tooling: look at and reset one key's state of one rule.
impl<St: Store, B, R> RateLimitLayer<St, B, R> {
    /// What rule `rule` would decide now for one unit of `key`, without consuming
    /// anything ("why is this customer limited?"): `remaining` counts what would be left
    /// after that unit. `Ok(None)` when the layer has no such rule. Uses the quota given to [`Rule::new`]: for a rule whose quota is chosen per
    /// request ([`Rule::quota_fn`]), use [`RateLimitLayer::peek_with`].
    ///
    /// # Errors
    ///
    /// The store's error (no deadline or circuit breaker applies here).
    pub async fn peek(&self, rule: &str, key: impl Into<Key>) -> Result<Option<Decision>, StoreError> {
        match self.rules.iter().find(|r| &*r.name == rule) {
            Some(r) => self.peek_with(rule, key, r.quota).await,
            None => Ok(None),
        }
    }

    /// [`RateLimitLayer::peek`] under `quota` (e.g. the key's tier).
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
        let Some(r) = self.rules.iter().find(|r| &*r.name == rule) else { return Ok(None) };
        let check = Check {
            rule: r.name.clone(),
            key: key.into(),
            algorithm: r.algorithm.unwrap_or(self.options.algorithm),
            params: Params { quota, cost: 1, max_delay_us: u64::try_from(r.max_delay.as_micros()).unwrap_or(u64::MAX) },
        };
        self.store.peek(&check).await.map(Some)
    }

    /// Forgets the state of `key` under rule `rule`, in the store and in this process's
    /// blocked-key cache: the key starts afresh. `Ok(false)` when the layer has no such
    /// rule. Other servers' blocked-key caches may still reject the key until their
    /// entry runs out (at most its `Retry-After`).
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn reset(&self, rule: &str, key: impl Into<Key>) -> Result<bool, StoreError> {
        let Some((i, r)) = self.rules.iter().enumerate().find(|(_, r)| &*r.name == rule) else { return Ok(false) };
        let key = key.into();
        self.store.reset(rule, &key, r.algorithm.unwrap_or(self.options.algorithm)).await?;
        self.runtime.cache.forget(i, &key);
        Ok(true)
    }
}

impl<S, St, B, R> Layer<S> for RateLimitLayer<St, B, R> {
    type Service = RateLimit<S, St, B, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.clone())
    }
}

/// Builds a [`RateLimitLayer`] with several rules; see [`RateLimitLayer::builder`].
pub struct RateLimitLayerBuilder<St, B> {
    store: St,
    rules: Vec<Rule<B>>,
    runtime: Runtime,
}

impl<St: fmt::Debug, B> fmt::Debug for RateLimitLayerBuilder<St, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder").field("store", &self.store).field("rules", &self.rules).finish()
    }
}

/// Longest rule name.
pub const MAX_RULE_NAME: usize = 64;

impl<St, B> RateLimitLayerBuilder<St, B> {
    /// Adds a rule with default options.
    #[must_use]
    pub fn rule(self, name: impl Into<String>, quota: Quota, key: impl KeyExtractor<B>) -> Self {
        self.add_rule(Rule::new(name, quota, key))
    }

    /// Adds a configured [`Rule`].
    #[must_use]
    pub fn add_rule(mut self, rule: Rule<B>) -> Self {
        self.rules.push(rule);
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`BuildError::DuplicateRule`] when two rules share a name,
    /// [`BuildError::InvalidRuleName`] for an empty or over-long name, and
    /// [`BuildError::InvalidConfig`] when there is no rule at all.
    pub fn build(self) -> Result<RateLimitLayer<St, B>, BuildError> {
        if self.rules.is_empty() {
            return Err(BuildError::InvalidConfig {
                rule: String::new(),
                field: "rule".into(),
                why: "a layer needs at least one rule".into(),
            });
        }
        for (i, r) in self.rules.iter().enumerate() {
            if r.name.is_empty() || r.name.len() > MAX_RULE_NAME {
                return Err(BuildError::InvalidRuleName {
                    name: r.name.to_string(),
                    why: format!("a rule name needs 1 to {MAX_RULE_NAME} bytes"),
                });
            }
            if self.rules[..i].iter().any(|o| o.name == r.name) {
                return Err(BuildError::DuplicateRule(r.name.to_string()));
            }
        }
        Ok(RateLimitLayer::from_parts(self.store, self.rules, self.runtime))
    }
}
