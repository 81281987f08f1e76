//! Every server sharing one Redis: standalone, Sentinel failover, a 3-node Cluster, batching,
//! ACLs, faults (kills and stalls), and the features that only show across servers. The
//! tests start their own `redis-server` processes on free loopback ports.

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod batch;
mod cluster;
mod cluster_stall;
mod concurrency;
mod concurrency_load;
mod concurrency_model;
mod degradation;
mod failover;
mod fallback_counts;
mod fallback_rejections;
mod fallback_shares;
mod faults;
mod features;
mod local_cache;
mod multi_batch;
mod review;
mod servers;
mod shared_limit;
mod slices;
mod store;
mod swaps;
