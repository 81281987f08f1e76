//! Rate-limit response headers: which ones ([`HeaderStyle`]) and how a [`Decision`](crate::Decision)
//! becomes them.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::LazyLock;
use std::thread::LocalKey;
use std::time::Duration;

use bytes::BytesMut;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::clock::{Clock, SystemClock};
use crate::decision::ceil_secs;
use crate::error::BuildError;
use crate::quota::Quota;
use crate::verdict::RuleDecision;

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Unix epoch
    /// seconds, as GitHub sends them); when the layer has several rules also
    /// `X-RateLimit-Rule`, naming the rule they describe.
    #[default]
    Legacy,
    /// The IETF draft (draft-ietf-httpapi-ratelimit-headers): `RateLimit-Policy` listing
    /// every rule, `RateLimit` for the most restrictive one.
    Ietf,
    /// Both.
    Both,
    /// None (a rejection still carries `Retry-After`).
    None,
}

impl FromStr for HeaderStyle {
    type Err = BuildError;

    /// `legacy`, `ietf`, `both` or `none`, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "legacy" => Ok(HeaderStyle::Legacy),
            "ietf" => Ok(HeaderStyle::Ietf),
            "both" => Ok(HeaderStyle::Both),
            "none" => Ok(HeaderStyle::None),
            _ => Err(BuildError::InvalidConfig {
                rule: String::new(),
                field: "headers".into(),
                why: format!("unknown header style {s:?}: use legacy, ietf, both or none"),
            }),
        }
    }
}

/// `X-RateLimit-Limit`
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-RateLimit-Rule`: the rule the other legacy headers describe.
pub const X_RATELIMIT_RULE: HeaderName = HeaderName::from_static("x-ratelimit-rule");
/// `RateLimit`
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy`
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The decimal digits of 0, 1, …, [`SMALL`] − 1 written one after the other, made once.
static DIGITS: LazyLock<&'static str> = LazyLock::new(|| {
    let mut s = String::with_capacity(38_890);
    for n in 0..SMALL {
        let _ = write!(s, "{n}");
    }
    Box::leak(s.into_boxed_str())
});

/// Numbers below this become header values with no allocation.
const SMALL: u64 = 10_000;

/// `n` as a header value, with no allocation of its own. Below [`SMALL`] (counts, limits,
/// seconds to wait: most values sent) it is a slice of [`DIGITS`]; larger numbers are
/// written into this thread's [`ARENA`], a 4 KiB buffer shared (a reference count) by the
/// values cut from it, so one allocation serves a few hundred of them
/// (`HeaderValue::from(u64)` allocates twice a value: a buffer, then the shared header it
/// freezes into).
pub(crate) fn number(n: u64) -> HeaderValue {
    if n >= SMALL {
        // A value cut from the arena keeps its whole chunk alive while it lives: fine for
        // a response's header, not for a value kept (see `kept_number`).
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n).as_bytes();
        let bytes = ARENA.with_borrow_mut(|arena| {
            if arena.capacity() - arena.len() < digits.len() {
                // A fresh chunk: the values cut from the old one keep it alive until dropped.
                *arena = BytesMut::with_capacity(ARENA_CHUNK);
            }
            arena.extend_from_slice(digits);
            arena.split().freeze()
        });
        return HeaderValue::from_maybe_shared(bytes).expect("digits are a valid header value");
    }
    // Where n starts in DIGITS: after every shorter number.
    let (first, width, start) = match n {
        0..=9 => (0, 1, 0),
        10..=99 => (10, 2, 10),
        100..=999 => (100, 3, 190),
        _ => (1000, 4, 2890),
    };
    let from = usize::try_from(start + (n - first) * width).expect("below SMALL");
    let to = from + usize::try_from(width).expect("at most 4");
    HeaderValue::from_static(&DIGITS[from..to])
}

/// `n` as a header value of its own allocation (not from [`ARENA`]), for the values the
/// caches below keep: a kept value cut from the arena would keep its 4 KiB chunk alive.
fn kept_number(n: u64) -> HeaderValue {
    if n >= SMALL {
        let mut digits = itoa::Buffer::new();
        return HeaderValue::from_str(digits.format(n)).expect("digits are a valid header value");
    }
    number(n)
}

