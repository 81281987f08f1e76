//! Charges: units reported after the work ([`Charge`](crate::Charge)), taken from a
//! verdict's charged rules by whoever decided it — the store, or the fallback limiter
//! that decided while the store was down. A [`Charging`] owns what it needs, so it can
//! run detached after a response.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
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
    /// the store, within the deadline (an in-process store needs none).
    pub(crate) async fn run(&self) -> Result<(), StoreError> {
        #[cfg(feature = "memory")]
        if self.by == Some(DecidedBy::Fallback) {
            if let Some((fallback, instances)) = &self.fallback {
                let local: Vec<Check> =
                    self.checks.iter().map(|c| crate::runtime::local_check(c, *instances)).collect();
                return fallback.charge_at(&local, fallback.now_micros());
            }
        }
        if self.store.is_local() {
            return self.store.charge(&self.checks).await;
        }
        match tokio::time::timeout(self.deadline, self.store.charge(&self.checks)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.deadline)),
        }
    }

    /// Whether the units go to an in-process limiter (the fallback's, or a local store),
    /// which takes them with no I/O.
    fn is_local(&self) -> bool {
        #[cfg(feature = "memory")]
        if self.by == Some(DecidedBy::Fallback) && self.fallback.is_some() {
            return true;
        }
        self.store.is_local()
    }

    /// Takes the units after the response: at once when they go to an in-process limiter
    /// (before the next request is decided, with no runtime needed), else in a task of
    /// its own. A failure is logged and counted.
    pub(crate) fn spawn(self) {
        let local = self.is_local();
        let mut run = Box::pin(async move {
            if let Err(err) = self.run().await {
                for c in &self.checks {
                    crate::metrics::charge_failed(&c.rule);
                }
                let rules: Vec<&str> = self.checks.iter().map(|c| &*c.rule).collect();
                tracing::warn!(error = %err, ?rules, "tollgate: a charge reported after a response was not taken");
            }
        });
        // Polled once here; a store whose charge is not ready at once finishes in a task.
        if local && run.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(run);
            }
            Err(_) => tracing::warn!("tollgate: no tokio runtime to take a charge"),
        }
    }
}
