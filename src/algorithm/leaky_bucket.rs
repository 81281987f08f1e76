//! Leaky bucket as a shaper (nginx `limit_req` with `burst`, without `nodelay`).
//!
//! Requests leave at a constant rate, one every `T = ceil(W / L)`. An accepted request of
//! cost `c` takes the next free slot `max(now, next)` and the `c - 1` slots after it; the
//! middleware waits until its slot (`Decision::delay`) before forwarding. `B` counts the
//! requests that may wait besides the one leaving now: a request is rejected when its
//! last unit would wait more than `B·T`, or when its own delay would exceed `max_delay`.
//! A cost above `B + 1` is never accepted.

use std::time::Duration;

use super::Params;
use crate::decision::Decision;

/// The next free slot, µs since the epoch (0: never seen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeakyBucket {
    /// Next free slot.
    pub next: u64,
}

impl LeakyBucket {
    /// Decides without changing anything.
    #[must_use]
    pub(crate) fn decide(&self, p: &Params, now: u64) -> Decision {
        let (l, b, t, c) = (p.quota.limit(), p.quota.burst_size(), p.quota.emission_interval_micros(), p.cost);
        let slot = self.next.max(now);
        let delay = slot - now;
        // The queue holds B waiting requests plus the one leaving: (B + 1)·T of slots.
        let room = (b + 1) * t;
        if c <= b + 1 && delay + c.saturating_sub(1) * t <= b * t && delay <= p.max_delay_us {
            let queued = delay + c * t;
            let free = room.saturating_sub(queued);
            let mut d = Decision::allow_units(l, free, t, queued);
            // A probe (cost 0: a charged rule's admission) takes no slot: nothing to wait for.
            if c > 0 {
                d.set_delay(Duration::from_micros(delay));
            }
            return d;
        }
        let retry = (c <= b + 1).then(|| {
            // Earliest t' with next - t' + (c-1)·T <= B·T and next - t' <= max_delay.
            let by_queue = (slot + c.saturating_sub(1) * t).saturating_sub(b * t);
            let by_delay = slot.saturating_sub(p.max_delay_us);
            by_queue.max(by_delay).saturating_sub(now)
        });
        Decision::reject_units(l, room.saturating_sub(delay), t, delay, retry)
    }

    /// Applies an accepted request; returns its first slot, `max(next, now)`.
    pub(crate) fn commit(&mut self, p: &Params, now: u64) -> u64 {
        let slot = self.next.max(now);
        self.next = slot + p.cost * p.quota.emission_interval_micros();
        slot
    }

    /// Gives back the slots of a commit whose first slot was `at` — only while they are
    /// the last ones taken (a later request holds the slots after them, and must keep
    /// its own), and only those not yet reached.
    pub(crate) fn refund(&mut self, p: &Params, at: u64, now: u64) {
        if self.next == at + p.cost * p.quota.emission_interval_micros() {
            self.next = at.max(now);
        }
    }

    /// When the queue is empty.
    #[must_use]
    pub(crate) fn expires_at(&self, _p: &Params) -> u64 {
        self.next
    }
}
