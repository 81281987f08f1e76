//! A production-shaped axum app: layered limits in one layer, tiers, per-route rules,
//! limits read from a config file, Prometheus metrics, and admin routes.
//!
//! ```text
//! cargo run -p tollgate-examples --features production --example production
//! LIMITS_FILE=limits.toml INTERNAL_TOKEN=s3cret cargo run -p tollgate-examples --features production --example production
//! ```
//!
//! With `LIMITS_FILE`, edit the file and send `SIGHUP` (`kill -HUP <pid>`) to apply it
//! without a restart: the configured rules are swapped atomically, each key keeps what it
//! used, and a file with a mistake is refused with the reason while the limits in force
//! stay.
//!
//! Public listener (`PORT`, default 3000):
//!
//! | route | limits |
//! |---|---|
//! | `GET /health` | none: load balancers must always reach it |
//! | `POST /auth/login`, `POST /auth/token` | 10 failed attempts a minute per client address, per route; fail-closed |
//! | `GET /api/me`, `GET /api/orders/{id}` | per IP, per API key (both from [`LIMITS_TOML`]), and per account per minute and per day by tier — all in one store call |
//! | `POST /api/completions` | the above, and an LLM-style limit per API key: 3 in flight (held until the streamed answer ends) and 60 a minute |
//!
//! Internal listener (`ADMIN_PORT`, default 9000; loopback only, never public):
//! `GET /metrics` (Prometheus), `GET /admin/limits/{rule}/{key}` (a key's state under a
//! rule; `?quota=6000/min` for tier rules) and `DELETE /admin/limits/{rule}/{key}` (forget
//! it: "unblock this customer").
//!
//! Demo API keys: `demo-free`, `demo-pro`, `demo-enterprise`. Demo login: `alice` /
//! `wonderland`. Try:
//!
//! ```text
//! for i in $(seq 61); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: demo-free' localhost:3000/api/me; done
//! curl -i -H 'x-api-key: demo-free' localhost:3000/api/me        # 429, X-RateLimit-Rule: account-minute
//! curl localhost:9000/admin/limits/account-minute/acct-free
//! curl -X DELETE localhost:9000/admin/limits/account-minute/acct-free
//! curl -s localhost:9000/metrics | grep tollgate_
//! ```
//!
//! The store here is a `MemoryStore`: one process. With several servers, pass a
//! `RedisStore` instead (see the quickstart example); nothing else changes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tollgate::key::{self, Key, KeyExtractor};
use tollgate::store::Store;
use tollgate::RequestHead;
use tollgate::{BuildError, Decision, FailMode, HeaderStyle, LayerConfig, Quota, RateLimitLayer, Rule, StoreError};

/// The limits operations tune without a rebuild (`LIMITS_FILE` replaces them). Rules
/// that need code — the account's tier, the login rule — are defined in [`limits`].
pub const LIMITS_TOML: &str = r#"
# Both header styles: X-RateLimit-* for older clients, the IETF RateLimit /
# RateLimit-Policy for newer ones.
headers = "both"

# Everyone, authenticated or not: a ceiling per client address.
[[rule]]
name = "ip"
key = "peer_ip"
quota = "600/min"

# Per API key, valid or not (guessing keys spends the guesser's per-address budget
# too). Fail-open: if the store is down, paying customers keep working.
[[rule]]
name = "api-key"
key = "header:x-api-key"
quota = "100/min"
algorithm = "sliding_window_counter"
fail_mode = "open"

# Rolling out a stricter per-address limit: shadow mode records what it would reject
# (metric tollgate_decisions_total{outcome="shadow_rejected"}) and never rejects.
[[rule]]
name = "ip-strict"
key = "peer_ip"
quota = "120/min"
shadow = true
"#;

/// The header internal callers (batch jobs, other services) send with the shared secret
/// to pass the public API limits.
pub const INTERNAL_HEADER: &str = "x-internal-token";

/// An account's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// 60 a minute, 1,000 a day.
    Free,
    /// 6,000 a minute, 100,000 a day.
    Pro,
    /// No account limit (the per-IP and per-key limits still apply).
    Enterprise,
}

