//! Managed Redis: a password or an ACL user in the URL (standalone and cluster), TLS
//! (`rediss://`) against a CA made at test time, and the password kept out of every
//! message, `Debug` output and log line.
//!
//! Every test starts its own redis-server processes (see `support/redis.rs`).
#![cfg(feature = "redis")]

use crate::support;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate::store::Params;
use tollgate::store::{Check, Store};
use tollgate::{key, Algorithm, FailMode, Quota, RateLimitLayer, RedisStore, StoreError};
use tower::{Layer, ServiceExt};

use support::redis::{RedisCluster, RedisServer};

/// The limit of every layer here: exactly `LIMIT` of `LIMIT + 3` requests pass.
const LIMIT: usize = 5;
/// Worst latency allowed for a request whose store cannot authenticate: the layer's
/// 50 ms deadline plus scheduling slack on a busy two-core machine. A hang fails.
const BOUND: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// Log capture: a tiny `tracing` subscriber that writes every event and span field
// (all levels) into one buffer, for the whole test binary.
// ---------------------------------------------------------------------------

static LOG: Mutex<String> = Mutex::new(String::new());

struct Capture;

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut line = format!("span {}:", span.metadata().name());
        span.record(&mut Fields(&mut line));
        log_line(line);
        tracing::span::Id::from_u64(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut line = String::from("record:");
        values.record(&mut Fields(&mut line));
        log_line(line);
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = format!("{} {}:", event.metadata().level(), event.metadata().target());
        event.record(&mut Fields(&mut line));
        log_line(line);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

fn log_line(line: String) {
    let mut log = LOG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    log.push_str(&line);
    log.push('\n');
}

/// Installs [`Capture`] as the global subscriber (once per test binary).
fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| tracing::subscriber::set_global_default(Capture).expect("no other subscriber"));
}

fn logs() -> String {
    LOG.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// Fails when any of `secrets` is in `text` (`what` names where it came from).
fn assert_hidden(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "{what} shows {secret:?}:\n{text}");
    }
}

// ---------------------------------------------------------------------------
// Requests through the layer
// ---------------------------------------------------------------------------

/// What `n` requests through a one-rule layer got.
struct Outcome {
    statuses: Vec<StatusCode>,
    /// How many requests reached the inner service.
    inner_calls: usize,
    worst: Duration,
}

impl Outcome {
    fn count(&self, code: StatusCode) -> usize {
        self.statuses.iter().filter(|s| **s == code).count()
    }

    /// Exactly `LIMIT` passed and the rest were rate limited: no store error at all
    /// (under `FailMode::Closed` an error is a 503).
    fn assert_exact(&self) {
        assert_eq!(self.statuses.len(), LIMIT + 3);
        assert_eq!(self.count(StatusCode::OK), LIMIT, "{:?}", self.statuses);
        assert_eq!(self.count(StatusCode::TOO_MANY_REQUESTS), 3, "{:?}", self.statuses);
        assert!(self.statuses[..LIMIT].iter().all(|s| *s == StatusCode::OK), "{:?}", self.statuses);
        assert_eq!(self.inner_calls, LIMIT);
    }
}

/// Sends `n` requests for `key` one after the other through a GCRA layer of `LIMIT` a
/// minute on `store`, with `mode` and a layer deadline of `deadline`.
async fn send(store: &RedisStore, mode: FailMode, deadline: Duration, key: &str, n: usize) -> Outcome {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let inner = tower::service_fn(move |_: Request<Body>| {
        counted.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
    });
    let svc = RateLimitLayer::builder(store.clone())
        .rule("default", Quota::per_minute(LIMIT as u64), key::header("x-api-key"))
        .algorithm(Algorithm::Gcra)
        .fail_mode(mode)
        .timeout(deadline)
        .local_cache(false)
        .build()
        .unwrap()
        .layer(inner);
    let mut statuses = Vec::with_capacity(n);
    let mut worst = Duration::ZERO;
    for _ in 0..n {
        let req = Request::get("/").header("x-api-key", key).body(Body::empty()).unwrap();
        let started = Instant::now();
        let res = svc.clone().oneshot(req).await.unwrap();
        worst = worst.max(started.elapsed());
        statuses.push(res.status());
    }
    Outcome { statuses, inner_calls: calls.load(Ordering::Relaxed), worst }
}

