//! Where a store's connections come from ([`Origin`]), and the URLs that name it: parsed,
//! checked, and shown without their credentials.

use deadpool_redis::redis::{self, IntoConnectionInfo};

use super::security::is_tls;
use super::sentinel::Sentinel;
use crate::error::BuildError;

/// The port of a sentinel address that names none.
const SENTINEL_PORT: u16 = 26379;

/// Where connections come from.
#[derive(Clone)]
#[allow(clippy::large_enum_variant, reason = "one per store; a TLS ConnectionInfo holds its root certificates")]
pub(crate) enum Origin {
    /// A URL given to `from_url`: the store builds its own pool with its timeouts.
    Url(redis::ConnectionInfo),
    /// A pool given by the application.
    Pool(deadpool_redis::Pool),
    /// Cluster node URLs given to `cluster`.
    ClusterUrls(Vec<redis::ConnectionInfo>),
    /// A cluster pool given by the application.
    ClusterPool(deadpool_redis::cluster::Pool),
    /// A `redis+sentinel://` URL: the primary that the sentinels name.
    Sentinel(Sentinel),
}

impl Origin {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Origin::ClusterUrls(_) | Origin::ClusterPool(_))
    }

    /// Whether the store connects over TLS (an application's pool: as it was built).
    pub(crate) fn uses_tls(&self) -> bool {
        match self {
            Origin::Url(info) => is_tls(info),
            Origin::ClusterUrls(infos) => infos.iter().any(is_tls),
            Origin::Sentinel(s) => s.tls,
            Origin::Pool(_) | Origin::ClusterPool(_) => false,
        }
    }

    /// How the connections are secured, for `Debug`.
    pub(crate) fn describe_tls(&self) -> &'static str {
        let given = |info: &redis::ConnectionInfo| {
            matches!(info.addr(), redis::ConnectionAddr::TcpTls { tls_params: Some(_), .. })
        };
        match self {
            Origin::Pool(_) | Origin::ClusterPool(_) => "as the application pool",
            Origin::Url(info) | Origin::Sentinel(Sentinel { node: info, .. }) if given(info) => {
                "rediss (given root certificates)"
            }
            _ if self.uses_tls() => "rediss (system root certificates)",
            _ => "off",
        }
    }

    /// The same origin trusting the CAs of `pem` for its TLS connections (see
    /// `RedisStore::tls_root_certificates`), or why it cannot.
    #[cfg(feature = "redis-tls")]
    pub(crate) fn with_root_certificates(&self, pem: &[u8]) -> Result<Origin, String> {
        Ok(match self {
            Origin::Url(info) => Origin::Url(super::security::with_root_certificates(info, pem)?),
            Origin::ClusterUrls(_) => {
                return Err("root certificates cannot be given to a redis cluster store (deadpool-redis builds \
                     cluster clients without them): add the CA to the system's trust store"
                    .into())
            }
            Origin::Pool(_) | Origin::ClusterPool(_) => {
                return Err("root certificates cannot be given to a store on an application's pool: \
                     configure TLS on the pool"
                    .into())
            }
            Origin::Sentinel(s) => {
                if !s.tls {
                    return Err("root certificates were given to a redis+sentinel:// store, which does not use \
                         TLS: use rediss+sentinel://"
                        .into());
                }
                // The sentinels and the primary: one CA for all, as a private PKI has it.
                let mut s = s.clone();
                let with_roots = |info: &redis::ConnectionInfo| super::security::with_root_certificates(info, pem);
                s.sentinels = s.sentinels.iter().map(with_roots).collect::<Result<_, _>>()?;
                s.node = with_roots(&s.node)?;
                Origin::Sentinel(s)
            }
        })
    }
}

/// `url` without its user name and password, for messages: everything up to the last `@`
/// (after the scheme, if any), so that a password with an unescaped `/`, `?` or `#` does
/// not end the user info early and get shown.
pub(crate) fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].rfind('@') {
        Some(at) => format!("{}***@{}", &url[..start], &url[start + at + 1..]),
        None => url.to_owned(),
    }
}

/// Parses a redis URL, with errors that say what is wrong and never show a password;
/// `rediss://` needs the `redis-tls` feature, and `#insecure` (no certificate check) is
/// refused.
pub(crate) fn parse_url(url: &str) -> Result<redis::ConnectionInfo, BuildError> {
    let shown = redact(url);
    let bad = |why: String| Err(BuildError::InvalidStore(why));
    let Some((scheme, _)) = url.split_once("://") else {
        return bad(format!("{shown:?} is not a redis URL: expected redis://[user:password@]host[:port][/db]"));
    };
    let scheme = scheme.to_ascii_lowercase();
    if !matches!(&*scheme, "redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "valkey+unix" | "unix") {
        return bad(format!(
            "redis URL {shown:?} has the scheme {scheme:?}: use redis://host:port (or rediss://, redis+unix://)"
        ));
    }
    let tls = matches!(&*scheme, "rediss" | "valkeys");
    if tls && !cfg!(feature = "redis-tls") {
        return bad(format!(
            "redis URL {shown:?} asks for TLS ({scheme}://), which needs the `redis-tls` feature of tollgate"
        ));
    }
    if tls && url.contains('#') {
        return bad(format!(
            "redis URL {shown:?} has a #fragment: tollgate always checks the server's certificate \
             (no #insecure); for a private CA use RedisStore::tls_root_certificates"
        ));
    }
    url.into_connection_info().map_err(|e| {
        BuildError::InvalidStore(format!(
            "invalid redis URL {shown:?}: {e} (expected redis://[user:password@]host[:port][/db])"
        ))
    })
}

