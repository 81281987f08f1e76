//! Rule names and shadow rules: what two layers over one store share, and what a shadow
//! rule counts.

use crate::common::{app, get};
use crate::support;

use std::sync::Arc;

use http::StatusCode;
use support::fake::{settle, T0};
use tokio::sync::Notify;
use tollgate::clock::ManualClock;
use tollgate::key::{self};
use tollgate::{Algorithm, BuildError, MemoryStore, Quota, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};

// Two layers over one store with one rule name share their counts: `RateLimitLayer::new`
// (which cannot fail) shares and says so once; a builder refuses the name.

#[tokio::test]
async fn two_new_layers_over_one_store_share_and_builders_refuse_the_name() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let search = RateLimitLayer::new(Quota::per_minute(3), key::Global, store.clone());
    // No panic: the second `new` shares "default" (and says so on stderr).
    let upload = RateLimitLayer::new(Quota::per_minute(100), key::Global, store.clone());
    let (search_svc, upload_svc) = (search.layer(app(Arc::default())), upload.layer(app(Arc::default())));
    for _ in 0..3 {
        assert_eq!(upload_svc.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::OK);
    }
    let res = search_svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "the two `new` layers count into one state");

    let err = RateLimitLayer::builder(store.clone()).rule("default", Quota::per_day(1), key::Global).build();
    let err = err.unwrap_err();
    assert!(matches!(&err, BuildError::RuleInUse { rule, .. } if rule == "default"), "{err}");
    assert!(err.to_string().contains("RateLimitLayer::builder(store)"), "the hint names what was built: {err}");
    // A limiter's hint names the limiter's builder, not the layer's.
    let err =
        tollgate::Limiter::<_, str>::builder(store.clone()).rule("default", Quota::per_day(1), key::Global).build();
    let err = err.unwrap_err().to_string();
    assert!(err.contains("Limiter::builder(store)") && !err.contains("RateLimitLayer::builder"), "{err}");
    // Other stores and other names are fine.
    let _other = RateLimitLayer::new(Quota::per_minute(3), key::Global, MemoryStore::new());
    let other = RateLimitLayer::builder(store.clone()).rule("upload", Quota::per_minute(100), key::Global);
    assert!(other.build().is_ok());
    // Once the layers are gone, their names are free again.
    drop((search, upload, search_svc, upload_svc));
    let again = RateLimitLayer::builder(store).rule("default", Quota::per_minute(3), key::Global).build();
    assert!(again.is_ok(), "{again:?}");
}

