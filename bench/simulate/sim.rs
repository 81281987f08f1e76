//! The simulator's core, shared by `bench/simulate.rs` and `bench/tests/accuracy.rs`: request
//! traces generated from a seed, their replay through a store with simulated time, and the
//! judge that holds every decision against the exact sliding-window rule.
//!
//! The rule: per key, at most `L` accepted units in any window `(t - W, t]`. Each algorithm
//! is judged against its own history of accepted units:
//!
//! - an accepted request is **over-admitted** when the trailing window ending at it, this
//!   request included, holds more than `L` units;
//! - a refused request is **wrongly refused** when the units accepted before it, in the
//!   trailing window, plus its cost are at most `L`;
//! - the **worst window** is the largest number of units accepted in any `W`-long window of
//!   one key.
//!
//! Per source (key), as Cloudflare counts: a source **limited within the limit** never sent
//! more than `L` units in any `W`-long window yet had a request refused; a source
//! **unlimited above the limit** sent more than `L` in some window yet had none refused.
//!
//! The leaky bucket delays instead of refusing, so its requests are judged at the time they
//! are forwarded (`now + delay`); when it refuses, the requests still waiting in its queue
//! count as accepted before.
//!
//! Each key keeps a deque of its accepted units with running totals, so judging is
//! O(log n) per request and the memory is bounded by what one window holds.

use std::collections::VecDeque;
use std::error::Error;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tollgate::key::Key;
use tollgate::store::Params;
use tollgate::store::{Check, RuleName};
use tollgate::{Algorithm, Decision, MemoryStore, Quota};

/// Every trace starts at this instant (2023-11-14T22:13:20Z) rounded up to a multiple of
/// the period, so the trace's offset 0 is a window boundary of the window algorithms.
const EPOCH_US: u64 = 1_700_000_000_000_000;

/// The heavy-tail trace: Zipf exponent of the sources' popularity.
const ZIPF_EXPONENT: f64 = 1.1;
/// The heavy-tail trace: requests per source on average (20,000 sources for 2M requests).
const REQUESTS_PER_SOURCE: usize = 100;
/// The heavy-tail trace: how many periods it lasts.
const HEAVY_TAIL_PERIODS: u64 = 60;
/// The bursty trace: during a burst, requests arrive at this multiple of the limit.
const BURST_RATE: f64 = 5.0;
/// The bursty trace: mean length of a burst, and of the silence after it, in periods.
const BURST_ON: f64 = 0.2;
const BURST_OFF: f64 = 1.0;

/// A boxed error, for store failures and I/O.
pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// The cost of every simulated request.
pub(crate) const COST: u64 = 1;

/// One request of a trace, of cost [`COST`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    /// µs since the start of the trace.
    pub(crate) at: u64,
    /// The source: key ids are dense, `0..Trace::keys`.
    pub(crate) key: u32,
}

/// The kinds of trace the simulator generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TraceKind {
    /// One key, Poisson arrivals at 80% of the limit.
    PoissonBelow,
    /// One key, Poisson arrivals at 150% of the limit.
    PoissonAbove,
    /// One key: the seed article's example generalised to `L`, then `L` requests just
    /// before a window boundary and `L` just after.
    Boundary,
    /// One key: bursts at 5× the limit (0.2 periods on average), then silence (1 period on
    /// average).
    Bursty,
    /// Many keys (one per 100 requests) with Zipf-like popularity: a few very hot sources
    /// and a long tail of quiet ones.
    HeavyTail,
}

impl TraceKind {
    /// Every trace, in report order.
    pub(crate) const ALL: [TraceKind; 5] = [
        TraceKind::PoissonBelow,
        TraceKind::PoissonAbove,
        TraceKind::Boundary,
        TraceKind::Bursty,
        TraceKind::HeavyTail,
    ];

