//! Real `redis-server` processes on loopback for integration tests.
//!
//! Std-only on purpose: no extra dev-dependencies. Every server runs in a
//! fresh directory under [`std::env::temp_dir`], logs its stdout/stderr to
//! `redis.log` there, and is killed (SIGKILL) and cleaned up when its handle
//! is dropped, including while a test unwinds from a panic.
//!
//! Each process also gets a tiny `sh` watchdog that holds the read end of a
//! pipe whose write end lives in the test process: if the test binary dies
//! without running destructors (SIGKILL from a timeout, `process::exit`, a
//! server kept in a `static`), the pipe closes and the watchdog SIGKILLs the
//! server and removes its directory, so no `redis-server` outlives the tests.
//!
//! Tests that need Redis never skip: a missing `redis-server` or `redis-cli`
//! binary is a panic with an install hint.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a single server may take to answer `PING` after spawning.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster may take to reach a consistent `cluster_state:ok`.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for one `redis-cli` invocation made through [`RedisServer::cmd`].
const CLI_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for one `redis-cli` probe while polling cluster health.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a bind race is retried before giving up.
const BIND_ATTEMPTS: usize = 8;
/// Redis Cluster has a fixed number of hash slots.
const CLUSTER_SLOTS: usize = 16384;
/// The cluster bus listens on the client port plus this offset.
const BUS_PORT_OFFSET: u16 = 10000;
/// Lines of `redis.log` shown in panic messages.
const LOG_TAIL_LINES: usize = 60;
/// The configuration file of a server started with one, in its directory.
const CONF_FILE: &str = "redis.conf";

const SERVER_NOT_FOUND: &str = "redis-server not found on PATH: install it (apt-get install redis-server) \
     — tests that need Redis never skip";
const CLI_NOT_FOUND: &str = "redis-cli not found on PATH: install it (apt-get install redis-tools) \
     — tests that need Redis never skip";

/// Ports handed to live servers of this test process (cluster nodes also
/// reserve their bus port), so parallel tests never pick the same one.
static RESERVED_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

// ---------------------------------------------------------------------------
// Standalone server
// ---------------------------------------------------------------------------

/// One `redis-server` process on `127.0.0.1`, killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// Extra arguments after the harness's own (`--requirepass`, cluster flags…).
    extra_args: Vec<String>,
    password: Option<String>,
    /// Also reserve `port + 10000` in this process (cluster nodes).
    reserve_bus_port: bool,
    process: Option<ServerProcess>,
    log_path: PathBuf,
    // Declared last so it is removed after the process is gone.
    dir: TempDir,
}

/// Builder for a [`RedisServer`] with extra arguments or a password.
#[derive(Debug, Clone, Default)]
pub struct RedisServerBuilder {
    args: Vec<String>,
    password: Option<String>,
    conf: Option<String>,
}

impl RedisServerBuilder {
    /// Appends one extra `redis-server` argument.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// Appends extra `redis-server` arguments, e.g. `&["--maxmemory", "10mb"]`.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Starts the server with `--requirepass PASSWORD`; [`RedisServer::cmd`]
    /// then authenticates with it.
    pub fn with_password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// Starts the server with this configuration file (written into its directory as
    /// `redis.conf`, writable: a sentinel rewrites its own).
    pub fn conf(mut self, text: &str) -> Self {
        self.conf = Some(text.to_owned());
        self
    }

    /// A sentinel: `redis-server redis.conf --sentinel` (Debian's redis-tools has no
    /// `redis-sentinel`), with `conf` as its configuration.
    pub fn sentinel(self, conf: &str) -> Self {
        self.conf(conf).arg("--sentinel")
    }

    /// Spawns the server on a free port and waits until it answers `PING`.
    pub fn start(self) -> RedisServer {
        let mut args = self.args;
        if let Some(password) = &self.password {
            args.push("--requirepass".to_owned());
            args.push(password.clone());
        }
        RedisServer::start_on_free_port(args, self.conf)
    }
}

impl RedisServer {
    /// Spawns `redis-server` on a free loopback port and waits until it is ready.
    pub fn start() -> RedisServer {
        Self::builder().start()
    }

    /// Like [`RedisServer::start`], with extra `redis-server` arguments
    /// (e.g. `&["--requirepass", "secret"]`). A `--requirepass` here is
    /// picked up by [`RedisServer::cmd`] and [`RedisServer::url_with_auth`].
    pub fn start_with_args(args: &[&str]) -> RedisServer {
        Self::builder().args(args).start()
    }