impl Tier {
    /// The per-minute quota; `None` is unlimited.
    #[must_use]
    pub fn per_minute(self) -> Option<Quota> {
        match self {
            Tier::Free => Some(Quota::per_minute(60)),
            Tier::Pro => Some(Quota::per_minute(6_000)),
            Tier::Enterprise => None,
        }
    }

    /// The per-day quota; `None` is unlimited.
    #[must_use]
    pub fn per_day(self) -> Option<Quota> {
        match self {
            Tier::Free => Some(Quota::per_day(1_000)),
            Tier::Pro => Some(Quota::per_day(100_000)),
            Tier::Enterprise => None,
        }
    }
}

/// Who is calling: put into the request's extensions by [`authenticate`].
#[derive(Debug, Clone)]
pub struct Account {
    /// The account id: the key of the account rules (all of an account's API keys share them).
    pub id: Arc<str>,
    /// The plan, which chooses the account rules' quotas.
    pub tier: Tier,
}

/// API key → account. In a real app: a database or an auth service behind a cache.
#[derive(Debug, Clone, Default)]
pub struct Accounts(Arc<HashMap<String, Account>>);

impl Accounts {
    /// Accounts by API key.
    pub fn new(keys: impl IntoIterator<Item = (String, Account)>) -> Self {
        Self(Arc::new(keys.into_iter().collect()))
    }

    /// The demo accounts, one per tier.
    #[must_use]
    pub fn demo() -> Self {
        Self::new([Tier::Free, Tier::Pro, Tier::Enterprise].map(|tier| {
            let name = format!("{tier:?}").to_lowercase();
            (format!("demo-{name}"), Account { id: format!("acct-{name}").into(), tier })
        }))
    }
}

/// The limiters of the app. Clones share their state.
pub struct Limits<St> {
    /// Everything under `/api`: IP, API key, account per minute and per day, and the
    /// shadow rule — decided in one store call per request.
    pub api: RateLimitLayer<St>,
    /// `/auth/*`: failed attempts per client address and route.
    pub auth: RateLimitLayer<St>,
    /// `/api/completions`: 3 in flight and 60 a minute per API key.
    pub completions: RateLimitLayer<St>,
    /// What code adds to each configured rule (the internal callers' pass), for reloads.
    allow_internal: Arc<dyn Fn(Rule<RequestHead>) -> Rule<RequestHead> + Send + Sync>,
}

impl<St> Clone for Limits<St> {
    fn clone(&self) -> Self {
        Self {
            api: self.api.clone(),
            auth: self.auth.clone(),
            completions: self.completions.clone(),
            allow_internal: self.allow_internal.clone(),
        }
    }
}

impl<St: std::fmt::Debug> std::fmt::Debug for Limits<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("api", &self.api)
            .field("auth", &self.auth)
            .field("completions", &self.completions)
            .finish_non_exhaustive()
    }
}

impl<St> Limits<St> {
    /// Applies a new limits file to the running API layer: its rules replace the
    /// configured ones (with the internal callers' pass, as at start-up); the account
    /// rules, defined in code, stay.
    ///
    /// # Errors
    ///
    /// A rule name the code rules use; the limits in force stay.
    pub fn reload(&self, config: &LayerConfig) -> Result<(), BuildError> {
        self.api.handle().reload_with(config, |rule| (self.allow_internal)(rule))
    }
}

/// The account that [`authenticate`] found, if any.
fn account(req: &RequestHead) -> Option<&Account> {
    req.extensions().get::<Account>()
}

