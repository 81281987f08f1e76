//! `tollgate::config`: rules read from TOML, checked when read, and enforced as written.
#![cfg(feature = "config")]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::config::{KeySpec, LayerConfig};
use tollgate::headers::{RATELIMIT_POLICY, X_RATELIMIT_LIMIT};
use tollgate::key::{Key, KeyExtractor};
use tollgate::store::{Check, Store};
use tollgate::RequestHead;
use tollgate::{Algorithm, BuildError, Decision, FailMode, MemoryStore, Quota, RateLimitLayer, Rule, StoreError};
use tower::{Layer, ServiceExt};

const T0: u64 = 1_700_000_040_000_000; // the start of a minute

const FULL: &str = r#"
algorithm = "fixed_window"
headers = "ietf"
fail_mode = "closed"
timeout = "20ms"

[[rule]]
name = "api"
key = "header:X-Api-Key"
quota = "3/min"
algorithm = "sliding_window_counter"
fail_mode = "open"

[[rule]]
name = "burst"
key = "peer_ip/48"
quota = "60/min"
algorithm = "gcra"
burst = 2

[[rule]]
name = "trial"
key = "global"
quota = "1/min"
shadow = true
block_for = "1h"

[[rule]]
name = "shaped"
key = "trusted_proxy_ip:10.0.0.0/8, fd00::/8"
quota = "5/s"
algorithm = "leaky_bucket"
max_delay = "2s"
"#;

fn store() -> MemoryStore {
    MemoryStore::with_clock(ManualClock::new(T0))
}

fn inner() -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = std::convert::Infallible,
    Future = impl Future + Send,
> + Clone {
    tower::service_fn(|_req: Request<Body>| async { Ok::<_, std::convert::Infallible>(Response::new(Body::empty())) })
}

fn req(ip: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::get("/");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let mut req = b.body(Body::empty()).unwrap();
    let addr: SocketAddr = if ip.contains(':') { format!("[{ip}]:1") } else { format!("{ip}:1") }.parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

fn key_of<B>(spec: &str, req: &Request<B>) -> Option<String> {
    let spec: KeySpec = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    spec.extract(req).map(|k| String::from_utf8(k.as_bytes().to_vec()).unwrap())
}

#[test]
fn every_field_is_read() {
    let config = LayerConfig::from_toml(FULL).unwrap();
    let rules = config.rules();
    let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["api", "burst", "trial", "shaped"]);
    assert_eq!(rules[0].quota, Quota::per_minute(3));
    assert_eq!(rules[0].algorithm, Some(Algorithm::SlidingWindowCounter));
    assert_eq!(rules[0].fail_mode, Some(FailMode::Open));
    assert_eq!(rules[0].key.to_string(), "header:x-api-key", "header names are case-insensitive");
    assert_eq!(rules[1].quota, Quota::per_minute(60).burst(2));
    assert!(matches!(rules[1].key, KeySpec::PeerIp { ipv6_prefix: 48 }));
    assert!(rules[2].shadow && !rules[0].shadow);
    assert!(matches!(rules[2].key, KeySpec::Global));
    assert_eq!(rules[2].block_for, Some(Duration::from_secs(3600)));
    assert_eq!(rules[0].block_for, None);
    assert_eq!(rules[3].max_delay, Some(Duration::from_secs(2)));
    assert_eq!(rules[3].algorithm, Some(Algorithm::LeakyBucket));
    assert_eq!(rules[1].fail_mode, None, "unset: the layer's");
}

