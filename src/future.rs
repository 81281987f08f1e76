//! [`ResponseFuture`], the future of [`RateLimit`](crate::RateLimit): a state machine with
//! no allocation on the in-process path.
//!
//! A refusal decided in `call` is [`Kind::Ready`]. An admitted request (or one no rule
//! applies to) waits, [`Kind::Unpolled`], holding its [`Lease`]: dropped there, the lease
//! gives its units back. Its first poll forwards it: the inner service is called and the
//! lease becomes [`Forwarded`], which lives beside the inner future ([`Kind::Running`])
//! until the response settles it. A remote store's decision is boxed, the request waiting
//! beside it ([`Kind::Deciding`]) until it becomes one of the above; the rare wait for a
//! leaky bucket's slot runs in a boxed future ([`Kind::Boxed`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

use crate::charge::Charge;
use crate::head::RequestHead;
use crate::limiter::{Forwarded, Lease, RuleSet};
use crate::report::{names, Report, Shared};
use crate::response::{OnRejected, OnUnavailable};
use crate::store::Store;
use crate::verdict::{Ruling, Verdict};

/// The boxed future of the paths that wait (a remote store, a leaky bucket's slot).
pub(crate) type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    pub struct ResponseFuture<S, B, St, R, U>
    where
        S: Service<Request<B>>,
        St: Store,
    {
        #[pin]
        kind: Kind<S, B, St, R, U>,
        // What the response's headers say (none when no rule applied).
        report: Option<Report<St, R, U>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, B, St, R, U>
    where
        S: Service<Request<B>>,
        St: Store,
    {
        Ready { output: Option<Result<S::Response, S::Error>> },
        Boxed { future: Boxed<Result<S::Response, S::Error>> },
        // A remote store's decision (boxed), and the request waiting for it; `None` once
        // decided.
        Deciding { decision: Boxed<Verdict>, waiting: Option<Waiting<S, B, St, R, U>> },
        // The inner service (made ready by `poll_ready`) and the request, not yet
        // forwarded; `None` once taken by the first poll.
        Unpolled { forward: Option<(S, Request<B>, Option<Lease<St>>)> },
        // The inner service's future, and what the request holds until its response.
        Running { #[pin] future: S::Future, forwarded: Option<Forwarded<St>> },
    }
}

impl<S, B, St, R, U> ResponseFuture<S, B, St, R, U>
where
    S: Service<Request<B>>,
    St: Store,
{
    pub(crate) fn ready(output: Result<S::Response, S::Error>) -> Self {
        Self { kind: Kind::Ready { output: Some(output) }, report: None }
    }

    pub(crate) fn boxed(future: Boxed<Result<S::Response, S::Error>>) -> Self {
        Self { kind: Kind::Boxed { future }, report: None }
    }

    /// The request `waiting` for a remote store's `decision`.
    pub(crate) fn deciding(decision: Boxed<Verdict>, waiting: Waiting<S, B, St, R, U>) -> Self {
        Self { kind: Kind::Deciding { decision, waiting: Some(waiting) }, report: None }
    }

    /// `req` for `inner` at the first poll, holding `lease` until then, its response
    /// answered with the headers of `report`.
    pub(crate) fn unpolled(
        inner: S,
        req: Request<B>,
        lease: Option<Lease<St>>,
        report: Option<Report<St, R, U>>,
    ) -> Self {
        Self { kind: Kind::Unpolled { forward: Some((inner, req, lease)) }, report }
    }

    /// `req` admitted by `verdict` (in process, with no slot to wait for), for `inner` at
    /// the first poll: its lease and its report are made where the future keeps them
    /// (made apart and passed in, each was copied twice more).
    pub(crate) fn admitted(
        shared: &Arc<Shared<St, R, U>>,
        inner: S,
        req: Request<B>,
        verdict: Verdict,
        set: Arc<RuleSet<RequestHead>>,
    ) -> Self {
        let most = verdict.most();
        let Verdict { decided, held, .. } = verdict;
        let lease = shared.limiter.lease(held, DROPPED);
        let report = most.map(|most| Report::new(shared.clone(), decided, most, set));
        Self::unpolled(inner, req, Some(lease), report)
    }
}

impl<S, B, St, R, U, ResBody> Future for ResponseFuture<S, B, St, R, U>
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
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.kind.as_mut().project() {
                KindProj::Ready { output } => {
                    return Poll::Ready(output.take().expect("ResponseFuture polled after completion"))
                }
                KindProj::Boxed { future } => return future.as_mut().poll(cx),
                KindProj::Deciding { decision, waiting } => {
                    let verdict = ready!(decision.as_mut().poll(cx));
                    let Waiting { shared, set, inner, head, body } =
                        waiting.take().expect("ResponseFuture polled after completion");
                    match Step::of(&shared, &verdict, &set, &head) {
                        Step::Refused(res) => {
                            this.kind.set(Kind::Ready { output: None });
                            return Poll::Ready(Ok(res));
                        }
                        // Forwarded at once: this is its first poll since it was decided.
                        Step::Admitted { slot: None } => {
                            let Admitted { report, lease, .. } = Admitted::new(&shared, verdict, set, None);
                            *this.report = report;
                            let running = forward(inner, with_body(head, body), Some(lease), this.report.as_ref());
                            this.kind.set(running);
                        }
                        // A leaky bucket's slot to wait for (rare): boxed.
                        Step::Admitted { slot } => {
                            let admitted = Admitted::new(&shared, verdict, set, slot);
                            this.kind.set(Kind::Boxed { future: Box::pin(admitted.run(inner, head, body)) });
                        }
                    }
                }
                KindProj::Unpolled { forward: waiting } => {
                    let (inner, req, lease) = waiting.take().expect("ResponseFuture polled after completion");
                    let running = forward(inner, req, lease, this.report.as_ref());
                    this.kind.set(running);
                }
                KindProj::Running { future, forwarded } => {
                    let res = ready!(future.poll(cx));
                    // Taken only when there is one: a take copies the whole slot, and the
                    // common request forwards nothing.
                    let forwarded = if forwarded.is_some() { forwarded.take() } else { None };
                    // An error gives back what is forwarded: as for a response never given.
                    let mut res = res?;
                    // Read in place (the future is done with it): moved out, it was copied.
                    if let Some(report) = this.report.as_mut() {
                        report.headers(&mut res);
                    }
                    if let Some(forwarded) = forwarded {
                        // Units the handler reports it used are taken after the response.
                        let charge = res.extensions().get::<Charge>().map(|&Charge(units)| units);
                        // Issue 42: a concurrency rule's permits go with the response (see `hold`).
                        if let Some(permits) = forwarded.settle(res.status(), charge) {
                            crate::hold::attach(&mut res, Box::new(permits));
                        }
                    }
                    return Poll::Ready(Ok(res));
                }
            }
        }
    }
}

