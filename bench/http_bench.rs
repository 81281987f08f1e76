//! HTTP benchmark: an axum "hello" server, bare and behind `RateLimitLayer`, loaded by
//! `wrk` over loopback with 64 connections and 10,000 rotating `x-api-key` values.
//!
//! ```text
//! apt-get install wrk                                   # the load generator (Debian package)
//! cargo run --release -p tollgate-bench --example http_bench              # all runs, then a markdown table
//! DURATION=5 ROUNDS=1 cargo run --release -p tollgate-bench --example http_bench
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p tollgate-bench --example http_bench
//! ```
//!
//! Runs, each on a fresh server: `bare` (no layer), `bare, 3 static headers` (no layer, the
//! handler adding the layer's three `X-RateLimit-*` headers: their cost alone), `memory` with a high limit (every
//! request accepted; also with `HeaderStyle::None`) and with a low one (nearly every request answered 429), the same two
//! behind tower_governor (governor's keyed GCRA, the in-memory peer, keyed by the same
//! header, with its rate-limit headers on), and, with
//! feature `redis` and `REDIS_URL` set, the same two on `RedisStore`. Each run has a 2 s
//! warm-up (for the low limit, it uses up the keys' quotas, so the measured part is the
//! steady 429 path) then `DURATION` seconds (default 10) of measurement. The runs are
//! interleaved `ROUNDS` times (default 3) and the table shows, per configuration, the round
//! with the median req/s. The server's CPU time per request (all threads of this process,
//! from `/proc/self/task/*/schedstat`) is shown too: on a shared machine it moves less
//! than req/s does. Latencies are wrk's (closed loop: one request at a time per
//! connection, no coordinated-omission correction).
//!
//! Last, issue 44's goals: each ratio taken within one round (its runs follow each other),
//! min–median–max over the rounds, and the layer's user time per request beyond bare's.
//!
//! Environment: `DURATION`, `ROUNDS`, `CONNECTIONS` (64), `WRK_THREADS` (1),
//! `SERVER_THREADS` (2), `ALGORITHM` (the layer's default, `sliding_window_counter`),
//! `ONLY` (run only the configurations whose name contains it, and `bare`).
//! Server and client share the machine; only 127.0.0.1 is used.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use axum::Router;
use http::{HeaderName, HeaderValue};
use tollgate::store::Store;
use tollgate::{key, Algorithm, HeaderStyle, Quota, RateLimitLayer};
use tollgate_bench::http::{hello, tower_governor};

const KEYS: usize = 10_000;
/// Every request is accepted: each key gets far fewer than this in a run.
const HIGH: Quota = Quota::per_minute(1_000_000);
/// After its first request each key is rejected for the rest of the minute.
const LOW: Quota = Quota::per_minute(1);

/// Where the limiter keeps its state, if there is a limiter.
#[derive(Clone)]
enum Backend {
    Bare,
    /// No limiter, but the hello handler answers with the three `X-RateLimit-*` headers the
    /// layer sends (fixed values of the same lengths): what sending them costs at all.
    BareWithHeaders,
    Memory,
    /// tower_governor (governor's keyed GCRA on a DashMap), the in-memory peer, keyed by
    /// the same header, with its rate-limit headers on (`use_headers`) as the layer has.
    TowerGovernor,
    /// A hook for the Redis benches: `REDIS_URL` with feature `redis`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Redis(String),
}

#[derive(Clone)]
struct Config {
    name: String,
    backend: Backend,
    quota: Option<Quota>,
    /// The layer's headers (its default, legacy, unless said).
    headers: HeaderStyle,
}

impl Config {
    fn new(name: &str, backend: Backend, quota: Option<Quota>) -> Self {
        Config { name: name.into(), backend, quota, headers: HeaderStyle::default() }
    }
}

struct Opts {
    duration: u64,
    rounds: usize,
    connections: usize,
    wrk_threads: usize,
    server_threads: usize,
    algorithm: Algorithm,
}

/// What wrk reported for one run.
#[derive(Debug, Clone, Copy)]
struct Run {
    requests: u64,
    seconds: f64,
    non_2xx: u64,
    socket_errors: u64,
    p50_us: u64,
    p99_us: u64,
    /// CPU time of this process (the server; wrk is another process) during the run.
    server_cpu_ns: u64,
    /// Of which user time (the process's `utime`, in clock ticks of 10 ms).
    server_user_ns: u64,
}

impl Run {
    #[allow(clippy::cast_precision_loss)]
    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// Server CPU per request, µs: less sensitive than req/s to what else runs.
    #[allow(clippy::cast_precision_loss)]
    fn cpu_us(&self) -> f64 {
        self.server_cpu_ns as f64 / 1e3 / self.requests.max(1) as f64
    }

