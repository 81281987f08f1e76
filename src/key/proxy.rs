//! [`TrustedProxyIp`]: the client address behind trusted reverse proxies.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::Request;
use ipnet::Ipv4Net;

use super::peer::{canonical_ip, ip_key, peer_addr, unknown_peer};
use super::{Key, KeyExtractor};
use crate::error::BuildError;

/// An IP network (`10.0.0.0/8`, `fd00::/8`): the [`ipnet`] crate's, re-exported.
pub use ipnet::IpNet;

/// One trusted network: a CIDR or a bare address (a /32 or /128). An IPv4-mapped IPv6
/// network (`::ffff:10.0.0.0/104`) becomes the IPv4 network it maps (`10.0.0.0/8`), as
/// clients' addresses are compared in their canonical form.
fn parse_network(s: &str) -> Result<IpNet, BuildError> {
    let bad = |why: &str| BuildError::InvalidKey(format!("trusted proxy network {s:?}: {why}"));
    let text = s.trim();
    let net = match text.split_once('/') {
        None => text.parse::<IpAddr>().map(IpNet::from).map_err(|_| bad("not an IP address"))?,
        Some((addr, _)) => {
            addr.parse::<IpAddr>().map_err(|_| bad("not an IP address"))?;
            text.parse::<IpNet>().map_err(|_| bad("bad prefix length"))?
        }
    };
    Ok(match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, IpNet::V4),
            None => net.trunc(),
        },
        _ => net.trunc(),
    })
}

/// Which header a trusted proxy writes the client address into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`: a list each proxy appends to, read
    /// right to left.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`: a list,
    /// read right to left.
    Forwarded,
    /// `X-Real-IP: client` (nginx's `real_ip` module, many load balancers): one address,
    /// set by the proxy that connects to this server.
    XRealIp,
    /// `CF-Connecting-IP: client` (Cloudflare).
    CfConnectingIp,
    /// `True-Client-IP: client` (Akamai, Cloudflare Enterprise).
    TrueClientIp,
    /// `Fly-Client-IP: client` (Fly.io).
    FlyClientIp,
}

impl ProxyHeader {
    fn name(self) -> &'static str {
        match self {
            ProxyHeader::XForwardedFor => "x-forwarded-for",
            ProxyHeader::Forwarded => "forwarded",
            ProxyHeader::XRealIp => "x-real-ip",
            ProxyHeader::CfConnectingIp => "cf-connecting-ip",
            ProxyHeader::TrueClientIp => "true-client-ip",
            ProxyHeader::FlyClientIp => "fly-client-ip",
        }
    }
}

/// Which hops are proxies of this service.
#[derive(Debug, Clone)]
enum Trust {
    /// Those inside these networks.
    Networks(Arc<[IpNet]>),
    /// The connected peer and the `n - 1` proxies nearest to it, whatever their address.
    Hops(usize),
}

/// The client address behind trusted reverse proxies.
///
/// Only when the connected peer is a trusted proxy is the forwarding header read: a list
/// (`X-Forwarded-For`, `Forwarded`) right to left, skipping trusted proxies, the first
/// untrusted address being the client; a single-address header of an edge proxy
/// (`X-Real-IP`, `CF-Connecting-IP`, `True-Client-IP`, `Fly-Client-IP`: see
/// [`ProxyHeader`]) as it stands. A client can therefore never choose its own key by
/// sending the header: whatever it writes stands left of what the trusted proxies
/// appended, or is replaced by the edge. A peer that is not trusted is itself the client.
/// A header that cannot be read yields the nearest trusted hop, so the request is still
/// limited.
///
/// Which hops are trusted: those inside networks ([`TrustedProxyIp::new`]), or a number
/// of hops ([`TrustedProxyIp::hops`]) when the proxies' addresses are not known (a cloud
/// load balancer) — as express's `trust proxy` takes either.
///
/// ```
/// use tollgate::key::{ProxyHeader, TrustedProxyIp};
///
/// let key = TrustedProxyIp::new(["10.0.0.0/8", "::1"]).unwrap();
/// assert!(TrustedProxyIp::new(["10.0.0.0/33"]).is_err());
/// // Behind one load balancer whose address is not known:
/// let behind_lb = TrustedProxyIp::hops(1);
/// // Behind Cloudflare, reached from its published ranges:
/// let cloudflare = TrustedProxyIp::new(["173.245.48.0/20", "103.21.244.0/22"]).unwrap().header(ProxyHeader::CfConnectingIp);
/// # let _ = (key, behind_lb, cloudflare);
/// ```
#[derive(Debug, Clone)]
pub struct TrustedProxyIp {
    trust: Trust,
    header: ProxyHeader,
    v6_bits: u8,
}

