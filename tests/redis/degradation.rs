//! Bounded degradation under a slow or dead Redis (issue 26), as an operator would see it:
//! three axum servers, each with its own `RedisStore` and every setting at its default,
//! share one key limited to 100 an hour while the redis-server (or the cluster master of the
//! key) is stalled by SIGSTOP/SIGCONT, or killed and restarted empty. 50 clients send 1,000
//! requests over real HTTP: at most max(1.1 × L, L + N) = 110 may be admitted while the
//! store is stalled; killed and restarted empty, it forgets what it had admitted, and the
//! README states up to L more after the restart: 210, under N × L = 300. None refused with
//! 503, none slower than 2 s.
//!
//! Each test prints one line of figures (`--nocapture` shows them).
#![cfg(feature = "redis")]

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::{key, Algorithm, Quota, RateLimitLayer, RedisStore};

use support::redis::{RedisCluster, RedisServer};

const SERVERS: usize = 3;
const REQUESTS: usize = 1_000;
const CLIENTS: usize = 50;
/// max(1.1 × L, L + N) for L = 100 and N = 3 servers.
const STALL_BOUND: usize = 110;
/// The README's bound for a store killed and restarted empty: max(1.1 × L, L + N) while
/// it is down, and up to L more after the restart (it forgot what it had admitted); under
/// N × L = 300.
const KILL_BOUND: usize = 210;
/// No request may take longer, stalled store or not.
const SLOWEST: Duration = Duration::from_secs(2);
/// How long the killed redis-server stays down.
const DOWN: Duration = Duration::from_secs(2);
/// Each client's pause between requests in the kill scenario: about 200 requests a second,
/// so that some 400 are sent while Redis is down and some 500 after its restart.
const PACE: Duration = Duration::from_millis(250);

/// What the clients and the handlers saw, and what the fault did when.
#[derive(Default)]
struct Tally {
    seed: u64,
    sent: AtomicUsize,
    ok: AtomicUsize,
    limited: AtomicUsize,
    unavailable: AtomicUsize,
    other: AtomicUsize,
    /// Calls of the handler for the scenario's key (the warm-up's are not counted).
    handler: Arc<AtomicUsize>,
    longest_us: AtomicU64,
    /// Set when the clients are done (or gave up): the fault ends.
    done: AtomicBool,
    /// The fault's events: what, requests sent and 200s received by then.
    marks: Mutex<Vec<(&'static str, usize, usize)>>,
}

impl Tally {
    fn mark(&self, what: &'static str) {
        self.marks.lock().unwrap().push((what, self.sent.load(SeqCst), self.ok.load(SeqCst)));
    }
}

/// Ends the fault when dropped: the clients are done, or a panic unwinds.
struct Finish<'a>(&'a Tally);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.done.store(true, SeqCst);
    }
}

/// SIGCONTs the server when dropped, so that no process stays stopped, even on a panic.
struct Resume<'a>(&'a RedisServer);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        if self.0.is_running() {
            self.0.resume();
        }
    }
}

/// xorshift64: the stall's rhythm, reproducible from the printed seed.
struct XorShift(u64);

impl XorShift {
    fn millis(&mut self, low: u64, high: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(low + self.0 % (high - low + 1))
    }
}

fn now_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// A key no store has seen.
fn fresh_key(what: &str) -> String {
    format!("{what}-{}", now_nanos())
}

/// A fault, run on its own thread: it sends on `started` once in effect, and ends when
/// the tally is `done`.
trait Fault: FnOnce(&Tally, mpsc::Sender<()>) + Send {}
impl<F: FnOnce(&Tally, mpsc::Sender<()>) + Send> Fault for F {}

/// SIGSTOP for 60–120 ms (the first stop 100 ms), SIGCONT for 20–50 ms, until the clients
/// are done; then running for good.
fn stall(server: &RedisServer) -> impl Fault + '_ {
    move |tally: &Tally, started: mpsc::Sender<()>| {
        let mut rng = XorShift(tally.seed | 1);
        let _resume = Resume(server);
        let mut stop = Duration::from_millis(100);
        server.pause();
        let _ = started.send(());
        loop {
            thread::sleep(stop);
            server.resume();
            if tally.done.load(SeqCst) {
                break;
            }
            thread::sleep(rng.millis(20, 50));
            if tally.done.load(SeqCst) {
                break;
            }
            stop = rng.millis(60, 120);
            server.pause();
        }
    }
}

/// SIGKILL; `DOWN` later a restart on the same port, empty (no persistence).
fn kill_and_restart(server: &mut RedisServer) -> impl Fault + '_ {
    move |tally: &Tally, started: mpsc::Sender<()>| {
        server.kill();
        tally.mark("killed");
        let _ = started.send(());
        thread::sleep(DOWN);
        server.restart();
        tally.mark("restarted");
    }
}

