//! Checks whose rules sit in several Redis Cluster slots: one script call per slot, all at
//! once, in a task of the store's own, and a rollback of the slots that accepted when
//! another rejected (or failed).
//!
//! - The task owns the calls: when the caller's future is dropped (its deadline passed,
//!   the client left), the calls still end and the rollback still runs — and when every
//!   slot accepts only after the caller has gone, their units are refunded too: the
//!   caller never learned it was admitted. The caller gets its answer once the rollback
//!   of the slots that answered is done, so that its next request finds the units back.
//! - A rejection does not wait long for slots still out: 5 ms after it, it is answered
//!   without them, as a hung node would otherwise hold the answer past the caller's
//!   deadline and turn the rejection into a store error (a fail-open pass by default).
//!   What a late slot takes is refunded when it answers.
//! - A rollback refunds exactly what each slot's commit took (its `Taken`), never
//!   units of requests decided in between.
//! - If any slot rejected, the request is rejected, whatever another slot's error: the
//!   rules of a failed slot are reported undecided (`None`). An error is returned only
//!   when no answer rejects.
//! - A slot that holds only shadow checks (`Params::shadow`) never rejects, and its error
//!   fails nothing: its checks are reported undecided. Once every slot holding an enforced
//!   check has answered, the shadow-only slots still out have 20 ms more (a healthy node
//!   answers long before), then finish on their own (their checks reported undecided), so
//!   that a stalled node holding only a shadow rule's key does not fail the request. What a shadow-only slot took
//!   is kept when every other slot accepts, and rolled back otherwise.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::call::Inner;
use super::script::{Reply, MODE_CHECK};
use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Check, Outcome, Refund};

/// How long the slots still out have once one rejected (see the module docs): enough for
/// healthy nodes, well inside the default 50 ms deadline.
const LATE_SLOT_GRACE: Duration = Duration::from_millis(5);

/// How long the shadow-only slots still out have once every slot with an enforced check
/// has answered: a healthy node's answer (sent at the same time) is in long before; a
/// stalled one's is not waited for, well inside the default 50 ms deadline.
const SHADOW_SLOT_GRACE: Duration = Duration::from_millis(20);

/// What a multi-slot check answers when its grace ends.
#[derive(Clone, Copy)]
enum Then {
    /// A slot rejected: the rejection, without the slots still out.
    Reject,
    /// Every enforced slot answered: their answer, without the shadow-only slots still out.
    Answer,
}

impl Inner {
    /// Decides `checks`: in one script call when they share a slot (or the server is
    /// standalone), else per slot with [`check_slots`].
    pub(super) async fn check(self: &Arc<Self>, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        crate::store::distinct(checks)?;
        let groups = self.groups(checks.iter().map(|c| &c.key));
        if let [_] = groups.as_slice() {
            let all: Vec<&Check> = checks.iter().collect();
            return Ok(self.run_check(&all, MODE_CHECK).await?.outcomes.into_vec());
        }
        check_slots(self.clone(), checks, groups).await
    }

    /// Runs `call` on each slot's group of `items` (one group on a standalone server), all
    /// at once, each group on its own (refunds and charges have nothing to roll back): the
    /// first error once every group has answered.
    pub(super) async fn per_slot<'a, T, Fut>(
        &self,
        items: &[&'a T],
        key: impl Fn(&T) -> &Key,
        call: impl Fn(Vec<&'a T>) -> Fut,
    ) -> Result<(), StoreError>
    where
        Fut: std::future::Future<Output = Result<(), StoreError>>,
    {
        let groups = self.groups(items.iter().map(|t| key(t)));
        let calls = groups.iter().map(|g| call(g.iter().map(|&i| items[i]).collect()));
        join_all(calls).await.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }

    /// Indexes of the checks (by their keys) grouped so that each group is one script
    /// call: everything at once on a standalone server, one group per slot on a cluster.
    fn groups<'k>(&self, keys: impl Iterator<Item = &'k Key>) -> Vec<Vec<usize>> {
        let mut groups: Vec<(Option<u16>, Vec<usize>)> = Vec::new();
        for (i, key) in keys.enumerate() {
            let slot = self.slot_of(key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }
}

/// Decides `checks`, spread over the slots `groups`, in a task of its own (see the module
/// docs).
async fn check_slots(
    inner: Arc<Inner>,
    checks: &[Check],
    groups: Vec<Vec<usize>>,
) -> Result<Vec<Option<Outcome>>, StoreError> {
    let checks: Arc<[Check]> = checks.into();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut calls: FuturesUnordered<_> = groups
            .iter()
            .enumerate()
            .map(|(slot, g)| {
                let group: Vec<&Check> = g.iter().map(|&i| &checks[i]).collect();
                let inner = &inner;
                async move { (slot, inner.run_check(&group, MODE_CHECK).await) }
            })
            .collect();
        let mut replies: Vec<Option<Result<Reply, StoreError>>> = groups.iter().map(|_| None).collect();
        let mut rolled_back = vec![false; groups.len()];
        let mut tx = Some(tx);
        // What the caller is answered when the timer fires: a rejection without the slots
        // still out, or the enforced slots' answer without the shadow-only ones.
        let mut grace: Option<(Pin<Box<tokio::time::Sleep>>, Then)> = None;
        // Whether the caller was answered that every slot accepted: what the shadow-only
        // slots still out take is then kept.
        let mut kept = false;
        loop {
            let next = match grace.as_mut() {
                Some((sleep, then)) if tx.is_some() => {
                    let then = *then;
                    tokio::select! {
                        next = calls.next() => next,
                        () = sleep.as_mut() => {
                            if let Some(tx) = tx.take() {
                                match then {
                                    // The slots still out are late: the rejection goes without them.
                                    Then::Reject => drop(tx.send(combine(&checks, &groups, &replies, false))),
                                    Then::Answer => {
                                        kept = answer(&inner, tx, &checks, &groups, &replies, &mut rolled_back).await;
                                    }
                                }
                            }
                            continue;
                        }
                    }
                }
                _ => calls.next().await,
            };
            let Some((slot, reply)) = next else { break };
            replies[slot] = Some(reply);
            if replies.iter().flatten().any(|r| matches!(r, Ok(reply) if !reply.all)) {
                // A slot rejected: the request is rejected. Refund what the slots that
                // accepted took.
                roll_back(&inner, &checks, &groups, &replies, &mut rolled_back).await;
                grace.get_or_insert_with(|| (Box::pin(tokio::time::sleep(LATE_SLOT_GRACE)), Then::Reject));
                continue;
            }
            // Every slot with an enforced check has answered: the shadow-only slots still
            // out have a moment more, then finish on their own (a stalled node holding only
            // a shadow rule's key would else fail the request).
            let enforced_answered = groups.iter().zip(&replies).all(|(g, r)| r.is_some() || shadow_only(&checks, g));
            if enforced_answered && tx.is_some() && grace.is_none() {
                grace = Some((Box::pin(tokio::time::sleep(SHADOW_SLOT_GRACE)), Then::Answer));
            }
        }
        if let Some(tx) = tx {
            kept = answer(&inner, tx, &checks, &groups, &replies, &mut rolled_back).await;
        }
        if !kept {
            // The shadow-only slots that answered after the caller heard of a rejection or
            // an error (or after the caller left): nobody uses what they took.
            roll_back(&inner, &checks, &groups, &replies, &mut rolled_back).await;
        }
    });
    rx.await.unwrap_or_else(|_| Err(StoreError::Unavailable("the multi-slot check task ended early".into())))
}

