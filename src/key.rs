//! What is being limited: [`Key`], the [`KeyExtractor`] trait, and the built-in extractors
//! [`PeerIp`], [`TrustedProxyIp`], [`header`] and [`Global`].
//!
//! Any closure `Fn(&http::Request<B>) -> Option<K>` with `K: Into<Key>` is an extractor.
//! Annotate the request type, as Rust cannot infer it from the layer:
//! `|req: &http::Request<axum::body::Body>| …` for axum, `|req: &http::Request<tonic::body::Body>| …`
//! for tonic. A closure that returns `None` says "do not limit this request by this rule".
//! The built-in IP extractors never return `None`: without connection info they warn once
//! and limit under one shared `"unknown"` key rather than silently stop limiting.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::Request;
use sha2::{Digest, Sha256};

use crate::BuildError;

/// Keys longer than this many bytes are replaced by their SHA-256 digest.
pub const MAX_KEY_LEN: usize = 128;
const INLINE: usize = 46;

/// The identity a rule limits (an IP, an API key, an account id…): up to
/// [`MAX_KEY_LEN`] bytes; longer ones are replaced by their SHA-256 digest, so a client
/// cannot make the limiter store arbitrarily large keys, and a digest never equals a
/// short key.
#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline(u8, [u8; INLINE]),
    Heap(Arc<[u8]>),
    Digest([u8; 32]),
}

impl Key {
    /// A key from bytes (hashed when longer than [`MAX_KEY_LEN`]).
    #[must_use]
    pub fn new(bytes: &[u8]) -> Self {
        if bytes.len() <= INLINE {
            let mut buf = [0; INLINE];
            buf[..bytes.len()].copy_from_slice(bytes);
            #[allow(clippy::cast_possible_truncation)]
            Self(Repr::Inline(bytes.len() as u8, buf))
        } else if bytes.len() <= MAX_KEY_LEN {
            Self(Repr::Heap(Arc::from(bytes)))
        } else {
            Self(Repr::Digest(Sha256::digest(bytes).into()))
        }
    }

    /// A key from anything `Display`, formatted without a heap allocation when it fits
    /// the inline buffer (IP addresses always do).
    #[must_use]
    pub fn display(value: impl fmt::Display) -> Self {
        struct Inline {
            buf: [u8; INLINE],
            len: usize,
            spill: Option<String>,
        }
        impl fmt::Write for Inline {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                if let Some(spill) = &mut self.spill {
                    spill.push_str(s);
                } else if self.len + s.len() <= INLINE {
                    self.buf[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
                    self.len += s.len();
                } else {
                    let mut spill = String::from_utf8_lossy(&self.buf[..self.len]).into_owned();
                    spill.push_str(s);
                    self.spill = Some(spill);
                }
                Ok(())
            }
        }
        let mut w = Inline { buf: [0; INLINE], len: 0, spill: None };
        let _ = fmt::write(&mut w, format_args!("{value}"));
        match w.spill {
            Some(s) => Self::new(s.as_bytes()),
            #[allow(clippy::cast_possible_truncation)]
            None => Self(Repr::Inline(w.len as u8, w.buf)),
        }
    }

    /// The key's bytes (for a hashed key: the 32 bytes of its digest).
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline(len, buf) => &buf[..usize::from(*len)],
            Repr::Heap(b) => b,
            Repr::Digest(d) => d,
        }
    }

    /// Whether the key was longer than [`MAX_KEY_LEN`] and is stored as its digest.
    #[must_use]
    pub fn is_hashed(&self) -> bool {
        matches!(self.0, Repr::Digest(_))
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.is_hashed() == other.is_hashed() && self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.is_hashed().hash(state);
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_hashed() {
            f.write_str("Key(sha256:")?;
            for b in self.as_bytes() {
                write!(f, "{b:02x}")?;
            }
            f.write_str(")")
        } else {
            write!(f, "Key({:?})", String::from_utf8_lossy(self.as_bytes()))
        }
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Self::new(s.as_bytes())
    }
}
impl From<String> for Key {
    fn from(s: String) -> Self {
        Self::new(s.as_bytes())
    }
}
impl From<&String> for Key {
    fn from(s: &String) -> Self {
        Self::new(s.as_bytes())
    }
}
impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Self {
        Self::new(b)
    }
}
impl From<Vec<u8>> for Key {
    fn from(b: Vec<u8>) -> Self {
        Self::new(&b)
    }
}
impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Self::display(n)
    }
}
impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Self::display(ip)
    }
}

