//! What the HTTP tests share: a request, and an inner service that answers by path.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::sync::Notify;
use tower::Service;

/// A `GET` of `path`.
pub(crate) fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// 200, except `/fail` (401) and `/slow` (200 once `go` is notified).
pub(crate) fn app(
    go: Arc<Notify>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(move |req: Request<Body>| {
        let go = go.clone();
        async move {
            let mut res = Response::new(Body::empty());
            match req.uri().path() {
                "/fail" => *res.status_mut() = StatusCode::UNAUTHORIZED,
                "/slow" => go.notified().await,
                _ => {}
            }
            Ok(res)
        }
    })
}
