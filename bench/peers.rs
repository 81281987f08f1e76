//! tollgate on Redis beside its peers, in one command (issue 41, item 1).
//!
//! ```text
//! cargo run --release -p tollgate-bench --example peers -- [--runs N] [--only SUBSTRING] [--quick]
//! ```
//!
//! It starts its own `redis-server`s on free 127.0.0.1 ports (the harness of
//! `tests/support/redis.rs`: killed by PID when dropped, also while a panic unwinds, and by
//! a watchdog when this process is killed), pins them to CPU 0 and itself to CPU 1 with
//! `taskset` when the machine has two CPUs or more, and measures, on a current-thread tokio
//! client with 64 decisions in flight:
//!
//! - **W1**: 10,000 keys drawn uniformly from a fixed seed (printed), 100 per 60 s with a
//!   burst of 100, 200,000 decisions; **W2**: one key, 1,000 per 60 s, 50,000 decisions.
//! - **(a)**: one `EVALSHA` of `INCR` + `PEXPIRE` a decision, written here with redis-rs
//!   (64 in flight on one multiplexed connection, which pipelines them).
//! - **redis-cell** 0.2.2 (native GCRA): its crates.io source downloaded into
//!   `<target>/peers/redis-cell`, built with `cargo rustc --release --lib --crate-type
//!   cdylib`, loaded into a second `redis-server --loadmodule`; `CL.THROTTLE <key> 99 100 60 1`
//!   (W1) and `CL.THROTTLE <key> 999 1000 60 1` (W2).
//! - **tollgate**, every algorithm, three ways: through the HTTP layer (a `RateLimitLayer`
//!   over a trivial service, called in process with `ready().call()`, the key in
//!   `x-api-key`), through the store (`RedisStore` `Store::check_one`), and through
//!   `Limiter::check_key` (the layer's limiter). The leaky bucket runs as a policer
//!   (`max_delay` 0, the blocked-key cache off): as a shaper the layer would sleep until each
//!   request's slot, which measures the quota, not the limiter. The limiter's store deadline
//!   is 1 s (default 50 ms) and the store's response timeout 1 s (default 100 ms), so that a slow batch on a loaded machine is measured, not
//!   refused by the fail mode and the circuit breaker; the table counts failed decisions.
//! - **rate-limiter-flexible** (`RateLimiterRedis`, a fixed window, Node and ioredis) when
//!   `node` is on the PATH: `bench/rlf` copied into `<target>/peers/rlf`, `npm install` there
//!   when its `node_modules` is missing.
//!
//! A peer that cannot run is said in one line (and in the table), never skipped silently.
//! (a) and redis-cell are the anchors of the ratios: each is measured at the start and at
//! the end of each workload of each run (the two pooled), and always run, whatever `--only`.
//!
//! Per row: decisions/s; the ratio to (a) and to redis-cell in the same run; the client's
//! CPU µs a decision (this process's threads, `/proc/self/task/*/schedstat`, over the row);
//! Redis's CPU µs a decision from `INFO commandstats` `usec` deltas (a script's or a
//! transaction's own commands are inside its `usec`, so where `EVAL*`/`FCALL*`/`EXEC` ran
//! only theirs are summed), and the whole `redis-server` process's (its schedstat, which
//! includes reading and writing sockets); Redis commands a decision (`calls` deltas, a
//! script's inner commands included). Each row starts on an empty Redis (`FLUSHALL`,
//! `CONFIG RESETSTAT`) after a warm-up on other keys. One JSON line a row a run on stdout,
//! then a markdown table of min–median–max over the runs. `--quick`: 20,000 and 5,000
//! decisions. `--only SUBSTRING`: only the rows whose name holds it (plus the anchors).

#[path = "../tests/support/mod.rs"]
mod support;

fn main() {
    if let Err(e) = run::main() {
        eprintln!("peers failed: {e}");
        std::process::exit(1);
    }
}

mod run {
    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::fmt::Write as _;
    use std::future::Future;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use axum::body::Body;
    use http::{HeaderValue, Request, Response, StatusCode};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use redis::aio::MultiplexedConnection;
    use redis::Value;
    use tollgate::key::{self, Key};
    use tollgate::store::{Check, Params, Store};
    use tollgate::{Algorithm, FailMode, HttpLimiter, Quota, RateLimitLayer, RedisStore, Rule};
    use tower::{Layer, Service, ServiceExt};

    use crate::support::redis::RedisServer;

    type Error = Box<dyn std::error::Error + Send + Sync>;

