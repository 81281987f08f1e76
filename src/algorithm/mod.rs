//! The six algorithms, as pure functions of (state, quota, cost, now) with no I/O.
//!
//! Each algorithm has a state type whose `Default` is "never seen", and two functions:
//! `decide(&state, …) -> Decision` reads, and `commit(&mut state, …)` applies an accepted
//! request. They are separate so that a request checked against several rules changes
//! nothing unless every rule accepts it. Rejected requests change no state.
//!
//! All times are integer microseconds since the Unix epoch. The Redis scripts implement
//! the same accept rules and return the state they read, from which the same `decide`
//! computes the [`Decision`]: every store decides bit for bit alike.

use std::fmt;
use std::str::FromStr;

use crate::decision::Decision;
use crate::error::BuildError;
use crate::quota::Quota;

pub(crate) mod concurrency;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
pub(crate) mod sliding_window_counter;
pub(crate) mod sliding_window_log;
pub(crate) mod token_bucket;

/// Which algorithm a rule uses. See the README's "Algorithms" and `docs/accuracy.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Counter per aligned window. Cheapest; up to `2L` in a span straddling a boundary.
    FixedWindow,
    /// Timestamps of accepted units in the last period. Exact; memory grows with the limit.
    SlidingWindowLog,
    /// Two counters, the previous window weighted by its overlap. Close to exact, O(1).
    #[default]
    SlidingWindowCounter,
    /// Continuous refill of `limit` tokens per period into a bucket of `burst`.
    TokenBucket,
    /// Shaping: requests wait for their slot, one every `period / limit`.
    LeakyBucket,
    /// Generic cell rate algorithm: one timestamp per key; the token bucket's twin.
    Gcra,
    /// Not a rate: the permits a key holds at once, the state of a
    /// [`Rule::concurrent`](crate::Rule::concurrent) rule (which sets it). Giving it to
    /// a rate rule is a build error; it is not in [`Algorithm::ALL`].
    Concurrent,
}

impl Algorithm {
    /// Every rate algorithm, in declaration order ([`Algorithm::Concurrent`] is not one).
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The short name used in configuration and store keys (`fixed_window`, `gcra`, …).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::Concurrent => "concurrent",
        }
    }

    /// A short tag used inside store keys.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn tag(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindowLog => "swl",
            Algorithm::SlidingWindowCounter => "swc",
            Algorithm::TokenBucket => "tb",
            Algorithm::LeakyBucket => "lb",
            Algorithm::Gcra => "gcra",
            Algorithm::Concurrent => "conc",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = BuildError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace(['-', ' '], "_");
        Algorithm::ALL.into_iter().find(|a| a.name() == norm).ok_or_else(|| BuildError::UnknownAlgorithm(s.to_owned()))
    }
}

/// The parameters of one check: the quota, the cost, for the leaky bucket the longest a
/// request may be delayed, and the block a rejection starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The quota.
    pub quota: Quota,
    /// Units this request consumes. 0 is a probe: decided as whether the key is within
    /// its quota (not in debt from charges), and takes nothing — a charged rule's check
    /// when the request arrives (`Rule::charged`).
    pub cost: u64,
    /// Leaky bucket: the longest delay, in µs.
    pub max_delay_us: u64,
    /// GCRA and the token bucket: how far past the burst this check may reserve future
    /// emission slots, in µs — a quota slice's, which admits its units no earlier than
    /// their slots; 0 for a request's check (the algorithm as stated).
    pub ahead_us: u64,
    /// GCRA and the token bucket: a quota slice's first slot comes no earlier than this
    /// long after now, in µs, so that a server admitting slower than the rate still finds
    /// its slots ahead of its clock; 0 for a request's check.
    pub after_us: u64,
    /// How long a rejection blocks the key, in µs (0: no block; `Rule::block_for`).
    pub block_us: u64,
    /// Whether the key can be blocked by hand (`Limiter::block`, `Rule::blockable`): a
    /// remote store then reads the key's block on every check even when `block_us` is 0.
    pub blockable: bool,
    /// The check's role in its call: a shadow check (`Rule::shadow`) is decided and
    /// recorded but never refuses the call, and is committed only when it and every
    /// enforced check of the call accept.
    pub shadow: bool,
}

impl Params {
    /// Parameters with cost 1, the default 10 s max delay, nothing ahead and no block.
    #[must_use]
    pub const fn new(quota: Quota) -> Self {
        Self {
            quota,
            cost: 1,
            max_delay_us: 10_000_000,
            ahead_us: 0,
            after_us: 0,
            block_us: 0,
            blockable: false,
            shadow: false,
        }
    }