/// `req` forwarded to `inner`, with the decision the handler reads (`report`'s), and what
/// it holds until its response.
#[inline(always)]
fn forward<S, B, St, R, U>(
    mut inner: S,
    mut req: Request<B>,
    lease: Option<Lease<St>>,
    report: Option<&Report<St, R, U>>,
) -> Kind<S, B, St, R, U>
where
    S: Service<Request<B>>,
    St: Store,
{
    if let Some(report) = report {
        req.extensions_mut().insert(*report.most_restrictive());
    }
    let forwarded = match lease {
        Some(lease) => lease.forward(),
        None => None,
    };
    Kind::Running { future: inner.call(req), forwarded }
}

impl<S, B, St, R, U> fmt::Debug for ResponseFuture<S, B, St, R, U>
where
    S: Service<Request<B>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
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

/// What a decided request comes to. The verdict is only read here: what an admitted
/// request keeps of it is taken apart where it is kept ([`ResponseFuture::admitted`], or
/// [`Admitted`] on the paths that wait).
pub(crate) enum Step<ResBody> {
    Refused(Response<ResBody>),
    /// Admitted, to be forwarded at `slot` (a leaky bucket's), or at once.
    Admitted {
        slot: Option<Instant>,
    },
}

impl<ResBody: Default> Step<ResBody> {
    pub(crate) fn of<St: Store, R: OnRejected<ResBody>, U: OnUnavailable<ResBody>>(
        shared: &Shared<St, R, U>,
        verdict: &Verdict,
        set: &RuleSet<RequestHead>,
        req: &RequestHead,
    ) -> Self {
        match &verdict.ruling {
            Ruling::Rejected { worst, key } => {
                let blocks = !set.rules[verdict.decided[*worst].rule].block.is_zero();
                Step::Refused(shared.responder.rejected(verdict, (*worst, key), &names(set), blocks, req))
            }
            Ruling::Failed { error, closed: true } => Step::Refused(shared.responder.unavailable(error, req)),
            Ruling::Failed { closed: false, .. } | Ruling::Allowed => {
                // A leaky bucket's slot is `delay` after the decision, however late the
                // future is first polled.
                let delay = verdict.delay();
                Step::Admitted { slot: (!delay.is_zero()).then(|| Instant::now() + delay) }
            }
        }
    }
}

/// What a lease of a request's units says when it gives them back.
const DROPPED: &str = "a request dropped before it was forwarded";

/// An admitted request, before it is forwarded.
pub(crate) struct Admitted<St: Store, R, U> {
    pub(crate) report: Option<Report<St, R, U>>,
    pub(crate) lease: Lease<St>,
    pub(crate) slot: Option<Instant>,
}

impl<St: Store, R, U> Admitted<St, R, U> {
    /// What the request admitted by `verdict` keeps: its lease and its report, taken
    /// apart, not moved whole (each part goes where it is kept).
    pub(crate) fn new(
        shared: &Arc<Shared<St, R, U>>,
        verdict: Verdict,
        set: Arc<RuleSet<RequestHead>>,
        slot: Option<Instant>,
    ) -> Self {
        let most = verdict.most();
        let Verdict { decided, held, .. } = verdict;
        let lease = shared.limiter.lease(held, DROPPED);
        let report = most.map(|most| Report::new(shared.clone(), decided, most, set));
        Self { report, lease, slot }
    }

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