#[tokio::test]
async fn named_rules_on_two_routes_keep_their_own_counts() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let layer = |name: &str, q| {
        RateLimitLayer::builder(store.clone()).rule(name, q, key::Global).build().unwrap().layer(app(Arc::default()))
    };
    let (upload, search) = (layer("upload", Quota::per_minute(100)), layer("search", Quota::per_minute(3)));
    for _ in 0..5 {
        assert_eq!(upload.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(
            search.clone().oneshot(get("/")).await.unwrap().status(),
            StatusCode::OK,
            "/upload used /search's limit"
        );
    }
    assert_eq!(search.clone().oneshot(get("/")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

// 12. `count_if` on a shadow rule was ignored.

#[tokio::test]
async fn count_if_applies_to_shadow_rules_too() {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .add_rule(
            Rule::new("trial", Quota::per_minute(1), key::Global)
                .shadow(true)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let svc = layer.clone().layer(app(Arc::default()));
    for _ in 0..3 {
        assert_eq!(svc.clone().oneshot(get("/ok")).await.unwrap().status(), StatusCode::OK);
        settle().await;
    }
    let d = layer.peek("trial", "global").await.unwrap();
    assert!(d.allowed, "successes were counted by the shadow rule: {d:?}");
    assert_eq!(svc.clone().oneshot(get("/fail")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    settle().await;
    assert!(!layer.peek("trial", "global").await.unwrap().allowed, "the failure counts");
}

// R3. Shadow rules kept what they took for requests another rule refused: a shadow rule
// counting only 401s was charged for 429s, and a plain one counted requests that never
// happened (an enforced rule in its place would have taken nothing).

#[tokio::test]
async fn a_refused_request_takes_nothing_from_shadow_rules() {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("strict", Quota::per_minute(1), key::Global)
        .add_rule(
            Rule::new("logins", Quota::per_minute(3), key::Global)
                .shadow(true)
                .count_if(|s| s == StatusCode::UNAUTHORIZED),
        )
        .add_rule(Rule::new("candidate", Quota::per_minute(10), key::Global).shadow(true))
        .build()
        .unwrap();
    let svc = layer.clone().layer(app(Arc::new(Notify::new())));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(svc.clone().oneshot(get("/ok")).await.unwrap().status());
        settle().await;
    }
    assert_eq!(statuses[0], StatusCode::OK);
    assert!(statuses[1..].iter().all(|&s| s == StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
    // No 401: the 401 counter holds nothing (a peek reports the room after one more).
    let logins = layer.peek("logins", "global").await.unwrap();
    assert_eq!(logins.remaining(), 2, "the shadow 401-counter was charged: {logins:?}");
    // One request happened: the candidate limit counted it alone.
    let candidate = layer.peek("candidate", "global").await.unwrap();
    assert_eq!(candidate.remaining(), 8, "the shadow rule counted refused requests: {candidate:?}");
}

/// `RateLimitLayer::new` joins the limiter that holds `"default"` as one owner of the name
/// (found by review: it used to hold no claim, so once the first layer was dropped a
/// builder could take the name the second still counted into, and the second's own
/// handle could not swap its rule).
#[tokio::test]
async fn a_shared_default_stays_claimed_and_swappable_by_either_layer() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let first = RateLimitLayer::new(Quota::per_minute(3), key::Global, store.clone());
    let second = RateLimitLayer::new(Quota::per_minute(3), key::Global, store.clone());
    second.handle().set_quota("default", Quota::per_minute(10)).expect("the second layer swaps its own rule");
    first.handle().set_quota("default", Quota::per_minute(3)).expect("and so does the first");
    drop(first);
    let taken = RateLimitLayer::builder(store.clone()).rule("default", Quota::per_minute(3), key::Global);
    let err = taken.build().unwrap_err();
    assert!(matches!(&err, BuildError::RuleInUse { rule, .. } if rule == "default"), "still held by the second: {err}");
    // A `new` joins a limiter's explicit "default" too (and says so), as documented.
    let limiter = tollgate::Limiter::<_, str>::builder(MemoryStore::new())
        .rule("default", Quota::per_minute(1), |s: &str| Some(s.to_owned()))
        .build()
        .unwrap();
    let joined = RateLimitLayer::new(Quota::per_minute(1), key::Global, limiter.store().clone());
    assert!(limiter.check("k").await.is_allowed());
    let svc = joined.layer(app(Arc::default()));
    assert_eq!(svc.oneshot(get("/")).await.unwrap().status(), StatusCode::OK, "key::Global is not \"k\"");
    drop((second, limiter));
}

/// Joining shares the one name `new` asked for, nothing else (found by review: the joined
/// layer took the other limiter's owner id, so either could then swap in any name the
/// other held, and both counted into it).
#[tokio::test]
async fn a_joined_layer_shares_only_its_default() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let jobs = tollgate::Limiter::<_, str>::builder(store.clone())
        .rule("default", Quota::per_minute(100), |s: &str| Some(s.to_owned()))
        .rule("jobs", Quota::per_minute(1), |s: &str| Some(s.to_owned()))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(Quota::per_minute(100), key::Global, store.clone());
    let taken = layer.handle().set_rules(vec![Rule::new("jobs", Quota::per_minute(1_000), key::Global)]);
    assert!(matches!(&taken, Err(BuildError::RuleInUse { rule, .. }) if rule == "jobs"), "{taken:?}");
    layer.handle().set_rules(vec![Rule::new("api", Quota::per_minute(10), key::Global)]).unwrap();
    let back = jobs.handle().set_rules(vec![Rule::new("api", Quota::per_minute(1), |s: &str| Some(s.to_owned()))]);
    assert!(matches!(&back, Err(BuildError::RuleInUse { rule, .. }) if rule == "api"), "{back:?}");

    // Two `new` layers share "default"; a name one of them swaps in is its own.
    let other = MemoryStore::with_clock(ManualClock::new(T0));
    let search = RateLimitLayer::new(Quota::per_minute(3), key::Global, other.clone());
    let upload = RateLimitLayer::new(Quota::per_minute(3), key::Global, other.clone());
    search.handle().set_rules(vec![Rule::new("search", Quota::per_minute(3), key::Global)]).unwrap();
    let same = upload.handle().set_rules(vec![Rule::new("search", Quota::per_minute(100), key::Global)]);
    assert!(matches!(&same, Err(BuildError::RuleInUse { rule, .. }) if rule == "search"), "{same:?}");
    drop((jobs, layer, search, upload));
}

/// A rejection names the rule that makes the client wait longest and that rule's own key
/// (each rule here has its own): not the first rule's, nor the first rejecting one's.
#[tokio::test]
async fn a_rejection_names_the_worst_rule_and_its_own_key() {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("by-ip", Quota::per_minute(100), key::header("x-ip"))
        .rule("per-minute", Quota::per_minute(1), key::header("x-api-key"))
        .rule("per-hour", Quota::per_hour(1), key::header("x-account"))
        .build()
        .unwrap()
        .on_rejected(|r| {
            let said = format!("{} {}", r.rule, String::from_utf8_lossy(&r.key.as_bytes()));
            let mut res = http::Response::new(axum::body::Body::from(said));
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res
        });
    let svc = layer.layer(app(Arc::default()));
    let said = |account: &'static str| {
        let svc = svc.clone();
        async move {
            let req = http::Request::get("/")
                .header("x-ip", "192.0.2.7")
                .header("x-api-key", "ak_1")
                .header("x-account", account)
                .body(axum::body::Body::empty())
                .unwrap();
            let res = svc.oneshot(req).await.unwrap();
            let status = res.status();
            let body = axum::body::to_bytes(res.into_body(), 1 << 10).await.unwrap();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    assert_eq!(said("acct_1").await.0, StatusCode::OK);
    // Both the minute's and the hour's rule reject: the hour's makes the client wait longer.
    assert_eq!(said("acct_1").await, (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1".into()));
    // Another account: only the minute's rule (keyed by the API key) rejects.
    assert_eq!(said("acct_2").await, (StatusCode::TOO_MANY_REQUESTS, "per-minute ak_1".into()));
}

/// What a layer's rejection said: its status, its body (`"<rule> <key> <who decided>"`,
/// from `says_who`), and its `Retry-After` and `X-RateLimit-Rule` headers.
type Said = (StatusCode, String, Option<String>, Option<String>);

/// `layer` over `app`, its rejections saying which rule refused, the key and who decided.
fn says_who<St: tollgate::store::Store>(
    layer: RateLimitLayer<St>,
) -> impl tower::Service<
    http::Request<axum::body::Body>,
    Response = http::Response<axum::body::Body>,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone {
    layer
        .on_rejected(|r| {
            let said = format!("{} {} {:?}", r.rule, String::from_utf8_lossy(&r.key.as_bytes()), r.decided_by);
            let mut res = http::Response::new(axum::body::Body::from(said));
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res
        })
        .layer(app(Arc::default()))
}

/// Sends a `GET /` with `headers` to `svc`; what came back.
async fn ask<S>(svc: &S, headers: &[(&str, &str)]) -> Said
where
    S: tower::Service<
            http::Request<axum::body::Body>,
            Response = http::Response<axum::body::Body>,
            Error = std::convert::Infallible,
        > + Clone,
{
    let mut req = http::Request::get("/");
    for &(name, value) in headers {
        req = req.header(name, value);
    }
    let res = svc.clone().oneshot(req.body(axum::body::Body::empty()).unwrap()).await.unwrap();
    let header = |name| res.headers().get(name).map(|v: &http::HeaderValue| v.to_str().unwrap().to_owned());
    let (retry, rule) = (header("retry-after"), header("x-ratelimit-rule"));
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), 1 << 10).await.unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap(), retry, rule)
}

/// A rule the request can never pass (its cost is above the rule's capacity: no
/// `Retry-After` would help) is the one named, over one that only makes the client wait
/// an hour; and the response says no `Retry-After` then.
#[tokio::test]
async fn a_rejection_names_a_rule_that_can_never_pass_over_one_that_waits() {
    let cost = |req: &tollgate::RequestHead| {
        req.headers().get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1)
    };
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .add_rule(Rule::new("bulk", Quota::per_minute(2), key::header("x-api-key")).cost(cost))
        .rule("hourly", HOUR, key::header("x-account"))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let svc = says_who(layer);
    let headers = |cost| [("x-api-key", "ak_1"), ("x-account", "acct_1"), ("x-cost", cost)];
    assert_eq!(ask(&svc, &headers("1")).await.0, StatusCode::OK);
    // The hour's rule rejects (an hour to wait); the bulk rule can never take 3 of 2.
    let (status, body, retry, rule) = ask(&svc, &headers("3")).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "bulk ak_1 Store"));
    assert_eq!(retry, None, "no wait lets a cost of 3 through a quota of 2");
    assert_eq!(rule.as_deref(), Some("bulk"), "the headers describe the rule named");
    // Within its cost, the hour's rule alone rejects: named, with its wait.
    let (status, body, retry, rule) = ask(&svc, &headers("1")).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "hourly acct_1 Store"));
    assert_eq!(retry.as_deref(), Some(&*secs(HOUR)));
    assert_eq!(rule.as_deref(), Some("hourly"));
}