/// Builds the limiters over one `store`: the rules of `config` plus the rules that need
/// code. `internal_token` is the secret that lets internal callers pass the API limits
/// (`None`: nobody passes).
///
/// # Errors
///
/// A rule name that `config` already uses.
pub fn limits<St: Store + Clone>(
    store: St,
    config: &LayerConfig,
    internal_token: Option<Arc<str>>,
) -> Result<Limits<St>, BuildError> {
    // Allow-list: a request with the right secret is not limited by any API rule. (A
    // secret, not just a header: a header alone anyone can send. Real code compares it in
    // constant time, e.g. with the `subtle` crate.)
    let internal = move |req: &RequestHead| {
        let sent = req.headers().get(INTERNAL_HEADER).map(axum::http::HeaderValue::as_bytes);
        matches!((&internal_token, sent), (Some(token), Some(sent)) if token.as_bytes() == sent)
    };
    let internal = Arc::new(internal);
    let bypass = move |rule: Rule<RequestHead>| {
        let internal = internal.clone();
        rule.bypass_if(move |req: &RequestHead| internal(req))
    };

    // The account rules. The key is the account id (every API key of an account shares
    // the budget); the quota is the account's tier, chosen per request. Enterprise gets
    // `None`: no limit. Unauthenticated requests have no account: the rules skip them
    // (the IP rule still applies). The quota given to `Rule::new` is the free tier's: it
    // is what the admin routes assume unless told otherwise.
    let account_id = |req: &RequestHead| account(req).map(|a| Key::from(&*a.id));
    let per_minute = Rule::new("account-minute", Quota::per_minute(60), account_id)
        .quota_fn(|req: &RequestHead| account(req)?.tier.per_minute());
    let per_day = Rule::new("account-day", Quota::per_day(1_000), account_id)
        .quota_fn(|req: &RequestHead| account(req)?.tier.per_day());

    let mut api = RateLimitLayer::builder(store.clone());
    for rule in config.to_rules() {
        api = api.add_rule(bypass(rule));
    }
    // One layer, so one store call decides all rules, and a request that one rule
    // rejects consumes nothing from the others.
    let api = config.apply(api.add_rule(bypass(per_minute)).add_rule(bypass(per_day))).build()?;

    // Failed credentials, per client address *and route*: `MatchedPath` is the route
    // template ("/auth/login"), so one layer gives every auth route its own budget, and a
    // path with ids ("/orders/{id}") would still be one key, not one per id.
    let route_and_ip = |req: &RequestHead| {
        let route = req.extensions().get::<MatchedPath>()?.as_str();
        let ip = key::PeerIp.extract(req)?;
        Some([route.as_bytes(), b" ", &ip.as_bytes()].concat())
    };
    // An LLM-style endpoint: a few slow, expensive calls hurt more than many cheap ones.
    // At most 3 of an API key's completions in flight on every server (a permit each,
    // held until the streamed answer ends: see `public_router`), and 60 a minute.
    let completions = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::concurrent("completions-in-flight", 3, key::header("x-api-key")))
        .add_rule(Rule::new("completions-minute", Quota::per_minute(60), key::header("x-api-key")))
        .build()?;
    let auth = RateLimitLayer::builder(store)
        .add_rule(
            Rule::new("login", Quota::per_minute(10), route_and_ip)
                // Only failures count: a user who logs in successfully is given the unit back.
                .count_if(|status| status == StatusCode::UNAUTHORIZED)
                // Without the store, an unlimited login is worse than a 503: fail closed.
                .fail_mode(FailMode::Closed),
        )
        .build()?
        .headers(HeaderStyle::Both);
    Ok(Limits { api, auth, completions, allow_internal: Arc::new(bypass) })
}

/// Finds the account of the request's API key and puts it into the extensions. It runs
/// *outside* (before) the rate-limit layer, so the account rules can read it. It rejects
/// nothing: a request without a valid key still meets the per-IP limit, then the handler.
pub async fn authenticate(State(accounts): State<Accounts>, mut req: Request, next: Next) -> Response {
    let found = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).and_then(|k| accounts.0.get(k)).cloned();
    if let Some(account) = found {
        req.extensions_mut().insert(account);
    }
    next.run(req).await
}