    /// The name used on the command line and in the report.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            TraceKind::PoissonBelow => "poisson-below",
            TraceKind::PoissonAbove => "poisson-above",
            TraceKind::Boundary => "boundary",
            TraceKind::Bursty => "bursty",
            TraceKind::HeavyTail => "heavy-tail",
        }
    }

    /// The trace called `name`, if any.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// How many requests the full-size trace has (the boundary trace always has `4L`).
    pub(crate) const fn default_requests(self) -> usize {
        match self {
            TraceKind::PoissonBelow | TraceKind::PoissonAbove | TraceKind::Bursty => 1_000_000,
            TraceKind::Boundary => 0,
            TraceKind::HeavyTail => 2_000_000,
        }
    }

    /// How many requests [`TraceKind::generate`] will make.
    pub(crate) fn size(self, quota: Quota, requests: Option<usize>) -> u64 {
        match self {
            TraceKind::Boundary => 4 * quota.limit(),
            _ => requests.unwrap_or(self.default_requests()) as u64,
        }
    }

    /// Generates the trace for `quota` from `seed`; `requests` overrides the default size
    /// (ignored by the boundary trace). The same arguments always give the same trace.
    pub(crate) fn generate(self, quota: Quota, seed: u64, requests: Option<usize>) -> Trace {
        let n = requests.unwrap_or(self.default_requests());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // One independent stream per trace kind: changing one generator leaves the others.
        rng.set_stream(self as u64);
        let w = quota.period_micros() as f64;
        let l = quota.limit() as f64;
        let mut keys = 1;
        let requests = match self {
            TraceKind::PoissonBelow => poisson(&mut rng, n, w / (0.8 * l)),
            TraceKind::PoissonAbove => poisson(&mut rng, n, w / (1.5 * l)),
            TraceKind::Boundary => boundary(quota),
            TraceKind::Bursty => bursty(&mut rng, n, quota),
            TraceKind::HeavyTail => {
                let sources = (n / REQUESTS_PER_SOURCE).max(10);
                keys = u32::try_from(sources).unwrap_or(u32::MAX);
                heavy_tail(&mut rng, n, keys, quota)
            }
        };
        Trace { kind: self, quota, seed, requests, keys }
    }
}

/// A generated trace: requests in time order.
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    /// What generated it.
    pub(crate) kind: TraceKind,
    /// The quota it was generated for (rates are relative to its limit).
    pub(crate) quota: Quota,
    /// The seed it was generated from.
    pub(crate) seed: u64,
    /// The requests, sorted by time.
    pub(crate) requests: Vec<Request>,
    /// How many distinct keys (ids `0..keys`).
    pub(crate) keys: u32,
}

impl Trace {
    /// The absolute time (µs since the epoch) of offset 0: a multiple of the period.
    pub(crate) fn start(&self) -> u64 {
        let w = self.quota.period_micros();
        EPOCH_US.div_ceil(w) * w
    }

    /// How long the trace lasts, µs.
    pub(crate) fn duration(&self) -> u64 {
        self.requests.last().map_or(0, |r| r.at)
    }
}

/// A uniform double in `(0, 1]`.
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    1.0 - rng.random::<f64>()
}

/// An exponential variate with this mean.
fn exponential(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    -unit(rng).ln() * mean
}

/// `n` Poisson arrivals on key 0 with this mean gap (µs).
fn poisson(rng: &mut ChaCha8Rng, n: usize, mean_gap: f64) -> Vec<Request> {
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += exponential(rng, mean_gap);
            Request { at: t as u64, key: 0 }
        })
        .collect()
}

/// `count` requests evenly spread over `[from, to]` (all at `from` when `count` is 1).
fn spread(from: u64, to: u64, count: u64) -> impl Iterator<Item = u64> {
    let step = move |i: u64| if count <= 1 { 0 } else { (to - from) * i / (count - 1) };
    (0..count).map(move |i| from + step(i))
}

