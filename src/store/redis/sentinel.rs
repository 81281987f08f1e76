//! Redis Sentinel: the `redis+sentinel://` URL, the connections made to the primary the
//! sentinels name (redis-rs's `SentinelClient`: it asks them, and checks that the server
//! answers `ROLE` as a primary), and the watch that follows a switch which left the old
//! connection open.
//!
//! A connection learns of most failovers by itself: the old primary dies (the socket
//! fails), or Sentinel turns it into a replica and closes its clients. Two cases keep an
//! open connection to the wrong server, and the store handles both:
//! - an operator's `REPLICAOF` keeps clients connected, and every write then fails with
//!   `READONLY`: the connection is replaced (see `Link::on_error`);
//! - `SENTINEL FAILOVER` promotes the replica while the old primary stays a writable
//!   primary for seconds more (Sentinel reconfigures it only after about four publish
//!   periods): units counted there would be lost. The watch asks the sentinels every
//!   250 ms which server is the primary and replaces the connection when it is not the
//!   one the connection was made to.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use deadpool_redis::redis::{self, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, TlsMode};

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
    /// The primary's database and credentials (the URL's user info).
    pub(crate) node: redis::RedisConnectionInfo,
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

    /// The client that finds the primary: it asks the sentinels, and checks that the
    /// server they name answers `ROLE` as a primary.
    pub(crate) fn client(&self) -> Result<Connector, String> {
        let mut node = SentinelNodeConnectionInfo::default().set_redis_connection_info(self.node.clone());
        if self.tls {
            node = node.set_tls_mode(TlsMode::Secure);
        }
        SentinelClient::build(self.sentinels.clone(), self.master.clone(), Some(node), SentinelServerType::Master)
            .map(|client| Connector(Arc::new(tokio::sync::Mutex::new(client))))
            .map_err(|e| e.to_string())
    }
}

/// Makes connections to the primary the sentinels name.
#[derive(Clone)]
pub(crate) struct Connector(Arc<tokio::sync::Mutex<SentinelClient>>);

impl Connector {
    /// A connection to the primary, and its address (`host:port`) as the sentinels name it.
    /// `connect` bounds the connection's making, `response` each command on it.
    pub(crate) async fn connect(
        &self,
        connect: Duration,
        response: Duration,
    ) -> Result<(MultiplexedConnection, String), String> {
        let client = self.0.lock().await.async_get_client().await.map_err(|e| super::security::explain(&e))?;
        let addr = client.get_connection_info().addr().to_string();
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(connect)).set_response_timeout(Some(response));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| format!("primary {addr}: {}", super::security::explain(&e)))?;
        Ok((conn, addr))
    }
}

/// Asks the sentinels which server is the primary, over one cached connection to the
/// first sentinel that answers.
pub(crate) struct Watch {
    sentinel: Sentinel,
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl Watch {
    pub(crate) fn new(sentinel: Sentinel) -> Arc<Self> {
        Arc::new(Self { sentinel, conn: Mutex::new(None) })
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn cache(&self, conn: Option<MultiplexedConnection>) {
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = conn;
    }

    /// The primary as the sentinels name it now: `host:port`; `timeout` bounds each
    /// connection and question.
    pub(crate) async fn primary(&self, timeout: Duration) -> Result<String, String> {
        let master = &self.sentinel.master;
        if let Some(mut conn) = self.cached() {
            match ask(&mut conn, master, timeout).await {
                Ok(addr) => return addr.ok_or_else(|| self.unknown()),
                Err(_) => self.cache(None),
            }
        }
        let mut last = String::from("no sentinel given");
        for info in &self.sentinel.sentinels {
            let config =
                AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
            let connected = match redis::Client::open(info.clone()) {
                Ok(client) => client.get_multiplexed_async_connection_with_config(&config).await,
                Err(e) => Err(e),
            };
            let mut conn = match connected {
                Ok(conn) => conn,
                Err(e) => {
                    last = format!("sentinel {}: {}", info.addr(), super::security::explain(&e));
                    continue;
                }
            };
            match ask(&mut conn, master, timeout).await {
                Ok(addr) => {
                    self.cache(Some(conn));
                    return addr.ok_or_else(|| self.unknown());
                }
                Err(e) => last = format!("sentinel {}: {}", info.addr(), super::security::explain(&e)),
            }
        }
        Err(format!("no sentinel of {} answered ({last})", self.sentinel.addrs()))
    }

    fn unknown(&self) -> String {
        format!("the sentinels at {} monitor no master named {:?}", self.sentinel.addrs(), self.sentinel.master)
    }
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME`: `host:port`, or `None` for an unknown name.
async fn ask(conn: &mut MultiplexedConnection, master: &str, timeout: Duration) -> redis::RedisResult<Option<String>> {
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(master);
    let reply: Option<(String, u16)> = match tokio::time::timeout(timeout, cmd.query_async(conn)).await {
        Ok(reply) => reply?,
        Err(_) => return Err(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))),
    };
    Ok(reply.map(|(host, port)| ConnectionAddr::Tcp(host, port).to_string()))
}
