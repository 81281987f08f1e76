//! What the services of one layer share ([`Shared`]), and what an admitted request's
//! response says ([`Report`]): the part of the HTTP adapter that both the service and its
//! response future use.

use std::sync::Arc;

use http::Response;
use smallvec::SmallVec;

use crate::decision::Decision;
use crate::head::RequestHead;
use crate::limiter::{Limiter, RuleSet};
use crate::response::{Names, Responder};
use crate::verdict::Decided;
#[cfg(doc)]
use crate::verdict::Verdict;

/// What every clone of the service and every request's future share: one reference
/// count to move per clone (servers clone the service per request, on every thread).
pub(crate) struct Shared<St, R, U> {
    pub(crate) limiter: Arc<Limiter<St, RequestHead>>,
    pub(crate) responder: Responder<R, U>,
}

/// What an admitted request's response says: the rate-limit headers of its decisions.
/// Only what the headers need (the decisions, not the checks nor what they took), so that
/// the response future it lives in stays small.
pub(crate) struct Report<St, R, U> {
    shared: Arc<Shared<St, R, U>>,
    set: Arc<RuleSet<RequestHead>>,
    decided: SmallVec<[Decided; 1]>,
    /// The most restrictive decision, the one the headers describe (an index in `decided`).
    most: usize,
}

impl<St, R, U> Report<St, R, U> {
    /// What the response to an admitted verdict says: its `decided` rules, of which `most`
    /// is the most restrictive ([`Verdict::most`]: a verdict with no decisions has no report).
    pub(crate) fn new(
        shared: Arc<Shared<St, R, U>>,
        decided: SmallVec<[Decided; 1]>,
        most: usize,
        set: Arc<RuleSet<RequestHead>>,
    ) -> Self {
        Self { shared, set, decided, most }
    }

    /// The decision handlers find in the request's extensions.
    pub(crate) fn most_restrictive(&self) -> &Decision {
        &self.decided[self.most].decision
    }

    /// The rate-limit headers of the most restrictive rule, on `res` (an inner layer's own
    /// refusal keeps its own). A count-by-outcome rule whose units the response's status
    /// gives back says what remains once they are back: a successful login under
    /// `count_if(401)` took nothing.
    pub(crate) fn headers<ResBody>(&mut self, res: &mut Response<ResBody>) {
        let refused = crate::response::is_refusal(res);
        let mut most = self.most;
        let status = res.status();
        let mut given_back = false;
        for d in &mut self.decided {
            if let Some(counts) = &self.set.rules[d.rule].count_if {
                if !counts(status) {
                    d.decision.set_remaining(d.decision.remaining().saturating_add(d.cost));
                    given_back = true;
                }
            }
        }
        if given_back {
            most = crate::verdict::fewest_left(&self.decided).unwrap_or(most);
        }
        self.shared.responder.add_headers(res.headers_mut(), &self.decided, &names(&self.set), most, refused);
    }
}

/// The rule names a response may show, and the header style a reloaded set names.
pub(crate) fn names(set: &RuleSet<RequestHead>) -> Names<'_> {
    Names { public: &set.names, style: set.headers }
}