/// One scenario: who runs it, on which key, and how the clients send.
struct Scenario {
    label: String,
    algorithm: Algorithm,
    api_key: String,
    /// Requests sent (and answered) before the fault begins.
    before_fault: usize,
    /// Each client's pause between two requests.
    pace: Duration,
    /// The rules swapped on every server while the fault lasts (the same quota set again,
    /// as a reload of an unchanged file does): the bound holds across it.
    swap: bool,
}

impl Scenario {
    fn stalled(label: &str, algorithm: Algorithm, api_key: String) -> Self {
        Scenario {
            label: format!("{algorithm} {label}"),
            algorithm,
            api_key,
            before_fault: 0,
            pace: Duration::ZERO,
            swap: false,
        }
    }

    /// The same after the key's quota was spent through the store (150 requests before
    /// the fault), with the quota set again on every server 300 ms into the fault and the
    /// clients paced (50 ms) so that most requests come after the swap: the servers must
    /// not forget what the store said remains.
    fn swapped(mut self) -> Self {
        self.label.push_str(", spent first, quota set again on every server during the stall");
        self.swap = true;
        self.before_fault = 150;
        self.pace = Duration::from_millis(50);
        self
    }
}

/// When the rules are swapped during the fault.
const SWAP_AFTER: Duration = Duration::from_millis(300);

/// Starts one server with the defaults; its handler counts its calls. Its address, and the
/// handle that swaps its rules.
async fn serve(
    store: RedisStore,
    algorithm: Algorithm,
    calls: Arc<AtomicUsize>,
) -> (SocketAddr, tollgate::LimiterHandle<tollgate::RequestHead>) {
    let layer = RateLimitLayer::builder(store)
        .rule("default", Quota::per_hour(100), key::header("x-api-key"))
        .algorithm(algorithm)
        .build()
        .unwrap();
    let handle = layer.handle();
    let handler = move || {
        calls.fetch_add(1, SeqCst);
        async { "ok" }
    };
    let app = axum::Router::new().route("/", axum::routing::get(handler)).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    (addr, handle)
}

/// One HTTP/1.1 request over a new TCP connection; the status code.
async fn get(addr: SocketAddr, api_key: &str) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: t\r\nx-api-key: {api_key}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("bad response {text:?}"))
}