    /// Server user time per request, µs.
    #[allow(clippy::cast_precision_loss)]
    fn user_us(&self) -> f64 {
        self.server_user_ns as f64 / 1e3 / self.requests.max(1) as f64
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The layer's legacy headers on a 200, as `Backend::BareWithHeaders` sends them.
fn static_headers() -> [(HeaderName, HeaderValue); 3] {
    [
        (HeaderName::from_static("x-ratelimit-limit"), HeaderValue::from_static("1000000")),
        (HeaderName::from_static("x-ratelimit-remaining"), HeaderValue::from_static("999998")),
        (HeaderName::from_static("x-ratelimit-reset"), HeaderValue::from_static("1")),
    ]
}

fn limited<St: Store>(store: St, quota: Quota, algorithm: Algorithm, headers: HeaderStyle) -> Router {
    hello().layer(
        RateLimitLayer::builder(store)
            .rule("default", quota, key::header("x-api-key"))
            .algorithm(algorithm)
            .headers(headers)
            .build()
            .unwrap(),
    )
}

fn router(config: &Config, algorithm: Algorithm) -> Result<Router, Box<dyn std::error::Error>> {
    let quota = config.quota.unwrap_or(HIGH);
    Ok(match &config.backend {
        Backend::Bare => hello(),
        Backend::BareWithHeaders => {
            Router::new().route("/", axum::routing::get(|| async { (static_headers(), "hello") }))
        }
        Backend::TowerGovernor => hello().layer(tower_governor(quota)?),
        Backend::Memory => limited(tollgate::MemoryStore::new(), quota, algorithm, config.headers),
        #[cfg(feature = "redis")]
        Backend::Redis(url) => {
            // A prefix of its own per run, so one run's counts never meet another's (nor the
            // warm-up's of an earlier round).
            let name: String = config.name.chars().filter(char::is_ascii_alphanumeric).collect();
            let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
            let prefix = format!("tollgate-bench-{name}-{run}");
            limited(tollgate::RedisStore::from_url(url)?.prefix(&prefix)?, quota, algorithm, config.headers)
        }
        #[cfg(not(feature = "redis"))]
        Backend::Redis(_) => return Err("REDIS_URL needs --features redis".into()),
    })
}

/// A wrk script: each thread rotates over the 10,000 keys from its own starting point,
/// with every request formatted once up front; `done` prints one parseable line.
fn lua_script() -> String {
    format!(
        r#"local keys = {KEYS}
local n = 0
setup = function(thread)
  thread:set("first", n * 7919)
  n = n + 1
end
local reqs = {{}}
local i = 0
init = function(args)
  for k = 1, keys do
    reqs[k] = wrk.format("GET", "/", {{ ["x-api-key"] = string.format("ak_%05d", k) }})
  end
  i = (first or 0) % keys
end
request = function()
  i = i % keys + 1
  return reqs[i]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d non2xx=%d socket_errors=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"#
    )
}

fn wrk(addr: SocketAddr, script: &Path, seconds: u64, opts: &Opts) -> Result<Run, Box<dyn std::error::Error>> {
    let out = Command::new("wrk")
        .arg(format!("-t{}", opts.wrk_threads))
        .arg(format!("-c{}", opts.connections))
        .arg(format!("-d{seconds}s"))
        .arg("--timeout")
        .arg("5s")
        .arg("-s")
        .arg(script)
        .arg(format!("http://{addr}/"))
        .output()
        .map_err(|e| format!("could not run wrk ({e}): install it with `apt-get install wrk`"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("RESULT ")).ok_or_else(|| {
        format!("wrk printed no result (exit {}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr))
    })?;
    let field = |name: &str| -> Result<u64, String> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {name} in {line:?}"))
    };
    #[allow(clippy::cast_precision_loss)]
    let seconds = field("duration_us")? as f64 / 1e6;
    Ok(Run {
        requests: field("requests")?,
        seconds,
        non_2xx: field("non2xx")?,
        socket_errors: field("socket_errors")?,
        p50_us: field("p50_us")?,
        p99_us: field("p99_us")?,
        server_cpu_ns: 0,
        server_user_ns: 0,
    })
}

/// One run on a fresh server: warm-up, then the measured part.
fn run(config: &Config, script: &Path, opts: &Opts) -> Result<Run, Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(opts.server_threads).enable_all().build()?;
    let (addr, server) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let app = router(config, opts.algorithm)?;
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok::<_, Box<dyn std::error::Error>>((addr, server))
    })?;
    wrk(addr, script, 2, opts)?;
    let (cpu, user) = (cpu_ns(), user_ns());
    let result = wrk(addr, script, opts.duration, opts).map(|r| Run {
        server_cpu_ns: cpu_ns() - cpu,
        server_user_ns: user_ns().saturating_sub(user),
        ..r
    });
    server.abort();
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// On-CPU time of every thread of this process, ns (Linux `schedstat`).
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// User time of this process, ns (`utime` of `/proc/self/stat`, in ticks of 10 ms: the
/// kernel's USER_HZ is 100 on Linux).
fn user_ns() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0 };
    // The fields after the command (which may hold spaces) and its closing parenthesis:
    // state is field 3, utime field 14.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after.split_whitespace().nth(11).and_then(|t| t.parse::<u64>().ok()).map_or(0, |ticks| ticks * 10_000_000)
}

