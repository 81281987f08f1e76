//! The pools a store takes its connection from (deadpool-redis, redis-rs's cluster client,
//! or the sentinels), and the connection itself.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::cluster::ClusterConnection;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{AsyncConnectionConfig, Cmd, RedisResult, Value};
use deadpool_redis::Runtime;

use super::origin::Origin;
use super::security::explain;
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

#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
}

/// The pools of `origin`: fails only for a bad configuration.
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
    /// primary's address. A multiplexed connection gets the store's response timeout
    /// (whatever pool it came from): requests on it need no timer of their own.
    pub(super) async fn connect(&self, timeouts: Timeouts) -> Result<(Conn, Option<String>), String> {
        let t = timeouts.connect;
        let conn = async {
            match self {
                Pools::Single(p) => {
                    let mut c = deadpool_redis::Connection::take(p.get().await.map_err(pool_error)?);
                    c.set_response_timeout(timeouts.response);
                    Ok((Conn::Single(c), None))
                }
                Pools::Cluster(p) => Ok((
                    Conn::Cluster(deadpool_redis::cluster::Connection::take(p.get().await.map_err(pool_error)?)),
                    None,
                )),
                Pools::ClusterClient(client) => {
                    Ok((Conn::Cluster(client.get_async_connection().await.map_err(|e| explain(&e))?), None))
                }
                Pools::Sentinel(watch) => {
                    let (c, addr) = watch.connect(timeouts.connect, timeouts.response).await?;
                    Ok((Conn::Single(c), Some(addr)))
                }
            }
        };
        tokio::time::timeout(t, conn).await.unwrap_or_else(|_| Err(format!("no connection within {t:?}")))
    }
}

/// Why the pool gave no connection; redis errors (wrong password, untrusted certificate)
/// are worded by [`explain`].
fn pool_error(e: deadpool_redis::PoolError) -> String {
    match e {
        deadpool_redis::PoolError::Backend(e) => explain(&e),
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
    pub(crate) async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}
