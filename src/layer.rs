//! [`RateLimitLayer`] and its builder: the HTTP adapter of a [`Limiter`]. Every service
//! it makes shares the one limiter.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tower_layer::Layer;

use crate::headers::HeaderStyle;
use crate::key::{Key, KeyExtractor};
use crate::limiter::{Config, LimiterBuilder};
use crate::response::{DefaultRejection, DefaultUnavailable, Rejection, Responder, Unavailable};
use crate::service::RateLimit;
use crate::store::Store;
use crate::{Algorithm, BuildError, Decision, FailMode, Limiter, Quota, Rule, StoreError};

/// A [`tower_layer::Layer`] that limits requests by key, through a shared store.
///
/// Unlike `tower::limit::RateLimitLayer` — one window per service instance, no keys, and
/// backpressure in `poll_ready` — this layer decides per key, shares one [`Limiter`]
/// among every clone of the service (and, with `RedisStore`, every server), never waits
/// in `poll_ready`, and answers over-limit requests with `429` (gRPC:
/// `RESOURCE_EXHAUSTED`).
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
pub struct RateLimitLayer<St, B, R = DefaultRejection, U = DefaultUnavailable> {
    limiter: Arc<Limiter<St, Request<B>>>,
    style: HeaderStyle,
    on_rejected: Arc<R>,
    on_unavailable: Arc<U>,
}

impl<St, B, R, U> Clone for RateLimitLayer<St, B, R, U> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            style: self.style,
            on_rejected: self.on_rejected.clone(),
            on_unavailable: self.on_unavailable.clone(),
        }
    }
}

impl<St: fmt::Debug, B, R, U> fmt::Debug for RateLimitLayer<St, B, R, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("headers", &self.style)
            .finish_non_exhaustive()
    }
}

impl<St: Store, B: 'static> RateLimitLayer<St, B> {
    /// One rule, named `"default"`: each key may use `quota`.
    ///
    /// # Panics
    ///
    /// When another live layer (or limiter) over this store already has a rule named
    /// `"default"`: two layers from `new` on one store (say on two routes) would count
    /// into one state, so that `/upload`'s requests use up `/search`'s limit. Name the
    /// rules instead — `RateLimitLayer::builder(store).rule("search", quota, key).build()`
    /// — as rule names are what servers sharing a Redis agree on. Clones of one layer (on
    /// several routes) share one limiter and are fine.
    pub fn new(quota: Quota, key: impl KeyExtractor<Request<B>>, store: St) -> Self {
        match Limiter::builder(store).for_layer().rule("default", quota, key).build() {
            Ok(limiter) => Self::from_limiter(limiter),
            Err(err) => panic!("RateLimitLayer::new: {err}"),
        }
    }
}

impl<St, B: 'static> RateLimitLayer<St, B> {
    /// A builder for several rules.
    pub fn builder(store: St) -> RateLimitLayerBuilder<St, B> {
        RateLimitLayerBuilder { inner: Limiter::builder(store).for_layer() }
    }

    /// The layer of a limiter built with [`Limiter::builder`], which holds every setting
    /// but the HTTP ones ([`RateLimitLayer::headers`], [`RateLimitLayer::on_rejected`]).
    pub fn from_limiter(limiter: Limiter<St, Request<B>>) -> Self {
        Self {
            limiter: Arc::new(limiter),
            style: HeaderStyle::default(),
            on_rejected: Arc::new(DefaultRejection),
            on_unavailable: Arc::new(DefaultUnavailable),
        }
    }
}

