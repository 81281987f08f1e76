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
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::charge::Charge;
use crate::limiter::{Forwarded, Lease};
use crate::report::Report;
use crate::response::{OnRejected, OnUnavailable};
use crate::service::{with_body, Admitted, Step, Waiting};
use crate::store::Store;
use crate::verdict::Verdict;

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
                    match Step::of(&shared, verdict, set, &head) {
                        Step::Refused(res) => {
                            this.kind.set(Kind::Ready { output: None });
                            return Poll::Ready(Ok(res));
                        }
                        // Forwarded at once: this is its first poll since it was decided.
                        Step::Admitted(Admitted { report, lease, slot: None }) => {
                            *this.report = report;
                            let running = forward(inner, with_body(head, body), Some(lease), this.report.as_ref());
                            this.kind.set(running);
                        }
                        // A leaky bucket's slot to wait for (rare): boxed.
                        Step::Admitted(admitted) => {
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
                    let forwarded = forwarded.take();
                    // An error gives back what is forwarded: as for a response never given.
                    let mut res = res?;
                    if let Some(report) = this.report.take() {
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
    let forwarded = lease.and_then(Lease::forward);
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
