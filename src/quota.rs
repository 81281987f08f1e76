//! [`Quota`]: how many units per period, and how many at once.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::BuildError;

/// `limit` units per `period`, with a `burst` capacity (defaults to `limit`).
///
/// `Quota::per_minute(100)` means 100 a minute, always: it is a rate, never "one every n".
/// How a burst is treated belongs to the [`Algorithm`](crate::Algorithm): window algorithms
/// cap a window at `limit`; the token bucket and GCRA let `burst` units through at once and
/// then the rate.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let q = Quota::per_minute(100);
/// assert_eq!(q.limit(), 100);
/// assert_eq!(q.period(), Duration::from_secs(60));
/// assert_eq!("100/min".parse::<Quota>().unwrap(), q);
/// assert_eq!("5/30s".parse::<Quota>().unwrap(), Quota::new(5, Duration::from_secs(30)));
/// assert!(Quota::try_new(0, Duration::from_secs(1)).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period_us: u64,
    burst: u64,
    /// The emission interval, `ceil(period / limit)`: made once, as every decision of the
    /// bucket algorithms and GCRA needs it (a 64-bit division a decision otherwise).
    interval_us: u64,
}

/// Longest period a quota may have: 366 days. Keeps every product of the algorithms
/// exact in 64-bit integers and in Lua's doubles.
const MAX_PERIOD_US: u64 = 366 * 86_400 * 1_000_000;
/// Largest limit or burst: 2^32 units per period.
const MAX_UNITS: u64 = 1 << 32;
/// Largest `(burst + 1) × emission interval`, in µs (about 142 years): keeps every product
/// the algorithms form (the leaky bucket's queue of `B + 1` slots the largest) exact in
/// Lua's doubles, so a quota that builds is one every store can compute.
const MAX_BURST_SPAN_US: u64 = 1 << 52;

/// Whether `burst` fits a quota of emission interval `t`: `(burst + 1)·t <= 2^52`.
const fn burst_fits(burst: u64, t: u64) -> bool {
    burst.saturating_add(1).saturating_mul(t) <= MAX_BURST_SPAN_US
}

impl Quota {
    /// `limit` units per `period`.
    ///
    /// # Panics
    ///
    /// When `limit` is 0, above 2^32, or `period` is shorter than 1 µs or longer than
    /// 366 days. Use [`Quota::try_new`] for values that come from configuration.
    #[must_use]
    pub const fn new(limit: u64, period: Duration) -> Self {
        match Self::check(limit, period) {
            Ok(q) => q,
            // Says which bound (a const panic cannot format the value itself).
            Err(why) => panic!("{}", why),
        }
    }

    /// `limit` units per `period`, or an error that says what is wrong.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidQuota`] when `limit` is 0 or above 2^32, or when `period` is
    /// shorter than 1 µs or longer than 366 days.
    pub fn try_new(limit: u64, period: Duration) -> Result<Self, BuildError> {
        Self::check(limit, period)
            .map_err(|why| BuildError::InvalidQuota(why.trim_start_matches("invalid quota: ").to_owned()))
    }