/// The seed article's example, generalised: at 3/min it is exactly "requests at 0.4, 0.7,
/// 0.8 and 1.4, 1.5, 1.6 minutes". For a limit `L`: one request at 0.4 W, `L - 1` spread
/// over [0.7 W, 0.8 W], `L` spread over [1.4 W, 1.6 W]. Then, after the key has been quiet
/// for more than a period, `L` requests in the last 1% of the window that ends at 3 W and
/// `L` in the first 1% of the next: the worst case of the fixed window, `2L` in 2% of a
/// period.
fn boundary(quota: Quota) -> Vec<Request> {
    let (l, w) = (quota.limit(), quota.period_micros());
    let at = |tenths: u64| w * tenths / 10;
    let edge = 3 * w;
    let margin = (w / 100).max(1);
    // `L` slots of `margin / L` before the edge: the last one is still before it.
    let before = (0..l).map(|i| edge - margin + margin * i / l);
    let after = (0..l).map(|i| edge + margin * i / l);
    std::iter::once(at(4))
        .chain(spread(at(7), at(8), l - 1))
        .chain(spread(at(14), at(16), l))
        .chain(before)
        .chain(after)
        .map(|at| Request { at, key: 0 })
        .collect()
}

/// On/off traffic on key 0: bursts of Poisson arrivals at `BURST_RATE` × the limit lasting
/// `BURST_ON` periods on average, separated by silences of `BURST_OFF` periods on average
/// (both exponential). The mean rate is about 0.83 × the limit, but a burst often holds
/// more than `L` requests.
fn bursty(rng: &mut ChaCha8Rng, n: usize, quota: Quota) -> Vec<Request> {
    let w = quota.period_micros() as f64;
    let gap = w / (BURST_RATE * quota.limit() as f64);
    let mut out = Vec::with_capacity(n);
    let mut t = 0.0;
    while out.len() < n {
        let end = t + exponential(rng, BURST_ON * w);
        loop {
            t += exponential(rng, gap);
            if t >= end || out.len() == n {
                break;
            }
            out.push(Request { at: t as u64, key: 0 });
        }
        t = end + exponential(rng, BURST_OFF * w);
    }
    out
}

/// `n` Poisson arrivals over `HEAVY_TAIL_PERIODS` periods, each from one of `sources` keys
/// drawn with probability ∝ `rank^-ZIPF_EXPONENT` (key id = rank - 1). With 20,000 sources
/// the hottest sends ~15% of all requests, about 50× the limit, and the ~35 hottest are
/// above the limit on average.
fn heavy_tail(rng: &mut ChaCha8Rng, n: usize, sources: u32, quota: Quota) -> Vec<Request> {
    let mut cdf: Vec<f64> = Vec::with_capacity(sources as usize);
    let mut sum = 0.0;
    for rank in 1..=sources {
        sum += f64::from(rank).powf(-ZIPF_EXPONENT);
        cdf.push(sum);
    }
    let gap = (HEAVY_TAIL_PERIODS * quota.period_micros()) as f64 / n as f64;
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += exponential(rng, gap);
            let u = rng.random::<f64>() * sum;
            let rank = cdf.partition_point(|&c| c <= u).min(cdf.len() - 1);
            Request { at: t as u64, key: rank as u32 }
        })
        .collect()
}

/// Where decisions come from: a store, fresh for each algorithm, driven at simulated time.
pub(crate) trait Decider {
    /// Decides one request of cost [`COST`] from `key` at `now` (µs since the epoch), and commits
    /// it when allowed.
    fn check(&mut self, key: u32, now: u64) -> Result<Decision, BoxError>;
}

/// The rule name used in every simulated check.
pub(crate) const RULE: &str = "simulate";

/// The checks of one rule for keys `0..keys`, built once.
pub(crate) fn checks(algorithm: Algorithm, quota: Quota, keys: u32) -> Vec<Check> {
    let rule = RuleName::new(RULE);
    (0..keys).map(|k| Check { rule, key: Key::from(u64::from(k)), algorithm, params: Params::new(quota) }).collect()
}

/// A fresh [`MemoryStore`], decided through `check_at` with the simulated time.
pub(crate) struct MemoryDecider {
    store: MemoryStore,
    checks: Vec<Check>,
}

impl MemoryDecider {
    /// A fresh in-process store for one algorithm.
    pub(crate) fn new(algorithm: Algorithm, quota: Quota, keys: u32) -> Self {
        Self { store: MemoryStore::new(), checks: checks(algorithm, quota, keys) }
    }
}

