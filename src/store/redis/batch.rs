//! Group commit: single-rule checks that arrive while others are on their way go to Redis
//! together, as one script call that decides each of them on its own, in arrival order.
//!
//! - A request's check waits in the store's queue; a task of the store (never the
//!   request's future) takes at most half of the checks outstanding (waiting, or sent and
//!   not answered), up to `RedisStore::max_batch`, and sends them: with two batches out,
//!   the client reads one's answers while Redis runs the other. Batching comes from
//!   requests arriving together, never from holding one back. The task yields once before
//!   it takes the queue, so that the requests woken with the one that started it join it.
//! - Batches go out on one connection in the order they are taken, and each decides its
//!   checks in arrival order; a batch retried with `EVAL` after `NOSCRIPT` (a restart,
//!   `SCRIPT FLUSH`, a failover) goes after the batches sent meanwhile, as concurrent
//!   single calls would.
//! - A check whose caller left before its batch was taken is skipped: it takes nothing.
//!   After that it is decided like a dropped unbatched call (units taken, answer lost).
//! - Each decision in a batch is checked and committed on its own (`scripts/batch_main.lua`):
//!   one that fails (a key of another type, OOM) is that request's error only, and takes
//!   nothing; `READONLY` or `MASTERDOWN` (the server is a replica) fails the whole call,
//!   as a single check's would, so that the connection is dropped. One `TIME` serves the
//!   whole batch.
//! - A decision stays O(1) in a batch: one of the sliding window log that would read past
//!   the head of its log (a long expired prefix, the k-th unit of a rejection past the
//!   head) is neither decided nor written there, nor is any later one on its key; they go
//!   on their own afterwards, one call each, in arrival order. A batch's work is so
//!   bounded by its length, whatever its logs hold.
//! - Batches are per algorithm (one script each) and, on a cluster, per slot: every key a
//!   script touches is declared in `KEYS`, all in one slot.
//! - The caller's deadline and the limiter's in-flight cap cover the time in the queue;
//!   the batch itself is bounded by the response timeout.
//! - Each runtime that has checks waiting has one flush task on its way, which takes only
//!   that runtime's checks (a store shared by several runtimes: one idle or blocked never
//!   holds up another's checks, before or after they are sent). Tasks are spawned and entries
//!   dropped with the queue's lock released (a runtime shutting down drops a new task on
//!   the spot, and its guard takes the lock). Checks made outside a tokio runtime are not
//!   batched.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::join_all;
use tokio::runtime::Id as RuntimeId;
use tokio::sync::oneshot;

use super::call::Inner;
use super::script::{batch_cmd, index, parse_batch, validate, Batched, MODE_CHECK, SCRIPTS};
use crate::error::StoreError;
use crate::store::{Check, Outcome};

/// The default of `RedisStore::max_batch`.
pub(super) const MAX_BATCH: usize = 64;

type Answer = Result<Outcome, StoreError>;

/// Checks waiting for a batch.
#[derive(Default)]
pub(super) struct Queue {
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    /// In arrival order.
    entries: VecDeque<Entry>,
    /// The runtimes that have a flush task on its way to take the queue.
    flushing: Vec<RuntimeId>,
    /// Checks sent in batches whose answers are not back.
    sent: usize,
}

struct Entry {
    check: Check,
    slot: Option<u16>,
    /// The runtime that queued it: only its flush tasks take it.
    rt: RuntimeId,
    answer: oneshot::Sender<Answer>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The runtime `check` is batched on: `None` when it is sent on its own (batching off,
    /// a check no batch script decides, or no tokio runtime to spawn the flush task on).
    pub(super) fn runtime_for(inner: &Inner, check: &Check) -> Option<RuntimeId> {
        if inner.config.max_batch > 1 && SCRIPTS.batch_for(check).is_some() {
            tokio::runtime::Handle::try_current().ok().map(|h| h.id())
        } else {
            None
        }
    }

    /// Decides `check` on `inner` in the next batch taken by a flush task of runtime `rt`.
    pub(super) async fn check(self: &Arc<Self>, inner: &Arc<Inner>, check: &Check, rt: RuntimeId) -> Answer {
        validate(check)?;
        let (tx, rx) = oneshot::channel();
        let entry = Entry { check: check.clone(), slot: inner.slot_of(&check.key), rt, answer: tx };
        let start = {
            let mut waiting = self.lock();
            waiting.entries.push_back(entry);
            let pending = waiting.flushing.contains(&rt);
            if !pending {
                waiting.flushing.push(rt);
            }
            !pending
        };
        // Spawned with the lock released (see the module docs).
        if start {
            start_flush(inner, self, rt);
        }
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(format!(
                "redis at {}: the batch of this check was dropped (its runtime shut down)",
                inner.config.addr
            )))
        })
    }
}

/// Takes the runtime of a flush task dropped before it took the queue (its runtime shut
/// down) off the queue's list, so that its next check starts another, and answers that
/// runtime's waiting checks with an error rather than leaving them to their deadlines.
struct Flushing(Option<Arc<Queue>>, RuntimeId);

