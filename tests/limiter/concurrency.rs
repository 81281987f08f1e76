//! Issue 42: concurrency rules by key on the in-process store — `Rule::concurrent`,
//! `Limiter::enter_key` and its `Permit`, composition with rate rules, shadow, tiers, and
//! the build errors.

use std::time::Duration;

use tollgate::{BuildError, Limiter, MemoryStore, Quota, Rule, StoreError};

fn user(u: &str) -> Option<String> {
    Some(u.to_owned())
}

fn limiter(rules: Vec<Rule<str>>) -> Limiter<MemoryStore, str> {
    rules.into_iter().fold(Limiter::builder(MemoryStore::new()), |b, r| b.add_rule(r)).build().unwrap()
}

#[tokio::test]
async fn n_permits_are_held_until_dropped_and_each_goes_back_once() {
    let l = limiter(vec![Rule::concurrent("jobs", 2, user)]);
    let a = l.enter_key("jobs", "ada", 1).await;
    let b = l.enter_key("jobs", "ada", 1).await;
    assert!(a.is_allowed() && b.is_allowed());
    assert_eq!((a.permits(), b.permits()), (1, 1));
    let refused = l.enter_key("jobs", "ada", 1).await;
    assert!(refused.is_rejected());
    assert_eq!(refused.permits(), 0, "a refusal holds nothing");
    let retry = refused.retry_after().expect("a refusal says when to retry");
    assert!(retry >= Duration::from_millis(10), "{retry:?}");
    assert!(l.enter_key("jobs", "bob", 1).await.is_allowed(), "another key has its own permits");
    drop(refused);
    drop(a);
    let c = l.enter_key("jobs", "ada", 1).await;
    assert!(c.is_allowed(), "a dropped permit made room");
    assert!(l.enter_key("jobs", "ada", 1).await.is_rejected(), "and only one");
    let verdict = b.release();
    assert!(verdict.is_allowed());
    drop(verdict);
    assert!(l.enter_key("jobs", "ada", 1).await.is_allowed());
}

#[tokio::test]
async fn a_cost_is_several_permits_and_more_than_n_never_passes() {
    let l = limiter(vec![Rule::concurrent("renders", 4, user)]);
    let big = l.enter_key("renders", "ada", 3).await;
    assert_eq!(big.permits(), 3);
    assert!(l.enter_key("renders", "ada", 2).await.is_rejected());
    let one = l.enter_key("renders", "ada", 1).await;
    assert!(one.is_allowed());
    let never = l.enter_key("renders", "bob", 5).await;
    assert!(never.is_rejected());
    assert_eq!(never.retry_after(), None, "5 permits of 4 can never be held");
}

#[tokio::test]
async fn the_retry_time_is_the_median_hold_time() {
    tokio::time::pause();
    let l = limiter(vec![Rule::concurrent("jobs", 1, user)]);
    // The memory store's clock is the system's: real holds of about 40 ms each.
    for _ in 0..3 {
        let p = l.enter_key("jobs", "ada", 1).await;
        assert!(p.is_allowed());
        std::thread::sleep(Duration::from_millis(40));
        drop(p);
    }
    let _held = l.enter_key("jobs", "ada", 1).await;
    let retry = l.enter_key("jobs", "ada", 1).await.retry_after().unwrap();
    assert!(retry >= Duration::from_millis(40) && retry < Duration::from_millis(400), "{retry:?}");
}

#[tokio::test]
async fn refused_by_a_rate_rule_holds_no_permit_and_refused_by_permits_takes_no_rate_unit() {
    let l = limiter(vec![Rule::new("per-minute", Quota::per_minute(3), user), Rule::concurrent("in-flight", 1, user)]);
    let held = l.enter("ada").await;
    assert!(held.is_allowed());
    assert_eq!(held.permits(), 1);
    // Refused by the permits: the rate rule takes nothing.
    for _ in 0..5 {
        let refused = l.enter("ada").await;
        assert_eq!(refused.rejected_by().unwrap().rule, "in-flight");
    }
    drop(held);
    // Two rate units are left of three.
    drop(l.enter("ada").await);
    drop(l.enter("ada").await);
    let refused = l.enter("ada").await;
    assert_eq!(refused.rejected_by().unwrap().rule, "per-minute");
    assert_eq!(refused.permits(), 0, "refused by the rate rule: no permit held");
    // And the permit is free: the rate rule's refusal held nothing.
    assert!(l.enter_key("in-flight", "ada", 1).await.is_allowed());
}

