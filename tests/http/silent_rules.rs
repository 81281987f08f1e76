//! A rule that limits nothing is said, not silent (issue 38, item 1): with the
//! authentication layer inside the limiter (the other order of two `route_layer` calls), a
//! rule keyed by the account the auth layer puts into the request's extensions gets no key
//! for any request and admits everything. The operator is told once, naming the rule and
//! the likely cause; with the layers in the right order, nothing is said.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::middleware::{self, Next};
use http::{Request, StatusCode};
use tollgate::{MemoryStore, Quota, RateLimitLayer, RequestHead, Rule};
use tower::ServiceExt;

#[derive(Clone)]
struct Account(String);

/// The application's authentication: the account of the `x-api-key`.
async fn auth(mut req: axum::extract::Request, next: Next) -> axum::response::Response {
    if let Some(k) = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
        let account = Account(format!("acct-{k}"));
        req.extensions_mut().insert(account);
    }
    next.run(req).await
}

fn limit() -> RateLimitLayer<MemoryStore> {
    let by_account = |req: &RequestHead| req.extensions().get::<Account>().map(|a| a.0.clone());
    RateLimitLayer::builder(MemoryStore::new())
        .add_rule(Rule::new("account-day", Quota::per_day(3), by_account))
        .build()
        .unwrap()
}

/// The warnings `tracing` receives while `f` runs on this thread.
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            use std::fmt::Write as _;
            let _ = write!(self.0, "{value:?}");
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = String::new();
        event.record(&mut Message(&mut line));
        self.0.lock().unwrap().push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Sends `n` requests with an API key to `app`: their statuses, and the warnings said.
fn run(app: axum::Router, n: usize) -> (Vec<StatusCode>, Vec<String>) {
    let said = Arc::new(Mutex::new(Vec::new()));
    let _guard = tracing::subscriber::set_default(Warnings(said.clone()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let statuses = rt.block_on(async {
        let mut statuses = Vec::new();
        for _ in 0..n {
            let req = Request::get("/").header("x-api-key", "k1").body(Body::empty()).unwrap();
            statuses.push(app.clone().oneshot(req).await.unwrap().status());
        }
        statuses
    });
    let said = said.lock().unwrap().clone();
    (statuses, said)
}

#[test]
fn a_rule_whose_key_an_inner_auth_layer_sets_is_said_to_limit_nothing() {
    // Wrong: the last `route_layer` runs first, so the limit runs before the auth layer.
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .route_layer(middleware::from_fn(auth))
        .route_layer(limit());
    let (statuses, said) = run(app, 12);
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "no key, no limit: {statuses:?}");
    let notices: Vec<&String> = said.iter().filter(|l| l.contains("\"account-day\" got no key")).collect();
    assert_eq!(notices.len(), 1, "said once, naming the rule: {said:#?}");
    assert!(notices[0].contains("first 10 requests") && notices[0].contains("auth"), "{}", notices[0]);
}

#[test]
fn a_rule_that_gets_its_key_is_not_said_to_limit_nothing() {
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .route_layer(limit())
        .route_layer(middleware::from_fn(auth));
    let (statuses, said) = run(app, 12);
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 3, "{statuses:?}");
    assert!(said.iter().all(|l| !l.contains("got no key")), "{said:#?}");
}
