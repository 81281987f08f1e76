//! Quota slices (issue 39) measured on one hot key shared by three servers: the limit
//! held in every window, what Redis does per decision, the quota left unused, the share of
//! decisions a slice answers and its latency, and fairness between the servers.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example slices -- [--quick] [--runs N]
//!     [--windows N] [--only fixed|counter|gcra|tb|buckets] [--out FILE.md] [--plot FILE.svg]
//!     [--no-faults | --faults-only] [--timeout-ms N]
//! ```
//!
//! `--quick --runs 1` takes about 4 minutes, the default (30 windows, 3 runs) about 40.
//!
//! The parent starts one `redis-server` on a free 127.0.0.1 port (the test harness of
//! `tests/support/redis.rs`, whose watchdog kills it even when this process is killed),
//! pinned to CPU 0 with `taskset` when the machine has 2 CPUs or more; the servers are
//! pinned to the others. For each cell it re-executes itself three times (`--child …`, an
//! argument list not meant for people): three OS processes, each a server with its own
//! `RedisStore` and a `RateLimitLayer` of one rule `hot` (`Quota::per_second(10_000)`,
//! L = 10,000 a window of W = 1 s, key `key::Global`: one hot key), the cell's algorithm
//! and `LimiterBuilder::slices(on|off)`, over a handler that records each admission.
//!
//! Each server drives its layer with an open-loop Poisson generator (exponential gaps from
//! a seeded ChaCha8 RNG, on a thread of its own; every arrival is a task spawned at its
//! time on a one-worker tokio runtime, never waiting for earlier answers, fired at once
//! when behind; the thread sleeps at least 200 µs and then fires all that fell due, so
//! that the three servers on one CPU are not woken once per arrival). The tables show the
//! servers' CPU time, in % of one core. All three start on the same whole second (a Unix time they are given),
//! run one warm-up window that is not counted, then `--windows` windows (default 30,
//! `--quick` 5). A server reports how many arrivals it fired more than 1 ms after their
//! time; the tables show the largest share of the three ("late %"), flagged "BEHIND"
//! over 1 % (the generator could not keep its schedule: a busy CPU, not the limiter).
//!
//! The handler, before it answers, appends (Unix µs now, `reset_after` µs, decided by
//! slice or store, in-process latency) to a buffer that a thread writes to the server's
//! record file every 50 ms (a killed server loses at most its last 50 ms: an undercount of
//! admissions). The latency runs from just before `call` to the handler's first line. An
//! admission's window is exact, from the store's clock: the fixed window's `reset_after` is
//! the time to its window's end, so window = round((now + reset_after) / W) − 1; the
//! sliding window counter's is 2W − e, so window = round((now + reset_after − W) / W) − 1.
//! How many admissions this puts in another window than floor(now / W) is shown per cell
//! ("attr. off"): only a few near the boundaries when the attribution is right.
//!
//! Cells: algorithm (fixed window, sliding window counter) × load (50, 100, 200 % of L)
//! × split (uniform, 80 % on one server and 10 % on each other) × slices (off, on), each
//! run `--runs` times (default 3), the tables giving min–median–max over runs. Before
//! each cell: `FLUSHALL`; at the start of its first counted window `CONFIG RESETSTAT`; at
//! its end `INFO commandstats` (every command, those inside scripts included, less the
//! parent's own INFO, CONFIG, FLUSHALL). Per cell:
//!
//! - **violations**: windows in which the three servers admitted more than L together;
//! - **store calls / decision**: EVALSHA + EVAL ÷ arrivals; **Redis commands / decision**:
//!   every command counted (EVALSHA and what the scripts ran) ÷ arrivals; **script µs /
//!   decision**: the EVALSHA + EVAL `usec` (which includes the commands they ran; the
//!   literal sum of every command's `usec` counts those twice and is in the JSON as
//!   `usec_all_per_decision`); **Redis CPU µs / decision**: redis-server's CPU time;
//! - **shortfall** (100 % and 200 %): per window, (min(arrivals, L) − admitted) ÷ L, the
//!   worst window and the median (slightly negative when a window admits arrivals of the
//!   end of the one before, which the store decided after its turn);
//! - **slice share** of the allowed decisions, p50 / p99 latency of slice decisions, p99
//!   of all allowed decisions;
//! - **fairness** (200 %): each server's admitted ÷ its arrivals, the largest distance from
//!   their mean ÷ the mean.
//!
//! Then a probe (one server, fixed window, slices on, 1,000 arrivals in one window) whose
//! whole commandstats is printed, and two fault cells (slices on, fixed window, 100 %
//! uniform, 10 windows): one server `kill -9`ed 3.4 s into the cell (0.4 s into a window),
//! and one stopped (`kill -STOP`) for 300 ms from the same moment, then continued. Both
//! must show zero violations. `--plot FILE.svg` draws admitted per window and EVALSHA per
//! second of the first fixed-window 200 % uniform cells, slices off and on. One JSON line
//! per cell run is printed as it ends, then the markdown tables (also to `--out`). The
//! exit status is 1 when a cell failed (a server died, a fault cell went over L), else 0.
//!
//! The store's deadline (`LimiterBuilder::timeout` and `RedisStore::response_timeout`) is
//! 500 ms here, not the library's 50 ms: on a shared 2-core machine a niced run's Redis or
//! server misses 50 ms now and then, and its refusals (fail closed, then the circuit open
//! for a second) would show as shortfall of the limiter; `--timeout-ms 50` measures with
//! the default. Decisions that failed all the same are a column and a warning.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{SystemTime, UNIX_EPOCH};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The quota: L units a window of W.
const L: u64 = 10_000;
const W_US: u64 = 1_000_000;
const RULE: &str = "hot";
/// One record of an admission: Unix µs, `reset_after` µs (a bucket's: the decision's
/// reading of the store's clock, `Decision::decided_at_micros`), decided by, latency ns.
const RECORD_BYTES: usize = 32;
/// `decided by` in a record.
const BY_STORE: u64 = 0;
const BY_SLICE: u64 = 1;
const BY_OTHER: u64 = 2;

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Whether `alg` is a bucket (GCRA, the token bucket): rate `L` a second, burst `L`, whose
/// bound is checked on the admissions' stamps, not per window.
fn is_bucket(alg: &str) -> bool {
    matches!(alg, "gcra" | "tb")
}

