//! The heartbeat of a store some limiter counts on (its `Presence`): announcing its
//! process (one member, while a limiter counts on it), counting the servers, loading the charge and refund scripts, and withdrawing
//! a dropped limiter's announcement.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use deadpool_redis::redis::{self, Value};

use super::call::Inner;
use super::conn::ClearOnDrop;
use super::presence::{ANNOUNCE, HEARTBEAT, LAPSE};
use super::script::SCRIPTS;

/// One more limiter over `inner`'s store counts on it: its heartbeat starts. Dropping
/// what this returns (with the limiter) withdraws it.
pub(super) fn announce_limiter(inner: &Arc<Inner>) -> crate::store::Announced {
    inner.presence.limiters.fetch_add(1, Ordering::Relaxed);
    inner.presence.wanted.store(true, Ordering::Relaxed);
    start(inner);
    crate::store::Announced::new(Withdraw(Arc::downgrade(inner)))
}

/// One limiter's announcement: withdrawn when dropped (its members lapse).
struct Withdraw(Weak<Inner>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.presence.limiters.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Starts the heartbeat of `inner`'s store when it does not run and a runtime is running
/// (else a later check starts it). It ends when the store is dropped, or with its
/// runtime: the next check on another starts it again.
pub(super) fn start(inner: &Arc<Inner>) {
    let presence = &inner.presence;
    if presence.started.load(Ordering::Relaxed) || presence.started.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        presence.started.store(false, Ordering::Release);
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let running = ClearOnDrop(weak.clone(), |inner: &Inner| &inner.presence.started);
    drop(runtime.spawn(async move {
        let _running = running;
        loop {
            let Some(inner) = weak.upgrade() else { return };
            announce(&inner).await;
            drop(inner);
            tokio::time::sleep(HEARTBEAT).await;
        }
    }));
}

/// Starts the heartbeat if it does not run yet, and counts once more, in a task of its own.
pub(super) fn recount(inner: &Arc<Inner>) {
    start(inner);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let inner = Arc::clone(inner);
    drop(runtime.spawn(async move { announce(&inner).await }));
}

/// Announces this server and counts: the count is kept when the store answers.
pub(super) async fn announce(inner: &Inner) {
    let name = format!("{}:servers", inner.config.names.prefix);
    let mut cmd = redis::cmd("EVAL");
    // One member per process and store identity, however many limiters count on it.
    let limiters = u64::from(inner.presence.limiters.load(Ordering::Relaxed) > 0);
    cmd.arg(ANNOUNCE).arg(1).arg(&name).arg(&inner.presence.member).arg(LAPSE.as_millis() as u64).arg(limiters);
    let Ok((conn, generation)) = inner.connection().await else { return };
    let slot = inner.config.origin.is_cluster().then(|| super::keys::slot(name.as_bytes()));
    if let Ok(Value::Int(n)) = inner.query(conn.clone(), generation, slot, &cmd, None).await {
        inner.presence.counted(u64::try_from(n).unwrap_or(0));
    }
    let presence = &inner.presence;
    if presence.loaded.load(Ordering::Relaxed) != generation {
        let mut loaded = true;
        for script in [&SCRIPTS.multi, &SCRIPTS.refund] {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.text);
            loaded &= inner.query(conn.clone(), generation, None, &load, None).await.is_ok();
        }
        if loaded {
            presence.loaded.store(generation, Ordering::Relaxed);
        }
    }
}
