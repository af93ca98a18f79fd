//! The same annotated function against every mode: one server, RedLock, Cluster and
//! Sentinel. The attribute does not know or care which one the client speaks to.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlock_runtime::{LockClient, LockError, current_lock, distributed_lock};
use redlock_testkit::{RedisCluster, RedisServer, SentinelSetup};

#[derive(Default)]
struct Overlap {
    inside: AtomicUsize,
    most: AtomicUsize,
    runs: AtomicUsize,
}

#[distributed_lock(key = "shipment:{<id>}", client = locks, wait = "20s", lease = "10s")]
async fn ship(locks: &LockClient, id: u32, overlap: &Overlap) -> Result<u64, LockError> {
    let inside = overlap.inside.fetch_add(1, Ordering::SeqCst) + 1;
    overlap.most.fetch_max(inside, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2)).await;
    overlap.inside.fetch_sub(1, Ordering::SeqCst);
    overlap.runs.fetch_add(1, Ordering::SeqCst);
    let _ = id;
    Ok(current_lock().expect("inside the lock").fencing_token())
}

/// Eight tasks, five calls each, on one id: never two inside, tokens all distinct.
async fn exercise(client: LockClient) {
    let overlap = Arc::new(Overlap::default());
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            let overlap = overlap.clone();
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..5 {
                    tokens.push(ship(&client, 7, &overlap).await.unwrap());
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.extend(task.await.unwrap());
    }
    assert_eq!(
        overlap.most.load(Ordering::SeqCst),
        1,
        "two calls ran at once"
    );
    assert_eq!(overlap.runs.load(Ordering::SeqCst), 40);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 40, "a fencing token was handed out twice");
}

#[tokio::test]
async fn on_one_server() {
    let server = RedisServer::start();
    exercise(LockClient::connect(&server.url()).await.unwrap()).await;
}

#[tokio::test]
async fn on_redlock_masters() {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    exercise(
        LockClient::redlock(masters.iter().map(RedisServer::url))
            .await
            .unwrap(),
    )
    .await;
}

#[tokio::test]
async fn on_a_cluster() {
    let cluster = RedisCluster::start(3);
    exercise(LockClient::cluster(cluster.urls()).await.unwrap()).await;
}

#[tokio::test]
async fn behind_sentinel() {
    let setup = SentinelSetup::start();
    let client = LockClient::sentinel(setup.sentinel_urls(), redlock_testkit::sentinel::SERVICE)
        .await
        .unwrap();
    exercise(client).await;
}