    /// Runs `redis-cli` with a password of its own (a sentinel's, say).
    pub fn cmd_with_password(&self, password: &str, args: &[&str]) -> String {
        let mut command = Command::new(cli_binary());
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--no-auth-warning", "-a", password]);
        command.args(args);
        run_with_timeout(command, CLI_TIMEOUT).map(|out| out.stdout.trim().to_owned()).unwrap_or_else(|e| e)
    }

    /// A builder for extra arguments and/or a password.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port the server listens on (stable across [`RedisServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis://:PASSWORD@127.0.0.1:PORT` when a password is set, else [`RedisServer::url`].
    ///
    /// The password is inserted verbatim (not percent-encoded).
    pub fn url_with_auth(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => self.url(),
        }
    }

    /// The password given via `--requirepass` / [`RedisServerBuilder::with_password`].
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The OS process id. Panics if the server was [`RedisServer::kill`]ed.
    pub fn pid(&self) -> u32 {
        self.running("pid").child.id()
    }

    /// Whether a process is currently attached (false after [`RedisServer::kill`]).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// The server's private working directory.
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// Where the server's stdout/stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_of_file(&self.log_path, lines)
    }

    /// SIGKILLs the server and waits for it to exit. Idempotent. The port
    /// then refuses connections until [`RedisServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// SIGSTOPs the server: connections are still accepted by the kernel but
    /// nothing is answered. Returns once the process is actually stopped.
    pub fn pause(&self) {
        let pid = self.pid();
        send_signal(pid, "STOP");
        wait_for_proc_state(pid, true);
    }

    /// SIGCONTs a [`RedisServer::pause`]d server. Returns once it runs again.
    pub fn resume(&self) {
        let pid = self.pid();
        send_signal(pid, "CONT");
        wait_for_proc_state(pid, false);
    }

    /// Kills the server (if running) and starts it again on the same port,
    /// with the same arguments and the same directory, then waits until ready.
    pub fn restart(&mut self) {
        self.kill();
        let mut last_failure = String::new();
        for attempt in 0..BIND_ATTEMPTS {
            match spawn_and_wait(self.port, &self.extra_args, &self.dir.0, &self.log_path) {
                Ok(process) => {
                    self.process = Some(process);
                    return;
                }
                Err(StartError::AddrInUse(log)) => {
                    last_failure = log;
                    thread::sleep(Duration::from_millis(100 * (attempt as u64 + 1)));
                }
            }
        }
        panic!(
            "redis-server could not re-bind port {} after {BIND_ATTEMPTS} attempts\n\
             --- redis.log (tail) ---\n{last_failure}",
            self.port
        );
    }

    /// Sends one RESP `PING` over a fresh connection, waiting at most
    /// `timeout` for connect and reply. Returns the first reply line
    /// (`+PONG`, `-NOAUTH …`, …).
    pub fn ping(&self, timeout: Duration) -> io::Result<String> {
        resp_ping(self.port, timeout)
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT [--no-auth-warning -a PASS] ARGS…`
    /// and returns its stdout, trimmed. Error replies come back as text
    /// (`ERR …`); a failure to run or connect (or 30 s without an answer)
    /// panics with the server log.
    /// `INFO commandstats` as command → calls.
    pub fn commandstats(&self) -> std::collections::BTreeMap<String, u64> {
        self.cmd(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args).unwrap_or_else(|err| {
            panic!(
                "redis-cli -p {} {args:?} failed: {err}\n--- redis.log (tail) ---\n{}",
                self.port,
                self.log_tail(LOG_TAIL_LINES)
            )
        })
    }

    /// Like [`RedisServer::cmd`], returning the failure instead of panicking.
    pub fn try_cmd(&self, args: &[&str]) -> Result<String, String> {
        self.cli(false, args, CLI_TIMEOUT)
    }

    fn cli(&self, follow_redirects: bool, args: &[&str], timeout: Duration) -> Result<String, String> {
        let mut command = Command::new(cli_binary());
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if follow_redirects {
            command.arg("-c");
        }
        if let Some(password) = &self.password {
            command.args(["--no-auth-warning", "-a", password]);
        }
        command.args(args);
        let out = run_with_timeout(command, timeout)?;
        if out.status.success() {
            Ok(out.stdout.trim().to_owned())
        } else {
            Err(format!("exit status {}; stdout: {:?}; stderr: {:?}", out.status, out.stdout.trim(), out.stderr.trim()))
        }
    }

    fn running(&self, what: &str) -> &ServerProcess {
        self.process
            .as_ref()
            .unwrap_or_else(|| panic!("RedisServer::{what}: the server on port {} is not running (killed)", self.port))
    }

    /// Picks a free ephemeral port; retries with a new one on a bind race.
    fn start_on_free_port(extra_args: Vec<String>, conf: Option<String>) -> RedisServer {
        let mut last_failure = String::new();
        for _ in 0..BIND_ATTEMPTS {
            let port = free_port();
            match Self::try_start_with(port, extra_args.clone(), false, conf.as_deref()) {
                Ok(server) => return server,
                Err(StartError::AddrInUse(log)) => last_failure = log,
            }
        }
        panic!(
            "redis-server could not bind a free port after {BIND_ATTEMPTS} attempts\n\
             --- redis.log (tail) ---\n{last_failure}"
        );
    }

    /// Starts on exactly `port`; reports a bind failure so the caller can pick another.
    fn try_start_on(port: u16, extra_args: Vec<String>, reserve_bus_port: bool) -> Result<RedisServer, StartError> {
        Self::try_start_with(port, extra_args, reserve_bus_port, None)
    }

    fn try_start_with(
        port: u16,
        extra_args: Vec<String>,
        reserve_bus_port: bool,
        conf: Option<&str>,
    ) -> Result<RedisServer, StartError> {
        let dir = TempDir::new(port);
        if let Some(conf) = conf {
            fs::write(dir.0.join(CONF_FILE), conf).unwrap_or_else(|e| panic!("cannot write {CONF_FILE}: {e}"));
        }
        let log_path = dir.0.join("redis.log");
        let password = requirepass_in(&extra_args);
        let process = spawn_and_wait(port, &extra_args, &dir.0, &log_path)?;
        reserve(port, reserve_bus_port);
        Ok(RedisServer { port, extra_args, password, reserve_bus_port, process: Some(process), log_path, dir })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        release(self.port, self.reserve_bus_port);
        // `dir` (a TempDir) removes itself afterwards.
    }
}

/// A spawned server plus its watchdog.
#[derive(Debug)]
struct ServerProcess {
    child: Child,
    watchdog: Option<Child>,
}

impl ServerProcess {
    fn kill(&mut self) {
        // Watchdog first: it must not fire once the pid can be reused.
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        // SIGKILL also ends a SIGSTOPped process; no SIGCONT needed.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug)]
enum StartError {
    /// The port (or its cluster bus port) was taken; carries the log tail.
    AddrInUse(String),
}

/// Spawns `redis-server` on `port` and waits for it to be ready.
///
/// Ready means: this process's log says "Ready to accept connections" (so a
/// `PONG` from some other server that won the port race is not mistaken for
/// ours), it is still alive, and a RESP `PING` gets `+PONG` or `-NOAUTH`.
fn spawn_and_wait(port: u16, extra_args: &[String], dir: &Path, log_path: &Path) -> Result<ServerProcess, StartError> {
    let binary = server_binary();
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", log_path.display()));
    let _ = writeln!(log, "=== tollgate test harness: starting redis-server on 127.0.0.1:{port} ===");
    let log_offset = fs::metadata(log_path).map(|m| m.len()).unwrap_or(0);
    let log_err = log.try_clone().expect("clone log file handle");

    let mut command = Command::new(&binary);
    // A configuration file must come first.
    if dir.join(CONF_FILE).exists() {
        command.arg(dir.join(CONF_FILE));
    }
    command
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .args(["--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra_args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err));
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => panic!("{SERVER_NOT_FOUND}"),
        Err(e) => panic!("cannot spawn {}: {e}", binary.display()),
    };
    let watchdog = spawn_watchdog(child.id(), dir);
    let mut process = ServerProcess { child, watchdog };

    let started = Instant::now();
    let deadline = started + READY_TIMEOUT;
    let mut last_ping = String::from("(no PING attempted yet)");
    loop {
        if let Ok(Some(status)) = process.child.try_wait() {
            let new_log = read_from(log_path, log_offset);
            let tail = tail_of_file(log_path, LOG_TAIL_LINES);
            if new_log.contains("Address already in use") || new_log.contains("Failed listening on port") {
                return Err(StartError::AddrInUse(tail));
            }
            panic!(
                "redis-server on port {port} exited before becoming ready ({status})\n\
                 command: {command:?}\n--- {} (tail) ---\n{tail}",
                log_path.display()
            );
        }
        let log = read_from(log_path, log_offset);
        if log.contains("Ready to accept connections") || log.contains("Sentinel ID is") {
            match resp_ping(port, Duration::from_millis(500)) {
                Ok(reply) if reply == "+PONG" || reply.starts_with("-NOAUTH") => return Ok(process),
                Ok(reply) => last_ping = format!("PING replied {reply:?}"),
                Err(e) => last_ping = format!("PING failed: {e}"),
            }
        }
        if Instant::now() >= deadline {
            process.kill();
            panic!(
                "redis-server on port {port} not ready within {READY_TIMEOUT:?}; last: {last_ping}\n\
                 command: {command:?}\n--- {} (tail) ---\n{}",
                log_path.display(),
                tail_of_file(log_path, LOG_TAIL_LINES)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// `sh` blocks reading a pipe we hold the write end of; when this process
/// dies the pipe closes and it SIGKILLs the server and removes its
/// directory. Best effort. Normal shutdown kills the watchdog first.
fn spawn_watchdog(pid: u32, dir: &Path) -> Option<Child> {
    Command::new("sh")
        .args(["-c", "read -r _; kill -9 \"$0\" 2>/dev/null; rm -rf \"$1\"", &pid.to_string()])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn resp_ping(port: u16, timeout: Duration) -> io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let _ = stream.shutdown(Shutdown::Both);
    if line.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    Ok(line.trim_end().to_owned())
}

fn requirepass_in(args: &[String]) -> Option<String> {
    args.windows(2)
        .rev()
        .find(|pair| pair[0].eq_ignore_ascii_case("--requirepass"))
        .map(|pair| pair[1].clone())
        .filter(|password| !password.is_empty())
}

// ---------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------

/// A Redis Cluster of `masters` master nodes (with or without one replica each), all
/// slots assigned.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    masters: usize,
}

impl RedisCluster {
    /// Starts `masters` (at least 3) cluster-enabled servers, joins them with
    /// `redis-cli --cluster create`, and waits until every node reports
    /// `cluster_state:ok` and all nodes agree on the slot map.
    pub fn start(masters: usize) -> RedisCluster {
        Self::start_with(masters, 0, 2000, true)
    }

    /// Like [`RedisCluster::start`], with one replica behind every master
    /// (`--cluster-replicas 1`, `cluster-node-timeout` 1000 ms, diskless sync without
    /// delay); returns once every replica reports `master_link_status:up`. With
    /// `full_coverage` false (`cluster-require-full-coverage no`), the other masters keep
    /// serving their slots while a failed master's are not served.
    pub fn start_with_replicas(masters: usize, full_coverage: bool) -> RedisCluster {
        let cluster = Self::start_with(masters, 1, CLUSTER_NODE_TIMEOUT_MS, full_coverage);
        cluster.wait_replicas_up();
        cluster
    }

    fn start_with(masters: usize, replicas: usize, node_timeout_ms: u64, full_coverage: bool) -> RedisCluster {
        assert!(masters >= 3, "redis-cli --cluster create needs at least 3 masters, got {masters}");
        let total = masters * (1 + replicas);
        let mut nodes: Vec<RedisServer> = Vec::with_capacity(total);
        let mut failures = 0;
        while nodes.len() < total {
            let port = free_cluster_port();
            let mut args = cluster_node_args(port, node_timeout_ms);
            args.extend([
                "--cluster-require-full-coverage".to_owned(),
                if full_coverage { "yes" } else { "no" }.to_owned(),
            ]);
            match RedisServer::try_start_on(port, args, true) {
                Ok(node) => nodes.push(node),
                Err(StartError::AddrInUse(log)) => {
                    failures += 1;
                    assert!(
                        failures < BIND_ATTEMPTS * total,
                        "cluster nodes keep failing to bind\n--- last redis.log (tail) ---\n{log}"
                    );
                }
            }
        }
        let cluster = RedisCluster { nodes, masters };

        let mut command = Command::new(cli_binary());
        command.args(["--cluster", "create"]);
        command.args(cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        command.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let shown = format!("{command:?}");
        match run_with_timeout(command, CLUSTER_TIMEOUT) {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "{shown} failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
                out.status,
                out.stdout,
                out.stderr,
                cluster.diagnostics()
            ),
            Err(e) => panic!("{shown} failed: {e}\n{}", cluster.diagnostics()),
        }
        cluster.wait_ok();
        cluster
    }

    /// Waits (30 s at most) until every replica reports `master_link_status:up`.
    pub fn wait_replicas_up(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        for node in &self.nodes {
            loop {
                let info = node.cli(false, &["INFO", "replication"], PROBE_TIMEOUT).unwrap_or_default();
                if info_field(&info, "role") == Some("master") || info_field(&info, "master_link_status") == Some("up")
                {
                    break;
                }
                assert!(Instant::now() < deadline, "replica {} not in sync: {info}\n{}", node.port, self.diagnostics());
                thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The node that serves `slot` now as the first live node that answers sees it
    /// (`CLUSTER NODES`; `None` while no master that is not failed serves it).
    pub fn owner_of(&self, slot: u16) -> Option<usize> {
        let port = self.nodes.iter().filter(|n| n.is_running()).find_map(|n| {
            let raw = n.cli(false, &["CLUSTER", "NODES"], PROBE_TIMEOUT).ok()?;
            Some(slot_owner(&raw, slot))
        })??;
        self.nodes.iter().position(|n| n.port == port)
    }

    /// `redis://127.0.0.1:PORT` of every node, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The client port of every node, in node order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The node handles (pause/resume/cmd/pid work through these).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, mutably (to [`RedisServer::kill`] it; bring it back with
    /// [`RedisCluster::restart_node`], or [`RedisServer::restart`] followed by
    /// [`RedisCluster::wait_ok`]).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Kills node `i` (if running) and starts it on the same port, in the
    /// same directory with the same `nodes-PORT.conf`, so it rejoins with
    /// its node id and slots; then waits for the whole cluster to be ok.
    pub fn restart_node(&mut self, i: usize) {
        self.nodes[i].restart();
        self.wait_ok();
    }

    /// Runs [`RedisServer::cmd`] on every node; replies in node order.
    pub fn cmd_all(&self, args: &[&str]) -> Vec<String> {
        self.nodes.iter().map(|node| node.cmd(args)).collect()
    }

    /// Runs `redis-cli -c` (following MOVED/ASK) against node `i`.
    pub fn cluster_cmd(&self, i: usize, args: &[&str]) -> String {
        let node = &self.nodes[i];
        node.cli(true, args, CLI_TIMEOUT).unwrap_or_else(|err| {
            panic!(
                "redis-cli -c -p {} {args:?} failed: {err}\n--- redis.log (tail) ---\n{}",
                node.port,
                node.log_tail(LOG_TAIL_LINES)
            )
        })
    }

    /// Waits (30 s at most, else panics with every node's view) until every
    /// node reports `cluster_state:ok` with all 16384 slots ok, sees every
    /// node connected and not failing, and all nodes agree on who owns which slot.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let problem = match self.check_health() {
                Ok(()) => return,
                Err(problem) => problem,
            };
            if Instant::now() >= deadline {
                panic!("cluster not ok within {CLUSTER_TIMEOUT:?}: {problem}\n{}", self.diagnostics());
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn check_health(&self) -> Result<(), String> {
        let expected: BTreeSet<u16> = self.nodes.iter().map(|n| n.port).collect();
        let mut agreed: Option<(u16, SlotMap)> = None;
        for node in &self.nodes {
            let port = node.port;
            if !node.is_running() {
                return Err(format!("node {port} is not running"));
            }
            let info = node
                .cli(false, &["CLUSTER", "INFO"], PROBE_TIMEOUT)
                .map_err(|e| format!("node {port}: CLUSTER INFO: {e}"))?;
            for (field, want) in [
                ("cluster_state", "ok".to_owned()),
                ("cluster_slots_assigned", CLUSTER_SLOTS.to_string()),
                ("cluster_slots_ok", CLUSTER_SLOTS.to_string()),
                ("cluster_known_nodes", self.nodes.len().to_string()),
            ] {
                let got = info_field(&info, field);
                if got != Some(want.as_str()) {
                    return Err(format!("node {port}: {field} is {got:?}, want {want}"));
                }
            }
            let raw = node
                .cli(false, &["CLUSTER", "NODES"], PROBE_TIMEOUT)
                .map_err(|e| format!("node {port}: CLUSTER NODES: {e}"))?;
            let view = parse_cluster_nodes(&raw).map_err(|e| format!("node {port}: {e}"))?;
            let seen: BTreeSet<u16> = view.iter().map(|(p, _)| *p).collect();
            if seen.len() != self.masters || !seen.is_subset(&expected) {
                return Err(format!("node {port} sees masters {seen:?}, want {} of {expected:?}", self.masters));
            }
            let covered: usize = view.iter().flat_map(|(_, r)| r).map(|(a, b)| b - a + 1).sum();
            if covered != CLUSTER_SLOTS {
                return Err(format!("node {port} sees {covered} slots assigned"));
            }
            match &agreed {
                None => agreed = Some((port, view)),
                Some((first, first_view)) if *first_view != view => {
                    return Err(format!("nodes {first} and {port} disagree on the slot map"));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Every node's `CLUSTER INFO`, `CLUSTER NODES` and log tail, for panics.
    fn diagnostics(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let _ = writeln!(out, "===== node 127.0.0.1:{} =====", node.port);
            if node.is_running() {
                for args in [["CLUSTER", "INFO"], ["CLUSTER", "NODES"]] {
                    let reply = node.cli(false, &args, PROBE_TIMEOUT).unwrap_or_else(|e| e);
                    let _ = writeln!(out, "--- {} ---\n{reply}", args.join(" "));
                }
            } else {
                let _ = writeln!(out, "(not running)");
            }
            let _ = writeln!(out, "--- redis.log (tail) ---\n{}", node.log_tail(20));
        }
        out
    }
}

/// `cluster-node-timeout` of a cluster with replicas: failovers take about this long.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1000;

fn cluster_node_args(port: u16, node_timeout_ms: u64) -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &format!("nodes-{port}.conf"),
        "--cluster-node-timeout",
        &node_timeout_ms.to_string(),
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .find(|(key, _)| *key == field)
        .map(|(_, value)| value.trim())
}

/// The port of the master that serves `slot` in one node's `CLUSTER NODES` (masters
/// flagged `fail` do not count).
fn slot_owner(raw: &str, slot: u16) -> Option<u16> {
    let slot = usize::from(slot);
    raw.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = fields.get(2)?;
        if !flags.split(',').any(|f| f == "master") || flags.split(',').any(|f| f == "fail") {
            return None;
        }
        let serves = fields.get(8..)?.iter().filter(|s| !s.starts_with('[')).any(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            matches!((a.parse::<usize>(), b.parse::<usize>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
        });
        let port = fields[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
        serves.then_some(port)
    })
}

/// Sorted `(master port, sorted inclusive slot ranges)`.
type SlotMap = Vec<(u16, Vec<(usize, usize)>)>;

/// One node's `CLUSTER NODES` as sorted `(master port, slot ranges)`,
/// or an error if any node is failing, handshaking or disconnected.
fn parse_cluster_nodes(raw: &str) -> Result<SlotMap, String> {
    let mut masters = Vec::new();
    for line in raw.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(format!("malformed CLUSTER NODES line {line:?}"));
        }
        let (addr, flags, link) = (fields[1], fields[2], fields[7]);
        for bad in ["fail", "fail?", "handshake", "noaddr"] {
            if flags.split(',').any(|f| f == bad) {
                return Err(format!("{addr} is flagged {flags}"));
            }
        }
        if link != "connected" {
            return Err(format!("{addr} link is {link}"));
        }
        if !flags.split(',').any(|f| f == "master") {
            continue;
        }
        let host_port = addr.split('@').next().unwrap_or(addr);
        let port = host_port
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| format!("bad address {addr:?}"))?;
        let mut ranges = Vec::new();
        for slot in fields[8..].iter().filter(|s| !s.starts_with('[')) {
            let range = match slot.split_once('-') {
                Some((a, b)) => (a.parse(), b.parse()),
                None => (slot.parse(), slot.parse()),
            };
            match range {
                (Ok(a), Ok(b)) => ranges.push((a, b)),
                _ => return Err(format!("bad slot {slot:?} in {line:?}")),
            }
        }
        ranges.sort_unstable();
        masters.push((port, ranges));
    }
    masters.sort();
    Ok(masters)
}

