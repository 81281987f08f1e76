//! `RedisStore` against real redis-server processes: one round trip per decision (read
//! from the server's own command statistics), `NOSCRIPT` recovery, configuration errors,
//! unreachable and failing servers, TTLs, and keys with any bytes.
#![cfg(feature = "redis")]

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::redis::RedisServer;
use tollgate::key::Key;
use tollgate::store::Params;
use tollgate::store::{Check, Store};
use tollgate::store::{Outcome, Refund, Taken};
use tollgate::{Algorithm, BuildError, MemoryStore, Quota, RedisStore, StoreError};

fn check(rule: &str, key: impl Into<Key>, algorithm: Algorithm, quota: Quota) -> Check {
    Check { rule: rule.into(), key: key.into(), algorithm, params: Params::new(quota) }
}

async fn store_for(server: &RedisServer) -> RedisStore {
    // Generous timeout: these tests count commands, a slow machine must not add errors.
    let store = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
    store.ping().await.unwrap();
    store
}

/// The commands the test itself sends through redis-cli (not the store's).
const OWN: [&str; 3] = ["info", "config|resetstat", "config"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_decision() {
    const N: u64 = 500;
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let mut report = String::from("| algorithm | EVALSHA per decision | commands inside the script per decision | all commands per decision |\n|---|---|---|---|\n");
    for algorithm in Algorithm::ALL {
        // 50 keys, a large quota: the accepting path (TIME + GET + SET for O(1) states).
        let checks: Vec<Check> =
            (0..50).map(|i| check("rt", format!("user-{i}"), algorithm, Quota::per_hour(1_000_000))).collect();
        // The warm-up loads the script the measured calls use (EVAL after a NOSCRIPT).
        for c in &checks {
            store.check_one(c).await.unwrap();
        }
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let mut allowed = 0;
        for i in 0..N {
            let c = &checks[usize::try_from(i).unwrap() % checks.len()];
            if store.check_one(c).await.unwrap().decision.allowed {
                allowed += 1;
            }
        }
        assert_eq!(allowed, N, "{algorithm}");
        let stats = server.commandstats();
        let calls = |name: &str| stats.get(name).copied().unwrap_or(0);
        let evalsha = calls("evalsha");
        assert!((N..=N + 3).contains(&evalsha), "{algorithm}: {evalsha} EVALSHA for {N} decisions: {stats:?}");
        assert!(calls("ping") <= 2, "{algorithm}: pool recycling pings: {stats:?}");
        for absent in ["unwatch", "expire", "script|load", "script", "eval", "hgetall", "hset", "multi", "watch"] {
            assert_eq!(calls(absent), 0, "{algorithm}: {absent} sent: {stats:?}");
        }
        let total: u64 = stats.iter().filter(|(k, _)| !OWN.contains(&k.as_str())).map(|(_, v)| v).sum();
        #[allow(clippy::cast_precision_loss)]
        let (per_evalsha, inside, all) =
            (evalsha as f64 / N as f64, (total - evalsha) as f64 / N as f64, total as f64 / N as f64);
        report.push_str(&format!("| {algorithm} | {per_evalsha:.2} | {inside:.2} | {all:.2} |\n"));
        // TIME + GET + SET … PX (the token bucket keeps its longest expiry in its value:
        // no PTTL).
        let most = match algorithm {
            Algorithm::SlidingWindowLog => 7.0,
            _ => 3.0,
        };
        assert!(inside <= most, "{algorithm}: {inside} commands inside the script per decision: {stats:?}");
    }
    eprintln!("commands per decision on the accepting path, server TIME, {N} decisions each:\n{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_invisible_to_requests() {
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let single = check("nf", "k", Algorithm::FixedWindow, Quota::per_hour(30));
    let multi = [single.clone(), check("nf2", "k", Algorithm::SlidingWindowLog, Quota::per_hour(100))];
    let mut allowed = 0;
    for i in 0..40 {
        if i % 10 == 5 {
            server.cmd(&["SCRIPT", "FLUSH"]);
        }
        let checks = if i % 2 == 0 { std::slice::from_ref(&single) } else { &multi[..] };
        let d = store.check(checks).await.unwrap_or_else(|e| panic!("request {i} failed after SCRIPT FLUSH: {e}"));
        allowed += usize::from(d.iter().flatten().all(|o| o.decision.allowed));
        store.peek(&single).await.unwrap();
        // The refund script, too (a commit long gone: it gives back nothing).
        store.refund(&[Refund { check: multi[1].clone(), taken: Taken { at: 0 } }]).await.unwrap();
    }
    assert_eq!(allowed, 30, "the fixed window admitted exactly its limit across flushes");
    let stats = server.commandstats();
    // Three scripts (fixed window, multi-rule, refund), each sent once by EVAL at first
    // use and once after each of the 4 flushes, EVALSHA otherwise; no SCRIPT LOAD.
    assert_eq!(stats.get("eval"), Some(&15), "EVAL after NOSCRIPT: {stats:?}");
    assert_eq!(stats.get("evalsha"), Some(&120), "{stats:?}");
    assert!(!stats.contains_key("script|load"), "{stats:?}");
}

#[test]
fn invalid_urls_say_what_is_wrong() {
    let cases = [
        ("not a url", "not a redis URL"),
        ("http://127.0.0.1:6379", "scheme \"http\""),
        ("redis://127.0.0.1:notaport", "invalid redis URL"),
        ("redis://127.0.0.1:6379/zero", "database"),
        ("redis://0.0.0.0:6379", "wildcard"),
        ("redis://:hunter2@127.0.0.1:6379/x", "database"),
    ];
    for (url, says) in cases {
        match RedisStore::from_url(url) {
            Err(BuildError::InvalidStore(msg)) => {
                assert!(msg.contains(says), "{url:?}: {msg:?} should mention {says:?}");
                assert!(!msg.contains("hunter2"), "{url:?}: the password leaked: {msg:?}");
            }
            other => panic!("{url:?}: {other:?}"),
        }
    }
    assert!(matches!(RedisStore::cluster(Vec::<String>::new()), Err(BuildError::InvalidStore(_))));
    assert!(matches!(RedisStore::cluster(["redis://127.0.0.1:1", "nope"]), Err(BuildError::InvalidStore(_))));
    assert!(matches!(
        RedisStore::from_url("redis://127.0.0.1").unwrap().prefix("a{b}"),
        Err(BuildError::InvalidStore(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_quick_store_error_not_a_build_error() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let store = RedisStore::from_url(&format!("redis://127.0.0.1:{port}")).expect("not a build error");
    let c = check("u", "k", Algorithm::Gcra, Quota::per_second(10));
    let started = Instant::now();
    let err = store.check(std::slice::from_ref(&c)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotConnected(_)), "{err:?}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "the message names the server: {err}");
    // At most the first-connection wait (the response timeout, 100 ms).
    assert!(started.elapsed() < Duration::from_millis(400), "first check took {:?}", started.elapsed());
    // Later requests fail at once: no request waits for a reconnect.
    let started = Instant::now();
    for _ in 0..100 {
        assert!(matches!(store.check(std::slice::from_ref(&c)).await, Err(StoreError::NotConnected(_))));
        assert!(store.peek(&c).await.is_err());
    }
    assert!(started.elapsed() < Duration::from_millis(100), "100 checks took {:?}", started.elapsed());
    let started = Instant::now();
    assert!(store.ping().await.is_err());
    assert!(started.elapsed() < Duration::from_millis(1500), "ping took {:?}", started.elapsed());

    // A black-holed address: connecting hangs rather than being refused.
    let store = RedisStore::from_url("redis://10.255.255.1:6379").unwrap();
    let started = Instant::now();
    assert!(store.check(std::slice::from_ref(&c)).await.is_err());
    assert!(started.elapsed() < Duration::from_millis(400), "black hole took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_restarted_and_paused_servers_never_hold_a_request() {
    let mut server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_millis(100));
    store.ping().await.unwrap();
    let c = check("k", "k", Algorithm::FixedWindow, Quota::per_hour(1000));
    store.check(std::slice::from_ref(&c)).await.unwrap();

    server.kill();
    let started = Instant::now();
    let mut errors = 0;
    for _ in 0..50 {
        errors += usize::from(store.check(std::slice::from_ref(&c)).await.is_err());
    }
    assert_eq!(errors, 50);
    assert!(started.elapsed() < Duration::from_millis(300), "50 checks on a dead server took {:?}", started.elapsed());

    server.restart();
    let started = Instant::now();
    loop {
        match store.check(std::slice::from_ref(&c)).await {
            Ok(d) => {
                assert!(d[0].as_ref().unwrap().decision.allowed);
                break;
            }
            Err(e) => assert!(started.elapsed() < Duration::from_secs(5), "no reconnect after a restart: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("reconnected {:?} after the restart", started.elapsed());

    server.pause();
    let started = Instant::now();
    let err = store.check(std::slice::from_ref(&c)).await.unwrap_err();
    assert!(matches!(err, StoreError::Timeout(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(300), "a paused server held a request {:?}", started.elapsed());
    server.resume();
    let started = Instant::now();
    while store.check(std::slice::from_ref(&c)).await.is_err() {
        assert!(started.elapsed() < Duration::from_secs(5), "no recovery after SIGCONT");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_has_a_ttl_and_idle_keys_disappear() {
    let server = RedisServer::start();
    let store = store_for(&server).await;
    // Short quotas: every state is "never seen" again within 1 s. The fixed window's key
    // lives to the end of its aligned second: start just after a second begins, so that
    // it is still there when the keys are listed.
    let into_second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_micros();
    tokio::time::sleep(Duration::from_micros(u64::from(1_000_000 - into_second) + 5_000)).await;
    for algorithm in Algorithm::ALL {
        let mut c = check("ttl", "user", algorithm, Quota::per_second(4));
        store.check(std::slice::from_ref(&c)).await.unwrap();
        c.params = c.params.cost(2);
        let taken = store.check_one(&c).await.unwrap().taken.expect("allowed");
        store.refund(&[Refund { check: c.clone(), taken }]).await.unwrap();
    }
    let keys = server.cmd(&["KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 6, "{keys:?}");
    for key in &keys {
        let pttl: i64 = server.cmd(&["PTTL", key]).parse().unwrap();
        assert!((1..=2_002).contains(&pttl), "{key}: PTTL {pttl}");
    }
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(server.cmd(&["DBSIZE"]), "0", "idle keys stayed: {:?}", server.cmd(&["KEYS", "*"]));
    // A check that is rejected, and a peek, create nothing.
    let c = check("ttl", "other", Algorithm::Gcra, Quota::per_second(4));
    store.peek(&c).await.unwrap();
    let mut big = c.clone();
    big.params = big.params.cost(5);
    assert!(!store.check_one(&big).await.unwrap().decision.allowed);
    assert_eq!(server.cmd(&["DBSIZE"]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_any_bytes_are_independent() {
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let q = Quota::per_hour(2);
    let keys: Vec<Key> = vec![
        Key::from("a{b}c"),
        Key::from("a%7Bb%7Dc"),
        Key::from("a:b"),
        Key::from("a%3Ab"),
        Key::from(""),
        Key::new(b"\0\xff\xfe{"),
        Key::new(&[b'x'; 10 * 1024]),
        Key::new(&[b'y'; 10 * 1024]),
    ];
    for (i, key) in keys.iter().enumerate() {
        let c = Check {
            rule: "rule:{x}".into(),
            key: key.clone(),
            algorithm: Algorithm::SlidingWindowLog,
            params: Params::new(q),
        };
        let mut allowed = Vec::new();
        for _ in 0..3 {
            allowed.push(store.check_one(&c).await.unwrap().decision.allowed);
        }
        assert_eq!(allowed, [true, true, false], "key {i} {key:?} shares state with an earlier key");
    }
    let names = server.cmd(&["--no-raw", "KEYS", "*"]);
    assert_eq!(names.lines().count(), keys.len(), "{names}");
    assert!(names.contains("tollgate:{a%7Bb%7Dc}:rule%3A%7Bx%7D:swl:v6"), "{names}");
    assert!(names.contains("tollgate:{a%257Bb%257Dc}:rule%3A%7Bx%7D:swl:v6"), "{names}");
    assert!(names.contains("tollgate:{%E}:"), "{names}");
    assert!(names.contains("tollgate:{%H"), "{names}");
    // Long keys are stored as a digest: names stay short.
    assert!(names.lines().all(|n| n.len() < 120), "{names}");
    // Two rules of one weird key decide together.
    let both = [
        check("one", "a{b}c", Algorithm::Gcra, Quota::per_hour(3)),
        check("two", "a{b}c", Algorithm::FixedWindow, Quota::per_hour(1)),
    ];
    assert!(store.check(&both).await.unwrap().iter().flatten().all(|o| o.decision.allowed));
    assert!(!store.check(&both).await.unwrap()[1].as_ref().unwrap().decision.allowed);
    assert_eq!(store.peek(&both[0]).await.unwrap().remaining(), 1, "the rejected request took nothing");
    // Reset forgets exactly one (rule, key).
    store.reset("rule:{x}", &keys[0], Algorithm::SlidingWindowLog).await.unwrap();
    let again = Check {
        rule: "rule:{x}".into(),
        key: keys[0].clone(),
        algorithm: Algorithm::SlidingWindowLog,
        params: Params::new(q),
    };
    assert_eq!(store.peek(&again).await.unwrap().remaining(), 1);
    let other = Check { key: keys[1].clone(), ..again };
    assert!(!store.peek(&other).await.unwrap().allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_pool_is_used_without_per_request_checkouts() {
    let server = RedisServer::builder().with_password("s3cret-pw").start();
    let pool = deadpool_redis::Config::from_url(server.url_with_auth())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let store = RedisStore::new(pool.clone()).prefix("app").unwrap();
    store.ping().await.unwrap();
    server.cmd(&["CONFIG", "RESETSTAT"]);
    let c = check("p", "k", Algorithm::TokenBucket, Quota::per_minute(100));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (store, c) = (store.clone(), c.clone());
            tokio::spawn(async move { store.check_one(&c).await.unwrap().decision.allowed })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        allowed += usize::from(t.await.unwrap());
    }
    assert_eq!(allowed, 100, "200 concurrent requests over clones of one store");
    let stats = server.commandstats();
    // One script call per decision, or fewer: concurrent checks go in batches.
    let calls = stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0);
    assert!((1..=200).contains(&calls), "{stats:?}");
    assert!(!stats.contains_key("ping") && !stats.contains_key("unwatch"), "{stats:?}");
    assert!(server.cmd(&["KEYS", "app:*"]).starts_with("app:{k}:p:tb:v6"));
    // The password appears nowhere in the store's Debug.
    let shown = format!("{store:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    // A wrong password is a store error at request time, not a hang.
    let wrong = RedisStore::from_url(&format!("redis://:nope@127.0.0.1:{}", server.port())).unwrap();
    let err = wrong.ping().await.unwrap_err();
    assert!(!format!("{err} {wrong:?}").contains("nope"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_store_decides_from_its_first_request() {
    // No `ping` first: the first request of a store waits for its first connection
    // attempt (at most the response timeout); later ones never wait for a connection.
    let server = RedisServer::start();
    let c = check("f", "k", Algorithm::Gcra, Quota::per_minute(30));
    for i in 0..20 {
        let store = RedisStore::from_url(&server.url()).unwrap();
        let started = Instant::now();
        let o = store.check_one(&c).await.unwrap_or_else(|e| panic!("store {i}: {e}"));
        assert!(o.decision.allowed);
        assert!(started.elapsed() < Duration::from_millis(150), "store {i}: {:?}", started.elapsed());
    }
    let store = RedisStore::from_url(&server.url()).unwrap();
    assert_eq!(store.peek(&c).await.unwrap().remaining(), 9, "20 checks counted");
}

/// The straight-line single-rule scripts (`scripts/<alg>_single.lua`) against the generic
/// check script for one rule of the same algorithm: one `EVAL` runs both, on two keys, with
/// `redis.call` wrapped to log every write, and returns their replies, writes (with the
/// `PX` argument), stored values and PTTLs. Random quotas and steps: costs 0–4, peeks,
/// rejections, time jumps onto, just before and just after window boundaries, server time.
#[tokio::test]
async fn single_rule_scripts_match_the_generic_script() {
    const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/redis/scripts/");
    let read = |name: &str| std::fs::read_to_string(format!("{DIR}{name}.lua")).unwrap();
    let wrapper = |alg: &str| {
        // The token bucket is GCRA's code under its own tag: gcra.lua serves both, and
        // tat_single.lua is the base of both single-rule scripts.
        let twin = matches!(alg, "gcra" | "token_bucket");
        let generic =
            format!("{}{}{}{}", read("floordiv"), read("lib"), read(if twin { "gcra" } else { alg }), read("check"));
        // As script.rs builds it: the shared `now` prologue, the algorithm's `decide`, the
        // single-rule main.
        let single = format!(
            "{}{}{}{}{}",
            read("floordiv"),
            read("single_now"),
            if twin { read("tat_single") } else { String::new() },
            read(&format!("{alg}_single")),
            read("single_main")
        );
        format!(
            "local function G(KEYS, ARGV, redis)\n{generic}\nend\n\
             local function S(KEYS, ARGV, redis)\n{single}\nend\nlocal twin = {twin}\n{}",
            r"
-- A GCRA or token-bucket state (packed doubles) shown as 'tat' or 'tat:left'.
local function shown(v)
  if twin and v and #v == 8 then return string.format('%d', struct.unpack('d', v)) end
  if twin and v and #v == 16 then
    local tat, left = struct.unpack('dd', v)
    return string.format('%d:%d', tat, left)
  end
  return tostring(v)
end
local log = {}
local fake = setmetatable({ call = function(...)
  local a = { ... }
  if a[1] ~= 'GET' and a[1] ~= 'TIME' then
    local t = { a[1] }
    for i = 3, #a do t[#t + 1] = (i == 3 and a[1] == 'SET') and shown(a[i]) or a[i] end
    log[#log + 1] = table.concat(t, ' ')
  end
  return redis.call(...)
end }, { __index = redis })
local function ser(r)
  if type(r) ~= 'table' then return 'not a table: ' .. tostring(r) end
  if r.err then return 'error: ' .. r.err end
  local t = {}
  for i = 1, #r do t[i] = string.format('%.17g', r[i]) end
  return table.concat(t, ',')
end
local rg = ser(G({ KEYS[1] }, ARGV, fake))
local lg = table.concat(log, ';')
log = {}
local rs = ser(S({ KEYS[2] }, ARGV, fake))
local ls = table.concat(log, ';')
local pa, pb = redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2])
-- The test's clock is not Redis's: no real-time expiry (the PX arguments are compared).
redis.call('PERSIST', KEYS[1])
redis.call('PERSIST', KEYS[2])
return { rg, lg, shown(redis.call('GET', KEYS[1])), tostring(pa),
         rs, ls, shown(redis.call('GET', KEYS[2])), tostring(pb) }
"
        )
    };
    let server = RedisServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut below = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for (tag, alg) in [
        ("fw", "fixed_window"),
        ("swc", "sliding_window_counter"),
        ("tb", "token_bucket"),
        ("lb", "leaky_bucket"),
        ("gcra", "gcra"),
    ] {
        let script = redis::Script::new(&wrapper(alg));
        let (mut committed, mut kept) = (0, 0);
        for round in 0..20 {
            let l = 1 + below(12);
            let w = match below(4) {
                0 => 1000 * (1 + below(5)),
                1 => 1_000_000,
                2 => 7 + below(100_000),
                _ => 60_000_000 + below(3),
            };
            let (t, b) = (w.div_ceil(l), if below(2) == 0 { l } else { 1 + below(15) });
            let md = [0, t * below(5), 1 << 53][usize::try_from(below(3)).unwrap()];
            let mut now = 1_700_000_000_000_000 + below(1_000_000_000);
            let (ka, kb) = (format!("eq:g:{tag}:{round}"), format!("eq:s:{tag}:{round}"));
            let (mut generic_expiry, mut single_expiry): (Option<u64>, Option<u64>) = (None, None);
            for _ in 0..60 {
                let to_boundary = w - now % w;
                now += match below(10) {
                    0 | 1 => 0,
                    2 => 1,
                    3 => below(t),
                    4 => t,
                    5 => to_boundary,
                    6 => to_boundary - 1,
                    7 => to_boundary + 1,
                    8 => w * (1 + below(3)),
                    _ => below(w),
                };
                // Costs from 1: a cost of 0 is a probe (a charged rule's admission), which
                // only the generic script handles (it writes nothing; see check_for).
                let cost = 1 + below(4);
                let mode = if below(4) == 0 { "p" } else { "c" };
                let server_time = below(10) == 0;
                let now_arg = if server_time { String::new() } else { now.to_string() };
                let r: Vec<String> = script
                    .key(&ka)
                    .key(&kb)
                    .arg(&now_arg)
                    .arg(mode)
                    .arg(tag)
                    .arg(l)
                    .arg(w)
                    .arg(b)
                    .arg(t)
                    .arg(cost)
                    .arg(md)
                    .arg(0) // no block: the single-rule scripts know none
                    .invoke_async(&mut con)
                    .await
                    .unwrap();
                let ctx =
                    format!("{alg} L={l} W={w} B={b} T={t} max delay {md}, now {now_arg:?} {mode} cost {cost}: {r:?}");
                if server_time {
                    // Two reads of TIME: the same fields; then both keys start afresh.
                    assert_eq!(r[0].split_once(',').map(|x| x.1), r[4].split_once(',').map(|x| x.1), "{ctx}");
                    let () = redis::cmd("DEL").arg(&ka).arg(&kb).query_async(&mut con).await.unwrap();
                    (generic_expiry, single_expiry) = (None, None);
                } else {
                    assert_eq!(r[0], r[4], "{ctx}");
                    generic_expiry = expiry_after(&r[1], generic_expiry, now, &ctx);
                    single_expiry = expiry_after(&r[5], single_expiry, now, &ctx);
                    same_state(tag, &r[2], &r[6], &ctx);
                    // The single script's key lives at least as long as the generic one's: the
                    // window scripts exactly as long, GCRA and the token bucket at most 10 s
                    // longer (they set a TTL with room).
                    let slack = if matches!(tag, "gcra" | "tb") { 10_000_000 } else { 0 };
                    match (generic_expiry, single_expiry) {
                        (None, None) => {}
                        (Some(g), Some(s)) => {
                            assert!(s + 2_000 >= g && s <= g + slack + 2_000, "expiry {s} vs {g}: {ctx}");
                        }
                        other => panic!("one key exists and not the other ({other:?}): {ctx}"),
                    }
                    committed += usize::from(r[1].split(';').any(|c| c.starts_with("SET")));
                    kept += usize::from(r[5].split(';').any(|c| c.ends_with("KEEPTTL")));
                }
            }
        }
        assert!(committed > 400, "{alg}: {committed} commits");
        // On a client's clock (every round but the server-time ones) no write keeps a TTL:
        // the clock may step, and Redis counts TTLs on its own (see the next test).
        assert_eq!(kept, 0, "{alg}");
    }
}

/// On Redis's own time the single-rule and batch scripts keep a key's TTL when a write does
/// not move its expiry (`KEEPTTL`). Random single, batched, multi-rule (the generic script),
/// refund and charge calls on one key, with tiers of other quotas, and random pauses: after
/// each, the key must live (by `TIME` and `PTTL`, read atomically) at least until its value
/// says its state is "never seen" again — for the least demanding tier, as any of them may
/// have written it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_ttl_always_outlives_the_state() {
    let server = RedisServer::start();
    let mut tasks = Vec::new();
    for (i, algorithm) in
        [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::FixedWindow, Algorithm::SlidingWindowCounter]
            .into_iter()
            .enumerate()
    {
        for batch in [1, 64] {
            let seed = 0x9e37_79b9_7f4a_7c15 ^ ((i as u64) << 8 | batch as u64);
            tasks.push(tokio::spawn(ttl_walk(algorithm, server.url(), batch, seed)));
        }
    }
    let mut kept = 0;
    for t in tasks {
        kept += t.await.unwrap();
    }
    assert!(kept > 100, "only {kept} writes kept a TTL: the walk does not test KEEPTTL");
}

/// One key's walk (see above); returns how many writes kept the key's TTL.
async fn ttl_walk(algorithm: Algorithm, url: String, batch: usize, mut seed: u64) -> usize {
    // A GCRA or token-bucket state (packed doubles, ARGV[1] 'tat') shown as its TAT.
    const PROBE: &str = "local t = redis.call('TIME') \
        local v = redis.call('GET', KEYS[1]) \
        if v and ARGV[1] == 'tat' then v = string.format('%d', struct.unpack('d', v)) end \
        return { t[1] * 1000000 + t[2], tostring(v), redis.call('PTTL', KEYS[1]) }";
    let store = RedisStore::from_url(&url).unwrap().response_timeout(Duration::from_secs(2)).max_batch(batch).unwrap();
    let mut con = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let probe = redis::Script::new(PROBE);
    let mut below = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // Tiers of one rule and key: two of one period (comparable windows), one of another.
    let tiers = [
        Quota::new(8, Duration::from_millis(1500)),
        Quota::new(20, Duration::from_millis(1500)),
        Quota::new(5, Duration::from_millis(700)).burst(9),
    ];
    let n_tiers = if matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket) { 3 } else { 2 };
    let key = format!("walk{batch}");
    let tag = match algorithm {
        Algorithm::Gcra => "gcra",
        Algorithm::TokenBucket => "tb",
        Algorithm::FixedWindow => "fw",
        _ => "swc",
    };
    let name = format!("tollgate:{{{key}}}:r:{tag}:v6");
    // When a state of `value` is "never seen" again under quota `q`, µs.
    let needed = |value: &str, q: Quota| -> u64 {
        let f: Vec<u64> = value.split(':').map(|x| x.parse::<i64>().unwrap().max(0).unsigned_abs()).collect();
        match algorithm {
            // The TAT; the token bucket is GCRA's twin.
            Algorithm::Gcra | Algorithm::TokenBucket => f[0],
            Algorithm::FixedWindow => (f[0] + 1) * q.period_micros(),
            _ => (f[0] + 2) * q.period_micros(),
        }
    };
    let mut taken: Vec<Refund> = Vec::new();
    let (mut kept, mut last_expiry) = (0, None);
    for _ in 0..200 {
        let q = tiers[usize::try_from(below(n_tiers)).unwrap()];
        let mut c = check("r", &key, algorithm, q);
        c.params = c.params.cost(1 + below(3));
        match below(10) {
            0..=4 => {
                if let Some(t) = store.check_one(&c).await.unwrap().taken {
                    taken.push(Refund { check: c.clone(), taken: t });
                }
            }
            5 | 6 => {
                let other = check("o", &key, Algorithm::FixedWindow, Quota::per_second(1_000_000));
                if let Some(Some(o)) = store.check(&[c.clone(), other]).await.unwrap().first() {
                    taken.extend(o.taken.map(|t| Refund { check: c.clone(), taken: t }));
                }
            }
            7 | 8 if !taken.is_empty() => {
                let r = taken.swap_remove(usize::try_from(below(taken.len() as u64)).unwrap());
                store.refund(&[r]).await.unwrap();
            }
            _ => store.charge(std::slice::from_ref(&c)).await.unwrap(),
        }
        let twin = if matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket) { "tat" } else { "" };
        let (now, value, pttl): (u64, String, i64) = probe.key(&name).arg(twin).invoke_async(&mut con).await.unwrap();
        if value != "false" {
            assert!(pttl >= 0, "{algorithm}: {value} has no TTL ({pttl})");
            let expiry = now + pttl.unsigned_abs() * 1000;
            let least = tiers[..usize::try_from(n_tiers).unwrap()].iter().map(|&q| needed(&value, q)).min().unwrap();
            assert!(
                least <= now || expiry + 1_000 >= least,
                "{algorithm}: {value} expires {} µs early",
                least - expiry
            );
            // A write that left the expiry where it was (within the PTTL's ms) kept it.
            kept += usize::from(last_expiry.is_some_and(|e: u64| e.abs_diff(expiry) <= 1_000));
            last_expiry = Some(expiry);
        } else {
            last_expiry = None;
        }
        tokio::time::sleep(Duration::from_millis(below(250))).await;
    }
    kept
}

/// A store on a client's clock that steps back: the key's TTL is set afresh by every write
/// (it would run out early if one were kept: Redis counts it on its own clock).
#[cfg(feature = "test-util")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_stepping_back_loses_no_state() {
    let server = RedisServer::start();
    let t0 = tollgate::clock::Clock::now_micros(&tollgate::clock::SystemClock);
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::FixedWindow, Algorithm::SlidingWindowCounter]
    {
        let clock = tollgate::clock::ManualClock::new(t0);
        let store = store_for(&server).await.with_clock(clock.clone());
        let c = check("back", "k", algorithm, Quota::per_minute(60));
        assert!(store.check_one(&c).await.unwrap().decision.allowed);
        clock.set(t0 - 30_000_000);
        assert!(store.check_one(&c).await.unwrap().decision.allowed);
        let before = store.peek(&c).await.unwrap().remaining();
        // Real time passes; the client's clock stands still: nothing expires for it.
        tokio::time::sleep(Duration::from_millis(2_600)).await;
        assert_eq!(store.peek(&c).await.unwrap().remaining(), before, "{algorithm}: the state expired early");
    }
}

/// The expiry (µs) a key has after `writes` (the wrapper's log: `SET value PX ms`,
/// `SET value KEEPTTL`, `DEL`) made at `now`; `None`: no key.
fn expiry_after(writes: &str, mut expiry: Option<u64>, now: u64, ctx: &str) -> Option<u64> {
    for w in writes.split(';').filter(|w| !w.is_empty()) {
        let parts: Vec<&str> = w.split(' ').collect();
        expiry = match parts[..] {
            ["DEL"] => None,
            ["SET", _, "PX", ms] => Some(now + ms.parse::<u64>().unwrap() * 1000),
            ["SET", _, "KEEPTTL"] => Some(expiry.unwrap_or_else(|| panic!("KEEPTTL on a key with no TTL: {ctx}"))),
            _ => panic!("unexpected write {w:?}: {ctx}"),
        };
    }
    expiry
}

/// The generic and the single-rule script stored the same state: the same value, but for
/// the field the single-rule script of GCRA and of its twin, the token bucket, adds to keep
/// the key's TTL (`tat:left` for the generic script's `tat`).
fn same_state(tag: &str, generic: &str, single: &str, ctx: &str) {
    let (g, s): (Vec<&str>, Vec<&str>) = (generic.split(':').collect(), single.split(':').collect());
    match tag {
        _ if generic == "false" || single == "false" => assert_eq!(generic, single, "{ctx}"),
        "gcra" | "tb" => assert_eq!((&g[..], s.len()), (&s[..1], 2), "{ctx}"),
        _ => assert_eq!(generic, single, "{ctx}"),
    }
}

/// A sliding-log request of any cost is one member of the sorted set (it used to be one
/// member per unit: a request of cost 1,000,000 held Redis for seconds and wrote 125 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_request_of_any_cost_is_one_member() {
    let server = RedisServer::start();
    let store = store_for(&server).await;
    let mut c = check("big", "k", Algorithm::SlidingWindowLog, Quota::per_hour(2_000_000));
    c.params = c.params.cost(1_000_000);
    assert!(store.check_one(&c).await.unwrap().decision.allowed);
    let name = "tollgate:{k}:big:swl:v6";
    // On the server's clock: the total, the newest timestamp and the TTL's end are marks.
    assert_eq!(server.cmd(&["ZCARD", name]), "4", "one member for the units and three marks");
    let bytes: u64 = server.cmd(&["MEMORY", "USAGE", name]).parse().unwrap();
    assert!(bytes < 1024, "{bytes} bytes for one request");
    c.params = c.params.cost(999_999);
    assert!(store.check_one(&c).await.unwrap().decision.allowed);
    c.params = c.params.cost(2);
    let d = store.check_one(&c).await.unwrap().decision;
    assert!(!d.allowed && d.remaining() == 1, "{d:?}");
}

/// A log's key lives until its newest member leaves the longest window it was committed
/// under: a commit of a shorter tier never shortens its TTL (`PEXPIRE … GT`), on the
/// server's clock (the TTL's end kept in the log) and on a client's (set on every commit).
#[tokio::test]
async fn a_log_keeps_the_longest_tiers_ttl() {
    let server = RedisServer::start();
    let clock = tollgate::clock::ManualClock::new(1_700_000_000_000_000);
    let stores = [store_for(&server).await, store_for(&server).await.with_clock(clock)];
    for (i, store) in stores.iter().enumerate() {
        let key = format!("tiers{i}");
        let name = format!("tollgate:{{{key}}}:r:swl:v6");
        let pttl = || -> u64 { server.cmd(&["PTTL", &name]).parse().unwrap() };
        let hour = check("r", &key, Algorithm::SlidingWindowLog, Quota::per_hour(10));
        let minute = check("r", &key, Algorithm::SlidingWindowLog, Quota::per_minute(10));
        assert!(store.check_one(&minute).await.unwrap().decision.allowed);
        assert!((59_000..=70_001).contains(&pttl()), "{i}: PTTL {}", pttl());
        assert!(store.check_one(&hour).await.unwrap().decision.allowed);
        assert!((3_599_000..=3_610_001).contains(&pttl()), "{i}: PTTL {}", pttl());
        assert!(store.check_one(&minute).await.unwrap().decision.allowed);
        assert!(pttl() > 3_599_000, "{i}: the minute's commit shortened the hour's TTL to {} ms", pttl());
    }
}

/// A raw check list naming one state twice is refused by both stores (it used to decide
/// both against the state before either commit, over-admitting, and a Redis token bucket
/// stored a negative level that failed every later check of the key).
#[tokio::test]
async fn a_check_list_naming_one_state_twice_is_refused() {
    let server = RedisServer::start();
    let redis = RedisStore::from_url(&server.url()).unwrap();
    let memory = MemoryStore::new();
    let tb = |cost| Check {
        rule: "r".into(),
        key: "k".into(),
        algorithm: Algorithm::TokenBucket,
        params: Params { cost, ..Params::new(Quota::per_minute(3).burst(2)) },
    };
    let twice = [tb(1), tb(2)];
    let e = redis.check(&twice).await.unwrap_err();
    assert!(matches!(&e, StoreError::Invalid(m) if m.contains("twice")), "{e}");
    let e = memory.check(&twice).await.unwrap_err();
    assert!(matches!(&e, StoreError::Invalid(m) if m.contains("twice")), "{e}");
    // Nothing was taken, and the key still works.
    for store_check in [redis.check(&[tb(2)]).await.unwrap(), memory.check(&[tb(2)]).await.unwrap()] {
        assert!(store_check[0].as_ref().unwrap().decision.allowed);
    }
    // Same key under another rule or algorithm: distinct states, decided together.
    let other = Check { algorithm: Algorithm::Gcra, ..tb(1) };
    assert!(redis.check(&[tb(1), other.clone()]).await.is_ok());
    assert!(memory.check(&[tb(1), other]).await.is_ok());
}

/// A key whose quota changes between requests (tiers of different periods): a write under
/// the shorter period kept its own TTL on Redis, so the longer period's state vanished
/// with it (the sliding window log's day units after a second; a token bucket's likewise,
/// when its state was a level), while `MemoryStore` kept the longest expiry. Both now keep
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_tier_does_not_cut_a_longer_tiers_state_short() {
    let server = RedisServer::start();
    let redis = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(5));
    redis.ping().await.unwrap();
    let memory = MemoryStore::new();
    let check =
        |algorithm, quota| Check { rule: "r".into(), key: "acct".into(), algorithm, params: Params::new(quota) };
    let daily = |a| check(a, Quota::per_day(2));
    // Fine-grained enough to accept a moment after the daily units were taken.
    let short = |a| check(a, Quota::per_second(10_000));
    let allowed = |o: Outcome| o.decision.allowed;
    let mut seen: BTreeMap<(String, &str), Vec<bool>> = BTreeMap::new();
    for a in Algorithm::ALL {
        for (name, store) in [("memory", &memory as &dyn DynCheck), ("redis", &redis as &dyn DynCheck)] {
            let log = seen.entry((a.to_string(), name)).or_default();
            log.push(allowed(store.one(&daily(a)).await));
            log.push(allowed(store.one(&daily(a)).await));
        }
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    for a in Algorithm::ALL {
        for (name, store) in [("memory", &memory as &dyn DynCheck), ("redis", &redis as &dyn DynCheck)] {
            seen.get_mut(&(a.to_string(), name)).unwrap().push(allowed(store.one(&short(a)).await));
        }
    }
    // The short period's TTL (about a second) runs out; the day's must not.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for a in Algorithm::ALL {
        for (name, store) in [("memory", &memory as &dyn DynCheck), ("redis", &redis as &dyn DynCheck)] {
            seen.get_mut(&(a.to_string(), name)).unwrap().push(allowed(store.one(&daily(a)).await));
        }
    }
    for a in Algorithm::ALL {
        let (m, r) = (&seen[&(a.to_string(), "memory")], &seen[&(a.to_string(), "redis")]);
        assert_eq!(m, r, "{a}: memory and Redis differ");
        if a == Algorithm::SlidingWindowLog {
            assert_eq!(m, &[true, true, true, false], "{a}: the day's state was lost to the second's TTL");
        }
        // GCRA and its twin, the token bucket: the day's TAT, a day ahead, refuses the
        // second's check, which writes nothing; the day's state stays.
        if matches!(a, Algorithm::Gcra | Algorithm::TokenBucket) {
            assert_eq!(m, &[true, true, false, false], "{a}");
        }
    }
}

/// `Store::check_one` behind `dyn` (the trait's futures are `impl Future`).
trait DynCheck {
    fn one<'a>(&'a self, check: &'a Check) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + 'a>>;
}

impl<S: Store> DynCheck for S {
    fn one<'a>(&'a self, check: &'a Check) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + 'a>> {
        Box::pin(async move { self.check_one(check).await.unwrap() })
    }
}

/// Rule names are claimed per store: a reconfigured copy (`response_timeout`) counts into
/// the same keys, so it may not reuse a rule name (it used to slip past and share the
/// counts). Another prefix is other keys. A store built separately is another store, as
/// each server of a deployment has its own (and `shared_limit.rs` plays three in one
/// process).
#[test]
fn rule_names_are_claimed_per_store_and_prefix() {
    let url = "redis://127.0.0.1:6399/0";
    let claim = |store: RedisStore| {
        tollgate::RateLimitLayer::builder(store).rule("api", Quota::per_minute(10), tollgate::key::Global).build()
    };
    let store = RedisStore::from_url(url).unwrap();
    let first = claim(store.clone()).unwrap();
    let in_use = Err(BuildError::RuleInUse {
        rule: "api".into(),
        hint: "e.g. RateLimitLayer::builder(store).rule(\"search\", quota, key)",
    });
    assert_eq!(claim(store.clone().response_timeout(Duration::from_millis(20))).map(|_| ()), in_use);
    assert_eq!(claim(store.clone().connect_timeout(Duration::from_millis(20))).map(|_| ()), in_use);
    let _other_prefix = claim(store.clone().prefix("other").unwrap()).unwrap();
    let _another_store = claim(RedisStore::from_url(url).unwrap()).unwrap();
    // Once the layer is gone, the name is free again.
    drop(first);
    let _again = claim(store).unwrap();
}

fn connections_received(server: &RedisServer) -> u64 {
    let stats = server.cmd(&["INFO", "stats"]);
    let line = stats.lines().find(|l| l.starts_with("total_connections_received:")).expect("the field");
    line.trim().rsplit(':').next().unwrap().parse().unwrap()
}

/// A store used from one runtime, whose reconnection task that runtime drops before it ever
/// runs, reconnects from the next runtime (the task's flag used to stay set for good).
#[test]
fn a_reconnection_dropped_with_its_runtime_is_made_again_from_the_next() {
    let server = RedisServer::start();
    let c = check("rt", "k", Algorithm::Gcra, Quota::per_second(100));
    let rt = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = rt().block_on(async {
        let store = RedisStore::from_url(&server.url()).unwrap();
        store.ping().await.unwrap();
        store
    });
    server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    // The broken connection is noticed, and a reconnection spawned on a runtime that
    // ends at once, before the task is first polled.
    let first = rt().block_on(store.check(std::slice::from_ref(&c)));
    assert!(first.is_err(), "the killed connection must fail once: {first:?}");
    let again = rt().block_on(async {
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            match store.check(std::slice::from_ref(&c)).await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > until => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });
    assert!(again.is_ok(), "never reconnected: {again:?}");
}

/// A check cut off by its caller while Redis is briefly slow counts as a timeout of the
/// connection; two of them seconds apart on a healthy server are no outage, and the
/// connection is kept (it used to be replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_cut_off_checks_do_not_replace_a_healthy_connection() {
    let server = RedisServer::start_with_args(&["--enable-debug-command", "local"]);
    let store = store_for(&server).await;
    let c = check("cut", "k", Algorithm::Gcra, Quota::per_second(100));
    store.check(std::slice::from_ref(&c)).await.unwrap();
    let connections = connections_received(&server);
    for _ in 0..2 {
        let port = server.port();
        let sleeper = std::thread::spawn(move || {
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "DEBUG", "SLEEP", "0.5"])
                .output()
                .expect("redis-cli");
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Cut off by the caller while the server sleeps.
        let cut = tokio::time::timeout(Duration::from_millis(30), store.check(std::slice::from_ref(&c))).await;
        assert!(cut.is_err(), "the server was asleep");
        sleeper.join().unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    let after = store.check(std::slice::from_ref(&c)).await;
    assert!(after.is_ok(), "{after:?}");
    // The test's own redis-cli calls are connections too: two sleepers, one INFO.
    assert_eq!(connections_received(&server), connections + 3, "the store reconnected");
}

/// A server that stops answering while calls are sparse (one every 2.5 s, each failing):
/// the connection is replaced after three failures over 2 s or more, not kept for ever
/// because the failures are far apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_under_sparse_calls_still_gets_a_new_connection() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    store.ping().await.unwrap();
    let c = check("sparse", "k", Algorithm::Gcra, Quota::per_second(100));
    server.pause();
    let mut errors = Vec::new();
    for _ in 0..4 {
        errors.push(store.check(std::slice::from_ref(&c)).await.unwrap_err());
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    server.resume();
    // Three timeouts, then the connection was replaced: the fourth call found none.
    assert!(errors[..3].iter().all(|e| matches!(e, StoreError::Timeout(_))), "{errors:?}");
    assert!(matches!(errors[3], StoreError::NotConnected(_)), "{errors:?}");
    let until = Instant::now() + Duration::from_secs(5);
    while store.check(std::slice::from_ref(&c)).await.is_err() {
        assert!(Instant::now() < until, "no new connection after SIGCONT");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Charges (what the fallback admitted, written back) count beside checks on every
/// algorithm that admits a burst (the leaky bucket shapes: one at a time): 50 checks and
/// 49 charges of 100 an hour leave 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_count_beside_checks_on_every_algorithm() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap().response_timeout(Duration::from_secs(2));
    for algorithm in Algorithm::ALL.into_iter().filter(|&a| a != Algorithm::LeakyBucket) {
        let c = check("written", "k", algorithm, Quota::per_hour(100));
        for i in 0..50 {
            let d = store.check_one(&c).await.unwrap().decision;
            assert!(d.allowed, "{algorithm} {i}: {d:?}");
        }
        for _ in 0..49 {
            store.charge(std::slice::from_ref(&c)).await.unwrap();
        }
        let d = store.check_one(&c).await.unwrap().decision;
        assert!(d.allowed && d.remaining() == 0, "{algorithm}: {d:?}");
        assert!(!store.check_one(&c).await.unwrap().decision.allowed, "{algorithm}");
    }
}
