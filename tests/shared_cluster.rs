//! Every shared primitive on a 3-master Redis Cluster the test creates: read-write
//! exclusion, sharing and writer preference on keys of every master, a concurrent
//! read-write history, the semaphore's limit (and its count mismatch), the election,
//! and nothing but redlock's per-slot fencing counters left once all is released.
//!
//! A cluster is slow to start, so one test starts one and runs every part in turn.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlock_runtime::{LockClient, LockError};
use redlock_testkit::{RedisCluster, RedisServer};

const SECOND: Duration = Duration::from_secs(1);

async fn cluster_client(cluster: &RedisCluster, name: &str) -> LockClient {
    LockClient::builder_for(cluster.urls())
        .cluster()
        .name(name)
        .connect()
        .await
        .expect("connect to the cluster")
}

/// A hand-off's evidence (`redlock:forced:<key>` reading `handed:<owner>`): it expires
/// within three response timeouts (3 s by default) and a second, so it is not left behind.
fn expiring_hand_off_evidence(node: &RedisServer, key: &str) -> bool {
    key.contains("redlock:forced:")
        && node.cli(&["GET", key]).starts_with("handed:")
        && node
            .cli(&["PTTL", key])
            .trim()
            .parse::<i64>()
            .is_ok_and(|ms| (1..=10_000).contains(&ms))
}

/// Keys `doc:<n>`, one served by each master.
fn one_key_per_master(cluster: &RedisCluster) -> Vec<String> {
    let mut masters = BTreeSet::new();
    let mut keys = Vec::new();
    for n in 0.. {
        let key = format!("doc:{n}");
        let master = cluster.master_of(&key).expect("a master serves every slot");
        if masters.insert(master) {
            keys.push(key);
        }
        if masters.len() == 3 {
            return keys;
        }
    }
    unreachable!()
}

