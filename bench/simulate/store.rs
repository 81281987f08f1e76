//! Which store the simulator drives: `--store memory` (default) or `--store redis`.

use tollgate::{Algorithm, Quota};

use super::sim::{BoxError, Decider, MemoryDecider};

/// A kind of store; each algorithm gets a fresh one.
pub(crate) enum Backend {
    /// `MemoryStore::check_at`, in-process.
    Memory,
    /// `RedisStore` at `REDIS_URL`, on a manual clock set to each request's time.
    #[cfg(feature = "redis")]
    Redis(redis_store::RedisBackend),
}

impl Backend {
    /// Parses `--store`; `redis` connects to `REDIS_URL`.
    ///
    /// # Errors
    ///
    /// An unknown name, `redis` in a build without the `redis` feature, or a bad or unset
    /// `REDIS_URL`.
    pub(crate) fn parse(name: &str) -> Result<Self, String> {
        match name {
            "memory" => Ok(Backend::Memory),
            #[cfg(feature = "redis")]
            "redis" => redis_store::RedisBackend::from_env().map(Backend::Redis),
            #[cfg(not(feature = "redis"))]
            "redis" => Err("this simulator was built without redis support: run it with \
                            `cargo run --release --features redis --example simulate -- --store redis …` \
                            and REDIS_URL set"
                .to_owned()),
            other => Err(format!("unknown store {other:?}: use memory or redis")),
        }
    }

    /// The name shown in reports.
    pub(crate) const fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            #[cfg(feature = "redis")]
            Backend::Redis(_) => "redis",
        }
    }

    /// A fresh store for one algorithm over keys `0..keys`.
    ///
    /// # Errors
    ///
    /// When the store cannot be set up (Redis unreachable).
    pub(crate) fn decider(&self, algorithm: Algorithm, quota: Quota, keys: u32) -> Result<Box<dyn Decider>, BoxError> {
        match self {
            Backend::Memory => Ok(Box::new(MemoryDecider::new(algorithm, quota, keys))),
            #[cfg(feature = "redis")]
            Backend::Redis(r) => Ok(Box::new(r.decider(algorithm, quota, keys)?)),
        }
    }
}

#[cfg(feature = "redis")]
mod redis_store {
    //! Replays through Redis: the scripts decide on times passed from a `ManualClock`, so a
    //! trace of hours runs in the time its round trips take (one per request).

    use std::sync::atomic::{AtomicU32, Ordering};

    use tollgate::clock::ManualClock;
    use tollgate::store::{Check, Store};
    use tollgate::{Algorithm, Decision, Quota, RedisStore};

    use super::super::sim::{checks, BoxError, Decider};

    /// `REDIS_URL` and a runtime to drive the async store from the synchronous replay.
    pub(crate) struct RedisBackend {
        url: String,
        runtime: tokio::runtime::Runtime,
        /// Numbers the stores, so each algorithm starts from empty keys.
        next: AtomicU32,
    }

    impl RedisBackend {
        /// Reads `REDIS_URL` and starts a runtime.
        pub(crate) fn from_env() -> Result<Self, String> {
            let url = std::env::var("REDIS_URL")
                .map_err(|_| "--store redis needs REDIS_URL, e.g. REDIS_URL=redis://127.0.0.1:6379".to_owned())?;
            RedisStore::from_url(&url).map_err(|e| format!("REDIS_URL: {e}"))?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| format!("starting a tokio runtime: {e}"))?;
            Ok(Self { url, runtime, next: AtomicU32::new(0) })
        }

        /// A store under a prefix of its own (`tollgate-sim:<pid>:<n>`), checked with `PING`.
        pub(crate) fn decider(&self, algorithm: Algorithm, quota: Quota, keys: u32) -> Result<RedisDecider, BoxError> {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let clock = ManualClock::new(0);
            let store = RedisStore::from_url(&self.url)?
                .prefix(&format!("tollgate-sim:{}:{n}", std::process::id()))?
                .with_clock(clock.clone());
            self.runtime.block_on(store.ping())?;
            Ok(RedisDecider {
                runtime: self.runtime.handle().clone(),
                store,
                clock,
                checks: checks(algorithm, quota, keys),
            })
        }
    }

    /// One algorithm's store in Redis.
    pub(crate) struct RedisDecider {
        runtime: tokio::runtime::Handle,
        store: RedisStore,
        clock: ManualClock,
        checks: Vec<Check>,
    }

    impl Decider for RedisDecider {
        fn check(&mut self, key: u32, now: u64) -> Result<Decision, BoxError> {
            let check = self.checks.get(key as usize).ok_or("key outside the trace")?;
            self.clock.set(now);
            Ok(self.runtime.block_on(self.store.check_one(check))?.decision)
        }
    }
}
