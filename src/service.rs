//! [`RateLimit`]: the service. `poll_ready` only forwards; `call` asks the
//! [`Limiter`] and answers or forwards. An in-process store decides within `call`, and
//! a refusal is then answered with no future allocated; the inner service is called only
//! when the response future is polled.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::limiter::{GiveBackOnDrop, Now, RuleSet};
use crate::response::{DefaultUnavailable, OnRejected, OnUnavailable, Responder};
use crate::store::Store;
use crate::verdict::State;
use crate::{Charge, Limiter, Verdict};

/// The service built by [`RateLimitLayer`](crate::RateLimitLayer). Clones share one
/// [`Limiter`].
pub struct RateLimit<S, St, B, R, U = DefaultUnavailable> {
    inner: S,
    shared: Arc<Shared<St, B, R, U>>,
}

/// What every clone of the service and every request's future share: one reference
/// count to move per clone (servers clone the service per request, on every thread).
struct Shared<St, B, R, U> {
    limiter: Arc<Limiter<St, Request<B>>>,
    responder: Responder<R, U>,
}

impl<S: Clone, St, B, R, U> Clone for RateLimit<S, St, B, R, U> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), shared: self.shared.clone() }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, B, R, U> fmt::Debug for RateLimit<S, St, B, R, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, St, B, R, U> RateLimit<S, St, B, R, U> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter<St, Request<B>>>, responder: Responder<R, U>) -> Self {
        Self { inner, shared: Arc::new(Shared { limiter, responder }) }
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
        &self.shared.limiter
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
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = &self.shared.limiter;
        let plan = limiter.plan(&req);
        if plan.is_empty() {
            // No rule applies: forwarded too, when the future is first polled.
            return ResponseFuture::new(Box::pin(async move { inner.call(req).await }));
        }
        match limiter.decide_now(plan) {
            // An in-process store decided at once: a refusal is answered here, with no
            // future to allocate; an admission is forwarded when its future is polled (after
            // a leaky bucket's wait, if any).
            Now::Decided(verdict, set) => {
                if let Some(res) = refusal(&self.shared.responder, &verdict, &set, &req) {
                    return ResponseFuture::ready(Ok(res));
                }
                let admitted = Admitted::new(self.shared.clone(), verdict);
                let delay = admitted.verdict.delay();
                if delay.is_zero() {
                    ResponseFuture::new(Box::pin(forward(inner, req, admitted, set)))
                } else {
                    // The slot is `delay` after the decision, however late the future is
                    // first polled.
                    let slot = Instant::now() + delay;
                    ResponseFuture::new(Box::pin(wait_then_forward(inner, req, admitted, set, slot)))
                }
            }
            Now::Later(plan) => {
                let shared = self.shared.clone();
                ResponseFuture::new(Box::pin(async move {
                    // The request is answered under the rules it was decided by, whatever
                    // a swap does.
                    let set = plan.set.clone();
                    let verdict = shared.limiter.decide(plan).await;
                    if let Some(res) = refusal(&shared.responder, &verdict, &set, &req) {
                        return Ok(res);
                    }
                    let slot = Instant::now() + verdict.delay();
                    wait_then_forward(inner, req, Admitted::new(shared, verdict), set, slot).await
                }))
            }
        }
    }
}

/// The answer to a request its verdict refuses: `429` (gRPC: `RESOURCE_EXHAUSTED`), or
/// the fail mode's `503` when the store failed and a rule fails closed. `None`: forward
/// it (allowed, or failed open — with no rate-limit headers, nothing being known).
fn refusal<ResBody, B, R, U>(
    responder: &Responder<R, U>,
    verdict: &Verdict,
    set: &RuleSet<Request<B>>,
    req: &Request<B>,
) -> Option<Response<ResBody>>
where
    R: OnRejected<ResBody>,
    U: OnUnavailable<ResBody>,
    ResBody: Default,
{
    match &verdict.state {
        State::Rejected => Some(responder.rejected(verdict, set, req)),
        State::Failed { error, closed: true } => Some(responder.unavailable(error, req)),
        State::Failed { closed: false, .. } | State::Allowed => None,
    }
}

/// An admitted request's verdict, until the request reaches the inner service: dropped
/// before that (its response future dropped unpolled, or while it waits for a leaky
/// bucket's slot), it gives back everything the verdict took, as a request that never
/// happened. It holds the verdict itself, so arming it costs nothing.
struct Admitted<St: Store, B: 'static, R, U> {
    shared: Arc<Shared<St, B, R, U>>,
    verdict: Verdict,
    armed: bool,
}

