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
//! - Multi-checks (the rules of one input: a rate rule and a concurrency rule on one key,
//!   an account's per-minute and per-day limits) go through the same queue, in batches of
//!   their own (`scripts/multi_batch.lua`, any algorithms), each decided all or nothing as
//!   one call of the multi-rule script would, with everything above: skipped when its
//!   caller left before its batch was taken, an error of its own, `READONLY` failing the
//!   call, one `TIME`, and the log's bound (a multi-check that would read past the head of
//!   a log goes on its own after its batch, and so does every later one sharing a key with
//!   it). Batched are multi-checks whose keys share a slot and whose rules read no block;
//!   the others keep their own call (across slots: `cluster.rs`). A batch whose rules are
//!   all straight-line (a cost, no shadow rule) runs the algorithms' own `decide`
//!   functions (`scripts/multi_single_main.lua`, about half the generic code's work in
//!   Redis); one with a shadow rule or a probe runs the generic code. A slot's multi-checks
//!   go in one call whichever script, so that they keep their arrival order; single-rule
//!   checks go in other calls of the same batch, so a single-rule check and a multi-check
//!   on one state taken together are decided in an order of the batch's making, as two
//!   concurrent calls would be.
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
use super::script::{
    batch_cmd, index, multi_batch_cmd, multi_batchable, multi_straight, parse_batch, parse_multi_batch, validate,
    Batched, MODE_CHECK, SCRIPTS,
};
use crate::error::StoreError;
use crate::store::{Check, Outcome};

/// The default of `RedisStore::max_batch`.
pub(super) const MAX_BATCH: usize = 64;

type Answer = Result<Outcome, StoreError>;
/// A multi-check's answer, as `Store::check`'s.
type Answers = Result<Vec<Option<Outcome>>, StoreError>;

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
    job: Job,
    slot: Option<u16>,
    /// The runtime that queued it: only its flush tasks take it.
    rt: RuntimeId,
}

/// What an entry asks, and where its answer goes.
enum Job {
    /// A single-rule check.
    One(Check, oneshot::Sender<Answer>),
    /// A multi-check: all or nothing.
    Many(Box<[Check]>, oneshot::Sender<Answers>),
}

impl Entry {
    /// Whether its caller left.
    fn left(&self) -> bool {
        match &self.job {
            Job::One(_, tx) => tx.is_closed(),
            Job::Many(_, tx) => tx.is_closed(),
        }
    }

    /// Its batch script: the algorithm's (`0..7`), or the multi-check one.
    fn script(&self) -> usize {
        match &self.job {
            Job::One(c, _) => index(c.algorithm),
            Job::Many(..) => MULTI,
        }
    }
}

/// [`Entry::script`] of a multi-check (of either multi-check batch script: a slot's
/// multi-checks go in one call, so that they are decided in arrival order).
const MULTI: usize = usize::MAX;

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

    /// The runtime the multi-check `checks` is batched on: `None` when it is sent on its
    /// own (batching off, a multi-check the batch script does not decide, keys in several
    /// slots, or no tokio runtime).
    pub(super) fn runtime_for_many(inner: &Inner, checks: &[Check]) -> Option<RuntimeId> {
        let one_slot = || {
            let slot = inner.slot_of(&checks[0].key);
            checks[1..].iter().all(|c| inner.slot_of(&c.key) == slot)
        };
        if inner.config.max_batch > 1 && multi_batchable(checks) && one_slot() {
            tokio::runtime::Handle::try_current().ok().map(|h| h.id())
        } else {
            None
        }
    }

    /// Decides `check` on `inner` in the next batch taken by a flush task of runtime `rt`.
    pub(super) async fn check(self: &Arc<Self>, inner: &Arc<Inner>, check: &Check, rt: RuntimeId) -> Answer {
        validate(check)?;
        let (tx, rx) = oneshot::channel();
        self.enqueue(inner, Entry { job: Job::One(check.clone(), tx), slot: inner.slot_of(&check.key), rt });
        rx.await.unwrap_or_else(|_| Err(dropped(inner)))
    }

    /// Decides the multi-check `checks` (all in one slot, see [`Queue::runtime_for_many`])
    /// on `inner` in the next batch taken by a flush task of runtime `rt`, all or nothing.
    pub(super) async fn check_many(self: &Arc<Self>, inner: &Arc<Inner>, checks: &[Check], rt: RuntimeId) -> Answers {
        crate::store::distinct(checks)?;
        checks.iter().try_for_each(validate)?;
        let (tx, rx) = oneshot::channel();
        let slot = inner.slot_of(&checks[0].key);
        self.enqueue(inner, Entry { job: Job::Many(checks.into(), tx), slot, rt });
        rx.await.unwrap_or_else(|_| Err(dropped(inner)))
    }

    /// Queues `entry`, and starts its runtime's flush task if none is on its way.
    fn enqueue(self: &Arc<Self>, inner: &Arc<Inner>, entry: Entry) {
        let rt = entry.rt;
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
    }
}

