//! Charges: units reported after the work ([`Charge`](crate::Charge)), taken from a
//! verdict's charged rules, each by whoever decided that rule — the store, or the fallback
//! limiter that decided it while the store was down. A [`Charging`] owns what it needs, so
//! it can run detached after a response.

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::Settings;
use crate::store::{Check, Store};
use crate::{StoreError, Verdict};

/// One charge of one verdict.
pub(crate) struct Charging<St> {
    store: Arc<St>,
    /// The fallback limiter's part: the probes it decided, as it decides them (its share
    /// of each quota), and the limiter.
    #[cfg(feature = "memory")]
    fallback: Option<(crate::MemoryStore, Vec<Check>)>,
    /// The store's part.
    checks: Vec<Check>,
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
        let mut checks = Vec::with_capacity(verdict.charged.len());
        #[cfg(feature = "memory")]
        let mut local = Vec::new();
        for (c, by) in &verdict.charged {
            let mut c = c.clone();
            c.params.cost = units;
            #[cfg(feature = "memory")]
            if let (crate::DecidedBy::Fallback, Some((_, instances))) = (by, &settings.fallback) {
                local.push(crate::runtime::local_check(&c, *instances));
                continue;
            }
            checks.push(c);
        }
        Some(Self {
            store,
            #[cfg(feature = "memory")]
            fallback: settings.fallback.as_ref().filter(|_| !local.is_empty()).map(|(f, _)| (f.clone(), local)),
            checks,
            deadline,
        })
    }

    /// Takes the units: each rule's from whoever decided it. A remote store's part is under
    /// the deadline; an in-process store's is taken at once, as its decisions are (it needs
    /// no I/O, and there may be no runtime or timer).
    pub(crate) async fn run(&self) -> Result<(), StoreError> {
        let local = self.charge_fallback();
        let store = self.charge_store().await;
        local.and(store)
    }

    /// The fallback limiter's part, at once (it needs no I/O).
    fn charge_fallback(&self) -> Result<(), StoreError> {
        #[cfg(feature = "memory")]
        if let Some((fallback, checks)) = &self.fallback {
            return fallback.charge_at(checks, fallback.now_micros());
        }
        Ok(())
    }

    async fn charge_store(&self) -> Result<(), StoreError> {
        if self.checks.is_empty() {
            return Ok(());
        }
        if let Some(local) = self.store.as_local() {
            return local.charge(&self.checks);
        }
        match tokio::time::timeout(self.deadline, self.store.charge(&self.checks)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.deadline)),
        }
    }

    /// Takes the units after a response: the fallback's at once, and the store's at once
    /// too when it is in-process (before the next request is decided, with no runtime
    /// needed), else in a task of its own under the deadline. A failure is logged and
    /// counted.
    pub(crate) fn spawn(self) {
        #[cfg(feature = "memory")]
        if let Err(err) = self.charge_fallback() {
            failed(self.fallback.iter().flat_map(|(_, c)| c), &err);
        }
        if self.checks.is_empty() {
            return;
        }
        if let Some(local) = self.store.as_local() {
            if let Err(err) = local.charge(&self.checks) {
                failed(&self.checks, &err);
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            failed(&self.checks, &"no tokio runtime to take a charge");
            return;
        };
        drop(runtime.spawn(async move {
            if let Err(err) = self.charge_store().await {
                failed(&self.checks, &err);
            }
        }));
    }
}

/// A charge not taken: logged, and counted per rule.
fn failed<'a>(checks: impl IntoIterator<Item = &'a Check>, err: &dyn std::fmt::Display) {
    let rules: Vec<&str> = checks.into_iter().map(|c| &*c.rule).collect();
    for rule in &rules {
        crate::metrics::charge_failed(rule);
    }
    tracing::warn!(error = %err, ?rules, "tollgate: a charge reported after a response was not taken");
}