/// `n` as a header value, for a value that mostly repeats from one response to the next
/// on a thread (`X-RateLimit-Limit`): the last value made on
/// this thread in `slot` is shared (a reference count), not formatted and allocated again.
fn repeated(slot: &'static LocalKey<RefCell<(u64, HeaderValue)>>, n: u64) -> HeaderValue {
    slot.with_borrow_mut(|(last, value)| {
        if *last != n {
            *value = kept_number(n);
            *last = n;
        }
        value.clone()
    })
}

/// `n` as a header value, for a value drawn from a few recent ones on a thread
/// (`X-RateLimit-Reset`'s epoch second: each key's own, within a window of now): a
/// direct-mapped cache of [`RECENT`] values, each shared (a reference count) while it stays.
fn recent(n: u64) -> HeaderValue {
    RESETS.with_borrow_mut(|slots| {
        #[allow(clippy::cast_possible_truncation, reason = "the remainder is below RECENT")]
        let (last, value) = &mut slots[(n % RECENT as u64) as usize];
        if *last != n {
            *value = kept_number(n);
            *last = n;
        }
        value.clone()
    })
}

/// The slots of [`recent`]'s cache: 64 seconds, a minute's window of resets.
const RECENT: usize = 64;

/// The size of [`ARENA`]'s chunks.
const ARENA_CHUNK: usize = 4096;

thread_local! {
    /// Where [`number`] writes numbers of [`SMALL`] and above.
    static ARENA: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    static RESETS: RefCell<[(u64, HeaderValue); RECENT]> =
        const { RefCell::new([const { (0, HeaderValue::from_static("0")) }; RECENT]) };
    static LAST_LIMIT: RefCell<(u64, HeaderValue)> = const { RefCell::new((0, HeaderValue::from_static("0"))) };
}

/// `Retry-After` in delta seconds, rounded up, at least 1.
pub(crate) fn retry_after(headers: &mut HeaderMap, d: Duration) {
    headers.insert(RETRY_AFTER, number(ceil_secs(d).max(1)));
}

