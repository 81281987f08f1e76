//! [`PeerIp`]: the address of the connected peer, canonicalised.

use std::net::{IpAddr, SocketAddr};

use http::Request;
use ipnet::Ipv6Net;

use super::{Key, KeyExtractor};
use crate::notice::Once;

/// The address of the connected peer: from axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's `TcpConnectInfo`
/// (feature `tonic`), or a bare `SocketAddr` extension.
///
/// IPv4-mapped IPv6 addresses count as IPv4; other IPv6 addresses are grouped by their
/// /64 prefix (one customer usually holds a whole /64) — see [`PeerIp::ipv6_prefix`].
/// Without any connection info it warns once and limits under the key `"unknown"`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl PeerIp {
    /// Groups IPv6 peers by a prefix of this many bits instead of 64 (128: every address
    /// on its own).
    #[must_use]
    pub fn ipv6_prefix(self, bits: u8) -> PeerIpPrefix {
        PeerIpPrefix(bits.min(128))
    }
}

/// [`PeerIp`] with another IPv6 prefix length.
#[derive(Debug, Clone, Copy)]
pub struct PeerIpPrefix(u8);

impl<B> KeyExtractor<Request<B>> for PeerIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        PeerIpPrefix(64).extract(req)
    }
}

impl<B> KeyExtractor<Request<B>> for PeerIpPrefix {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        if req.headers().contains_key("x-forwarded-for") || req.headers().contains_key("forwarded") {
            FORWARDED.tell(true, || FORWARDED_HINT.to_owned());
        }
        Some(match peer_addr(req) {
            Some(ip) => ip_key(ip, self.0),
            None => unknown_peer(),
        })
    }
}

static NO_PEER: Once = Once::new();
static FORWARDED: Once = Once::new();

/// What to do when requests carry forwarding headers but are keyed by the peer.
const FORWARDED_HINT: &str = "tollgate: a request arrived with X-Forwarded-For (or Forwarded) but its rule is \
     keyed by key::PeerIp, the connected peer: behind a reverse proxy or load balancer every client shares the \
     proxy's address, and one limit. Key by key::TrustedProxyIp::new([\"<your proxies' networks>\"]) or \
     key::TrustedProxyIp::hops(<number of proxies>) instead (or ignore this if clients connect directly and \
     send the header themselves).";

/// What to do when a request carries no peer address.
pub(super) const NO_PEER_HINT: &str = "tollgate: no peer address in the request, so every such request shares \
     the key \"unknown\" (one limit for all clients). axum: serve with \
     app.into_make_service_with_connect_info::<SocketAddr>(); tonic: keep TcpConnectInfo (the default); \
     behind a proxy: key::TrustedProxyIp.";

pub(super) fn unknown_peer() -> Key {
    NO_PEER.tell(true, || NO_PEER_HINT.to_owned());
    crate::metrics::peer_unknown();
    Key::from("unknown")
}

/// The peer's IP from the request's connection info.
pub(crate) fn peer_addr<B>(req: &Request<B>) -> Option<IpAddr> {
    let ext = req.extensions();
    #[cfg(feature = "axum")]
    if let Some(ci) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(ci) = ext.get::<tonic::transport::server::TcpConnectInfo>() {
        if let Some(addr) = ci.remote_addr() {
            return Some(addr.ip());
        }
    }
    ext.get::<SocketAddr>().map(SocketAddr::ip)
}

/// The canonical form of an address: IPv4-mapped IPv6 as IPv4, IPv6 masked to `v6_bits`.
pub(crate) fn canonical_ip(ip: IpAddr, v6_bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Net::new(v6, v6_bits.min(128)).map_or(v6, |net| net.network())),
        },
    }
}

pub(super) fn ip_key(ip: IpAddr, v6_bits: u8) -> Key {
    let ip = canonical_ip(ip, v6_bits);
    match ip {
        IpAddr::V6(_) if v6_bits < 128 => Key::display(format_args!("{ip}/{v6_bits}")),
        _ => Key::from(ip),
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::super::test_support::{key_of, req_from};
    use super::*;

    #[test]
    fn peer_ip_canonicalises() {
        assert_eq!(key_of(&PeerIp, &req_from("1.2.3.4:5", &[])), "1.2.3.4");
        assert_eq!(key_of(&PeerIp, &req_from("[::ffff:1.2.3.4]:5", &[])), "1.2.3.4");
        assert_eq!(key_of(&PeerIp, &req_from("[2001:db8:1:2:3:4:5:6]:5", &[])), "2001:db8:1:2::/64");
        assert_eq!(key_of(&PeerIp.ipv6_prefix(48), &req_from("[2001:db8:1:2:3:4:5:6]:5", &[])), "2001:db8:1::/48");
        assert_eq!(key_of(&PeerIp.ipv6_prefix(128), &req_from("[2001:db8::6]:5", &[])), "2001:db8::6");
    }

    #[test]
    fn peer_ip_without_connect_info_limits_under_unknown() {
        let req = Request::new(());
        assert_eq!(key_of(&PeerIp, &req), "unknown");
    }

    #[test]
    fn peer_ip_ignores_forwarding_headers() {
        let req = req_from("9.9.9.9:1", &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(key_of(&PeerIp, &req), "9.9.9.9");
    }
}