/// Turns a request into the [`Key`] a rule limits, or `None` to skip the rule.
///
/// Implemented for closures `Fn(&Request<B>) -> Option<K>` where `K: Into<Key>`.
pub trait KeyExtractor<B>: Send + Sync + 'static {
    /// The key, or `None` when this rule does not apply to the request.
    fn extract(&self, req: &Request<B>) -> Option<Key>;
}

impl<F, B, K> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<K> + Send + Sync + 'static,
    K: Into<Key>,
{
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        self(req).map(Into::into)
    }
}

/// One key for every request: a global limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl<B> KeyExtractor<B> for Global {
    fn extract(&self, _req: &Request<B>) -> Option<Key> {
        Some(Key::from("global"))
    }
}

/// The value of a request header, e.g. `header("x-api-key")`. A request without the
/// header (or with an empty value) is not limited by the rule. Any bytes are accepted;
/// long values are hashed.
#[must_use]
pub fn header(name: &'static str) -> Header {
    Header(http::HeaderName::from_static(name))
}

/// See [`header`].
#[derive(Debug, Clone)]
pub struct Header(http::HeaderName);

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        let v = req.headers().get(&self.0)?.as_bytes();
        (!v.is_empty()).then(|| Key::new(v))
    }
}

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

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        PeerIpPrefix(64).extract(req)
    }
}

impl<B> KeyExtractor<B> for PeerIpPrefix {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        Some(match peer_addr(req) {
            Some(ip) => ip_key(ip, self.0),
            None => unknown_peer(),
        })
    }
}

static WARNED_NO_PEER: AtomicBool = AtomicBool::new(false);

fn unknown_peer() -> Key {
    if !WARNED_NO_PEER.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "tollgate: no peer address in the request (axum: serve with \
             into_make_service_with_connect_info::<SocketAddr>()); such requests share \
             the key \"unknown\""
        );
    }
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
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(v6_bits))),
        },
    }
}

fn mask128(bits: u8) -> u128 {
    if bits == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(bits.min(128)))
    }
}

fn ip_key(ip: IpAddr, v6_bits: u8) -> Key {
    let ip = canonical_ip(ip, v6_bits);
    match ip {
        IpAddr::V6(_) if v6_bits < 128 => Key::display(format_args!("{ip}/{v6_bits}")),
        _ => Key::from(ip),
    }
}

/// An IP network such as `10.0.0.0/8` or `::1/128` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    bits: u8,
}

impl IpNet {
    /// Whether `ip` is inside this network (IPv4-mapped addresses count as IPv4).
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical_ip(ip, 128)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let m = if self.bits == 0 { 0 } else { u32::MAX << (32 - u32::from(self.bits)) };
                u32::from(net) & m == u32::from(ip) & m
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let m = mask128(self.bits);
                u128::from(net) & m == u128::from(ip) & m
            }
            _ => false,
        }
    }
}

impl FromStr for IpNet {
    type Err = BuildError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| BuildError::InvalidStore(format!("trusted proxy network {s:?}: {why}"));
        let (addr, bits) = match s.trim().split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
        let addr = canonical_ip(addr, 128);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(b) => b.parse::<u8>().ok().filter(|&b| b <= max).ok_or_else(|| bad("bad prefix length"))?,
            None => max,
        };
        Ok(Self { addr, bits })
    }
}

/// Which header a trusted proxy writes the client address into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// The client address behind trusted reverse proxies.
///
/// Only when the connected peer is inside one of the trusted networks is the forwarding
/// header read, right to left, skipping trusted proxies; the first untrusted address is
/// the client. A client can therefore never choose its own key by sending the header:
/// whatever it writes stands left of what the trusted proxies appended. A peer outside
/// the trusted networks is itself the client. A header that cannot be read yields the
/// nearest trusted hop, so the request is still limited.
///
/// ```
/// use tollgate::key::TrustedProxyIp;
///
/// let key = TrustedProxyIp::new(["10.0.0.0/8", "::1"]).unwrap();
/// assert!(TrustedProxyIp::new(["10.0.0.0/33"]).is_err());
/// # let _ = key;
/// ```
#[derive(Debug, Clone)]
pub struct TrustedProxyIp {
    trusted: Arc<[IpNet]>,
    header: ProxyHeader,
    v6_bits: u8,
}

