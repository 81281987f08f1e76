//! The tonic example's server behind `RateLimitLayer`, called by a real tonic client over
//! a loopback port: what a gRPC client sees once its quota is spent.
#![cfg(all(feature = "tonic", feature = "memory"))]

use std::time::Duration;

use tokio::net::TcpListener;
use tollgate::clock::ManualClock;
use tollgate::MemoryStore;
use tonic::{Code, Request};

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/tonic_server.rs"]
mod example;

use example::hello::{GreeterClient, HelloRequest};

const T0: u64 = 1_700_000_000_000_000;

// The middleware answers rejections with `ResBody::default()`: tonic's body must be `Default`.
const _: fn() = || {
    fn is_default<T: Default>() {}
    is_default::<tonic::body::Body>();
};

struct Server {
    client: GreeterClient,
    clock: ManualClock,
    limits: tollgate::RateLimitLayer<MemoryStore>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn server() -> Server {
    let clock = ManualClock::new(T0);
    let limits = example::limits(MemoryStore::with_clock(clock.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(example::serve(listener, limits.clone()));
    let client = GreeterClient::connect(format!("http://{addr}")).await.unwrap();
    Server { client, clock, limits, task }
}

fn hello(api_key: Option<&str>) -> Request<HelloRequest> {
    let mut req = Request::new(HelloRequest { name: "test".into() });
    if let Some(k) = api_key {
        req.metadata_mut().insert("x-api-key", k.parse().unwrap());
    }
    req
}

fn meta<'a>(md: &'a tonic::metadata::MetadataMap, name: &str) -> &'a str {
    md.get(name).unwrap_or_else(|| panic!("no {name} in {md:?}")).to_str().unwrap()
}

#[tokio::test]
async fn a_spent_api_key_gets_resource_exhausted_with_retry_information() {
    let mut s = server().await;
    for left in (0..5).rev() {
        let res = s.client.say_hello(hello(Some("k1"))).await.expect("within quota");
        // Allowed responses carry the rate-limit headers as metadata, and the handler
        // saw the Decision.
        assert_eq!(meta(res.metadata(), "x-ratelimit-remaining"), left.to_string());
        assert_eq!(res.get_ref().message, format!("Hello, test! ({left} calls left)"));
    }
    let status = s.client.say_hello(hello(Some("k1"))).await.expect_err("the sixth call is over the quota");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let md = status.metadata();
    // GCRA, 5 per minute: the next call fits 12 s later.
    assert_eq!(meta(md, "grpc-retry-pushback-ms"), "12000");
    assert_eq!(meta(md, "retry-after"), "12");
    assert_eq!(meta(md, "x-ratelimit-rule"), "api-key");
    assert_eq!(meta(md, "x-ratelimit-remaining"), "0");
    assert_eq!(example::retry_delay(&status), Some(Duration::from_secs(12)));

    // Another key is not affected; the spent one is back once the pushback has passed.
    s.client.say_hello(hello(Some("k2"))).await.expect("another key has its own quota");
    s.clock.advance(Duration::from_millis(11_999));
    assert_eq!(s.client.say_hello(hello(Some("k1"))).await.unwrap_err().code(), Code::ResourceExhausted);
    s.clock.advance(Duration::from_millis(1));
    s.client.say_hello(hello(Some("k1"))).await.expect("the pushback was exact");
}

#[tokio::test]
async fn the_peer_address_comes_from_tonic_connect_info() {
    let mut s = server().await;
    // 20 calls from this address with 5 keys, each under its own limit of 5.
    for i in 0..20 {
        let key = format!("ip-test-{}", i / 4);
        s.client.say_hello(hello(Some(&key))).await.unwrap_or_else(|e| panic!("call {i}: {e:?}"));
    }
    // A fresh key does not help: the address is spent.
    let status = s.client.say_hello(hello(Some("fresh"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(meta(status.metadata(), "x-ratelimit-rule"), "peer-ip");
    assert!(example::retry_delay(&status).is_some());
    // Nor does sending no key at all.
    assert_eq!(s.client.say_hello(hello(None)).await.unwrap_err().code(), Code::ResourceExhausted);

    // The key was the real peer address read from tonic's TcpConnectInfo, not the
    // shared "unknown" key used when connection info is missing.
    let d = s.limits.peek("peer-ip", "127.0.0.1").await.unwrap();
    assert!(!d.allowed, "{d:?}");
    // (A peek answers as if one more call came: a fresh key would have 19 left after it.)
    let unknown = s.limits.peek("peer-ip", "unknown").await.unwrap();
    assert!(unknown.allowed && unknown.remaining() == 19, "{unknown:?}");
}
