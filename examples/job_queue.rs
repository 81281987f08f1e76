//! Limiting something that is not an HTTP request: jobs of a queue, per customer, through
//! a [`tollgate::Limiter`] — the same rules, store and protections the HTTP layer uses.
//!
//! ```text
//! cargo run -p tollgate-examples --example job_queue                                    # in-process store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tollgate-examples --features redis --example job_queue
//! ```
//!
//! Two customers enqueue jobs at once: `acme` 14, `globex` 3. Each customer may start 5
//! jobs a second, and a worker waits at most a second for a job's turn
//! ([`Limiter::wait`](tollgate::Limiter::wait)); a job that would wait longer goes back to
//! the queue for later. `globex` is not slowed down by `acme`'s backlog, and a job too big
//! for any second (`cost` above the burst) is refused at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::Store;
use tollgate::{Algorithm, Limiter, Quota};

/// One job of the queue.
#[derive(Debug, Clone)]
struct Job {
    customer: &'static str,
    id: u32,
    /// How many units the job counts for (a batch of 10 items counts 10).
    weight: u64,
}

/// Runs every job through the limiter, one task per job, and prints what happened.
async fn run<St: Store>(limiter: Limiter<St, Job>) {
    let limiter = Arc::new(limiter);
    let mut jobs: Vec<Job> = (1..=14).map(|id| Job { customer: "acme", id, weight: 1 }).collect();
    jobs.extend((1..=3).map(|id| Job { customer: "globex", id, weight: 1 }));
    jobs.push(Job { customer: "globex", id: 4, weight: 50 });

    let started = Instant::now();
    let tasks: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let verdict = limiter.wait(&job, Duration::from_secs(1)).await;
                let at = started.elapsed();
                (job, verdict, at)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("job task"));
    }
    outcomes.sort_by_key(|(_, _, at)| *at);
    for (job, verdict, at) in &outcomes {
        let what = if verdict.is_allowed() {
            "started".to_owned()
        } else if let Some(retry) = verdict.retry_after() {
            format!("deferred (would wait too long; next turn in {} ms)", retry.as_millis())
        } else if let Some(err) = verdict.store_error() {
            format!("refused: store unavailable ({err})")
        } else {
            "refused: larger than any second allows".to_owned()
        };
        println!("{:>6} ms  {}#{} (weight {}): {what}", at.as_millis(), job.customer, job.id, job.weight);
    }
    for customer in ["acme", "globex"] {
        let mine: Vec<_> = outcomes.iter().filter(|(j, _, _)| j.customer == customer).collect();
        let started: Vec<_> = mine.iter().filter(|(_, v, _)| v.is_allowed()).collect();
        let last = started.iter().map(|(_, _, at)| at.as_millis()).max().unwrap_or(0);
        println!(
            "summary {customer}: started {} of {}, deferred {}, last start at {last} ms",
            started.len(),
            mine.len(),
            mine.len() - started.len()
        );
    }
}

fn limiter<St: Store>(store: St) -> Limiter<St, Job> {
    Limiter::builder(store)
        // Per customer: 5 jobs a second, a burst of 5; a job's weight is its cost.
        .rule("jobs-per-customer", Quota::per_second(5), |job: &Job| Some(job.customer))
        .algorithm(Algorithm::Gcra)
        .cost(|job: &Job| job.weight)
        .build()
        .expect("one valid rule")
}

/// Errors are printed as their message (`error: …`), not their `Debug` form.
#[tokio::main]
async fn main() {
    if let Err(err) = start().await {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}

async fn start() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => {
            let store = tollgate::RedisStore::from_url(&url)?;
            store.ping().await?;
            println!("store: Redis at {url}");
            run(limiter(store)).await;
        }
        #[cfg(not(feature = "redis"))]
        Ok(_) => return Err("REDIS_URL is set but this build has no Redis support: add --features redis".into()),
        Err(_) => {
            println!("store: in-process (set REDIS_URL to share limits through Redis)");
            run(limiter(tollgate::MemoryStore::new())).await;
        }
    }
    Ok(())
}
