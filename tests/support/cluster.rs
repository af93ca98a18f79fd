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
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
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
            .args(["--cluster-replicas", "0", "--cluster-yes"])
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

    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self.nodes.iter().all(|node| {
                let info = node.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
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