impl<St, B: 'static, R, U> RateLimitLayer<St, B, R, U> {
    /// The limiter for the settings below: a clone of this layer already handed to a
    /// service keeps the limiter it has, so this one gets its own.
    fn configure(mut self, f: impl FnOnce(&mut Config<'_, Request<B>>)) -> Self {
        if Arc::get_mut(&mut self.limiter).is_none() {
            self.limiter = Arc::new(self.limiter.fresh_copy());
        }
        Arc::get_mut(&mut self.limiter).expect("just made unique").configure(f);
        self
    }

    /// The algorithm of every rule that does not choose its own
    /// (default: [`Algorithm::SlidingWindowCounter`]).
    #[must_use]
    pub fn algorithm(self, algorithm: Algorithm) -> Self {
        self.configure(|c| *c.algorithm = algorithm)
    }

    /// Which rate-limit headers responses carry (default: legacy `X-RateLimit-*`).
    #[must_use]
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.style = style;
        self
    }

    /// What happens when the store fails, for rules that do not choose
    /// (default: [`FailMode::Open`]).
    #[must_use]
    pub fn fail_mode(self, mode: FailMode) -> Self {
        self.configure(|c| *c.fail_mode = mode)
    }

    /// The cost of a request for every rule that has none of its own (default 1).
    #[must_use]
    pub fn cost(self, f: impl Fn(&Request<B>) -> u64 + Send + Sync + 'static) -> Self {
        self.configure(|c| *c.cost = Some(Arc::new(f)))
    }

    /// Builds rejections with `f` (status, body…) from the [`Rejection`]: the rule, its
    /// decision, who decided, and the request's head; `Retry-After` and the rate-limit
    /// headers are added to what it returns. [`response::text`] and [`response::json`]
    /// are ready-made ones.
    ///
    /// ```
    /// use axum::body::Body;
    /// use http::{header::ACCEPT, Response, StatusCode};
    /// use tollgate::{key, MemoryStore, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::<_, Body>::new(Quota::per_minute(10), key::PeerIp, MemoryStore::new())
    ///     .on_rejected(|r| {
    ///         let wait = r.decision.retry_after_secs().unwrap_or(60);
    ///         let html = r.headers.get(ACCEPT).is_some_and(|a| a.as_bytes().starts_with(b"text/html"));
    ///         let body = if html { format!("<p>Slow down: {wait} s</p>") } else { format!("slow down: {wait} s") };
    ///         let mut res = Response::new(Body::from(body));
    ///         *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///         res
    ///     });
    /// # let _ = layer;
    /// ```
    ///
    /// [`response::text`]: crate::response::text
    /// [`response::json`]: crate::response::json
    pub fn on_rejected<F, ResBody>(self, f: F) -> RateLimitLayer<St, B, F, U>
    where
        F: Fn(&Rejection<'_>) -> http::Response<ResBody> + Send + Sync + 'static,
    {
        self.on_rejected_with(f)
    }

    /// Builds rejections with any [`OnRejected`](crate::OnRejected) (a type of your own,
    /// rather than a closure).
    pub fn on_rejected_with<R2>(self, handler: R2) -> RateLimitLayer<St, B, R2, U> {
        RateLimitLayer {
            limiter: self.limiter,
            style: self.style,
            on_rejected: Arc::new(handler),
            on_unavailable: self.on_unavailable,
        }
    }

    /// Builds the `503` of a request refused because the store could not decide under
    /// [`FailMode::Closed`] (default: an empty `503`); `Retry-After` is added to what it
    /// returns.
    pub fn on_unavailable<F, ResBody>(self, f: F) -> RateLimitLayer<St, B, R, F>
    where
        F: Fn(&Unavailable<'_>) -> http::Response<ResBody> + Send + Sync + 'static,
    {
        RateLimitLayer {
            limiter: self.limiter,
            style: self.style,
            on_rejected: self.on_rejected,
            on_unavailable: Arc::new(f),
        }
    }

    /// The deadline of every store call (default 50 ms): a store that has not answered by
    /// then is an error, handled by the fail mode.
    #[must_use]
    pub fn timeout(self, deadline: Duration) -> Self {
        self.configure(|c| *c.deadline = deadline)
    }

    /// The most store calls in flight at once (default 1024); beyond it a request is a
    /// store error at once, never queued.
    #[must_use]
    pub fn max_in_flight(self, n: usize) -> Self {
        self.configure(|c| c.settings.max_in_flight = n.max(1))
    }

    /// Circuit breaker: after `failures` consecutive store errors, stop calling the store
    /// for `cool_down`, then let one request probe it (default: 5 failures, 1 s).
    #[must_use]
    pub fn circuit_breaker(self, failures: u32, cool_down: Duration) -> Self {
        self.configure(|c| c.settings.breaker = (failures, cool_down))
    }

    /// An in-process limiter used while the store is failing, so fail-open is not
    /// "unlimited": each rule's limit is divided by `instances` (the expected number of
    /// servers; at least 1 unit per period).
    #[cfg(feature = "memory")]
    #[must_use]
    pub fn fallback(self, store: crate::MemoryStore, instances: u64) -> Self {
        self.configure(|c| c.settings.fallback = Some((store, instances.max(1))))
    }

    /// Turns the local blocked-key cache on or off (default on): once a key is rejected
    /// with `retry_after = d`, this process rejects the same key and cost for `d` without
    /// asking the store. Exact, because other servers can only consume more.
    #[must_use]
    pub fn local_cache(self, on: bool) -> Self {
        self.configure(|c| c.settings.cache_enabled = on)
    }

    /// The share of a quota in use from which an allowed decision counts in
    /// `tollgate_near_limit_total` (default 0.8); see
    /// [`LimiterBuilder::near_limit`](crate::LimiterBuilder::near_limit).
    ///
    /// # Panics
    ///
    /// When `share` is not in (0, 1].
    #[must_use]
    pub fn near_limit(self, share: f64) -> Self {
        crate::runtime::check_near_limit(share);
        self.configure(|c| c.settings.near_limit = share)
    }

    /// A handle that changes the layer's rules while it serves: a quota with
    /// [`LimiterHandle::set_quota`], or every rule from a configuration with
    /// [`LimiterHandle::reload`](crate::LimiterHandle::reload) (feature `config`). Take it
    /// after the layer's builder methods: one called after this gives the layer rules of
    /// its own.
    ///
    /// ```
    /// use tollgate::{key, MemoryStore, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::<_, axum::body::Body>::builder(MemoryStore::new())
    ///     .rule("api", Quota::per_minute(100), key::PeerIp)
    ///     .build()
    ///     .unwrap();
    /// let handle = layer.handle();
    /// let app: axum::Router = axum::Router::new().layer(layer);
    /// // Later, from an admin endpoint or a config watcher:
    /// handle.set_quota("api", Quota::per_minute(50)).unwrap();
    /// # let _ = app;
    /// ```
    ///
    /// [`LimiterHandle::set_quota`]: crate::LimiterHandle::set_quota
    #[must_use]
    pub fn handle(&self) -> crate::LimiterHandle<Request<B>> {
        self.limiter.handle()
    }

    /// The layer's rules.
    #[must_use]
    pub fn rules(&self) -> Arc<[Rule<Request<B>>]> {
        self.limiter.rules()
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &St {
        self.limiter.store()
    }

    /// The limiter every service of this layer shares: a job loop, a WebSocket handler
    /// or an admin task asks it by key ([`Limiter::check_key`], [`Limiter::block`]) and
    /// uses up the same counts as the layer's requests.
    #[must_use]
    pub fn limiter(&self) -> &Arc<Limiter<St, Request<B>>> {
        &self.limiter
    }
}

/// Support tooling: look at, reset and block one key's state of one rule (see
/// [`Limiter::peek`]).
impl<St: Store, B: 'static, R, U> RateLimitLayer<St, B, R, U> {
    /// [`Limiter::peek`]: what rule `rule` would decide now for one unit of `key`,
    /// without consuming anything.
    ///
    /// # Errors
    ///
    /// The store's error (no deadline or circuit breaker applies here).
    pub async fn peek(&self, rule: &str, key: impl Into<Key>) -> Result<Option<Decision>, StoreError> {
        self.limiter.peek(rule, key).await
    }

    /// [`Limiter::peek_with`]: [`RateLimitLayer::peek`] under `quota` (e.g. the key's tier).
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
        self.limiter.peek_with(rule, key, quota).await
    }

    /// [`Limiter::reset`]: forgets the state of `key` under rule `rule`.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn reset(&self, rule: &str, key: impl Into<Key>) -> Result<bool, StoreError> {
        self.limiter.reset(rule, key).await
    }

    /// [`Limiter::block`]: refuses `key` under rule `rule` for `duration`, on every server
    /// that shares the store.
    ///
    /// # Errors
    ///
    /// As [`Limiter::block`].
    pub async fn block(&self, rule: &str, key: impl Into<Key>, duration: Duration) -> Result<bool, StoreError> {
        self.limiter.block(rule, key, duration).await
    }
}