impl Drop for Flushing {
    fn drop(&mut self) {
        if let Some(queue) = self.0.take() {
            let rt = self.1;
            let mut waiting = queue.lock();
            waiting.flushing.retain(|&r| r != rt);
            let (_mine, others): (VecDeque<Entry>, VecDeque<Entry>) =
                std::mem::take(&mut waiting.entries).into_iter().partition(|e| e.rt == rt);
            waiting.entries = others;
            // `_mine` is answered (dropped) with the lock released.
            drop(waiting);
        }
    }
}

/// Spawns a flush task on runtime `rt`, the current one (boxed: a flush that leaves checks
/// waiting starts the next).
fn start_flush(inner: &Arc<Inner>, queue: &Arc<Queue>, rt: RuntimeId) {
    let task: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
        Box::pin(flush(inner.clone(), Flushing(Some(queue.clone()), rt)));
    tokio::spawn(task);
}

/// Takes a batch of this runtime's waiting checks (its next task takes the rest) and sends it.
async fn flush(inner: Arc<Inner>, mut flushing: Flushing) {
    tokio::task::yield_now().await;
    let Some(queue) = flushing.0.clone() else { return };
    let (taken, left, more) = {
        let mut waiting = queue.lock();
        // At most half of the checks outstanding (see the module docs): one batch of all 64
        // in flight ran at 0.58× the throughput of batches of 32, each side idle in turn.
        let rt = flushing.1;
        let n = (waiting.entries.len() + waiting.sent).div_ceil(2).clamp(1, inner.config.max_batch);
        // This runtime's first `n` checks, in arrival order, from the front; a caller that
        // left before its batch was taken takes nothing (dropped below, with the lock
        // released); another runtime's checks stay for its own flush task.
        let mut taken = Vec::with_capacity(n);
        let mut left = Vec::new();
        let mut others = Vec::new();
        while taken.len() < n {
            let Some(e) = waiting.entries.pop_front() else { break };
            if e.answer.is_closed() {
                left.push(e);
            } else if e.rt == rt {
                taken.push(e);
            } else {
                others.push(e);
            }
        }
        for e in others.into_iter().rev() {
            waiting.entries.push_front(e);
        }
        waiting.sent += taken.len();
        // The rest of this runtime's checks is taken by its next task, which keeps it on
        // the list.
        let more = waiting.entries.iter().any(|e| e.rt == rt);
        if !more {
            waiting.flushing.retain(|&r| r != rt);
        }
        flushing.0 = None;
        (taken, left, more)
    };
    drop(left);
    // Spawned with the lock released (see `Queue::check`).
    if more {
        start_flush(&inner, &queue, flushing.1);
    }
    let _sent = Sent(&queue, taken.len());
    send(&inner, taken).await;
}

/// Takes its checks off the queue's `sent` count when their batch is answered, or dropped.
struct Sent<'a>(&'a Queue, usize);

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        self.0.lock().sent -= self.1;
    }
}

/// Sends `entries` as one script call per (algorithm, slot), all at once, and answers each
/// entry as soon as its call is back.
async fn send(inner: &Inner, mut entries: Vec<Entry>) {
    // Stable: arrival order is kept within a group.
    entries.sort_by_key(|e| (index(e.check.algorithm), e.slot));
    let mut groups: Vec<Vec<Entry>> = Vec::new();
    for e in entries {
        match groups.last_mut() {
            Some(g) if g[0].check.algorithm == e.check.algorithm && g[0].slot == e.slot => g.push(e),
            _ => groups.push(vec![e]),
        }
    }
    join_all(groups.into_iter().map(|g| send_group(inner, g))).await;
}

/// One batch script call for `group` (one algorithm, one slot), and its answers.
async fn send_group(inner: &Inner, group: Vec<Entry>) {
    let checks: Vec<&Check> = group.iter().map(|e| &e.check).collect();
    let slot = group[0].slot;
    let result = async {
        let script = SCRIPTS.batch_for(checks[0]).ok_or_else(|| StoreError::Backend("no batch script".into()))?;
        let names = &inner.config.names;
        let reply =
            inner.eval_cmd(script, slot, |verb, script, now| batch_cmd(verb, script, names, &checks, now)).await?;
        parse_batch(&reply, &checks)
    }
    .await;
    drop(checks);
    match result {
        Ok(answers) => {
            let mut alone = Vec::new();
            for (e, a) in group.into_iter().zip(answers) {
                match a {
                    Batched::Decided(a) => {
                        let _ = e.answer.send(a);
                    }
                    Batched::Alone => alone.push(e),
                }
            }
            // One call each, in arrival order (a key's later decisions went alone with it).
            for e in alone {
                let a = inner.run_one(&e.check, MODE_CHECK, "no outcome for a check sent on its own").await;
                let _ = e.answer.send(a);
            }
        }
        Err(err) => {
            for e in group {
                let _ = e.answer.send(Err(err.clone()));
            }
        }
    }
}