/// The public app.
pub fn public_router<St: Store + Clone>(limits: &Limits<St>, accounts: Accounts) -> Router {
    // `hold_permits`: a completion's permit is held until its body ends, not only until
    // its headers are written.
    let completions =
        Router::new().route("/completions", post(complete)).route_layer(limits.completions.clone().hold_permits());
    let api = Router::new()
        .route("/me", get(me))
        .route("/orders/{id}", get(order))
        .merge(completions)
        // `route_layer`: only requests that match a route meet the limits, so a 404 spends
        // no quota (a wrong method on a real path, 405, does: axum layers each path's
        // method router as a whole), and `MatchedPath` is known to the key extractors.
        .route_layer(limits.api.clone())
        // `layer` after it wraps the routes *and* the limits: authentication runs first.
        .layer(middleware::from_fn_with_state(accounts, authenticate));
    let auth = Router::new().route("/login", post(login)).route("/token", post(token)).route_layer(limits.auth.clone());
    Router::new().route("/health", get(|| async { "ok\n" })).nest("/api", api).nest("/auth", auth)
}

/// `POST /api/completions`: a slow answer (a real one would stream tokens as they come).
async fn complete() -> &'static str {
    tokio::time::sleep(COMPLETION_TIME).await;
    "Once upon a time…\n"
}

/// How long [`complete`] takes.
pub const COMPLETION_TIME: Duration = Duration::from_millis(200);

/// The internal app: metrics and admin routes. Serve it on a port only operators reach.
pub fn internal_router<St: Store + Clone>(limits: Limits<St>, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = metrics.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
            }),
        )
        .route("/admin/limits/{rule}/{key}", get(peek_limit::<St>).delete(reset_limit::<St>))
        .with_state(limits)
}

async fn me(account: Option<Extension<Account>>, decision: Option<Extension<Decision>>) -> Response {
    let Some(Extension(account)) = account else { return unauthorized() };
    // The layer put the most restrictive rule's decision into the extensions (absent when
    // the store failed open, or for an internal caller: nothing is known then).
    let left = decision.map_or_else(|| "unknown".to_owned(), |Extension(d)| d.remaining().to_string());
    format!("account {} ({:?}), {left} requests left\n", account.id, account.tier).into_response()
}

async fn order(account: Option<Extension<Account>>, Path(id): Path<u64>) -> Response {
    let Some(Extension(account)) = account else { return unauthorized() };
    format!("order {id} of {}\n", account.id).into_response()
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, "send a valid x-api-key\n").into_response()
}

async fn login(Form(form): Form<HashMap<String, String>>) -> StatusCode {
    let ok = form.get("user").is_some_and(|u| u == "alice") && form.get("password").is_some_and(|p| p == "wonderland");
    if ok {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

async fn token(Form(form): Form<HashMap<String, String>>) -> Response {
    if form.get("client_id").is_some_and(|c| c == "cli") && form.get("client_secret").is_some_and(|s| s == "shh") {
        "{\"access_token\":\"demo\"}\n".into_response()
    } else {
        StatusCode::UNAUTHORIZED.into_response()
    }
}

/// The layer holding `rule`.
fn layer_of<'a, St>(limits: &'a Limits<St>, rule: &str) -> Option<&'a RateLimitLayer<St>> {
    [&limits.api, &limits.auth].into_iter().find(|l| l.rules().iter().any(|r| r.name() == rule))
}