/// The quota and window of `RateLimit-Policy` for `quota`: `w` in whole seconds. A period
/// that is not a whole number of seconds is sent as the smallest whole number of seconds
/// that holds a whole number of periods, with the quota scaled to match (`1/250ms` is
/// `q=4;w=1`, `1/1500ms` is `q=2;w=3`): the same rate, never a misstated one. `None` for
/// `w` when the scaled quota would not fit a structured-field integer.
fn policy(quota: Quota) -> (u64, Option<u64>) {
    const SEC: u64 = 1_000_000;
    let (limit, period) = (quota.limit(), quota.period_micros());
    let g = gcd(period, SEC);
    let (w, scale) = (period / g, SEC / g);
    match limit.checked_mul(scale).filter(|q| *q <= 999_999_999_999_999) {
        Some(q) => (q, Some(w)),
        None => (limit, None),
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Adds the headers of `style` describing `most` (the most restrictive rule) and, for the
/// IETF policy, every rule in `all`; `name_rule`: the layer has several rules, say which
/// one the legacy headers describe. The IETF `t` and `X-RateLimit-Reset` both name
/// [`Decision::reset_secs`](crate::Decision::reset_secs).
///
/// Nested layers (a `route_layer` inside a `layer`): an inner layer's headers already in
/// `headers` are merged, never overwritten blindly: the legacy headers describe the more
/// restrictive of the two (the inner one when it refused — `inner_refused` — or has no
/// more left), naming their rule; `RateLimit-Policy` lists both layers' policies;
/// `RateLimit` lists both, the more restrictive first. An outer layer never contradicts
/// an inner 429.
pub(crate) fn apply(
    headers: &mut HeaderMap,
    style: HeaderStyle,
    most: &RuleDecision<'_>,
    all: &[RuleDecision<'_>],
    name_rule: bool,
    inner_refused: bool,
) {
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        let d = most.decision;
        // The inner layer's remaining units: from its legacy headers, else its IETF ones.
        // One walk over the response's few headers costs less than two hashed lookups.
        // And whether a rule is named there (only then is there a name to remove).
        let (mut legacy, mut ietf, mut named) = (None, None, false);
        for (name, value) in headers.iter() {
            if *name == X_RATELIMIT_REMAINING {
                legacy = legacy.or(Some(value));
            } else if *name == RATELIMIT {
                ietf = ietf.or(Some(value));
            } else if *name == X_RATELIMIT_RULE {
                named = true;
            }
        }
        let inner = legacy
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .or_else(|| first_remaining(ietf?.to_str().ok()?));
        // An inner 429 (a layer, or the handler) is the most restrictive answer there is:
        // nothing here may contradict its `Retry-After` or `X-RateLimit-Reset`.
        if !(inner_refused || inner.is_some_and(|left| left <= d.remaining())) {
            // The wall clock as the crate's clock reads it: a counter read, no system call.
            let now = SystemClock.now_micros() / 1_000_000;
            // Room for the three at once (an empty response's map would grow twice).
            headers.reserve(3);
            headers.insert(X_RATELIMIT_LIMIT, repeated(&LAST_LIMIT, d.limit));
            headers.insert(X_RATELIMIT_REMAINING, number(d.remaining()));
            headers.insert(X_RATELIMIT_RESET, recent(now + d.reset_secs()));
            // Over an inner layer's headers, say whose these are; and no other rule's name
            // (an inner layer's, an upstream's) is left over these numbers.
            let rule = (name_rule || inner.is_some()).then_some(most.rule).filter(|r| !r.is_empty());
            match rule.and_then(|r| HeaderValue::from_str(r).ok()) {
                Some(v) => drop(headers.insert(X_RATELIMIT_RULE, v)),
                None if named => drop(headers.remove(X_RATELIMIT_RULE)),
                None => {}
            }
        }
    }
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        let d = most.decision;
        // An inner layer's (rare: copied out): its policies first (they were there first).
        let inner = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok()).map(str::to_owned);
        let (inner_policy, inner_limit) = (inner(RATELIMIT_POLICY), inner(RATELIMIT));
        let inner_limit = inner_limit.as_deref();
        let policy = match inner_policy {
            None => policy_value(all),
            Some(inner) => HeaderValue::from_str(&format!("{inner}, {}", policy_list(all))).ok(),
        };
        if let Some(v) = policy {
            headers.insert(RATELIMIT_POLICY, v);
        }
        let limit = RENDERED.with_borrow_mut(|buf| {
            buf.clear();
            // Its `RateLimit` first when it is the more restrictive.
            let inner_first = inner_limit
                .filter(|inner| inner_refused || first_remaining(inner).is_some_and(|left| left <= d.remaining()));
            if let Some(inner) = inner_first {
                buf.push_str(inner);
                buf.push_str(", ");
            }
            push_sf_string(buf, most.rule);
            let mut digits = itoa::Buffer::new();
            buf.push_str(";r=");
            buf.push_str(digits.format(d.remaining()));
            buf.push_str(";t=");
            buf.push_str(digits.format(d.reset_secs()));
            if let Some(inner) = inner_limit.filter(|_| inner_first.is_none()) {
                buf.push_str(", ");
                buf.push_str(inner);
            }
            HeaderValue::from_str(buf).ok()
        });
        if let Some(v) = limit {
            headers.insert(RATELIMIT, v);
        }
    }
}

/// `RateLimit-Policy`'s list for `all`: `"name";q=…;w=…` each, comma-separated.
fn policy_list(all: &[RuleDecision<'_>]) -> String {
    let mut policy = String::with_capacity(32 * all.len());
    for (i, o) in all.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
        }
        let (q, w) = self::policy(o.quota);
        push_sf_string(&mut policy, o.rule);
        let _ = write!(policy, ";q={q}");
        if let Some(w) = w {
            let _ = write!(policy, ";w={w}");
        }
    }
    policy
}