fn fmt_ms(us: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let ms = us as f64 / 1000.0;
    format!("{ms:.2} ms")
}

/// The median run of the configuration named `name`.
fn find_in(pairs: &[(&Config, &Run)], name: &str) -> Option<Run> {
    pairs.iter().find(|(c, _)| c.name == name).map(|(_, r)| **r)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let opts = Opts {
        duration: env_or("DURATION", 10),
        rounds: env_or("ROUNDS", 3).max(1),
        connections: env_or("CONNECTIONS", 64),
        wrk_threads: env_or("WRK_THREADS", 1),
        server_threads: env_or("SERVER_THREADS", 2),
        algorithm: std::env::var("ALGORITHM").map_or(Ok(Algorithm::default()), |a| a.parse())?,
    };
    let mut configs = vec![
        Config::new("bare", Backend::Bare, None),
        Config::new("bare, 3 static headers", Backend::BareWithHeaders, None),
        Config::new("memory, high limit", Backend::Memory, Some(HIGH)),
        Config {
            headers: HeaderStyle::None,
            ..Config::new("memory, high limit, no headers", Backend::Memory, Some(HIGH))
        },
        Config::new("memory, low limit", Backend::Memory, Some(LOW)),
        Config::new("tower_governor, high limit", Backend::TowerGovernor, Some(HIGH)),
        Config::new("tower_governor, low limit", Backend::TowerGovernor, Some(LOW)),
    ];
    if let Ok(url) = std::env::var("REDIS_URL") {
        configs.push(Config::new("redis, high limit", Backend::Redis(url.clone()), Some(HIGH)));
        configs.push(Config::new("redis, low limit", Backend::Redis(url), Some(LOW)));
    }
    if let Ok(only) = std::env::var("ONLY") {
        // Keep `bare` as the reference for the ratios.
        configs.retain(|c| c.name == "bare" || c.name.contains(only.as_str()));
    }

    let script: PathBuf = std::env::temp_dir().join(format!("tollgate-http-bench-{}.lua", std::process::id()));
    std::fs::File::create(&script)?.write_all(lua_script().as_bytes())?;

    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); configs.len()];
    for round in 1..=opts.rounds {
        for (config, runs) in configs.iter().zip(&mut runs) {
            let r = run(config, &script, &opts);
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    let _ = std::fs::remove_file(&script);
                    return Err(e);
                }
            };
            eprintln!(
                "round {round}/{}: {:<20} {:>9.0} req/s  p50 {}  p99 {}  non-2xx {}  server CPU {:.1} µs/req",
                opts.rounds,
                config.name,
                r.rps(),
                fmt_ms(r.p50_us),
                fmt_ms(r.p99_us),
                r.non_2xx,
                r.cpu_us()
            );
            runs.push(r);
        }
    }
    let _ = std::fs::remove_file(&script);
    let goals = goals(&configs, &runs);

    // Per configuration, the round with the median req/s.
    let median: Vec<Run> = runs
        .into_iter()
        .map(|mut rs| {
            rs.sort_by(|a, b| a.rps().total_cmp(&b.rps()));
            rs[rs.len() / 2]
        })
        .collect();
    let bare = median[0].rps();
    let bare_cpu = median[0].cpu_us();
    println!();
    println!(
        "HTTP, {} connections, {} keys in `x-api-key`, wrk -t{} ({} s per run, median of {} rounds), \
         server on {} tokio workers, algorithm `{}`",
        opts.connections, KEYS, opts.wrk_threads, opts.duration, opts.rounds, opts.server_threads, opts.algorithm
    );
    println!();
    println!("| server | req/s | vs bare | p50 | p99 | 429 (non-2xx) | socket errors | server CPU µs/req | vs bare |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (config, r) in configs.iter().zip(&median) {
        #[allow(clippy::cast_precision_loss)]
        let rejected = 100.0 * r.non_2xx as f64 / r.requests.max(1) as f64;
        println!(
            "| {} | {:.0} | {:.2} | {} | {} | {rejected:.1}% | {} | {:.2} | {:.2} |",
            config.name,
            r.rps(),
            r.rps() / bare,
            fmt_ms(r.p50_us),
            fmt_ms(r.p99_us),
            r.socket_errors,
            r.cpu_us(),
            r.cpu_us() / bare_cpu
        );
    }
    println!();
    let pairs = configs.iter().zip(&median).collect::<Vec<_>>();
    for store in ["memory", "redis"] {
        let find = |suffix: &str| pairs.iter().find(|(c, _)| c.name == format!("{store}, {suffix}")).map(|(_, r)| *r);
        let (Some(high), Some(low)) = (find("high limit"), find("low limit")) else { continue };
        if store == "memory" {
            let ratio = high.rps() / bare;
            let status = if ratio >= 0.9 { "met" } else { "MISSED" };
            println!(
                "- {store} layer vs bare: {ratio:.2}× req/s (target ≥ 0.90: {status}); server CPU per request {:.2}× bare's",
                high.cpu_us() / bare_cpu
            );
        }
        if store == "memory" {
            if let (Some(gh), Some(gl)) =
                (find_in(&pairs, "tower_governor, high limit"), find_in(&pairs, "tower_governor, low limit"))
            {
                for (path, ours, theirs) in [("200", high, gh), ("429", low, gl)] {
                    let ratio = ours.rps() / theirs.rps();
                    let status = if ratio >= 1.0 { "met" } else { "MISSED" };
                    println!(
                        "- {store} layer vs tower_governor, {path} path: {ratio:.2}× req/s (target ≥ 1.00: {status}); \
                         server CPU per request {:.2}× tower_governor's",
                        ours.cpu_us() / theirs.cpu_us()
                    );
                }
            }
        }
        let ratio = low.rps() / high.rps();
        let status = if ratio >= 1.0 { "met" } else { "MISSED" };
        println!(
            "- {store}, 429 path vs 200 path: {ratio:.2}× req/s (target ≥ 1.00: {status}); server CPU per request {:.2}× the 200 path's",
            low.cpu_us() / high.cpu_us()
        );
    }
    println!();
    println!("{goals}");
    Ok(())
}