#[test]
fn key_specs_extract_what_they_say() {
    let r = req("203.0.113.9", &[("x-api-key", "k1"), ("x-forwarded-for", "198.51.100.7")]);
    assert_eq!(key_of("peer_ip", &r).unwrap(), "203.0.113.9");
    assert_eq!(key_of("global", &r).unwrap(), "global");
    assert_eq!(key_of("header:x-api-key", &r).unwrap(), "k1");
    assert_eq!(key_of("header:x-other", &r), None, "no header: the rule does not apply");
    // An untrusted peer is the client, whatever the header says.
    assert_eq!(key_of("trusted_proxy_ip:10.0.0.0/8", &r).unwrap(), "203.0.113.9");
    let via_proxy = req("10.1.2.3", &[("x-forwarded-for", "198.51.100.7")]);
    assert_eq!(key_of("trusted_proxy_ip:10.0.0.0/8,fd00::/8", &via_proxy).unwrap(), "198.51.100.7");
    let v6 = req("2001:db8:1:2:3:4:5:6", &[]);
    assert_eq!(key_of("peer_ip", &v6).unwrap(), "2001:db8:1:2::/64");
    assert_eq!(key_of("peer_ip/48", &v6).unwrap(), "2001:db8:1::/48");
    assert_eq!(key_of("peer_ip/128", &v6).unwrap(), "2001:db8:1:2:3:4:5:6");
}

async fn status<S>(svc: &S, req: Request<Body>) -> StatusCode
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible> + Clone,
{
    svc.clone().oneshot(req).await.unwrap().status()
}

#[tokio::test]
async fn the_built_layer_enforces_the_file() {
    let config = LayerConfig::from_toml(FULL).unwrap();
    let svc = config.build(store()).unwrap().layer(inner());
    let api = |key: &str, ip: &str| req(ip, &[("x-api-key", key)]);
    // burst: GCRA with burst 2 lets two through at once from one /48, then spaces them.
    assert_eq!(status(&svc, api("a", "2001:db8:1:1::1")).await, StatusCode::OK);
    assert_eq!(status(&svc, api("b", "2001:db8:1:2::1")).await, StatusCode::OK);
    assert_eq!(status(&svc, api("c", "2001:db8:1:3::1")).await, StatusCode::TOO_MANY_REQUESTS);
    // api: 3 a minute per key; trial (1 a minute, shadow) never rejects.
    for i in 0..3 {
        let res = svc.clone().oneshot(api("k", &format!("192.0.2.{i}"))).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{i}");
        // headers = "ietf": no legacy headers, the policy of every enforced rule.
        assert!(!res.headers().contains_key(X_RATELIMIT_LIMIT));
        assert_eq!(
            res.headers()[RATELIMIT_POLICY],
            "\"api\";q=3;w=60, \"burst\";q=60;w=60, \"shaped\";q=5;w=1",
            "shadow rules are not announced"
        );
    }
    assert_eq!(status(&svc, api("k", "192.0.2.9")).await, StatusCode::TOO_MANY_REQUESTS);
}

/// A store that is down.
#[derive(Clone, Copy)]
struct Down;

