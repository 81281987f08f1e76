//! Permits held until the response's body ends (issue 42): [`HoldPermitsLayer`] around a
//! [`RateLimitLayer`](crate::RateLimitLayer) with concurrency rules
//! ([`Rule::concurrent`](crate::Rule::concurrent)), as tower-http's in-flight counter
//! moves its guard from the response future into the body.
//!
//! The rate-limit layer's response keeps its own type (users without concurrency rules
//! see no change): when a response settles with permits, the layer puts them in the
//! response's extensions. [`HoldPermits`] takes them out and moves them into
//! its [`PermitBody`], which gives them back when the body ends (its last frame, an
//! error) or is dropped (the client went away mid-stream). Without `HoldPermitsLayer`,
//! permits are given back when the server drops the response's head: once the headers
//! are written, before a streamed body ends.

mod body;
mod layer;

use std::sync::Arc;

use http::Response;
use parking_lot::Mutex;

pub use self::body::PermitBody;
pub use self::layer::{HoldPermits, HoldPermitsFuture, HoldPermitsLayer};
use crate::permit::Held;

/// The permits of a response, in its extensions between the rate-limit layer and
/// [`HoldPermits`] (extensions must be `Clone`: the permits go back when the last clone is
/// dropped, or when [`HoldPermits`] takes them).
#[derive(Clone)]
pub(crate) struct InExtensions(Arc<Mutex<Option<Box<dyn Held>>>>);

impl InExtensions {
    /// Takes the permits out (once: later clones find none).
    pub(crate) fn take(&self) -> Option<Box<dyn Held>> {
        self.0.lock().take()
    }
}

/// Puts `permits` in `res`'s extensions, for [`HoldPermits`] to move into the body.
pub(crate) fn attach<B>(res: &mut Response<B>, permits: Box<dyn Held>) {
    res.extensions_mut().insert(InExtensions(Arc::new(Mutex::new(Some(permits)))));
}
