//! A Redis Cluster of the test's own: redis-server nodes on free loopback
//! ports (each with its cluster bus port, the port + 10000, free too),
//! joined by `redis-cli --cluster create`, stopped when dropped.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::redis::{leftover, RedisServer};
use super::wait_until;
use super::world::{TestStore, World, PROMPT};

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    /// The node `consem` is pointed at.
    pub pointed: usize,
}

/// A port free now whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisCluster {
    /// `primaries` primaries, each with `replicas` replicas, every slot
    /// covered, each node agreeing that the cluster is up.
    pub fn start(dir: &Path, primaries: usize, replicas: usize) -> RedisCluster {
        let count = primaries * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count)
            .map(|i| loop {
                let port = free_cluster_port();
                let conf = dir.join(format!("nodes-{port}.conf"));
                let started = RedisServer::try_start_on_port(
                    port,
                    &dir.join(format!("node-{i}")),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        conf.to_str().unwrap(),
                        "--cluster-node-timeout",
                        "2000",
                    ],
                );
                // A port (or its bus port) taken meanwhile: another.
                if let Some(node) = started {
                    break node;
                }
            })
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli is not installed: scripts/test installs it (apt-get install redis-server)");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = RedisCluster { nodes, pointed: 0 };
        wait_until(PROMPT * 3, "every node to see the cluster up", || {
            cluster.nodes.iter().all(|node| {
                node.query::<String>(redis::cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            }) && cluster.primary_count() == primaries
        });
        // A replica that has not synced yet cannot take over.
        wait_until(PROMPT * 3, "every replica to sync with its primary", || {
            cluster.nodes.iter().all(|node| {
                node.query::<String>(redis::cmd("INFO").arg("replication"))
                    .is_ok_and(|info| {
                        info.contains("role:master") || info.contains("master_link_status:up")
                    })
            })
        });
        cluster
    }

    fn primary_count(&self) -> usize {
        (0..self.nodes.len())
            .filter(|&i| self.is_primary(i))
            .count()
    }

    /// Whether node `i` is a primary now (`ROLE` says `master`).
    pub fn is_primary(&self, i: usize) -> bool {
        matches!(
            self.nodes[i].query::<redis::Value>(&mut redis::cmd("ROLE")),
            Ok(redis::Value::Array(items))
                if matches!(items.first(), Some(redis::Value::BulkString(b)) if b == b"master")
        )
    }

    /// A replica of node `primary`, if it has one.
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        let port = i64::from(self.nodes[primary].port);
        (0..self.nodes.len()).find(|&i| {
            matches!(
                self.nodes[i].query::<redis::Value>(&mut redis::cmd("ROLE")),
                Ok(redis::Value::Array(items))
                    if matches!(items.first(), Some(redis::Value::BulkString(b)) if b == b"slave")
                        && matches!(items.get(2), Some(redis::Value::Int(p)) if *p == port)
            )
        })
    }

    /// The node that serves `key`'s slot as a primary now.
    pub fn primary_of(&self, key: &str) -> usize {
        let slot: i64 = self.nodes[0]
            .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .unwrap();
        (0..self.nodes.len())
            .find(|&i| self.is_primary(i) && self.serves_slot(i, slot))
            .expect("a primary serves every slot of a cluster that is up")
    }

    fn serves_slot(&self, i: usize, slot: i64) -> bool {
        let slots: Vec<redis::Value> = self.nodes[i]
            .query(redis::cmd("CLUSTER").arg("SLOTS"))
            .unwrap();
        let port = i64::from(self.nodes[i].port);
        slots.iter().any(|range| {
            let redis::Value::Array(items) = range else {
                return false;
            };
            let number = |v: Option<&redis::Value>| match v {
                Some(redis::Value::Int(n)) => *n,
                _ => -1,
            };
            let owner = match items.get(2) {
                Some(redis::Value::Array(node)) => number(node.get(1)),
                _ => -1,
            };
            number(items.first()) <= slot && slot <= number(items.get(1)) && owner == port
        })
    }

    /// `redis://` URL of node `i` alone.
    pub fn url_of(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// The semaphore's keys of `prefix` on every node that serves as a
    /// primary (a braced prefix puts them all on one).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let mut keys: Vec<String> = (0..self.nodes.len())
            .filter(|&i| self.is_primary(i))
            .flat_map(|i| self.nodes[i].keys(prefix))
            .collect();
        keys.sort();
        keys
    }
}

impl TestStore for RedisCluster {
    const NAME: &'static str = "redis";
    const HAS_LEASE: bool = true;

    fn point(&self, command: &mut Command) {
        command.arg(format!("--store={}", self.url_of(self.pointed)));
    }

    fn contenders(&self, prefix: &str) -> usize {
        let i = self.primary_of(&format!("semaphore:{prefix}"));
        self.nodes[i].contenders(prefix)
    }

    fn assert_clean(&self, prefix: &str) {
        let keys = self.keys(prefix);
        let left = leftover(&keys);
        assert!(left.is_empty(), "keys left on the cluster: {left:?}");
    }
}

impl World<RedisCluster> {
    /// A world on a cluster of three primaries of its own, its prefix in
    /// braces, consem pointed at a node that does not serve the prefix's
    /// slot: every command is redirected before it is served.
    pub fn redis_cluster(name: &str) -> World<RedisCluster> {
        let mut world =
            World::with_store(name, |dir| RedisCluster::start(&dir.join("cluster"), 3, 0));
        world.prefix = format!("{{{}}}", world.prefix);
        let owner = world
            .store
            .primary_of(&format!("semaphore:{}", world.prefix));
        world.store.pointed = (owner + 1) % world.store.nodes.len();
        world
    }
}

/// How long a failover may take on loopback with a node timeout of 2 s.
pub const FAILOVER: Duration = Duration::from_secs(30);
