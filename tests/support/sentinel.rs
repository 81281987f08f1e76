//! Redis Sentinel on loopback: one primary, one replica and three sentinels, each a
//! `redis-server` process of its own (see [`super::redis`]), killed with their handles.

use std::thread;
use std::time::{Duration, Instant};

use super::redis::RedisServer;

/// The name the sentinels monitor the primary under.
pub const MASTER: &str = "mymaster";
/// `down-after-milliseconds`: how long the primary may not answer before a sentinel
/// thinks it down.
pub const DOWN_AFTER_MS: u64 = 1000;
/// The sentinels' `INFO` period, set by `SENTINEL DEBUG` (default 10 s). A primary that
/// reports itself a replica (an operator's `REPLICAOF`) is thought down only after
/// down-after + 2 × this.
pub const INFO_PERIOD_MS: u64 = 500;
/// How long a set-up step may take.
const SETUP: Duration = Duration::from_secs(30);

/// A primary and a replica (in `nodes`, the primary first until a failover), and three
/// sentinels that watch them.
pub struct SentinelGroup {
    pub nodes: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
    password: Option<String>,
    sentinel_password: Option<String>,
}

impl SentinelGroup {
    /// Starts the group; returns once the replica is in sync and every sentinel knows
    /// the replica and the two other sentinels. `password` protects the data nodes,
    /// `sentinel_password` the sentinels.
    pub fn start(password: Option<&str>, sentinel_password: Option<&str>) -> SentinelGroup {
        Self::start_with(password, sentinel_password, &[])
    }

    /// Like [`SentinelGroup::start`], with extra arguments for both data nodes (ACL
    /// users, say).
    pub fn start_with(password: Option<&str>, sentinel_password: Option<&str>, node_args: &[&str]) -> SentinelGroup {
        let node = |extra: &[&str]| {
            let mut b =
                RedisServer::builder().args(&["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]);
            if let Some(pw) = password {
                b = b.with_password(pw).args(&["--masterauth", pw]);
            }
            b.args(node_args).args(extra).start()
        };
        let primary = node(&[]);
        let primary_port = primary.port().to_string();
        let replica = node(&["--replicaof", "127.0.0.1", &primary_port]);
        let mut conf = format!(
            "sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER} 10000\n"
        );
        if let Some(pw) = password {
            conf.push_str(&format!("sentinel auth-pass {MASTER} {pw}\n"));
        }
        if let Some(pw) = sentinel_password {
            conf.push_str(&format!("requirepass {pw}\n"));
            // The sentinels talk to each other with it too.
            conf.push_str(&format!("sentinel sentinel-pass {pw}\n"));
        }
        let sentinels = (0..3).map(|_| RedisServer::builder().sentinel(&conf).start()).collect();
        let group = SentinelGroup {
            nodes: vec![primary, replica],
            sentinels,
            password: password.map(str::to_owned),
            sentinel_password: sentinel_password.map(str::to_owned),
        };
        for s in 0..3 {
            group.sentinel_cmd(s, &["SENTINEL", "DEBUG", "INFO-PERIOD", &INFO_PERIOD_MS.to_string()]);
        }
        group.wait_ready();
        group
    }

    /// `redis+sentinel://[:password@]127.0.0.1:P1,…/mymaster`.
    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.sentinels.iter().map(RedisServer::port).collect();
        url(self.password.as_deref(), &ports)
    }

    /// Runs `redis-cli` on sentinel `i`.
    pub fn sentinel_cmd(&self, i: usize, args: &[&str]) -> String {
        match &self.sentinel_password {
            Some(pw) => self.sentinels[i].cmd_with_password(pw, args),
            None => self.sentinels[i].cmd(args),
        }
    }

    /// The primary's port as sentinel `i` names it.
    pub fn named_primary(&self, i: usize) -> Option<u16> {
        let reply = self.sentinel_cmd(i, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
        reply.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// The node listening on `port`.
    pub fn node_at(&mut self, port: u16) -> &mut RedisServer {
        self.nodes.iter_mut().find(|n| n.port() == port).expect("a node of the group")
    }

    /// The node that is not on `port`.
    pub fn other_than(&self, port: u16) -> &RedisServer {
        self.nodes.iter().find(|n| n.port() != port).expect("two nodes")
    }

    /// Waits until the replica reports `master_link_status:up` and every sentinel sees
    /// one replica and two other sentinels, and names the same primary.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + SETUP;
        loop {
            match self.problem() {
                None => return,
                Some(problem) if Instant::now() > deadline => panic!("sentinel group not ready: {problem}"),
                Some(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn problem(&self) -> Option<String> {
        let named = self.named_primary(0)?;
        for s in 0..3 {
            if self.named_primary(s) != Some(named) {
                return Some(format!("sentinel {s} names {:?}, sentinel 0 {named}", self.named_primary(s)));
            }
            let master = self.sentinel_cmd(s, &["SENTINEL", "MASTER", MASTER]);
            let field = |name: &str| {
                let lines: Vec<&str> = master.lines().map(str::trim).collect();
                lines.iter().position(|l| *l == name).and_then(|i| lines.get(i + 1).map(|v| v.to_string()))
            };
            if field("num-slaves").as_deref() != Some("1") || field("num-other-sentinels").as_deref() != Some("2") {
                return Some(format!("sentinel {s}: {master}"));
            }
            if field("flags").as_deref() != Some("master") {
                return Some(format!("sentinel {s} flags the primary {:?}", field("flags")));
            }
        }
        for node in self.nodes.iter().filter(|n| n.port() != named) {
            let info = node.cmd(&["INFO", "replication"]);
            if !info.contains("master_link_status:up") || !info.contains(&format!("master_port:{named}")) {
                return Some(format!("replica {} not in sync with {named}: {info}", node.port()));
            }
        }
        None
    }
}

/// `redis+sentinel://[:password@]127.0.0.1:P1,…/mymaster`, the sentinels in `ports`' order.
pub fn url(password: Option<&str>, ports: &[u16]) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let auth = password.map(|pw| format!(":{pw}@")).unwrap_or_default();
    format!("redis+sentinel://{auth}{}/{MASTER}", hosts.join(","))
}