/// Two rules that reject with the same wait: the later rule is named (the last of
/// equals, as before), with its own key, and the headers describe that same rule.
#[tokio::test]
async fn of_rejecting_rules_with_equal_waits_the_last_is_named_with_its_key() {
    let layer = RateLimitLayer::builder(MemoryStore::with_clock(ManualClock::new(T0)))
        .rule("by-ip", MINUTE, key::header("x-ip"))
        .rule("by-key", MINUTE, key::header("x-api-key"))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let svc = says_who(layer);
    let headers = [("x-ip", "192.0.2.7"), ("x-api-key", "ak_1")];
    assert_eq!(ask(&svc, &headers).await.0, StatusCode::OK);
    let (status, body, retry, rule) = ask(&svc, &headers).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "by-key ak_1 Store"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(MINUTE)), Some("by-key")));
}

/// While the store fails, a rule that passes open is not decided (the fallback decides
/// the others): the rejection still names the worst of those decided, with its key, and
/// not whichever rule sits at its position among the checks.
#[tokio::test]
async fn a_fallback_rejection_names_the_worst_rule_when_an_open_rule_is_not_decided() {
    let store = support::fake::Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    store.set(support::fake::Mode::Failing);
    let layer = RateLimitLayer::builder(store)
        .add_rule(Rule::new("open", Quota::per_minute(100), key::header("x-ip")).fail_mode(tollgate::FailMode::Open))
        .rule("per-minute", MINUTE, key::header("x-api-key"))
        .rule("per-hour", HOUR, key::header("x-account"))
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)))
        .servers(1)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let svc = says_who(layer);
    let headers = |account| [("x-ip", "192.0.2.7"), ("x-api-key", "ak_1"), ("x-account", account)];
    assert_eq!(ask(&svc, &headers("acct_1")).await.0, StatusCode::OK);
    let (status, body, retry, rule) = ask(&svc, &headers("acct_1")).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1 Fallback"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(HOUR)), Some("per-hour")));
    let (status, body, retry, rule) = ask(&svc, &headers("acct_2")).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-minute ak_1 Fallback"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(MINUTE)), Some("per-minute")));
}

