//! Redis Sentinel: what a `redis+sentinel://` URL names, the question to the sentinels
//! (all at once, each bounded: one that hangs or lags costs only its vote), the
//! connection to the primary they name (checked with `ROLE`), and the watch that follows
//! a switch which left the old connection open.
//!
//! redis-rs's `SentinelClient` asks the sentinels in order and waits for each answer in
//! turn with its own timeouts, so a hung sentinel first in the list stalls every
//! connection attempt; and it trusts the first answer. Hence the few lines here.
//!
//! A connection learns of most failovers by itself: the old primary dies (the socket
//! fails), or Sentinel turns it into a replica and closes its clients. Two cases keep an
//! open connection to the wrong server, and the store handles both:
//! - an operator's `REPLICAOF` keeps clients connected, and every write then fails with
//!   `READONLY`: the connection is replaced (see `Link::on_error`);
//! - `SENTINEL FAILOVER` promotes the replica while the old primary stays a writable
//!   primary for seconds more (Sentinel reconfigures it only after about four publish
//!   periods): units counted there would be lost. The watch asks the sentinels every
//!   250 ms which server is the primary and replaces the connection when a majority of
//!   them name another one than the connection was made to.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo};

use super::security::explain;

/// How often the watch asks the sentinels which server is the primary. Once a failover
/// has promoted the replica, the sentinels name it (`SENTINEL GET-MASTER-ADDR-BY-NAME`)
/// while the old primary may still accept writes: what the store writes there in between
/// is lost, so the watch asks often (a sentinel answers such a question in microseconds).
pub(crate) const POLL: Duration = Duration::from_millis(250);
/// The longest pause between two connection attempts of a sentinel store: each costs a
/// question to a sentinel and a refused or checked connection.
pub(crate) const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

/// What a `redis+sentinel://` URL names.
#[derive(Clone)]
pub(crate) struct Sentinel {
    /// The sentinels, with the credentials for the sentinels themselves.
    pub(crate) sentinels: Vec<ConnectionInfo>,
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> …`).
    pub(crate) master: String,
    /// The primary's settings: database, credentials (the URL's user info), TLS; on a
    /// placeholder address that each connection replaces with the one the sentinels name.
    pub(crate) node: ConnectionInfo,
    /// TLS to the sentinels and to the primary (`rediss+sentinel://`).
    pub(crate) tls: bool,
}

impl Sentinel {
    /// The sentinels' addresses, for messages.
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

    /// The primary's connection settings at `host:port`.
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
    /// `host:port`.
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

