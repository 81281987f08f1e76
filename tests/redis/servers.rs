//! How many servers share a store (the fallback's share, issue 26): counted, lapsing,
//! never lower after a restart or a long stall, and once per process and store (two
//! limiters of one process are one server; two that share a rule's count divide its share).
#![cfg(feature = "redis")]

use crate::support;

use std::time::{Duration, Instant};

use tollgate::key::Key;
use tollgate::store::Store;
use tollgate::{Limiter, Quota, RedisStore};

use support::redis::RedisServer;

fn user(u: &str) -> Option<Key> {
    Some(Key::from(u))
}

/// Three servers, counted; then Redis restarts empty (or stalls > 3 s): the first to
/// announce again counts itself alone, and takes the whole quota as its share for the
/// next second.
async fn lowest_count_after(fault: impl FnOnce(&mut RedisServer)) -> Vec<u64> {
    let mut server = RedisServer::start();
    let stores: Vec<RedisStore> = (0..3).map(|_| RedisStore::from_url(&server.url()).unwrap()).collect();
    let limiters: Vec<_> = stores
        .iter()
        .map(|s| Limiter::<_, str>::builder(s.clone()).rule("r", Quota::per_hour(100), user).build().unwrap())
        .collect();
    for l in &limiters {
        assert!(l.check("warm").await.is_allowed());
    }
    tokio::time::sleep(Duration::from_millis(3_500)).await; // no longer young
    let before: Vec<_> = limiters.iter().map(|l| l.store().servers()).collect();
    assert!(before.iter().all(|&n| n == Some(3)), "{before:?}");
    fault(&mut server);
    let mut lowest = vec![u64::MAX; 3];
    let until = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < until {
        for (i, l) in limiters.iter().enumerate() {
            lowest[i] = lowest[i].min(l.store().servers().unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_never_drops_after_a_restart() {
    let lowest = lowest_count_after(|s| s.restart()).await;
    assert!(lowest.iter().all(|&n| n >= 3), "lowest counts after a restart: {lowest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_never_drops_after_a_long_stall() {
    let lowest = lowest_count_after(|s| {
        s.pause();
        std::thread::sleep(Duration::from_millis(3_500));
        s.resume();
    })
    .await;
    assert!(lowest.iter().all(|&n| n >= 3), "lowest counts after a 3.5 s stall: {lowest:?}");
}

/// Two layers from `RateLimitLayer::new` over clones of one store, on two routes, share
/// one count ("default"), as documented. The store counts one server (one member), but
/// each layer's limiter has a fallback of its own with a share of 1/1: while Redis is
/// stalled, this ONE server admits 2 x L.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_sharing_a_count_share_one_share() {
    use tollgate::{key, RateLimitLayer};
    use tower::ServiceExt;
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let app = axum::Router::new()
        .route("/search", axum::routing::get(|| async { "ok" }))
        .layer(RateLimitLayer::new(Quota::per_hour(100), key::header("x-api-key"), store.clone()))
        .merge(axum::Router::new().route("/upload", axum::routing::get(|| async { "ok" })).layer(RateLimitLayer::new(
            Quota::per_hour(100),
            key::header("x-api-key"),
            store.clone(),
        )));
    let req =
        |path: &str, k: &str| http::Request::get(path).header("x-api-key", k).body(axum::body::Body::empty()).unwrap();
    for p in ["/search", "/upload"] {
        assert_eq!(app.clone().oneshot(req(p, "warm")).await.unwrap().status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    println!("servers counted: {:?}", store.servers());
    server.pause();
    let mut admitted = 0;
    for i in 0..400 {
        let p = if i % 2 == 0 { "/search" } else { "/upload" };
        if app.clone().oneshot(req(p, "busy")).await.unwrap().status() == 200 {
            admitted += 1;
        }
    }
    server.resume();
    assert!(admitted <= 110, "{admitted} of 400 admitted on one server for a shared limit of 100");
}

/// Each limiter's store announces its server; every store counts the live ones (after its
/// first check, and every second; one more for its first 3 s), and a server gone lapses
/// within about 7 s (3 s for its announcement, 3 s more before a lower count is taken).
#[test]
fn servers_count_themselves_and_a_gone_one_lapses() {
    use tollgate::store::Store;
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let limiter = |store: RedisStore| {
            tollgate::Limiter::<_, str>::builder(store)
                .rule("r", Quota::per_hour(100), |u: &str| Some(tollgate::key::Key::from(u)))
                .build()
                .unwrap()
        };
        let stores: Vec<RedisStore> = (0..3).map(|_| RedisStore::from_url(&redis.url()).unwrap()).collect();
        let limiters: Vec<_> = stores.iter().map(|s| limiter(s.clone())).collect();
        for l in &limiters {
            assert!(l.check("warm-up").await.is_allowed());
        }
        let counted = |s: &RedisStore| s.servers();
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(stores.iter().all(|s| counted(s) == Some(4)), "one more while young");
        let deadline = started + Duration::from_secs(5);
        while stores.iter().any(|s| counted(s) != Some(3)) {
            assert!(Instant::now() < deadline, "{:?}", stores.iter().map(counted).collect::<Vec<_>>());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Two servers stop: their announcements lapse.
        let mut limiters = limiters;
        limiters.truncate(1);
        let mut stores = stores;
        stores.truncate(1);
        let gone = Instant::now();
        while counted(&stores[0]) != Some(1) {
            assert!(gone.elapsed() < Duration::from_secs(8), "still {:?}", counted(&stores[0]));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("degradation: 3 servers counted, 2 gone lapsed after {:?}", gone.elapsed());
        assert!(gone.elapsed() >= Duration::from_secs(2), "lapsed before the 3 s an announcement lasts");
    });
}

/// A limiter rebuilt over one store (a configuration reload, a router rebuilt per
/// tenant), the old one dropped: the dropped ones no longer count (their announcements
/// are withdrawn and lapse), so the live one keeps its whole share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_limiter_is_no_longer_counted() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    for _ in 0..4 {
        let l = Limiter::<_, str>::builder(store.clone()).rule("r", Quota::per_hour(100), user).build().unwrap();
        assert!(l.check("warm").await.is_allowed());
        drop(l);
    }
    let live = Limiter::<_, str>::builder(store.clone()).rule("r", Quota::per_hour(100), user).build().unwrap();
    assert!(live.check("warm").await.is_allowed());
    tokio::time::sleep(Duration::from_millis(4_500)).await; // no longer young; dropped ones would lapse
    let counted = store.servers();
    server.pause();
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += usize::from(live.check("busy").await.is_allowed());
    }
    server.resume();
    assert_eq!(counted, Some(1), "one live limiter in one process; admitted {admitted} of 100 while Redis was stalled");
}

/// A store and limiter used on one tokio runtime, then on another: the heartbeat, which
/// ended with the first runtime, runs again (the server stays announced and counted).
#[test]
fn the_heartbeat_runs_again_on_a_new_runtime() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let limiter = Limiter::<_, str>::builder(store).rule("r", Quota::per_hour(1000), user).build().unwrap();
    let rt1 = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt1.block_on(async {
        assert!(limiter.check("a").await.is_allowed());
        tokio::time::sleep(Duration::from_millis(1200)).await;
    });
    drop(rt1);
    let rt2 = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let members = rt2.block_on(async {
        let mut allowed = 0;
        for i in 0..50 {
            if limiter.check(&format!("b{i}")).await.is_allowed()
                && limiter.check(&format!("b{i}")).await.store_error().is_none()
            {
                allowed += 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("allowed without error on rt2: {allowed}/50");
        server.cmd(&["ZRANGE", "tollgate:servers", "0", "-1"])
    });
    eprintln!(
        "members after 5 s on rt2: {members:?}; servers(): {:?}",
        tollgate::store::Store::servers(limiter.store())
    );
    assert!(
        !members.trim().is_empty(),
        "this server is no longer announced: the heartbeat died with the first runtime"
    );
}

/// A store behind an `Arc` counts and announces like the store itself: two servers, each
/// over an `Arc<RedisStore>`, count two (before, the `Arc` answered `None` and announced
/// nothing, so each fallback took the whole quota as its share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_behind_an_arc_counts_its_servers() {
    let server = RedisServer::start();
    let limiters: Vec<_> = (0..2)
        .map(|_| {
            let store = std::sync::Arc::new(RedisStore::from_url(&server.url()).unwrap());
            Limiter::<_, str>::builder(store).rule("r", Quota::per_hour(100), user).build().unwrap()
        })
        .collect();
    for l in &limiters {
        assert!(l.check("warm").await.is_allowed());
    }
    let counted = || limiters.iter().map(|l| l.store().servers()).collect::<Vec<_>>();
    let until = Instant::now() + Duration::from_secs(5);
    while counted() != [Some(2), Some(2)] && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counted(), [Some(2), Some(2)], "two servers announced through their Arcs");
}

/// Issue 37, item 9: the README's own pattern, an API limiter and a login limiter over one
/// store in one process, is one server, not two: each fallback's share is 1/N of its own
/// rule's quota (it was 1/(2N)). Two stores built separately still count as two servers
/// (as the tests above play several servers in one process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_of_one_process_count_one_server() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    let api = Limiter::<_, str>::builder(store.clone()).rule("api", Quota::per_hour(100), user).build().unwrap();
    let login = Limiter::<_, str>::builder(store.clone()).rule("login", Quota::per_hour(5), user).build().unwrap();
    assert!(api.check("warm").await.is_allowed());
    assert!(login.check("warm").await.is_allowed());
    tokio::time::sleep(Duration::from_millis(3_500)).await; // no longer young
    assert_eq!(store.servers(), Some(1), "two limiters of one process counted as several servers");

    // Redis stalled: the API limiter's fallback takes this server's whole share (1/1) of
    // what Redis last said remains (98), not half of it.
    assert!(api.check("warm").await.is_allowed());
    server.pause();
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += usize::from(api.check("warm").await.is_allowed());
    }
    server.resume();
    assert!(admitted >= 90, "the one server admitted {admitted} of the 98 remaining");

    let other = RedisStore::from_url(&server.url()).unwrap();
    let elsewhere =
        Limiter::<_, str>::builder(other.clone()).rule("other", Quota::per_hour(100), user).build().unwrap();
    assert!(elsewhere.check("warm").await.is_allowed());
    let until = Instant::now() + Duration::from_secs(5);
    while other.servers() != Some(2) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(3_500)).await; // no longer young
    assert_eq!(other.servers(), Some(2), "a store built separately plays another server");
    drop((api, login, elsewhere));
}