fn algorithm(name: &str) -> Result<tollgate::Algorithm, Error> {
    match name {
        "fixed" => Ok(tollgate::Algorithm::FixedWindow),
        "counter" => Ok(tollgate::Algorithm::SlidingWindowCounter),
        "gcra" => Ok(tollgate::Algorithm::Gcra),
        "tb" => Ok(tollgate::Algorithm::TokenBucket),
        other => Err(format!("unknown algorithm {other:?}: fixed, counter, gcra or tb").into()),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result =
        if args.first().map(String::as_str) == Some("--child") { child::main(&args[1..]) } else { parent::main(&args) };
    if let Err(e) = result {
        eprintln!("slices failed: {e}");
        std::process::exit(1);
    }
}

/// One server: a layer over Redis driven by an open-loop Poisson generator.
mod child {
    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::fs::File;
    use std::io::{BufWriter, Write};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use axum::body::Body;
    use http::{Request, Response, StatusCode};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use tollgate::verdict::DecidedBy;
    use tollgate::{key, Decision, FailMode, Quota, RateLimitLayer, RedisStore, Rule};
    use tower::{Layer, Service, ServiceExt};

    use super::{algorithm, is_bucket, unix_us, Error, BY_OTHER, BY_SLICE, BY_STORE, L, RULE, W_US};

    /// The generator's shortest sleep.
    const QUANTUM: Duration = Duration::from_micros(200);

    /// CPU time of every thread of this process so far, ns.
    fn cpu_ns() -> u64 {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// When the request was handed to the layer.
    #[derive(Clone, Copy)]
    struct Start(Instant);

    type Sink = Arc<Mutex<Vec<[u64; 4]>>>;

    /// allowed, rejected, failed, in flight
    #[derive(Default)]
    struct Counts([AtomicU64; 4]);

    /// `--child URL fixed|counter on|off RATE RUN_US SEED RECORDS START_UNIX_US TIMEOUT_MS`
    pub(crate) fn main(a: &[String]) -> Result<(), Error> {
        let [url, alg, slices, rate, run_us, seed, path, start_us, timeout_ms] = a else {
            return Err("--child URL ALG on|off RATE RUN_US SEED RECORDS START_US TIMEOUT_MS".into());
        };
        let algorithm = algorithm(alg)?;
        let bucket = is_bucket(alg);
        let on = match slices.as_str() {
            "on" => true,
            "off" => false,
            other => return Err(format!("slices {other:?}: on or off").into()),
        };
        let rate: f64 = rate.parse()?;
        let run_us: u64 = run_us.parse()?;
        let seed: u64 = seed.parse()?;
        let start_us: u64 = start_us.parse()?;
        let timeout = Duration::from_millis(timeout_ms.parse()?);

        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let guard = rt.enter();
        let sink: Sink = Arc::new(Mutex::new(Vec::with_capacity(1 << 16)));
        let inner = {
            let sink = sink.clone();
            tower::service_fn(move |req: Request<Body>| {
                let latency = req
                    .extensions()
                    .get::<Start>()
                    .map_or(u64::MAX, |s| u64::try_from(s.0.elapsed().as_nanos()).unwrap_or(u64::MAX));
                let now = unix_us();
                let (reset, allowed) = req.extensions().get::<Decision>().map_or((u64::MAX, true), |d| {
                    let reset = u64::try_from(d.reset_after().as_micros()).unwrap_or(u64::MAX);
                    (if bucket { d.decided_at_micros() } else { reset }, d.allowed)
                });
                let by = match req.extensions().get::<Decision>().map(Decision::decided_by) {
                    Some(DecidedBy::Store) => BY_STORE,
                    Some(DecidedBy::Slice) => BY_SLICE,
                    _ => BY_OTHER,
                };
                // A decision that is not allowed cannot reach here with FailMode::Closed;
                // if it did, it is recorded as decided by "other" and shows in the tables.
                let by = if allowed { by } else { BY_OTHER };
                sink.lock().expect("the record buffer").push([now, reset, by, latency]);
                std::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
            })
        };
        let store = RedisStore::from_url(url)?.response_timeout(timeout);
        let svc = RateLimitLayer::builder(store)
            .add_rule(Rule::new(RULE, Quota::per_second(L), key::Global).algorithm(algorithm))
            .slices(on)
            // A store error answers 503 and is counted as failed, never admitted.
            .fail_mode(FailMode::Closed)
            .timeout(timeout)
            .build()?
            .layer(inner);
        drop(guard);

        // The record file, written every 50 ms.
        let stop = Arc::new(AtomicBool::new(false));
        let flusher = {
            let (sink, stop) = (sink.clone(), stop.clone());
            let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
            std::thread::spawn(move || -> std::io::Result<()> {
                loop {
                    let done = stop.load(Ordering::Acquire);
                    let batch = std::mem::take(&mut *sink.lock().expect("the record buffer"));
                    for r in batch {
                        for v in r {
                            out.write_all(&v.to_le_bytes())?;
                        }
                    }
                    out.flush()?;
                    if done {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };

        // Wait for the common start (a Unix time: the servers share the host's clock).
        let now = unix_us();
        if now > start_us {
            eprintln!("started {} µs after the common start", now - start_us);
        }
        let start = Instant::now() + Duration::from_micros(start_us.saturating_sub(now));
        std::thread::sleep(start.saturating_duration_since(Instant::now()));

        let counts = Arc::new(Counts::default());
        let handle = rt.handle().clone();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut arrivals = BTreeMap::<u64, u64>::new();
        let (mut t, mut n, mut late, mut max_lag) = (0.0_f64, 0_u64, 0_u64, Duration::ZERO);
        let cpu0 = cpu_ns();
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        loop {
            let u: f64 = rng.random();
            t += -(1.0 - u).ln() * 1e6 / rate;
            if t >= run_us as f64 {
                break;
            }
            let off = t as u64;
            let due = start + Duration::from_micros(off);
            let now = Instant::now();
            if due > now {
                // At least a quantum: arrivals close together go out on one wake-up (each
                // wake-up is a context switch on a CPU the three servers share).
                std::thread::sleep((due - now).max(QUANTUM));
            }
            let lag = Instant::now().saturating_duration_since(due);
            late += u64::from(lag > Duration::from_millis(1));
            max_lag = max_lag.max(lag);
            n += 1;
            *arrivals.entry((start_us + off) / W_US).or_default() += 1;
            let (mut svc, counts) = (svc.clone(), counts.clone());
            counts.0[3].fetch_add(1, Ordering::Relaxed);
            handle.spawn(async move {
                let Ok(s) = svc.ready().await;
                let mut req = Request::new(Body::empty());
                req.extensions_mut().insert(Start(Instant::now()));
                let Ok(res) = s.call(req).await;
                let i = match res.status() {
                    StatusCode::OK => 0,
                    StatusCode::TOO_MANY_REQUESTS => 1,
                    _ => 2,
                };
                counts.0[i].fetch_add(1, Ordering::Relaxed);
                counts.0[3].fetch_sub(1, Ordering::Relaxed);
            });
        }
        let cpu = cpu_ns().saturating_sub(cpu0);
        let drain = Instant::now() + Duration::from_secs(10);
        while counts.0[3].load(Ordering::Relaxed) > 0 && Instant::now() < drain {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Release);
        flusher.join().map_err(|_| "the record writer panicked")??;
        let mut out = std::io::stdout().lock();
        for (w, c) in &arrivals {
            writeln!(out, "arrivals {w} {c}")?;
        }
        let c = |i: usize| counts.0[i].load(Ordering::Relaxed);
        writeln!(out, "summary {n} {} {} {} {} {late} {} {cpu}", c(0), c(1), c(2), c(3), max_lag.as_micros())?;
        out.flush()?;
        drop(svc);
        rt.shutdown_timeout(Duration::from_secs(1));
        Ok(())
    }
}

/// The driver: Redis, the cells, the servers, the tables.
mod parent {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    use std::io::{BufRead, BufReader};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use super::support::redis::RedisServer;
    use super::{is_bucket, unix_us, Error, BY_OTHER, BY_SLICE, L, RECORD_BYTES, W_US};

    struct Options {
        quick: bool,
        runs: usize,
        windows: u64,
        only: Option<String>,
        out: Option<String>,
        plot: Option<String>,
        faults: bool,
        /// Only the probe and the fault cells.
        faults_only: bool,
        /// The store's deadline (the layer's and the connection's), ms.
        timeout_ms: u64,
    }

    fn options(args: &[String]) -> Result<Options, Error> {
        let mut o = Options {
            quick: false,
            runs: 3,
            windows: 0,
            only: None,
            out: None,
            plot: None,
            faults: true,
            faults_only: false,
            timeout_ms: 500,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |what: &str| it.next().cloned().ok_or_else(|| format!("{a} needs {what}"));
            match a.as_str() {
                "--quick" => o.quick = true,
                "--runs" => o.runs = value("a number")?.parse()?,
                "--windows" => o.windows = value("a number")?.parse()?,
                "--only" => {
                    let v = value("fixed, counter, gcra, tb or buckets")?;
                    if v != "buckets" {
                        super::algorithm(&v)?;
                    }
                    o.only = Some(v);
                }
                "--out" => o.out = Some(value("a file name")?),
                "--plot" => o.plot = Some(value("a file name")?),
                "--no-faults" => o.faults = false,
                "--faults-only" => o.faults_only = true,
                "--timeout-ms" => o.timeout_ms = value("a number of ms")?.parse()?,
                other => return Err(format!("unknown argument {other:?}; see the top of bench/slices.rs").into()),
            }
        }
        if o.windows == 0 {
            o.windows = if o.quick { 5 } else { 30 };
        }
        o.runs = o.runs.max(1);
        Ok(o)
    }

    // ------------------------------------------------------------------------------
    // Redis from the side
    // ------------------------------------------------------------------------------

    struct Ctx {
        server: RedisServer,
        conn: redis::Connection,
        exe: PathBuf,
        /// `taskset -c` list of the servers, when pinned.
        child_cpus: Option<String>,
        dir: PathBuf,
        timeout_ms: u64,
    }

    /// Commands of the measuring itself, not of the decisions. (The parent's connection is
    /// made once, before any cell: its `CLIENT SETINFO` is not in a cell's counts; the
    /// servers' are, with their heartbeats, as Redis work of the limiter.)
    const OWN: [&str; 3] = ["info", "config|resetstat", "flushall"];

    impl Ctx {
        fn cmd(&mut self, args: &[&str]) -> Result<String, Error> {
            let mut c = redis::cmd(args[0]);
            for a in &args[1..] {
                c.arg(*a);
            }
            let v: redis::Value = c.query(&mut self.conn)?;
            Ok(match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                redis::Value::VerbatimString { text, .. } => text,
                redis::Value::SimpleString(s) => s,
                other => format!("{other:?}"),
            })
        }

        /// `INFO commandstats`: command → (calls, usec), less the parent's own commands.
        fn commandstats(&mut self) -> Result<BTreeMap<String, (u64, u64)>, Error> {
            let info = self.cmd(&["INFO", "commandstats"])?;
            Ok(info
                .lines()
                .filter_map(|l| {
                    let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                    let field = |k: &str| rest.split(',').find_map(|kv| kv.strip_prefix(k)?.parse::<u64>().ok());
                    Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
                })
                .filter(|(name, _)| !OWN.contains(&name.as_str()))
                .collect())
        }

        fn redis_cpu_ns(&self) -> u64 {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.server.pid())) else { return 0 };
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        }
    }

    fn evalsha(stats: &BTreeMap<String, (u64, u64)>) -> (u64, u64) {
        let get = |k: &str| stats.get(k).copied().unwrap_or((0, 0));
        let (a, b) = (get("evalsha"), get("eval"));
        (a.0 + b.0, a.1 + b.1)
    }

    // ------------------------------------------------------------------------------
    // One cell
    // ------------------------------------------------------------------------------

    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
    enum Split {
        Uniform,
        Hot,
    }

    impl Split {
        fn shares(self) -> [f64; 3] {
            match self {
                Split::Uniform => [1.0 / 3.0; 3],
                Split::Hot => [0.8, 0.1, 0.1],
            }
        }
        fn name(self) -> &'static str {
            match self {
                Split::Uniform => "uniform",
                Split::Hot => "80/10/10",
            }
        }
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Fault {
        Kill,
        Stop,
    }

    #[derive(Clone)]
    struct Spec {
        alg: &'static str,
        load: u64,
        split: Split,
        slices: bool,
        windows: u64,
        run: usize,
        fault: Option<Fault>,
        /// Arrivals per second of each server.
        rates: Vec<f64>,
        label: String,
    }

    impl Spec {
        #[allow(clippy::cast_precision_loss)]
        fn new(alg: &'static str, load: u64, split: Split, slices: bool, windows: u64, run: usize) -> Self {
            let total = L as f64 * load as f64 / 100.0;
            let rates = split.shares().iter().map(|s| s * total).collect();
            let label =
                format!("{} {load}% {} slices {}", alg_name(alg), split.name(), if slices { "on" } else { "off" });
            Spec { alg, load, split, slices, windows, run, fault: None, rates, label }
        }
    }

    fn alg_name(alg: &str) -> &'static str {
        match alg {
            "fixed" => "fixed window",
            "gcra" => "GCRA",
            "tb" => "token bucket",
            _ => "sliding window counter",
        }
    }

    /// What a server reported at its end.
    #[derive(Default, Clone, Copy)]
    struct Summary {
        arrivals: u64,
        allowed: u64,
        rejected: u64,
        failed: u64,
        late: u64,
        max_lag_us: u64,
        /// CPU time of the server during its run, ns.
        cpu_ns: u64,
    }

    /// What one cell run measured.
    struct Raw {
        /// The first counted window (Unix seconds).
        first: u64,
        records: Vec<Vec<[u64; 4]>>,
        arrivals: Vec<BTreeMap<u64, u64>>,
        summaries: Vec<Option<Summary>>,
        stats: BTreeMap<String, (u64, u64)>,
        /// EVALSHA + EVAL calls in each counted window.
        calls_per_window: Vec<u64>,
        redis_cpu_ns: u64,
        killed: Option<usize>,
    }

    /// The servers of a cell, killed if the cell ends early.
    struct Servers(Vec<Server>);

    /// A server process, the thread reading its stdout, the thread forwarding its stderr.
    type Server = (Child, Option<JoinHandle<Vec<String>>>, Option<JoinHandle<()>>);

    impl Drop for Servers {
        fn drop(&mut self) {
            for (c, _, _) in &mut self.0 {
                if matches!(c.try_wait(), Ok(None)) {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
    }

    fn signal(pid: u32, sig: &str) -> Result<(), Error> {
        let st = Command::new("kill").arg(sig).arg(pid.to_string()).status()?;
        if st.success() {
            Ok(())
        } else {
            Err(format!("kill {sig} {pid}: {st}").into())
        }
    }

    fn sleep_until_unix(us: u64) {
        let now = unix_us();
        if us > now {
            std::thread::sleep(Duration::from_micros(us - now));
        }
    }

    #[allow(clippy::too_many_lines)]
    fn run_cell(ctx: &mut Ctx, spec: &Spec, seed: u64) -> Result<Raw, Error> {
        ctx.cmd(&["FLUSHALL"])?;
        // The common start: a whole second at least 1.5 s ahead (the servers connect first).
        let t0 = (unix_us() + 1_500_000).div_ceil(W_US) * W_US;
        let run_us = (1 + spec.windows) * W_US;
        let url = ctx.server.url();
        let mut servers = Servers(Vec::new());
        let mut paths = Vec::new();
        for (i, rate) in spec.rates.iter().enumerate() {
            let path = ctx.dir.join(format!("records-{i}.bin"));
            let _ = std::fs::remove_file(&path);
            let mut cmd = match &ctx.child_cpus {
                Some(cpus) => {
                    let mut c = Command::new("taskset");
                    c.args(["-c", cpus]).arg(&ctx.exe);
                    c
                }
                None => Command::new(&ctx.exe),
            };
            cmd.arg("--child")
                .arg(&url)
                .arg(spec.alg)
                .arg(if spec.slices { "on" } else { "off" })
                .arg(format!("{rate}"))
                .arg(run_us.to_string())
                .arg((seed + i as u64).to_string())
                .arg(&path)
                .arg(t0.to_string())
                .arg(ctx.timeout_ms.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn()?;
            let out = child.stdout.take().ok_or("no stdout")?;
            let err = child.stderr.take().ok_or("no stderr")?;
            let out = std::thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).collect());
            let err = std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("[server {i}] {line}");
                }
            });
            servers.0.push((child, Some(out), Some(err)));
            paths.push(path);
        }

        // The events of the cell, in time order.
        let first = t0 / W_US + 1;
        let mut events: Vec<(u64, Ev)> = vec![(t0 + W_US, Ev::Reset)];
        for k in 1..=spec.windows {
            // The last sample a little after the end: the last arrivals' answers.
            let at = t0 + (1 + k) * W_US + if k == spec.windows { 50_000 } else { 0 };
            events.push((at, Ev::Sample));
        }
        match spec.fault {
            Some(Fault::Kill) => events.push((t0 + 3_400_000, Ev::Kill)),
            Some(Fault::Stop) => {
                events.push((t0 + 3_400_000, Ev::Stop));
                events.push((t0 + 3_700_000, Ev::Cont));
            }
            None => {}
        }
        events.sort_by_key(|e| e.0);
        let (mut last_calls, mut calls_per_window, mut cpu0, mut killed) = (0, Vec::new(), 0, None);
        let victim = 0;
        for (at, ev) in events {
            sleep_until_unix(at);
            // Before the run's end, a server that has exited died.
            for (i, (c, _, _)) in servers.0.iter_mut().enumerate() {
                if killed != Some(i) && at < t0 + run_us {
                    if let Some(st) = c.try_wait()? {
                        return Err(format!("server {i} exited during the cell: {st}").into());
                    }
                }
            }
            let pid = servers.0[victim].0.id();
            match ev {
                Ev::Reset => {
                    ctx.cmd(&["CONFIG", "RESETSTAT"])?;
                    cpu0 = ctx.redis_cpu_ns();
                }
                Ev::Sample => {
                    let calls = evalsha(&ctx.commandstats()?).0;
                    calls_per_window.push(calls - last_calls);
                    last_calls = calls;
                }
                Ev::Kill => {
                    signal(pid, "-KILL")?;
                    killed = Some(victim);
                }
                Ev::Stop => signal(pid, "-STOP")?,
                Ev::Cont => signal(pid, "-CONT")?,
            }
        }
        let stats = ctx.commandstats()?;
        let redis_cpu_ns = ctx.redis_cpu_ns().saturating_sub(cpu0);

        // The servers end once their answers are in.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut summaries = Vec::new();
        let mut arrivals = Vec::new();
        for (i, (c, out, err)) in servers.0.iter_mut().enumerate() {
            let st = loop {
                if let Some(st) = c.try_wait()? {
                    break st;
                }
                if Instant::now() > deadline {
                    return Err(format!("server {i} did not end 20 s after its run").into());
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let lines = out.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
            if let Some(h) = err.take() {
                let _ = h.join();
            }
            if killed == Some(i) {
                summaries.push(None);
                arrivals.push(BTreeMap::new());
                continue;
            }
            if !st.success() {
                return Err(format!("server {i} failed: {st}").into());
            }
            let (s, a) = parse_output(&lines).ok_or_else(|| format!("server {i} printed no summary"))?;
            summaries.push(Some(s));
            arrivals.push(a);
        }
        let mut records = Vec::new();
        for p in &paths {
            records.push(read_records(p)?);
            let _ = std::fs::remove_file(p);
        }
        Ok(Raw { first, records, arrivals, summaries, stats, calls_per_window, redis_cpu_ns, killed })
    }

    #[derive(Clone, Copy)]
    enum Ev {
        Reset,
        Sample,
        Kill,
        Stop,
        Cont,
    }

    fn parse_output(lines: &[String]) -> Option<(Summary, BTreeMap<u64, u64>)> {
        let mut arrivals = BTreeMap::new();
        let mut summary = None;
        for l in lines {
            let v: Vec<u64> = l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            if l.starts_with("arrivals ") && v.len() == 2 {
                arrivals.insert(v[0], v[1]);
            } else if l.starts_with("summary ") && v.len() == 8 {
                summary = Some(Summary {
                    arrivals: v[0],
                    allowed: v[1],
                    rejected: v[2],
                    failed: v[3] + v[4],
                    late: v[5],
                    max_lag_us: v[6],
                    cpu_ns: v[7],
                });
            }
        }
        Some((summary?, arrivals))
    }

    fn read_records(path: &Path) -> Result<Vec<[u64; 4]>, Error> {
        let bytes = std::fs::read(path)?;
        Ok(bytes
            .chunks_exact(RECORD_BYTES)
            .map(|c| {
                let f = |i: usize| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                [f(0), f(1), f(2), f(3)]
            })
            .collect())
    }

    // ------------------------------------------------------------------------------
    // What a cell run says
    // ------------------------------------------------------------------------------

    /// The window an admission counts in, from the store's `reset_after` (see the top); a
    /// bucket's: the second of its stamp.
    fn window_of(alg: &str, now: u64, reset: u64) -> u64 {
        if reset == u64::MAX {
            return now / W_US; // no decision in the request: cannot happen with one rule
        }
        if is_bucket(alg) {
            return reset / W_US;
        }
        let end = if alg == "fixed" { now + reset } else { (now + reset).saturating_sub(W_US) };
        ((end + W_US / 2) / W_US).saturating_sub(1)
    }

    /// A bucket's violations: admissions (stamps, every server's) that end a run
    /// `t_i <= … <= t_j` holding more than `B + r·(t_j - t_i)` (`B = L`, `r = L` a second,
    /// `T = W / L`): `units·T - (t_j - t_i) > B·T`, in integers.
    fn bucket_violations(stamps: &mut [u64]) -> u64 {
        stamps.sort_unstable();
        let t = i128::from(W_US / L);
        let span = i128::from(L) * t;
        let (mut units, mut least, mut over) = (0i128, i128::MAX, 0);
        for &at in stamps.iter() {
            let at = i128::from(at);
            least = least.min(units * t - at);
            units += 1;
            over += u64::from(units * t - at - least > span);
        }
        over
    }

    #[derive(Default, Clone)]
    struct Metrics {
        violations: u64,
        /// Largest admitted in a window (all windows, the warm-up too).
        max_admitted: u64,
        decisions: u64,
        calls: f64,
        commands: f64,
        script_us: f64,
        usec_all: f64,
        cpu_us: f64,
        shortfall_worst: f64,
        shortfall_median: f64,
        slice_share: f64,
        slice_p50: f64,
        slice_p99: f64,
        allowed_p99: f64,
        fairness: f64,
        attr_off: u64,
        records: u64,
        behind: bool,
        late_pct: f64,
        /// The servers' CPU time during their runs, % of one core.
        servers_cpu: f64,
        /// Each server's share of arrivals more than 1 ms late, %.
        late_by: Vec<f64>,
        max_lag_ms: f64,
        failed: u64,
        other_by: u64,
        /// 200 answers the servers counted less the records they wrote (killed: not counted).
        unrecorded: i64,
        rejected: u64,
        /// Admitted in each counted window, all servers.
        admitted: Vec<u64>,
    }

    fn quantile(sorted: &[u64], p: f64) -> f64 {
        if sorted.is_empty() {
            return f64::NAN;
        }
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
        #[allow(clippy::cast_precision_loss)]
        let v = sorted[i] as f64 / 1000.0;
        v
    }

    #[allow(clippy::cast_precision_loss)]
    fn metrics(spec: &Spec, raw: &Raw) -> Metrics {
        let n = spec.windows;
        let counted = raw.first..raw.first + n;
        let mut m = Metrics::default();
        let mut per_window = BTreeMap::<u64, u64>::new();
        let mut admitted_by = vec![0_u64; raw.records.len()];
        let (mut slice_lat, mut all_lat, mut slices) = (Vec::new(), Vec::new(), 0_u64);
        for (i, recs) in raw.records.iter().enumerate() {
            for &[now, reset, by, lat] in recs {
                let w = window_of(spec.alg, now, reset);
                *per_window.entry(w).or_default() += 1;
                m.records += 1;
                m.attr_off += u64::from(w != now / W_US);
                m.other_by += u64::from(by == BY_OTHER);
                if counted.contains(&w) {
                    admitted_by[i] += 1;
                    all_lat.push(lat);
                    if by == BY_SLICE {
                        slices += 1;
                        slice_lat.push(lat);
                    }
                }
            }
        }
        m.violations = if is_bucket(spec.alg) {
            let mut stamps: Vec<u64> = raw.records.iter().flatten().map(|r| r[1]).collect();
            bucket_violations(&mut stamps)
        } else {
            per_window.values().filter(|&&a| a > L).count() as u64
        };
        m.max_admitted = per_window.values().copied().max().unwrap_or(0);
        let arrivals_in = |w: u64| raw.arrivals.iter().map(|a| a.get(&w).copied().unwrap_or(0)).sum::<u64>();
        m.decisions = counted.clone().map(arrivals_in).sum();
        let d = m.decisions.max(1) as f64;
        let (calls, script_usec) = evalsha(&raw.stats);
        m.calls = calls as f64 / d;
        m.commands = raw.stats.values().map(|v| v.0).sum::<u64>() as f64 / d;
        m.usec_all = raw.stats.values().map(|v| v.1).sum::<u64>() as f64 / d;
        m.script_us = script_usec as f64 / d;
        m.cpu_us = raw.redis_cpu_ns as f64 / 1000.0 / d;
        m.admitted = counted.clone().map(|w| per_window.get(&w).copied().unwrap_or(0)).collect();
        let mut short: Vec<f64> = counted
            .clone()
            .zip(&m.admitted)
            .map(|(w, &a)| (arrivals_in(w).min(L) as f64 - a as f64) / L as f64 * 100.0)
            .collect();
        short.sort_by(f64::total_cmp);
        m.shortfall_worst = short.last().copied().unwrap_or(f64::NAN);
        m.shortfall_median = short.get(short.len() / 2).copied().unwrap_or(f64::NAN);
        let allowed: u64 = admitted_by.iter().sum();
        m.slice_share = slices as f64 / allowed.max(1) as f64 * 100.0;
        slice_lat.sort_unstable();
        all_lat.sort_unstable();
        m.slice_p50 = quantile(&slice_lat, 0.5);
        m.slice_p99 = quantile(&slice_lat, 0.99);
        m.allowed_p99 = quantile(&all_lat, 0.99);
        let ratios: Vec<f64> = raw
            .arrivals
            .iter()
            .zip(&admitted_by)
            .filter(|(a, _)| !a.is_empty())
            .map(|(a, &adm)| {
                adm as f64 / counted.clone().map(|w| a.get(&w).copied().unwrap_or(0)).sum::<u64>().max(1) as f64
            })
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
        m.fairness = ratios.iter().map(|x| (x - mean).abs()).fold(0.0, f64::max) / mean * 100.0;
        let s: Vec<Summary> = raw.summaries.iter().flatten().copied().collect();
        m.late_by = s.iter().map(|s| (s.late as f64 / s.arrivals.max(1) as f64 * 1e4).round() / 100.0).collect();
        m.late_pct = m.late_by.iter().copied().fold(0.0, f64::max);
        m.servers_cpu = s.iter().map(|s| s.cpu_ns).sum::<u64>() as f64 / ((1 + n) * W_US * 1000) as f64 * 100.0;
        m.behind = m.late_pct > 1.0;
        m.max_lag_ms = s.iter().map(|s| s.max_lag_us as f64 / 1000.0).fold(0.0, f64::max);
        m.failed = s.iter().map(|s| s.failed).sum();
        m.rejected = s.iter().map(|s| s.rejected).sum();
        m.unrecorded = raw
            .summaries
            .iter()
            .zip(&raw.records)
            .filter_map(|(s, r)| Some(s.as_ref()?.allowed as i64 - r.len() as i64))
            .sum();
        m
    }

    fn json(spec: &Spec, m: &Metrics) -> String {
        format!(
            "{{\"cell\":\"{}\",\"algorithm\":\"{}\",\"load\":{},\"split\":\"{}\",\"slices\":{},\"run\":{},\
             \"windows\":{},\"decisions\":{},\"violations\":{},\"max_admitted\":{},\"store_calls_per_decision\":{:.4},\
             \"commands_per_decision\":{:.4},\"script_usec_per_decision\":{:.3},\"usec_all_per_decision\":{:.3},\
             \"redis_cpu_us_per_decision\":{:.3},\"shortfall_worst_pct\":{:.3},\"shortfall_median_pct\":{:.3},\
             \"slice_share_pct\":{:.2},\"slice_p50_us\":{},\"slice_p99_us\":{},\"allowed_p99_us\":{:.1},\
             \"fairness_spread_pct\":{:.3},\"attribution_off\":{},\"records\":{},\"late_pct\":{:.3},\
             \"late_pct_by_server\":{:?},\"servers_cpu_pct\":{:.1},\"max_lag_ms\":{:.2},\"failed\":{},\"rejected\":{},\"unrecorded\":{},\"decided_by_other\":{},\"admitted\":{:?}}}",
            spec.label,
            spec.alg,
            spec.load,
            spec.split.name(),
            spec.slices,
            spec.run,
            spec.windows,
            m.decisions,
            m.violations,
            m.max_admitted,
            m.calls,
            m.commands,
            m.script_us,
            m.usec_all,
            m.cpu_us,
            m.shortfall_worst,
            m.shortfall_median,
            m.slice_share,
            num(m.slice_p50),
            num(m.slice_p99),
            m.allowed_p99,
            m.fairness,
            m.attr_off,
            m.records,
            m.late_pct,
            m.late_by,
            m.servers_cpu,
            m.max_lag_ms,
            m.failed,
            m.rejected,
            m.unrecorded,
            m.other_by,
            m.admitted
        )
    }

    /// A number for JSON (NaN as null).
    fn num(v: f64) -> String {
        if v.is_finite() {
            format!("{v:.1}")
        } else {
            "null".to_owned()
        }
    }

    /// `min–median–max` of `f` over runs, `prec` decimals; one value when all are equal.
    fn mmm(ms: &[Metrics], prec: usize, f: impl Fn(&Metrics) -> f64) -> String {
        let mut v: Vec<f64> = ms.iter().map(f).filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return "—".to_owned();
        }
        v.sort_by(f64::total_cmp);
        let (lo, mid, hi) = (v[0], v[v.len() / 2], v[v.len() - 1]);
        if format!("{lo:.prec$}") == format!("{hi:.prec$}") {
            format!("{mid:.prec$}")
        } else {
            format!("{lo:.prec$}–{mid:.prec$}–{hi:.prec$}")
        }
    }

    // ------------------------------------------------------------------------------
    // The whole run
    // ------------------------------------------------------------------------------

    fn taskset_ok() -> bool {
        Command::new("taskset")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    #[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
    pub(crate) fn main(args: &[String]) -> Result<(), Error> {
        let opts = options(args)?;
        let started = Instant::now();
        let server = RedisServer::start();
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let mut notes = Vec::new();
        let child_cpus = if cpus < 2 {
            notes.push(format!("{cpus} CPU: redis-server and the servers run unpinned"));
            None
        } else if !taskset_ok() {
            notes.push("taskset is missing: redis-server and the servers run unpinned".to_owned());
            None
        } else {
            let st = Command::new("taskset")
                .args(["-a", "-p", "-c", "0", &server.pid().to_string()])
                .stdout(Stdio::null())
                .status()?;
            if !st.success() {
                return Err(format!("taskset -a -p -c 0 {}: {st}", server.pid()).into());
            }
            let list = if cpus == 2 { "1".to_owned() } else { format!("1-{}", cpus - 1) };
            notes.push(format!("redis-server pinned to CPU 0, the three servers to CPU {list} (taskset)"));
            Some(list)
        };
        let dir = std::env::temp_dir().join(format!("tollgate-slices-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let conn = redis::Client::open(server.url().as_str())?.get_connection()?;
        let mut ctx = Ctx { server, conn, exe: std::env::current_exe()?, child_cpus, dir, timeout_ms: opts.timeout_ms };

        let algs: Vec<&'static str> = match opts.only.as_deref() {
            Some("fixed") => vec!["fixed"],
            Some("counter") => vec!["counter"],
            Some("gcra") => vec!["gcra"],
            Some("tb") => vec!["tb"],
            Some(_) => vec!["gcra", "tb"],
            None => vec!["fixed", "counter", "gcra", "tb"],
        };
        let mut cells: Vec<(Spec, Vec<Metrics>)> = Vec::new();
        for &alg in if opts.faults_only { &[][..] } else { &algs[..] } {
            for load in [50, 100, 200] {
                for split in [Split::Uniform, Split::Hot] {
                    for slices in [false, true] {
                        cells.push((Spec::new(alg, load, split, slices, opts.windows, 0), Vec::new()));
                    }
                }
            }
        }
        let mut failures = Vec::new();
        let mut warnings = Vec::new();
        let mut plot_data: BTreeMap<bool, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
        let total = cells.len() * opts.runs;
        let mut done = 0;
        for run in 0..opts.runs {
            for (ci, (base, ms)) in cells.iter_mut().enumerate() {
                let spec = Spec { run, ..base.clone() };
                done += 1;
                eprintln!("[{done}/{total}] {} (run {})", spec.label, run + 1);
                let seed = 1_000 * (ci as u64 + 1) + 10 * run as u64;
                match run_cell(&mut ctx, &spec, seed) {
                    Ok(raw) => {
                        let m = metrics(&spec, &raw);
                        println!("{}", json(&spec, &m));
                        if m.failed > 0 {
                            warnings.push(format!(
                                "{} run {}: {} decisions failed (the store did not answer in time: 503, not admitted; \
                                 they count in the shortfall)",
                                spec.label,
                                run + 1,
                                m.failed
                            ));
                        }
                        if spec.alg == "fixed" && spec.load == 200 && spec.split == Split::Uniform {
                            plot_data.entry(spec.slices).or_insert((m.admitted.clone(), raw.calls_per_window));
                        }
                        ms.push(m);
                    }
                    Err(e) => {
                        eprintln!("!!! CELL FAILED: {} run {}: {e}", spec.label, run + 1);
                        failures.push(format!("{} run {}: {e}", spec.label, run + 1));
                    }
                }
            }
        }

        // The probe: the commands of a burst on one server.
        let mut probe = String::new();
        if algs.contains(&"fixed") {
            let mut spec = Spec::new("fixed", 10, Split::Uniform, true, 1, 0);
            spec.rates = vec![1_000.0];
            spec.label = "probe: one server, fixed window, slices on, 1,000/s".to_owned();
            eprintln!("{}", spec.label);
            match run_cell(&mut ctx, &spec, 7) {
                Ok(raw) => {
                    let m = metrics(&spec, &raw);
                    let slices: usize =
                        raw.records.iter().flatten().filter(|r| r[2] == BY_SLICE && r[0] / W_US == raw.first).count();
                    let _ = writeln!(
                        probe,
                        "One server, fixed window, slices on, 1,000 arrivals/s for one counted window: {} decisions, \
                         {} allowed by a slice, {:.3} EVALSHA per decision. Its whole `INFO commandstats` (less the \
                         parent's own): {}.",
                        m.decisions,
                        slices,
                        m.calls,
                        raw.stats
                            .iter()
                            .map(|(k, (c, u))| format!("`{k}` {c} calls, {u} µs"))
                            .collect::<Vec<_>>()
                            .join("; ")
                    );
                    let (calls, _) = evalsha(&raw.stats);
                    let inside: u64 = raw.stats.iter().filter(|(k, _)| !k.starts_with("eval")).map(|(_, v)| v.0).sum();
                    let _ = writeln!(
                        probe,
                        "\nPer store call: {:.2} commands inside the script. A slice take and a plain check are the \
                         same script call, so a slice's own cost is not isolated here: with slices taking effect, the \
                         calls are mostly slice takes{}.",
                        inside as f64 / calls.max(1) as f64,
                        if slices == 0 { " (none in this run: the library does not take slices yet)" } else { "" }
                    );
                }
                Err(e) => {
                    eprintln!("!!! CELL FAILED: {}: {e}", spec.label);
                    failures.push(format!("{}: {e}", spec.label));
                }
            }
        }

        // The faults.
        let mut faults = String::new();
        let fault_algs: Vec<&'static str> = ["fixed", "gcra"].into_iter().filter(|a| algs.contains(a)).collect();
        for (alg, fault) in fault_algs.iter().flat_map(|&a| [(a, Fault::Kill), (a, Fault::Stop)]) {
            if !opts.faults {
                break;
            }
            {
                let mut spec = Spec::new(alg, 100, Split::Uniform, true, 10, 0);
                spec.fault = Some(fault);
                let what = match fault {
                    Fault::Kill => "server 0 `kill -9`ed 3.4 s into the cell",
                    Fault::Stop => "server 0 stopped (`kill -STOP`) 3.4 s into the cell for 300 ms, then continued",
                };
                spec.label = format!("fault: {} 100% uniform slices on, {what}", alg_name(alg));
                eprintln!("{}", spec.label);
                match run_cell(&mut ctx, &spec, 99) {
                    Ok(raw) => {
                        let m = metrics(&spec, &raw);
                        println!("{}", json(&spec, &m));
                        // 3.4 s into the cell: counted window index 2 (the warm-up is not counted).
                        let at = |i: usize| m.admitted.get(i).copied().unwrap_or(0);
                        let _ = writeln!(
                            faults,
                            "| {} | {what} | {} | {} | {} | {} | {:?} | {} |",
                            alg_name(alg),
                            m.violations,
                            m.max_admitted,
                            at(2),
                            at(3),
                            m.admitted,
                            if raw.killed.is_some() {
                                "the killed server's last ≤ 50 ms of records may be lost (an undercount)"
                            } else {
                                "the stopped server fires its 300 ms of arrivals at once on SIGCONT (late, by design)"
                            }
                        );
                        if m.violations > 0 {
                            failures.push(format!("{}: {} violations", spec.label, m.violations));
                        }
                    }
                    Err(e) => {
                        eprintln!("!!! CELL FAILED: {}: {e}", spec.label);
                        failures.push(format!("{}: {e}", spec.label));
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&ctx.dir);

        let text = Text { notes, probe, faults, failures: failures.clone(), warnings };
        let report = report(&opts, &cells, &text, started.elapsed());
        print!("{report}");
        if let Some(path) = &opts.out {
            std::fs::write(path, &report)?;
        }
        if let Some(path) = &opts.plot {
            match (plot_data.get(&false), plot_data.get(&true)) {
                (Some(off), Some(on)) => plot::draw(Path::new(path), off, on)?,
                _ => eprintln!("--plot: no fixed-window 200% uniform cells were run"),
            }
        }
        drop(ctx);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!("{} cell run(s) failed", failures.len()).into())
        }
    }

    /// The table of the cells, min–median–max over runs.
    #[allow(clippy::cast_precision_loss)]
    fn table(s: &mut String, cells: &[(Spec, Vec<Metrics>)]) {
        let _ = writeln!(
            s,
            "| algorithm | load | split | slices | violations | store calls / decision | Redis cmds / decision | \
             script µs / decision | Redis CPU µs / decision | shortfall worst % | shortfall median % | \
             slice share % | slice p50 µs | slice p99 µs | allowed p99 µs | fairness spread % | attr. off | \
             failed | late % (behind) | servers CPU % |"
        );
        let _ = writeln!(s, "|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for (spec, ms) in cells {
            if ms.is_empty() {
                let _ = writeln!(
                    s,
                    "| {} | {}% | {} | {} | FAILED |||||||||||||||",
                    alg_name(spec.alg),
                    spec.load,
                    spec.split.name(),
                    if spec.slices { "on" } else { "off" }
                );
                continue;
            }
            let short = spec.load >= 100;
            let behind = ms.iter().any(|m| m.behind);
            let _ = writeln!(
                s,
                "| {} | {}% | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} | {} |",
                alg_name(spec.alg),
                spec.load,
                spec.split.name(),
                if spec.slices { "on" } else { "off" },
                mmm(ms, 0, |m| m.violations as f64),
                mmm(ms, 3, |m| m.calls),
                mmm(ms, 2, |m| m.commands),
                mmm(ms, 1, |m| m.script_us),
                mmm(ms, 1, |m| m.cpu_us),
                if short { mmm(ms, 2, |m| m.shortfall_worst) } else { "—".to_owned() },
                if short { mmm(ms, 2, |m| m.shortfall_median) } else { "—".to_owned() },
                mmm(ms, 1, |m| m.slice_share),
                mmm(ms, 0, |m| m.slice_p50),
                mmm(ms, 0, |m| m.slice_p99),
                mmm(ms, 0, |m| m.allowed_p99),
                if spec.load == 200 { mmm(ms, 2, |m| m.fairness) } else { "—".to_owned() },
                mmm(ms, 0, |m| m.attr_off as f64),
                mmm(ms, 0, |m| m.failed as f64),
                mmm(ms, 2, |m| m.late_pct),
                if behind { " BEHIND" } else { "" },
                mmm(ms, 0, |m| m.servers_cpu)
            );
        }
    }

    /// The report's text besides the cells.
    struct Text {
        notes: Vec<String>,
        probe: String,
        faults: String,
        failures: Vec<String>,
        warnings: Vec<String>,
    }

    fn report(opts: &Options, cells: &[(Spec, Vec<Metrics>)], text: &Text, took: Duration) -> String {
        let Text { notes, probe, faults, failures, warnings } = text;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n## Quota slices: one hot key, L = {L} / 1 s, three servers over one Redis{}\n",
            if opts.quick { " (--quick)" } else { "" }
        );
        let _ = writeln!(
            s,
            "{} windows a cell after a warm-up second, {} run(s) a cell (min–median–max over runs); store deadline \
             {} ms (layer and connection; the library's default is 50 ms); {} CPUs; {}; run took {:.0} s.\n",
            opts.windows,
            opts.runs,
            opts.timeout_ms,
            std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            notes.join("; "),
            took.as_secs_f64()
        );
        if !cells.is_empty() {
            table(&mut s, cells);
        }
        let off: Vec<&Metrics> = cells.iter().filter(|(c, _)| !c.slices).flat_map(|(_, m)| m).collect();
        let _ = writeln!(
            s,
            "\nWindow attribution, slices off: {} of {} admissions counted in another window than floor(now / W) \
             (only near a boundary, between the store's clock and the handler's).",
            off.iter().map(|m| m.attr_off).sum::<u64>(),
            off.iter().map(|m| m.records).sum::<u64>()
        );
        let unrecorded: i64 = cells.iter().flat_map(|(_, m)| m).map(|m| m.unrecorded).sum();
        if unrecorded != 0 {
            let _ = writeln!(s, "\n{unrecorded} admissions the servers answered 200 were not in their records.");
        }
        let other: u64 = cells.iter().flat_map(|(_, m)| m).map(|m| m.other_by).sum();
        if other > 0 {
            let _ = writeln!(s, "\n{other} admissions were decided by neither the store nor a slice.");
        }
        if !probe.is_empty() {
            let _ = writeln!(s, "\n### The commands of a burst (probe)\n\n{probe}");
        }
        if !faults.is_empty() {
            let _ = writeln!(s, "\n### Faults: 100% uniform, slices on, 10 windows\n");
            let _ = writeln!(
                s,
                "| algorithm | fault | violations | most admitted in a window | admitted, window of the fault | \
                 admitted, next window | admitted per window | note |"
            );
            let _ = writeln!(s, "|---|---|--:|--:|--:|--:|---|---|");
            s.push_str(faults);
        }
        if !warnings.is_empty() {
            let _ = writeln!(s, "\n### Warnings\n");
            for w in warnings {
                let _ = writeln!(s, "- {w}");
            }
        }
        if !failures.is_empty() {
            let _ = writeln!(s, "\n### FAILED\n");
            for f in failures {
                let _ = writeln!(s, "- {f}");
            }
        }
        s
    }

    mod plot {
        use std::path::Path;

        use plotters::prelude::*;

        use super::{Error, L};

        fn err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> Error {
            format!("drawing the figure: {e}").into()
        }

        /// Admitted per window and EVALSHA per second, slices off and on: (admitted, calls).
        #[allow(clippy::cast_precision_loss)]
        pub(super) fn draw(path: &Path, off: &(Vec<u64>, Vec<u64>), on: &(Vec<u64>, Vec<u64>)) -> Result<(), Error> {
            let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
            root.fill(&WHITE).map_err(err)?;
            let body = root
                .titled(
                    "Fixed window, 200% of L uniform on three servers: slices off (red) and on (blue)",
                    ("sans-serif", 18),
                )
                .map_err(err)?;
            let panels = body.split_evenly((2, 1));
            let n = off.0.len().max(on.0.len()).max(1) as f64;
            let series = |v: &[u64]| v.iter().enumerate().map(|(i, &c)| (i as f64 + 0.5, c as f64)).collect::<Vec<_>>();
            for (p, (title, pick)) in
                panels.iter().zip([("admitted per window (dashed: L)", 0_usize), ("EVALSHA calls per second", 1)])
            {
                let get = |d: &(Vec<u64>, Vec<u64>)| if pick == 0 { d.0.clone() } else { d.1.clone() };
                let top = get(off).iter().chain(get(on).iter()).copied().max().unwrap_or(L).max(L) as f64 * 1.1;
                let mut chart = ChartBuilder::on(p)
                    .caption(title, ("sans-serif", 16))
                    .margin(8)
                    .x_label_area_size(32)
                    .y_label_area_size(64)
                    .build_cartesian_2d(0.0..n, 0.0..top)
                    .map_err(err)?;
                chart.configure_mesh().x_desc("window (s)").light_line_style(WHITE).draw().map_err(err)?;
                if pick == 0 {
                    chart
                        .draw_series(DashedLineSeries::new(
                            [(0.0, L as f64), (n, L as f64)],
                            6,
                            4,
                            BLACK.stroke_width(1),
                        ))
                        .map_err(err)?;
                }
                chart.draw_series(LineSeries::new(series(&get(off)), RED.stroke_width(2))).map_err(err)?;
                chart.draw_series(LineSeries::new(series(&get(on)), BLUE.stroke_width(2))).map_err(err)?;
            }
            root.present().map_err(err)?;
            Ok(())
        }
    }
}