impl TrustedProxyIp {
    /// Trusts these proxy networks (`"10.0.0.0/8"`, `"192.168.1.7"`, `"fd00::/8"`).
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidStore`] naming the network that does not parse.
    pub fn new<I, S>(trusted: I) -> Result<Self, BuildError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = trusted.into_iter().map(|s| s.as_ref().parse()).collect::<Result<Vec<IpNet>, _>>()?;
        Ok(Self { trusted: trusted.into(), header: ProxyHeader::default(), v6_bits: 64 })
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

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// The client address for a request whose peer is `peer`.
    pub(crate) fn client_ip<B>(&self, req: &Request<B>, peer: IpAddr) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut nearest = peer;
        let name = match self.header {
            ProxyHeader::XForwardedFor => "x-forwarded-for",
            ProxyHeader::Forwarded => "forwarded",
        };
        // All header lines, in order; entries read right to left across them.
        let values: Vec<&[u8]> = req.headers().get_all(name).iter().map(http::HeaderValue::as_bytes).collect();
        for value in values.iter().rev() {
            let Ok(text) = std::str::from_utf8(value) else { return nearest };
            for entry in text.rsplit(',') {
                let parsed = match self.header {
                    ProxyHeader::XForwardedFor => parse_xff_entry(entry),
                    ProxyHeader::Forwarded => parse_forwarded_entry(entry),
                };
                let Some(ip) = parsed else { return nearest };
                if !self.is_trusted(ip) {
                    return ip;
                }
                nearest = ip;
            }
        }
        nearest
    }
}

impl<B> KeyExtractor<B> for TrustedProxyIp {
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

fn parse_xff_entry(entry: &str) -> Option<IpAddr> {
    parse_ip_port(entry)
}

fn parse_forwarded_entry(entry: &str) -> Option<IpAddr> {
    entry.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then(|| parse_ip_port(v)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_from(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder();
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    fn key_of<E: KeyExtractor<()>>(e: &E, req: &Request<()>) -> String {
        String::from_utf8(e.extract(req).unwrap().as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn long_keys_are_hashed_and_never_equal_short_ones() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let k = Key::from(long.as_str());
        assert!(k.is_hashed());
        assert_eq!(k.as_bytes().len(), 32);
        assert_eq!(k, Key::from(long.clone()));
        assert_ne!(k, Key::from("k".repeat(MAX_KEY_LEN + 2)));
        // A short key holding the digest's bytes is still a different key.
        assert_ne!(k, Key::new(k.as_bytes()));
        let exact = Key::from("x".repeat(MAX_KEY_LEN));
        assert!(!exact.is_hashed());
        assert_eq!(exact.as_bytes().len(), MAX_KEY_LEN);
        assert_eq!(Key::from("abc").as_bytes(), b"abc");
        assert_eq!(Key::display(42u64), Key::from("42"));
        let long = "y".repeat(INLINE + 10);
        assert_eq!(Key::display(&long), Key::from(long.as_str()));
        assert_eq!(Key::display("z".repeat(MAX_KEY_LEN + 1)), Key::from("z".repeat(MAX_KEY_LEN + 1)));
    }

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
    fn trusted_proxy_reads_forwarded() {
        let k = TrustedProxyIp::new(["127.0.0.1", "::1"]).unwrap().header(ProxyHeader::Forwarded);
        let req =
            req_from("[::1]:1", &[("forwarded", "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https, for=127.0.0.1")]);
        assert_eq!(key_of(&k, &req), "2001:db8::/64");
    }

    #[test]
    fn header_key() {
        let e = header("x-api-key");
        assert_eq!(key_of(&e, &req_from("1.1.1.1:1", &[("x-api-key", "abc")])), "abc");
        assert!(e.extract(&req_from("1.1.1.1:1", &[])).is_none());
        assert!(e.extract(&req_from("1.1.1.1:1", &[("x-api-key", "")])).is_none());
        let mut req = Request::new(());
        req.headers_mut().insert("x-api-key", http::HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert_eq!(e.extract(&req).unwrap().as_bytes(), b"\xff\xfe");
    }

    #[test]
    fn networks() {
        let n: IpNet = "10.0.0.0/8".parse().unwrap();
        assert!(n.contains("10.200.1.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!n.contains("11.0.0.1".parse().unwrap()));
        let n: IpNet = "fd00::/8".parse().unwrap();
        assert!(n.contains("fd12::1".parse().unwrap()));
        assert!("1.2.3.4/40".parse::<IpNet>().is_err());
        assert!("nope".parse::<IpNet>().unwrap_err().to_string().contains("nope"));
    }
}
