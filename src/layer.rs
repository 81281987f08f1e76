//! [`RateLimitLayer`] and its builder: the HTTP adapter of a [`Limiter`]. Every service
//! it makes shares the one limiter.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::head::RequestHead;
use crate::headers::HeaderStyle;
use crate::key::{Key, KeyExtractor};
use crate::limiter::{Limiter, LimiterBuilder};
use crate::quota::Quota;
use crate::report::Shared;
use crate::response::{DefaultRejection, DefaultUnavailable, Rejection, Responder, Unavailable};
use crate::rule::Rule;
use crate::service::RateLimit;
use crate::store::Store;
use crate::HttpLimiter;

/// A [`tower_layer::Layer`] that limits requests by key, through a shared store.
///
/// Unlike `tower::limit::RateLimitLayer` — one window per service instance, no keys, and
/// backpressure in `poll_ready` — this layer decides per key, shares one [`Limiter`]
/// among every clone of the service (and, with `RedisStore`, every server), never waits
/// in `poll_ready`, and answers over-limit requests with `429` (gRPC:
/// `RESOURCE_EXHAUSTED`).
///
/// ```
/// use tollgate::{key, MemoryStore, Quota, RateLimitLayer};
///
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "hello" }))
///     .layer(
///         RateLimitLayer::new(Quota::per_minute(100), key::PeerIp, MemoryStore::new()),
///     );
/// ```
///
/// Several rules, decided in one store call (a request rejected by one rule consumes
/// nothing from the others):
///
/// ```
/// use tollgate::{key, Algorithm, MemoryStore, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .rule("ip", Quota::per_minute(300), key::PeerIp)
///     .algorithm(Algorithm::Gcra)
///     .rule("api-key", Quota::per_minute(100), key::header("x-api-key"))
///     .rule("api-key-daily", Quota::per_day(10_000), key::header("x-api-key"))
///     .build()
///     .expect("rule names are unique");
/// # let _ = layer;
/// ```
pub struct RateLimitLayer<St, R = DefaultRejection, U = DefaultUnavailable> {
    // What every service of the layer shares, made once: a service (axum makes one per
    // request for a route's layer) costs one reference count.
    shared: Arc<Shared<St, R, U>>,
}

impl<St, R, U> Clone for RateLimitLayer<St, R, U> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone() }
    }
}

impl<St: fmt::Debug, R, U> fmt::Debug for RateLimitLayer<St, R, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("headers", &self.shared.responder.style)
            .finish_non_exhaustive()
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// One rule, named `"default"`: each key may use `quota`, counted with the default
    /// algorithm ([`Algorithm::SlidingWindowCounter`](crate::Algorithm)); any other
    /// setting is made on [`RateLimitLayer::builder`].
    ///
    /// Two layers from `new` over one store (say on two routes) both name their rule
    /// `"default"`, so they share one count: `/upload`'s requests use up `/search`'s
    /// limit; the name stays theirs while either lives, and any other name stays its
    /// layer's own. This is said once per process on stderr, and as a `tracing` warning
    /// each time. Name the rules to count apart —
    /// `RateLimitLayer::builder(store).rule("search", quota, key).build()`, which refuses a
    /// name in use with [`BuildError::RuleInUse`](crate::BuildError::RuleInUse) — as rule
    /// names are what servers sharing a Redis agree on. Clones of one layer share one
    /// limiter and are fine.
    pub fn new(quota: Quota, key: impl KeyExtractor<RequestHead>, store: St) -> Self {
        let builder = Self::builder(store).sharing().rule("default", quota, key);
        builder.build().unwrap_or_else(|err| unreachable!("one valid rule, sharing its name on a clash: {err}"))
    }
}

impl<St> RateLimitLayer<St> {
    /// A builder for several rules and every setting of the limiter (algorithm, fail
    /// mode, deadline, breaker, fallback…): the same [`LimiterBuilder`] as
    /// [`Limiter::builder`]'s, whose `build` makes the layer.
    pub fn builder(store: St) -> LimiterBuilder<St, RequestHead, Self> {
        LimiterBuilder::new(store, "e.g. RateLimitLayer::builder(store).rule(\"search\", quota, key)")
    }

    /// The layer of a limiter built with [`Limiter::builder`], which holds every setting
    /// but the HTTP ones ([`RateLimitLayer::headers`], [`RateLimitLayer::on_rejected`],
    /// [`RateLimitLayer::on_unavailable`]), set on the layer. Takes the limiter, or an
    /// `Arc` of it that the application keeps too (an `AppState` field, a job loop's
    /// argument: `Arc<HttpLimiter<St>>`).
    pub fn from_limiter(limiter: impl Into<Arc<HttpLimiter<St>>>) -> Self {
        let limiter = limiter.into();
        let style = limiter.headers.unwrap_or_default();
        Self::assemble(limiter, style, Arc::new(DefaultRejection), Arc::new(DefaultUnavailable))
    }
}

impl<St, R, U> RateLimitLayer<St, R, U> {
    fn assemble(
        limiter: Arc<Limiter<St, RequestHead>>,
        style: HeaderStyle,
        on_rejected: Arc<R>,
        on_unavailable: Arc<U>,
    ) -> Self {
        Self { shared: Arc::new(Shared { limiter, responder: Responder { style, on_rejected, on_unavailable } }) }
    }

