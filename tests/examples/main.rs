//! Runs the examples that need no external service as child processes, on free loopback
//! ports, and talks to them over real sockets: what a user sees after `cargo run -p
//! tollgate-examples --example …`.
//!
//! The binaries are the ones a whole-workspace `cargo test` builds under
//! `target/<profile>/examples/` (run alone, `--test examples` does not rebuild them: `cargo
//! build -p tollgate-examples --examples --all-features` first); an example whose features
//! are off is neither built nor run. Children are killed on drop.

#[cfg(feature = "redis")]
#[path = "../support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running example.
struct Example {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary(name: &str) -> PathBuf {
    // target/<profile>/deps/examples-<hash> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("test binary in target/<profile>/deps");
    let path = profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p tollgate-examples --examples --all-features` first (a whole-workspace `cargo test --all-features` builds them)",
        path.display()
    );
    path
}

impl Example {
    fn start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(binary(name));
        cmd.args(args).env("PORT", "0").env_remove("REDIS_URL").stdout(Stdio::piped()).stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{name}: {e}"));
        // Standard output and standard error, line by line, as they come.
        let (tx, lines) = mpsc::channel();
        let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let pipe = |out: Box<dyn Read + Send>, tx: mpsc::Sender<String>| {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        };
        pipe(Box::new(stdout), tx.clone());
        pipe(Box::new(stderr), tx);
        Self { child, lines, seen: Vec::new() }
    }

    /// The next output line starting with `prefix` (the rest of it), within 60 s.
    fn line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.to_owned();
                    }
                }
                Err(_) => panic!("no line starting with {prefix:?}; output so far: {:#?}", self.seen),
            }
        }
    }

    /// The address in a `<prefix>http://127.0.0.1:<port>` line.
    fn addr(&mut self, prefix: &str) -> SocketAddr {
        let url = self.line(prefix);
        url.trim().trim_start_matches("http://").parse().unwrap_or_else(|e| panic!("{url:?}: {e}"))
    }

    /// Waits for the process to exit (within 60 s) and returns its output and success.
    #[cfg_attr(not(feature = "tonic"), allow(dead_code))]
    fn finish(mut self) -> (Vec<String>, bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader thread ends at EOF: take what is left.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.seen.push(line);
                }
                return (std::mem::take(&mut self.seen), status.success());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("did not exit; output so far: {:#?}", self.seen);
    }
}

/// A response read from the wire.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// One HTTP/1.1 request on its own connection (`Connection: close`).
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end in {raw:?}"));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply { status, headers, body: body.to_owned() }
}

fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    http(addr, "GET", path, headers, "")
}

