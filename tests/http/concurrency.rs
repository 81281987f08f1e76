//! Issue 42 in the HTTP layer: a concurrency rule's permit is held from the decision until
//! the response's body ends ([`RateLimitLayer::hold_permits`]), and given back exactly once
//! at every place a request may stop — the client gone mid-handler, a timeout around the
//! layer, a handler that panics, a body dropped mid-stream, an error from the handler. A
//! refusal is a 429 with `Retry-After`; the rate-limit headers describe the rate rule, and
//! the IETF policy lists no concurrency rule.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tollgate::headers::X_RATELIMIT_LIMIT;
use tollgate::HeaderStyle;
use tollgate::{key, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, Service, ServiceExt};

/// A body whose chunks come from a channel: it ends when the sender is dropped.
struct Chunks(mpsc::Receiver<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

/// One in flight per `x-key`, and 100 a minute.
fn limit() -> RateLimitLayer<MemoryStore> {
    RateLimitLayer::builder(MemoryStore::new())
        .add_rule(Rule::new("per-minute", Quota::per_minute(100), key::header("x-key")))
        .add_rule(Rule::concurrent("in-flight", 1, key::header("x-key")))
        .headers(HeaderStyle::Both)
        .build()
        .unwrap()
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).header("x-key", "ada").body(Body::empty()).unwrap()
}

/// `/stream`: a body fed by the sender this returns; `/sleep`: 200 after 10 s; `/panic`:
/// panics; `/error`: the service's error; else 200 at once.
fn inner(
    streams: mpsc::UnboundedSender<mpsc::Sender<Bytes>>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = std::io::Error, Future: Send> + Clone {
    tower::service_fn(move |req: Request<Body>| {
        let streams = streams.clone();
        async move {
            match req.uri().path() {
                "/stream" => {
                    let (tx, rx) = mpsc::channel(4);
                    streams.send(tx).unwrap();
                    Ok(Response::new(Body::new(Chunks(rx))))
                }
                "/sleep" => {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    Ok(Response::new(Body::empty()))
                }
                "/panic" => panic!("the handler panicked"),
                "/error" => Err(std::io::Error::other("the handler failed")),
                _ => Ok(Response::new(Body::empty())),
            }
        }
    })
}

/// Whether a request of `ada` is admitted now (its permit given back at once).
async fn admitted<S>(svc: &S) -> bool
where
    S: Service<Request<Body>, Response = Response<tollgate::hold::PermitBody<Body>>> + Clone,
    S::Error: std::fmt::Debug,
{
    let res = svc.clone().oneshot(get("/")).await.unwrap();
    let ok = res.status() == StatusCode::OK;
    drop(res.into_body().collect().await);
    ok
}

#[tokio::test]
async fn the_permit_is_held_until_the_body_ends() {
    let (tx, mut streams) = mpsc::unbounded_channel();
    let svc = limit().hold_permits().layer(inner(tx));
    let res = svc.clone().oneshot(get("/stream")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.body().permits(), 1, "the permit moved into the body");
    let feed = streams.recv().await.unwrap();
    // The response's head is out; the body streams: the permit is held.
    let refused = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    // The headers describe the rate rule, never the concurrency rule.
    assert_eq!(refused.headers()[X_RATELIMIT_LIMIT], "100");
    let policy = refused.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(policy.contains("per-minute") && !policy.contains("in-flight"), "{policy}");
    let mut body = res.into_body();
    feed.send(Bytes::from_static(b"part")).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part");
    assert_eq!(body.permits(), 1, "a frame is not the end");
    assert!(!admitted(&svc).await, "mid-stream: still held");
    drop(feed); // the stream ends
    assert!(body.frame().await.is_none());
    assert_eq!(body.permits(), 0, "given back at the body's end");
    assert!(admitted(&svc).await);
    drop(body);
    assert!(admitted(&svc).await, "dropping an ended body gives nothing back twice");
    assert!(admitted(&svc).await);
}

#[tokio::test]
async fn a_body_dropped_mid_stream_gives_the_permit_back() {
    let (tx, mut streams) = mpsc::unbounded_channel();
    let svc = limit().hold_permits().layer(inner(tx));
    let res = svc.clone().oneshot(get("/stream")).await.unwrap();
    let feed = streams.recv().await.unwrap();
    feed.send(Bytes::from_static(b"part")).await.unwrap();
    let mut body = res.into_body();
    let _ = body.frame().await;
    assert!(!admitted(&svc).await);
    drop(body); // the client went away mid-download
    assert!(admitted(&svc).await);
}

#[tokio::test]
async fn the_client_gone_mid_handler_gives_the_permit_back() {
    tokio::time::pause();
    let (tx, _streams) = mpsc::unbounded_channel();
    let svc = limit().hold_permits().layer(inner(tx));
    let mut call = Box::pin(svc.clone().oneshot(get("/sleep")));
    assert!(futures_poll(&mut call).await.is_none(), "in the handler");
    assert!(!admitted(&svc).await, "held while the handler runs");
    drop(call);
    assert!(admitted(&svc).await);
}

#[tokio::test]
async fn a_timeout_around_the_layer_gives_the_permit_back() {
    tokio::time::pause();
    let (tx, _streams) = mpsc::unbounded_channel();
    let svc =
        tower::timeout::TimeoutLayer::new(Duration::from_millis(100)).layer(limit().hold_permits().layer(inner(tx)));
    let err = svc.clone().oneshot(get("/sleep")).await.unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    let res = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the timed-out request's permit went back");
}

#[tokio::test]
async fn a_panicking_handler_gives_the_permit_back() {
    let (tx, _streams) = mpsc::unbounded_channel();
    let svc = limit().hold_permits().layer(inner(tx));
    let panicked = tokio::spawn(svc.clone().oneshot(get("/panic"))).await;
    assert!(panicked.unwrap_err().is_panic());
    assert!(admitted(&svc).await);
}

#[tokio::test]
async fn a_handler_error_gives_the_permit_back() {
    let (tx, _streams) = mpsc::unbounded_channel();
    let svc = limit().hold_permits().layer(inner(tx));
    assert!(svc.clone().oneshot(get("/error")).await.is_err());
    assert!(admitted(&svc).await);
}

#[tokio::test]
async fn without_hold_permits_the_layer_keeps_its_response_type_and_gives_back_with_the_head() {
    let (tx, mut streams) = mpsc::unbounded_channel();
    // The plain layer: `Response<Body>`, as for users without concurrency rules.
    let svc = limit().layer(inner(tx));
    let res: Response<Body> = svc.clone().oneshot(get("/stream")).await.unwrap();
    let _feed = streams.recv().await.unwrap();
    let refused = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "held while the response's head lives");
    let (parts, _body) = res.into_parts();
    drop(parts); // what a server does once the head is written
    let res = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// Polls `fut` once after letting the runtime run: `None` while it is pending.
async fn futures_poll<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *fut).poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}
