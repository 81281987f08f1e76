//! [`ResponseFuture`], the future of [`RateLimit`](crate::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The response future of [`RateLimit`](crate::RateLimit): the store's decision, then
/// (unless rejected) the inner service's response with rate-limit headers added.
pub struct ResponseFuture<T> {
    inner: Pin<Box<dyn Future<Output = T> + Send>>,
}

impl<T> ResponseFuture<T> {
    pub(crate) fn new(inner: Pin<Box<dyn Future<Output = T> + Send>>) -> Self {
        Self { inner }
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
