//! [`RateLimit`]: the service. `poll_ready` only forwards; `call` asks the
//! [`Limiter`], then answers or forwards, on one path ([`Step`]): an in-process store
//! decides within `call`, and a refusal is then answered with no future allocated; a
//! remote store decides in the response future. An admitted request holds a
//! [`Lease`] on its units until it is forwarded, then its `Forwarded` stage until its
//! response settles it; the inner service is called only when the future is polled.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::charge::Charge;
use crate::future::ResponseFuture;
use crate::limiter::Limiter;
use crate::limiter::{Lease, Now, RuleSet};
use crate::response::{DefaultUnavailable, Names, OnRejected, OnUnavailable, Responder};
use crate::store::Store;
use crate::verdict::Ruling;
use crate::verdict::Verdict;

/// What the rules of an HTTP layer see of a request: its head (method, URI, version,
/// headers, extensions) without the body, whatever the body type, so that neither rules
/// nor layers carry it. Key extractors and closures take `&RequestHead`
/// (`req.headers()`, `req.extensions()`, as on any `http::Request`).
pub type RequestHead = http::Request<()>;

/// The service built by [`RateLimitLayer`](crate::RateLimitLayer). Clones share one
/// [`Limiter`].
pub struct RateLimit<S, St, R, U = DefaultUnavailable> {
    inner: S,
    shared: Arc<Shared<St, R, U>>,
}

/// What every clone of the service and every request's future share: one reference
/// count to move per clone (servers clone the service per request, on every thread).
struct Shared<St, R, U> {
    limiter: Arc<Limiter<St, RequestHead>>,
    responder: Responder<R, U>,
}

impl<S: Clone, St, R, U> Clone for RateLimit<S, St, R, U> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), shared: self.shared.clone() }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, R, U> fmt::Debug for RateLimit<S, St, R, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, St, R, U> RateLimit<S, St, R, U> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter<St, RequestHead>>, responder: Responder<R, U>) -> Self {
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
    pub fn limiter(&self) -> &Arc<Limiter<St, RequestHead>> {
        &self.shared.limiter
    }
}

impl<S, St, B, R, U, ResBody> Service<Request<B>> for RateLimit<S, St, R, U>
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
        // The rules see the head; the body waits beside it until the request is forwarded.
        let (parts, body) = req.into_parts();
        let head = RequestHead::from_parts(parts, ());
        let plan = limiter.plan(&head);
        if plan.is_empty() {
            // No rule applies: forwarded too, when the future is first polled.
            let req = with_body(head, body);
            return ResponseFuture::new(Box::pin(async move { inner.call(req).await }));
        }
        // One path: decide (at once in process, else in the future), then answer a
        // refusal or run the admitted request. A refusal decided here needs no future.
        match limiter.decide_now(plan) {
            Now::Decided(verdict, set) => match Step::of(&self.shared, verdict, set, &head) {
                Step::Refused(res) => ResponseFuture::ready(Ok(res)),
                Step::Admitted(admitted) => ResponseFuture::new(Box::pin(admitted.run(inner, head, body))),
            },
            Now::Later(plan) => {
                let shared = self.shared.clone();
                ResponseFuture::new(Box::pin(async move {
                    // The request is answered under the rules it was decided by, whatever
                    // a swap does.
                    let set = plan.set.clone();
                    let verdict = shared.limiter.decide(plan).await;
                    match Step::of(&shared, verdict, set, &head) {
                        Step::Refused(res) => Ok(res),
                        Step::Admitted(admitted) => admitted.run(inner, head, body).await,
                    }
                }))
            }
        }
    }
}

/// What a decided request comes to.
#[allow(clippy::large_enum_variant, reason = "made once per request and matched at once: boxing would allocate")]
enum Step<St: Store, R, U, ResBody> {
    /// `429` (gRPC: `RESOURCE_EXHAUSTED`), or the fail mode's `503` when the store failed
    /// and a rule fails closed.
    Refused(Response<ResBody>),
    /// Forward it (allowed, or failed open — with no rate-limit headers, nothing being
    /// known).
    Admitted(Admitted<St, R, U>),
}

