//! Redis Sentinel: what a `redis+sentinel://` URL names, the question to the sentinels
//! (all at once, each bounded: one that hangs or lags costs only its vote), the
//! connection to the primary they name (checked with `ROLE`), and the watch that follows
//! a switch which left the old connection open.
//!
//! redis-rs's `SentinelClient` asks the sentinels in order and waits for each answer in
//! turn with its own timeouts, so a hung sentinel first in the list stalls every
//! connection attempt; and it trusts the first answer. Hence the few lines here. How a
//! failover is followed: docs/redis-store.md, "Redis Sentinel" (`READONLY`:
//! `Link::on_error`; a writable old primary: `conn::watch_loop`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo};

use super::security::explain;

/// How often the watch asks the sentinels which server is the primary: what the store
/// writes to an old primary still writable after a failover is lost, and a sentinel
/// answers in microseconds.
pub(crate) const POLL: Duration = Duration::from_millis(250);
/// The longest pause between two connection attempts of a sentinel store (each is cheap).
pub(crate) const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

/// What a `redis+sentinel://` URL names.
#[derive(Clone)]
pub(crate) struct Sentinel {
    pub(crate) sentinels: Vec<ConnectionInfo>,
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> …`).
    pub(crate) master: String,
    /// The primary's settings (database, credentials, TLS) on a placeholder address.
    pub(crate) node: ConnectionInfo,
    pub(crate) tls: bool,
}

impl Sentinel {
    pub(crate) fn addrs(&self) -> String {
        self.sentinels.iter().map(|i| i.addr().to_string()).collect::<Vec<_>>().join(",")
    }

    /// The same, with the sentinels themselves asking for `username` and `password`.
    pub(crate) fn with_sentinel_credentials(mut self, username: Option<&str>, password: &str) -> Self {
        for info in &mut self.sentinels {
            let mut settings = info.redis_settings().clone().set_password(password);
            if let Some(user) = username {
                settings = settings.set_username(user);
            }
            *info = info.clone().set_redis_settings(settings);
        }
        self
    }

    fn at(&self, host: &str, port: u16) -> ConnectionInfo {
        let addr = match self.node.addr().clone() {
            ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
                ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure, tls_params }
            }
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        self.node.clone().set_addr(addr)
    }
}

/// A primary as the sentinels name it, with how many of them did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    host: String,
    port: u16,
    votes: usize,
}

impl Named {
    pub(crate) fn addr(&self) -> String {
        ConnectionAddr::Tcp(self.host.clone(), self.port).to_string()
    }
}

/// Asks the sentinels which server is the primary, each over a cached connection.
pub(crate) struct Watch {
    sentinel: Sentinel,
    conns: Mutex<Vec<Option<MultiplexedConnection>>>,
}

impl Watch {
    pub(crate) fn new(sentinel: Sentinel) -> Arc<Self> {
        let n = sentinel.sentinels.len();
        Arc::new(Self { sentinel, conns: Mutex::new(vec![None; n]) })
    }

    fn cached(&self, i: usize) -> Option<MultiplexedConnection> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)[i].clone()
    }

    fn cache(&self, i: usize, conn: Option<MultiplexedConnection>) {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)[i] = conn;
    }

    /// Sentinel `i`'s answer within `timeout` in all (`None`: it does not monitor the name);
    /// a cached connection that fails is replaced at once (a restarted sentinel keeps its vote).
    async fn ask_one(&self, i: usize, timeout: Duration) -> Result<Option<(String, u16)>, String> {
        let info = &self.sentinel.sentinels[i];
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.sentinel.master);
        let asked = async {
            if let Some(mut conn) = self.cached(i) {
                if let Ok(reply) = cmd.query_async(&mut conn).await {
                    return Ok(reply);
                }
            }
            let config =
                AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
            let client = redis::Client::open(info.clone()).map_err(|e| e.to_string())?;
            let mut conn =
                client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| explain(&e))?;
            let reply = cmd.query_async(&mut conn).await.map_err(|e| explain(&e))?;
            self.cache(i, Some(conn));
            Ok(reply)
        };
        let answer = tokio::time::timeout(timeout, asked).await;
        let answer = answer.unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")));
        if answer.is_err() {
            self.cache(i, None);
        }
        answer.map_err(|e| format!("sentinel {}: {e}", info.addr()))
    }

    /// Asks every sentinel at once: every address named (at least one), most votes first
    /// (between equal votes, the one named by the sentinel first in the URL).
    pub(crate) async fn candidates(&self, timeout: Duration) -> Result<Vec<Named>, String> {
        let n = self.sentinel.sentinels.len();
        let answers = futures_util::future::join_all((0..n).map(|i| self.ask_one(i, timeout))).await;
        let mut named: Vec<Named> = Vec::new();
        let (mut unknown, mut last_error) = (0, None);
        for answer in answers {
            match answer {
                Ok(Some((host, port))) => match named.iter_mut().find(|c| c.host == host && c.port == port) {
                    Some(c) => c.votes += 1,
                    None => named.push(Named { host, port, votes: 1 }),
                },
                Ok(None) => unknown += 1,
                Err(e) => last_error = Some(e),
            }
        }
        // Stable: between equal votes the first named stays first.
        named.sort_by_key(|c| std::cmp::Reverse(c.votes));
        if !named.is_empty() {
            Ok(named)
        } else if unknown > 0 {
            Err(format!(
                "the sentinels at {} monitor no master named {:?}",
                self.sentinel.addrs(),
                self.sentinel.master
            ))
        } else {
            Err(format!(
                "no sentinel of {} answered ({})",
                self.sentinel.addrs(),
                last_error.unwrap_or_else(|| "none given".into())
            ))
        }
    }

    /// Whether a majority of the URL's sentinels named `named`.
    pub(crate) fn is_majority(&self, named: &Named) -> bool {
        named.votes > self.sentinel.sentinels.len() / 2
    }

    /// A connection to the primary the sentinels name, and its address: of the addresses
    /// tied for the most votes, the one that answers `ROLE` as a primary (two are no
    /// answer). `connect` bounds the connection's making, `response` each command on it.
    pub(crate) async fn connect(
        &self,
        connect: Duration,
        response: Duration,
    ) -> Result<(MultiplexedConnection, String), String> {
        let named = self.candidates(question_timeout(connect)).await?;
        let top = named[0].votes;
        let tied: Vec<&Named> = named.iter().take_while(|c| c.votes == top).collect();
        let tries = futures_util::future::join_all(tied.iter().map(|c| self.connect_to(c, connect, response))).await;
        let mut last_error = String::new();
        let mut primaries: Vec<_> = tries.into_iter().filter_map(|t| t.map_err(|e| last_error = e).ok()).collect();
        match primaries.len() {
            1 => Ok(primaries.remove(0)),
            0 => Err(last_error),
            _ => Err(format!(
                "the sentinels disagree, and {} servers they name answer as primaries: asking again",
                primaries.len()
            )),
        }
    }

    /// A connection to `named`, if it answers `ROLE` as a primary.
    async fn connect_to(
        &self,
        named: &Named,
        connect: Duration,
        response: Duration,
    ) -> Result<(MultiplexedConnection, String), String> {
        let addr = named.addr();
        let said = |e: &redis::RedisError| format!("primary {addr}: {}", explain(e));
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(connect)).set_response_timeout(Some(response));
        let client = redis::Client::open(self.sentinel.at(&named.host, named.port)).map_err(|e| said(&e))?;
        let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| said(&e))?;
        let role: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await.map_err(|e| said(&e))?;
        match role {
            redis::Value::Array(items)
                if items
                    .first()
                    .is_some_and(|r| redis::from_redis_value_ref::<String>(r).is_ok_and(|r| r == "master")) =>
            {
                Ok((conn, addr))
            }
            other => Err(format!("{addr}, named by the sentinels, is not a primary (ROLE: {other:?})")),
        }
    }
}

/// How long each sentinel has to answer, out of a connection attempt's `connect`: a
/// sentinel that hangs leaves time for the connection.
pub(crate) fn question_timeout(connect: Duration) -> Duration {
    connect / 4
}
