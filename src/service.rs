//! [`RateLimit`]: the service. `poll_ready` only forwards; `call` asks the [`Limiter`],
//! then answers or forwards, on one path ([`Step`]): an in-process store decides within
//! `call` (the [`ResponseFuture`]'s stages, with no allocation, are in `future.rs`), a
//! remote store in a boxed response future.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::future::{with_body, Admitted, ResponseFuture, Step, Waiting};
use crate::head::RequestHead;
use crate::limiter::Limiter;
use crate::report::Shared;
use crate::response::{DefaultUnavailable, OnRejected, OnUnavailable};
use crate::store::Store;

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
        let Some(local) = limiter.local() else {
            // The request is answered under the rules it was decided by, whatever a
            // swap does. Only the decision is boxed: the request waits beside it.
            let set = plan.set.clone();
            let limiter = self.shared.limiter.clone();
            let deciding = Box::pin(async move { limiter.decide_remote(&plan).await });
            return ResponseFuture::deciding(deciding, Waiting { shared: self.shared.clone(), set, inner, head, body });
        };
        // Returned bare, the verdict is written once, where it is kept (out of an
        // `Option`, it was copied again).
        let verdict = limiter.decide_local(local, &plan);
        match Step::of(&self.shared, &verdict, &plan.set, &head) {
            Step::Refused(res) => ResponseFuture::ready(Ok(res)),
            Step::Admitted { slot: None } => {
                ResponseFuture::admitted(&self.shared, inner, with_body(head, body), verdict, plan.set)
            }
            Step::Admitted { slot } => {
                let admitted = Admitted::new(&self.shared, verdict, plan.set, slot);
                ResponseFuture::boxed(Box::pin(admitted.run(inner, head, body)))
            }
        }
    }
}