impl<St: Store, R, U, ResBody> Step<St, R, U, ResBody>
where
    R: OnRejected<ResBody>,
    U: OnUnavailable<ResBody>,
    ResBody: Default,
{
    fn of(
        shared: &Arc<Shared<St, R, U>>,
        mut verdict: Verdict,
        set: Arc<RuleSet<RequestHead>>,
        req: &RequestHead,
    ) -> Self {
        match &verdict.ruling {
            Ruling::Rejected => Step::Refused(shared.responder.rejected(&verdict, &names(&set), req)),
            Ruling::Failed { error, closed: true } => Step::Refused(shared.responder.unavailable(error, req)),
            Ruling::Failed { closed: false, .. } | Ruling::Allowed => {
                // A leaky bucket's slot is `delay` after the decision, however late the
                // future is first polled.
                let delay = verdict.delay();
                let slot = (!delay.is_zero()).then(|| Instant::now() + delay);
                let held = std::mem::take(&mut verdict.held);
                let lease = shared.limiter.lease(held, "a request dropped before it was forwarded");
                Step::Admitted(Admitted { shared: shared.clone(), verdict, set, lease, slot })
            }
        }
    }
}

/// An admitted request, until it is forwarded: its lease gives back everything it took if
/// it is dropped first (its response future dropped unpolled, or while it waits for a
/// leaky bucket's slot), as a request that never happened.
struct Admitted<St: Store, R, U> {
    shared: Arc<Shared<St, R, U>>,
    verdict: Verdict,
    set: Arc<RuleSet<RequestHead>>,
    lease: Lease<St>,
    /// A leaky bucket's slot, to wait for first.
    slot: Option<Instant>,
}

impl<St: Store, R, U> Admitted<St, R, U> {
    /// Waits for a leaky bucket's slot, if any; forwards the request — the decision into
    /// its extensions, the inner service called — then adds the rate-limit headers to its
    /// response and settles the lease with the response's status and `Charge`.
    ///
    /// Built as a plain function returning an `async` block: the block holds each value
    /// once, where an `async fn` keeps its arguments and their moved copies side by side,
    /// and the request's future is that much smaller to allocate and move.
    ///
    /// Until its first poll the request has not reached the inner service (not even its
    /// `call`, which may start work): dropped then, the lease gives back all it took. From
    /// there on it counts; dropped before the handler answers, it gives back the units of
    /// its count-by-outcome rules (it has no status to be counted by).
    #[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see above)")]
    fn run<S, B, ResBody>(
        self,
        mut inner: S,
        head: RequestHead,
        body: B,
    ) -> impl Future<Output = Result<Response<ResBody>, S::Error>>
    where
        S: Service<Request<B>, Response = Response<ResBody>> + Clone,
        R: OnRejected<ResBody>,
        U: OnUnavailable<ResBody>,
    {
        async move {
            let Admitted { shared, verdict, set, lease, slot } = self;
            if let Some(slot) = slot {
                // Leaky bucket (rare): boxed, so the common request's future stays small.
                inner = Box::pin(wait_for_slot(inner, slot)).await?;
            }
            let forwarded = lease.forward();
            let mut req = with_body(head, body);
            if let Some(most) = verdict.most_restrictive() {
                req.extensions_mut().insert(most.decision.clone());
            }
            let mut res = inner.call(req).await?;
            let refused = crate::response::is_refusal(&res);
            shared.responder.allowed(refused, res.headers_mut(), &verdict, &names(&set));
            // Units the handler reports it used are taken after the response.
            let charge = res.extensions().get::<Charge>().map(|&Charge(units)| units);
            forwarded.settle(res.status(), charge);
            Ok(res)
        }
    }
}

/// What responses say of the rules of `set`.
fn names(set: &RuleSet<RequestHead>) -> Names<'_> {
    Names { public: &set.names, style: set.headers }
}

/// The request again, from its head and its body.
fn with_body<B>(head: RequestHead, body: B) -> Request<B> {
    Request::from_parts(head.into_parts().0, body)
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
