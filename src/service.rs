//! [`RateLimit`]: the service. `poll_ready` only forwards; `call` asks the [`Limiter`],
//! then answers or forwards, on one path ([`Step`]): an in-process store decides within
//! `call` (the [`ResponseFuture`]'s stages, with no allocation, are in `future.rs`), a
//! remote store in a boxed response future.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::head::RequestHead;
use crate::limiter::{Lease, Limiter, Now, RuleSet};
use crate::report::{names, Report, Shared};
use crate::response::{DefaultUnavailable, OnRejected, OnUnavailable};
use crate::store::Store;
use crate::verdict::{Ruling, Verdict};

/// The service built by [`RateLimitLayer`](crate::RateLimitLayer). Clones share one
/// [`Limiter`].
pub struct RateLimit<S, St, R, U = DefaultUnavailable> {
    inner: S,
    shared: Arc<Shared<St, R, U>>,
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
    pub(crate) fn new(inner: S, shared: Arc<Shared<St, R, U>>) -> Self {
        Self { inner, shared }
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
    type Future = ResponseFuture<S, B, St, R, U>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Take the instance poll_ready made ready; leave a clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let limiter = &self.shared.limiter;
        // The rules see the head; the body waits beside it until the request is forwarded.
        let (parts, body) = req.into_parts();
        let head = RequestHead::from_parts(parts, ());
        let plan = limiter.plan(&head);
        if plan.is_empty() {
            // No rule applies: forwarded too, when the future is first polled.
            return ResponseFuture::unpolled(inner, with_body(head, body), None, None);
        }
        // One path: decide (at once in process, else in the future), then answer a
        // refusal or run the admitted request. A refusal decided here needs no future.
        match limiter.decide_now(plan) {
            Now::Decided(verdict, set) => match Step::of(&self.shared, verdict, set, &head) {
                Step::Refused(res) => ResponseFuture::ready(Ok(res)),
                Step::Admitted(Admitted { report, lease, slot: None }) => {
                    ResponseFuture::unpolled(inner, with_body(head, body), Some(lease), report)
                }
                Step::Admitted(admitted) => ResponseFuture::boxed(Box::pin(admitted.run(inner, head, body))),
            },
            Now::Later(plan) => {
                // The request is answered under the rules it was decided by, whatever a
                // swap does. Only the decision is boxed: the request waits beside it.
                let set = plan.set.clone();
                let limiter = self.shared.limiter.clone();
                let deciding = Box::pin(async move { limiter.decide_remote(&plan).await });
                ResponseFuture::deciding(deciding, Waiting { shared: self.shared.clone(), set, inner, head, body })
            }
        }
    }
}

/// A request waiting for a remote store's decision: what answers it, once decided.
pub(crate) struct Waiting<S, B, St, R, U> {
    pub(crate) shared: Arc<Shared<St, R, U>>,
    pub(crate) set: Arc<RuleSet<RequestHead>>,
    pub(crate) inner: S,
    pub(crate) head: RequestHead,
    pub(crate) body: B,
}

#[allow(clippy::large_enum_variant, reason = "made once per request and matched at once: boxing would allocate")]
pub(crate) enum Step<St: Store, R, U, ResBody> {
    Refused(Response<ResBody>),
    Admitted(Admitted<St, R, U>),
}

impl<St: Store, R, U, ResBody> Step<St, R, U, ResBody>
where
    R: OnRejected<ResBody>,
    U: OnUnavailable<ResBody>,
    ResBody: Default,
{
    pub(crate) fn of(
        shared: &Arc<Shared<St, R, U>>,
        verdict: Verdict,
        set: Arc<RuleSet<RequestHead>>,
        req: &RequestHead,
    ) -> Self {
        match &verdict.ruling {
            Ruling::Rejected { worst, key } => {
                let blocks = !set.rules[verdict.decided[*worst].rule].block.is_zero();
                Step::Refused(shared.responder.rejected(&verdict, (*worst, key), &names(&set), blocks, req))
            }
            Ruling::Failed { error, closed: true } => Step::Refused(shared.responder.unavailable(error, req)),
            Ruling::Failed { closed: false, .. } | Ruling::Allowed => {
                // A leaky bucket's slot is `delay` after the decision, however late the
                // future is first polled.
                let delay = verdict.delay();
                let slot = (!delay.is_zero()).then(|| Instant::now() + delay);
                let most = verdict.most();
                // Taken apart, not moved whole: each part goes where it is kept.
                let Verdict { decided, held, .. } = verdict;
                let lease = shared.limiter.lease(held, "a request dropped before it was forwarded");
                let report = most.map(|most| Report::new(shared.clone(), decided, most, set));
                Step::Admitted(Admitted { report, lease, slot })
            }
        }
    }
}

/// An admitted request, before it is forwarded.
pub(crate) struct Admitted<St: Store, R, U> {
    pub(crate) report: Option<Report<St, R, U>>,
    pub(crate) lease: Lease<St>,
    pub(crate) slot: Option<Instant>,
}

impl<St: Store, R, U> Admitted<St, R, U> {
    /// The paths that wait anyway (a remote store, a leaky bucket's slot), in one future:
    /// the wait, then the unboxed [`ResponseFuture`] an in-process decision's request
    /// takes at once.
    #[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see above)")]
    pub(crate) fn run<S, B, ResBody>(
        self,
        mut inner: S,
        head: RequestHead,
        body: B,
    ) -> impl Future<Output = Result<Response<ResBody>, S::Error>>
    where
        S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Send + 'static,
        B: Send + 'static,
        R: OnRejected<ResBody>,
        U: OnUnavailable<ResBody>,
        ResBody: Default + Send + 'static,
    {
        async move {
            let Admitted { report, lease, slot } = self;
            if let Some(slot) = slot {
                // Leaky bucket (rare): boxed, so the common request's future stays small.
                inner = Box::pin(wait_for_slot(inner, slot)).await?;
            }
            // Then the life of an in-process decision's request, on the same code.
            ResponseFuture::unpolled(inner, with_body(head, body), Some(lease), report).await
        }
    }
}

/// The request again, from its head and its body.
pub(crate) fn with_body<B>(head: RequestHead, body: B) -> Request<B> {
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
