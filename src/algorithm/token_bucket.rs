//! Token bucket: capacity `B`, refilled continuously at `L` tokens per `W`, decided as its
//! GCRA twin — one word of state, the time at which the bucket is full again.
//!
//! A bucket holding `level` tokens (in µs of refill, `tokens × T`) at `now` is the TAT
//! `now + (B·T - level)`: refill is time passing, a take moves the TAT forward by `c·T`, a
//! debt (a charge past empty) is a TAT beyond `now + B·T`. So the decisions, charges and
//! refunds are [`Gcra`]'s, exactly. The one difference from the `(level, last)` bucket
//! it replaces is when the clock steps back behind the latest commit: that bucket kept
//! the level it had then, while the TAT counts the refill from the earlier `now` — the
//! twin admits less, never more, until the clock catches up. The state is its own type (and
//! its own key tag, `tb`), so a token bucket's state never mixes with a GCRA's.

use super::gcra::Gcra;
use super::Params;
use crate::decision::Decision;

/// The bucket as its GCRA twin: the time (µs since the epoch) at which it is full again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TokenBucket(pub Gcra);

impl TokenBucket {
    /// Decides without changing anything: [`Gcra::decide`].
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        self.0.decide(p, now)
    }

    /// Applies an accepted request or a charge: [`Gcra::commit`] (the TAT it left).
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        self.0.commit(p, now)
    }

    /// All or nothing, as [`Gcra::refund`].
    pub(crate) fn refund(&mut self, p: &Params, at: u64, now: u64) {
        self.0.refund(p, at, now);
    }

    /// When the bucket is full again.
    #[must_use]
    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        self.0.expires_at(p)
    }
}