impl TrustedProxyIp {
    /// Trusts these proxy networks (`"10.0.0.0/8"`, `"192.168.1.7"`, `"fd00::/8"`).
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidKey`] naming the network that does not parse.
    pub fn new<I, S>(trusted: I) -> Result<Self, BuildError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = trusted.into_iter().map(|s| parse_network(s.as_ref())).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { trust: Trust::Networks(trusted.into()), header: ProxyHeader::default(), v6_bits: 64 })
    }

    /// Trusts the `n` proxies nearest to this server, whatever their addresses: the
    /// connected peer and the `n - 1` hops before it (express's `trust proxy = n`). Behind
    /// one load balancer, `hops(1)`: the client is the last address it appended to
    /// `X-Forwarded-For`. A list shorter than that yields its leftmost address; `hops(0)`
    /// trusts nothing (the peer is the client, as [`PeerIp`](super::PeerIp)).
    ///
    /// Only right when every request comes through exactly those `n` proxies: a client
    /// that can reach this server directly chooses its own key.
    #[must_use]
    pub fn hops(n: usize) -> Self {
        Self { trust: Trust::Hops(n), header: ProxyHeader::default(), v6_bits: 64 }
    }

    /// Reads this header instead of `X-Forwarded-For`.
    #[must_use]
    pub fn header(mut self, header: ProxyHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by a prefix of this many bits instead of 64.
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_bits = bits.min(128);
        self
    }

    /// Whether the hop `hop` away from this server (1: the connected peer), at `ip`, is a
    /// trusted proxy.
    fn is_trusted_hop(&self, hop: usize, ip: IpAddr) -> bool {
        match &self.trust {
            Trust::Networks(nets) => {
                let ip = canonical_ip(ip, 128);
                nets.iter().any(|n| n.contains(&ip))
            }
            Trust::Hops(n) => hop <= *n,
        }
    }

    /// The hop count, when hops are trusted by count ([`TrustedProxyIp::hops`]).
    #[cfg_attr(not(feature = "config"), allow(dead_code))]
    pub(crate) fn hop_count(&self) -> Option<usize> {
        match self.trust {
            Trust::Hops(n) => Some(n),
            Trust::Networks(_) => None,
        }
    }

    /// The client address for a request whose peer is `peer`.
    pub(crate) fn client_ip<B>(&self, req: &Request<B>, peer: IpAddr) -> IpAddr {
        if !self.is_trusted_hop(1, peer) {
            return peer;
        }
        let name = self.header.name();
        let list = match self.header {
            ProxyHeader::XForwardedFor => parse_ip_port,
            ProxyHeader::Forwarded => parse_forwarded_entry,
            // An edge proxy's one address (the last line, should a client have sent one
            // too and the edge appended rather than replaced).
            _ => {
                let value = req.headers().get_all(name).iter().next_back();
                return value.and_then(|v| parse_ip_port(v.to_str().ok()?)).unwrap_or(peer);
            }
        };
        let mut nearest = peer;
        let mut hop = 1;
        // All header lines; entries read right to left across them, each on its own: a
        // byte that is not UTF-8 spoils its entry only (a client writes left of what the
        // trusted proxies append, so it can never hide their entries by spoiling its own).
        // The k-th entry from the right is hop k + 1: the address that connected to hop k.
        for value in req.headers().get_all(name).iter().rev() {
            for entry in value.as_bytes().rsplit(|&b| b == b',') {
                let Some(ip) = std::str::from_utf8(entry).ok().and_then(list) else { return nearest };
                hop += 1;
                if !self.is_trusted_hop(hop, ip) {
                    return ip;
                }
                nearest = ip;
            }
        }
        nearest
    }
}

impl<B> KeyExtractor<Request<B>> for TrustedProxyIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        Some(match peer_addr(req) {
            Some(peer) => ip_key(self.client_ip(req, peer), self.v6_bits),
            None => unknown_peer(),
        })
    }
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`.
fn parse_ip_port(s: &str) -> Option<IpAddr> {
    let s = s.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    let inner = s.strip_prefix('[')?.split(']').next()?;
    inner.parse().ok()
}

fn parse_forwarded_entry(entry: &str) -> Option<IpAddr> {
    entry.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then(|| parse_ip_port(v)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{key_of, req_from};
    use super::*;

    #[test]
    fn trusted_proxy_reads_right_to_left() {
        let k = TrustedProxyIp::new(["10.0.0.0/8"]).unwrap();
        // Untrusted peer: the header is ignored, whatever it says.
        assert_eq!(key_of(&k, &req_from("8.8.8.8:1", &[("x-forwarded-for", "1.1.1.1")])), "8.8.8.8");
        // Trusted peer: the rightmost untrusted entry; a spoofed left entry is ignored.
        let req = req_from("10.0.0.1:1", &[("x-forwarded-for", "6.6.6.6, 7.7.7.7, 10.0.0.2")]);
        assert_eq!(key_of(&k, &req), "7.7.7.7");
        // Several header lines count as one list.
        let req = req_from("10.0.0.1:1", &[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "7.7.7.7:443")]);
        assert_eq!(key_of(&k, &req), "7.7.7.7");
        // No header: the proxy itself. Garbage: the nearest trusted hop, never a panic.
        assert_eq!(key_of(&k, &req_from("10.0.0.1:1", &[])), "10.0.0.1");
        let req = req_from("10.0.0.1:1", &[("x-forwarded-for", "6.6.6.6, garbage, 10.0.0.3")]);
        assert_eq!(key_of(&k, &req), "10.0.0.3");
    }

    #[test]
    fn bytes_that_are_not_utf8_spoil_only_their_own_entry() {
        let k = TrustedProxyIp::new(["10.0.0.0/8"]).unwrap();
        // The client sent `198.51.100.1\xff\xfe`; the trusted proxy appended its address.
        let mut req = req_from("10.0.0.1:1", &[]);
        let value = http::HeaderValue::from_bytes(b"198.51.100.1\xff\xfe, 203.0.113.7").unwrap();
        req.headers_mut().insert("x-forwarded-for", value);
        assert_eq!(key_of(&k, &req), "203.0.113.7", "the client escaped into the proxy's shared key");
        // Garbage right of a trusted hop: the nearest trusted hop, as for any garbage.
        let mut req = req_from("10.0.0.1:1", &[]);
        let value = http::HeaderValue::from_bytes(b"203.0.113.7, \xff, 10.0.0.9").unwrap();
        req.headers_mut().insert("x-forwarded-for", value);
        assert_eq!(key_of(&k, &req), "10.0.0.9");
    }

    #[test]
    fn trusted_proxy_reads_forwarded() {
        let k = TrustedProxyIp::new(["127.0.0.1", "::1"]).unwrap().header(ProxyHeader::Forwarded);
        let req =
            req_from("[::1]:1", &[("forwarded", "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https, for=127.0.0.1")]);
        assert_eq!(key_of(&k, &req), "2001:db8::/64");
    }

    #[test]
    fn networks() {
        let trusted = |nets: &[&str], ip: &str| {
            let k = TrustedProxyIp::new(nets).unwrap();
            k.is_trusted_hop(1, ip.parse().unwrap())
        };
        assert!(trusted(&["10.0.0.0/8"], "10.200.1.1"));
        assert!(trusted(&["10.0.0.0/8"], "::ffff:10.1.1.1"), "a mapped client is its IPv4 address");
        assert!(!trusted(&["10.0.0.0/8"], "11.0.0.1"));
        assert!(trusted(&["fd00::/8"], "fd12::1"));
        assert!(!trusted(&["fd00::/8"], "fe00::1"));
        // A bare address is one host; host bits in a CIDR are ignored.
        assert!(trusted(&[" 192.168.1.7 "], "192.168.1.7"));
        assert!(!trusted(&["192.168.1.7"], "192.168.1.8"));
        assert!(trusted(&["10.1.2.3/8"], "10.9.9.9"));
        // A mapped IPv6 network is the IPv4 network it maps.
        assert!(trusted(&["::ffff:10.0.0.0/104"], "10.3.3.3"));
        assert!(trusted(&["::ffff:10.0.0.0/104"], "::ffff:10.3.3.3"));
        assert!(!trusted(&["::ffff:10.0.0.0/104"], "11.3.3.3"));
        let err = |net: &str| TrustedProxyIp::new([net]).unwrap_err().to_string();
        assert!(err("1.2.3.4/40").contains("1.2.3.4/40"));
        assert!(err("nope").contains("\"nope\": not an IP address"));
        assert!(err("10.0.0.0/x").contains("bad prefix length"));
        assert!(err("10.0.0.0/33").contains("bad prefix length"));
        assert!(err("10.0.0/8").contains("not an IP address"));
    }
}
