//! Credentials and TLS (`rediss://`): which roots a connection trusts, the rustls crypto
//! provider, and authentication and certificate errors worded so that a user knows what
//! to fix.

use deadpool_redis::redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError};

pub(super) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// `info` with the CA certificates of `pem` as its only trust anchors.
#[cfg(feature = "redis-tls")]
pub(super) fn with_root_certificates(info: &ConnectionInfo, pem: &[u8]) -> Result<ConnectionInfo, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    if !is_tls(info) {
        return Err(format!(
            "root certificates were given for redis at {}, which is not a rediss:// (TLS) URL",
            info.addr()
        ));
    }
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| format!("the redis root certificates are not valid PEM: {e}"))?;
        count += 1;
    }
    if count == 0 {
        return Err("the redis root certificates hold no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    let certs = deadpool_redis::redis::TlsCertificates { client_tls: None, root_cert: Some(pem.to_vec()) };
    deadpool_redis::redis::Client::build_with_tls(info.clone(), certs)
        .map(|client| client.get_connection_info().clone())
        .map_err(|e| format!("unusable redis root certificates: {e}"))
}

/// Before the first TLS connection (`tls`: the store uses TLS): rustls needs a
/// process-wide crypto provider. When the application installed none, rustls picks the
/// one its enabled features name (ring, from this crate) and panics if both ring and
/// aws-lc-rs are enabled; installing ring here instead is the same choice, without the
/// panic.
pub(super) fn ensure_crypto_provider(tls: bool) {
    #[cfg(feature = "redis-tls")]
    if tls && rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one in between, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    #[cfg(not(feature = "redis-tls"))]
    let _ = tls;
}

/// A redis error, said so that the user knows what to fix when it is about credentials,
/// ACL permissions or certificates. Never holds the password: redis-rs puts none in its
/// errors, and the URL is not part of them.
pub(super) fn explain(e: &RedisError) -> String {
    let text = e.to_string();
    let hint = if e.kind() == ErrorKind::AuthenticationFailed || e.code() == Some("WRONGPASS") {
        "authentication failed: the server refused the user name or password of the URL"
    } else if e.code() == Some("NOAUTH") {
        "the server requires a password: put it in the URL (redis://:PASSWORD@host, or \
         redis://USER:PASSWORD@host for an ACL user)"
    } else if e.code() == Some("NOPERM") {
        "the ACL user may not run a command or touch a key tollgate needs (see the ACL in \
         tollgate's Managed Redis docs)"
    } else if text.contains("certificate") || text.contains("UnknownIssuer") || text.contains("NotValidForName") {
        "TLS: the server's certificate is not trusted or does not name the URL's host; for a \
         private CA use RedisStore::tls_root_certificates"
    } else {
        return text;
    };
    format!("{hint} ({text})")
}
