//! Checks whose rules sit in several Redis Cluster slots: one script call per slot, all at
//! once, and a rollback of the slots that accepted when another rejected or failed.

use futures_util::future::join_all;

use super::call::Inner;
use super::keys;
use super::script::MODE_CHECK;
use crate::store::Check;
use crate::{Decision, StoreError};

impl Inner {
    /// The checks grouped so that each group is one script call: everything at once on
    /// a standalone server, one group per slot on a cluster.
    pub(super) fn groups<'c>(&self, checks: &'c [Check]) -> Vec<Vec<&'c Check>> {
        if !self.config.origin.is_cluster() {
            return vec![checks.iter().collect()];
        }
        let mut groups: Vec<(u16, Vec<&Check>)> = Vec::new();
        for c in checks {
            let slot = keys::key_slot(&c.key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(c),
                None => groups.push((slot, vec![c])),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }

    /// Decides checks spread over several slots: each slot atomically, all at once; the
    /// units of slots that accepted are given back when another rejected (or failed).
    pub(super) async fn check_slots(
        &self,
        checks: &[Check],
        groups: &[Vec<&Check>],
    ) -> Result<Vec<Decision>, StoreError> {
        let replies = join_all(groups.iter().map(|g| self.run_check(g, MODE_CHECK))).await;
        let everyone = replies.iter().all(|r| matches!(r, Ok(reply) if reply.all));
        if !everyone {
            let rollbacks = groups.iter().zip(&replies).filter_map(|(g, r)| match r {
                Ok(reply) if reply.all => Some(self.run_refund(g, Some(reply.now))),
                _ => None,
            });
            for result in join_all(rollbacks).await {
                if let Err(e) = result {
                    tracing::warn!(target: "tollgate", error = %e, "could not give back the units of a rejected multi-slot check");
                }
            }
        }
        // Decisions back in the order of `checks`.
        let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
        for (group, reply) in groups.iter().zip(replies) {
            for (c, d) in group.iter().zip(reply?.decisions) {
                if let Some(i) = checks.iter().position(|x| std::ptr::eq(x, *c)) {
                    decisions[i] = Some(d);
                }
            }
        }
        decisions.into_iter().map(|d| d.ok_or_else(|| StoreError::Backend("a rule got no decision".into()))).collect()
    }
}
