//! Client IPs behind real proxies, over real TCP: an axum server keyed by
//! `key::TrustedProxyIp`, reached from a trusted peer (127.0.0.1) and from an untrusted one
//! (127.0.0.2, another loopback address), with a hop count and with each edge proxy's
//! header. Each rule admits one request a key an hour; the second request's 429 names the
//! key it was counted under.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use http::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::key::{ProxyHeader, TrustedProxyIp};
use tollgate::{MemoryStore, Quota, RateLimitLayer};

/// A server keyed by `key`; its 429 bodies are the key.
async fn serve(key: TrustedProxyIp) -> SocketAddr {
    let layer = RateLimitLayer::new(Quota::per_hour(1), key, MemoryStore::new()).on_rejected(|r| {
        let mut res = Response::new(Body::from(String::from_utf8_lossy(&r.key.as_bytes()).into_owned()));
        *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
        res
    });
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" })).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    addr
}

/// One request from the local address `from`, with `headers`: the status and the body.
async fn get(addr: SocketAddr, from: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0)).unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    let mut req = String::from("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    // Chunked or not, the key is the body's one line of text.
    let body = body.lines().find(|l| l.contains('.') || l.contains(':')).unwrap_or_default().trim().to_owned();
    (status, body)
}

/// The key a request is counted under: it is sent twice, and the second one's 429 says.
async fn key_of(addr: SocketAddr, from: &str, headers: &[(&str, &str)]) -> String {
    assert_eq!(get(addr, from, headers).await.0, 200, "a fresh key");
    let (status, key) = get(addr, from, headers).await;
    assert_eq!(status, 429, "the same key twice");
    key
}

#[tokio::test]
async fn a_hop_count_trusts_the_nearest_proxies_whatever_their_address() {
    let xff = [("x-forwarded-for", "203.0.113.9, 198.51.100.7, 192.0.2.1")];
    // One proxy (the peer): the last address it appended.
    assert_eq!(key_of(serve(TrustedProxyIp::hops(1)).await, "127.0.0.1", &xff).await, "192.0.2.1");
    // Two: the peer and the hop before it; the client's own entry left of theirs.
    assert_eq!(key_of(serve(TrustedProxyIp::hops(2)).await, "127.0.0.2", &xff).await, "198.51.100.7");
    // More hops than entries: the leftmost address.
    assert_eq!(key_of(serve(TrustedProxyIp::hops(5)).await, "127.0.0.1", &xff).await, "203.0.113.9");
    // None: the peer.
    assert_eq!(key_of(serve(TrustedProxyIp::hops(0)).await, "127.0.0.2", &xff).await, "127.0.0.2");
}

#[tokio::test]
async fn an_edge_header_counts_only_from_a_trusted_peer() {
    for (header, name) in [
        (ProxyHeader::XRealIp, "x-real-ip"),
        (ProxyHeader::CfConnectingIp, "cf-connecting-ip"),
        (ProxyHeader::TrueClientIp, "true-client-ip"),
        (ProxyHeader::FlyClientIp, "fly-client-ip"),
    ] {
        let key = TrustedProxyIp::new(["127.0.0.1"]).unwrap().header(header);
        let addr = serve(key).await;
        let sent = [(name, "203.0.113.50"), ("x-forwarded-for", "198.51.100.99")];
        assert_eq!(key_of(addr, "127.0.0.1", &sent).await, "203.0.113.50", "{name} from the trusted proxy");
        assert_eq!(key_of(addr, "127.0.0.2", &sent).await, "127.0.0.2", "{name} from an untrusted peer");
        // A header that does not parse: the proxy itself, still limited.
        let garbage = [(name, "not an address")];
        assert_eq!(key_of(addr, "127.0.0.1", &garbage).await, "127.0.0.1", "{name} garbage");
        // With a hop count the peer is trusted.
        let addr = serve(TrustedProxyIp::hops(1).header(header)).await;
        assert_eq!(key_of(addr, "127.0.0.2", &[(name, "203.0.113.51")]).await, "203.0.113.51", "{name}, hops(1)");
    }
}