/// Readers share, a writer excludes them and is woken by the last reader's release,
/// a waiting writer goes before new readers, and its token is above theirs.
async fn readers_share_and_writers_exclude(
    key: &str,
    a: &LockClient,
    b: &LockClient,
    c: &LockClient,
) {
    let first = a.read_lock(key).lease(10 * SECOND).acquire().await.unwrap();
    let second = b.read_lock(key).lease(10 * SECOND).acquire().await.unwrap();
    let busy = c
        .write_lock(key)
        .acquire()
        .await
        .expect_err("readers hold it");
    assert!(busy.is_busy(), "{key}: {busy}");
    let writer = tokio::spawn({
        let (c, key) = (c.clone(), key.to_owned());
        async move {
            c.write_lock(key)
                .wait(10 * SECOND)
                .lease(10 * SECOND)
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = a
        .read_lock(key)
        .acquire()
        .await
        .expect_err("a writer waits");
    assert!(
        late.is_busy(),
        "{key}: a new reader went before a waiting writer: {late}"
    );
    assert!(
        !writer.is_finished(),
        "{key}: the writer got in beside readers"
    );
    let readers_max = first.fencing_token().max(second.fencing_token());
    first.release().await.unwrap();
    second.release().await.unwrap();
    let written = tokio::time::timeout(2 * SECOND, writer)
        .await
        .expect("the last reader's release wakes the writer")
        .unwrap()
        .unwrap();
    assert!(
        written.fencing_token() > readers_max,
        "{key}: write token below a read's"
    );
    let refused = b
        .read_lock(key)
        .acquire()
        .await
        .expect_err("a writer holds it");
    assert!(refused.is_busy(), "{key}: {refused}");
    let write_token = written.fencing_token();
    written.release().await.unwrap();
    let after = a.read_lock(key).acquire().await.expect("free again");
    assert!(after.fencing_token() > write_token);
    after.release().await.unwrap();
}

/// Counts of what the concurrent runs saw.
#[derive(Default)]
struct Inside {
    readers: AtomicUsize,
    writers: AtomicUsize,
    peak: AtomicUsize,
    /// Releases that said `Lost` of a hold of a few ms under a 10 s lease.
    lost: AtomicUsize,
    /// Those of them that were writes.
    lost_writes: AtomicUsize,
}

/// Tasks of several clients read and write one key at random; a writer never finds
/// anyone inside, a reader never finds a writer, and readers do share. Returns how
/// many releases said `Lost`, and how many of those were writes.
async fn concurrent_read_write(clients: &[LockClient]) -> (usize, usize) {
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..4 {
            let (client, inside) = (client.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..15 {
                    let write = rand::random_range(0..10) < 3;
                    let request = if write {
                        client.write_lock("doc:history")
                    } else {
                        client.read_lock("doc:history")
                    };
                    let guard = request
                        .wait(30 * SECOND)
                        .lease(10 * SECOND)
                        .acquire()
                        .await
                        .expect("acquired within the wait");
                    if write {
                        assert_eq!(
                            inside.writers.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two writers"
                        );
                        assert_eq!(
                            inside.readers.load(Ordering::SeqCst),
                            0,
                            "a writer beside readers"
                        );
                        tokio::time::sleep(Duration::from_micros(rand::random_range(0..2_000)))
                            .await;
                        inside.writers.fetch_sub(1, Ordering::SeqCst);
                    } else {
                        let now = inside.readers.fetch_add(1, Ordering::SeqCst) + 1;
                        inside.peak.fetch_max(now, Ordering::SeqCst);
                        assert_eq!(
                            inside.writers.load(Ordering::SeqCst),
                            0,
                            "a reader beside a writer"
                        );
                        tokio::time::sleep(Duration::from_micros(rand::random_range(500..5_000)))
                            .await;
                        inside.readers.fetch_sub(1, Ordering::SeqCst);
                    }
                    match guard.release().await {
                        Ok(()) => {}
                        Err(LockError::Lost { .. }) => {
                            inside.lost.fetch_add(1, Ordering::SeqCst);
                            if write {
                                inside.lost_writes.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Err(error) => panic!("release failed: {error}"),
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a task saw two holders at once");
    }
    let peak = inside.peak.load(Ordering::SeqCst);
    println!("cluster read/write: at most {peak} readers at once");
    assert!(peak >= 2, "readers never shared the key on the cluster");
    (
        inside.lost.load(Ordering::SeqCst),
        inside.lost_writes.load(Ordering::SeqCst),
    )
}

/// At most `permits` holders, the limit reached, a freed permit wakes a waiter, and a
/// count mismatch is a typed error naming both counts.
async fn semaphore_keeps_its_limit(clients: &[LockClient]) {
    let (a, b) = (&clients[0], &clients[1]);
    let mut held = Vec::new();
    for n in 0..3 {
        let client = if n % 2 == 0 { a } else { b };
        held.push(
            client
                .semaphore("partner-api", 3)
                .lease(10 * SECOND)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let full = b
        .semaphore("partner-api", 3)
        .acquire()
        .await
        .expect_err("3 of 3 taken");
    assert!(full.is_busy(), "{full}");
    let other = a
        .semaphore("partner-api", 4)
        .acquire()
        .await
        .expect_err("another count");
    assert!(
        matches!(
            other,
            LockError::PermitsMismatch {
                requested: 4,
                existing: 3,
                ..
            }
        ),
        "{other}"
    );
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.semaphore("partner-api", 3)
                .wait(5 * SECOND)
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "a fourth holder got in");
    held.pop().unwrap().release().await.unwrap();
    held.push(
        tokio::time::timeout(2 * SECOND, waiter)
            .await
            .expect("a freed permit wakes the waiter")
            .unwrap()
            .unwrap(),
    );
    for permit in held {
        permit.release().await.unwrap();
    }

    // Tasks of every client: never above 2 of 2 permits, and 2 at some point.
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..4 {
            let (client, inside) = (client.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let permit = client
                        .semaphore("pool", 2)
                        .wait(30 * SECOND)
                        .lease(10 * SECOND)
                        .acquire()
                        .await
                        .expect("a permit within the wait");
                    let now = inside.readers.fetch_add(1, Ordering::SeqCst) + 1;
                    inside.peak.fetch_max(now, Ordering::SeqCst);
                    assert!(now <= 2, "{now} holders of 2 permits");
                    tokio::time::sleep(Duration::from_micros(rand::random_range(1_000..5_000)))
                        .await;
                    inside.readers.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.expect("released within its lease");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a task saw too many holders");
    }
    assert_eq!(
        inside.peak.load(Ordering::SeqCst),
        2,
        "both permits were never in use at once"
    );
}

/// One leader; `leader()` names it; the next is elected when it resigns, in a later term.
async fn election_has_one_leader(a: &LockClient, b: &LockClient) {
    let election = b.election("scheduler");
    assert!(election.leader().await.unwrap().is_none());
    let term = a.election("scheduler").campaign().await.unwrap();
    let info = election.leader().await.unwrap().expect("a leader");
    assert_eq!(info.holder(), a.name());
    assert_eq!(info.fencing_token(), term.fencing_token());
    let contender = tokio::spawn({
        let b = b.clone();
        async move { b.election("scheduler").campaign().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!contender.is_finished(), "two leaders at once");
    let first = term.fencing_token();
    term.release().await.unwrap();
    let next = tokio::time::timeout(2 * SECOND, contender)
        .await
        .expect("elected when the leader resigns")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > first);
    let info = election.leader().await.unwrap().expect("a leader");
    assert_eq!(info.holder(), b.name());
    next.release().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shared_primitive_works_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let clients = vec![
        cluster_client(&cluster, "cluster-a").await,
        cluster_client(&cluster, "cluster-b").await,
        cluster_client(&cluster, "cluster-c").await,
    ];
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);

    for key in one_key_per_master(&cluster) {
        readers_share_and_writers_exclude(&key, a, b, c).await;
    }
    let (lost, lost_writes) = concurrent_read_write(&clients).await;
    semaphore_keeps_its_limit(&clients).await;
    election_has_one_leader(a, b).await;

    // Nothing is left but the fencing counters of the slots used (and hand-offs'
    // evidence, which expires within seconds).
    let mut left = Vec::new();
    for node in &cluster.nodes {
        left.extend(
            node.cli(&["KEYS", "*"])
                .lines()
                .map(str::trim)
                .filter(|key| !key.is_empty() && !expiring_hand_off_evidence(node, key))
                .map(str::to_owned),
        );
    }
    assert!(
        left.iter().all(|key| key.starts_with("redlock:fence:{")),
        "left on the cluster: {left:?}"
    );
    assert_eq!(
        lost, 0,
        "releases said Lost ({lost_writes} of them writes) of read/write holds of a few ms \
         under a 10 s lease"
    );
}