#[test]
fn quickstart_limits_each_client_to_ten_a_minute() {
    let mut ex = Example::start("quickstart", &[], &[]);
    let addr = ex.addr("listening on ");
    for i in 0..10 {
        let r = get(addr, "/", &[]);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(r.body, "hello from tollgate\n");
        assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    }
    let r = get(addr, "/", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    let retry: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
    // Sliding window counter: the spent minute still weighs on the next one, so the wait
    // can pass the end of the current window, but never two.
    assert!((1..=120).contains(&retry), "{retry}");
}

/// Behind a proxy, a rule keyed by `key::PeerIp` would put every client under the proxy's
/// address: the first request with `X-Forwarded-For` says so on stderr, once (no
/// `tracing` subscriber is installed in the quick start).
#[test]
fn peer_ip_warns_once_about_forwarded_requests() {
    let mut ex = Example::start("quickstart", &[], &[]);
    let addr = ex.addr("listening on ");
    assert_eq!(get(addr, "/", &[]).status, 200);
    for _ in 0..3 {
        assert_eq!(get(addr, "/", &[("x-forwarded-for", "203.0.113.7")]).status, 200);
    }
    let hint = ex.line("tollgate: a request arrived with X-Forwarded-For");
    assert!(hint.contains("key::TrustedProxyIp::hops"), "{hint}");
    drop(ex.child.kill());
    let (lines, _) = ex.finish();
    let said = lines.iter().filter(|l| l.contains("arrived with X-Forwarded-For")).count();
    assert_eq!(said, 1, "said once: {lines:#?}");
}

/// With an unreachable `REDIS_URL`, each server limits in process with its share of the
/// quota (the fallback, the default): the operator is told once on stderr, not left with
/// no output and no limiting.
#[cfg(feature = "redis")]
#[test]
fn a_store_that_fails_is_told_once() {
    let mut ex = Example::start("quickstart", &[], &[("REDIS_URL", "redis://127.0.0.1:1")]);
    let addr = ex.addr("listening on ");
    // The example's per-IP limit: 10 a minute, all of it this server's (it counts alone).
    let statuses: Vec<u16> = (0..12).map(|_| get(addr, "/", &[]).status).collect();
    assert_eq!(statuses, [[200; 10].as_slice(), &[429, 429]].concat(), "limited in process");
    let told = ex.line("tollgate: the rate-limit store failed");
    assert!(told.contains("in-process fallback decides") && told.contains("1/1"), "{told}");
    drop(ex.child.kill());
    let (lines, _) = ex.finish();
    let said = lines.iter().filter(|l| l.contains("in-process fallback decides")).count();
    assert_eq!(said, 1, "said once: {lines:#?}");
}

/// `summary <customer>: started S of N, deferred D, last start at T ms` → (S, N, D, T).
fn summary(lines: &[String], customer: &str) -> (u64, u64, u64, u64) {
    let prefix = format!("summary {customer}: started ");
    let line = lines.iter().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no summary: {lines:#?}"));
    let n: Vec<u64> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    (n[0], n[1], n[2], n[3])
}

#[test]
fn job_queue_limits_each_customer_through_a_limiter() {
    let (lines, ok) = Example::start("job_queue", &[], &[]).finish();
    assert!(ok, "{lines:#?}");
    // acme: 14 jobs at once, 5 a second with a burst of 5, each waiting at most 1 s: the
    // burst, then one every 200 ms for a second; the rest are deferred.
    let (started, total, deferred, last) = summary(&lines, "acme");
    assert_eq!(total, 14);
    assert!((9..=11).contains(&started), "acme started {started}: {lines:#?}");
    assert_eq!(started + deferred, 14);
    assert!((700..=1_300).contains(&last), "acme's last start at {last} ms: {lines:#?}");
    // globex is not held up by acme's backlog; its oversized job is refused at once.
    let (started, total, _, last) = summary(&lines, "globex");
    assert_eq!((started, total), (3, 4), "{lines:#?}");
    assert!(last < 300, "globex waited {last} ms behind acme: {lines:#?}");
    assert!(lines.iter().any(|l| l.contains("globex#4 (weight 50): refused: larger than any second allows")));
}

/// The API and the job loop of `api_and_jobs` use up one count: exactly the limit is
/// admitted between them; an account blocked by hand gets 429 with the block's rest.
fn api_and_jobs_share_one_count(env: &[(&str, &str)]) {
    let (lines, ok) = Example::start("api_and_jobs", &[], env).finish();
    assert!(ok, "{lines:#?}");
    let number = |prefix: &str| -> u64 {
        let line = lines.iter().find_map(|l| l.strip_prefix(prefix)).unwrap_or_else(|| panic!("{prefix}: {lines:#?}"));
        line.split(' ').next().unwrap().parse().unwrap()
    };
    let (api, jobs, together) = (number("api admitted "), number("jobs admitted "), number("together: "));
    assert_eq!((api + jobs, together), (20, 20), "{lines:#?}");
    assert!(lines.iter().any(|l| l == "blocked account: 429, Retry-After: 3600"), "{lines:#?}");
}

#[test]
fn api_and_jobs_share_one_count_in_process() {
    api_and_jobs_share_one_count(&[]);
}

#[cfg(feature = "redis")]
#[test]
fn api_and_jobs_share_one_count_through_redis() {
    let redis = support::redis::RedisServer::start();
    api_and_jobs_share_one_count(&[("REDIS_URL", &redis.url())]);
}

#[cfg(all(feature = "metrics", feature = "config"))]
#[test]
fn production_app_tiers_login_admin_and_metrics() {
    let mut ex = Example::start("production", &[], &[("ADMIN_PORT", "0")]);
    let public = ex.addr("listening on ");
    let internal = ex.addr("internal (metrics, admin) on ");

    assert_eq!(get(public, "/health", &[]).body, "ok\n");
    // The free demo account: 60 a minute, then 429 naming the account rule.
    for i in 0..60 {
        let r = get(public, "/api/me", &[("x-api-key", "demo-free")]);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
    }
    let r = get(public, "/api/me", &[("x-api-key", "demo-free")]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("x-ratelimit-rule"), Some("account-minute"));
    assert!(r.header("ratelimit").is_some_and(|v| v.starts_with("\"account-minute\";r=0;")), "{r:?}");
    // Other tiers are not affected.
    assert_eq!(get(public, "/api/me", &[("x-api-key", "demo-pro")]).status, 200);
    assert_eq!(get(public, "/api/me", &[]).status, 401, "no key: limited per IP, then refused by the handler");

    // Ten failed logins, then 429.
    let login = |password: &str| {
        let body = format!("user=alice&password={password}");
        http(public, "POST", "/auth/login", &[("Content-Type", "application/x-www-form-urlencoded")], &body)
    };
    assert_eq!(login("wonderland").status, 200);
    for _ in 0..10 {
        assert_eq!(login("nope").status, 401);
    }
    assert_eq!(login("nope").status, 429);

    // Admin: look, then unblock.
    let r = get(internal, "/admin/limits/account-minute/acct-free", &[]);
    assert!(r.body.starts_with("{\"allowed\":false,\"limit\":60,"), "{r:?}");
    assert_eq!(http(internal, "DELETE", "/admin/limits/account-minute/acct-free", &[], "").status, 204);
    assert_eq!(get(public, "/api/me", &[("x-api-key", "demo-free")]).status, 200);

    // Metrics by rule and outcome.
    let scrape = get(internal, "/metrics", &[]).body;
    let has = |rule: &str, outcome: &str| {
        scrape.lines().any(|l| {
            l.starts_with("tollgate_decisions_total{")
                && l.contains(&format!("rule=\"{rule}\""))
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
    };
    assert!(has("account-minute", "rejected") && has("login", "rejected") && has("ip", "allowed"), "{scrape}");
}

#[cfg(all(feature = "metrics", feature = "config"))]
#[test]
fn production_app_reads_limits_file_and_refuses_a_bad_one() {
    let dir = std::env::temp_dir().join(format!("tollgate-examples-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, "[[rule]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"2/min\"\n").unwrap();
    let mut ex = Example::start("production", &[], &[("ADMIN_PORT", "0"), ("LIMITS_FILE", good.to_str().unwrap())]);
    let public = ex.addr("listening on ");
    assert_eq!(get(public, "/api/me", &[]).status, 401);
    assert_eq!(get(public, "/api/me", &[]).status, 401);
    assert_eq!(get(public, "/api/me", &[]).status, 429, "the file's 2 a minute is enforced");

    // Edited and SIGHUP: swapped in while serving; the two used still count.
    let hangup = |ex: &Example| {
        let pid = ex.child.id().to_string();
        assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    };
    std::fs::write(&good, "[[rule]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"4/min\"\n").unwrap();
    hangup(&ex);
    assert!(ex.line("limits reloaded from ").contains("ip 4/min"), "{:#?}", ex.seen);
    let statuses: Vec<u16> = (0..3).map(|_| get(public, "/api/me", &[]).status).collect();
    assert_eq!(statuses, [401, 401, 429], "4 a minute, 2 of them used before the reload");
    // A mistake in the edited file: refused with the reason, and the 4 a minute stays.
    std::fs::write(&good, "[[rule]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"9/fortnight\"\n").unwrap();
    hangup(&ex);
    let refused = ex.line("limits file ");
    assert!(refused.contains("not applied") && refused.contains("field `quota`"), "{refused}");
    assert_eq!(get(public, "/api/me", &[]).status, 429);
    drop(ex);

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[rule]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"2/fortnight\"\n").unwrap();
    let out = Command::new(binary("production"))
        .env("PORT", "0")
        .env("ADMIN_PORT", "0")
        .env("LIMITS_FILE", &bad)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rule \"ip\", field `quota`"), "{stderr}");
}

#[cfg(feature = "tonic")]
#[test]
fn tonic_demo_is_limited_with_a_retry_pushback() {
    let ex = Example::start("tonic_server", &["demo"], &[]);
    let (out, ok) = ex.finish();
    assert!(ok, "{out:#?}");
    assert!(out[0].starts_with("listening on http://127.0.0.1:"), "{out:#?}");
    for (i, left) in (1..=5).zip((0..5).rev()) {
        assert_eq!(out[i], format!("call {i}: OK Hello, demo! ({left} calls left)"), "{out:#?}");
    }
    // GCRA at 5 a minute: the next call fits about 12 s after the first.
    let wait = out[6].strip_prefix("call 6: ResourceExhausted by rule api-key, retry in ").expect("sixth call limited");
    let ms: u64 = wait.strip_suffix(" ms").unwrap().parse().unwrap();
    assert!((10_000..=12_000).contains(&ms), "{ms}");
}

/// Every path the README names exists (issue 38: it named `src/limiter/admin.rs` long after
/// the file was gone): each `` `src/…` ``, `` `tests/…` ``, `` `examples/…` ``, `` `bench/…` ``
/// or `` `docs/…` `` in backticks or a link, and each file a row of "Where things are" names
/// in its folder (`` (`plan.rs`) `` in the row of `src/limiter/`).
#[test]
fn the_readme_names_only_paths_that_exist() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    fn found(dir: &std::path::Path, name: &str) -> bool {
        std::fs::read_dir(dir).unwrap().flatten().any(|e| {
            let p = e.path();
            if p.is_dir() {
                found(&p, name)
            } else {
                p.file_name().is_some_and(|n| n == name)
            }
        })
    }
    let mut missing = Vec::new();
    let mut check = |path: &str| {
        let path = path.split('#').next().unwrap().trim_end_matches(':');
        if !root.join(path).exists() {
            missing.push(path.to_owned());
        }
    };
    let roots = ["src/", "tests/", "examples/", "bench/", "docs/"];
    for piece in readme.split(['`', '(', ')', ' ', '\n']) {
        if roots.iter().any(|r| piece.starts_with(r)) && !piece.contains('*') && !piece.contains('<') {
            check(piece);
        }
    }
    let table = readme.split("## Where things are").nth(1).expect("the section").split("\n## ").next().unwrap();
    for row in table.lines().filter(|l| l.starts_with("| `src/")) {
        let dir = row.trim_start_matches("| `").split('`').next().unwrap();
        if !dir.ends_with('/') {
            continue;
        }
        for name in row.split('`').skip(1).step_by(2).filter(|n| n.ends_with(".rs") && !n.contains('/')) {
            // In the folder or one of its own (`table.rs` of `src/store/`'s `memory/`).
            if !found(&root.join(dir), name) {
                missing.push(format!("{dir}…/{name}"));
            }
        }
    }
    assert!(missing.is_empty(), "the README names paths that do not exist: {missing:?}");
}