    /// [`Quota::per_second`], or an error that says what is wrong (a limit from
    /// configuration).
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidQuota`] when `n` is 0 or above 2^32.
    pub fn try_per_second(n: u64) -> Result<Self, BuildError> {
        Self::try_new(n, Duration::from_secs(1))
    }

    /// [`Quota::per_minute`], or an error that says what is wrong.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidQuota`] when `n` is 0 or above 2^32.
    pub fn try_per_minute(n: u64) -> Result<Self, BuildError> {
        Self::try_new(n, Duration::from_secs(60))
    }

    /// [`Quota::per_hour`], or an error that says what is wrong.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidQuota`] when `n` is 0 or above 2^32.
    pub fn try_per_hour(n: u64) -> Result<Self, BuildError> {
        Self::try_new(n, Duration::from_secs(3600))
    }

    /// [`Quota::per_day`], or an error that says what is wrong.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidQuota`] when `n` is 0 or above 2^32.
    pub fn try_per_day(n: u64) -> Result<Self, BuildError> {
        Self::try_new(n, Duration::from_secs(86_400))
    }

    const fn check(limit: u64, period: Duration) -> Result<Self, &'static str> {
        if limit == 0 {
            return Err("invalid quota: the limit is 0, and a quota must allow at least 1 unit per period");
        }
        if limit > MAX_UNITS {
            return Err("invalid quota: the limit is above 2^32 units per period");
        }
        let period_us = period.as_micros();
        if period_us == 0 {
            return Err("invalid quota: the period is 0, and it must be at least 1 µs");
        }
        if period_us > MAX_PERIOD_US as u128 {
            return Err("invalid quota: the period is longer than 366 days");
        }
        Ok(Self::of(limit, period_us as u64))
    }

    /// A quota of valid `limit` and `period_us`, its burst the limit.
    const fn of(limit: u64, period_us: u64) -> Self {
        // At least 1: the period is at least 1 µs.
        Self { limit, period_us, burst: limit, interval_us: period_us.div_ceil(limit) }
    }

    /// `n` per second.
    ///
    /// # Panics
    ///
    /// When `n` is 0 or above 2^32.
    #[must_use]
    pub const fn per_second(n: u64) -> Self {
        Self::new(n, Duration::from_secs(1))
    }

    /// `n` per minute.
    ///
    /// # Panics
    ///
    /// When `n` is 0 or above 2^32.
    #[must_use]
    pub const fn per_minute(n: u64) -> Self {
        Self::new(n, Duration::from_secs(60))
    }

    /// `n` per hour.
    ///
    /// # Panics
    ///
    /// When `n` is 0 or above 2^32.
    #[must_use]
    pub const fn per_hour(n: u64) -> Self {
        Self::new(n, Duration::from_secs(3600))
    }

    /// `n` per day.
    ///
    /// # Panics
    ///
    /// When `n` is 0 or above 2^32.
    #[must_use]
    pub const fn per_day(n: u64) -> Self {
        Self::new(n, Duration::from_secs(86_400))
    }

    /// The burst: how many units may pass at one instant (token bucket, GCRA) or wait in
    /// the queue besides the one leaving (leaky bucket). Defaults to the limit.
    ///
    /// # Panics
    ///
    /// When `burst` is 0 or above 2^32, or when `(burst + 1) × period / limit` exceeds
    /// 2^52 µs (about 142 years); see [`Quota::try_burst`].
    #[must_use]
    pub const fn burst(self, burst: u64) -> Self {
        match self.check_burst(burst) {
            Ok(q) => q,
            Err(why) => panic!("{}", why),
        }
    }

    /// Like [`Quota::burst`], with an error instead of a panic.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidQuota`] when `burst` is 0 or above 2^32.
    pub fn try_burst(self, burst: u64) -> Result<Self, BuildError> {
        self.check_burst(burst)
            .map_err(|why| BuildError::InvalidQuota(why.trim_start_matches("invalid quota: ").to_owned()))
    }

    const fn check_burst(mut self, burst: u64) -> Result<Self, &'static str> {
        if burst == 0 {
            return Err("invalid quota: the burst is 0: it must be at least 1");
        }
        if burst > MAX_UNITS {
            return Err("invalid quota: the burst is above 2^32 units");
        }
        if !burst_fits(burst, self.emission_interval_micros()) {
            return Err("invalid quota: the burst is too large for the period: (burst + 1) × (period / limit) must \
                 stay below 2^52 µs (about 142 years)");
        }
        self.burst = burst;
        Ok(self)
    }

    /// Units per period.
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    #[must_use]
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds.
    #[must_use]
    pub const fn period_micros(&self) -> u64 {
        self.period_us
    }

    /// The burst (defaults to the limit).
    #[must_use]
    pub const fn burst_size(&self) -> u64 {
        self.burst
    }

    /// This quota's share for one of `instances` servers (the fallback limiter): the limit
    /// and burst divided, at least 1 unit, the burst clamped to what the period allows.
    /// Never panics, whatever quota it is given.
    pub(crate) fn divided(self, instances: u64) -> Self {
        let instances = instances.max(1);
        let limit = (self.limit / instances).max(1);
        let mut q = Self::of(limit, self.period_us);
        let t = q.emission_interval_micros();
        let most = MAX_BURST_SPAN_US / t - 1; // (most + 1)·t <= 2^52; t <= 366 days: most >= 141
        q.burst = (self.burst / instances).clamp(1, most);
        q
    }

    /// The emission interval `T = ceil(period / limit)` in µs, at least 1: the spacing of
    /// the bucket algorithms and GCRA.
    #[must_use]
    pub const fn emission_interval_micros(&self) -> u64 {
        self.interval_us
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("limit", &self.limit)
            .field("period", &self.period())
            .field("burst", &self.burst)
            .finish()
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.period_us;
        match p {
            1_000_000 => write!(f, "{}/s", self.limit)?,
            60_000_000 => write!(f, "{}/min", self.limit)?,
            3_600_000_000 => write!(f, "{}/h", self.limit)?,
            86_400_000_000 => write!(f, "{}/day", self.limit)?,
            _ if p.is_multiple_of(1_000_000) => write!(f, "{}/{}s", self.limit, p / 1_000_000)?,
            _ if p.is_multiple_of(1_000) => write!(f, "{}/{}ms", self.limit, p / 1_000)?,
            _ => write!(f, "{}/{}us", self.limit, p)?,
        }
        if self.burst != self.limit {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

impl FromStr for Quota {
    type Err = BuildError;

    /// Parses `"<limit>/<period>"`: `100/s`, `100/sec`, `100/second`, `100/m`, `100/min`,
    /// `100/minute`, `100/h`, `100/hour`, `100/d`, `100/day`, and a count of units such as
    /// `100/30s`, `10/5min`, `1/250ms`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| BuildError::InvalidQuota(format!("{s:?}: {why}"));
        let (limit, period) =
            s.trim().split_once('/').ok_or_else(|| bad("expected <limit>/<period>, e.g. 100/min or 10/30s"))?;
        let limit: u64 = limit.trim().parse().map_err(|_| bad("the limit is not a whole number"))?;
        let period = period.trim();
        let digits = period.find(|c: char| !c.is_ascii_digit()).unwrap_or(period.len());
        let (count, unit) = period.split_at(digits);
        let count: u64 = if count.is_empty() {
            1
        } else {
            count.parse().map_err(|_| bad("the period count is not a whole number"))?
        };
        let unit_us = match unit.trim() {
            "" => return Err(bad("the period has no unit (s, min, h, day)")),
            unit => unit_micros(unit).ok_or_else(|| bad("unknown period unit (use s, min, h or day)"))?,
        };
        let period_us = count.checked_mul(unit_us).ok_or_else(|| bad("the period is longer than 366 days"))?;
        Self::check(limit, Duration::from_micros(period_us))
            .map_err(|why| bad(why.trim_start_matches("invalid quota: ")))
    }
}

/// Microseconds per unit of a period (`"100/5min"`) or a duration (`timeout = "50ms"`):
/// `us`, `ms`, `s`, `min`, `h`, `day`, with their long and plural forms.
pub(crate) fn unit_micros(unit: &str) -> Option<u64> {
    Some(match unit {
        "us" | "µs" => 1,
        "ms" => 1_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000_000,
        "d" | "day" | "days" => 86_400_000_000,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The interval made once is `ceil(period / limit)` for every way a quota is made:
        /// built, given a burst, divided between servers.
        #[test]
        fn the_interval_is_the_period_over_the_limit_rounded_up(
            limit in 1..=MAX_UNITS,
            period_us in 1..=MAX_PERIOD_US,
            burst in 1..=1_000u64,
            servers in 1..=64u64,
        ) {
            let q = Quota::new(limit, Duration::from_micros(period_us));
            proptest::prop_assert_eq!(q.emission_interval_micros(), period_us.div_ceil(limit));
            if let Ok(b) = q.try_burst(burst) {
                proptest::prop_assert_eq!(b.emission_interval_micros(), period_us.div_ceil(limit));
            }
            let d = q.divided(servers);
            proptest::prop_assert_eq!(d.emission_interval_micros(), period_us.div_ceil(d.limit()));
        }
    }

    #[test]
    fn a_divided_quota_never_panics() {
        // 3 a day with a burst of 150,000 builds; between two servers the share would be
        // 1 a day (T = 86.4 ks) with a burst of 75,000: 75,001 × T is above 2^52 µs, and
        // `Quota::burst` would panic at request time. It is clamped instead.
        let q = Quota::per_day(3).try_burst(150_000).unwrap();
        let d = q.divided(2);
        assert_eq!(d.limit(), 1);
        assert!(d.burst_size() >= 1 && burst_fits(d.burst_size(), d.emission_interval_micros()));
        assert_eq!(Quota::per_minute(100).burst(10).divided(3), Quota::per_minute(33).burst(3));
        assert_eq!(Quota::per_minute(2).divided(5), Quota::per_minute(1));
        for n in [1, 2, 7, 1 << 40] {
            let d = Quota::new(1 << 32, Duration::from_secs(366 * 86_400)).divided(n);
            assert!(burst_fits(d.burst_size(), d.emission_interval_micros()));
        }
    }
}