/// Issue 44's goals, each ratio taken within one round (the two runs of a round follow
/// each other), min–median–max over the rounds; and the layer's user and CPU time per
/// request beyond bare's, in the same round.
fn goals(configs: &[Config], runs: &[Vec<Run>]) -> String {
    let of = |name: &str| configs.iter().position(|c| c.name == name).map(|i| &runs[i]);
    let mmm = |mut v: Vec<f64>| -> Option<(f64, f64, f64)> {
        v.sort_by(f64::total_cmp);
        Some((*v.first()?, v[v.len() / 2], *v.last()?))
    };
    let per_round = |a: &str, b: &str, f: &dyn Fn(&Run, &Run) -> f64| -> Option<(f64, f64, f64)> {
        let (a, b) = (of(a)?, of(b)?);
        mmm(a.iter().zip(b).map(|(a, b)| f(a, b)).collect())
    };
    let mut out = String::from(
        "| goal (issue 44), ratios within each round | min–median–max | target | |\n|---|---:|---:|---|\n",
    );
    let rows: [(&str, &str, &str, f64); 3] = [
        (
            "200 path, default (legacy headers) ÷ tower_governor with its headers",
            "memory, high limit",
            "tower_governor, high limit",
            1.0,
        ),
        ("200 path, `HeaderStyle::None` ÷ bare axum", "memory, high limit, no headers", "bare", 0.9),
        ("429 path ÷ tower_governor's 429 path", "memory, low limit", "tower_governor, low limit", 2.0),
    ];
    for (what, ours, theirs, target) in rows {
        if let Some((lo, med, hi)) = per_round(ours, theirs, &|a, b| a.rps() / b.rps()) {
            let status = if med >= target { "met" } else { "MISSED" };
            out += &format!("| {what} | {lo:.2}–{med:.2}–{hi:.2} | ≥ {target:.1} | {status} (median) |\n");
        }
    }
    for (what, ours) in [
        (
            "the layer's user time per request beyond bare's (µs; the issue's analysis asks 0.25–0.3)",
            "memory, high limit",
        ),
        ("the same, `HeaderStyle::None`", "memory, high limit, no headers"),
    ] {
        if let Some((lo, med, hi)) = per_round(ours, "bare", &|a, b| a.user_us() - b.user_us()) {
            out += &format!("| {what} | {lo:.2}–{med:.2}–{hi:.2} | | |\n");
        }
    }
    if let Some((lo, med, hi)) = per_round("memory, high limit", "bare", &|a, b| a.cpu_us() - b.cpu_us()) {
        out += &format!("| the layer's server CPU (user and system) per request beyond bare's (µs) | {lo:.2}–{med:.2}–{hi:.2} | | |\n");
    }
    out
}
