//! Where the layer's responses are built: the `429` of a rejection (gRPC:
//! `RESOURCE_EXHAUSTED`), the `503` of a store failure under [`FailMode::Closed`]
//! (gRPC: `UNAVAILABLE`), and the rate-limit headers of allowed responses; and the
//! ready-made rejections [`text`] and [`json`].
//!
//! [`FailMode::Closed`]: crate::FailMode::Closed

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use smallvec::SmallVec;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::headers::{self, HeaderStyle};
use crate::key::Key;
use crate::verdict::{Decided, DecidedBy, RuleDecision, Verdict};

/// A rejected request, for [`RateLimitLayer::on_rejected`](crate::RateLimitLayer::on_rejected):
/// the rule that rejected, its decision, and the request's head (for content negotiation).
/// The middleware adds `Retry-After` and the rate-limit headers to the response built from it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Rejection<'a> {
    /// The rule that rejected (its public name: see [`Rule::public_name`](crate::Rule::public_name)).
    pub rule: &'a str,
    /// The key it rejected (for logs; think twice before echoing an API key).
    pub key: &'a Key,
    /// Its decision: [`Decision::retry_after_secs`] is what `Retry-After` says.
    pub decision: &'a Decision,
    /// Who decided: the store, the fallback limiter while the store is down (an
    /// approximate limit), or this process's cache of the store's earlier rejections.
    pub decided_by: DecidedBy,
    /// Whether the key is blocked: a penalty ([`Rule::block_for`](crate::Rule::block_for))
    /// refuses it until [`Decision::retry_after`], whatever it sends meanwhile (an ordinary
    /// rejection of such a rule starts one). A block by hand on a
    /// [`Rule::blockable`](crate::Rule::blockable) rule is not told apart: its
    /// `retry_after` is the block's rest.
    pub blocked: bool,
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's headers (`Accept`, for a body in the client's format).
    pub headers: &'a HeaderMap,
}

/// A request refused because the store could not decide and the fail mode is
/// [`FailMode::Closed`](crate::FailMode::Closed), for
/// [`RateLimitLayer::on_unavailable`](crate::RateLimitLayer::on_unavailable). The
/// middleware adds `Retry-After`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Unavailable<'a> {
    /// Why the store could not decide.
    pub error: &'a StoreError,
    /// What `Retry-After` says (the circuit's remaining cool-down, else 1 s).
    pub retry_after: Duration,
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's headers.
    pub headers: &'a HeaderMap,
}

/// Builds the response of a rejected request. Implemented for closures
/// `Fn(&Rejection<'_>) -> Response<ResBody>`; [`DefaultRejection`] is the default.
pub trait OnRejected<ResBody>: Send + Sync + 'static {
    /// The response for a rejected request.
    fn response(&self, rejection: &Rejection<'_>) -> Response<ResBody>;
}

/// Builds the response of a request refused because the store failed (fail closed).
/// Implemented for closures `Fn(&Unavailable<'_>) -> Response<ResBody>`;
/// [`DefaultUnavailable`] is the default.
pub trait OnUnavailable<ResBody>: Send + Sync + 'static {
    /// The response for a refused request.
    fn response(&self, unavailable: &Unavailable<'_>) -> Response<ResBody>;
}

/// The default rejection: `429 Too Many Requests` with an empty body (any body type with
/// a `Default`: axum's, tonic's, hyper's).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRejection;

impl<ResBody: Default> OnRejected<ResBody> for DefaultRejection {
    fn response(&self, _: &Rejection<'_>) -> Response<ResBody> {
        status(StatusCode::TOO_MANY_REQUESTS)
    }
}

/// The default refusal: `503 Service Unavailable` with an empty body.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultUnavailable;

impl<ResBody: Default> OnUnavailable<ResBody> for DefaultUnavailable {
    fn response(&self, _: &Unavailable<'_>) -> Response<ResBody> {
        status(StatusCode::SERVICE_UNAVAILABLE)
    }
}