    /// Sentinel `i`'s answer within `timeout` in all: the primary's address, or `None` for
    /// a name it does not monitor. A cached connection that fails is replaced by a fresh
    /// one at once (a restarted sentinel keeps its vote).
    async fn ask_one(&self, i: usize, timeout: Duration) -> Result<Option<(String, u16)>, String> {
        let info = &self.sentinel.sentinels[i];
        let asked = async {
            let mut last = String::new();
            for cached in [self.cached(i), None] {
                let fresh = cached.is_none();
                let mut conn = match cached {
                    Some(conn) => conn,
                    None => {
                        let config = AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(timeout))
                            .set_response_timeout(Some(timeout));
                        let client = redis::Client::open(info.clone()).map_err(|e| e.to_string())?;
                        client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| explain(&e))?
                    }
                };
                let mut cmd = redis::cmd("SENTINEL");
                cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.sentinel.master);
                match cmd.query_async::<Option<(String, u16)>>(&mut conn).await {
                    Ok(reply) => {
                        self.cache(i, Some(conn));
                        return Ok(reply);
                    }
                    Err(e) => {
                        self.cache(i, None);
                        last = explain(&e);
                        if fresh {
                            break;
                        }
                    }
                }
            }
            Err(last)
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(answer) => answer.map_err(|e| format!("sentinel {}: {e}", info.addr())),
            Err(_) => {
                self.cache(i, None);
                Err(format!("sentinel {}: no answer within {timeout:?}", info.addr()))
            }
        }
    }

    /// Asks every sentinel at once: every address named, most votes first (between equal
    /// votes, the one named by the sentinel first in the URL).
    async fn candidates(&self, timeout: Duration) -> Result<Vec<Named>, String> {
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

    /// The address most sentinels name, if one has more votes than any other.
    pub(crate) async fn primary(&self, timeout: Duration) -> Result<Named, String> {
        let mut named = self.candidates(timeout).await?;
        match named.as_slice() {
            [first, second, ..] if first.votes == second.votes => Err(format!(
                "the sentinels disagree on the primary ({} and {}, {} votes each)",
                first.addr(),
                second.addr(),
                first.votes
            )),
            _ => Ok(named.swap_remove(0)),
        }
    }

    /// Whether a majority of the URL's sentinels named `named`: only then does the watch
    /// move a working connection (a sentinel that lags or is cut off from the others may
    /// still name an old primary).
    pub(crate) fn is_majority(&self, named: &Named) -> bool {
        named.votes > self.sentinel.sentinels.len() / 2
    }

    /// A connection to the primary the sentinels name, checked to answer `ROLE` as a
    /// primary, and its address. When addresses tie for the most votes (a sentinel lags or
    /// is cut off), each is asked, and the one primary among them is taken; two primaries
    /// are no answer. `connect` bounds the connection's making (the sentinels get a quarter
    /// of it to answer), `response` each command on it.
    pub(crate) async fn connect(
        &self,
        connect: Duration,
        response: Duration,
    ) -> Result<(MultiplexedConnection, String), String> {
        let named = self.candidates(question_timeout(connect)).await?;
        let top = named[0].votes;
        let tied: Vec<&Named> = named.iter().take_while(|c| c.votes == top).collect();
        let tries = futures_util::future::join_all(tied.iter().map(|c| self.connect_to(c, connect, response))).await;
        let mut primaries = Vec::new();
        let mut last_error = String::new();
        for t in tries {
            match t {
                Ok(found) => primaries.push(found),
                Err(e) => last_error = e,
            }
        }
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
            redis::Value::Array(items) if items.first().is_some_and(|r| is_text(r, "master")) => Ok((conn, addr)),
            other => Err(format!("{addr}, named by the sentinels, is not a primary (ROLE: {other:?})")),
        }
    }
}

/// How long each sentinel has to answer a question, out of a connection attempt's
/// `connect`: a quarter, so that a sentinel that hangs leaves time for the connection.
pub(crate) fn question_timeout(connect: Duration) -> Duration {
    connect / 4
}

fn is_text(v: &redis::Value, text: &str) -> bool {
    match v {
        redis::Value::BulkString(b) => b == text.as_bytes(),
        redis::Value::SimpleString(s) => s == text,
        _ => false,
    }
}

/// What [`watch_loop`] follows: a store's connection (`conn::Link`), so that this file
/// needs nothing of it.
pub(crate) trait Follower: Send + Sync + 'static {
    /// The connection's generation and the primary it was made to, while there is one;
    /// and the connect timeout.
    fn in_use(&self) -> (Option<(u64, String)>, Duration);
    /// Replaces connection `generation`, for `why`.
    fn moved(self: &Arc<Self>, generation: u64, why: String);
}

/// Sentinel stores: asks the sentinels every [`POLL`] which server is the primary, and
/// replaces a connection made to another one (after `SENTINEL FAILOVER` the old primary
/// stays writable for seconds, with its clients connected). Ends with the store; `_guard`
/// goes with it.
pub(crate) async fn watch_loop<F: Follower>(link: Weak<F>, watch: Arc<Watch>, _guard: impl Send) {
    loop {
        tokio::time::sleep(POLL).await;
        let Some(strong) = link.upgrade() else { return };
        let (current, connect) = strong.in_use();
        drop(strong);
        // Without a connection, the connection task asks the sentinels itself.
        let Some((generation, primary)) = current else { continue };
        let Ok(named) = watch.primary(question_timeout(connect)).await else { continue };
        // A majority, or a lagging or cut-off sentinel could move the store back and forth.
        if named.addr() != primary && watch.is_majority(&named) {
            let Some(strong) = link.upgrade() else { return };
            strong.moved(generation, format!("the sentinels now name {} as the primary, not {primary}", named.addr()));
        }
    }
}