#[tokio::test]
async fn a_shadow_concurrency_rule_records_and_never_refuses() {
    let l = limiter(vec![Rule::concurrent("in-flight", 1, user).shadow(true)]);
    let a = l.enter("ada").await;
    let b = l.enter("ada").await;
    assert!(a.is_allowed() && b.is_allowed(), "shadow never refuses");
    assert_eq!(a.permits(), 1, "the first was within the limit: its permit is held");
    assert_eq!(b.permits(), 0, "the second would have been refused: nothing held");
}

#[tokio::test]
async fn tiers_choose_n_per_input() {
    let rule = Rule::concurrent("in-flight", 1, |u: &str| Some(u.trim_start_matches("pro:").to_owned()))
        .permits_fn(|u: &str| Some(if u.starts_with("pro:") { 3 } else { 1 }));
    let l = limiter(vec![rule]);
    let held: Vec<_> = [l.enter("pro:ada").await, l.enter("pro:ada").await, l.enter("pro:ada").await].into();
    assert!(held.iter().all(|p| p.is_allowed()));
    assert!(l.enter("pro:ada").await.is_rejected());
    assert!(l.enter("bob").await.is_allowed());
}

#[tokio::test]
async fn a_check_of_a_concurrency_rule_is_refused_with_what_to_call() {
    let l = limiter(vec![Rule::concurrent("jobs", 2, user)]);
    let v = l.check_key("jobs", "ada", 1).await;
    assert!(!v.is_allowed(), "refused (failed closed), whatever the fail mode");
    match v.store_error() {
        Some(StoreError::Invalid(why)) => assert!(why.contains("enter_key"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(l.check("ada").await.store_error().is_some());
    assert!(l.check_key_now("jobs", "ada", 1).store_error().is_some());
    // Nothing was taken by those.
    let (a, b) = (l.enter_key("jobs", "ada", 1).await, l.enter_key("jobs", "ada", 1).await);
    assert!(a.is_allowed() && b.is_allowed());
}

#[tokio::test]
async fn wait_enter_key_waits_for_a_permit() {
    let l = std::sync::Arc::new(limiter(vec![Rule::concurrent("jobs", 1, user)]));
    let held = l.enter_key("jobs", "ada", 1).await;
    let l2 = l.clone();
    let waiter = tokio::spawn(async move { l2.wait_enter_key("jobs", "ada", 1, Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(held);
    let got = waiter.await.unwrap();
    assert!(got.is_allowed(), "{got:?}");
    let gave_up = l.wait_enter_key("jobs", "ada", 1, Duration::from_millis(5)).await;
    assert!(gave_up.is_rejected());
}

#[test]
fn bad_concurrency_rules_are_build_errors_that_say_why() {
    let err = |r: Rule<str>| Limiter::builder(MemoryStore::new()).add_rule(r).build().unwrap_err();
    let said = |e: BuildError| e.to_string();
    assert!(said(err(Rule::concurrent("jobs", 0, user))).contains("at least 1 permit"));
    assert!(said(err(Rule::concurrent("jobs", 2, user).algorithm(tollgate::Algorithm::Gcra))).contains("no algorithm"));
    assert!(said(err(Rule::new("api", Quota::per_minute(1), user).algorithm(tollgate::Algorithm::Concurrent)))
        .contains("Rule::concurrent"));
    assert!(said(err(Rule::concurrent("jobs", 2, user).charged())).contains("charged"));
    assert!(said(err(Rule::concurrent("jobs", 2, user).block_for(Duration::from_secs(1)))).contains("block"));
    assert!(said(err(Rule::concurrent("jobs", 2, user).hold_limit(Duration::from_millis(2)))).contains("3 ms"));
    let default = Limiter::<_, str>::builder(MemoryStore::new())
        .add_rule(Rule::new("api", Quota::per_minute(1), user))
        .algorithm(tollgate::Algorithm::Concurrent)
        .build()
        .unwrap_err();
    assert!(said(default).contains("default algorithm"));
}
