//! Charges: units reported after the work ([`Charge`](crate::Charge)), taken from a
//! verdict's charged rules by whoever decided it — the store, or the fallback limiter
//! that decided while the store was down. A [`Charging`] owns what it needs, so it can
//! run detached after a response.

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::Settings;
use crate::store::{Check, Store};
use crate::verdict::DecidedBy;
use crate::{StoreError, Verdict};

/// One charge of one verdict.
pub(crate) struct Charging<St> {
    store: Arc<St>,
    #[cfg(feature = "memory")]
    fallback: Option<(crate::MemoryStore, u64)>,
    checks: Vec<Check>,
    #[cfg_attr(not(feature = "memory"), allow(dead_code))] // only the fallback needs it
    by: Option<DecidedBy>,
    deadline: Duration,
}

impl<St: Store> Charging<St> {
    /// `units` from `verdict`'s charged rules; `None` when there is nothing to take (no
    /// charged rule, no unit, or a verdict that did not let the work happen).
    #[cfg_attr(not(feature = "memory"), allow(unused_variables))]
    pub(crate) fn new(
        store: Arc<St>,
        settings: &Settings,
        deadline: Duration,
        verdict: &Verdict,
        units: u64,
    ) -> Option<Self> {
        if units == 0 || verdict.charged.is_empty() || !verdict.is_allowed() {
            return None;
        }
        let checks = verdict
            .charged
            .iter()
            .map(|c| {
                let mut c = c.clone();
                c.params.cost = units;
                c
            })
            .collect();
        Some(Self {
            store,
            #[cfg(feature = "memory")]
            fallback: settings.fallback.clone(),
            checks,
            by: verdict.source,
            deadline,
        })
    }

    /// Takes the units: from the fallback limiter when it decided the verdict, else from
    /// the store, within the deadline.
    pub(crate) async fn run(&self) -> Result<(), StoreError> {
        #[cfg(feature = "memory")]
        if self.by == Some(DecidedBy::Fallback) {
            if let Some((fallback, instances)) = &self.fallback {
                let local: Vec<Check> =
                    self.checks.iter().map(|c| crate::runtime::local_check(c, *instances)).collect();
                return fallback.charge_at(&local, fallback.now_micros());
            }
        }
        match tokio::time::timeout(self.deadline, self.store.charge(&self.checks)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.deadline)),
        }
    }

    /// Runs in a task of its own, after the response: a failure is logged and counted.
    pub(crate) fn spawn(self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("tollgate: no tokio runtime to take a charge");
            return;
        };
        rt.spawn(async move {
            if let Err(err) = self.run().await {
                for c in &self.checks {
                    crate::metrics::charge_failed(&c.rule);
                }
                let rules: Vec<&str> = self.checks.iter().map(|c| &*c.rule).collect();
                tracing::warn!(error = %err, ?rules, "tollgate: a charge reported after a response was not taken");
            }
        });
    }
}