impl Decider for MemoryDecider {
    fn check(&mut self, key: u32, now: u64) -> Result<Decision, BoxError> {
        let check = self.checks.get(key as usize).ok_or("key outside the trace")?;
        Ok(self.store.check_one_at(check, now)?.decision)
    }
}

/// The figures of one algorithm on one trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    /// Requests in the trace.
    pub(crate) requests: u64,
    /// Requests accepted (forwarded, for the leaky bucket).
    pub(crate) accepted: u64,
    /// Accepted requests that made their trailing window hold more than `L` units.
    pub(crate) over_admitted: u64,
    /// Refused requests that the exact rule would have accepted.
    pub(crate) wrongly_refused: u64,
    /// The most units accepted in any `W`-long window of one key.
    pub(crate) worst_window: u64,
    /// Leaky bucket: the longest delay, µs.
    pub(crate) max_delay_us: u64,
    /// Leaky bucket: the sum of the delays, µs.
    pub(crate) total_delay_us: u64,
    /// Wrongly refused requests whose trailing window had room for exactly their cost: the
    /// closest calls.
    pub(crate) near_ties: u64,
    /// Keys that sent requests.
    pub(crate) sources: u64,
    /// Keys that sent more than `L` units in some `W`-long window.
    pub(crate) sources_above: u64,
    /// Requests sent by those keys.
    pub(crate) requests_from_above: u64,
    /// Keys that never sent more than `L` units in any `W`-long window, yet had a request
    /// refused (a source limited although it kept to the limit).
    pub(crate) sources_limited_within: u64,
    /// Keys that sent more than `L` units in some `W`-long window, yet had no request
    /// refused (a source over the limit that was never limited).
    pub(crate) sources_unlimited_above: u64,
}

impl Figures {
    /// `part` as a percentage of the requests.
    pub(crate) fn percent(&self, part: u64) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            100.0 * part as f64 / self.requests as f64
        }
    }
}

/// One algorithm replayed over one trace.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    /// The algorithm.
    pub(crate) algorithm: Algorithm,
    /// Its figures.
    pub(crate) figures: Figures,
    /// Whether each request of the trace was accepted, in trace order.
    pub(crate) allowed: Vec<bool>,
    /// When key 0's accepted requests were forwarded, µs since the start of the trace, up to
    /// the `record_until` given to [`replay`].
    pub(crate) key0_accepted: Vec<u64>,
}

/// The accepted units of one key inside the last period, with running totals so that the
/// units after any instant are found by binary search.
#[derive(Debug, Default)]
struct History {
    /// `(forwarding time, units accepted up to and including this entry)`, oldest first.
    entries: VecDeque<(u64, u64)>,
    /// Units accepted since the start.
    total: u64,
    /// The running total of the newest entry dropped.
    dropped: u64,
}

impl History {
    /// Drops the entries at or before `t`: they are outside every window judged from now on.
    fn forget_until(&mut self, t: u64) {
        while let Some(&(at, running)) = self.entries.front() {
            if at > t {
                break;
            }
            self.dropped = running;
            self.entries.pop_front();
        }
    }

    /// Units accepted with a forwarding time after `t`.
    fn after(&self, t: u64) -> u64 {
        let i = self.entries.partition_point(|&(at, _)| at <= t);
        let before = if i == 0 { self.dropped } else { self.entries[i - 1].1 };
        self.total - before
    }

    /// Records `units` forwarded at `at`, which must not be earlier than any recorded entry.
    fn record(&mut self, at: u64, units: u64) -> Result<(), BoxError> {
        if let Some(&(last, _)) = self.entries.back() {
            if at < last {
                return Err(format!("forwarding times went backwards: {at} µs after {last} µs").into());
            }
        }
        self.total += units;
        self.entries.push_back((at, self.total));
        Ok(())
    }
}

/// What the judge keeps per key.
#[derive(Debug, Default)]
struct Source {
    /// Accepted units.
    history: History,
    /// Arrival times of this key's requests in the last period.
    arrivals: VecDeque<u64>,
    /// The most units it sent in any `W`-long window.
    peak_demand: u64,
    /// Requests seen.
    requests: u64,
    /// Whether any of its requests was refused.
    refused: bool,
}