impl Store for Down {
    fn check(
        &self,
        _: &[Check],
    ) -> impl Future<Output = Result<Vec<Option<tollgate::store::Outcome>>, StoreError>> + Send {
        std::future::ready(Err(StoreError::Unavailable("down".into())))
    }
    fn refund(&self, _: &[tollgate::store::Refund]) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
    fn peek(&self, _: &Check) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(Err(StoreError::Unavailable("down".into())))
    }
    fn reset(&self, _: &str, _: &Key, _: Algorithm) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn fail_modes_come_from_the_file() {
    // Layer-wide closed; the rule "open" overrides it; any closed rule closes the request.
    let open = LayerConfig::from_toml(
        "fail_mode = \"closed\"\n[[rule]]\nname = \"a\"\nkey = \"global\"\nquota = \"1/s\"\nfail_mode = \"open\"",
    )
    .unwrap();
    let svc = open.build(Down).unwrap().layer(inner());
    assert_eq!(status(&svc, req("192.0.2.1", &[])).await, StatusCode::OK);
    let closed =
        LayerConfig::from_toml("fail_mode = \"closed\"\n[[rule]]\nname = \"a\"\nkey = \"global\"\nquota = \"1/s\"")
            .unwrap();
    let svc = closed.build(Down).unwrap().layer(inner());
    assert_eq!(status(&svc, req("192.0.2.1", &[])).await, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn code_rules_join_the_file_rules() {
    let config =
        LayerConfig::from_toml("headers = \"ietf\"\n[[rule]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"100/min\"")
            .unwrap();
    // Adjust the configured rules (an allow-list), add one defined in code, then apply
    // the layer-wide settings.
    let rules =
        config.to_rules().into_iter().map(|r| r.bypass_if(|req: &RequestHead| req.headers().contains_key("x-partner")));
    let layer = rules.fold(RateLimitLayer::builder(store()), tollgate::LimiterBuilder::add_rule).add_rule(Rule::new(
        "per-user",
        Quota::per_minute(1),
        |req: &RequestHead| req.headers().get("x-user").map(|v| v.as_bytes().to_vec()),
    ));
    let svc = config.apply(layer).build().unwrap().layer(inner());
    let res = svc.clone().oneshot(req("192.0.2.1", &[("x-user", "u")])).await.unwrap();
    assert_eq!(res.headers()[RATELIMIT_POLICY], "\"ip\";q=100;w=60, \"per-user\";q=1;w=60");
    assert_eq!(status(&svc, req("192.0.2.1", &[("x-user", "u")])).await, StatusCode::TOO_MANY_REQUESTS);
    let partner = svc.clone().oneshot(req("192.0.2.1", &[("x-partner", "1")])).await.unwrap();
    assert!(!partner.headers().contains_key(RATELIMIT_POLICY), "the partner bypassed the configured rule");

    // builder() is the short way to the same.
    let layer = config.builder(store()).rule("more", Quota::per_hour(5), tollgate::key::Global).build();
    assert_eq!(layer.unwrap().rules().len(), 2);
}

/// Asserts `toml` is refused naming `rule` and `field`, with `why` in the explanation.
#[track_caller]
fn refused(toml: &str, rule: &str, field: &str, why: &str) {
    match LayerConfig::from_toml(toml) {
        Err(BuildError::InvalidConfig { rule: r, field: f, why: w }) => {
            assert_eq!((r.as_str(), f.as_str()), (rule, field), "{w}");
            assert!(w.contains(why), "{w:?} does not say {why:?}");
        }
        other => panic!("{toml}\nwas not refused as invalid: {other:?}"),
    }
}

fn one(fields: &str) -> String {
    format!("[[rule]]\nname = \"r\"\n{fields}")
}

#[test]
fn mistakes_name_the_rule_and_the_field() {
    let key = "key = \"peer_ip\"\n";
    let quota = "quota = \"10/min\"\n";
    // Bad values.
    refused(&one(&format!("{key}quota = \"10/fortnight\"")), "r", "quota", "unknown period unit");
    refused(&one(&format!("{key}quota = \"0/min\"")), "r", "quota", "limit is 0");
    refused(&one(&format!("{key}quota = \"lots\"")), "r", "quota", "expected <limit>/<period>");
    refused(&one(&format!("{key}{quota}algorithm = \"magic\"")), "r", "algorithm", "unknown algorithm \"magic\"");
    refused(&one(&format!("key = \"cookie:sid\"\n{quota}")), "r", "key", "unknown key kind \"cookie\"");
    refused(&one(&format!("key = \"header:x api key\"\n{quota}")), "r", "key", "not a valid HTTP header name");
    refused(&one(&format!("key = \"header:\"\n{quota}")), "r", "key", "not a valid HTTP header name");
    refused(&one(&format!("key = \"peer_ip/129\"\n{quota}")), "r", "key", "prefix length");
    refused(&one(&format!("key = \"trusted_proxy_ip:10.0.0.0/33\"\n{quota}")), "r", "key", "bad prefix length");
    refused(&one(&format!("key = \"trusted_proxy_ip:\"\n{quota}")), "r", "key", "expected trusted_proxy_ip:<cidr>");
    refused(&one(&format!("{key}{quota}burst = 0")), "r", "burst", "burst is 0");
    refused(&one(&format!("{key}{quota}burst = -1")), "r", "burst", "negative");
    refused(&one(&format!("{key}{quota}burst = \"5\"")), "r", "burst", "expected a whole number, found string");
    refused(&one(&format!("{key}{quota}fail_mode = \"ajar\"")), "r", "fail_mode", "use fallback, open or closed");
    refused(&one(&format!("{key}{quota}max_delay = \"2 fortnights\"")), "r", "max_delay", "unknown unit");
    refused(&one(&format!("{key}{quota}block_for = 3600")), "r", "block_for", "a duration like \"1h\"");
    refused(&one(&format!("{key}{quota}shadow = \"yes\"")), "r", "shadow", "expected true or false, found string");
    refused(&one(&format!("{key}quota = 100")), "r", "quota", "as a string, found integer");
    // Missing and unknown fields: a typo must not silently mean "default".
    refused(&one(key), "r", "quota", "missing");
    refused(&one(quota), "r", "key", "missing");
    refused(&format!("[[rule]]\n{key}{quota}"), "#1", "name", "missing");
    refused(&format!("[[rule]]\nname = \"\"\n{key}{quota}"), "#1", "name", "1 to 64 bytes");
    refused(&format!("[[rule]]\nname = \"{}\"\n{key}{quota}", "n".repeat(65)), "#1", "name", "1 to 64 bytes");
    refused(&one(&format!("{key}{quota}qouta = \"10/min\"")), "r", "qouta", "unknown field");
    // The rule is named by its position when it has no usable name.
    let second = format!("[[rule]]\nname = \"a\"\n{key}{quota}\n[[rule]]\n{key}{quota}");
    refused(&second, "#2", "name", "missing");
    // Duplicate names (they are part of the store keys).
    let dup = format!("[[rule]]\nname = \"a\"\n{key}{quota}\n[[rule]]\nname = \"a\"\nkey = \"global\"\n{quota}");
    refused(&dup, "a", "name", "already named \"a\"");
    // Layer-wide settings.
    refused(&format!("headers = \"fancy\"\n{}", one(&format!("{key}{quota}"))), "", "headers", "legacy, ietf");
    refused("timeout = \"soon\"", "", "timeout", "whole number");
    refused("algorithm = \"magic\"", "", "algorithm", "unknown algorithm");
    refused(&format!("[[rules]]\nname = \"r\"\n{key}{quota}"), "", "rules", "did you mean [[rule]]");
    refused("rule = \"everything\"", "", "rule", "expected [[rule]] tables");
    refused("[[rule]\nname = ", "", "toml", "line 1");
}

#[test]
fn error_messages_read_well() {
    let err = LayerConfig::from_toml(&one("key = \"peer_ip\"\nquota = \"100/min\"\nalgorithm = \"lru\"")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule \"r\", field `algorithm`: unknown algorithm \"lru\": use one of fixed_window, sliding_window_log, \
         sliding_window_counter, token_bucket, leaky_bucket, gcra"
    );
}

#[test]
fn an_empty_file_has_no_rules_and_cannot_build_a_layer_alone() {
    let config = LayerConfig::from_toml("").unwrap();
    assert!(config.rules().is_empty());
    assert!(config.build(store()).is_err());
}

/// An application's own configuration, with the limits as one section.
#[derive(Debug, serde::Deserialize)]
struct AppConfig {
    port: u16,
    rate_limit: LayerConfig,
}

#[test]
fn a_section_of_the_applications_own_config() {
    let app: AppConfig = toml::from_str(
        r#"
        port = 8080

        [rate_limit]
        headers = "both"

        [[rate_limit.rule]]
        name = "ip"
        key = "peer_ip"
        quota = "300/min"
        "#,
    )
    .unwrap();
    assert_eq!(app.port, 8080);
    assert_eq!(app.rate_limit.rules()[0].quota, Quota::per_minute(300));

    // A mistake in the section fails the whole deserialization, naming rule and field.
    let err = toml::from_str::<AppConfig>(
        "port = 1\n[[rate_limit.rule]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"300/minutes please\"",
    )
    .unwrap_err();
    assert!(err.to_string().contains("rule \"ip\", field `quota`"), "{err}");
}
