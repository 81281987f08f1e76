//! [`HoldPermitsLayer`], its service [`HoldPermits`] and its future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{InExtensions, PermitBody};

/// Wraps a layer (a [`RateLimitLayer`](crate::RateLimitLayer) with concurrency rules) so
/// that each response's permits are held until its body ends, not only until its head is
/// written: a streamed download or an SSE stream holds its permit to its end. Made by
/// [`RateLimitLayer::hold_permits`](crate::RateLimitLayer::hold_permits). The response's
/// body becomes a [`PermitBody`].
///
/// ```
/// use tollgate::{key, MemoryStore, RateLimitLayer, Rule};
///
/// let limit = RateLimitLayer::builder(MemoryStore::new())
///     .add_rule(Rule::concurrent("downloads", 2, key::PeerIp))
///     .build()
///     .unwrap();
/// let app: axum::Router = axum::Router::new()
///     .route("/file", axum::routing::get(|| async { "…" }))
///     .layer(limit.hold_permits());
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct HoldPermitsLayer<L> {
    inner: L,
}

impl<L> HoldPermitsLayer<L> {
    /// `inner`, its responses' permits held until their bodies end.
    pub fn new(inner: L) -> Self {
        Self { inner }
    }
}

impl<S, L: Layer<S>> Layer<S> for HoldPermitsLayer<L> {
    type Service = HoldPermits<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        HoldPermits { inner: self.inner.layer(inner) }
    }
}

/// The service of [`HoldPermitsLayer`]: moves the permits a response carries into its
/// body ([`PermitBody`]).
#[derive(Debug, Clone)]
pub struct HoldPermits<S> {
    inner: S,
}

impl<S, B, ResBody> Service<Request<B>> for HoldPermits<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<PermitBody<ResBody>>;
    type Error = S::Error;
    type Future = HoldPermitsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        HoldPermitsFuture { inner: self.inner.call(req) }
    }
}

pin_project! {
    /// The response future of [`HoldPermits`].
    pub struct HoldPermitsFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, ResBody, E> Future for HoldPermitsFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<PermitBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let res = std::task::ready!(self.project().inner.poll(cx))?;
        let (mut parts, body) = res.into_parts();
        // The stage moves: from the response's head into its body.
        let permits = parts.extensions.remove::<InExtensions>().and_then(|p| p.take());
        Poll::Ready(Ok(Response::from_parts(parts, PermitBody::new(body, permits))))
    }
}

impl<F> fmt::Debug for HoldPermitsFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldPermitsFuture").finish_non_exhaustive()
    }
}