/// A store with generous timeouts (a slow machine must not turn into errors), connected.
async fn connected(url: &str) -> RedisStore {
    let store = RedisStore::from_url(url).unwrap().response_timeout(Duration::from_secs(2));
    store.ping().await.unwrap_or_else(|e| panic!("ping: {e}"));
    store
}

/// Correct credentials: exactly `LIMIT` of `LIMIT + 3` pass under `FailMode::Closed`.
async fn assert_decides(store: &RedisStore, key: &str) {
    let outcome = send(store, FailMode::Closed, Duration::from_secs(2), key, LIMIT + 3).await;
    outcome.assert_exact();
}

/// Credentials the server refuses: `ping` and the request path fail with a store error
/// that says authentication failed; `FailMode::Open` lets every request through,
/// `FailMode::Closed` answers 503 without calling the inner service; nothing hangs. Returns
/// every message seen, for the caller to search for secrets.
async fn assert_refused(store: &RedisStore, key: &str) -> String {
    let mut messages = String::new();
    let err = store.ping().await.expect_err("the server must refuse these credentials");
    messages.push_str(&format!("{err}\n{err:?}\n"));
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("authentication failed: the server refused the user name or password"), "{err}");

    // The request path: the store's own error, then both fail modes through the layer.
    let checks = [Check {
        rule: "default".into(),
        key: key.into(),
        algorithm: Algorithm::Gcra,
        params: Params::new(Quota::per_minute(LIMIT as u64)),
    }];
    let err = store.check(&checks).await.expect_err("no decision without authentication");
    messages.push_str(&format!("{err}\n{err:?}\n"));
    assert!(err.to_string().contains("authentication failed"), "{err}");

    let open = send(store, FailMode::Open, Duration::from_millis(50), key, LIMIT + 3).await;
    assert_eq!(open.count(StatusCode::OK), LIMIT + 3, "fail open lets everything through: {:?}", open.statuses);
    assert_eq!(open.inner_calls, LIMIT + 3);
    assert!(open.worst < BOUND, "a request took {:?}", open.worst);

    let closed = send(store, FailMode::Closed, Duration::from_millis(50), key, LIMIT + 3).await;
    assert_eq!(closed.count(StatusCode::SERVICE_UNAVAILABLE), LIMIT + 3, "{:?}", closed.statuses);
    assert_eq!(closed.inner_calls, 0, "fail closed never calls the inner service");
    assert!(closed.worst < BOUND, "a request took {:?}", closed.worst);
    messages
}

