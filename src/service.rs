//! [`RateLimit`]: the service. `poll_ready` only forwards; `call` decides.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use smallvec::SmallVec;
use tokio::time::Instant;
use tower_service::Service;

use crate::algorithm::Params;
use crate::future::ResponseFuture;
use crate::headers::{self, HeaderStyle, Outcome};
use crate::layer::{OnRejected, RateLimitLayer, Rejection};
use crate::runtime::{Admit, InFlight};
use crate::store::{Check, Decisions, Store};
use crate::{Decision, FailMode, Quota, StoreError};

/// The service built by [`RateLimitLayer`]. Clones share one limiter.
pub struct RateLimit<S, St, B, R> {
    inner: S,
    shared: Arc<RateLimitLayer<St, B, R>>,
}

impl<S: Clone, St, B, R> Clone for RateLimit<S, St, B, R> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), shared: self.shared.clone() }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, B, R> fmt::Debug for RateLimit<S, St, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).field("layer", &self.shared).finish()
    }
}

impl<S, St, B, R> RateLimit<S, St, B, R> {
    pub(crate) fn new(inner: S, layer: RateLimitLayer<St, B, R>) -> Self {
        Self { inner, shared: Arc::new(layer) }
    }
}

impl<S, St, B, R, ResBody> Service<Request<B>> for RateLimit<S, St, B, R>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    St: Store,
    B: Send + 'static,
    R: OnRejected<ResBody>,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Take the instance poll_ready made ready; leave a clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(Box::pin(handle(self.shared.clone(), inner, req)))
    }
}

/// The checks of one request for one kind of rule (enforced or shadow), with, for each,
/// the index of its rule and its quota. Up to `N` rules are kept inline: no allocation per
/// request, in a future that stays small (it is boxed once per request).
#[derive(Default)]
struct Plan<const N: usize> {
    checks: SmallVec<[Check; N]>,
    rules: SmallVec<[(usize, Quota); N]>,
}