/// The answer of a check whose batch was dropped.
fn dropped(inner: &Inner) -> StoreError {
    StoreError::Unavailable(format!(
        "redis at {}: the batch of this check was dropped (its runtime shut down)",
        inner.config.addr
    ))
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
            if e.left() {
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

/// Sends `entries` as one script call per (algorithm, slot), and one per slot for the
/// multi-checks, all at once, and answers each entry as soon as its call is back.
async fn send(inner: &Inner, mut entries: Vec<Entry>) {
    // Stable: arrival order is kept within a group.
    entries.sort_by_key(|e| (e.script(), e.slot));
    let mut groups: Vec<Vec<Entry>> = Vec::new();
    for e in entries {
        match groups.last_mut() {
            Some(g) if g[0].script() == e.script() && g[0].slot == e.slot => g.push(e),
            _ => groups.push(vec![e]),
        }
    }
    join_all(groups.into_iter().map(|g| async move {
        if g[0].script() == MULTI {
            send_many(inner, g).await;
        } else {
            send_group(inner, g).await;
        }
    }))
    .await;
}

/// One batch script call for `group` (one algorithm, one slot), and its answers.
async fn send_group(inner: &Inner, group: Vec<Entry>) {
    let slot = group[0].slot;
    let (owned, answers): (Vec<Check>, Vec<oneshot::Sender<Answer>>) = group
        .into_iter()
        .map(|e| match e.job {
            Job::One(c, tx) => (c, tx),
            Job::Many(..) => unreachable!("a multi-check in a single-rule batch"),
        })
        .unzip();
    let checks: Vec<&Check> = owned.iter().collect();
    let result = async {
        let script = SCRIPTS.batch_for(checks[0]).ok_or_else(|| StoreError::Backend("no batch script".into()))?;
        let names = &inner.config.names;
        let reply =
            inner.eval_cmd(script, slot, |verb, script, now| batch_cmd(verb, script, names, &checks, now)).await?;
        parse_batch(&reply, &checks)
    }
    .await;
    match result {
        Ok(decided) => {
            let mut alone = Vec::new();
            for ((c, tx), a) in checks.into_iter().zip(answers).zip(decided) {
                match a {
                    Batched::Decided(a) => {
                        let _ = tx.send(a);
                    }
                    Batched::Alone => alone.push((c, tx)),
                }
            }
            // One call each, in arrival order (a key's later decisions went alone with it).
            for (c, tx) in alone {
                let a = inner.run_one(c, MODE_CHECK, "no outcome for a check sent on its own").await;
                let _ = tx.send(a);
            }
        }
        Err(err) => {
            for tx in answers {
                let _ = tx.send(Err(err.clone()));
            }
        }
    }
}

/// One multi-check batch script call for `group` (multi-checks of one slot), and its
/// answers: the straight-line script when every rule of every multi-check is straight-line
/// (at about half the generic one's work in Redis), else the generic one.
async fn send_many(inner: &Inner, group: Vec<Entry>) {
    let slot = group[0].slot;
    let (lists, answers): (Vec<Box<[Check]>>, Vec<oneshot::Sender<Answers>>) = group
        .into_iter()
        .map(|e| match e.job {
            Job::Many(c, tx) => (c, tx),
            Job::One(..) => unreachable!("a single-rule check in a multi-check batch"),
        })
        .unzip();
    let refs: Vec<&[Check]> = lists.iter().map(|l| &**l).collect();
    let script = if refs.iter().all(|l| multi_straight(l)) { &SCRIPTS.multi_single } else { &SCRIPTS.multi_batch };
    let result = async {
        let names = &inner.config.names;
        let reply =
            inner.eval_cmd(script, slot, |verb, script, now| multi_batch_cmd(verb, script, names, &refs, now)).await?;
        parse_multi_batch(&reply, &refs)
    }
    .await;
    match result {
        Ok(decided) => {
            let mut alone = Vec::new();
            for ((list, tx), a) in refs.iter().zip(answers).zip(decided) {
                match a {
                    Batched::Decided(a) => {
                        let _ = tx.send(a.map(|o| o.into_vec()));
                    }
                    Batched::Alone => alone.push((list, tx)),
                }
            }
            // One call each, in arrival order (the multi-checks sharing a key with one
            // that went alone went alone with it).
            for (list, tx) in alone {
                let checks: Vec<&Check> = list.iter().collect();
                let a = inner.run_check(&checks, MODE_CHECK).await.map(|r| r.outcomes.into_vec());
                let _ = tx.send(a);
            }
        }
        Err(err) => {
            for tx in answers {
                let _ = tx.send(Err(err.clone()));
            }
        }
    }
}
