//! Load test of `RedisStore`: decisions per second and latency at 64 in flight over one
//! multiplexed connection, beside baselines measured in the same run on the same Redis.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example loadtest -- [--quick]
//!     [--threads N] [--rlf PATH/bench.js] [--out FILE.md] [--only ALGORITHM]
//!     [--conc-only] [--conc-runs N]
//! ```
//!
//! It starts its own `redis-server` on a free 127.0.0.1 port (with the test harness of
//! `tests/support/redis.rs`, whose watchdog kills the server even when this process is
//! killed or interrupted), and runs:
//!
//! - **W1**: 10,000 keys drawn uniformly at random (fixed seed), 100/min per key,
//!   200,000 decisions, for each algorithm (1) through the full layer path: a
//!   `RateLimitLayer` over a trivial service, called with `ready().call()` and requests
//!   that carry the key in `x-api-key`; (2) through `Store::check_one`; (3) the algorithm's own
//!   script by raw `EVALSHA` with the KEYS and ARGV the store sends (baseline b).
//!   The layer runs twice: on the default store (group commit, `RedisStore::max_batch`
//!   64) and with batching off (`max_batch(1)`, one script call per decision).
//! - **W3**: W1's workload through the layer at 2, 4, 8, 64 and 1,024 decisions in flight
//!   (1,024: 4 tasks of 256 calls each, as a busy server's connection tasks), batching off
//!   and on, beside baseline (a) at the same in-flight count, with each side's CPU share.
//! - **W2**: one hot key, 1,000/min, 50,000 decisions through the layer, with the local
//!   blocked-key cache on (the default) and off, and the accepted count checked.
//! - **Baseline (a)**: a trivial script (`INCR` + `PEXPIRE`) by `EVALSHA`, the ceiling of
//!   one round trip, on the keys of each workload. In W1 it is measured again just before
//!   each algorithm's rows, and their ratios are to that adjacent measurement.
//! - **W1 with a concurrency rule** (issue 42): W1's workload through the layer with a rate
//!   rule and `Rule::concurrent` on the same key, beside the rate rule alone, 3 runs each
//!   (`--conc-runs N`), with the store calls and the script calls to enter and to leave,
//!   and renewals apart (see `loadtest_conc.rs`). `--conc-only` runs only this figure.
//! - Optionally **rate-limiter-flexible** (`RateLimiterRedis`, a fixed window) on the same
//!   Redis, W1's workload, by running `node PATH <port> <keys> <decisions> <in flight>
//!   <limit>`; the script prints one JSON line (`decisions`, `seconds`, `p50_us`, `p99_us`,
//!   `p999_us`, `commandstats`). Keep it and its `node_modules` outside the repository.
//!
//! Every row starts from an empty Redis (`FLUSHALL`) after a warm-up on other keys; Redis's
//! command counts are `INFO commandstats` after a `CONFIG RESETSTAT`. The leaky bucket is
//! run as a policer (`max_delay` 0): as a shaper the layer would sleep until each
//! request's slot, which measures the quota, not the limiter. `--quick` runs 20,000 and
//! 5,000 decisions. Each row also shows the CPU time the client and redis-server spent per
//! decision and how many decisions Redis got per socket read, which tell which side is the
//! bottleneck. `--threads N` runs the client on a multi-thread runtime (default: one
//! current-thread runtime), `--only ALGORITHM` one algorithm (for profiling);
//! `TOLLGATE_SLICES=on` runs the layer with quota slices on. The tables are markdown, then
//! the targets with PASS or FAIL; the exit status is 0 whatever they say
//! (it is a measurement), 1 only when the run itself failed. See docs/performance.md.

#[cfg(feature = "redis")]
#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(not(feature = "redis"))]
fn main() {
    eprintln!("the load test needs Redis: cargo run --release -p tollgate-bench --example loadtest");
    std::process::exit(2);
}