impl<S, St, B: 'static, R, U> Layer<S> for RateLimitLayer<St, B, R, U> {
    type Service = RateLimit<S, St, B, R, U>;

    fn layer(&self, inner: S) -> Self::Service {
        let responder = Responder {
            style: self.style,
            on_rejected: self.on_rejected.clone(),
            on_unavailable: self.on_unavailable.clone(),
        };
        RateLimit::new(inner, self.limiter.clone(), responder)
    }
}

/// Builds a [`RateLimitLayer`] with several rules; see [`RateLimitLayer::builder`].
pub struct RateLimitLayerBuilder<St, B> {
    inner: LimiterBuilder<St, Request<B>>,
}

impl<St: fmt::Debug, B> fmt::Debug for RateLimitLayerBuilder<St, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimitLayerBuilder").field(&self.inner).finish()
    }
}

impl<St, B: 'static> RateLimitLayerBuilder<St, B> {
    /// Adds a rule with default options.
    #[must_use]
    pub fn rule(self, name: impl Into<String>, quota: Quota, key: impl KeyExtractor<Request<B>>) -> Self {
        Self { inner: self.inner.rule(name, quota, key) }
    }

    /// Adds a configured [`Rule`].
    #[must_use]
    pub fn add_rule(self, rule: Rule<Request<B>>) -> Self {
        Self { inner: self.inner.add_rule(rule) }
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`BuildError::DuplicateRule`] when two rules share a name,
    /// [`BuildError::InvalidRuleName`] for an empty or over-long name, and
    /// [`BuildError::InvalidConfig`] when there is no rule at all, and
    /// [`BuildError::RuleInUse`] when another live layer or limiter over this store uses
    /// one of the names.
    pub fn build(self) -> Result<RateLimitLayer<St, B>, BuildError>
    where
        St: Store,
    {
        self.inner.build().map(RateLimitLayer::from_limiter)
    }
}