/// A rejection from the blocked-key cache names the blocked rule's own key, not the
/// first rule's.
#[tokio::test]
async fn a_cached_rejection_names_the_blocked_rules_own_key() {
    let store = support::fake::Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::builder(store.clone())
        .rule("by-ip", Quota::per_minute(100), key::header("x-ip"))
        .rule("by-key", MINUTE, key::header("x-api-key"))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let svc = says_who(layer);
    let headers = [("x-ip", "192.0.2.7"), ("x-api-key", "ak_1")];
    assert_eq!(ask(&svc, &headers).await.0, StatusCode::OK);
    let (status, body, ..) = ask(&svc, &headers).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "by-key ak_1 Store"));
    let asked = store.checks();
    let (status, body, retry, rule) = ask(&svc, &headers).await;
    assert_eq!(store.checks(), asked, "refused from the cache");
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "by-key ak_1 LocalCache"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(MINUTE)), Some("by-key")));
}

/// One unit a minute, and one an hour: under GCRA, a client that took its unit waits a
/// whole period.
const MINUTE: Quota = Quota::per_minute(1);
const HOUR: Quota = Quota::per_hour(1);

/// `Retry-After` for a wait of `q`'s whole period.
fn secs(q: Quota) -> String {
    q.period().as_secs().to_string()
}

