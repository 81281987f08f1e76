//! Cluster slots whose calls fail: a node that stopped answering is noticed per slot, and
//! a few slots failing for long enough make the store read the cluster's slot map again
//! (redis-rs does not for a node that hangs). Times are ms since the link's start, plus
//! one (0: never).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// A cluster slot whose calls have failed for this long, with no success in between (a
/// master that died or hangs), makes the store read the slot map again.
const SLOT_STALE_AFTER: Duration = Duration::from_secs(1);
/// How recent a success of another slot must be for a slot's failure to count as its
/// node's ([`StoreError::NodeTimeout`](crate::StoreError::NodeTimeout),
/// [`StoreError::NodeUnavailable`](crate::StoreError::NodeUnavailable)).
const OTHERS_ANSWERED: Duration = Duration::from_secs(1);
/// How many slots failing at once, with no success since, make the store read the slot
/// map again even when none has failed twice.
const SPREAD_SLOTS: usize = 8;
/// A failing slot with no failure for this long starts afresh (a rarely used key's
/// failures minutes apart are no outage).
const SLOT_FORGET: Duration = Duration::from_secs(10);
/// At most one slot-map refresh per this long.
pub(super) const REFRESH_GAP: Duration = Duration::from_secs(1);

/// The failing slots of one cluster connection, and the last success.
#[derive(Default)]
pub(super) struct Slots {
    table: Mutex<SlotTable>,
    /// Whether `table` holds any slot: successes skip the lock while none fails.
    any_failing: AtomicBool,
    /// The last success: `now << 16 | slot`.
    last_ok: AtomicU64,
}

impl Slots {
    fn table(&self) -> MutexGuard<'_, SlotTable> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn on_ok(&self, slot: u16, now: u64) {
        let last = (now << 16) | u64::from(slot);
        // Stored only when it changed: most successes within a millisecond write nothing.
        if self.last_ok.load(Ordering::Relaxed) != last {
            self.last_ok.store(last, Ordering::Relaxed);
        }
        if self.any_failing.load(Ordering::Relaxed) {
            let mut table = self.table();
            table.slots.remove(&slot);
            self.any_failing.store(!table.slots.is_empty(), Ordering::Relaxed);
        }
    }

    /// Whether a call about another slot than `slot` succeeded within the last
    /// [`OTHERS_ANSWERED`] before `now`: then a failure of `slot` is its node's, not the
    /// cluster's.
    pub(super) fn others_answer(&self, slot: u16, now: u64) -> bool {
        let last = self.last_ok.load(Ordering::Relaxed);
        let (at, last_slot) = (last >> 16, last & 0xFFFF);
        at != 0 && last_slot != u64::from(slot) && now < at + millis(OTHERS_ANSWERED)
    }

    /// Of the slots of a call the caller's deadline cut (in order, repeats allowed), the one
    /// that did not answer, as far as is known: one failing with no success since, else one
    /// that is not the last slot to answer (on a multi-slot call, that is usually the healthy
    /// slot that did), else the first.
    pub(super) fn unanswered(&self, slots: &[u16]) -> Option<u16> {
        let first = *slots.first()?;
        if self.any_failing.load(Ordering::Relaxed) {
            let table = self.table();
            if let Some(&slot) = slots.iter().find(|s| table.slots.contains_key(s)) {
                return Some(slot);
            }
        }
        let last = self.last_ok.load(Ordering::Relaxed);
        let last_slot = (last != 0).then_some(last & 0xFFFF);
        Some(slots.iter().copied().find(|&s| Some(u64::from(s)) != last_slot).unwrap_or(first))
    }

    /// A call about `slot` failed at `now` (read by `now()` under the table's lock, so that
    /// no failure recorded here is later). Returns why the slot map should be read again:
    /// when a slot has failed twice with no success in between, over [`SLOT_STALE_AFTER`]
    /// or more; or when [`SPREAD_SLOTS`] slots or more are failing so, some of them for
    /// that long (keys spread over many slots each fail rarely). A slot that has not failed
    /// for [`SLOT_FORGET`] starts afresh.
    pub(super) fn on_failure(&self, slot: u16, now: impl FnOnce() -> u64) -> Option<String> {
        let stale = millis(SLOT_STALE_AFTER);
        let mut t = self.table();
        let now = now();
        self.any_failing.store(true, Ordering::Relaxed);
        if now.saturating_sub(t.swept) >= stale {
            t.slots.retain(|_, f| now.saturating_sub(f.last) <= millis(SLOT_FORGET));
            t.swept = now;
        }
        if t.slots.is_empty() {
            t.failing_since = now;
        }
        let f = t.slots.entry(slot).or_insert(SlotFailures { since: now, last: now, count: 0 });
        if now.saturating_sub(f.last) > millis(SLOT_FORGET) {
            *f = SlotFailures { since: now, last: now, count: 0 };
        }
        f.count += 1;
        f.last = now;
        let (count, failed_for) = (f.count, now.saturating_sub(f.since));
        if count >= 2 && failed_for >= stale {
            Some(format!("calls for cluster slot {slot} have failed for {failed_for} ms"))
        } else if t.slots.len() >= SPREAD_SLOTS && now.saturating_sub(t.failing_since) >= stale {
            Some(format!("calls for {} cluster slots have failed with no success since", t.slots.len()))
        } else {
            None
        }
    }

    /// A new slot map is in use: every slot starts afresh.
    pub(super) fn clear(&self) {
        self.table().slots.clear();
        self.any_failing.store(false, Ordering::Relaxed);
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The cluster slots whose calls fail with no success since.
#[derive(Default)]
struct SlotTable {
    slots: HashMap<u16, SlotFailures>,
    /// Since when the table has held a failing slot.
    failing_since: u64,
    swept: u64,
}

/// A slot's run of failures: since when, the latest, how many.
struct SlotFailures {
    since: u64,
    last: u64,
    count: u32,
}