impl<St: Store, B: 'static, R, U> Admitted<St, B, R, U> {
    fn new(shared: Arc<Shared<St, B, R, U>>, verdict: Verdict) -> Self {
        Self { shared, verdict, armed: true }
    }

    /// The request has reached the inner service: what it took stays taken.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<St: Store, B: 'static, R, U> Drop for Admitted<St, B, R, U> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.limiter.give_back(&self.verdict, |_| true).spawn("a request dropped before it was forwarded");
        }
    }
}

/// An admitted request: wait for a leaky bucket's slot (the instant `slot`), then
/// [`forward`] it. A request dropped while it waits gives back all it took.
async fn wait_then_forward<S, St, B, R, U, ResBody>(
    mut inner: S,
    req: Request<B>,
    admitted: Admitted<St, B, R, U>,
    set: Arc<RuleSet<Request<B>>>,
    slot: Instant,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    St: Store,
    B: 'static,
    R: OnRejected<ResBody>,
    U: OnUnavailable<ResBody>,
{
    if !admitted.verdict.delay().is_zero() {
        // Leaky bucket (rare): boxed, so the common request's future stays small.
        inner = Box::pin(wait_for_slot(inner, slot)).await?;
    }
    forward(inner, req, admitted, set).await
}

/// Forwards an admitted request when first polled — the decision into its extensions, the
/// inner service called — then adds the rate-limit headers to its response and gives back
/// count-by-outcome units.
///
/// Built as a plain function returning an `async` block: the block holds each value once,
/// where an `async fn` keeps its arguments and their moved copies side by side (1,320
/// against 2,232 bytes behind `http_bench`'s router), and the request's future is that
/// much smaller to allocate and move.
///
/// Until its first poll the request has not reached the inner service (not even its
/// `call`, which may start work): dropped then, it gives back all it took. From there on
/// it counts; dropped before the handler answers, it gives back the units of its
/// count-by-outcome rules (it has no status to be counted by).
#[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see above)")]
fn forward<S, St, B, R, U, ResBody>(
    mut inner: S,
    mut req: Request<B>,
    mut admitted: Admitted<St, B, R, U>,
    set: Arc<RuleSet<Request<B>>>,
) -> impl Future<Output = Result<Response<ResBody>, S::Error>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    St: Store,
    B: 'static,
    R: OnRejected<ResBody>,
    U: OnUnavailable<ResBody>,
{
    async move {
        admitted.disarm();
        let (shared, verdict) = (&admitted.shared, &admitted.verdict);
        if let Some(most) = verdict.most_restrictive() {
            req.extensions_mut().insert(most.decision.clone());
        }
        // Most rule sets count every outcome: then there is nothing to arm.
        let count_if = set.rules.iter().any(|r| r.count_if.is_some()).then(|| {
            GiveBackOnDrop::new(
                shared.limiter.give_back(verdict, |rule| set.rules[rule].count_if.is_some()),
                "a count-by-outcome rule whose handler did not answer",
            )
        });
        let mut res = inner.call(req).await?;
        shared.responder.allowed(res.headers_mut(), verdict, &set);
        // Units the handler reports it used: taken after the response, detached.
        if let Some(&Charge(units)) = res.extensions().get::<Charge>() {
            if let Some(charging) = shared.limiter.charging(verdict, units) {
                charging.spawn();
            }
        }
        // Count by outcome: give back the units of rules that do not count this status.
        if let Some(mut give_back) = count_if.and_then(GiveBackOnDrop::disarm) {
            let status = res.status();
            give_back.retain(|r| set.rules[r].count_if.as_ref().is_some_and(|f| !f(status)));
            give_back.spawn("a count-by-outcome rule");
        }
        Ok(res)
    }
}

/// Waits for a leaky bucket's slot without holding the inner service's readiness (a
/// ready instance may hold a permit others need), then gets a fresh instance ready.
async fn wait_for_slot<S, Req>(inner: S, slot: Instant) -> Result<S, S::Error>
where
    S: Service<Req> + Clone,
{
    let mut fresh = inner.clone();
    drop(inner);
    tokio::time::sleep_until(slot).await;
    std::future::poll_fn(|cx| fresh.poll_ready(cx)).await?;
    Ok(fresh)
}
