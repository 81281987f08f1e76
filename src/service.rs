//! [`RateLimit`]: the service. `poll_ready` only forwards; `call` asks the
//! [`Limiter`] and answers or forwards.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::limiter::GiveBackOnDrop;
use crate::response::{DefaultUnavailable, OnRejected, OnUnavailable, Responder};
use crate::store::Store;
use crate::verdict::State;
use crate::{Charge, Limiter};

/// The service built by [`RateLimitLayer`](crate::RateLimitLayer). Clones share one
/// [`Limiter`].
pub struct RateLimit<S, St, B, R, U = DefaultUnavailable> {
    inner: S,
    limiter: Arc<Limiter<St, Request<B>>>,
    responder: Arc<Responder<R, U>>,
}

impl<S: Clone, St, B, R, U> Clone for RateLimit<S, St, B, R, U> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), limiter: self.limiter.clone(), responder: self.responder.clone() }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, B, R, U> fmt::Debug for RateLimit<S, St, B, R, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).field("limiter", &self.limiter).finish_non_exhaustive()
    }
}

impl<S, St, B, R, U> RateLimit<S, St, B, R, U> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter<St, Request<B>>>, responder: Arc<Responder<R, U>>) -> Self {
        Self { inner, limiter, responder }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The limiter every clone of this service shares.
    pub fn limiter(&self) -> &Arc<Limiter<St, Request<B>>> {
        &self.limiter
    }
}

impl<S, St, B, R, U, ResBody> Service<Request<B>> for RateLimit<S, St, B, R, U>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    St: Store,
    B: Send + 'static,
    R: OnRejected<ResBody>,
    U: OnUnavailable<ResBody>,
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
        ResponseFuture::new(Box::pin(handle(self.limiter.clone(), self.responder.clone(), inner, req)))
    }
}

/// One request: plan its checks, decide, then answer (429, 503) or wait for a leaky
/// bucket's slot, forward, add the headers, and give back count-by-outcome units.
///
/// After the store call, every `.await` is covered: a request dropped while waiting for
/// its slot gives back all it took, and one whose handler fails or is dropped gives back
/// the units of its count-by-outcome rules (it has no status to be counted by).
async fn handle<S, St, B, R, U, ResBody>(
    limiter: Arc<Limiter<St, Request<B>>>,
    responder: Arc<Responder<R, U>>,
    mut inner: S,
    mut req: Request<B>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    St: Store,
    B: 'static,
    R: OnRejected<ResBody>,
    U: OnUnavailable<ResBody>,
    ResBody: Default,
{
    let plan = limiter.plan(&req);
    if plan.is_empty() {
        return inner.call(req).await;
    }
    // The request is answered under the rules it was decided by, whatever a swap does.
    let set = plan.set.clone();
    let verdict = limiter.decide(plan).await;
    match &verdict.state {
        State::Rejected => return Ok(responder.rejected(&verdict, &set, &req)),
        State::Failed { error, closed: true } => return Ok(responder.unavailable(error, &req)),
        // Fail open: the request passes, with no rate-limit headers (nothing is known);
        // its shadow rules count by outcome as for any forwarded request.
        State::Failed { closed: false, .. } | State::Allowed => {}
    }
    let delay = verdict.delay();
    if !delay.is_zero() {
        // Leaky bucket: wait for the slot without holding the inner service's readiness
        // (a ready instance may hold a permit others need), then get ready.
        let guard = GiveBackOnDrop::new(limiter.give_back(&verdict, |_| true), "a request dropped before its slot");
        let mut fresh = inner.clone();
        drop(inner);
        tokio::time::sleep(delay).await;
        std::future::poll_fn(|cx| fresh.poll_ready(cx)).await?;
        guard.disarm();
        inner = fresh;
    }
    if let Some(most) = verdict.most_restrictive() {
        req.extensions_mut().insert(most.decision.clone());
    }
    let count_if = GiveBackOnDrop::new(
        limiter.give_back(&verdict, |rule| set.rules[rule].count_if.is_some()),
        "a count-by-outcome rule whose handler did not answer",
    );
    let mut res = inner.call(req).await?;
    responder.allowed(res.headers_mut(), &verdict, &set);
    // Units the handler reports it used: taken after the response, detached.
    if let Some(&Charge(units)) = res.extensions().get::<Charge>() {
        if let Some(charging) = limiter.charging(&verdict, units) {
            charging.spawn();
        }
    }
    // Count by outcome: give back the units of rules that do not count this status.
    if let Some(mut give_back) = count_if.disarm() {
        let status = res.status();
        give_back.retain(|r| set.rules[r].count_if.as_ref().is_some_and(|f| !f(status)));
        give_back.spawn("a count-by-outcome rule");
    }
    Ok(res)
}