impl<F, ResBody> OnRejected<ResBody> for F
where
    F: Fn(&Rejection<'_>) -> Response<ResBody> + Send + Sync + 'static,
{
    fn response(&self, rejection: &Rejection<'_>) -> Response<ResBody> {
        self(rejection)
    }
}

impl<F, ResBody> OnUnavailable<ResBody> for F
where
    F: Fn(&Unavailable<'_>) -> Response<ResBody> + Send + Sync + 'static,
{
    fn response(&self, unavailable: &Unavailable<'_>) -> Response<ResBody> {
        self(unavailable)
    }
}

fn status<ResBody: Default>(code: StatusCode) -> Response<ResBody> {
    let mut res = Response::new(ResBody::default());
    *res.status_mut() = code;
    res
}

/// A ready-made rejection with a plain-text body, for bodies that can carry one
/// (`ResBody: From<String>`: axum's `Body`, `Full<Bytes>`, `String`):
/// `429` with `Too many requests: retry in 31 s.` (or, for a request that can never be
/// accepted, `Too many requests: this request is larger than the limit allows.`).
///
/// ```
/// use tollgate::{key, response, MemoryStore, Quota, RateLimitLayer};
///
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(Quota::per_minute(10), key::PeerIp, MemoryStore::new()).on_rejected(response::text()));
/// ```
pub fn text<ResBody: From<String>>() -> impl Fn(&Rejection<'_>) -> Response<ResBody> + Clone + Send + Sync + 'static {
    |r: &Rejection<'_>| {
        let body = match r.decision.retry_after_secs() {
            Some(s) if r.blocked => format!("Too many requests: blocked for {s} s.\n"),
            Some(s) => format!("Too many requests: retry in {s} s.\n"),
            None => "Too many requests: this request is larger than the limit allows.\n".to_owned(),
        };
        with_body(body, "text/plain; charset=utf-8")
    }
}

/// A ready-made rejection with a JSON body, for bodies that can carry one
/// (`ResBody: From<String>`): `429` with
/// `{"error":"rate_limited","rule":"per-ip","limit":10,"remaining":0,"retry_after":31,"blocked":false}`
/// (`retry_after` is `null` for a request that can never be accepted; `blocked` is true
/// while a penalty blocks the key: see [`Rejection::blocked`]).
///
/// ```
/// use tollgate::{key, response, MemoryStore, Quota, RateLimitLayer};
///
/// let limits = RateLimitLayer::new(Quota::per_minute(10), key::PeerIp, MemoryStore::new())
///     .on_rejected(response::json()); // the body type comes from the router
/// let app: axum::Router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" })).layer(limits);
/// ```
pub fn json<ResBody: From<String>>() -> impl Fn(&Rejection<'_>) -> Response<ResBody> + Clone + Send + Sync + 'static {
    |r: &Rejection<'_>| {
        let d = r.decision;
        let retry = d.retry_after_secs().map_or_else(|| "null".to_owned(), |s| s.to_string());
        let body = format!(
            r#"{{"error":"rate_limited","rule":{},"limit":{},"remaining":{},"retry_after":{retry},"blocked":{}}}"#,
            json_string(r.rule),
            d.limit,
            d.remaining(),
            r.blocked,
        );
        with_body(body, "application/json")
    }
}

/// The JSON twin of [`json`] for a request refused because the store could not decide under
/// [`FailMode::Closed`](crate::FailMode::Closed), for
/// [`RateLimitLayer::on_unavailable`](crate::RateLimitLayer::on_unavailable): `503` with
/// `{"error":"unavailable","retry_after":1}` (`Retry-After` is added by the middleware, and
/// says the same).
///
/// ```
/// use tollgate::{key, response, FailMode, MemoryStore, Quota, RateLimitLayer, Rule};
///
/// let limits = RateLimitLayer::builder(MemoryStore::new())
///     .add_rule(Rule::new("login", Quota::per_minute(5), key::PeerIp).fail_mode(FailMode::Closed))
///     .build()
///     .unwrap()
///     .on_rejected(response::json())
///     .on_unavailable(response::json_unavailable());
/// let app: axum::Router = axum::Router::new().route("/", axum::routing::post(|| async { "ok" })).layer(limits);
/// ```
pub fn json_unavailable<ResBody: From<String>>(
) -> impl Fn(&Unavailable<'_>) -> Response<ResBody> + Clone + Send + Sync + 'static {
    |u: &Unavailable<'_>| {
        let secs = crate::decision::ceil_secs(u.retry_after).max(1);
        let body = format!(r#"{{"error":"unavailable","retry_after":{secs}}}"#);
        with_status_and_body(StatusCode::SERVICE_UNAVAILABLE, body, "application/json")
    }
}

/// The plain-text twin of [`text`] for a request refused because the store could not
/// decide (fail closed): `503` with `Rate limiting is unavailable: retry in 1 s.`
pub fn text_unavailable<ResBody: From<String>>(
) -> impl Fn(&Unavailable<'_>) -> Response<ResBody> + Clone + Send + Sync + 'static {
    |u: &Unavailable<'_>| {
        let secs = crate::decision::ceil_secs(u.retry_after).max(1);
        let body = format!("Rate limiting is unavailable: retry in {secs} s.\n");
        with_status_and_body(StatusCode::SERVICE_UNAVAILABLE, body, "text/plain; charset=utf-8")
    }
}

fn with_body<ResBody: From<String>>(body: String, content_type: &'static str) -> Response<ResBody> {
    with_status_and_body(StatusCode::TOO_MANY_REQUESTS, body, content_type)
}

fn with_status_and_body<ResBody: From<String>>(
    status: StatusCode,
    body: String,
    content_type: &'static str,
) -> Response<ResBody> {
    let mut res = Response::new(ResBody::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

/// `s` as a JSON string: quotes, backslashes and control characters escaped.
fn json_string(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// How a layer answers: its header style, and its rejection and refusal builders. The
/// names rules are shown under come with the rule set a request was decided by.
pub(crate) struct Responder<R, U> {
    pub(crate) style: HeaderStyle,
    pub(crate) on_rejected: Arc<R>,
    pub(crate) on_unavailable: Arc<U>,
}

/// Marks a refusal this crate made, in its response's extensions (see [`is_refusal`]).
#[derive(Debug, Clone, Copy)]
struct Refused;

/// Whether a response an inner layer (or the handler) produced is a refusal: a 429, one
/// this crate made (a gRPC refusal is HTTP 200; `on_rejected` may pick any status), or one
/// that says when to retry.
pub(crate) fn is_refusal<ResBody>(res: &Response<ResBody>) -> bool {
    res.status() == http::StatusCode::TOO_MANY_REQUESTS
        || res.extensions().get::<Refused>().is_some()
        || res.headers().contains_key(http::header::RETRY_AFTER)
}

/// Whether a request is a gRPC call (`content-type: application/grpc*`).
fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// What responses say of the rules that decided: the names clients see, one per rule of
/// the set (empty: hidden), and the header style a reloaded configuration named, if any.
pub(crate) struct Names<'a> {
    pub(crate) public: &'a [Arc<str>],
    pub(crate) style: Option<HeaderStyle>,
}

impl<R, U> Responder<R, U> {
    /// The response to a rejected request: the rejection builder's (or a gRPC status),
    /// with `Retry-After` and the rate-limit headers of the worst rule.
    pub(crate) fn rejected<ResBody, B>(
        &self,
        verdict: &Verdict,
        (worst, key): (usize, &Key),
        names: &Names<'_>,
        blocks: bool,
        req: &Request<B>,
    ) -> Response<ResBody>
    where
        R: OnRejected<ResBody>,
        ResBody: Default,
    {
        let worst_rule = &verdict.decided[worst];
        let d = &worst_rule.decision;
        let grpc = is_grpc(req);
        let mut res = if grpc {
            grpc_status(8, "rate limit exceeded")
        } else {
            self.on_rejected.response(&Rejection {
                rule: &names.public[worst_rule.rule],
                key,
                decision: d,
                decided_by: verdict.source.unwrap_or(DecidedBy::Store),
                blocked: blocks && d.retry_after().is_some(),
                method: req.method(),
                uri: req.uri(),
                headers: req.headers(),
            })
        };
        let h = res.headers_mut();
        if let Some(retry) = d.retry_after() {
            headers::retry_after(h, retry);
            if grpc {
                let ms = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX).max(1);
                h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
            }
        }
        self.add_headers(h, &verdict.decided, names, worst, false);
        // Whatever its status (a gRPC refusal is HTTP 200; `on_rejected` may pick any):
        // an outer layer knows this response for a refusal.
        res.extensions_mut().insert(Refused);
        res
    }

    /// The rate-limit headers describing rule `most` of `verdict` — merged with those of an
    /// inner layer the response already carries (`inner_refused`: that layer, or the
    /// handler, refused it; see [`is_refusal`]).
    pub(crate) fn add_headers(
        &self,
        h: &mut HeaderMap,
        decided: &[Decided],
        names: &Names<'_>,
        most: usize,
        inner_refused: bool,
    ) {
        // A reloaded configuration may name the style.
        let style = names.style.unwrap_or(self.style);
        if style == HeaderStyle::None {
            return;
        }
        // Issue 42: a concurrency rule is never the one the headers describe, nor listed in
        // the IETF policy (it has no window): a refusal by one describes the most
        // restrictive rate rule, if any.
        let most = match decided[most].permits {
            false => most,
            true => match crate::verdict::fewest_left(decided) {
                Some(i) => i,
                None => return,
            },
        };
        let rates = || decided.iter().filter(|d| !d.permits);
        let all: SmallVec<[RuleDecision<'_>; 2]> = rates().map(|d| d.as_shown(&names.public[d.rule], None)).collect();
        let shown = rates().position(|d| std::ptr::eq(d, &decided[most])).unwrap_or(0);
        // Several rules: say which one the legacy headers describe.
        headers::apply(h, style, &all[shown], &all, names.public.len() > 1, inner_refused);
    }

    /// The response when the store cannot decide and the fail mode refuses: the refusal
    /// builder's `503` (gRPC: `UNAVAILABLE`), with `Retry-After`.
    pub(crate) fn unavailable<ResBody, B>(&self, error: &StoreError, req: &Request<B>) -> Response<ResBody>
    where
        U: OnUnavailable<ResBody>,
        ResBody: Default,
    {
        let retry_after = match error {
            StoreError::CircuitOpen(left) => *left,
            _ => Duration::from_secs(1),
        };
        let mut res = if is_grpc(req) {
            grpc_status(14, "rate limiter unavailable")
        } else {
            self.on_unavailable.response(&Unavailable {
                error,
                retry_after,
                method: req.method(),
                uri: req.uri(),
                headers: req.headers(),
            })
        };
        headers::retry_after(res.headers_mut(), retry_after);
        res
    }
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
