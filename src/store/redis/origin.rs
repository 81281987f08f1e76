//! Where a store's connections come from ([`Origin`]), and the URLs that name it: parsed,
//! checked, and shown without their credentials.

use deadpool_redis::redis::{self, IntoConnectionInfo};

use crate::BuildError;

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
}

impl Origin {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Origin::ClusterUrls(_) | Origin::ClusterPool(_))
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

/// Parses a redis URL, with errors that say what is wrong and never show a password.
pub(crate) fn parse_url(url: &str) -> Result<redis::ConnectionInfo, BuildError> {
    let shown = redact(url);
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "valkey+unix" | "unix") => {}
        Some(other) => {
            return Err(BuildError::InvalidStore(format!(
                "redis URL {shown:?} has the scheme {other:?}: use redis://host:port \
                 (or rediss://, redis+unix://)"
            )))
        }
        None => {
            return Err(BuildError::InvalidStore(format!(
                "{shown:?} is not a redis URL: expected redis://[user:password@]host[:port][/db]"
            )))
        }
    }
    check_url(scheme.as_deref().unwrap_or_default(), url, &shown).map_err(BuildError::InvalidStore)?;
    url.into_connection_info().map_err(|e| {
        BuildError::InvalidStore(format!(
            "invalid redis URL {shown:?}: {e} (expected redis://[user:password@]host[:port][/db])"
        ))
    })
}

/// `rediss://` needs the `redis-tls` feature; `#insecure` (no certificate check) is refused.
fn check_url(scheme: &str, url: &str, shown: &str) -> Result<(), String> {
    let tls = matches!(scheme, "rediss" | "valkeys");
    if tls && !cfg!(feature = "redis-tls") {
        return Err(format!(
            "redis URL {shown:?} asks for TLS ({scheme}://), which needs the `redis-tls` feature of tollgate"
        ));
    }
    if tls && url.contains('#') {
        return Err(format!(
            "redis URL {shown:?} has a #fragment: tollgate always checks the server's certificate \
             (no #insecure); for a private CA use RedisStore::tls_root_certificates"
        ));
    }
    Ok(())
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
}
