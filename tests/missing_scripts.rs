//! A script missing on the server — after a restart, a `SCRIPT FLUSH`, or on a replica a
//! Cluster failover has just promoted — runs with its source, in one `EVAL` sent where
//! the key lives. redis-rs would load it with `SCRIPT LOAD` and send the `EVALSHA` again;
//! on a Cluster that load goes to the masters of the client's slot map, which a failover
//! has just made stale, and the release failed with `NOSCRIPT` (tests/crossed_replies.rs,
//! on Valkey, about one run in three). Counted here with `INFO commandstats`.

use std::time::Duration;

use redlock_runtime::LockClient;
use redlock_testkit::{RedisCluster, RedisServer};

/// How many times `node` ran `command` since its statistics were reset.
fn calls(node: &RedisServer, command: &str) -> u64 {
    let stats = node.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// Empties the script cache of `nodes` and resets their statistics.
fn forget_scripts(nodes: &[RedisServer]) {
    for node in nodes {
        assert_eq!(node.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
        assert_eq!(node.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    }
}

/// Takes `key`, has every node forget its scripts, and releases it: the release must
/// run with the script's source in one `EVAL` and no `SCRIPT LOAD`, and the next
/// acquisition must work.
async fn released_with_its_source(client: &LockClient, nodes: &[RedisServer], key: &str) {
    let guard = client
        .lock(key)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire");
    forget_scripts(nodes);
    guard
        .release()
        .await
        .expect("a release whose script the server forgot");
    let evals: u64 = nodes.iter().map(|node| calls(node, "eval")).sum();
    let loads: u64 = nodes
        .iter()
        .map(|node| calls(node, "script|load"))
        .sum::<u64>()
        + nodes.iter().map(|node| calls(node, "script")).sum::<u64>();
    assert_eq!(evals, 1, "the release was not sent once with its source");
    assert_eq!(loads, 0, "the script was loaded apart from its run");
    // The `EVAL` left the script cached where it ran: the next cycle runs as usual.
    let again = client
        .lock(key)
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire again");
    again.release().await.expect("release again");
}

#[tokio::test]
async fn a_script_the_server_forgot_runs_with_its_source() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    released_with_its_source(&client, std::slice::from_ref(&server), "missing:one").await;
}

#[tokio::test]
async fn a_script_a_cluster_node_forgot_runs_with_its_source_where_the_key_lives() {
    let cluster = RedisCluster::start(3);
    let client = LockClient::builder_for(cluster.urls())
        .cluster()
        .connect()
        .await
        .expect("connect to the cluster");
    released_with_its_source(&client, &cluster.nodes, "missing:cluster").await;
}
