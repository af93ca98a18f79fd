//! A throwaway Redis Cluster: cluster-enabled servers on free loopback ports, joined
//! with `redis-cli --cluster create` (the [`crate::redis_cli_binary`]), killed on drop.

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
        let output = Command::new(crate::redis_cli_binary())
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

    /// The cluster node id of node `node` (`CLUSTER MYID`).
    pub fn node_id(&self, node: usize) -> String {
        self.nodes[node].cli(&["CLUSTER", "MYID"])
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let live = self
            .nodes
            .iter()
            .find(|node| node.pid().is_some())
            .expect("a live node");
        live.cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("CLUSTER KEYSLOT answers a number")
    }

    /// The keys of `slot` stored on node `node` (`CLUSTER GETKEYSINSLOT`, up to 1000).
    pub fn keys_in_slot(&self, node: usize, slot: u16) -> Vec<String> {
        self.nodes[node]
            .cli(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1000"])
            .lines()
            .map(str::trim)
            .filter(|key| !key.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Starts moving `slot` from master `source` to master `target` the way
    /// `redis-cli --cluster reshard` does: IMPORTING on the target first, then
    /// MIGRATING on the source. Until [`RedisCluster::finish_migration`], the source
    /// answers ASK for keys it no longer has and TRYAGAIN to multi-key commands that
    /// find only some of their keys; the target answers TRYAGAIN to multi-key commands
    /// (sent after ASKING) that miss some of theirs.
    pub fn start_migration(&self, slot: u16, source: usize, target: usize) {
        let slot = slot.to_string();
        let importing = self.nodes[target].cli(&[
            "CLUSTER",
            "SETSLOT",
            &slot,
            "IMPORTING",
            &self.node_id(source),
        ]);
        assert_eq!(importing, "OK", "SETSLOT IMPORTING");
        let migrating = self.nodes[source].cli(&[
            "CLUSTER",
            "SETSLOT",
            &slot,
            "MIGRATING",
            &self.node_id(target),
        ]);
        assert_eq!(migrating, "OK", "SETSLOT MIGRATING");
    }

    /// Moves the keys of `slot` on `source` for which `chosen` holds to `target`
    /// (`MIGRATE … KEYS`), leaving the others where they are; returns the keys moved.
    pub fn migrate_keys(
        &self,
        slot: u16,
        source: usize,
        target: usize,
        chosen: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let keys: Vec<String> = self
            .keys_in_slot(source, slot)
            .into_iter()
            .filter(|key| chosen(key))
            .collect();
        if keys.is_empty() {
            return keys;
        }
        let port = self.nodes[target].port().to_string();
        let mut args = vec![
            "MIGRATE",
            "127.0.0.1",
            &port,
            "",
            "0",
            "5000",
            "REPLACE",
            "KEYS",
        ];
        args.extend(keys.iter().map(String::as_str));
        let reply = self.nodes[source].cli(&args);
        assert_eq!(reply, "OK", "MIGRATE {keys:?}");
        keys
    }

    /// Ends a migration begun with [`RedisCluster::start_migration`]: moves the keys
    /// of `slot` still on `source`, then assigns the slot to `target` on the target,
    /// the source and every other master (the order `redis-cli --cluster reshard`
    /// uses), so that the source answers MOVED from then on.
    pub fn finish_migration(&self, slot: u16, source: usize, target: usize) {
        // Keys may arrive between two rounds (a lock taken on the source meanwhile).
        while !self.migrate_keys(slot, source, target, |_| true).is_empty() {}
        let target_id = self.node_id(target);
        let slot_text = slot.to_string();
        let others = (0..self.nodes.len()).filter(|&node| node != source && node != target);
        for node in [target, source].into_iter().chain(others) {
            let alive = self.nodes[node].pid().is_some();
            if !alive || !self.nodes[node].cli(&["ROLE"]).starts_with("master") {
                continue;
            }
            let reply =
                self.nodes[node].cli(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &target_id]);
            assert_eq!(reply, "OK", "SETSLOT NODE on node {node}");
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
            && lists_slot(&fields, slot)
    })
}

/// Whether the fields of a `CLUSTER NODES` line (split on whitespace) list `slot` among
/// its slot ranges (`low-high` or a single slot, from the ninth field on).
pub fn lists_slot(fields: &[impl AsRef<str>], slot: u64) -> bool {
    fields.iter().skip(8).any(|range| {
        let mut bounds = range
            .as_ref()
            .split('-')
            .filter_map(|b| b.parse::<u64>().ok());
        match (bounds.next(), bounds.next()) {
            (Some(low), Some(high)) => (low..=high).contains(&slot),
            (Some(only), None) => only == slot,
            _ => false,
        }
    })
}
