//! The pools a store takes its connection from (deadpool-redis, redis-rs's cluster client,
//! or the sentinels), and the connection itself.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::cluster::ClusterConnection;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{AsyncConnectionConfig, Cmd, RedisResult, Value};
use deadpool_redis::Runtime;

use super::origin::Origin;
use super::sentinel::Watch;

/// The least response timeout of a cluster node connection: redis-rs's own slot-map
/// queries go through them too.
pub(super) const MIN_NODE_RESPONSE: Duration = Duration::from_millis(250);
#[derive(Clone)]
pub(super) enum Pools {
    Single(deadpool_redis::Pool),
    Cluster(deadpool_redis::cluster::Pool),
    /// Cluster URLs: redis-rs's cluster client, with the store's timeouts on every node
    /// connection (deadpool-redis's cluster manager sets none, and a slot-map refresh
    /// that asks a hung node then stalls every request of the connection).
    ClusterClient(Box<deadpool_redis::cluster::ClusterClient>),
    Sentinel(Arc<Watch>),
}

/// The connection timeouts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
}

/// Builds the pool of an origin. Only fails for a bad configuration.
pub(crate) fn build_pool(origin: &Origin, t: Timeouts) -> Result<(), String> {
    make_pools(origin, t).map(drop)
}

pub(super) fn make_pools(origin: &Origin, t: Timeouts) -> Result<Pools, String> {
    // Each pool hands out one connection that the store keeps; the spare slot only
    // matters while a replacement is made.
    const MAX_SIZE: usize = 2;
    match origin {
        Origin::Pool(p) => Ok(Pools::Single(p.clone())),
        Origin::ClusterPool(p) => Ok(Pools::Cluster(p.clone())),
        Origin::Sentinel(s) => Ok(Pools::Sentinel(Watch::new(s.clone()))),
        Origin::Url(info) => {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(t.connect))
                .set_response_timeout(Some(t.response));
            let manager = deadpool_redis::Manager::new_with_config(info.clone(), config).map_err(|e| e.to_string())?;
            deadpool_redis::Pool::builder(manager)
                .max_size(MAX_SIZE)
                .wait_timeout(Some(t.connect))
                .create_timeout(Some(t.connect))
                .recycle_timeout(Some(t.connect))
                .runtime(Runtime::Tokio1)
                .build()
                .map(Pools::Single)
                .map_err(|e| e.to_string())
        }
        Origin::ClusterUrls(infos) => deadpool_redis::cluster::ClusterClientBuilder::new(infos.clone())
            // Half the attempt's time: a new connection may wait for a hung node once.
            .connection_timeout(t.connect / 2)
            .response_timeout(t.response.max(MIN_NODE_RESPONSE))
            .build()
            .map(|client| Pools::ClusterClient(Box::new(client)))
            .map_err(|e| e.to_string()),
    }
}

impl Pools {
    /// One new connection, taken out of the pool for good, and for a sentinel store the
    /// primary's address it was made to. A multiplexed connection gets the store's
    /// response timeout (whatever pool it came from), so that requests on it need no
    /// timer of their own.
    pub(super) async fn connect(&self, timeouts: Timeouts) -> Result<(Conn, Option<String>), String> {
        let t = timeouts.connect;
        let late = || format!("no connection within {t:?}");
        match self {
            Pools::Single(p) => match tokio::time::timeout(t, p.get()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(pool_error(e)),
                Ok(Ok(c)) => {
                    let mut c = deadpool_redis::Connection::take(c);
                    c.set_response_timeout(timeouts.response);
                    Ok((Conn::Single(c), None))
                }
            },
            Pools::Cluster(p) => match tokio::time::timeout(t, p.get()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(pool_error(e)),
                Ok(Ok(c)) => Ok((Conn::Cluster(deadpool_redis::cluster::Connection::take(c)), None)),
            },
            Pools::ClusterClient(client) => match tokio::time::timeout(t, client.get_async_connection()).await {
                Err(_) => Err(late()),
                Ok(Err(e)) => Err(super::security::explain(&e)),
                Ok(Ok(c)) => Ok((Conn::Cluster(c), None)),
            },
            Pools::Sentinel(watch) => {
                match tokio::time::timeout(t, watch.connect(timeouts.connect, timeouts.response)).await {
                    Err(_) => Err(late()),
                    Ok(Err(e)) => Err(e),
                    Ok(Ok((c, addr))) => Ok((Conn::Single(c), Some(addr))),
                }
            }
        }
    }
}

/// Why the pool gave no connection; redis errors (wrong password, untrusted certificate)
/// are worded by [`super::security::explain`].
fn pool_error(e: deadpool_redis::PoolError) -> String {
    match e {
        deadpool_redis::PoolError::Backend(e) => super::security::explain(&e),
        other => other.to_string(),
    }
}

/// A connection, cheap to clone: clones pipeline their requests over one socket (per node).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Whether the connection enforces the store's response timeout itself (a
    /// multiplexed connection does; a cluster connection's timeouts are its pool's).
    pub(crate) fn times_out_itself(&self) -> bool {
        matches!(self, Conn::Single(_))
    }

    pub(crate) async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}