/// `RateLimit-Policy` for `all`, rendered once a thread for as long as the rules and
/// their quotas are those of the last response (they rarely change between requests):
/// a reference count, not a list formatted and allocated again.
fn policy_value(all: &[RuleDecision<'_>]) -> Option<HeaderValue> {
    LAST_POLICY.with_borrow_mut(|(key, value)| {
        let same = key.len() == all.len() && key.iter().zip(all).all(|((r, q), o)| r == o.rule && *q == o.quota);
        if !same {
            *value = HeaderValue::from_str(&policy_list(all)).ok();
            *key = all.iter().map(|o| (o.rule.to_owned(), o.quota)).collect();
        }
        value.clone()
    })
}

/// [`policy_value`]'s last rules (name, quota) and their header value.
type KeptPolicy = (Vec<(String, Quota)>, Option<HeaderValue>);

thread_local! {
    static LAST_POLICY: RefCell<KeptPolicy> = const { RefCell::new((Vec::new(), None)) };
    /// Where `RateLimit` is written before it is copied into its header value.
    static RENDERED: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The `r` parameter of the first member of a `RateLimit` list (`"name";r=5;t=10, …`, or a
/// token for the name): the parameters after the member's item, up to the first comma
/// outside a string.
fn first_remaining(value: &str) -> Option<u64> {
    let (mut in_string, mut escaped) = (false, false);
    let (mut params, mut end) = (None, value.len());
    for (i, c) in value.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            ';' if params.is_none() => params = Some(i),
            ',' => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    value[params?..end].split(';').find_map(|p| p.trim().strip_prefix("r=")?.parse().ok())
}

/// A structured-field string: `"…"` with `\` and `"` escaped, non-printable bytes dropped.
/// `s` as a structured-field string (quoted, `"` and `\\` escaped, what is not printable
/// ASCII left out), appended to `out`.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Decision;

    fn decision(remaining: u64, reset_ms: u64) -> Decision {
        Decision::from_parts(
            true,
            100,
            remaining,
            Duration::from_millis(reset_ms),
            Duration::from_millis(reset_ms),
            None,
            Duration::ZERO,
        )
    }

    #[test]
    fn ietf_headers_list_every_policy() {
        let (a, b) = (decision(45, 29_001), decision(900, 3_600_000));
        let all = [
            RuleDecision { rule: "per-min", quota: Quota::per_minute(100), decision: &a, taken: None },
            RuleDecision { rule: "say \"hi\"", quota: Quota::per_day(1000), decision: &b, taken: None },
        ];
        let mut h = HeaderMap::new();
        apply(&mut h, HeaderStyle::Ietf, &all[0], &all, true, false);
        assert_eq!(h[&RATELIMIT_POLICY], r#""per-min";q=100;w=60, "say \"hi\"";q=1000;w=86400"#);
        assert_eq!(h[&RATELIMIT], r#""per-min";r=45;t=30"#);
        assert!(h.get(X_RATELIMIT_LIMIT).is_none());
    }

    /// The policy rendered once a thread is rendered again when the rules or their quotas
    /// change (a tier, a swap), never served stale; an inner layer's goes first.
    #[test]
    fn the_kept_policy_follows_the_rules() {
        let a = decision(5, 1_000);
        let policy = |rules: &[(&'static str, Quota)], inner: Option<&'static str>| {
            let all: Vec<_> =
                rules.iter().map(|&(rule, quota)| RuleDecision { rule, quota, decision: &a, taken: None }).collect();
            let mut h = HeaderMap::new();
            if let Some(inner) = inner {
                h.insert(RATELIMIT_POLICY, HeaderValue::from_static(inner));
            }
            apply(&mut h, HeaderStyle::Ietf, &all[0], &all, true, false);
            (h[&RATELIMIT_POLICY].to_str().unwrap().to_owned(), h[&RATELIMIT].to_str().unwrap().to_owned())
        };
        let (m, h) = (Quota::per_minute(100), Quota::per_hour(1000));
        assert_eq!(policy(&[("a", m)], None).0, r#""a";q=100;w=60"#);
        assert_eq!(policy(&[("a", m)], None).0, r#""a";q=100;w=60"#);
        assert_eq!(policy(&[("a", h)], None).0, r#""a";q=1000;w=3600"#, "another tier's quota");
        assert_eq!(policy(&[("b", h)], None).0, r#""b";q=1000;w=3600"#, "another rule");
        assert_eq!(policy(&[("b", h), ("a", m)], None).0, r#""b";q=1000;w=3600, "a";q=100;w=60"#);
        assert_eq!(policy(&[("b", h)], None).0, r#""b";q=1000;w=3600"#, "fewer rules");
        assert_eq!(policy(&[("b", h)], Some(r#""up";q=1;w=1"#)).0, r#""up";q=1;w=1, "b";q=1000;w=3600"#);
        assert_eq!(policy(&[("b", h)], None), (r#""b";q=1000;w=3600"#.to_owned(), r#""b";r=5;t=1"#.to_owned()));
    }

    #[test]
    fn legacy_headers() {
        let a = decision(7, 1_500);
        let all = [RuleDecision { rule: "r", quota: Quota::per_minute(100), decision: &a, taken: None }];
        let mut h = HeaderMap::new();
        apply(&mut h, HeaderStyle::Legacy, &all[0], &all, false, false);
        assert_eq!(h[&X_RATELIMIT_LIMIT], "100");
        assert_eq!(h[&X_RATELIMIT_REMAINING], "7");
        let reset: u64 = h[&X_RATELIMIT_RESET].to_str().unwrap().parse().unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!((now + 1..=now + 3).contains(&reset), "{reset} vs {now}");
        assert!(h.get(X_RATELIMIT_RULE).is_none());
        assert!(h.get(RATELIMIT).is_none());
    }

    /// Repeated and recent values are cached per thread: a new value gets a new header
    /// value, going back to an earlier one is no stale hit (also when two values share a
    /// slot of the recent cache, 64 apart), and one header's value never shows in the
    /// other's.
    #[test]
    fn repeated_values_are_cached_but_never_stale() {
        let values = [1_700_000_000, 1_700_000_000, 1_700_000_001, 1_700_000_064, 1_700_000_000, 5, 5, 69, 12_345];
        for n in values {
            assert_eq!(recent(n), n.to_string().as_str());
            let limit = n / 3 + 1;
            assert_eq!(repeated(&LAST_LIMIT, limit), limit.to_string().as_str());
        }
    }

    #[test]
    fn the_first_members_remaining_is_read_past_quoted_commas() {
        assert_eq!(first_remaining(r#""a";r=5;t=10"#), Some(5));
        assert_eq!(first_remaining(r#""a, \"b\";r=9";r=0;t=1, "c";r=3;t=2"#), Some(0));
        assert_eq!(first_remaining(r#""a";t=1"#), None);
        assert_eq!(first_remaining("garbage"), None);
        assert_eq!(first_remaining("token;r=7, \"b\";r=1"), Some(7), "a token for the name");
        assert_eq!(first_remaining("\"a\", \"b\";r=1"), None, "the first member has no r");
    }

    #[test]
    fn policy_windows_are_whole_seconds_with_the_same_rate() {
        let p = |s: &str| policy(s.parse().unwrap());
        assert_eq!(p("100/min"), (100, Some(60)));
        assert_eq!(p("1/250ms"), (4, Some(1)));
        assert_eq!(p("1/1500ms"), (2, Some(3)));
        assert_eq!(p("7/100ms"), (70, Some(1)));
        assert_eq!(p("3/333us"), (3_000_000, Some(333)));
        assert_eq!(policy(Quota::new(1 << 32, Duration::from_micros(7))), (1 << 32, None));
    }

    #[test]
    fn numbers_are_their_decimal_digits() {
        let mut check: Vec<u64> = (0..=10_001).collect();
        check.extend([99_999, 1 << 40, u64::MAX]);
        // Past the arena's chunks: a value cut from an old chunk stays as it was.
        check.extend((0..2_000).map(|i| 1_000_000_007 * i + 10_000));
        let kept: Vec<(u64, HeaderValue)> = check.iter().map(|&n| (n, number(n))).collect();
        for (n, value) in kept {
            assert_eq!(value, n.to_string().as_str(), "{n}");
        }
    }

    #[test]
    fn retry_after_rounds_up_to_at_least_one() {
        for (d, want) in
            [(Duration::from_micros(1), "1"), (Duration::from_millis(1001), "2"), (Duration::from_secs(30), "30")]
        {
            let mut h = HeaderMap::new();
            retry_after(&mut h, d);
            assert_eq!(h[RETRY_AFTER], want);
        }
    }
}
