//! A throwaway Redis Cluster: cluster-enabled servers on free loopback ports, joined
//! with `redis-cli --cluster create`, killed on drop.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::RedisServer;

/// A cluster of masters without replicas.
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` (at least 3) cluster-enabled servers and assigns them all slots.
    pub fn start(masters: usize) -> Self {
        Self::start_with_replicas(masters, 0)
    }

    /// Starts `masters` masters with `replicas` replicas each (the first `masters` nodes
    /// are the masters, as `redis-cli --cluster create` assigns them).
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    // Replicas sync at once instead of after the default 5 s delay.
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok();
        cluster
    }

    /// The seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node that serves `key`'s slot as a master now.
    pub fn master_of(&self, key: &str) -> Option<usize> {
        let live = self.nodes.iter().find(|node| node.pid().is_some())?;
        let slot: u64 = live.cli(&["CLUSTER", "KEYSLOT", key]).parse().ok()?;
        self.nodes
            .iter()
            .position(|node| node.pid().is_some() && serves_slot(node, slot))
    }

    /// Waits until the other nodes have marked `dead` as failed, a replica has taken its
    /// slots, and every live node reports `cluster_state:ok` again.
    pub fn wait_until_failed_over(&self, dead: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        let dead_address = format!("127.0.0.1:{}", self.nodes[dead].port());
        loop {
            let live: Vec<&RedisServer> = self
                .nodes
                .iter()
                .filter(|node| node.pid().is_some())
                .collect();
            let ready = live.iter().all(|node| {
                let nodes = node.cli(&["CLUSTER", "NODES"]);
                let dead_marked = nodes.lines().any(|line| {
                    line.contains(&dead_address) && line.contains("fail") && !line.contains("fail?")
                });
                dead_marked && node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not fail over");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self.nodes.iter().all(|node| {
                let info = node.cli(&["CLUSTER", "INFO"]);
                let replication = node.cli(&["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Whether `node`'s own line in `CLUSTER NODES` ("<id> <addr> <flags> … <slot ranges>")
/// says it is a master serving `slot`.
fn serves_slot(node: &RedisServer, slot: u64) -> bool {
    node.cli(&["CLUSTER", "NODES"]).lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields
            .get(2)
            .is_some_and(|flags| flags.contains("myself") && flags.contains("master"))
            && fields.iter().skip(8).any(|range| {
                let mut bounds = range.split('-').filter_map(|b| b.parse::<u64>().ok());
                match (bounds.next(), bounds.next()) {
                    (Some(low), Some(high)) => (low..=high).contains(&slot),
                    (Some(only), None) => only == slot,
                    _ => false,
                }
            })
    })
}