/// Answers the caller once every slot with an enforced check has answered and none
/// rejected: whether what the slots took is kept (every one accepted, the caller still
/// there); else it is given back first (or, the caller gone, after).
async fn answer(
    inner: &Inner,
    tx: tokio::sync::oneshot::Sender<Result<Vec<Option<Outcome>>, StoreError>>,
    checks: &[Check],
    groups: &[Vec<usize>],
    replies: &[Option<Result<Reply, StoreError>>],
    rolled_back: &mut [bool],
) -> bool {
    let everyone =
        groups.iter().zip(replies).all(|(g, r)| shadow_only(checks, g) || matches!(r, Some(Ok(reply)) if reply.all));
    if !everyone {
        roll_back(inner, checks, groups, replies, rolled_back).await;
    }
    // Answered once the units are back; a caller gone by then admitted nothing.
    let heard = tx.send(combine(checks, groups, replies, everyone)).is_ok();
    if everyone && !heard {
        roll_back(inner, checks, groups, replies, rolled_back).await;
    }
    everyone && heard
}

/// Gives back, by each commit's identity, what the slots that accepted took, once per
/// slot.
async fn roll_back(
    inner: &Inner,
    checks: &[Check],
    groups: &[Vec<usize>],
    replies: &[Option<Result<Reply, StoreError>>],
    rolled_back: &mut [bool],
) {
    let mut rollbacks: Vec<Vec<Refund>> = Vec::new();
    for ((g, r), done) in groups.iter().zip(replies).zip(rolled_back.iter_mut()) {
        if let (Some(Ok(reply)), false) = (r, *done) {
            if reply.all {
                let refunds = g
                    .iter()
                    .zip(&reply.outcomes)
                    .filter_map(|(&i, o)| o.as_ref()?.taken.map(|taken| Refund { check: checks[i].clone(), taken }));
                rollbacks.push(refunds.collect());
                *done = true;
            }
        }
    }
    let calls = rollbacks.iter().map(|r| {
        let group: Vec<&Refund> = r.iter().collect();
        async move { inner.run_refund(&group).await }
    });
    for r in join_all(calls).await {
        if let Err(e) = r {
            tracing::warn!(target: "tollgate", error = %e, "could not refund the units of a rejected multi-slot check");
        }
    }
}

/// Whether a slot's group holds only shadow checks.
fn shadow_only(checks: &[Check], group: &[usize]) -> bool {
    group.iter().all(|&i| checks[i].params.shadow)
}

/// The outcomes in the order of the checks: all taken when `everyone` accepted; else
/// decisions with nothing taken (rolled back), `None` for the rules of a slot that failed
/// or has not answered when another slot rejected (or of a shadow-only slot that failed),
/// or the first error of a slot with enforced checks when none rejected.
fn combine(
    checks: &[Check],
    groups: &[Vec<usize>],
    replies: &[Option<Result<Reply, StoreError>>],
    everyone: bool,
) -> Result<Vec<Option<Outcome>>, StoreError> {
    let rejected = replies.iter().flatten().any(|r| matches!(r, Ok(reply) if !reply.all));
    if !rejected {
        let mut enforced = groups.iter().zip(replies).filter(|(g, _)| !shadow_only(checks, g));
        if let Some((_, Some(Err(e)))) = enforced.find(|(_, r)| matches!(r, Some(Err(_)))) {
            return Err(e.clone());
        }
    }
    let mut outcomes: Vec<Option<Outcome>> = vec![None; checks.len()];
    for (g, r) in groups.iter().zip(replies) {
        let Some(Ok(reply)) = r else { continue };
        for (&i, o) in g.iter().zip(&reply.outcomes) {
            outcomes[i] = o.clone().map(|o| Outcome { taken: if everyone { o.taken } else { None }, ..o });
        }
    }
    Ok(outcomes)
}
