//! How much Redis memory one user costs, per algorithm.
//!
//! ```text
//! redis-server --port 6390 --save '' --appendonly no &
//! REDIS_URL=redis://127.0.0.1:6390 cargo run --release -p tollgate-bench --example redis_memory
//! ```
//!
//! Starts nothing itself: it uses the Redis at `REDIS_URL` (default
//! `redis://127.0.0.1:6379`), under its own key prefix, and deletes what it wrote. For
//! each algorithm it writes the state of 100,000 users (one request each; three for the
//! sliding window log), then prints a markdown table of the average `MEMORY USAGE` of a
//! sample of 1,000 keys and of the growth of `used_memory` divided by the users.

#[cfg(not(feature = "redis"))]
fn main() {
    eprintln!("this example needs the `redis` feature: cargo run --release -p tollgate-bench --example redis_memory");
}

#[cfg(feature = "redis")]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    imp::run().await
}

#[cfg(feature = "redis")]
mod imp {
    use std::sync::Arc;
    use std::time::Instant;

    use redis::aio::MultiplexedConnection;
    use tollgate::store::Params;
    use tollgate::store::{Check, Store};
    use tollgate::{Algorithm, Quota, RedisStore};

    const USERS: usize = 100_000;
    const SAMPLE: usize = 1_000;
    /// Requests in flight at once (pipelined over the store's one connection).
    const CONCURRENCY: usize = 256;
    /// As long as the default prefix `tollgate`, so that key sizes are representative.
    const PREFIX: &str = "tgmemory";

    async fn used_memory(conn: &mut MultiplexedConnection) -> redis::RedisResult<i64> {
        let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
        Ok(info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0))
    }

    /// Every key under [`PREFIX`].
    async fn scan_all(conn: &mut MultiplexedConnection) -> redis::RedisResult<Vec<Vec<u8>>> {
        let (mut cursor, mut all) = (0u64, Vec::new());
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{PREFIX}:*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await?;
            all.extend(keys);
            if next == 0 {
                // SCAN may return a key twice while the table resizes.
                all.sort_unstable();
                all.dedup();
                return Ok(all);
            }
            cursor = next;
        }
    }

    async fn delete_all(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
        for chunk in scan_all(conn).await?.chunks(1000) {
            let _: i64 = redis::cmd("UNLINK").arg(chunk).query_async(conn).await?;
        }
        Ok(())
    }

    pub(super) async fn run() -> Result<(), Box<dyn std::error::Error>> {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let store = RedisStore::from_url(&url)?.prefix(PREFIX)?;
        store.ping().await?;
        let mut conn = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;
        let version: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
        let version = version.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim().to_owned();
        delete_all(&mut conn).await?;

        let mut rows = Vec::new();
        for algorithm in Algorithm::ALL {
            let requests = if algorithm == Algorithm::SlidingWindowLog { 3 } else { 1 };
            // A day-long quota: every state outlives the measurement.
            let quota = Quota::per_day(1_000);
            let before = used_memory(&mut conn).await?;
            let started = Instant::now();
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let workers: Vec<_> = (0..CONCURRENCY)
                .map(|_| {
                    let (store, next) = (store.clone(), next.clone());
                    tokio::spawn(async move {
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= USERS * requests {
                                return Ok::<_, tollgate::StoreError>(());
                            }
                            let check = Check {
                                rule: "api".into(),
                                key: format!("user-{}", i % USERS).into(),
                                algorithm,
                                params: Params::new(quota),
                            };
                            store.check(std::slice::from_ref(&check)).await?;
                        }
                    })
                })
                .collect();
            for w in workers {
                w.await??;
            }
            let took = started.elapsed();
            let after = used_memory(&mut conn).await?;
            // Every key under the prefix is one user's state (the layout is `RedisStore`'s
            // business, so the keys are found by SCAN rather than by spelling their names).
            let keys = scan_all(&mut conn).await?;
            if keys.len() != USERS {
                return Err(format!("{algorithm}: {} keys for {USERS} users", keys.len()).into());
            }
            let (mut sampled, mut bytes) = (0, 0);
            for key in keys.iter().step_by(USERS / SAMPLE) {
                let usage: Option<i64> =
                    redis::cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0).query_async(&mut conn).await?;
                sampled += 1;
                bytes += usage.ok_or("a scanned key vanished")?;
            }
            #[allow(clippy::cast_precision_loss)]
            let (usage, delta) = (bytes as f64 / sampled as f64, (after - before) as f64 / USERS as f64);
            eprintln!("{algorithm}: {USERS} users written in {took:?}");
            rows.push(format!("| {algorithm} | {requests} | {usage:.1} | {delta:.1} |",));
            delete_all(&mut conn).await?;
        }
        println!("Redis {version}, {USERS} users per algorithm, `MEMORY USAGE` averaged over {SAMPLE} keys:\n");
        println!(
            "| algorithm | requests per user | MEMORY USAGE bytes per user | used_memory growth per user (bytes) |"
        );
        println!("|---|---|---|---|");
        for row in rows {
            println!("{row}");
        }
        Ok(())
    }
}