    /// Which rate-limit headers responses carry (default: legacy `X-RateLimit-*`).
    #[must_use]
    pub fn headers(self, style: HeaderStyle) -> Self {
        let Shared { limiter, responder } = &*self.shared;
        Self::assemble(limiter.clone(), style, responder.on_rejected.clone(), responder.on_unavailable.clone())
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
    /// let layer = RateLimitLayer::new(Quota::per_minute(10), key::PeerIp, MemoryStore::new())
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
    pub fn on_rejected<F, ResBody>(self, f: F) -> RateLimitLayer<St, F, U>
    where
        F: Fn(&Rejection<'_>) -> http::Response<ResBody> + Send + Sync + 'static,
    {
        self.on_rejected_with(f)
    }

    /// Builds rejections with any [`OnRejected`](crate::response::OnRejected) (a type of your own,
    /// rather than a closure).
    pub fn on_rejected_with<R2>(self, handler: R2) -> RateLimitLayer<St, R2, U> {
        let Shared { limiter, responder } = &*self.shared;
        RateLimitLayer::assemble(limiter.clone(), responder.style, Arc::new(handler), responder.on_unavailable.clone())
    }

    /// Builds the `503` of a request refused because the store could not decide under
    /// [`FailMode::Closed`](crate::FailMode::Closed) (default: an empty `503`); `Retry-After` is added to what it
    /// returns.
    pub fn on_unavailable<F, ResBody>(self, f: F) -> RateLimitLayer<St, R, F>
    where
        F: Fn(&Unavailable<'_>) -> http::Response<ResBody> + Send + Sync + 'static,
    {
        let Shared { limiter, responder } = &*self.shared;
        RateLimitLayer::assemble(limiter.clone(), responder.style, responder.on_rejected.clone(), Arc::new(f))
    }

    /// A handle that changes the layer's rules while it serves: a quota with
    /// [`LimiterHandle::set_quota`], or every rule from a configuration with
    /// [`LimiterHandle::reload`](crate::LimiterHandle::reload) (feature `config`).
    ///
    /// ```
    /// use tollgate::{key, MemoryStore, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
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
    pub fn handle(&self) -> crate::limiter::LimiterHandle<RequestHead> {
        self.shared.limiter.handle()
    }

    /// The layer's rules.
    #[must_use]
    pub fn rules(&self) -> Arc<[Rule<RequestHead>]> {
        self.shared.limiter.rules()
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &St {
        self.shared.limiter.store()
    }

    /// The limiter every service of this layer shares: a job loop, a WebSocket handler
    /// or an admin task asks it by key ([`Limiter::check_key`], [`Limiter::block`]) and
    /// uses up the same counts as the layer's requests. Clone the `Arc` to keep it: its
    /// type is `Arc<HttpLimiter<St>>` ([`HttpLimiter`]).
    #[must_use]
    pub fn limiter(&self) -> &Arc<HttpLimiter<St>> {
        &self.shared.limiter
    }
}

/// Support tooling: look at, reset and block one key's state of one rule (see
/// [`Limiter::peek`]).
impl<St: Store, R, U> RateLimitLayer<St, R, U> {
    /// [`Limiter::peek`]: what rule `rule` would decide now for one unit of `key`,
    /// without consuming anything.
    ///
    /// # Errors
    ///
    /// As [`Limiter::peek`].
    pub async fn peek(&self, rule: &str, key: impl Into<Key>) -> Result<Decision, StoreError> {
        self.shared.limiter.peek(rule, key).await
    }

    /// [`Limiter::peek_with`]: [`RateLimitLayer::peek`] under `quota` (e.g. the key's tier).
    ///
    /// # Errors
    ///
    /// As [`Limiter::peek_with`].
    pub async fn peek_with(&self, rule: &str, key: impl Into<Key>, quota: Quota) -> Result<Decision, StoreError> {
        self.shared.limiter.peek_with(rule, key, quota).await
    }

    /// [`Limiter::reset`]: forgets the state of `key` under rule `rule`.
    ///
    /// # Errors
    ///
    /// As [`Limiter::reset`].
    pub async fn reset(&self, rule: &str, key: impl Into<Key>) -> Result<(), StoreError> {
        self.shared.limiter.reset(rule, key).await
    }

    /// [`Limiter::block`]: refuses `key` under rule `rule` for `duration`, on every server
    /// that shares the store.
    ///
    /// # Errors
    ///
    /// As [`Limiter::block`].
    pub async fn block(&self, rule: &str, key: impl Into<Key>, duration: Duration) -> Result<(), StoreError> {
        self.shared.limiter.block(rule, key, duration).await
    }
}

impl<St, R, U> RateLimitLayer<St, R, U> {
    /// This layer, each response's permits of concurrency rules
    /// ([`Rule::concurrent`](crate::Rule::concurrent)) held until its body ends (a
    /// [`HoldPermitsLayer`](crate::HoldPermitsLayer): the body becomes a
    /// [`PermitBody`](crate::hold::PermitBody)). Without it, permits are given back when
    /// the server drops the response's head (once its headers are written), before a
    /// streamed body ends.
    pub fn hold_permits(self) -> crate::hold::HoldPermitsLayer<Self> {
        crate::hold::HoldPermitsLayer::new(self)
    }
}

impl<S, St, R, U> Layer<S> for RateLimitLayer<St, R, U> {
    type Service = RateLimit<S, St, R, U>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.shared.clone())
    }
}

/// The HTTP setting of a layer's builder.
impl<St> LimiterBuilder<St, RequestHead, RateLimitLayer<St>> {
    /// Which rate-limit headers responses carry (default: legacy `X-RateLimit-*`): the
    /// layer's style, which a later [`RateLimitLayer::headers`] replaces and a reloaded
    /// configuration that names `headers` overrides.
    #[must_use]
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = Some(style);
        self
    }
}

impl<St> From<Limiter<St, RequestHead>> for RateLimitLayer<St> {
    fn from(limiter: Limiter<St, RequestHead>) -> Self {
        Self::from_limiter(limiter)
    }
}
