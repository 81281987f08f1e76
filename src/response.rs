//! Where the layer's responses are built: the `429` of a rejection (gRPC:
//! `RESOURCE_EXHAUSTED`), the `503` of a store failure under [`FailMode::Closed`]
//! (gRPC: `UNAVAILABLE`), and the rate-limit headers of allowed responses.
//!
//! [`FailMode::Closed`]: crate::FailMode::Closed

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use smallvec::SmallVec;

use crate::headers::{self, HeaderStyle};
use crate::key::Key;
use crate::verdict::{DecidedBy, RuleDecision};
use crate::{Decision, StoreError, Verdict};

/// Details of a rejection, for [`RateLimitLayer::on_rejected`](crate::RateLimitLayer::on_rejected).
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The rule that rejected.
    pub rule: Arc<str>,
    /// The key it rejected (for logs; think twice before echoing an API key).
    pub key: Key,
    /// Its decision (`retry_after`, `limit`, …).
    pub decision: Decision,
    /// Who decided: the store, the fallback limiter while the store is down (an
    /// approximate limit), or this process's cache of the store's earlier rejections.
    pub decided_by: DecidedBy,
}

/// Builds the response of a rejected request. The middleware adds `Retry-After` and the
/// rate-limit headers to whatever it returns.
pub trait OnRejected<ResBody>: Send + Sync + 'static {
    /// The response for a rejected request.
    fn response(&self, rejection: &Rejection) -> Response<ResBody>;
}

/// The default rejection: `429 Too Many Requests` with an empty body.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRejection;

impl<ResBody: Default> OnRejected<ResBody> for DefaultRejection {
    fn response(&self, _: &Rejection) -> Response<ResBody> {
        let mut res = Response::new(ResBody::default());
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        res
    }
}

impl<F, ResBody> OnRejected<ResBody> for F
where
    F: Fn(&Rejection) -> Response<ResBody> + Send + Sync + 'static,
{
    fn response(&self, rejection: &Rejection) -> Response<ResBody> {
        self(rejection)
    }
}

/// How a layer answers: its header style and its rejection builder.
#[derive(Debug)]
pub(crate) struct Responder<R> {
    pub(crate) style: HeaderStyle,
    pub(crate) on_rejected: Arc<R>,
    /// The layer has several rules: say which one the legacy headers describe.
    pub(crate) name_rule: bool,
}

/// Whether a request is a gRPC call (`content-type: application/grpc*`).
pub(crate) fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl<R> Responder<R> {
    /// The response to a rejected request: the rejection builder's (or a gRPC status),
    /// with `Retry-After` and the rate-limit headers of the worst rule.
    pub(crate) fn rejected<ResBody>(&self, verdict: &Verdict, grpc: bool) -> Response<ResBody>
    where
        R: OnRejected<ResBody>,
        ResBody: Default,
    {
        let worst = verdict.worst().expect("a rejected verdict has a rejecting rule");
        let d = &verdict.decisions[worst];
        let mut res = if grpc {
            grpc_status(8, "rate limit exceeded")
        } else {
            self.on_rejected.response(&Rejection {
                rule: verdict.checks[worst].rule.clone(),
                key: verdict.checks[worst].key.clone(),
                decision: d.clone(),
                decided_by: verdict.source.unwrap_or(DecidedBy::Store),
            })
        };
        let h = res.headers_mut();
        if let Some(retry) = d.retry_after {
            headers::retry_after(h, retry);
            if grpc {
                let ms = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX).max(1);
                h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
            }
        }
        self.add_headers(h, verdict, worst);
        res
    }

    /// The rate-limit headers of an allowed response, describing the most restrictive rule.
    pub(crate) fn allowed(&self, headers: &mut HeaderMap, verdict: &Verdict) {
        if let Some(most) = verdict.most() {
            self.add_headers(headers, verdict, most);
        }
    }

    fn add_headers(&self, h: &mut HeaderMap, verdict: &Verdict, most: usize) {
        if self.style == HeaderStyle::None {
            return;
        }
        let all: SmallVec<[RuleDecision<'_>; 2]> = verdict.decisions().collect();
        headers::apply(h, self.style, &all[most], &all, self.name_rule);
    }
}

/// The response when the store cannot decide and the fail mode refuses: `503` with
/// `Retry-After` (gRPC: `UNAVAILABLE`).
pub(crate) fn unavailable<ResBody: Default>(grpc: bool, err: &StoreError) -> Response<ResBody> {
    let retry = match err {
        StoreError::CircuitOpen(left) => *left,
        _ => Duration::from_secs(1),
    };
    let mut res = if grpc {
        grpc_status(14, "rate limiter unavailable")
    } else {
        let mut res = Response::new(ResBody::default());
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        res
    };
    headers::retry_after(res.headers_mut(), retry);
    res
}

/// A trailers-only gRPC response: HTTP 200 with `grpc-status` in the headers.
fn grpc_status<ResBody: Default>(code: u8, message: &'static str) -> Response<ResBody> {
    let mut res = Response::new(ResBody::default());
    let h = res.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(u16::from(code)));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}