// ---------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------

/// A port the kernel just handed out for `127.0.0.1:0`, not used by this
/// process's other servers. It may still be taken before redis binds it;
/// callers retry on `AddrInUse`.
fn free_port() -> u16 {
    for _ in 0..100 {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0: {e}"));
        if !is_reserved(port) {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// A random port `P` such that both `P` and `P + 10000` (cluster bus) can be
/// bound now. Chosen below the kernel's ephemeral range so the bus port does
/// not collide with outgoing connections or `free_port` picks.
fn free_cluster_port() -> u16 {
    let (low, high) = cluster_port_range();
    for _ in 0..1000 {
        let port = low + (random_u64() % u64::from(high - low)) as u16;
        let bus = port + BUS_PORT_OFFSET;
        if is_reserved(port) || is_reserved(bus) {
            continue;
        }
        let client = TcpListener::bind(("127.0.0.1", port));
        let cluster_bus = TcpListener::bind(("127.0.0.1", bus));
        if client.is_ok() && cluster_bus.is_ok() {
            return port;
        }
    }
    panic!("no free port pair (P, P+10000) found in {low}..{high}");
}

/// `[10000, ephemeral_low - 10000)` when wide enough, else `20000..50000`.
fn cluster_port_range() -> (u16, u16) {
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<u16>().ok()));
    match ephemeral_low {
        Some(low) if low >= 10000 + BUS_PORT_OFFSET + 1000 => (10000, low - BUS_PORT_OFFSET),
        _ => (20000, 50000),
    }
}

fn reserved_ports() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    RESERVED_PORTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn is_reserved(port: u16) -> bool {
    reserved_ports().contains(&port)
}

fn reserve(port: u16, bus: bool) {
    let mut ports = reserved_ports();
    ports.insert(port);
    if bus {
        ports.insert(port.wrapping_add(BUS_PORT_OFFSET));
    }
}

fn release(port: u16, bus: bool) {
    let mut ports = reserved_ports();
    ports.remove(&port);
    if bus {
        ports.remove(&port.wrapping_add(BUS_PORT_OFFSET));
    }
}

fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(SEQUENCE.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    hasher.finish()
}

// ---------------------------------------------------------------------------
// Processes, files, binaries
// ---------------------------------------------------------------------------

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file())
}