/// `redis://[user:password@]127.0.0.1:port`, the user info percent-encoded.
fn url(user: &str, password: &str, port: u16) -> String {
    format!("redis://{}:{}@127.0.0.1:{port}", encode(user), encode(password))
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Passwords (requirepass)
// ---------------------------------------------------------------------------

/// A password with the characters managed providers put in them (`@`, `:`, `/`, `#`),
/// percent-encoded in the URL.
const PASSWORD: &str = "s3cr@t:p/w#rd";

#[tokio::test]
async fn a_password_in_the_url_authenticates() {
    let server = RedisServer::builder().with_password(PASSWORD).start();
    // The server really refuses clients without the password.
    assert!(server.ping(Duration::from_secs(2)).unwrap().starts_with("-NOAUTH"));

    let store = connected(&url("", PASSWORD, server.port())).await;
    assert_decides(&store, "pw").await;
    // The decisions are in this server, under the store's keys.
    assert_eq!(server.cmd(&["EXISTS", "tollgate:{pw}:default:gcra:v6"]), "1");
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_a_clear_store_error_under_either_fail_mode() {
    capture_logs();
    let server = RedisServer::builder().with_password(PASSWORD).start();
    let wrong = "n0t-the-pa55word";

    let store = RedisStore::from_url(&url("", wrong, server.port())).unwrap();
    let mut messages = assert_refused(&store, "wrong").await;
    messages.push_str(&format!("{store:?}\n"));

    // No password at all: the server answers NOAUTH to the script.
    let store = RedisStore::from_url(&server.url()).unwrap();
    let err = store.ping().await.expect_err("no password");
    assert!(err.to_string().contains("the server requires a password"), "{err}");

    assert_hidden("messages", &messages, &[wrong, &encode(wrong)]);
    let logs = logs();
    assert!(logs.contains("cannot connect to redis"), "the capture saw the store's warning:\n{logs}");
    assert_hidden("logs", &logs, &[wrong, PASSWORD, &encode(PASSWORD), ACL_PASSWORD, CLUSTER_PASSWORD]);
}

#[tokio::test]
async fn a_refused_store_connects_once_the_server_accepts_its_password() {
    let server = RedisServer::builder().with_password("old-pw").start();
    let store =
        RedisStore::from_url(&url("", "new-pw", server.port())).unwrap().response_timeout(Duration::from_secs(2));
    assert!(store.ping().await.is_err(), "the server does not take new-pw yet");
    // The rotation reaches the server after the application: no restart needed.
    assert_eq!(server.cmd(&["CONFIG", "SET", "requirepass", "new-pw"]), "OK");
    let started = Instant::now();
    while let Err(e) = store.ping().await {
        assert!(started.elapsed() < Duration::from_secs(5), "still refused after {:?}: {e}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_decides(&store, "rotated").await;
}

// ---------------------------------------------------------------------------
// ACL users
// ---------------------------------------------------------------------------

const ACL_PASSWORD: &str = "alice-pw-7f3e";

/// The least-privilege ACL as `docs/redis.md` gives it (and the README repeats): its own
/// keys only, and only the commands it sends or its scripts call. Read from the document,
/// so that what users copy is what is tested.
fn documented_acl(name: &str) -> Vec<&'static str> {
    let docs = include_str!("../../docs/redis.md");
    let prefix = format!("ACL SETUSER limiter {name}");
    let line =
        docs.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no `{prefix}` in docs/redis.md"));
    line.strip_prefix("ACL SETUSER limiter ").unwrap().split(' ').filter(|w| *w != ">PASSWORD").collect()
}

/// Every Redis server: `on >PASSWORD …`.
fn limiter_acl() -> Vec<&'static str> {
    let acl = documented_acl("on >PASSWORD");
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains(&format!("ACL SETUSER limiter {}", acl.join(" ").replacen("on ", "on >PASSWORD ", 1))),
        "the README's ACL differs from docs/redis.md's"
    );
    acl
}

/// A server whose default user is off: only `alice` (all rights), `limiter` (the least an
/// ACL user needs) and `admin` (for the test's redis-cli) can do anything.
fn acl_server() -> RedisServer {
    let mut args = vec!["--user", "default", "off", "--user", "admin", "on", ">admin-pw", "~*", "&*", "+@all"];
    args.extend(["--user", "alice", "on", ">alice-pw-7f3e", "~*", "&*", "+@all"]);
    args.extend(["--user", "limiter", ">limiter-pw"]);
    args.extend(limiter_acl());
    RedisServer::builder().args(&args).start()
}

fn admin(server: &RedisServer, args: &[&str]) -> String {
    let mut all = vec!["--no-auth-warning", "--user", "admin", "--pass", "admin-pw"];
    all.extend(args);
    server.cmd(&all)
}

#[tokio::test]
async fn an_acl_user_in_the_url_authenticates() {
    let server = acl_server();
    assert!(server.ping(Duration::from_secs(2)).unwrap().starts_with("-NOAUTH"), "the default user is off");

    let store = connected(&url("alice", ACL_PASSWORD, server.port())).await;
    assert_decides(&store, "acl").await;
    // The store's connection (the one that ran the script) is alice's.
    let clients = admin(&server, &["CLIENT", "LIST"]);
    assert!(clients.lines().any(|l| l.contains(" cmd=evalsha user=alice ")), "no script run by alice:\n{clients}");

    // alice with another password, and a user that does not exist.
    let refused = RedisStore::from_url(&url("alice", "wrong-pw", server.port())).unwrap();
    let messages = assert_refused(&refused, "acl-wrong").await + &format!("{refused:?}");
    assert_hidden("messages", &messages, &["wrong-pw", "alice:"]);
    let nobody = RedisStore::from_url(&url("nobody", ACL_PASSWORD, server.port())).unwrap();
    let err = nobody.ping().await.expect_err("no such user");
    assert!(err.to_string().contains("authentication failed"), "{err}");
}

#[tokio::test]
async fn the_documented_least_privilege_acl_is_enough_for_every_algorithm() {
    let server = acl_server();
    let store = connected(&url("limiter", "limiter-pw", server.port())).await;
    assert_decides(&store, "least").await;
    let quota = Quota::per_minute(2);
    for algorithm in Algorithm::ALL {
        let check = Check { rule: "r".into(), key: "k".into(), algorithm, params: Params::new(quota) };
        let outcome = store.check_one(&check).await.unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
        assert!(outcome.decision.allowed, "{algorithm:?}");
        let refund = tollgate::store::Refund { check: check.clone(), taken: outcome.taken.unwrap() };
        store.refund(&[refund]).await.unwrap_or_else(|e| panic!("{algorithm:?} refund: {e}"));
        store.peek(&check).await.unwrap_or_else(|e| panic!("{algorithm:?} peek: {e}"));
        store.reset("r", &"k".into(), algorithm).await.unwrap_or_else(|e| panic!("{algorithm:?} reset: {e}"));
    }
    // The ACL does hold: a key outside the prefix is refused (so the test above did not
    // pass because the user may do anything).
    let other = store.clone().prefix("other").unwrap();
    let check = Check { rule: "r".into(), key: "k".into(), algorithm: Algorithm::Gcra, params: Params::new(quota) };
    let err = other.check(&[check]).await.expect_err("keys outside ~tollgate:* are refused");
    assert!(err.to_string().contains("the ACL user may not run a command or touch a key"), "{err}");
}

// ---------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------

const CLUSTER_PASSWORD: &str = "cluster-default-pw";

#[tokio::test]
async fn cluster_urls_carry_a_password_or_an_acl_user() {
    let cluster = RedisCluster::start(3);
    // Credentials after the cluster is up: the harness's health checks run without them.
    for node in cluster.nodes() {
        assert_eq!(node.cmd(&["ACL", "SETUSER", "alice", "on", ">alice-pw-7f3e", "~*", "&*", "+@all"]), "OK");
        // The documented least-privilege user, with the cluster's addition.
        let mut limiter = vec!["ACL", "SETUSER", "limiter", ">limiter-pw"];
        limiter.extend(limiter_acl());
        limiter.extend(documented_acl("+cluster"));
        assert_eq!(node.cmd(&limiter), "OK");
        assert_eq!(node.cmd(&["CONFIG", "SET", "requirepass", CLUSTER_PASSWORD]), "OK");
    }
    let ports = cluster.ports();
    let urls = |user: &str, password: &str| ports.iter().map(|p| url(user, password, *p)).collect::<Vec<_>>();

    let by_password = RedisStore::cluster(urls("", CLUSTER_PASSWORD)).unwrap().response_timeout(Duration::from_secs(2));
    by_password.ping().await.unwrap();
    let by_user = RedisStore::cluster(urls("alice", ACL_PASSWORD)).unwrap().response_timeout(Duration::from_secs(2));
    by_user.ping().await.unwrap();
    // Keys on every node: each store decides for many keys, all exactly.
    for i in 0..6 {
        assert_decides(&by_password, &format!("cluster-pw-{i}")).await;
        assert_decides(&by_user, &format!("cluster-acl-{i}")).await;
    }

    let least = RedisStore::cluster(urls("limiter", "limiter-pw")).unwrap().response_timeout(Duration::from_secs(2));
    least.ping().await.unwrap();
    for i in 0..6 {
        assert_decides(&least, &format!("cluster-least-{i}")).await;
    }
    for algorithm in Algorithm::ALL {
        let check = Check { rule: "r".into(), key: "k".into(), algorithm, params: Params::new(Quota::per_minute(2)) };
        let taken = least.check_one(&check).await.unwrap_or_else(|e| panic!("{algorithm:?}: {e}")).taken.unwrap();
        least.refund(&[tollgate::store::Refund { check: check.clone(), taken }]).await.unwrap();
        least.reset("r", &"k".into(), algorithm).await.unwrap();
    }

    let refused = RedisStore::cluster(urls("alice", "wrong-pw")).unwrap();
    let err = refused.ping().await.expect_err("wrong password");
    let shown = format!("{err}\n{refused:?}");
    assert!(shown.contains("authentication failed"), "{shown}");
    assert_hidden("messages", &shown, &["wrong-pw", "alice:"]);
    let closed = send(&refused, FailMode::Closed, Duration::from_millis(50), "cluster-wrong", LIMIT + 3).await;
    assert_eq!(closed.count(StatusCode::SERVICE_UNAVAILABLE), LIMIT + 3, "{:?}", closed.statuses);
    assert!(closed.worst < BOUND, "a request took {:?}", closed.worst);
}

// ---------------------------------------------------------------------------
// Secrets in Debug output and build errors
// ---------------------------------------------------------------------------

#[test]
fn debug_output_and_build_errors_never_show_the_user_info() {
    let secret = "hunter2-zz";
    let store = RedisStore::from_url(&format!("redis://alice:{secret}@127.0.0.1:6379/0")).unwrap();
    let shown = format!("{store:?} {store:#?}");
    assert_hidden("Debug", &shown, &[secret, "alice"]);
    assert!(shown.contains("127.0.0.1:6379"), "{shown}");
    let cluster = RedisStore::cluster([
        format!("redis://alice:{secret}@127.0.0.1:7000"),
        format!("redis://alice:{secret}@127.0.0.1:7001"),
    ])
    .unwrap();
    assert_hidden("Debug", &format!("{cluster:?}"), &[secret, "alice"]);

    // URLs that cannot be used, each with the user info in it.
    let bad = [
        format!("http://alice:{secret}@127.0.0.1:6379"),
        format!("redis://alice:{secret}@127.0.0.1:notaport"),
        format!("redis://alice:{secret}@127.0.0.1:6379/notadb"),
        format!("redis://alice:{secret}@"),
        format!("alice:{secret}@127.0.0.1:6379"),
        // Unescaped `/`, `?`, `#` in the password.
        format!("redis://alice:{secret}/x?y#z@127.0.0.1:6379/x"),
        format!("rediss://alice:{secret}@127.0.0.1:6379#insecure"),
    ];
    for url in &bad {
        let err = RedisStore::from_url(url).expect_err(url);
        assert_hidden(url, &format!("{err} {err:?}"), &[secret, "alice:"]);
        let err = RedisStore::cluster([url]).expect_err(url);
        assert_hidden(url, &format!("{err} {err:?}"), &[secret, "alice:"]);
    }
}

// ---------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------

#[cfg(not(feature = "redis-tls"))]
#[test]
fn rediss_without_the_tls_feature_is_a_build_error_that_names_it() {
    let err = RedisStore::from_url("rediss://:hunter2-zz@127.0.0.1:6380").unwrap_err().to_string();
    assert!(err.contains("`redis-tls` feature"), "{err}");
    assert_hidden("error", &err, &["hunter2-zz"]);
}

#[cfg(feature = "redis-tls")]
mod tls {
    use std::net::TcpListener;
    use std::path::Path;

    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

    use super::*;

    /// A CA and a server certificate it signed, as PEM.
    struct Pki {
        ca: String,
        cert: String,
        key: String,
    }

    /// A new CA, and a certificate for `names` (DNS names or IP addresses) signed by it.
    fn new_pki(names: &[&str]) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "tollgate test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let cert = params.signed_by(&key, &ca).unwrap();
        Pki { ca: ca.pem(), cert: cert.pem(), key: key.serialize_pem() }
    }

    /// A free loopback port for the TLS listener (the harness keeps its plain port for
    /// its readiness check and redis-cli).
    fn free_port() -> u16 {
        TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port()
    }

    /// A server that also listens for TLS on the returned port, with the certificate of
    /// `pki` and only `protocols` (`"TLSv1.2"`, `"TLSv1.3"`, or both).
    fn tls_server(dir: &Path, pki: &Pki, protocols: &str, extra: &[&str]) -> (RedisServer, u16) {
        for (name, pem) in [("ca.pem", &pki.ca), ("cert.pem", &pki.cert), ("key.pem", &pki.key)] {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
        let port = free_port();
        let port_arg = port.to_string();
        let (ca, cert, key) = (path("ca.pem"), path("cert.pem"), path("key.pem"));
        let mut args = vec![
            "--tls-port",
            &port_arg,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
            "--tls-protocols",
            protocols,
        ];
        args.extend(extra);
        (RedisServer::builder().args(&args).start(), port)
    }

    /// A fresh directory for certificates, removed on drop.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new() -> Self {
            static N: AtomicU64 = AtomicU64::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("tollgate-tls-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn rediss_with_the_test_ca_decides_over_tls_1_2_and_1_3() {
        let dir = Dir::new();
        let pki = new_pki(&["127.0.0.1", "localhost"]);
        for protocols in ["TLSv1.2", "TLSv1.3"] {
            // Password and TLS together, as a managed Redis has them.
            let (server, port) = tls_server(&dir.0, &pki, protocols, &["--requirepass", PASSWORD]);
            let url = format!("rediss://:{}@127.0.0.1:{port}", encode(PASSWORD));
            let store = RedisStore::from_url(&url)
                .unwrap()
                .tls_root_certificates(pki.ca.as_bytes())
                .unwrap()
                .response_timeout(Duration::from_secs(2));
            let shown = format!("{store:?}");
            assert!(shown.contains("rediss (given root certificates)"), "{shown}");
            assert_hidden("Debug", &shown, &[PASSWORD, &encode(PASSWORD)]);
            store.ping().await.unwrap_or_else(|e| panic!("{protocols}: {e}"));
            assert_decides(&store, "tls").await;
            // The scripts came in on the TLS port (the plain one is the harness's).
            let clients = server.cmd(&["CLIENT", "LIST"]);
            assert!(
                clients
                    .lines()
                    .any(|l| l.contains(&format!(" laddr=127.0.0.1:{port} ")) && l.contains(" cmd=evalsha ")),
                "no script run over the TLS port {port}:\n{clients}"
            );
            // `localhost` is in the certificate too.
            let by_name = RedisStore::from_url(&format!("rediss://:{}@localhost:{port}", encode(PASSWORD)))
                .unwrap()
                .tls_root_certificates(pki.ca.as_bytes())
                .unwrap()
                .response_timeout(Duration::from_secs(2));
            by_name.ping().await.unwrap_or_else(|e| panic!("{protocols} by name: {e}"));
        }
    }

    #[tokio::test]
    async fn an_untrusted_or_misnamed_certificate_is_a_clear_store_error() {
        capture_logs();
        let dir = Dir::new();
        let pki = new_pki(&["127.0.0.1"]);
        let (_server, port) = tls_server(&dir.0, &pki, "TLSv1.2 TLSv1.3", &[]);
        let url = format!("rediss://127.0.0.1:{port}");

        // The system's roots do not hold the test CA; nor does another CA.
        let system = RedisStore::from_url(&url).unwrap();
        assert!(format!("{system:?}").contains("rediss (system root certificates)"));
        let other_ca = new_pki(&["127.0.0.1"]).ca;
        let other = RedisStore::from_url(&url).unwrap().tls_root_certificates(other_ca.as_bytes()).unwrap();
        // The right CA, but the certificate names 127.0.0.1, not localhost.
        let misnamed = RedisStore::from_url(&format!("rediss://localhost:{port}"))
            .unwrap()
            .tls_root_certificates(pki.ca.as_bytes())
            .unwrap();
        for (what, store, expect) in [
            ("system roots", &system, "not trusted"),
            ("another CA", &other, "not trusted"),
            ("wrong name", &misnamed, "not trusted"),
        ] {
            let started = Instant::now();
            let err = store.ping().await.expect_err(what);
            assert!(started.elapsed() < Duration::from_secs(2), "{what}: {:?}", started.elapsed());
            assert!(matches!(err, StoreError::Unavailable(_)), "{what}: {err:?}");
            assert!(err.to_string().contains(expect), "{what}: {err}");

            let open = send(store, FailMode::Open, Duration::from_millis(50), what, 4).await;
            assert_eq!(open.count(StatusCode::OK), 4, "{what}: {:?}", open.statuses);
            let closed = send(store, FailMode::Closed, Duration::from_millis(50), what, 4).await;
            assert_eq!(closed.count(StatusCode::SERVICE_UNAVAILABLE), 4, "{what}: {:?}", closed.statuses);
            assert_eq!(closed.inner_calls, 0);
            assert!(open.worst.max(closed.worst) < BOUND, "{what}: {:?}", open.worst.max(closed.worst));
        }

        // Plain redis:// to the TLS port: an error, not a hang.
        let plain = RedisStore::from_url(&format!("redis://127.0.0.1:{port}")).unwrap();
        let started = Instant::now();
        assert!(plain.ping().await.is_err());
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        let closed = send(&plain, FailMode::Closed, Duration::from_millis(50), "plain", 4).await;
        assert_eq!(closed.count(StatusCode::SERVICE_UNAVAILABLE), 4, "{:?}", closed.statuses);
        assert!(closed.worst < BOUND, "{:?}", closed.worst);
    }

    #[test]
    fn root_certificates_are_checked_when_given() {
        let ca = new_pki(&["127.0.0.1"]).ca;
        let tls = || RedisStore::from_url("rediss://127.0.0.1:6380").unwrap();
        for (what, pem) in [("empty", ""), ("no PEM", "not a certificate"), ("a key", &new_pki(&["x"]).key[..])] {
            let err = tls().tls_root_certificates(pem.as_bytes()).expect_err(what).to_string();
            assert!(err.contains("no PEM certificate"), "{what}: {err}");
        }
        let broken = ca.replace("MII", "M*I");
        let err = tls().tls_root_certificates(broken.as_bytes()).expect_err("broken PEM").to_string();
        assert!(err.contains("root certificates"), "{err}");
        assert!(tls().tls_root_certificates(ca.as_bytes()).is_ok());

        let err = RedisStore::from_url("redis://127.0.0.1:6379").unwrap().tls_root_certificates(ca.as_bytes());
        assert!(err.unwrap_err().to_string().contains("not a rediss://"));
        let err = RedisStore::cluster(["rediss://127.0.0.1:7000"]).unwrap().tls_root_certificates(ca.as_bytes());
        assert!(err.unwrap_err().to_string().contains("cluster"));
        let err = RedisStore::from_url("rediss://127.0.0.1:6380#insecure").unwrap_err().to_string();
        assert!(err.contains("no #insecure"), "{err}");
    }

    /// `rediss+sentinel://`: TLS to the sentinels and to the primary they name, both under
    /// a private CA given by `tls_root_certificates`, with the primary's password.
    #[tokio::test]
    async fn tls_sentinels_and_primary_under_a_private_ca() {
        let dir = Dir::new();
        let pki = new_pki(&["127.0.0.1", "localhost"]);
        let (primary, primary_tls) = tls_server(&dir.0, &pki, "TLSv1.2 TLSv1.3", &["--requirepass", PASSWORD]);
        let path = |name: &str| dir.0.join(name).to_str().unwrap().to_owned();
        let mut sentinels = Vec::new();
        let mut tls_ports = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let conf = format!(
                "tls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                 tls-auth-clients no\ntls-replication yes\n\
                 sentinel monitor mymaster 127.0.0.1 {primary_tls} 2\nsentinel auth-pass mymaster {PASSWORD}\n",
                path("cert.pem"),
                path("key.pem"),
                path("ca.pem"),
            );
            sentinels.push(RedisServer::builder().sentinel(&conf).start());
            tls_ports.push(port);
        }
        for s in &sentinels {
            let named = s.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
            assert!(named.ends_with(&primary_tls.to_string()), "{named}");
        }
        let hosts: Vec<String> = tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let url = format!("rediss+sentinel://:{}@{}/mymaster", encode(PASSWORD), hosts.join(","));

        // The system's roots do not know the test CA: refused, and said why.
        let err = RedisStore::from_url(&url).unwrap().ping().await.unwrap_err().to_string();
        assert!(err.contains("not trusted"), "{err}");
        assert_hidden("error", &err, &[PASSWORD]);

        let store = RedisStore::from_url(&url).unwrap().tls_root_certificates(pki.ca.as_bytes()).unwrap();
        store.ping().await.unwrap();
        assert_decides(&store, "tls-sentinel").await;
        assert_hidden("debug", &format!("{store:?}"), &[PASSWORD]);
        drop(primary);
    }
}
