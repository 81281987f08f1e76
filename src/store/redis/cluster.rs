//! Checks whose rules sit in several Redis Cluster slots: one script call per slot, all at
//! once, in a task of the store's own, and a rollback of the slots that accepted when
//! another rejected (or failed).
//!
//! - The task owns the calls: when the caller's future is dropped (its deadline passed,
//!   the client left), the calls still end and the rollback still runs. The caller gets
//!   its answer once the rollback is done, so that its next request finds the units back.
//! - A rollback gives back exactly what each slot's commit took (its `Taken`), never
//!   units of requests decided in between.
//! - If any slot rejected, the request is rejected, whatever another slot's error: the
//!   rules of a failed slot are reported undecided (`None`). An error is returned only
//!   when no answer rejects.

use std::sync::Arc;

use futures_util::future::join_all;

use super::call::Inner;
use super::keys;
use super::script::{Reply, MODE_CHECK};
use crate::key::Key;
use crate::store::{Check, Outcome, Refund};
use crate::StoreError;

impl Inner {
    /// Indexes of the checks (by their keys) grouped so that each group is one script
    /// call: everything at once on a standalone server, one group per slot on a cluster.
    pub(super) fn groups<'k>(&self, keys: impl Iterator<Item = &'k Key>) -> Vec<Vec<usize>> {
        if !self.config.origin.is_cluster() {
            return vec![keys.enumerate().map(|(i, _)| i).collect()];
        }
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, key) in keys.enumerate() {
            let slot = keys::key_slot(key);
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
pub(super) async fn check_slots(
    inner: Arc<Inner>,
    checks: &[Check],
    groups: Vec<Vec<usize>>,
) -> Result<Vec<Option<Outcome>>, StoreError> {
    let checks: Arc<[Check]> = checks.into();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let calls = groups.iter().map(|g| {
            let group: Vec<&Check> = g.iter().map(|&i| &checks[i]).collect();
            let inner = &inner;
            async move { inner.run_check(&group, MODE_CHECK).await }
        });
        let replies = join_all(calls).await;
        let everyone = replies.iter().all(|r| matches!(r, Ok(reply) if reply.all));
        let result = combine(checks.len(), &groups, &replies, everyone);
        if everyone {
            let _ = tx.send(result);
            return;
        }
        // Roll back what the slots that accepted took: by each commit's identity.
        let rollbacks: Vec<Vec<Refund>> = groups
            .iter()
            .zip(&replies)
            .filter_map(|(g, r)| match r {
                Ok(reply) if reply.all => Some(refunds(&checks, g, reply)),
                _ => None,
            })
            .collect();
        let calls = rollbacks.iter().map(|r| {
            let group: Vec<&Refund> = r.iter().collect();
            let inner = &inner;
            async move { inner.run_refund(&group).await }
        });
        for r in join_all(calls).await {
            if let Err(e) = r {
                tracing::warn!(target: "tollgate", error = %e, "could not give back the units of a rejected multi-slot check");
            }
        }
        // Answered once the units are back, so that the caller's next request finds them;
        // a caller gone by then (its deadline passed) changes nothing here.
        let _ = tx.send(result);
    });
    rx.await.unwrap_or_else(|_| Err(StoreError::Unavailable("the multi-slot check task ended early".into())))
}

/// What a group that accepted took.
fn refunds(checks: &[Check], group: &[usize], reply: &Reply) -> Vec<Refund> {
    group
        .iter()
        .zip(&reply.outcomes)
        .filter_map(|(&i, o)| o.as_ref()?.taken.map(|taken| Refund { check: checks[i].clone(), taken }))
        .collect()
}

/// The outcomes in the order of the checks: all taken when `everyone` accepted; else
/// decisions with nothing taken (rolled back), `None` for a failed slot's rules when
/// another slot rejected, or the first error when none rejected.
fn combine(
    n: usize,
    groups: &[Vec<usize>],
    replies: &[Result<Reply, StoreError>],
    everyone: bool,
) -> Result<Vec<Option<Outcome>>, StoreError> {
    let rejected = replies.iter().any(|r| matches!(r, Ok(reply) if !reply.all));
    if !rejected {
        if let Some(Err(e)) = replies.iter().find(|r| r.is_err()) {
            return Err(e.clone());
        }
    }
    let mut outcomes: Vec<Option<Outcome>> = vec![None; n];
    for (g, r) in groups.iter().zip(replies) {
        let Ok(reply) = r else { continue };
        for (&i, o) in g.iter().zip(&reply.outcomes) {
            outcomes[i] = o.clone().map(|o| Outcome { taken: if everyone { o.taken } else { None }, ..o });
        }
    }
    Ok(outcomes)
}