/// `CLIENTS` clients send requests round robin over the servers until `until` were sent.
async fn hammer(servers: &[SocketAddr], api_key: &str, until: usize, pace: Duration, tally: &Arc<Tally>) {
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (servers, api_key, tally) = (servers.to_vec(), api_key.to_owned(), tally.clone());
            tokio::spawn(async move {
                while let Ok(i) = tally.sent.fetch_update(SeqCst, SeqCst, |n| (n < until).then_some(n + 1)) {
                    let begun = Instant::now();
                    let status = get(servers[i % servers.len()], &api_key).await;
                    tally.longest_us.fetch_max(begun.elapsed().as_micros() as u64, SeqCst);
                    let counter = match status {
                        200 => &tally.ok,
                        429 => &tally.limited,
                        503 => &tally.unavailable,
                        _ => &tally.other,
                    };
                    counter.fetch_add(1, SeqCst);
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
}

/// The figures of one run.
struct Outcome {
    line: String,
    admitted: usize,
    unavailable: usize,
    longest: Duration,
}

impl Outcome {
    /// At most `bound` admitted, no 503, no request slower than `SLOWEST`.
    fn check(&self, bound: usize) {
        let mut broken = Vec::new();
        if self.admitted > bound {
            broken.push(format!("admitted {} > {bound}", self.admitted));
        }
        if self.unavailable > 0 {
            broken.push(format!("{} answered 503: the default must fail open within a share", self.unavailable));
        }
        if self.longest >= SLOWEST {
            broken.push(format!("a request took {:?} (>= {SLOWEST:?})", self.longest));
        }
        assert!(broken.is_empty(), "{}\n{}", self.line, broken.join("\n"));
    }
}

/// Three stores made first, three servers, one warm-up request each on a key of its own,
/// then `before_fault` requests, then the fault and the rest of the 1,000 requests.
fn run(sc: Scenario, make_store: impl Fn() -> RedisStore, fault: impl Fault) -> Outcome {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let tally = Arc::new(Tally { seed: now_nanos(), ..Tally::default() });
    let stores: Vec<RedisStore> = {
        let _rt = rt.enter();
        (0..SERVERS).map(|_| make_store()).collect()
    };
    let (servers, handles) = rt.block_on(async {
        let (mut servers, mut handles) = (Vec::new(), Vec::new());
        for store in stores {
            let (addr, handle) = serve(store, sc.algorithm, tally.handler.clone()).await;
            servers.push(addr);
            handles.push(handle);
        }
        for (i, &server) in servers.iter().enumerate() {
            assert_eq!(get(server, &format!("{}-warm-up-{i}", sc.api_key)).await, 200, "warm-up");
        }
        (servers, handles)
    });
    tally.handler.store(0, SeqCst);
    let begun = Instant::now();
    rt.block_on(hammer(&servers, &sc.api_key, sc.before_fault, Duration::ZERO, &tally));
    thread::scope(|s| {
        let (started, in_effect) = mpsc::channel();
        let t = &*tally;
        s.spawn(move || fault(t, started));
        let _finish = Finish(t);
        in_effect.recv().expect("the fault began");
        if sc.swap {
            let handles = &handles;
            s.spawn(move || {
                thread::sleep(SWAP_AFTER);
                for h in handles {
                    h.set_quota("default", Quota::per_hour(100)).unwrap();
                }
                t.mark("swapped");
            });
        }
        rt.block_on(hammer(&servers, &sc.api_key, REQUESTS, sc.pace, &tally));
    });
    let took = begun.elapsed();
    let (ok, handler) = (tally.ok.load(SeqCst), tally.handler.load(SeqCst));
    let admitted = ok.max(handler);
    let unavailable = tally.unavailable.load(SeqCst);
    let longest = Duration::from_micros(tally.longest_us.load(SeqCst));
    let marks: String = tally
        .marks
        .lock()
        .unwrap()
        .iter()
        .map(|(what, sent, ok)| format!(", {what} after {sent} sent ({ok} ok)"))
        .collect();
    let line = format!(
        "degradation: {}: admitted {admitted} of {REQUESTS} (handler {handler}), 429s {}, 503s {unavailable}, \
         other {}, longest {} ms{marks}; {:.1} s, seed {}",
        sc.label,
        tally.limited.load(SeqCst),
        tally.other.load(SeqCst),
        longest.as_millis(),
        took.as_secs_f64(),
        tally.seed,
    );
    println!("{line}");
    Outcome { line, admitted, unavailable, longest }
}

fn stalled_standalone(algorithm: Algorithm, swap: bool) {
    let redis = RedisServer::start();
    let url = redis.url();

    let mut sc = Scenario::stalled("standalone stalled", algorithm, fresh_key("stalled"));
    if swap {
        sc = sc.swapped();
    }
    run(sc, || RedisStore::from_url(&url).unwrap(), stall(&redis)).check(STALL_BOUND);
}

#[test]
fn a_stalled_redis_admits_at_most_110_of_100_gcra() {
    stalled_standalone(Algorithm::Gcra, false);
}

/// The same quota set again on every server 300 ms into the stall (a reload of an
/// unchanged file): what the servers learnt of the key survives the swap.
#[test]
fn a_stalled_redis_admits_at_most_110_of_100_across_a_swap() {
    stalled_standalone(Algorithm::Gcra, true);
}

#[test]
fn a_stalled_redis_admits_at_most_110_of_100_sliding_window_log() {
    stalled_standalone(Algorithm::SlidingWindowLog, false);
}

/// Only the master that owns the key's slot is stalled (the slot is the hash tag's: the
/// client key, `<prefix>:{<key>}:<rule>:…`).
#[test]
fn a_stalled_cluster_master_admits_at_most_110_of_100() {
    stalled_cluster_master(false);
}

/// The same, with the quota set again on every server during the stall.
#[test]
fn a_stalled_cluster_master_admits_at_most_110_of_100_across_a_swap() {
    stalled_cluster_master(true);
}

fn stalled_cluster_master(swap: bool) {
    let cluster = RedisCluster::start(3);
    let api_key = fresh_key("stalled-master");
    let slot: u16 = cluster.node(0).cmd(&["CLUSTER", "KEYSLOT", &format!("{{{api_key}}}")]).parse().unwrap();
    let owner = cluster.owner_of(slot).expect("an owner of the key's slot");
    let label = format!("cluster, master {owner} of slot {slot} stalled");
    let urls = cluster.urls();
    let mut sc = Scenario::stalled(&label, Algorithm::Gcra, api_key.clone());
    if swap {
        sc = sc.swapped();
    }
    let outcome = run(sc, || RedisStore::cluster(urls.clone()).unwrap(), stall(cluster.node(owner)));
    // The stalled master is the one the key lives on.
    let names = cluster.node(owner).cmd(&["KEYS", &format!("*{{{api_key}}}*")]);
    assert!(!names.is_empty(), "{}: the key is not on master {owner}", outcome.line);
    outcome.check(STALL_BOUND);
}

/// Killed after 50 answers (before the key's first rejection), down for 2 s while the
/// clients keep sending, restarted empty; the clients go on until 1,000 were sent.
#[test]
fn a_redis_killed_before_the_first_rejection_and_restarted_empty_stays_bounded() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let sc = Scenario {
        label: format!("gcra standalone killed for {DOWN:?} after 50, restarted empty"),
        algorithm: Algorithm::Gcra,
        api_key: fresh_key("killed"),
        before_fault: 50,
        pace: PACE,
        swap: false,
    };
    run(sc, || RedisStore::from_url(&url).unwrap(), kill_and_restart(&mut redis)).check(KILL_BOUND);
}

/// Many keys admitted by the fallback while Redis was down, written back after its
/// restart: every one reaches it (each call has its own time; it once shared one second
/// for all, and dropped what was left), and a key busy during the outage stays within
/// its limit across it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_of_many_keys_reaches_redis() {
    const KEYS: usize = 20_000;
    let mut server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let user = |u: &str| Some(tollgate::key::Key::from(u));
    let limiter =
        tollgate::Limiter::<_, str>::builder(store.clone()).rule("r", Quota::per_hour(10), user).build().unwrap();
    assert!(limiter.check("warm").await.is_allowed());
    server.kill();
    let mut fallback = 0;
    for i in 0..KEYS {
        let v = limiter.check(&format!("u{i}")).await;
        fallback += usize::from(v.is_allowed());
    }
    // One key busy while Redis is down, after the others.
    let mut busy_down = 0;
    for _ in 0..20 {
        busy_down += usize::from(limiter.check("busy").await.is_allowed());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart();
    until_the_store_decides(&limiter).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut busy_up = 0;
    for _ in 0..20 {
        busy_up += usize::from(limiter.check("busy").await.is_allowed());
    }
    println!("busy: {busy_down} admitted by the fallback while Redis was down, {busy_up} by Redis after its restart");
    let keys = server.cmd(&["EVAL", "return #redis.call('KEYS', '*u[0-9]*')", "0"]);
    let n: usize = keys.trim().trim_start_matches("(integer) ").parse().unwrap_or_else(|_| panic!("{keys}"));
    println!("Redis counts {n} of the {fallback} keys the fallback admitted");
    assert!(
        busy_down + busy_up <= 10,
        "a key first seen while Redis was down: {busy_down} + {busy_up} admitted for L = 10 (README: what the \
         fallback admitted meanwhile is charged to it, and counts in that L); Redis counts {n} of {fallback} keys"
    );
    assert_eq!(n, fallback, "the fallback admitted {fallback} keys while Redis was down; Redis counts {n} of them");
}

/// Redis stalls (SIGSTOP) and dies while three calls are in flight (cut by the 50 ms
/// deadline, not yet by the connection's 100 ms timeout): the fallback admits three
/// logins that count (`check`, a verdict kept). Restarted empty, Redis must be charged
/// with them: 10 − 3 = 7 left, not 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_if_units_kept_before_a_connection_reset_reach_redis() {
    let mut server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let user = |u: &str| Some(tollgate::key::Key::from(u));
    let limiter = tollgate::Limiter::<_, str>::builder(store.clone())
        .add_rule(tollgate::Rule::new("login", Quota::per_hour(10), user).count_if(|s| s.as_u16() == 401))
        .servers(1)
        .build()
        .unwrap();
    assert!(limiter.check("warm").await.is_allowed());
    server.pause();
    let (a, b, c) = tokio::join!(limiter.check("ada"), limiter.check("ada"), limiter.check("ada"));
    for v in [&a, &b, &c] {
        assert!(v.is_allowed() && v.decided_by() == Some(tollgate::verdict::DecidedBy::Fallback), "{v:?}");
    }
    tokio::time::sleep(Duration::from_millis(15)).await;
    server.kill(); // the three late calls fail with a connection error (not a timeout)
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.restart();
    until_the_store_decides(&limiter).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut after = 0;
    for _ in 0..20 {
        after += usize::from(limiter.check("ada").await.is_allowed());
    }
    assert!(after <= 7, "3 kept logins admitted by the fallback, then {after} more of L = 10 after the restart");
}

/// Checks a key of its own every 50 ms until the store decides (within 10 s of a restart).
async fn until_the_store_decides(limiter: &tollgate::Limiter<RedisStore, str>) {
    let started = std::time::Instant::now();
    while limiter.check("probe").await.decided_by() != Some(tollgate::verdict::DecidedBy::Store) {
        assert!(started.elapsed() < Duration::from_secs(10), "the store never decided again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