/// `GET /admin/limits/{rule}/{key}[?quota=6000/min]`: the key's state under the rule, as
/// JSON. Tier rules are read under the free quota unless `quota` names the account's.
async fn peek_limit<St: Store + Clone>(
    State(limits): State<Limits<St>>,
    Path((rule, key)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Some(layer) = layer_of(&limits, &rule) else { return no_rule(&rule) };
    let peeked = match query.get("quota").map(|q| q.parse::<Quota>()) {
        None => layer.peek(&rule, key).await,
        Some(Ok(quota)) => layer.peek_with(&rule, key, quota).await,
        Some(Err(e)) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    match peeked {
        Ok(d) => {
            let ms = |d: Duration| d.as_millis().to_string();
            let json = format!(
                "{{\"allowed\":{},\"limit\":{},\"remaining\":{},\"reset_after_ms\":{},\"retry_after_ms\":{}}}\n",
                d.allowed,
                d.limit,
                d.remaining(),
                ms(d.reset_after()),
                d.retry_after().map_or_else(|| "null".to_owned(), ms),
            );
            ([(header::CONTENT_TYPE, "application/json")], json).into_response()
        }
        Err(StoreError::UnknownRule(_)) => no_rule(&rule),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

/// `DELETE /admin/limits/{rule}/{key}`: the key starts afresh under the rule.
async fn reset_limit<St: Store + Clone>(
    State(limits): State<Limits<St>>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    let Some(layer) = layer_of(&limits, &rule) else { return no_rule(&rule) };
    match layer.reset(&rule, key).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(StoreError::UnknownRule(_)) => no_rule(&rule),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

fn no_rule(rule: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("no rule named {rule:?}\n")).into_response()
}

/// Installs the Prometheus recorder once per process (the `metrics` facade has one
/// global recorder) and returns its handle. No HTTP listener of its own: the internal
/// router renders it at `/metrics`.
///
/// # Panics
///
/// When another `metrics` recorder was installed first.
#[must_use]
pub fn install_metrics() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().expect("no other metrics recorder is installed"))
        .clone()
}

/// Re-reads the limits file on every `SIGHUP` and swaps its rules in; a file that does not
/// read or build leaves the limits in force, and says why.
#[cfg(unix)]
fn reload_on_sighup<St: Send + Sync + 'static>(limits: Limits<St>, path: String) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let read = std::fs::read_to_string(&path).map_err(|e| e.to_string());
            let config = read.and_then(|text| LayerConfig::from_toml(&text).map_err(|e| e.to_string()));
            match config.and_then(|c| limits.reload(&c).map_err(|e| e.to_string())) {
                Ok(()) => {
                    let rules = limits.api.rules();
                    let list: Vec<String> = rules.iter().map(|r| format!("{} {}", r.name(), r.quota())).collect();
                    println!("limits reloaded from {path}: {}", list.join(", "));
                }
                Err(e) => println!("limits file {path} not applied, the limits in force stay: {e}"),
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
fn reload_on_sighup<St>(_: Limits<St>, _: String) -> std::io::Result<()> {
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let port = |var: &str, default: u16| std::env::var(var).ok().and_then(|p| p.parse().ok()).unwrap_or(default);
    // A mistake in the limits stops the start-up, naming the rule and the field.
    let config = match std::env::var("LIMITS_FILE") {
        Ok(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("limits file {path}: {e}"))?;
            LayerConfig::from_toml(&text).map_err(|e| format!("limits file {path}: {e}"))?
        }
        Err(_) => LayerConfig::from_toml(LIMITS_TOML)?,
    };
    let internal_token = std::env::var("INTERNAL_TOKEN").ok().filter(|t| !t.is_empty()).map(Arc::from);

    let metrics = install_metrics();
    // The recorder's histograms need periodic upkeep when nothing scrapes for a while.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });

    let limits = limits(tollgate::MemoryStore::new(), &config, internal_token)?;
    if let Ok(path) = std::env::var("LIMITS_FILE") {
        reload_on_sighup(limits.clone(), path)?;
    }
    let public = public_router(&limits, Accounts::demo());
    let internal = internal_router(limits, metrics);

    let public_listener = tokio::net::TcpListener::bind(("127.0.0.1", port("PORT", 3000))).await?;
    let internal_listener = tokio::net::TcpListener::bind(("127.0.0.1", port("ADMIN_PORT", 9000))).await?;
    println!("listening on http://{}", public_listener.local_addr()?);
    println!("internal (metrics, admin) on http://{}", internal_listener.local_addr()?);
    // Connect info lets key::PeerIp see client addresses.
    let public = axum::serve(public_listener, public.into_make_service_with_connect_info::<SocketAddr>());
    let internal = axum::serve(internal_listener, internal);
    tokio::try_join!(async { public.await }, async { internal.await })?;
    Ok(())
}
