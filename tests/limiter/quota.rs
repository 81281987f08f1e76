//! `Quota`: the shorthands are rates, parsing every unit, and the errors of a zero or
//! overflowing quota.

use std::time::Duration;

use tollgate::Quota;

#[test]
fn shorthands_are_rates() {
    assert_eq!(Quota::per_second(5).period(), Duration::from_secs(1));
    assert_eq!(Quota::per_minute(100).limit(), 100);
    assert_eq!(Quota::per_hour(7).period_micros(), 3_600_000_000);
    assert_eq!(Quota::per_day(1000).period(), Duration::from_secs(86_400));
    assert_eq!(Quota::per_minute(100).burst_size(), 100);
    assert_eq!(Quota::per_minute(100).burst(5).burst_size(), 5);
}

#[test]
fn parses_every_unit() {
    for (s, limit, secs) in [
        ("100/s", 100, 1),
        ("100/sec", 100, 1),
        ("100/second", 100, 1),
        ("100/m", 100, 60),
        ("100/min", 100, 60),
        ("100/minute", 100, 60),
        ("100/h", 100, 3600),
        ("100/hour", 100, 3600),
        ("100/d", 100, 86_400),
        ("100/day", 100, 86_400),
        ("100/30s", 100, 30),
        (" 7 / 5min ", 7, 300),
    ] {
        let q: Quota = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!((q.limit(), q.period()), (limit, Duration::from_secs(secs)), "{s}");
    }
    assert_eq!("1/250ms".parse::<Quota>().unwrap().period_micros(), 250_000);
}

#[test]
fn bad_quotas_say_why() {
    for (s, needle) in [
        ("0/min", "limit is 0"),
        ("100", "expected <limit>/<period>"),
        ("x/min", "not a whole number"),
        ("100/fortnight", "unknown period unit"),
        ("100/0s", "period is 0"),
        ("100/400d", "longer than 366 days"),
        ("100/30", "no unit"),
    ] {
        let err = s.parse::<Quota>().unwrap_err().to_string();
        assert!(err.contains(needle), "{s}: {err}");
    }
    assert!(Quota::try_new(0, Duration::from_secs(1)).unwrap_err().to_string().contains("limit is 0"));
    assert!(Quota::try_new(1, Duration::ZERO).is_err());
    assert!(Quota::per_minute(1).try_burst(0).is_err());
    let err = Quota::new(1, Duration::from_secs(366 * 86_400)).try_burst(1 << 32).unwrap_err();
    assert!(err.to_string().contains("too large for the period"), "{err}");
    // Between B·T <= 2^52 and (B+1)·T <= 2^52: refused, since Lua's leaky bucket
    // computes (B+1)·T (it used to build, then fail every Redis call).
    let year = Quota::new(1, Duration::from_secs(366 * 86_400));
    let t = year.emission_interval_micros();
    let b = (1u64 << 52) / t;
    assert!(b * t <= 1 << 52 && (b + 1) * t > 1 << 52);
    assert!(year.try_burst(b).is_err());
    assert!(year.try_burst(b - 1).is_ok());
}

#[test]
#[should_panic(expected = "invalid quota: the limit is 0")]
fn zero_shorthand_panics_and_says_why() {
    let _ = Quota::per_minute(0);
}

#[test]
fn the_try_twins_say_what_is_wrong() {
    let err = Quota::try_per_minute(0).unwrap_err().to_string();
    assert!(err.starts_with("invalid quota: the limit is 0"), "{err}");
    assert!(!err.contains("invalid quota: invalid quota"), "{err}");
    assert_eq!(Quota::try_per_hour(7).unwrap(), Quota::per_hour(7));
    assert!(Quota::try_per_day((1 << 32) + 1).unwrap_err().to_string().contains("above 2^32"));
    assert_eq!(Quota::try_per_second(3).unwrap(), Quota::per_second(3));
}

#[test]
fn emission_interval_rounds_up() {
    assert_eq!(Quota::per_second(100).emission_interval_micros(), 10_000);
    assert_eq!(Quota::per_minute(7).emission_interval_micros(), 8_571_429);
    assert_eq!(Quota::new(10, Duration::from_micros(3)).emission_interval_micros(), 1);
}

#[test]
fn display_round_trips() {
    for s in ["100/min", "5/s", "3/30s", "1/250ms", "9/day"] {
        let q: Quota = s.parse().unwrap();
        assert_eq!(q.to_string().parse::<Quota>().unwrap(), q);
    }
}