/// Two keys blocked at once: the blocked-key cache's 429 names the rule the store's 429
/// named (the one that makes the client wait longest), with the same `Retry-After`, not
/// the first blocked rule with a shorter wait (the client would come back too soon).
#[tokio::test]
async fn a_cached_rejection_of_two_blocked_keys_names_the_worst_as_the_store_did() {
    let store = support::fake::Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::builder(store.clone())
        .rule("per-minute", MINUTE, key::header("x-api-key"))
        .rule("per-hour", HOUR, key::header("x-account"))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let svc = says_who(layer);
    let headers = [("x-api-key", "ak_1"), ("x-account", "acct_1")];
    assert_eq!(ask(&svc, &headers).await.0, StatusCode::OK);
    let (status, body, retry, rule) = ask(&svc, &headers).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1 Store"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(HOUR)), Some("per-hour")));
    let asked = store.checks();
    let (status, body, retry, rule) = ask(&svc, &headers).await;
    assert_eq!(store.checks(), asked, "refused from the cache");
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1 LocalCache"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(HOUR)), Some("per-hour")));
}

/// The store admitted a client's one unit of a minute's and of an hour's rule, then fails:
/// both of this server's shares of what the store said remains are spent. The fallback's
/// 429 names the hour's rule (the longest wait, as the store's 429 would), not the first
/// rule spent, with its key and its `Retry-After`.
#[tokio::test]
async fn a_fallback_rejection_over_two_spent_shares_names_the_longest_wait() {
    let store = support::fake::Remote::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = RateLimitLayer::builder(store.clone())
        .rule("per-minute", MINUTE, key::header("x-api-key"))
        .rule("per-hour", HOUR, key::header("x-account"))
        .fallback(MemoryStore::with_clock(ManualClock::new(T0)))
        .servers(1)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let svc = says_who(layer);
    let headers = |account| [("x-api-key", "ak_1"), ("x-account", account)];
    assert_eq!(ask(&svc, &headers("acct_1")).await.0, StatusCode::OK);
    store.set(support::fake::Mode::Failing);
    let (status, body, retry, rule) = ask(&svc, &headers("acct_1")).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-hour acct_1 Fallback"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(HOUR)), Some("per-hour")));
    // Another account: only the minute's share is spent.
    let (status, body, retry, rule) = ask(&svc, &headers("acct_2")).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, "per-minute ak_1 Fallback"));
    assert_eq!((retry.as_deref(), rule.as_deref()), (Some(&*secs(MINUTE)), Some("per-minute")));
}
