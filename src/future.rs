//! [`ResponseFuture`], the future of [`RateLimit`](crate::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The response future of [`RateLimit`](crate::RateLimit): the store's decision, then
/// (unless rejected) the inner service's response with rate-limit headers added.
pub struct ResponseFuture<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    /// Answered in `call` (a refusal decided by an in-process store); `None` once taken.
    Ready(Option<T>),
    Boxed(Pin<Box<dyn Future<Output = T> + Send>>),
}

// The output is only ever moved, never pinned: the future is `Unpin` whatever `T` is.
impl<T> Unpin for ResponseFuture<T> {}

impl<T> ResponseFuture<T> {
    pub(crate) fn new(inner: Pin<Box<dyn Future<Output = T> + Send>>) -> Self {
        Self { inner: Inner::Boxed(inner) }
    }

    pub(crate) fn ready(output: T) -> Self {
        Self { inner: Inner::Ready(Some(output)) }
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.get_mut().inner {
            Inner::Ready(output) => Poll::Ready(output.take().expect("ResponseFuture polled after completion")),
            Inner::Boxed(fut) => fut.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