impl<const N: usize> Plan<N> {
    fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

async fn handle<S, St, B, R, ResBody>(
    layer: Arc<RateLimitLayer<St, B, R>>,
    mut inner: S,
    mut req: Request<B>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    St: Store,
    B: 'static,
    R: OnRejected<ResBody>,
    ResBody: Default,
{
    let (enforced, shadow) = plan(&layer, &req);
    if enforced.is_empty() && shadow.is_empty() {
        return inner.call(req).await;
    }
    let grpc = is_grpc(&req);
    let remote = !layer.store.is_local();
    let rt = &layer.runtime;

    // Local blocked-key cache: a key known to be rejected is rejected with no store call.
    if remote && rt.cache_enabled {
        let now = rt.mono_us();
        for (check, &(rule, quota)) in enforced.checks.iter().zip(&enforced.rules) {
            if layer.rules[rule].count_if.is_some() {
                continue; // units may be given back: a rejection is not final
            }
            if let Some(left) = rt.cache.blocked(rule, &check.key, check.params.cost, quota, now) {
                crate::metrics::decision(&check.rule, "local_rejected");
                let decision = Decision {
                    allowed: false,
                    limit: quota.limit(),
                    remaining: 0,
                    reset_after: left,
                    retry_after: Some(left),
                    delay: Duration::ZERO,
                };
                let all = [Outcome { rule: &check.rule, quota, decision: &decision }];
                return Ok(reject(&layer, &all[0], &all, grpc));
            }
        }
    }

    let started = Instant::now();
    let (result, shadow_result) = if shadow.is_empty() {
        (decide(&layer, &enforced.checks).await, Ok(Decisions::new()))
    } else if enforced.is_empty() {
        (Ok(Decisions::new()), decide(&layer, &shadow.checks).await)
    } else {
        // The shadow call boxed: both calls inline would double the request's future.
        tokio::join!(decide(&layer, &enforced.checks), Box::pin(decide(&layer, &shadow.checks)))
    };
    let store_latency = started.elapsed();

    if let Ok(ds) = &shadow_result {
        for (check, d) in shadow.checks.iter().zip(ds) {
            let outcome = if d.allowed { "allowed" } else { "shadow_rejected" };
            crate::metrics::decision(&check.rule, outcome);
            if !d.allowed {
                tracing::info!(rule = %check.rule, key = ?check.key, "tollgate: shadow rule would reject");
            }
        }
    }

    let decisions = match result {
        Ok(ds) => ds,
        Err(err) => {
            crate::metrics::store_error(&err);
            let closed = enforced
                .rules
                .iter()
                .any(|&(r, _)| layer.rules[r].fail_mode.unwrap_or(layer.options.fail_mode) == FailMode::Closed);
            rt.warn_store_failure(&err, !closed);
            if closed {
                crate::metrics::fail_closed();
                return Ok(unavailable(grpc, &err));
            }
            crate::metrics::fail_open();
            return inner.call(req).await;
        }
    };

    let outcomes: SmallVec<[Outcome<'_>; 2]> = enforced
        .checks
        .iter()
        .zip(&enforced.rules)
        .zip(&decisions)
        .map(|((c, &(_, quota)), d)| Outcome { rule: &c.rule, quota, decision: d })
        .collect();
    for o in &outcomes {
        tracing::debug!(
            rule = %o.rule,
            allowed = o.decision.allowed,
            remaining = o.decision.remaining,
            store_latency_us = u64::try_from(store_latency.as_micros()).unwrap_or(u64::MAX),
            "tollgate decision"
        );
        crate::metrics::decision(o.rule, if o.decision.allowed { "allowed" } else { "rejected" });
    }

    if decisions.iter().any(|d| !d.allowed) {
        // The rejecting rule that makes the client wait longest (never = longest).
        let worst = outcomes
            .iter()
            .filter(|o| !o.decision.allowed)
            .max_by_key(|o| o.decision.retry_after.unwrap_or(Duration::MAX))
            .expect("one rejected");
        if remote && rt.cache_enabled {
            let now = rt.mono_us();
            for ((check, &(rule, quota)), d) in enforced.checks.iter().zip(&enforced.rules).zip(&decisions) {
                if let (false, Some(retry), None) = (d.allowed, d.retry_after, &layer.rules[rule].count_if) {
                    rt.cache.insert(rule, &check.key, check.params.cost, quota, now, retry);
                }
            }
        }
        return Ok(reject(&layer, worst, &outcomes, grpc));
    }

    // Allowed. Leaky-bucket rules shape: wait for the slot.
    let delay = decisions.iter().map(|d| d.delay).max().unwrap_or(Duration::ZERO);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let most = outcomes.iter().min_by_key(|o| o.decision.remaining);
    if let Some(m) = most {
        req.extensions_mut().insert(m.decision.clone());
    }
    let mut res = inner.call(req).await?;
    if let Some(m) = most {
        if layer.options.headers != HeaderStyle::None {
            headers::apply(res.headers_mut(), layer.options.headers, m, &outcomes, layer.rules.len() > 1);
        }
    }

    // Count by outcome: give back the units of rules that do not count this status.
    let status = res.status();
    let refunds: Vec<Check> = enforced
        .checks
        .iter()
        .zip(&enforced.rules)
        .filter(|(_, &(rule, _))| layer.rules[rule].count_if.as_ref().is_some_and(|f| !f(status)))
        .map(|(c, _)| c.clone())
        .collect();
    if !refunds.is_empty() {
        drop(outcomes);
        let store = layer.store.clone();
        tokio::spawn(async move {
            if let Err(err) = store.refund(&refunds).await {
                tracing::warn!(error = %err, "tollgate: could not give back units of a count-by-outcome rule");
            }
        });
    }
    Ok(res)
}

/// The checks of `req`: (enforced, shadow). Two enforced rules (say per IP and per key)
/// and one shadow rule fit inline.
fn plan<St, B: 'static, R>(layer: &RateLimitLayer<St, B, R>, req: &Request<B>) -> (Plan<2>, Plan<1>) {
    let mut enforced = Plan::default();
    let mut shadow = Plan::default();
    for (i, rule) in layer.rules.iter().enumerate() {
        if rule.bypass.as_ref().is_some_and(|f| f(req)) {
            continue;
        }
        let Some(key) = rule.key.extract(req) else { continue };
        let quota = match &rule.quota_fn {
            Some(f) => match f(req) {
                Some(q) => q,
                None => continue,
            },
            None => rule.quota,
        };
        let cost = rule.cost.as_ref().map_or(1, |f| f(req).max(1));
        let params =
            Params { quota, cost, max_delay_us: u64::try_from(rule.max_delay.as_micros()).unwrap_or(u64::MAX) };
        let check = Check {
            rule: rule.name.clone(),
            key,
            algorithm: rule.algorithm.unwrap_or(layer.options.algorithm),
            params,
        };
        if rule.shadow {
            shadow.checks.push(check);
            shadow.rules.push((i, quota));
        } else {
            enforced.checks.push(check);
            enforced.rules.push((i, quota));
        }
    }
    (enforced, shadow)
}

/// One store call: `check_one` for one rule (no `Vec`), else `check`.
async fn ask<St: Store>(store: &St, checks: &[Check]) -> Result<Decisions, StoreError> {
    match checks {
        [one] => store.check_one(one).await.map(|d| smallvec::smallvec![d]),
        _ => store.check(checks).await.map(Decisions::from_vec),
    }
}

/// One store call with the deadline, in-flight cap and circuit breaker; the fallback
/// limiter when the store fails.
async fn decide<St: Store, B, R>(layer: &RateLimitLayer<St, B, R>, checks: &[Check]) -> Result<Decisions, StoreError> {
    if layer.store.is_local() {
        return ask(&layer.store, checks).await;
    }
    let rt = &layer.runtime;
    let result = match rt.breaker.admit(rt.mono_us()) {
        Admit::Refuse(left) => Err(StoreError::CircuitOpen(left)),
        Admit::Call { probe } => match InFlight::enter(&rt.in_flight, rt.max_in_flight) {
            None => Err(StoreError::Overloaded(rt.max_in_flight)),
            Some(_guard) => {
                let started = Instant::now();
                let r = match tokio::time::timeout(rt.deadline, ask(&layer.store, checks)).await {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Timeout(rt.deadline)),
                };
                crate::metrics::store_latency(started.elapsed());
                match &r {
                    Ok(_) => rt.breaker.success(probe),
                    Err(_) => rt.breaker.failure(probe, rt.mono_us()),
                }
                r
            }
        },
    };
    #[cfg(feature = "memory")]
    if let (Err(err), Some((fallback, instances))) = (&result, &rt.fallback) {
        crate::metrics::store_error(err);
        rt.warn_store_failure(err, true);
        let local: Vec<Check> = checks
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let limit = (c.params.quota.limit() / instances).max(1);
                let burst = (c.params.quota.burst_size() / instances).max(1);
                c.params.quota = Quota::new(limit, c.params.quota.period()).burst(burst);
                c
            })
            .collect();
        let ds = fallback.check_at(&local, fallback.now_micros());
        for d in &ds {
            crate::metrics::fallback(if d.allowed { "allowed" } else { "rejected" });
        }
        return Ok(Decisions::from_vec(ds));
    }
    result
}

fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

fn reject<St, B, R, ResBody>(
    layer: &RateLimitLayer<St, B, R>,
    worst: &Outcome<'_>,
    all: &[Outcome<'_>],
    grpc: bool,
) -> Response<ResBody>
where
    R: OnRejected<ResBody>,
    ResBody: Default,
{
    let d = worst.decision;
    let mut res = if grpc {
        grpc_status(8, "rate limit exceeded")
    } else {
        layer.on_rejected.response(&Rejection { rule: worst.rule.clone(), decision: d.clone() })
    };
    let h = res.headers_mut();
    if let Some(retry) = d.retry_after {
        headers::retry_after(h, retry);
        if grpc {
            let ms = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX).max(1);
            h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
        }
    }
    if layer.options.headers != HeaderStyle::None {
        headers::apply(h, layer.options.headers, worst, all, layer.rules.len() > 1);
    }
    res
}

fn unavailable<ResBody: Default>(grpc: bool, err: &StoreError) -> Response<ResBody> {
    let retry = match err {
        StoreError::CircuitOpen(left) => *left,
        _ => Duration::from_secs(1),
    };
    let mut res = if grpc {
        grpc_status(14, "rate limiter unavailable")
    } else {
        let mut res = Response::new(ResBody::default());
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        res
    };
    headers::retry_after(res.headers_mut(), retry);
    res
}

/// A trailers-only gRPC response: HTTP 200 with `grpc-status` in the headers.
fn grpc_status<ResBody: Default>(code: u8, message: &'static str) -> Response<ResBody> {
    let mut res = Response::new(ResBody::default());
    let h = res.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(u16::from(code)));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}