/// Parses `redis+sentinel://[user:password@]host[:port][,host[:port]…]/master[/db]`
/// (`rediss+sentinel://` for TLS). The user info authenticates to the primary.
pub(crate) fn parse_sentinel_url(url: &str) -> Result<Sentinel, BuildError> {
    let shown = redact(url);
    let form = "redis+sentinel://[user:password@]host[:port][,host[:port]…]/master-name[/db]";
    let bad = |why: &str| BuildError::InvalidStore(format!("sentinel URL {shown:?} {why} (expected {form})"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("has no scheme"))?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "redis+sentinel" => false,
        "rediss+sentinel" => true,
        _ => return Err(bad("is not a sentinel URL")),
    };
    let node_scheme = if tls { "rediss" } else { "redis" };
    let (userinfo, rest) = rest.rsplit_once('@').map_or((None, rest), |(user, rest)| (Some(user), rest));
    let (hosts, path) = rest.split_once('/').ok_or_else(|| bad("names no master"))?;
    if path.contains(['?', '#']) {
        return Err(bad("has a query or fragment, which the sentinel form does not take"));
    }
    let (master, db) = path.split_once('/').unwrap_or((path, ""));
    if master.is_empty() {
        return Err(bad("names no master"));
    }
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(bad("has a database that is not a number"));
    }
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err(bad("has an empty sentinel address"));
        }
        // A bare host gets the sentinel port; `[v6]` and `host:port` keep theirs.
        let has_port = host.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && !p.contains(']'));
        if host.ends_with(':') {
            return Err(bad("has a sentinel address with an empty port"));
        }
        let addr = if has_port { host.to_owned() } else { format!("{host}:{SENTINEL_PORT}") };
        sentinels.push(parse_url(&format!("{node_scheme}://{addr}"))?);
    }
    // The primary's settings, on a placeholder host: each connection gets the address the
    // sentinels name.
    let credentials = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let node_url = format!("{node_scheme}://{credentials}primary.invalid/{db}");
    let node = parse_url(&node_url).map_err(|_| bad("has user info that is not a valid URL user info"))?;
    Ok(Sentinel { sentinels, master: master.to_owned(), node, tls })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:secret@host:1/0"), "redis://***@host:1/0");
        assert_eq!(redact("redis://user:secret@host"), "redis://***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("no url"), "no url");
        assert_eq!(redact("user:secret@host:1"), "***@host:1");
        assert_eq!(redact("redis://:pa/ss?w#d@host:1"), "redis://***@host:1");
    }

    fn addrs(s: &Sentinel) -> Vec<String> {
        s.sentinels.iter().map(|i| i.addr().to_string()).collect()
    }

    #[test]
    fn the_url_names_sentinels_master_database_and_credentials() {
        let s = parse_sentinel_url("redis+sentinel://app:p%40ss@10.0.0.1,10.0.0.2:26380,[::1]:26381/cache/2").unwrap();
        assert_eq!(addrs(&s), ["10.0.0.1:26379", "10.0.0.2:26380", "::1:26381"]);
        assert_eq!(s.master, "cache");
        let node = s.node.redis_settings();
        assert_eq!((node.db(), node.username(), node.password()), (2, Some("app"), Some("p@ss")));
        assert!(!s.tls);
        // The user info is the primary's: the sentinels get none unless given.
        assert!(s.sentinels.iter().all(|i| i.redis_settings().password().is_none()));
        let s = s.with_sentinel_credentials(None, "watch");
        assert!(s.sentinels.iter().all(|i| i.redis_settings().password() == Some("watch")));

        let s = parse_sentinel_url("redis+sentinel://127.0.0.1:26379/mymaster").unwrap();
        assert_eq!((s.node.redis_settings().db(), s.node.redis_settings().password()), (0, None));
        // An IPv6 sentinel may come first.
        let s = parse_sentinel_url("redis+sentinel://:pw@[::1]:26380,[::1]/m").unwrap();
        assert_eq!(addrs(&s), ["::1:26380", "::1:26379"]);
        assert_eq!(s.node.redis_settings().password(), Some("pw"));
    }

    #[test]
    fn bad_sentinel_urls_say_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("redis+sentinel://:hunter2@127.0.0.1:26379", "names no master"),
            ("redis+sentinel://:hunter2@127.0.0.1:26379/", "names no master"),
            ("redis+sentinel://:hunter2@127.0.0.1:26379/m/zero", "not a number"),
            ("redis+sentinel://:hunter2@127.0.0.1:26379,/m", "empty sentinel address"),
            ("redis+sentinel://:hunter2@127.0.0.1:notaport/m", "invalid redis URL"),
            ("redis+sentinel://:hunter2@127.0.0.1:/m", "empty port"),
            ("redis+sentinel://:hunter2@127.0.0.1/m?protocol=resp3", "query"),
        ] {
            let err = parse_sentinel_url(url).err().unwrap().to_string();
            assert!(err.contains(says) && !err.contains("hunter2"), "{url}: {err}");
        }
    }

    #[cfg(not(feature = "redis-tls"))]
    #[test]
    fn tls_sentinels_need_the_tls_feature() {
        let err = parse_sentinel_url("rediss+sentinel://127.0.0.1/m").err().unwrap().to_string();
        assert!(err.contains("redis-tls"), "{err}");
    }
}