#[cfg(feature = "redis")]
fn main() {
    if let Err(e) = run::main() {
        eprintln!("loadtest failed: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "redis")]
mod run {
    /// W1 with a concurrency rule (issue 42): see the top of `loadtest_conc.rs`.
    mod conc {
        include!("loadtest_conc.rs");
    }

    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::fmt::Write as _;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use axum::body::Body;
    use http::{HeaderValue, Request, Response, StatusCode};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use redis::aio::MultiplexedConnection;
    use redis::Value;
    use tollgate::key::{self, Key};
    use tollgate::store::Params;
    use tollgate::store::{Check, Store};
    use tollgate::{Algorithm, FailMode, Quota, RateLimitLayer, RedisStore, Rule};
    use tower::{Layer, Service, ServiceExt};

    use crate::support::redis::RedisServer;

    type Error = Box<dyn std::error::Error + Send + Sync>;

    const IN_FLIGHT: usize = 64;
    const W1_KEYS: usize = 10_000;
    const W1_QUOTA: Quota = Quota::per_minute(100);
    const W2_QUOTA: Quota = Quota::per_minute(1_000);
    /// 60 s / 1,000: the refill interval of W2's token bucket and GCRA.
    const W2_REFILL: Duration = Duration::from_millis(60);
    const SEED: u64 = 42;
    const HEADER: &str = "x-api-key";
    const RULE: &str = "lt";
    /// Keys only the warm-ups use.
    const WARM_KEYS: usize = 1_000;
    /// A window algorithm's W2 run starts only with this much left of the current minute,
    /// so that its window does not turn over during the run.
    const WINDOW_MARGIN: Duration = Duration::from_secs(12);
    /// Claimed in the issue for rate-limiter-flexible's fixed window on this machine
    /// (Node, one connection); used only when it is not measured in the run.
    const RLF_QUOTED: (f64, f64) = (27_000.0, 32_000.0);
    const TRIVIAL_LUA: &str =
        "local n = redis.call('INCR', KEYS[1])\nredis.call('PEXPIRE', KEYS[1], ARGV[1])\nreturn n\n";

    struct Options {
        quick: bool,
        threads: usize,
        rlf: Option<String>,
        out: Option<String>,
        only: Option<Algorithm>,
        /// `RedisStore::max_batch` of the batching store (default: the store's default).
        max_batch: Option<usize>,
        /// Only the sweep (W3), at these in-flight counts.
        sweep_only: Option<Vec<usize>>,
        /// Only W1 with a concurrency rule.
        conc_only: bool,
        /// Runs of W1 with a concurrency rule.
        conc_runs: usize,
    }

    fn options() -> Result<Options, Error> {
        let mut o = Options {
            quick: false,
            threads: 1,
            rlf: std::env::var("TOLLGATE_RLF_BENCH").ok(),
            out: None,
            only: None,
            max_batch: None,
            sweep_only: None,
            conc_only: false,
            conc_runs: 3,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => o.quick = true,
                "--threads" => o.threads = args.next().ok_or("--threads needs a number")?.parse()?,
                "--rlf" => o.rlf = Some(args.next().ok_or("--rlf needs the path of the node script")?),
                "--out" => o.out = Some(args.next().ok_or("--out needs a file name")?),
                "--only" => o.only = Some(args.next().ok_or("--only needs an algorithm")?.parse()?),
                "--conc-only" => o.conc_only = true,
                "--conc-runs" => o.conc_runs = args.next().ok_or("--conc-runs needs a number")?.parse()?,
                "--max-batch" => o.max_batch = Some(args.next().ok_or("--max-batch needs a number")?.parse()?),
                "--sweep-only" => {
                    let list = args.next().ok_or("--sweep-only needs in-flight counts, e.g. 8,64")?;
                    o.sweep_only = Some(list.split(',').map(str::parse).collect::<Result<_, _>>()?);
                }
                other => return Err(format!("unknown argument {other:?}; see the top of bench/loadtest.rs").into()),
            }
        }
        Ok(o)
    }

    pub(crate) fn main() -> Result<(), Error> {
        let opts = options()?;
        let server = RedisServer::start();
        let runtime = if opts.threads <= 1 {
            tokio::runtime::Builder::new_current_thread().enable_all().build()?
        } else {
            tokio::runtime::Builder::new_multi_thread().worker_threads(opts.threads).enable_all().build()?
        };
        let report = runtime.block_on(suite(&server, &opts))?;
        runtime.shutdown_timeout(Duration::from_secs(1));
        print!("{report}");
        if let Some(path) = &opts.out {
            std::fs::write(path, &report)?;
        }
        drop(server);
        Ok(())
    }

    // ------------------------------------------------------------------------------
    // What one decision is, for each path
    // ------------------------------------------------------------------------------

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Accepted,
        Rejected,
        Failed,
    }

    /// One way of asking for a decision for the `k`-th key. Each in-flight task has its
    /// own clone.
    trait Target: Clone + Send + 'static {
        fn call(&mut self, k: usize) -> impl Future<Output = Outcome> + Send;
    }

    /// The full layer path: a `RateLimitLayer` over a trivial service.
    #[derive(Clone)]
    struct ViaLayer<S> {
        svc: S,
        keys: Arc<[HeaderValue]>,
    }

    impl<S> Target for ViaLayer<S>
    where
        S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
        S::Future: Send,
    {
        async fn call(&mut self, k: usize) -> Outcome {
            let mut req = Request::new(Body::empty());
            req.headers_mut().insert(HEADER, self.keys[k].clone());
            let Ok(svc) = self.svc.ready().await;
            let Ok(res) = svc.call(req).await;
            match res.status() {
                StatusCode::OK => Outcome::Accepted,
                StatusCode::TOO_MANY_REQUESTS if res.headers().contains_key(http::header::RETRY_AFTER) => {
                    Outcome::Rejected
                }
                _ => Outcome::Failed,
            }
        }
    }

    /// `Store::check_one`: what the layer calls for a request with one rule.
    #[derive(Clone)]
    struct ViaStore {
        store: RedisStore,
        checks: Arc<[Check]>,
    }

    impl Target for ViaStore {
        async fn call(&mut self, k: usize) -> Outcome {
            match self.store.check_one(&self.checks[k]).await {
                Ok(o) if o.decision.allowed => Outcome::Accepted,
                Ok(_) => Outcome::Rejected,
                Err(_) => Outcome::Failed,
            }
        }
    }

    /// A prepared `EVALSHA` per key on a bare multiplexed connection.
    #[derive(Clone)]
    struct ViaScript {
        conn: MultiplexedConnection,
        cmds: Arc<[redis::Cmd]>,
    }

    impl Target for ViaScript {
        async fn call(&mut self, k: usize) -> Outcome {
            match self.cmds[k].query_async::<Value>(&mut self.conn).await {
                // The check scripts: { now, all accepted, … }.
                Ok(Value::Array(v)) if v.get(1) == Some(&Value::Int(1)) => Outcome::Accepted,
                Ok(Value::Array(_)) => Outcome::Rejected,
                // The trivial script: the counter.
                Ok(Value::Int(_)) => Outcome::Accepted,
                _ => Outcome::Failed,
            }
        }
    }

    // ------------------------------------------------------------------------------
    // Driving a workload
    // ------------------------------------------------------------------------------

    /// What one run of a workload measured.
    struct Run {
        decisions: usize,
        elapsed: Duration,
        /// Sorted latencies, ns.
        latencies: Vec<u64>,
        accepted: usize,
        failed: usize,
        /// Redis's `INFO commandstats` delta: (`EVALSHA`+`EVAL` calls, every other command).
        calls: u64,
        inside: u64,
        /// CPU time of this process and of redis-server during the run, ns.
        client_cpu: u64,
        redis_cpu: u64,
        /// Socket reads Redis processed (`total_reads_processed`): decisions per read is how
        /// well the client pipelines.
        reads: u64,
    }

    impl Run {
        #[allow(clippy::cast_precision_loss)]
        fn rate(&self) -> f64 {
            self.decisions as f64 / self.elapsed.as_secs_f64()
        }

        /// The `p` quantile in µs.
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        fn quantile_us(&self, p: f64) -> f64 {
            let i = ((self.latencies.len() as f64 * p) as usize).min(self.latencies.len() - 1);
            self.latencies[i] as f64 / 1000.0
        }

        #[allow(clippy::cast_precision_loss)]
        fn per_decision(&self, n: u64) -> f64 {
            n as f64 / self.decisions as f64
        }

        /// Decisions per socket read of Redis.
        #[allow(clippy::cast_precision_loss)]
        fn batch(&self) -> f64 {
            self.decisions as f64 / self.reads.max(1) as f64
        }

        /// The share of one core used during the run, %: (client, redis).
        #[allow(clippy::cast_precision_loss)]
        fn cpu_share(&self) -> (f64, f64) {
            let wall = self.elapsed.as_nanos() as f64 / 100.0;
            (self.client_cpu as f64 / wall, self.redis_cpu as f64 / wall)
        }

        /// CPU µs per decision: (client, redis).
        fn cpu_us(&self) -> (f64, f64) {
            (self.per_decision(self.client_cpu) / 1000.0, self.per_decision(self.redis_cpu) / 1000.0)
        }
    }

    /// How the decisions in flight are driven: `tasks` tokio tasks, each with `per_task`
    /// calls in flight (a loop each, joined inside the task).
    #[derive(Clone, Copy)]
    struct Shape {
        tasks: usize,
        per_task: usize,
    }

    impl Shape {
        const fn in_flight(self) -> usize {
            self.tasks * self.per_task
        }

        /// `n` in flight: one task per call up to 64; above, 4 tasks (a busy server's few
        /// connection tasks, each with many requests in flight).
        fn of(n: usize) -> Self {
            if n <= IN_FLIGHT {
                Self { tasks: n, per_task: 1 }
            } else {
                Self { tasks: 4, per_task: n.div_ceil(4) }
            }
        }
    }

    /// One caller's loop: takes the next index of `seq` until none is left.
    async fn caller<T: Target>(
        mut target: T,
        seq: Arc<[u32]>,
        next: Arc<AtomicUsize>,
        share: usize,
    ) -> (Vec<u64>, usize, usize) {
        let mut lat = Vec::with_capacity(share);
        let (mut accepted, mut failed) = (0, 0);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&k) = seq.get(i) else { break };
            let t = Instant::now();
            let outcome = target.call(k as usize).await;
            lat.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
            accepted += usize::from(outcome == Outcome::Accepted);
            failed += usize::from(outcome == Outcome::Failed);
            // A decision from the local cache completes without waiting: yield now
            // and then, as a server's connection task would, or this loop would
            // starve the task that reads Redis's replies.
            tokio::task::consume_budget().await;
        }
        (lat, accepted, failed)
    }

    /// Runs `seq` (indexes of keys) with `shape`'s calls in flight, each taking the next index.
    async fn drive<T: Target>(target: &T, seq: &Arc<[u32]>, shape: Shape) -> (Duration, Vec<u64>, usize, usize) {
        let next = Arc::new(AtomicUsize::new(0));
        let share = seq.len() / shape.in_flight() + 1;
        let started = Instant::now();
        let tasks: Vec<_> = (0..shape.tasks)
            .map(|_| {
                let callers: Vec<_> =
                    (0..shape.per_task).map(|_| caller(target.clone(), seq.clone(), next.clone(), share)).collect();
                tokio::spawn(async move {
                    let mut all = (Vec::new(), 0, 0);
                    for (lat, a, f) in futures_util::future::join_all(callers).await {
                        all.0.extend(lat);
                        all.1 += a;
                        all.2 += f;
                    }
                    all
                })
            })
            .collect();
        let mut all = Vec::with_capacity(seq.len());
        let (mut accepted, mut failed) = (0, 0);
        for t in tasks {
            let (lat, a, f) = t.await.expect("a load task panicked");
            all.extend(lat);
            accepted += a;
            failed += f;
        }
        let elapsed = started.elapsed();
        all.sort_unstable();
        (elapsed, all, accepted, failed)
    }

    /// Redis seen from the side: flush, reset and read the command statistics.
    struct Ctl {
        conn: MultiplexedConnection,
        url: String,
        redis_pid: u32,
    }

    impl Ctl {
        async fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> Result<T, Error> {
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            Ok(cmd.query_async(&mut self.conn).await?)
        }

        /// `INFO commandstats` as command → calls.
        async fn commandstats(&mut self) -> Result<BTreeMap<String, u64>, Error> {
            let info: String = self.cmd(&["INFO", "commandstats"]).await?;
            Ok(parse_commandstats(&info))
        }

        /// `total_reads_processed` of `INFO stats`.
        async fn reads(&mut self) -> Result<u64, Error> {
            let info: String = self.cmd(&["INFO", "stats"]).await?;
            Ok(info.lines().find_map(|l| l.trim().strip_prefix("total_reads_processed:")?.parse().ok()).unwrap_or(0))
        }

        /// CPU time used so far by this process and by redis-server, ns.
        fn cpu(&self) -> (u64, u64) {
            (cpu_ns("self"), cpu_ns(&self.redis_pid.to_string()))
        }

        async fn fresh(&mut self) -> Result<(), Error> {
            self.cmd::<()>(&["FLUSHALL"]).await?;
            self.cmd::<()>(&["CONFIG", "RESETSTAT"]).await
        }

        /// A new bare multiplexed connection (redis-rs defaults).
        async fn connection(&self) -> Result<MultiplexedConnection, Error> {
            Ok(redis::Client::open(self.url.as_str())?.get_multiplexed_async_connection().await?)
        }
    }

    /// CPU time of every thread of process `pid` (`self` for this one), ns, from the
    /// scheduler's statistics.
    fn cpu_ns(pid: &str) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// Commands of the measuring itself, not of the decisions.
    const OWN: [&str; 5] = ["info", "config|resetstat", "flushall", "ping", "client|setinfo"];

    /// (`EVALSHA` + `EVAL`, every other command) in `stats`.
    fn split_stats(stats: &BTreeMap<String, u64>) -> (u64, u64) {
        let calls = stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0);
        let all: u64 = stats.iter().filter(|(k, _)| !OWN.contains(&k.as_str())).map(|(_, v)| v).sum();
        (calls, all - calls)
    }

    /// Warm-up on `warm`, then an empty Redis, then `seq` measured.
    async fn measure<T: Target>(ctl: &mut Ctl, target: &T, warm: &Arc<[u32]>, seq: &Arc<[u32]>) -> Result<Run, Error> {
        measure_at(ctl, target, warm, seq, Shape::of(IN_FLIGHT)).await
    }

    /// [`measure`] with `shape`'s calls in flight.
    async fn measure_at<T: Target>(
        ctl: &mut Ctl,
        target: &T,
        warm: &Arc<[u32]>,
        seq: &Arc<[u32]>,
        shape: Shape,
    ) -> Result<Run, Error> {
        drive(target, warm, shape).await;
        ctl.fresh().await?;
        let cpu = ctl.cpu();
        let (elapsed, latencies, accepted, failed) = drive(target, seq, shape).await;
        let (client_cpu, redis_cpu) = ctl.cpu();
        let (client_cpu, redis_cpu) = (client_cpu.saturating_sub(cpu.0), redis_cpu.saturating_sub(cpu.1));
        let (calls, inside) = split_stats(&ctl.commandstats().await?);
        let reads = ctl.reads().await?;
        Ok(Run {
            decisions: seq.len(),
            elapsed,
            latencies,
            accepted,
            failed,
            calls,
            inside,
            client_cpu,
            redis_cpu,
            reads,
        })
    }

    // ------------------------------------------------------------------------------
    // Building the paths
    // ------------------------------------------------------------------------------

    fn key_name(i: usize) -> String {
        if i < W1_KEYS {
            format!("user-{i}")
        } else {
            format!("warm-{i}")
        }
    }

    fn max_delay(algorithm: Algorithm) -> Duration {
        if algorithm == Algorithm::LeakyBucket {
            Duration::ZERO // a policer: see the module docs
        } else {
            Duration::from_secs(10)
        }
    }

    fn check_for(name: &str, algorithm: Algorithm, quota: Quota) -> Check {
        let mut params = Params::new(quota);
        params.max_delay_us = u64::try_from(max_delay(algorithm).as_micros()).unwrap_or(u64::MAX);
        Check { rule: RULE.into(), key: Key::from(name), algorithm, params }
    }

    fn via_layer(
        store: &RedisStore,
        names: &[String],
        algorithm: Algorithm,
        quota: Quota,
        cache: bool,
    ) -> Result<impl Target, Error> {
        let layer = RateLimitLayer::builder(store.clone())
            .add_rule(Rule::new(RULE, quota, key::header(HEADER)).algorithm(algorithm).max_delay(max_delay(algorithm)))
            // A store error answers 503 and is counted as failed, never as accepted.
            .fail_mode(FailMode::Closed)
            .local_cache(cache)
            // `TOLLGATE_SLICES=on`: quota slices on (issue 39's "no regression where it does
            // not pay": W1's keys are cold, so no slice is ever taken).
            .slices(std::env::var("TOLLGATE_SLICES").is_ok_and(|v| v == "on"))
            .build()?;
        let inner =
            tower::service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
        let keys = names.iter().map(|n| HeaderValue::from_str(n)).collect::<Result<Vec<_>, _>>()?;
        Ok(ViaLayer { svc: layer.layer(inner), keys: keys.into() })
    }

    fn via_store(store: &RedisStore, names: &[String], algorithm: Algorithm, quota: Quota) -> ViaStore {
        let checks: Vec<Check> = names.iter().map(|n| check_for(n, algorithm, quota)).collect();
        ViaStore { store: store.clone(), checks: checks.into() }
    }

    /// The algorithm's own script, with the KEYS and ARGV the store sends: read off the wire
    /// with `MONITOR` while the store decides one check (the library exposes no hook for
    /// it), then sent by `EVALSHA` for each name, the first name's key replaced by each.
    async fn via_script(
        ctl: &mut Ctl,
        store: &RedisStore,
        names: &[String],
        algorithm: Algorithm,
        quota: Quota,
    ) -> Result<ViaScript, Error> {
        use futures_util::StreamExt;
        let first = names.first().ok_or("no names")?;
        let mut seen = redis::Client::open(ctl.url.as_str())?.get_async_monitor().await?.into_on_message::<String>();
        store.check(&[check_for(first, algorithm, quota)]).await?;
        let args = loop {
            let line = seen.next().await.ok_or("MONITOR ended before the store's call")?;
            let args = monitor_args(&line);
            if args.first().is_some_and(|verb| verb.eq_ignore_ascii_case("evalsha")) {
                break args;
            }
        };
        let tag = format!("{{{first}}}");
        let cmds: Vec<redis::Cmd> = names
            .iter()
            .map(|n| {
                let mut cmd = redis::cmd("EVALSHA");
                for a in &args[1..] {
                    cmd.arg(a.replace(&tag, &format!("{{{n}}}")));
                }
                cmd
            })
            .collect();
        Ok(ViaScript { conn: ctl.connection().await?, cmds: cmds.into() })
    }

    /// The arguments of one `MONITOR` line (`1700000000.1 [0 127.0.0.1:5] "evalsha" "ab…"`),
    /// unquoted (`\"`, `\\` and `\xHH` escapes).
    fn monitor_args(line: &str) -> Vec<String> {
        let mut args = Vec::new();
        let mut chars = line.chars();
        while chars.by_ref().any(|c| c == '"') {
            let mut arg = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next() {
                        Some('x') => {
                            let hex: String = chars.by_ref().take(2).collect();
                            arg.push(char::from(u8::from_str_radix(&hex, 16).unwrap_or(b'?')));
                        }
                        Some('n') => arg.push('\n'),
                        Some('r') => arg.push('\r'),
                        Some('t') => arg.push('\t'),
                        Some(other) => arg.push(other),
                        None => {}
                    },
                    c => arg.push(c),
                }
            }
            args.push(arg);
        }
        args
    }

    /// Baseline (a): `INCR` + `PEXPIRE` by `EVALSHA`.
    async fn via_trivial(ctl: &mut Ctl, names: &[String]) -> Result<ViaScript, Error> {
        let sha: String = ctl.cmd(&["SCRIPT", "LOAD", TRIVIAL_LUA]).await?;
        let cmds: Vec<redis::Cmd> = names
            .iter()
            .map(|n| {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&sha).arg(1).arg(format!("trivial:{{{n}}}")).arg(60_000);
                cmd
            })
            .collect();
        Ok(ViaScript { conn: ctl.connection().await?, cmds: cmds.into() })
    }

    // ------------------------------------------------------------------------------
    // rate-limiter-flexible
    // ------------------------------------------------------------------------------

    struct Rlf {
        rate: f64,
        p50: f64,
        p99: f64,
        p999: f64,
        inside: f64,
    }

    fn json_number(json: &str, field: &str) -> Option<f64> {
        let at = json.find(&format!("\"{field}\":"))? + field.len() + 3;
        let rest = &json[at..];
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    }

    async fn rlf(ctl: &mut Ctl, script: &str, port: u16, decisions: usize) -> Result<Rlf, Error> {
        ctl.fresh().await?;
        let (script, port) = (script.to_owned(), port.to_string());
        let args =
            [port, W1_KEYS.to_string(), decisions.to_string(), IN_FLIGHT.to_string(), W1_QUOTA.limit().to_string()];
        let out =
            tokio::task::spawn_blocking(move || std::process::Command::new("node").arg(&script).args(args).output())
                .await??;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(
                format!("node failed ({}): {}{}", out.status, stdout, String::from_utf8_lossy(&out.stderr)).into()
            );
        }
        let field = |f: &str| json_number(&stdout, f).ok_or_else(|| format!("no {f:?} in the node output: {stdout}"));
        let (n, seconds) = (field("decisions")?, field("seconds")?);
        let info = stdout.split("\"commandstats\":\"").nth(1).unwrap_or_default().replace("\\r\\n", "\n");
        let (calls, inside) = split_stats(&parse_commandstats(&info));
        #[allow(clippy::cast_precision_loss)]
        let inside = if calls == 0 { f64::NAN } else { inside as f64 / n };
        Ok(Rlf { rate: n / seconds, p50: field("p50_us")?, p99: field("p99_us")?, p999: field("p999_us")?, inside })
    }

    // ------------------------------------------------------------------------------
    // The suite
    // ------------------------------------------------------------------------------

    struct W1Row {
        algorithm: Algorithm,
        /// Baseline (a) again, measured just before this algorithm's rows: the reference
        /// of their "× baseline (a)" (one measurement at the start of W1 had moved by a
        /// third in one run, and every ratio with it).
        baseline: Run,
        script: Run,
        store: Run,
        /// The layer on the default store (group commit on), and with batching off.
        layer: Run,
        unbatched: Run,
    }

    /// In flight in the sweep (W3), and how many decisions each measures.
    const SWEEP: [(usize, usize); 5] = [(2, 20_000), (4, 30_000), (8, 50_000), (64, 100_000), (1024, 200_000)];

    /// One algorithm at one in-flight count of the sweep: the layer with batching off and on.
    struct SweepRow {
        algorithm: Algorithm,
        in_flight: usize,
        unbatched: Run,
        batched: Run,
    }

    struct Sweep {
        /// Baseline (a) at each in-flight count.
        baseline: Vec<(usize, Run)>,
        rows: Vec<SweepRow>,
    }

    struct W2Row {
        algorithm: Algorithm,
        /// Cache off, cache on.
        runs: [Run; 2],
        expected: [Expected; 2],
    }

    /// What W2's accepted count must be.
    #[derive(Clone, Copy)]
    enum Expected {
        /// Exactly the limit.
        Exactly(usize),
        /// limit + ⌊elapsed / 60 ms⌋, ±1 for the phase of the refill at both ends.
        Refilled(usize),
        /// The policing leaky bucket: at most 1 + ⌊elapsed / 60 ms⌋ (+1 for the phase).
        AtMost(usize),
    }

    impl Expected {
        fn holds(self, accepted: usize) -> bool {
            match self {
                Expected::Exactly(n) => accepted == n,
                Expected::Refilled(n) => accepted.abs_diff(n) <= 1,
                Expected::AtMost(n) => accepted <= n + 1,
            }
        }

        fn show(self) -> String {
            match self {
                Expected::Exactly(n) => format!("= {n}"),
                Expected::Refilled(n) => format!("{n} ± 1"),
                Expected::AtMost(n) => format!("≤ {}", n + 1),
            }
        }
    }

    fn expected(algorithm: Algorithm, elapsed: Duration) -> Expected {
        #[allow(clippy::cast_possible_truncation)]
        let refills = (elapsed.as_micros() / W2_REFILL.as_micros()) as usize;
        let limit = usize::try_from(W2_QUOTA.limit()).unwrap_or(usize::MAX);
        match algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => Expected::Refilled(limit + refills),
            Algorithm::LeakyBucket => Expected::AtMost(1 + refills),
            _ => Expected::Exactly(limit),
        }
    }

    /// Waits, for an algorithm with aligned windows, until the current minute has room
    /// for a whole W2 run.
    async fn align_window(algorithm: Algorithm) {
        if !matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindowCounter) {
            return;
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let into = Duration::from_micros(u64::try_from(now.as_micros() % 60_000_000).unwrap_or(0));
        let left = Duration::from_secs(60) - into;
        if left < WINDOW_MARGIN {
            eprintln!("  waiting {:.1} s for the next minute's window", left.as_secs_f64());
            tokio::time::sleep(left + Duration::from_millis(50)).await;
        }
    }

    fn sequence(len: usize, keys: usize, offset: usize, seed: u64) -> Arc<[u32]> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| u32::try_from(offset + rng.random_range(0..keys)).expect("few keys")).collect()
    }

    fn algorithms(opts: &Options) -> Vec<Algorithm> {
        Algorithm::ALL.into_iter().filter(|a| opts.only.is_none_or(|o| o == *a)).collect()
    }

    async fn suite(server: &RedisServer, opts: &Options) -> Result<String, Error> {
        let (w1_n, w2_n) = if opts.quick { (20_000, 5_000) } else { (200_000, 50_000) };
        let url = server.url();
        let conn = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;
        let mut ctl = Ctl { conn, url: url.clone(), redis_pid: server.pid() };
        let store = match opts.max_batch {
            Some(n) => RedisStore::from_url(&url)?.max_batch(n)?,
            None => RedisStore::from_url(&url)?,
        };
        store.ping().await?;
        // The same store with group commit off: one script call per decision.
        let unbatched = RedisStore::from_url(&url)?.max_batch(1)?;
        unbatched.ping().await?;
        let started = Instant::now();

        // W1: keys 0..10,000 measured, 10,000..11,000 for the warm-ups.
        let w1_names: Vec<String> = (0..W1_KEYS + WARM_KEYS).map(key_name).collect();
        let w1_seq = sequence(w1_n, W1_KEYS, 0, SEED);
        let w1_warm = sequence(2_000, WARM_KEYS, W1_KEYS, SEED + 1);
        eprintln!("W1: {w1_n} decisions over {W1_KEYS} keys, {IN_FLIGHT} in flight");
        // W1 with a concurrency rule, on its own store (its calls are counted).
        let conc_alg = opts.only.unwrap_or_default();
        let conc = if opts.sweep_only.is_none() {
            eprintln!("W1 with a concurrency rule ({conc_alg}), {} runs", opts.conc_runs.max(1));
            let runs = opts.conc_runs.max(1);
            Some(conc::run(&mut ctl, &url, &w1_names, conc_alg, W1_QUOTA, &w1_warm, &w1_seq, runs).await?)
        } else {
            None
        };
        if opts.conc_only {
            let conc = conc.ok_or("--conc-only with --sweep-only")?;
            let mut s = format!(
                "\n## tollgate on Redis: W1 with a concurrency rule{}\n\nClient: tokio {}; redis-server {} on \
                 127.0.0.1; {} cores; run took {:.0} s.\n",
                if opts.quick { " (--quick)" } else { "" },
                if opts.threads <= 1 { "current-thread" } else { "multi-thread" },
                redis_version(),
                std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
                started.elapsed().as_secs_f64()
            );
            let targets = conc::report(&conc, &mut s);
            targets_table(&mut s, &targets);
            return Ok(s);
        }
        let trivial = via_trivial(&mut ctl, &w1_names).await?;
        let w1_a = measure(&mut ctl, &trivial, &w1_warm, &w1_seq).await?;
        eprintln!("  baseline (a): {:.0}/s", w1_a.rate());
        let mut w1 = Vec::new();
        let full = opts.sweep_only.is_none();
        for algorithm in algorithms(opts).into_iter().filter(|_| full) {
            let baseline = measure(&mut ctl, &trivial, &w1_warm, &w1_seq).await?;
            let script = via_script(&mut ctl, &store, &w1_names, algorithm, W1_QUOTA).await?;
            let script = measure(&mut ctl, &script, &w1_warm, &w1_seq).await?;
            let direct =
                measure(&mut ctl, &via_store(&store, &w1_names, algorithm, W1_QUOTA), &w1_warm, &w1_seq).await?;
            // The leaky bucket polices here and rejects most requests: without the cache
            // every decision reaches Redis, as with the script.
            let cache = algorithm != Algorithm::LeakyBucket;
            let layer = via_layer(&store, &w1_names, algorithm, W1_QUOTA, cache)?;
            let layer = measure(&mut ctl, &layer, &w1_warm, &w1_seq).await?;
            let plain = via_layer(&unbatched, &w1_names, algorithm, W1_QUOTA, cache)?;
            let plain = measure(&mut ctl, &plain, &w1_warm, &w1_seq).await?;
            eprintln!(
                "  {algorithm}: baseline (a) {:.0}/s, script {:.0}/s, store {:.0}/s, layer {:.0}/s, unbatched {:.0}/s",
                baseline.rate(),
                script.rate(),
                direct.rate(),
                layer.rate(),
                plain.rate()
            );
            w1.push(W1Row { algorithm, baseline, script, store: direct, layer, unbatched: plain });
        }

        // W3: W1's workload through the layer at several in-flight counts, batching off and on.
        eprintln!("W3: the layer at {:?} in flight", SWEEP.map(|(n, _)| n));
        let mut sweep_a = Vec::new();
        let mut sweep = Vec::new();
        for (n, decisions) in SWEEP.into_iter().filter(|(n, _)| opts.sweep_only.as_ref().is_none_or(|o| o.contains(n)))
        {
            let decisions = if opts.quick { decisions / 10 } else { decisions };
            let seq = sequence(decisions, W1_KEYS, 0, SEED + 2);
            let shape = Shape::of(n);
            sweep_a.push((n, measure_at(&mut ctl, &trivial, &w1_warm, &seq, shape).await?));
            for algorithm in algorithms(opts) {
                let cache = algorithm != Algorithm::LeakyBucket;
                let off = via_layer(&unbatched, &w1_names, algorithm, W1_QUOTA, cache)?;
                let off = measure_at(&mut ctl, &off, &w1_warm, &seq, shape).await?;
                let on = via_layer(&store, &w1_names, algorithm, W1_QUOTA, cache)?;
                let on = measure_at(&mut ctl, &on, &w1_warm, &seq, shape).await?;
                eprintln!("  {n} in flight, {algorithm}: off {:.0}/s, on {:.0}/s", off.rate(), on.rate());
                sweep.push(SweepRow { algorithm, in_flight: n, unbatched: off, batched: on });
            }
        }
        let rlf = match opts.rlf.as_ref().filter(|_| full) {
            Some(path) => {
                let r = rlf(&mut ctl, path, server.port(), w1_n).await?;
                eprintln!("  rate-limiter-flexible: {:.0}/s", r.rate);
                Some(r)
            }
            None => None,
        };

        // W2: key 0 measured, key 1 for the warm-ups.
        let w2_names = vec!["hot".to_owned(), "warm".to_owned()];
        let w2_seq: Arc<[u32]> = vec![0; w2_n].into();
        let w2_warm: Arc<[u32]> = vec![1; 500].into();
        eprintln!("W2: {w2_n} decisions on one key");
        let trivial = via_trivial(&mut ctl, &w2_names).await?;
        let w2_a = measure(&mut ctl, &trivial, &w2_warm, &w2_seq).await?;
        eprintln!("  baseline (a): {:.0}/s", w2_a.rate());
        let mut w2 = Vec::new();
        for algorithm in algorithms(opts).into_iter().filter(|_| full) {
            let mut runs = Vec::new();
            for cache in [false, true] {
                align_window(algorithm).await;
                // A new layer each time: its cache starts empty.
                let layer = via_layer(&store, &w2_names, algorithm, W2_QUOTA, cache)?;
                runs.push(measure(&mut ctl, &layer, &w2_warm, &w2_seq).await?);
            }
            let runs: [Run; 2] = runs.try_into().map_err(|_| "two runs")?;
            let expected = [expected(algorithm, runs[0].elapsed), expected(algorithm, runs[1].elapsed)];
            eprintln!(
                "  {algorithm}: cache off {:.0}/s ({} accepted), on {:.0}/s ({} accepted)",
                runs[0].rate(),
                runs[0].accepted,
                runs[1].rate(),
                runs[1].accepted
            );
            w2.push(W2Row { algorithm, runs, expected });
        }
        let took = started.elapsed();
        let sweep = Sweep { baseline: sweep_a, rows: sweep };
        let mut s = report(opts, w1_n, w2_n, &w1_a, &w1, rlf.as_ref(), &w2_a, &w2, &sweep, took);
        if let Some(conc) = &conc {
            let targets = conc::report(conc, &mut s);
            targets_table(&mut s, &targets);
        }
        Ok(s)
    }

    /// A list of targets with PASS or FAIL.
    fn targets_table(s: &mut String, targets: &[(String, String, bool)]) {
        let _ = writeln!(s, "\n| target | measured | |\n|---|---|---|");
        for (name, value, ok) in targets {
            let _ = writeln!(s, "| {name} | {value} | {} |", verdict(*ok));
        }
    }

    // ------------------------------------------------------------------------------
    // The report
    // ------------------------------------------------------------------------------

    fn verdict(ok: bool) -> &'static str {
        if ok {
            "PASS"
        } else {
            "FAIL"
        }
    }

    fn latency_cells(r: &Run) -> String {
        format!("{:.0} | {:.0} | {:.0}", r.quantile_us(0.5), r.quantile_us(0.99), r.quantile_us(0.999))
    }

    #[allow(clippy::too_many_arguments, clippy::too_many_lines)]
    fn report(
        opts: &Options,
        w1_n: usize,
        w2_n: usize,
        w1_a: &Run,
        w1: &[W1Row],
        rlf: Option<&Rlf>,
        w2_a: &Run,
        w2: &[W2Row],
        sweep: &Sweep,
        took: Duration,
    ) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n## tollgate on Redis: {IN_FLIGHT} in flight, one multiplexed connection{}\n",
            if opts.quick { " (--quick)" } else { "" }
        );
        let _ = writeln!(
            s,
            "Client: tokio {}, {} worker thread(s); redis-server {} on 127.0.0.1; {} cores; run took {:.0} s.\n",
            if opts.threads <= 1 { "current-thread" } else { "multi-thread" },
            opts.threads.max(1),
            redis_version(),
            std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            took.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "### W1: {W1_KEYS} keys uniformly at random (seed {SEED}), {W1_QUOTA} per key, {w1_n} decisions\n"
        );
        let _ = writeln!(
            s,
            "| path | algorithm | decisions/s | × script (b) | × baseline (a) | p50 µs | p99 µs | p999 µs | accepted | \
             EVALSHA / decision | commands in script / decision | client CPU µs / decision | \
             Redis CPU µs / decision | decisions / Redis read | errors |"
        );
        let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        // `a`: the baseline (a) the row is compared with (its algorithm's adjacent one).
        let row = |s: &mut String, path: &str, alg: &str, r: &Run, a: &Run, b: Option<&Run>| {
            let _ = writeln!(
                s,
                "| {path} | {alg} | {:.0} | {} | {:.2} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {} |",
                r.rate(),
                b.map_or("—".to_owned(), |b| format!("{:.2}", r.rate() / b.rate())),
                r.rate() / a.rate(),
                latency_cells(r),
                r.accepted,
                r.per_decision(r.calls),
                r.per_decision(r.inside),
                r.cpu_us().0,
                r.cpu_us().1,
                r.batch(),
                r.failed
            );
        };
        row(&mut s, "(a) INCR+PEXPIRE script", "—", w1_a, w1_a, None);
        for w in w1 {
            let (alg, a) = (w.algorithm.name(), &w.baseline);
            row(&mut s, "(a) again, the reference of the rows below", "—", a, w1_a, None);
            row(&mut s, "(b) script by EVALSHA", alg, &w.script, a, None);
            row(&mut s, "`Store::check_one`", alg, &w.store, a, Some(&w.script));
            let path = if w.algorithm == Algorithm::LeakyBucket { "layer (cache off)" } else { "layer" };
            row(&mut s, path, alg, &w.layer, a, Some(&w.script));
            let path = if w.algorithm == Algorithm::LeakyBucket {
                "layer, batching off (cache off)"
            } else {
                "layer, batching off"
            };
            row(&mut s, path, alg, &w.unbatched, a, Some(&w.script));
        }
        match rlf {
            Some(r) => {
                let _ = writeln!(
                    s,
                    "| rate-limiter-flexible (Node, ioredis) | fixed window | {:.0} | — | {:.2} | {:.0} | {:.0} | {:.0} | \
                     — | 1.00 | {:.2} | — | — | — | — |",
                    r.rate,
                    r.rate / w1_a.rate(),
                    r.p50,
                    r.p99,
                    r.p999,
                    r.inside
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "| rate-limiter-flexible | fixed window | {:.0}–{:.0} (quoted, not this run) | | | | | | | | | | | | |",
                    RLF_QUOTED.0,
                    RLF_QUOTED.1
                );
            }
        }

        let _ = writeln!(s, "\n### W2: one key, {W2_QUOTA}, {w2_n} decisions, through the layer\n");
        let _ = writeln!(
            s,
            "| algorithm | local cache | decisions/s | × baseline (a) | p50 µs | p99 µs | p999 µs | accepted | expected | \
             EVALSHA / decision | commands in script / decision | client CPU µs / decision | \
             Redis CPU µs / decision | errors |"
        );
        let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        let _ = writeln!(
            s,
            "| (a) INCR+PEXPIRE script | — | {:.0} | 1.00 | {} | — | — | {:.2} | {:.2} | {:.1} | {:.1} | {} |",
            w2_a.rate(),
            latency_cells(w2_a),
            w2_a.per_decision(w2_a.calls),
            w2_a.per_decision(w2_a.inside),
            w2_a.cpu_us().0,
            w2_a.cpu_us().1,
            w2_a.failed
        );
        for w in w2 {
            for (i, r) in w.runs.iter().enumerate() {
                let e = w.expected[i];
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.2} | {} | {} | {} {} | {:.3} | {:.2} | {:.1} | {:.1} | {} |",
                    w.algorithm.name(),
                    if i == 1 { "on" } else { "off" },
                    r.rate(),
                    r.rate() / w2_a.rate(),
                    latency_cells(r),
                    r.accepted,
                    e.show(),
                    verdict(e.holds(r.accepted)),
                    r.per_decision(r.calls),
                    r.per_decision(r.inside),
                    r.cpu_us().0,
                    r.cpu_us().1,
                    r.failed
                );
            }
        }

        let _ = writeln!(
            s,
            "\n### W3: W1's workload through the layer by decisions in flight, group commit off and on\n\n\
             Up to 64 in flight: one task per call; 1,024: 4 tasks of 256 calls each. CPU % is the \
             share of one core the client process and redis-server used during the row: the side \
             near 100% limits.\n"
        );
        let _ = writeln!(
            s,
            "| algorithm | in flight | batching | decisions/s | × (a) at this in-flight | × batching off | p50 µs | \
             p99 µs | p999 µs | EVALSHA / decision | client CPU µs / decision | Redis CPU µs / decision | \
             client CPU % | Redis CPU % | errors |"
        );
        let _ = writeln!(s, "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        let sweep_row = |s: &mut String, alg: &str, n: usize, mode: &str, r: &Run, a: &Run, off: Option<&Run>| {
            let _ = writeln!(
                s,
                "| {alg} | {n} | {mode} | {:.0} | {:.2} | {} | {} | {:.3} | {:.1} | {:.1} | {:.0} | {:.0} | {} |",
                r.rate(),
                r.rate() / a.rate(),
                off.map_or("—".to_owned(), |o| format!("{:.2}", r.rate() / o.rate())),
                latency_cells(r),
                r.per_decision(r.calls),
                r.cpu_us().0,
                r.cpu_us().1,
                r.cpu_share().0,
                r.cpu_share().1,
                r.failed
            );
        };
        for (n, a) in &sweep.baseline {
            sweep_row(&mut s, "(a) INCR+PEXPIRE script", *n, "—", a, a, None);
            for r in sweep.rows.iter().filter(|r| r.in_flight == *n) {
                sweep_row(&mut s, r.algorithm.name(), *n, "off", &r.unbatched, a, None);
                sweep_row(&mut s, r.algorithm.name(), *n, "on", &r.batched, a, Some(&r.unbatched));
            }
        }

        // Targets.
        let mut t = Vec::<(String, String, bool)>::new();
        for w in w1.iter().filter(|w| w.algorithm != Algorithm::SlidingWindowLog) {
            let ratio = w.layer.rate() / w.baseline.rate();
            let want = if w.algorithm == Algorithm::Gcra { 0.8 } else { 0.7 };
            t.push((
                format!("W1 {}: layer (group commit) ≥ {want}× baseline (a), measured just before", w.algorithm),
                format!("{:.0} / {:.0} = {ratio:.2}×", w.layer.rate(), w.baseline.rate()),
                ratio >= want,
            ));
        }
        if let (Some(g), Some(r)) = (w1.iter().find(|w| w.algorithm == Algorithm::Gcra), rlf) {
            let ratio = g.layer.rate() / r.rate;
            t.push((
                "W1 gcra: layer (group commit) ≥ 1.7× rate-limiter-flexible".to_owned(),
                format!("{:.0} / {:.0} = {ratio:.2}×", g.layer.rate(), r.rate),
                ratio >= 1.7,
            ));
        }
        for r in &sweep.rows {
            let (on, off) = (&r.batched, &r.unbatched);
            let (p50, p99) = (on.quantile_us(0.5) / off.quantile_us(0.5), on.quantile_us(0.99) / off.quantile_us(0.99));
            if r.in_flight <= 8 {
                t.push((
                    format!("W3 {} at {} in flight: p50 and p99 within 10% of batching off", r.algorithm, r.in_flight),
                    format!("p50 {p50:.2}×, p99 {p99:.2}×"),
                    p50 <= 1.1 && p99 <= 1.1,
                ));
            } else if r.in_flight == 64 {
                t.push((
                    format!("W3 {} at 64 in flight: p99 no worse than batching off", r.algorithm),
                    format!("p99 {p99:.2}×"),
                    p99 <= 1.0,
                ));
            }
            t.push((
                format!("W3 {} at {} in flight: throughput no worse than batching off", r.algorithm, r.in_flight),
                format!("{:.2}×", on.rate() / off.rate()),
                on.rate() >= off.rate(),
            ));
        }
        for w in w1 {
            let ratio = w.layer.rate() / w.script.rate();
            t.push((
                format!("W1 {}: layer ≥ 0.9× its script", w.algorithm),
                format!("{:.0} / {:.0} = {ratio:.2}×", w.layer.rate(), w.script.rate()),
                ratio >= 0.9,
            ));
        }
        for w in w1.iter().filter(|w| w.algorithm != Algorithm::SlidingWindowLog) {
            let n = w.script.per_decision(w.script.inside);
            // The token bucket reads an existing key's TTL too (a tier of a longer period
            // keeps its state): one command more on keys seen before.
            let most = if w.algorithm == Algorithm::TokenBucket { 4 } else { 3 };
            t.push((
                format!("W1 {}: script ≤ {most} commands / decision (TIME included, EVALSHA not)", w.algorithm),
                format!("{n:.2}"),
                n <= f64::from(most),
            ));
        }
        if let Some(g) = w1.iter().find(|w| w.algorithm == Algorithm::Gcra) {
            let ratio = g.layer.rate() / g.baseline.rate();
            t.push((
                "W1 gcra: layer ≥ 0.4× baseline (a)".to_owned(),
                format!("{:.0} / {:.0} = {ratio:.2}×", g.layer.rate(), g.baseline.rate()),
                ratio >= 0.4,
            ));
        }
        let a99 = w1_a.quantile_us(0.99);
        for w in w1 {
            let p99 = w.layer.quantile_us(0.99);
            t.push((
                format!("W1 {}: layer p99 ≤ 2× baseline (a) p99", w.algorithm),
                format!("{p99:.0} µs vs 2 × {a99:.0} µs = {:.2}×", p99 / a99),
                p99 <= 2.0 * a99,
            ));
        }
        for w in w2 {
            let on = &w.runs[1];
            let ratio = on.rate() / w2_a.rate();
            let counts = w.expected[0].holds(w.runs[0].accepted) && w.expected[1].holds(on.accepted);
            t.push((
                format!("W2 {}: cache on ≥ 3× baseline (a), accepted count as without it", w.algorithm),
                format!(
                    "{:.0} / {:.0} = {ratio:.1}×; accepted {} (off: {})",
                    on.rate(),
                    w2_a.rate(),
                    on.accepted,
                    w.runs[0].accepted
                ),
                ratio >= 3.0 && counts,
            ));
        }
        if let Some(fw) = w1.iter().find(|w| w.algorithm == Algorithm::FixedWindow) {
            let (theirs, how) = match rlf {
                Some(r) => (r.rate, "measured in this run"),
                None => (RLF_QUOTED.1, "quoted 27–32k/s, NOT measured in this run; against 32k"),
            };
            let ratio = fw.layer.rate() / theirs;
            t.push((
                "W1 fixed window: layer ≥ 1.5× rate-limiter-flexible".to_owned(),
                format!("{:.0} / {theirs:.0} = {ratio:.2}× ({how})", fw.layer.rate()),
                ratio >= 1.5,
            ));
        }
        let failed: usize = w1
            .iter()
            .map(|w| w.baseline.failed + w.script.failed + w.store.failed + w.layer.failed + w.unbatched.failed)
            .sum::<usize>()
            + sweep.rows.iter().map(|r| r.batched.failed + r.unbatched.failed).sum::<usize>()
            + w2.iter().flat_map(|w| &w.runs).map(|r| r.failed).sum::<usize>()
            + w1_a.failed
            + w2_a.failed;
        t.push(("no decision failed (timeout, store error)".to_owned(), format!("{failed} failed"), failed == 0));

        let _ = writeln!(s, "\n### Targets\n");
        let _ = writeln!(s, "| target | measured | |");
        let _ = writeln!(s, "|---|---|---|");
        for (what, measured, ok) in &t {
            let _ = writeln!(s, "| {what} | {measured} | {} |", verdict(*ok));
        }
        let missed = t.iter().filter(|(_, _, ok)| !ok).count();
        let _ = writeln!(s, "\n{} of {} targets met.", t.len() - missed, t.len());
        s
    }

    fn redis_version() -> String {
        std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                out.split_whitespace().find_map(|w| w.strip_prefix("v=").map(str::to_owned))
            })
            .unwrap_or_else(|| "?".to_owned())
    }
}