fn server_binary() -> PathBuf {
    find_on_path("redis-server").unwrap_or_else(|| panic!("{SERVER_NOT_FOUND}"))
}

fn cli_binary() -> PathBuf {
    find_on_path("redis-cli").unwrap_or_else(|| panic!("{CLI_NOT_FOUND}"))
}

fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run `kill -{signal} {pid}`: {e}"));
    assert!(status.success(), "`kill -{signal} {pid}` failed: {status}");
}

/// Polls `/proc/PID/stat` until the process is (or is no longer) stopped;
/// a no-op where `/proc` is unavailable.
fn wait_for_proc_state(pid: u32, stopped: bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return;
        };
        // The state letter follows the parenthesised command name.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
        let is_stopped = matches!(state, Some('T') | Some('t'));
        if is_stopped == stopped || state.is_none() {
            return;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

struct CliOutput {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `command` with piped output, killing it after `timeout`.
fn run_with_timeout(mut command: Command, timeout: Duration) -> Result<CliOutput, String> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => panic!("{CLI_NOT_FOUND}"),
        Err(e) => return Err(format!("cannot spawn {command:?}: {e}")),
    };
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let out = stdout.join().unwrap_or_default();
                return Err(format!("no answer within {timeout:?} (stdout so far: {:?})", out.trim()));
            }
            Err(e) => return Err(format!("waiting for {command:?}: {e}")),
        }
    };
    Ok(CliOutput { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() })
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn read_from(path: &Path, offset: u64) -> String {
    let Ok(bytes) = fs::read(path) else {
        return String::new();
    };
    let start = usize::try_from(offset).unwrap_or(0).min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

fn tail_of_file(path: &Path, lines: usize) -> String {
    let text = read_from(path, 0);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A fresh directory under the system temp dir, removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(port: u16) -> TempDir {
        let base = std::env::temp_dir();
        for _ in 0..100 {
            let name = format!("tollgate-redis-{}-{port}-{:016x}", std::process::id(), random_u64());
            let path = base.join(name);
            match fs::create_dir(&path) {
                Ok(()) => return TempDir(path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create {}: {e}", path.display()),
            }
        }
        panic!("cannot create a fresh temp dir under {}", base.display());
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
