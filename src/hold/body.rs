//! [`PermitBody`]: a response body that holds its request's permits until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::permit::Held;

pin_project! {
    /// The body of [`HoldPermits`](super::HoldPermits): its inner body, and the permits
    /// of its request's concurrency rules, given back when the body ends (its last frame,
    /// or an error) or is dropped.
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        permits: Option<Box<dyn Held>>,
    }
}

impl<B> PermitBody<B> {
    pub(crate) fn new(inner: B, permits: Option<Box<dyn Held>>) -> Self {
        Self { inner, permits }
    }

    /// How many permits this body still holds.
    #[must_use]
    pub fn permits(&self) -> u64 {
        self.permits.as_ref().map_or(0, |p| p.permits())
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            // The end, or an error: the work is over.
            drop(this.permits.take());
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Default> Default for PermitBody<B> {
    fn default() -> Self {
        Self::new(B::default(), None)
    }
}

impl<B> fmt::Debug for PermitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody").field("permits", &self.permits()).finish_non_exhaustive()
    }
}