    /// Whether a check reads the key's block: the rule blocks on rejection, or may be
    /// blocked by hand.
    #[must_use]
    pub const fn reads_block(&self) -> bool {
        self.block_us > 0 || self.blockable
    }

    /// With this cost (0 is taken as 1).
    #[must_use]
    pub const fn cost(mut self, cost: u64) -> Self {
        self.cost = if cost == 0 { 1 } else { cost };
        self
    }
}

/// The decision of a rule that may block, from the algorithm's decision `d` and the key's
/// stored block (`blocked_until`, µs since the epoch, 0: none), with the block to store if
/// this decision starts one. Every store applies this one function, so they block alike.
///
/// A blocked key is refused outright (nothing taken, retry at the block's end); a
/// rejection during a block does not extend it. A rejection with a `retry_after` starts a
/// block of `block_us`; one of a cost the quota can never admit does not.
#[must_use]
pub(crate) fn blocking(d: Decision, blocked_until: u64, p: &Params, now: u64) -> (Decision, Option<u64>) {
    let limit = p.quota.limit();
    if blocked_until > now {
        return (Decision::blocked(limit, blocked_until - now, d.reset_after()).at(now), None);
    }
    if !d.allowed && d.retry_after().is_some() && p.block_us > 0 {
        let until = now.saturating_add(p.block_us);
        return (Decision::blocked(limit, p.block_us, d.reset_after()).at(now), Some(until));
    }
    (d, None)
}

/// The most units one check or charge counts (larger costs are taken as this): a cost
/// above 2^32, the largest limit and burst, is rejected by every algorithm anyway, and
/// the cap keeps `c·T` within what every store computes exactly.
pub(crate) const MAX_COST: u64 = 1 << 40;

/// How far a charge can put a key into debt: 2^46 µs (about 2.2 years) of the bucket
/// algorithms' and GCRA's time ahead of now, or 2^46 units in a window. Charges beyond it
/// take only what fits: every stored number stays exact (below 2^53) in every store.
pub(crate) const MAX_DEBT: u64 = 1 << 46;

/// The window of `now` (index `floor(now / period)`), or the stored one when it is the
/// next (the clock stepped back across its start: a step back across a boundary must not
/// wipe the counts). Only the next one: a stored window of another period (a tier) is not
/// comparable. The window algorithms' clock.
fn window_of(stored: u64, period: u64, now: u64) -> u64 {
    // `now` in the stored window, the common case: no division.
    if stored.checked_mul(period).is_some_and(|start| start <= now && now - start < period) {
        return stored;
    }
    let w = now / period;
    if stored == w + 1 {
        stored
    } else {
        w
    }
}

/// One algorithm's state as a type: `MemoryStore` keeps a table of each, so an entry is
/// as small as its own algorithm's state (a GCRA entry fits a cache line).
pub(crate) trait Kind: Default + Send + Sync + 'static {
    /// Decides without changing anything.
    fn decide(&self, p: &Params, now: u64) -> Decision;

    /// Applies an accepted request (call only after `decide` allowed it). Returns where
    /// its units went: the identity each state's `refund` needs to refund exactly them
    /// (each state type has its own: given back the units of that commit only).
    fn commit(&mut self, p: &Params, now: u64) -> u64;

    /// The time (µs since the epoch) from which this state is the same as "never seen":
    /// the store may forget it then (memory eviction, Redis TTL).
    fn expires_at(&self, p: &Params) -> u64;

    /// How many units a charge may still take: what keeps the debt within [`MAX_DEBT`].
    fn room(&self, p: &Params, now: u64) -> u64;

    /// Takes `cost` units whatever the decision (`Rule::charged`): the key may go into
    /// debt (windows count past the limit, the others push their time forward), and is
    /// refused until it is paid, with a `retry_after` that says when. At most
    /// [`MAX_COST`] units, and at most what keeps the debt within [`MAX_DEBT`].
    fn charge(&mut self, p: &Params, now: u64) {
        let cost = p.cost.min(MAX_COST).min(self.room(p, now));
        if cost > 0 {
            self.commit(&Params { cost, ..*p }, now);
        }
    }
}

/// `Kind` for an algorithm's state type, through its own methods, with its charge room.
macro_rules! kind {
    ($t:ty, |$s:ident, $p:ident, $now:ident| $room:expr) => {
        impl Kind for $t {
            fn decide(&self, p: &Params, now: u64) -> Decision {
                <$t>::decide(self, p, now).at(now)
            }
            fn commit(&mut self, p: &Params, now: u64) -> u64 {
                <$t>::commit(self, p, now)
            }
            fn expires_at(&self, p: &Params) -> u64 {
                <$t>::expires_at(self, p)
            }
            fn room(&self, $p: &Params, $now: u64) -> u64 {
                let $s = self;
                $room
            }
        }
    };
}