    const IN_FLIGHT: usize = 64;
    const W1_KEYS: usize = 10_000;
    const SEED: u64 = 42;
    const HEADER: &str = "x-api-key";
    const RULE: &str = "peers";
    const WARM_KEYS: usize = 1_000;
    const REDIS_CELL: &str = "0.2.2";
    const TRIVIAL_LUA: &str =
        "local n = redis.call('INCR', KEYS[1])\nredis.call('PEXPIRE', KEYS[1], ARGV[1])\nreturn n\n";

    struct Options {
        runs: usize,
        only: Option<String>,
        quick: bool,
    }

    fn options() -> Result<Options, Error> {
        let mut o = Options { runs: 3, only: None, quick: false };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--runs" => o.runs = args.next().ok_or("--runs needs a number")?.parse::<usize>()?.max(1),
                "--only" => o.only = Some(args.next().ok_or("--only needs a substring of a row's name")?),
                "--quick" => o.quick = true,
                other => return Err(format!("unknown argument {other:?}; see the top of bench/peers.rs").into()),
            }
        }
        Ok(o)
    }

    // ------------------------------------------------------------------------------
    // The workloads
    // ------------------------------------------------------------------------------

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Workload {
        W1,
        W2,
    }

    impl Workload {
        fn name(self) -> &'static str {
            match self {
                Workload::W1 => "W1",
                Workload::W2 => "W2",
            }
        }

        fn quota(self) -> Quota {
            match self {
                Workload::W1 => Quota::per_minute(100).burst(100),
                Workload::W2 => Quota::per_minute(1_000),
            }
        }

        /// `CL.THROTTLE`'s max burst (the burst less one) and count per period.
        fn cell_args(self) -> (u32, u32) {
            match self {
                Workload::W1 => (99, 100),
                Workload::W2 => (999, 1_000),
            }
        }

        fn decisions(self, quick: bool) -> usize {
            match (self, quick) {
                (Workload::W1, false) => 200_000,
                (Workload::W1, true) => 20_000,
                (Workload::W2, false) => 50_000,
                (Workload::W2, true) => 5_000,
            }
        }

        /// The key names (measured ones first, then the warm-up's), the measured sequence
        /// and the warm-up's, as indexes into the names.
        fn plan(self, quick: bool) -> Plan {
            let n = self.decisions(quick);
            match self {
                Workload::W1 => {
                    let names = (0..W1_KEYS + WARM_KEYS)
                        .map(|i| if i < W1_KEYS { format!("user-{i}") } else { format!("warm-{i}") })
                        .collect();
                    (names, sequence(n, W1_KEYS, 0, SEED), sequence(2_000, WARM_KEYS, W1_KEYS, SEED + 1))
                }
                Workload::W2 => {
                    (vec!["hot".to_owned(), "warm".to_owned()].into(), vec![0; n].into(), vec![1; 500].into())
                }
            }
        }
    }

    /// Key names, the measured sequence, the warm-up's.
    type Plan = (Arc<[String]>, Arc<[u32]>, Arc<[u32]>);

    fn sequence(len: usize, keys: usize, offset: usize, seed: u64) -> Arc<[u32]> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| u32::try_from(offset + rng.random_range(0..keys)).expect("few keys")).collect()
    }

    // ------------------------------------------------------------------------------
    // What one decision is, for each row
    // ------------------------------------------------------------------------------

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Accepted,
        Rejected,
        Failed,
    }

    trait Target: Clone + Send + 'static {
        fn call(&mut self, k: usize) -> impl Future<Output = Outcome> + Send;
    }

    /// A prepared command per key on a bare multiplexed connection: (a)'s `EVALSHA`, or
    /// redis-cell's `CL.THROTTLE`.
    #[derive(Clone)]
    struct ViaCommand {
        conn: MultiplexedConnection,
        cmds: Arc<[redis::Cmd]>,
    }

    impl Target for ViaCommand {
        async fn call(&mut self, k: usize) -> Outcome {
            match self.cmds[k].query_async::<Value>(&mut self.conn).await {
                // (a): the counter.
                Ok(Value::Int(_)) => Outcome::Accepted,
                // CL.THROTTLE: [limited (0 or 1), limit, remaining, retry after, reset after].
                Ok(Value::Array(v)) if v.first() == Some(&Value::Int(0)) => Outcome::Accepted,
                Ok(Value::Array(_)) => Outcome::Rejected,
                _ => Outcome::Failed,
            }
        }
    }

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
                StatusCode::TOO_MANY_REQUESTS => Outcome::Rejected,
                _ => Outcome::Failed,
            }
        }
    }

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

    #[derive(Clone)]
    struct ViaKey {
        limiter: Arc<HttpLimiter<RedisStore>>,
        keys: Arc<[Key]>,
    }

    impl Target for ViaKey {
        async fn call(&mut self, k: usize) -> Outcome {
            let verdict = self.limiter.check_key(RULE, self.keys[k].clone(), 1).await;
            if verdict.store_error().is_some() {
                Outcome::Failed
            } else if verdict.is_allowed() {
                Outcome::Accepted
            } else {
                Outcome::Rejected
            }
        }
    }

    async fn caller<T: Target>(mut target: T, seq: Arc<[u32]>, next: Arc<AtomicUsize>) -> (usize, usize) {
        let (mut accepted, mut failed) = (0, 0);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&k) = seq.get(i) else { break };
            let outcome = target.call(k as usize).await;
            accepted += usize::from(outcome == Outcome::Accepted);
            failed += usize::from(outcome == Outcome::Failed);
            // A decision from the local cache completes without waiting: yield now and
            // then, or this loop would starve the task that reads Redis's replies.
            tokio::task::consume_budget().await;
        }
        (accepted, failed)
    }

    /// `seq` with 64 callers in flight: (elapsed, accepted, failed).
    async fn drive<T: Target>(target: &T, seq: &Arc<[u32]>) -> (Duration, usize, usize) {
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let tasks: Vec<_> =
            (0..IN_FLIGHT).map(|_| tokio::spawn(caller(target.clone(), seq.clone(), next.clone()))).collect();
        let (mut accepted, mut failed) = (0, 0);
        for t in tasks {
            let (a, f) = t.await.expect("a load task panicked");
            accepted += a;
            failed += f;
        }
        (started.elapsed(), accepted, failed)
    }

    // ------------------------------------------------------------------------------
    // Measuring
    // ------------------------------------------------------------------------------

    /// What one row measured (or two pooled, for an anchor).
    #[derive(Clone, Copy, Default)]
    struct Sample {
        decisions: usize,
        seconds: f64,
        accepted: usize,
        failed: usize,
        /// CPU ns of this process; `None` where the client is another process (Node).
        client_ns: Option<u64>,
        redis_ns: u64,
        /// `INFO commandstats` deltas: calls and `usec` (see [`stats_of`]).
        calls: u64,
        usec: u64,
    }

    #[allow(clippy::cast_precision_loss)]
    impl Sample {
        fn rate(&self) -> f64 {
            self.decisions as f64 / self.seconds
        }

        fn per(&self, n: u64) -> f64 {
            n as f64 / self.decisions as f64
        }

        fn pooled(self, other: Sample) -> Sample {
            Sample {
                decisions: self.decisions + other.decisions,
                seconds: self.seconds + other.seconds,
                accepted: self.accepted + other.accepted,
                failed: self.failed + other.failed,
                client_ns: self.client_ns.zip(other.client_ns).map(|(a, b)| a + b),
                redis_ns: self.redis_ns + other.redis_ns,
                calls: self.calls + other.calls,
                usec: self.usec + other.usec,
            }
        }
    }

    /// One Redis seen from the side.
    struct Ctl {
        conn: MultiplexedConnection,
        url: String,
        pid: u32,
        port: u16,
    }

    impl Ctl {
        async fn of(server: &RedisServer) -> Result<Ctl, Error> {
            let url = server.url();
            let conn = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;
            Ok(Ctl { conn, url, pid: server.pid(), port: server.port() })
        }

        async fn cmd<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> Result<T, Error> {
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            Ok(cmd.query_async(&mut self.conn).await?)
        }

        async fn fresh(&mut self) -> Result<(), Error> {
            self.cmd::<()>(&["FLUSHALL"]).await?;
            self.cmd::<()>(&["CONFIG", "RESETSTAT"]).await
        }

        async fn connection(&self) -> Result<MultiplexedConnection, Error> {
            Ok(redis::Client::open(self.url.as_str())?.get_multiplexed_async_connection().await?)
        }

        /// Warm-up on `warm`, an empty Redis, then `seq` measured.
        async fn measure<T: Target>(
            &mut self,
            target: &T,
            warm: &Arc<[u32]>,
            seq: &Arc<[u32]>,
        ) -> Result<Sample, Error> {
            drive(target, warm).await;
            self.fresh().await?;
            let (client, redis) = (cpu_ns("self"), cpu_ns(&self.pid.to_string()));
            let (elapsed, accepted, failed) = drive(target, seq).await;
            let client = cpu_ns("self").saturating_sub(client);
            let redis = cpu_ns(&self.pid.to_string()).saturating_sub(redis);
            let info: String = self.cmd(&["INFO", "commandstats"]).await?;
            let (calls, usec) = stats_of(&info);
            Ok(Sample {
                decisions: seq.len(),
                seconds: elapsed.as_secs_f64(),
                accepted,
                failed,
                client_ns: Some(client),
                redis_ns: redis,
                calls,
                usec,
            })
        }
    }

    /// CPU time of every thread of process `pid` (`self` for this one), ns.
    fn cpu_ns(pid: &str) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// Commands of the measuring itself, not of the decisions.
    const OWN: [&str; 5] = ["info", "config|resetstat", "flushall", "ping", "client|setinfo"];
    /// Commands whose `usec` holds the commands they run.
    const CONTAINERS: [&str; 7] = ["eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "exec"];

    /// `INFO commandstats` → (calls of every command, inner ones included; Redis's µs:
    /// the containers' `usec` where any ran, else every command's).
    fn stats_of(info: &str) -> (u64, u64) {
        let stats: BTreeMap<String, (u64, u64)> = info
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |f: &str| rest.split(',').find_map(|kv| kv.strip_prefix(f))?.parse::<u64>().ok();
                Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
            })
            .filter(|(name, _)| !OWN.contains(&name.as_str()))
            .collect();
        let calls = stats.values().map(|v| v.0).sum();
        let contained = stats.keys().any(|k| CONTAINERS.contains(&k.as_str()));
        let usec = stats.iter().filter(|(k, _)| !contained || CONTAINERS.contains(&k.as_str())).map(|(_, v)| v.1).sum();
        (calls, usec)
    }

    // ------------------------------------------------------------------------------
    // The peers: redis-cell, rate-limiter-flexible
    // ------------------------------------------------------------------------------

    /// The target directory (this program is `<target>/release/examples/peers`; a copy
    /// elsewhere uses `./target`), absolute: redis-server runs in a directory of its own.
    fn target_dir() -> PathBuf {
        let exe = std::env::current_exe().ok();
        let dir = exe.as_deref().and_then(|exe| exe.ancestors().nth(3)).filter(|d| d.join("release/examples").is_dir());
        match dir {
            Some(dir) => dir.to_path_buf(),
            None => std::env::current_dir().map_or_else(|_| PathBuf::from("target"), |cwd| cwd.join("target")),
        }
    }

    fn run_ok(cmd: &mut Command, what: &str) -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: cannot run: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        Err(format!("{what} failed ({}): {last}", out.status))
    }

    /// redis-cell's module, downloaded and built once (kept under the target directory).
    fn redis_cell() -> Result<PathBuf, String> {
        let dir = target_dir().join("peers").join("redis-cell");
        let lib = dir.join("target/release/libredis_cell.so");
        if lib.exists() {
            return Ok(lib);
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let src = dir.join(format!("redis-cell-{REDIS_CELL}"));
        if !src.join("Cargo.toml").exists() {
            eprintln!("redis-cell: downloading {REDIS_CELL} from crates.io");
            // static.crates.io is where crates.io's download API redirects to.
            let url = format!("https://static.crates.io/crates/redis-cell/redis-cell-{REDIS_CELL}.crate");
            let crate_file = dir.join("redis-cell.crate");
            run_ok(Command::new("curl").args(["-sSfL", "-o"]).arg(&crate_file).arg(&url), "curl")?;
            run_ok(Command::new("tar").arg("xzf").arg(&crate_file).arg("-C").arg(&dir), "tar")?;
        }
        // A workspace of its own: under this repository's `target/` cargo would take it for a
        // member of the repository's workspace, and refuse to build it.
        let manifest = src.join("Cargo.toml");
        let text =
            std::fs::read_to_string(&manifest).map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
        if !text.lines().any(|l| l.trim() == "[workspace]") {
            std::fs::write(&manifest, format!("{text}\n[workspace]\n"))
                .map_err(|e| format!("cannot write {}: {e}", manifest.display()))?;
        }
        eprintln!("redis-cell: cargo rustc --release --lib --crate-type cdylib");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        run_ok(
            Command::new(cargo)
                .args(["rustc", "--release", "--lib", "--crate-type", "cdylib"])
                .current_dir(&src)
                .env("CARGO_TARGET_DIR", dir.join("target")),
            "cargo rustc (redis-cell)",
        )?;
        if lib.exists() {
            Ok(lib)
        } else {
            Err(format!("the build made no {}", lib.display()))
        }
    }

    /// rate-limiter-flexible's driver (`bench/rlf`), copied under the target directory with
    /// its `node_modules` (kept outside the repository).
    fn rlf_script() -> Result<PathBuf, String> {
        if Command::new("node").arg("--version").output().is_err() {
            return Err("node is not on the PATH".to_owned());
        }
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("rlf");
        let dir = target_dir().join("peers").join("rlf");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        for f in ["bench.js", "package.json"] {
            std::fs::copy(from.join(f), dir.join(f)).map_err(|e| format!("cannot copy bench/rlf/{f}: {e}"))?;
        }
        if !dir.join("node_modules").exists() {
            eprintln!("rate-limiter-flexible: npm install in {}", dir.display());
            run_ok(Command::new("npm").args(["install", "--no-audit", "--no-fund"]).current_dir(&dir), "npm install")?;
        }
        Ok(dir.join("bench.js"))
    }

    fn json_number(json: &str, field: &str) -> Option<f64> {
        let at = json.find(&format!("\"{field}\":"))? + field.len() + 3;
        let rest = &json[at..];
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    }

    /// rate-limiter-flexible on `ctl`'s Redis: its script times itself and reads Redis's
    /// `INFO commandstats` (after its own `CONFIG RESETSTAT`, after its warm-up).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    async fn rlf(ctl: &mut Ctl, script: &Path, w: Workload, quick: bool) -> Result<Sample, Error> {
        ctl.fresh().await?;
        let decisions = w.decisions(quick);
        let keys = if w == Workload::W1 { W1_KEYS } else { 1 };
        let args = [
            ctl.port.to_string(),
            keys.to_string(),
            decisions.to_string(),
            IN_FLIGHT.to_string(),
            w.quota().limit().to_string(),
        ];
        let redis = cpu_ns(&ctl.pid.to_string());
        let script = script.to_owned();
        let out = tokio::task::spawn_blocking(move || Command::new("node").arg(&script).args(args).output()).await??;
        let redis = cpu_ns(&ctl.pid.to_string()).saturating_sub(redis);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(
                format!("node failed ({}): {stdout}{}", out.status, String::from_utf8_lossy(&out.stderr)).into()
            );
        }
        let field = |f: &str| json_number(&stdout, f).ok_or_else(|| format!("no {f:?} in the node output: {stdout}"));
        let info = stdout.split("\"commandstats\":\"").nth(1).unwrap_or_default().replace("\\r\\n", "\n");
        let (calls, usec) = stats_of(&info);
        Ok(Sample {
            decisions: field("decisions")? as usize,
            seconds: field("seconds")?,
            accepted: field("accepted")? as usize,
            failed: field("errors")? as usize,
            client_ns: None,
            // The whole node run (its warm-up of 200 calls too): a little over.
            redis_ns: redis,
            calls,
            usec,
        })
    }

    // ------------------------------------------------------------------------------
    // tollgate's rows
    // ------------------------------------------------------------------------------

    #[derive(Clone, Copy)]
    enum Way {
        Layer,
        Store,
        CheckKey,
    }

    impl Way {
        const ALL: [Way; 3] = [Way::Layer, Way::Store, Way::CheckKey];

        fn name(self) -> &'static str {
            match self {
                Way::Layer => "layer",
                Way::Store => "store",
                Way::CheckKey => "check_key",
            }
        }
    }

    fn max_delay(algorithm: Algorithm) -> Duration {
        if algorithm == Algorithm::LeakyBucket {
            Duration::ZERO // a policer: see the module docs
        } else {
            Duration::from_secs(10)
        }
    }

    fn layer(store: &RedisStore, algorithm: Algorithm, quota: Quota) -> Result<RateLimitLayer<RedisStore>, Error> {
        Ok(RateLimitLayer::builder(store.clone())
            .add_rule(Rule::new(RULE, quota, key::header(HEADER)).algorithm(algorithm).max_delay(max_delay(algorithm)))
            .fail_mode(FailMode::Closed)
            // A store call's deadline of 1 s, not the default 50 ms: on a loaded machine a
            // batch of log decisions passed 50 ms, and the layer failed closed and opened its
            // circuit, which measures the breaker, not the limiter.
            .timeout(Duration::from_secs(1))
            // The policing leaky bucket rejects most requests: with the cache they would
            // not reach Redis.
            .local_cache(algorithm != Algorithm::LeakyBucket)
            .build()?)
    }

    #[allow(clippy::too_many_arguments)]
    async fn tollgate_row(
        ctl: &mut Ctl,
        store: &RedisStore,
        way: Way,
        algorithm: Algorithm,
        w: Workload,
        names: &[String],
        warm: &Arc<[u32]>,
        seq: &Arc<[u32]>,
    ) -> Result<Sample, Error> {
        let quota = w.quota();
        match way {
            Way::Layer => {
                let inner = tower::service_fn(|_req: Request<Body>| async {
                    Ok::<_, Infallible>(Response::new(Body::empty()))
                });
                let keys = names.iter().map(|n| HeaderValue::from_str(n)).collect::<Result<Vec<_>, _>>()?;
                let target = ViaLayer { svc: layer(store, algorithm, quota)?.layer(inner), keys: keys.into() };
                ctl.measure(&target, warm, seq).await
            }
            Way::Store => {
                let mut params = Params::new(quota);
                params.max_delay_us = u64::try_from(max_delay(algorithm).as_micros()).unwrap_or(u64::MAX);
                let checks: Vec<Check> = names
                    .iter()
                    .map(|n| Check { rule: RULE.into(), key: Key::from(n.as_str()), algorithm, params })
                    .collect();
                ctl.measure(&ViaStore { store: store.clone(), checks: checks.into() }, warm, seq).await
            }
            Way::CheckKey => {
                let limiter = layer(store, algorithm, quota)?.limiter().clone();
                let keys: Vec<Key> = names.iter().map(|n| Key::from(n.as_str())).collect();
                ctl.measure(&ViaKey { limiter, keys: keys.into() }, warm, seq).await
            }
        }
    }

    // ------------------------------------------------------------------------------
    // The suite
    // ------------------------------------------------------------------------------

    const ROW_A: &str = "(a) EVALSHA INCR+PEXPIRE (redis-rs)";
    const ROW_CELL: &str = "redis-cell CL.THROTTLE (native GCRA)";
    const ROW_RLF: &str = "rate-limiter-flexible fixed window (Node)";

    fn row_name(way: Way, algorithm: Algorithm) -> String {
        let policer = if algorithm == Algorithm::LeakyBucket { " (policer, cache off)" } else { "" };
        format!("tollgate {}: {}{policer}", way.name(), algorithm.name())
    }

    /// A row's sample, its ratio to (a) and to redis-cell.
    type Measured = (Sample, f64, Option<f64>);

    /// Every row's samples, by (workload, row), in the order first measured.
    #[derive(Default)]
    struct Results {
        order: Vec<(Workload, String)>,
        samples: BTreeMap<(&'static str, String), Vec<Measured>>,
    }

    impl Results {
        fn add(&mut self, run: usize, w: Workload, row: &str, s: Sample, a: &Sample, cell: Option<&Sample>) {
            let vs_a = s.rate() / a.rate();
            let vs_cell = cell.map(|c| s.rate() / c.rate());
            let num = |x: Option<f64>| x.map_or("null".to_owned(), |x| format!("{x:.4}"));
            println!(
                "{{\"run\":{run},\"workload\":\"{}\",\"row\":\"{row}\",\"seed\":{SEED},\"decisions\":{},\"seconds\":{:.4},\
                 \"decisions_per_s\":{:.0},\"vs_a\":{vs_a:.4},\"vs_redis_cell\":{},\"accepted\":{},\"failed\":{},\
                 \"client_cpu_us\":{},\"redis_cpu_us\":{:.4},\"redis_process_cpu_us\":{:.4},\"redis_commands\":{:.4}}}",
                w.name(),
                s.decisions,
                s.seconds,
                s.rate(),
                num(vs_cell),
                s.accepted,
                s.failed,
                num(s.client_ns.map(|n| s.per(n) / 1000.0)),
                s.per(s.usec),
                s.per(s.redis_ns) / 1000.0,
                s.per(s.calls),
            );
            let id = (w.name(), row.to_owned());
            if !self.samples.contains_key(&id) {
                self.order.push((w, row.to_owned()));
            }
            self.samples.entry(id).or_default().push((s, vs_a, vs_cell));
        }
    }

    struct Peers<'a> {
        main: Ctl,
        cell: Option<Ctl>,
        rlf: Result<&'a Path, &'a str>,
    }

    async fn one_run(
        run: usize,
        opts: &Options,
        peers: &mut Peers<'_>,
        store: &RedisStore,
        results: &mut Results,
    ) -> Result<(), Error> {
        let wanted = |row: &str| opts.only.as_ref().is_none_or(|o| row.contains(o.as_str()));
        for w in [Workload::W1, Workload::W2] {
            let (names, seq, warm) = w.plan(opts.quick);
            eprintln!("run {run}, {}: {} decisions", w.name(), seq.len());
            // The anchors, before.
            let sha: String = peers.main.cmd(&["SCRIPT", "LOAD", TRIVIAL_LUA]).await?;
            let a_cmds: Vec<redis::Cmd> = names
                .iter()
                .map(|n| {
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(&sha).arg(1).arg(format!("trivial:{{{n}}}")).arg(60_000);
                    cmd
                })
                .collect();
            let a = ViaCommand { conn: peers.main.connection().await?, cmds: a_cmds.into() };
            let a_before = peers.main.measure(&a, &warm, &seq).await?;
            let cell = match &mut peers.cell {
                Some(ctl) => {
                    let (burst, count) = w.cell_args();
                    let cmds: Vec<redis::Cmd> = names
                        .iter()
                        .map(|n| {
                            let mut cmd = redis::cmd("CL.THROTTLE");
                            cmd.arg(n).arg(burst).arg(count).arg(60).arg(1);
                            cmd
                        })
                        .collect();
                    let target = ViaCommand { conn: ctl.connection().await?, cmds: cmds.into() };
                    Some((ctl.measure(&target, &warm, &seq).await?, target))
                }
                None => None,
            };
            let mut rows: Vec<(String, Sample)> = Vec::new();
            for algorithm in Algorithm::ALL {
                for way in Way::ALL {
                    let row = row_name(way, algorithm);
                    if !wanted(&row) {
                        continue;
                    }
                    let s = tollgate_row(&mut peers.main, store, way, algorithm, w, &names, &warm, &seq).await?;
                    eprintln!("  {row}: {:.0}/s", s.rate());
                    rows.push((row, s));
                }
            }
            if wanted(ROW_RLF) {
                if let Ok(script) = peers.rlf {
                    let s = rlf(&mut peers.main, script, w, opts.quick).await?;
                    eprintln!("  {ROW_RLF}: {:.0}/s", s.rate());
                    rows.push((ROW_RLF.to_owned(), s));
                }
            }
            // The anchors, after; each pooled with its first measurement.
            let a = a_before.pooled(peers.main.measure(&a, &warm, &seq).await?);
            let cell = match (cell, &mut peers.cell) {
                (Some((before, target)), Some(ctl)) => Some(before.pooled(ctl.measure(&target, &warm, &seq).await?)),
                _ => None,
            };
            eprintln!(
                "  (a): {:.0}/s; redis-cell: {}",
                a.rate(),
                cell.map_or("—".to_owned(), |c| format!("{:.0}/s", c.rate()))
            );
            results.add(run, w, ROW_A, a, &a, cell.as_ref());
            if let Some(c) = &cell {
                results.add(run, w, ROW_CELL, *c, &a, cell.as_ref());
            }
            for (row, s) in rows {
                results.add(run, w, &row, s, &a, cell.as_ref());
            }
        }
        Ok(())
    }

    /// Pins every thread of `pid` to `cpu` with `taskset`.
    fn pin(pid: u32, cpu: usize) -> Result<(), String> {
        run_ok(Command::new("taskset").args(["-a", "-pc", &cpu.to_string(), &pid.to_string()]), "taskset")
    }

    pub(crate) fn main() -> Result<(), Error> {
        let opts = options()?;
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let mut notes: Vec<String> = Vec::new();
        // Pinned before the runtime starts: every thread made later inherits it.
        let pinned = cpus >= 2 && {
            match pin(std::process::id(), 1) {
                Ok(()) => true,
                Err(e) => {
                    notes.push(format!("not pinned: {e}"));
                    false
                }
            }
        };
        if cpus < 2 {
            notes.push(format!("not pinned: {cpus} CPU(s) (redis-server and the client share them)"));
        }
        let cell_lib = redis_cell();
        let rlf = rlf_script();
        let main_server = RedisServer::start();
        let cell_server = cell_lib
            .as_ref()
            .ok()
            .map(|lib| RedisServer::builder().args(&["--loadmodule", &lib.to_string_lossy()]).start());
        if pinned {
            for s in std::iter::once(&main_server).chain(cell_server.as_ref()) {
                pin(s.pid(), 0)?;
            }
            notes.push("redis-server(s) pinned to CPU 0, this client (and node) to CPU 1 (taskset)".to_owned());
        }
        if let Err(e) = &cell_lib {
            notes.push(format!("redis-cell {REDIS_CELL}: skipped: {e}"));
        }
        if let Err(e) = &rlf {
            notes.push(format!("rate-limiter-flexible: skipped: {e}"));
        }
        notes.push(
            "leaky_bucket: run as a policer (max_delay 0, the blocked-key cache off); as a shaper the layer would \
             sleep until each slot, which measures the quota, not the limiter"
                .to_owned(),
        );
        for n in &notes {
            eprintln!("{n}");
        }
        eprintln!("seed {SEED}; {} run(s)", opts.runs);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let results = runtime.block_on(async {
            let mut peers = Peers {
                main: Ctl::of(&main_server).await?,
                cell: match &cell_server {
                    Some(s) => Some(Ctl::of(s).await?),
                    None => None,
                },
                rlf: rlf.as_deref().map_err(String::as_str),
            };
            // Redis's answer may take 1 s (default 100 ms), as the limiter's deadline: see `layer`.
            let store = RedisStore::from_url(&main_server.url())?.response_timeout(Duration::from_secs(1));
            store.ping().await?;
            let mut results = Results::default();
            for run in 1..=opts.runs {
                one_run(run, &opts, &mut peers, &store, &mut results).await?;
            }
            Ok::<_, Error>(results)
        })?;
        runtime.shutdown_timeout(Duration::from_secs(1));
        print!("{}", table(&opts, &results, &notes));
        drop(cell_server);
        drop(main_server);
        Ok(())
    }

    // ------------------------------------------------------------------------------
    // The table
    // ------------------------------------------------------------------------------

    fn sorted(mut xs: Vec<f64>) -> Vec<f64> {
        xs.sort_by(f64::total_cmp);
        xs
    }

    /// min–median–max.
    fn spread(xs: Vec<f64>, digits: usize) -> String {
        let xs = sorted(xs);
        if xs.is_empty() {
            return "—".to_owned();
        }
        let at = |i: usize| format!("{:.*}", digits, xs[i]);
        if xs.len() == 1 {
            return at(0);
        }
        format!("{}–{}–{}", at(0), at(xs.len() / 2), at(xs.len() - 1))
    }

    fn median(xs: Vec<f64>, digits: usize) -> String {
        let xs = sorted(xs);
        xs.get(xs.len() / 2).map_or("—".to_owned(), |m| format!("{m:.*}", digits))
    }

    #[allow(clippy::cast_precision_loss)]
    fn table(opts: &Options, results: &Results, notes: &[String]) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n## Redis peers: {IN_FLIGHT} in flight, current-thread client, redis-server {}{}\n",
            redis_version(),
            if opts.quick { " (--quick)" } else { "" }
        );
        let _ = writeln!(
            s,
            "W1: {W1_KEYS} keys uniform from seed {SEED}, 100 per 60 s with a burst of 100, {} decisions. \
             W2: one key, 1,000 per 60 s, {} decisions. min–median–max of {} run(s); ratios are within each run; \
             CPU and commands are medians.\n",
            Workload::W1.decisions(opts.quick),
            Workload::W2.decisions(opts.quick),
            opts.runs
        );
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
        for w in [Workload::W1, Workload::W2] {
            let _ = writeln!(
                s,
                "\n| {} | decisions/s | ÷ (a) | ÷ redis-cell | accepted | failed | client CPU µs/decision | \
                 Redis CPU µs/decision (commandstats) | redis-server CPU µs/decision | Redis commands/decision |",
                w.name()
            );
            let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            for (_, row) in results.order.iter().filter(|(x, _)| *x == w) {
                let v = &results.samples[&(w.name(), row.clone())];
                let col = |f: &dyn Fn(&Measured) -> Option<f64>| -> Vec<f64> { v.iter().filter_map(f).collect() };
                let _ = writeln!(
                    s,
                    "| {row} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    spread(col(&|x| Some(x.0.rate())), 0),
                    spread(col(&|x| Some(x.1)), 2),
                    spread(col(&|x| x.2), 2),
                    median(col(&|x| Some(x.0.accepted as f64 / (x.0.decisions / w.decisions(opts.quick)) as f64)), 0),
                    spread(col(&|x| Some(x.0.failed as f64)), 0),
                    median(col(&|x| x.0.client_ns.map(|n| x.0.per(n) / 1000.0)), 2),
                    median(col(&|x| Some(x.0.per(x.0.usec))), 2),
                    median(col(&|x| Some(x.0.per(x.0.redis_ns) / 1000.0)), 2),
                    median(col(&|x| Some(x.0.per(x.0.calls))), 2),
                );
            }
        }
        let _ = writeln!(
            s,
            "\n`cargo run --release -p tollgate-bench --example peers --{}{}{}`",
            format_args!(" --runs {}", opts.runs),
            opts.only.as_ref().map_or(String::new(), |o| format!(" --only {o:?}")),
            if opts.quick { " --quick" } else { "" }
        );
        s
    }

    fn redis_version() -> String {
        Command::new("redis-server")
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