/// Replays `trace` through `decider` (a fresh store for `algorithm`) and judges every
/// decision. Records key 0's forwarding times before `record_until` (µs from the start)
/// for plots.
///
/// # Errors
///
/// A store error, or forwarding times of one key that go backwards (a leaky bucket that
/// reorders requests).
pub(crate) fn replay(
    trace: &Trace,
    algorithm: Algorithm,
    decider: &mut dyn Decider,
    record_until: u64,
) -> Result<Run, BoxError> {
    let (l, w) = (trace.quota.limit(), trace.quota.period_micros());
    let start = trace.start();
    let mut sources: Vec<Source> = (0..trace.keys).map(|_| Source::default()).collect();
    let mut figures = Figures { requests: trace.requests.len() as u64, ..Figures::default() };
    let mut allowed = Vec::with_capacity(trace.requests.len());
    let mut key0_accepted = Vec::new();
    for r in &trace.requests {
        let now = start + r.at;
        let d = decider.check(r.key, now)?;
        let src = sources.get_mut(r.key as usize).ok_or("key outside the trace")?;
        // Every window judged from here on starts after now - W.
        let window_start = now.saturating_sub(w);
        src.history.forget_until(window_start);
        while src.arrivals.front().is_some_and(|&t| t <= window_start) {
            src.arrivals.pop_front();
        }
        src.arrivals.push_back(now);
        src.peak_demand = src.peak_demand.max(src.arrivals.len() as u64 * COST);
        src.requests += 1;
        allowed.push(d.allowed);
        let h = &mut src.history;
        if d.allowed {
            let delay = u64::try_from(d.delay().as_micros()).unwrap_or(u64::MAX);
            let at = now.saturating_add(delay);
            h.record(at, COST)?;
            // Units forwarded in (at - W, at], this request included.
            let in_window = h.after(at.saturating_sub(w)) - h.after(at);
            figures.accepted += 1;
            figures.worst_window = figures.worst_window.max(in_window);
            if in_window > l {
                figures.over_admitted += 1;
            }
            figures.max_delay_us = figures.max_delay_us.max(delay);
            figures.total_delay_us += delay;
            if r.key == 0 && r.at < record_until {
                key0_accepted.push(at - start);
            }
        } else {
            src.refused = true;
            // Units in (now - W, now], plus any still waiting in a leaky bucket's queue.
            let in_window = h.after(window_start);
            if in_window + COST <= l {
                figures.wrongly_refused += 1;
                figures.near_ties += u64::from(in_window + COST == l);
            }
        }
    }
    for src in sources.iter().filter(|s| s.requests > 0) {
        figures.sources += 1;
        if src.peak_demand > l {
            figures.sources_above += 1;
            figures.requests_from_above += src.requests;
        }
        if src.refused && src.peak_demand <= l {
            figures.sources_limited_within += 1;
        }
        if !src.refused && src.peak_demand > l {
            figures.sources_unlimited_above += 1;
        }
    }
    Ok(Run { algorithm, figures, allowed, key0_accepted })
}

/// The number of units in the trailing window `(t - W, t]` as a step function of `t`, from
/// sorted forwarding times: `(t, count from t on)` at every change, starting at `(0, 0)`.
pub(crate) fn trailing_counts(accepted: &[u64], period: u64) -> Vec<(u64, u64)> {
    let mut out = vec![(0, 0)];
    let (mut enter, mut leave) = (0, 0);
    while enter < accepted.len() || leave < accepted.len() {
        let next_in = accepted.get(enter).copied().unwrap_or(u64::MAX);
        let next_out = accepted.get(leave).map_or(u64::MAX, |&t| t + period);
        let t = next_in.min(next_out);
        while accepted.get(enter) == Some(&t) {
            enter += 1;
        }
        while accepted.get(leave).is_some_and(|&a| a + period == t) {
            leave += 1;
        }
        out.push((t, (enter - leave) as u64));
    }
    out
}