kind!(fixed_window::FixedWindow, |s, p, now| MAX_DEBT.saturating_sub(s.in_use(p, now)));
kind!(sliding_window_log::SlidingWindowLog, |s, p, now| MAX_DEBT.saturating_sub(s.in_use(p, now)));
kind!(sliding_window_counter::SlidingWindowCounter, |s, p, now| MAX_DEBT.saturating_sub(s.in_use(p, now)));
kind!(token_bucket::TokenBucket, |s, p, now| (now + MAX_DEBT).saturating_sub(s.0.tat.max(now))
    / p.quota.emission_interval_micros());
kind!(leaky_bucket::LeakyBucket, |s, p, now| (now + MAX_DEBT).saturating_sub(s.next.max(now))
    / p.quota.emission_interval_micros());
kind!(concurrency::Concurrency, |_s, _p, _now| 0);
kind!(gcra::Gcra, |s, p, now| (now + MAX_DEBT).saturating_sub(s.tat.max(now)) / p.quota.emission_interval_micros());

/// Runs `$body` with `$k` the state type of `$algorithm` (a type alias in each arm).
macro_rules! by_algorithm {
    ($algorithm:expr, $k:ident => $body:expr) => {
        match $algorithm {
            $crate::algorithm::Algorithm::FixedWindow => {
                type $k = $crate::algorithm::fixed_window::FixedWindow;
                $body
            }
            $crate::algorithm::Algorithm::SlidingWindowLog => {
                type $k = $crate::algorithm::sliding_window_log::SlidingWindowLog;
                $body
            }
            $crate::algorithm::Algorithm::SlidingWindowCounter => {
                type $k = $crate::algorithm::sliding_window_counter::SlidingWindowCounter;
                $body
            }
            $crate::algorithm::Algorithm::TokenBucket => {
                type $k = $crate::algorithm::token_bucket::TokenBucket;
                $body
            }
            $crate::algorithm::Algorithm::LeakyBucket => {
                type $k = $crate::algorithm::leaky_bucket::LeakyBucket;
                $body
            }
            $crate::algorithm::Algorithm::Gcra => {
                type $k = $crate::algorithm::gcra::Gcra;
                $body
            }
            $crate::algorithm::Algorithm::Concurrent => {
                type $k = $crate::algorithm::concurrency::Concurrency;
                $body
            }
        }
    };
}
pub(crate) use by_algorithm;

/// The state of one (rule, key) for any algorithm, as one value: the algorithms' tests
/// drive every algorithm through it.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow(fixed_window::FixedWindow),
    SlidingWindowLog(sliding_window_log::SlidingWindowLog),
    SlidingWindowCounter(sliding_window_counter::SlidingWindowCounter),
    TokenBucket(token_bucket::TokenBucket),
    LeakyBucket(leaky_bucket::LeakyBucket),
    Gcra(gcra::Gcra),
    Concurrent(concurrency::Concurrency),
}

/// `$body` with `$s` the state inside `$state`, as a `Kind`.
#[cfg(test)]
macro_rules! each {
    ($state:expr, $s:ident => $body:expr) => {
        match $state {
            State::FixedWindow($s) => $body,
            State::SlidingWindowLog($s) => $body,
            State::SlidingWindowCounter($s) => $body,
            State::TokenBucket($s) => $body,
            State::LeakyBucket($s) => $body,
            State::Gcra($s) => $body,
            State::Concurrent($s) => $body,
        }
    };
}

#[cfg(test)]
impl State {
    /// The "never seen" state of an algorithm.
    pub(crate) fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::FixedWindow => State::FixedWindow(Default::default()),
            Algorithm::SlidingWindowLog => State::SlidingWindowLog(Default::default()),
            Algorithm::SlidingWindowCounter => State::SlidingWindowCounter(Default::default()),
            Algorithm::TokenBucket => State::TokenBucket(Default::default()),
            Algorithm::LeakyBucket => State::LeakyBucket(Default::default()),
            Algorithm::Gcra => State::Gcra(Default::default()),
            Algorithm::Concurrent => State::Concurrent(Default::default()),
        }
    }

    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        each!(self, s => Kind::decide(s, p, now))
    }

    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        each!(self, s => Kind::commit(s, p, now))
    }

    pub(crate) fn charge(&mut self, p: &Params, now: u64) {
        each!(self, s => Kind::charge(s, p, now))
    }

    pub(crate) fn refund(&mut self, p: &Params, at: u64, now: u64) {
        each!(self, s => s.refund(p, at, now))
    }

    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        each!(self, s => Kind::expires_at(s, p))
    }
}

#[cfg(test)]
mod tests;
