//! [`KeySpec`]: the `key` field of a configured rule.

use std::fmt;
use std::str::FromStr;

use http::{HeaderName, Request};

use super::why;
use crate::error::BuildError;
use crate::key::{header_key, Key, KeyExtractor, PeerIp, TrustedProxyIp};

/// What a configured rule limits: the `key` field, parsed.
///
/// | spec | extractor |
/// |---|---|
/// | `peer_ip` | [`PeerIp`] (IPv6 grouped by /64) |
/// | `peer_ip/<bits>` | [`PeerIp::ipv6_prefix`]`(bits)` |
/// | `global` | [`Global`](crate::key::Global) |
/// | `header:<name>` | [`header`](crate::key::header)`(name)`: requests without it are not limited by the rule |
/// | `trusted_proxy_ip:<cidr>,<cidr>,…` | [`TrustedProxyIp::new`] |
/// | `trusted_proxy_hops:<n>` | [`TrustedProxyIp::hops`] |
///
/// ```
/// use tollgate::config::KeySpec;
///
/// assert!(matches!("peer_ip/48".parse(), Ok(KeySpec::PeerIp { ipv6_prefix: 48 })));
/// assert!("header:X-Api-Key".parse::<KeySpec>().is_ok());
/// assert!("cookie:session".parse::<KeySpec>().is_err());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum KeySpec {
    /// `peer_ip` or `peer_ip/<bits>`.
    PeerIp {
        /// The IPv6 prefix length peers are grouped by (64 for plain `peer_ip`).
        ipv6_prefix: u8,
    },
    /// `global`: one key for every request.
    Global,
    /// `header:<name>`.
    Header(HeaderName),
    /// `trusted_proxy_ip:<cidr>,<cidr>,…` or `trusted_proxy_hops:<n>`.
    TrustedProxyIp(TrustedProxyIp),
}

impl FromStr for KeySpec {
    type Err = BuildError;

    /// # Errors
    ///
    /// [`BuildError::InvalidConfig`] with field `key` (and an empty rule name) saying
    /// what is wrong.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| BuildError::InvalidConfig { rule: String::new(), field: "key".into(), why };
        let s = s.trim();
        if s == "global" {
            return Ok(KeySpec::Global);
        }
        if s == "peer_ip" {
            return Ok(KeySpec::PeerIp { ipv6_prefix: 64 });
        }
        if let Some(bits) = s.strip_prefix("peer_ip/") {
            return match bits.trim().parse::<u8>() {
                Ok(bits) if bits <= 128 => Ok(KeySpec::PeerIp { ipv6_prefix: bits }),
                _ => Err(bad(format!("{s:?}: expected peer_ip/<IPv6 prefix length 0..=128>, e.g. peer_ip/48"))),
            };
        }
        if let Some(name) = s.strip_prefix("header:") {
            let name = name.trim();
            return HeaderName::from_bytes(name.as_bytes())
                .map(KeySpec::Header)
                .map_err(|_| bad(format!("{name:?} is not a valid HTTP header name")));
        }
        if let Some(nets) = s.strip_prefix("trusted_proxy_ip:") {
            let nets: Vec<&str> = nets.split(',').map(str::trim).collect();
            if nets.iter().any(|n| n.is_empty()) {
                return Err(bad(format!("{s:?}: expected trusted_proxy_ip:<cidr>,<cidr>, e.g. 10.0.0.0/8")));
            }
            return TrustedProxyIp::new(nets).map(KeySpec::TrustedProxyIp).map_err(|e| bad(why(e)));
        }
        if let Some(n) = s.strip_prefix("trusted_proxy_hops:") {
            return match n.trim().parse::<usize>() {
                Ok(n) => Ok(KeySpec::TrustedProxyIp(TrustedProxyIp::hops(n))),
                Err(_) => Err(bad(format!("{s:?}: expected trusted_proxy_hops:<number of proxies>, e.g. 1"))),
            };
        }
        let kind = s.split([':', '/']).next().unwrap_or(s);
        if ["global", "peer_ip", "header", "trusted_proxy_ip", "trusted_proxy_hops"].contains(&kind) {
            Err(bad(format!("{s:?} is malformed: expected one of {KEY_KINDS}")))
        } else {
            Err(bad(format!("unknown key kind {kind:?}: expected one of {KEY_KINDS}")))
        }
    }
}

const KEY_KINDS: &str =
    "peer_ip, peer_ip/<bits>, global, header:<name>, trusted_proxy_ip:<cidr>,<cidr>, trusted_proxy_hops:<n>";

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpec::PeerIp { ipv6_prefix: 64 } => f.write_str("peer_ip"),
            KeySpec::PeerIp { ipv6_prefix } => write!(f, "peer_ip/{ipv6_prefix}"),
            KeySpec::Global => f.write_str("global"),
            KeySpec::Header(name) => write!(f, "header:{name}"),
            KeySpec::TrustedProxyIp(t) => match t.hop_count() {
                Some(n) => write!(f, "trusted_proxy_hops:{n}"),
                None => f.write_str("trusted_proxy_ip:…"),
            },
        }
    }
}

impl<B> KeyExtractor<Request<B>> for KeySpec {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        match self {
            KeySpec::PeerIp { ipv6_prefix } => PeerIp.ipv6_prefix(*ipv6_prefix).extract(req),
            KeySpec::Global => Some(Key::from("global")),
            // As `key::header`: a missing or empty header means "not limited by this rule".
            KeySpec::Header(name) => header_key(req.headers(), name),
            KeySpec::TrustedProxyIp(t) => t.extract(req),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_specs_round_trip_through_display() {
        for s in ["peer_ip", "peer_ip/48", "global", "header:x-api-key"] {
            assert_eq!(s.parse::<KeySpec>().unwrap().to_string(), s);
        }
        assert!(matches!("peer_ip/129".parse::<KeySpec>(), Err(BuildError::InvalidConfig { .. })));
        assert!("peer_ip:48".parse::<KeySpec>().is_err());
        assert!("global:x".parse::<KeySpec>().is_err());
        assert!("header:".parse::<KeySpec>().is_err());
        assert!("trusted_proxy_ip:".parse::<KeySpec>().is_err());
    }
}
