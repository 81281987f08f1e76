//! What the services of one layer share ([`Shared`]), and what an admitted request's
//! response says ([`Report`]): the part of the HTTP adapter that both the service and its
//! response future use.

use std::sync::Arc;

use http::Response;

use crate::decision::Decision;
use crate::head::RequestHead;
use crate::limiter::{Limiter, RuleSet};
use crate::response::{Names, Responder};
use crate::verdict::Verdict;

/// What every clone of the service and every request's future share: one reference
/// count to move per clone (servers clone the service per request, on every thread).
pub(crate) struct Shared<St, R, U> {
    pub(crate) limiter: Arc<Limiter<St, RequestHead>>,
    pub(crate) responder: Responder<R, U>,
}

/// What an admitted request's response says: the rate-limit headers of its verdict.
pub(crate) struct Report<St, R, U> {
    shared: Arc<Shared<St, R, U>>,
    verdict: Verdict,
    set: Arc<RuleSet<RequestHead>>,
}

impl<St, R, U> Report<St, R, U> {
    pub(crate) fn new(shared: Arc<Shared<St, R, U>>, verdict: Verdict, set: Arc<RuleSet<RequestHead>>) -> Self {
        Self { shared, verdict, set }
    }

    /// The decision handlers find in the request's extensions.
    pub(crate) fn most_restrictive(&self) -> Option<&Decision> {
        self.verdict.most_restrictive().map(|most| most.decision)
    }

    /// The rate-limit headers of the most restrictive rule, on `res` (an inner layer's own
    /// refusal keeps its own).
    pub(crate) fn headers<ResBody>(self, res: &mut Response<ResBody>) {
        if let Some(most) = self.verdict.most() {
            let refused = crate::response::is_refusal(res);
            self.shared.responder.add_headers(res.headers_mut(), &self.verdict, &names(&self.set), most, refused);
        }
    }
}

/// The rule names a response may show, and the header style a reloaded set names.
pub(crate) fn names(set: &RuleSet<RequestHead>) -> Names<'_> {
    Names { public: &set.names, style: set.headers }
}
