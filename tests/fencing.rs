//! Fencing tokens never go backwards: not across keys, not after Redis restarts empty
//! or from a snapshot or an AOF that missed the last increments, not after a lagging
//! replica is promoted, not with RedLock masters restarting from snapshots, not after a
//! cluster shard fails over. Also: a client warns when Redis may evict its keys.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, raw, token_of};
use redis::AsyncCommands;
use redlock_runtime::LockClient;
use redlock_testkit::{RedisCluster, RedisServer};

/// Redis's stock RDB save points (`redis.conf` of 7.x). None of them fires within a
/// test (the first needs 60 s), so the only snapshots are the tests' explicit `SAVE`s.
const STOCK_SAVE_POINTS: [&str; 2] = ["--save", "3600 1 300 100 60 10000"];

/// Two lock names: the property is per key, but one counter serves every key of a
/// server, so a test checks that neither key falls behind what it was handed.
const KEYS: [&str; 2] = ["invoice", "report"];

/// The highest token handed out so far on each key.
#[derive(Debug, Default)]
struct Handed {
    highest: HashMap<String, u64>,
}

impl Handed {
    /// Records `token` for `key`, asserting it is above every token `key` had before.
    fn record(&mut self, key: &str, token: u64, when: &str) {
        if let Some(&before) = self.highest.get(key) {
            assert!(
                token > before,
                "{when}: token {token} on {key:?} is not above {before}, handed out before \
                 (behind by {})",
                before - token
            );
        }
        self.highest.insert(key.to_owned(), token);
    }
}

/// Takes and releases the lock on `key` once, recording its token. The wait is long
/// enough to ride out a reconnection or a RedLock master's post-restart quarantine.
async fn lock_once(client: &LockClient, key: &str, handed: &mut Handed, when: &str) {
    let guard = client
        .lock(key)
        .lease(Duration::from_secs(1))
        .wait(Duration::from_secs(8))
        .acquire()
        .await
        .unwrap_or_else(|error| panic!("{when}: could not lock {key:?}: {error}"));
    handed.record(key, guard.fencing_token(), when);
    guard.release().await.unwrap();
}

/// `rounds` locks, alternating between the two keys.
async fn lock_rounds(client: &LockClient, rounds: usize, handed: &mut Handed, when: &str) {
    for round in 0..rounds {
        lock_once(client, KEYS[round % KEYS.len()], handed, when).await;
    }
}

/// Number of keys the server holds: non-zero after a restart shows it loaded stale
/// data rather than starting empty (an empty start is another, easier case).
fn key_count(server: &RedisServer) -> u64 {
    server.cli(&["DBSIZE"]).parse().expect("DBSIZE")
}

#[tokio::test]
async fn tokens_keep_increasing_across_keys_and_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let client = client(&server).await;
    let mut last = 0;
    for key in ["a", "b", "a", "c", "a"] {
        let token = token_of(&client, key).await;
        assert!(token > last);
        last = token;
    }
    server.restart();
    // The client reconnects by itself, reloads its scripts, and tokens keep growing.
    let guard = client
        .lock("a")
        .wait(Duration::from_secs(10))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(
        guard.fencing_token() > last,
        "{} <= {last}",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
    // Distinct keys leave nothing behind but the one shared counter.
    let keys: Vec<String> = raw(&server).await.keys("*").await.unwrap();
    assert_eq!(keys, vec!["redlock:fence".to_string()]);
}

/// The scripts compare the counter with the clock as digits while both have as many:
/// a counter ahead of the clock (another server's tokens, or one raised by hand), one
/// with fewer digits, and one that is not a number at all each give the token they
/// gave when compared as numbers, in the one-key acquire, a grant and `lock_all`.
#[tokio::test]
async fn a_counter_ahead_of_the_clock_shorter_or_not_a_number_gives_the_same_tokens() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let mut redis = raw(&server).await;
    let now_us = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    // Ahead by 1000 s, with as many digits: the next token is the counter's next.
    let ahead = now_us() + 1_000_000_000;
    let _: () = redis.set("redlock:fence", ahead).await.unwrap();
    assert_eq!(token_of(&client, "a").await, ahead + 1);
    assert_eq!(token_of(&client, "b").await, ahead + 2);
    let both = client.lock_all(["c", "d"]).acquire().await.unwrap();
    assert_eq!(
        (both.fencing_token("c"), both.fencing_token("d")),
        (Some(ahead + 3), Some(ahead + 4))
    );
    both.release().await.unwrap();

    // A grant: a waiter given the key by a release takes the counter's next too.
    let holder = client
        .lock("e")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let waiter = common::wait_for_key(common::client(&server).await, "e", Duration::from_secs(5));
    common::until_waiting(&client, "e", 1).await;
    common::until_listening(&server, "e", 1).await;
    holder.release().await.unwrap();
    let granted = waiter.await.unwrap();
    // Above the holder's (ahead + 5) and the waiter's attempts' own (each took one):
    // the counter's, where the clock would give one 1000 s behind.
    let token = granted.fencing_token();
    assert!(
        token > ahead + 6 && token < ahead + 100,
        "granted {token}, the counter was at {}",
        ahead + 5
    );
    granted.release().await.unwrap();

    // Fewer digits, and not a number: the clock.
    for counter in ["42", "not a number"] {
        let _: () = redis.set("redlock:fence", counter).await.unwrap();
        let before = now_us();
        let token = token_of(&client, "f").await;
        assert!(
            token >= before && token <= now_us(),
            "counter {counter:?}: token {token} is not the clock ({before}..)"
        );
    }
}

#[tokio::test]
async fn tokens_keep_increasing_after_a_crash_restart_from_a_snapshot() {
    let mut server = RedisServer::start_persistent(&STOCK_SAVE_POINTS);
    let client = LockClient::connect(&server.url()).await.unwrap();
    let mut handed = Handed::default();
    lock_rounds(&client, 10, &mut handed, "before the snapshot").await;
    assert_eq!(server.cli(&["SAVE"]), "OK");
    // These ten are handed out but never reach the disk.
    lock_rounds(&client, 10, &mut handed, "after the snapshot").await;

    server.crash_and_restart();
    assert!(
        key_count(&server) > 0,
        "the restart did not load the snapshot"
    );
    // The same client reconnects by itself; both keys must stay ahead.
    for key in KEYS {
        lock_once(&client, key, &mut handed, "after the crash restart").await;
    }
    lock_rounds(&client, 4, &mut handed, "later").await;
}

#[tokio::test]
async fn tokens_keep_increasing_after_a_crash_restart_with_aof_everysec() {
    let mut server =
        RedisServer::start_persistent(&["--appendonly", "yes", "--appendfsync", "everysec"]);
    let client = LockClient::connect(&server.url()).await.unwrap();
    let mut handed = Handed::default();

    // kill -9 alone loses nothing everysec has written (the kernel holds it).
    lock_rounds(&client, 200, &mut handed, "before kill -9").await;
    server.crash_and_restart();
    for key in KEYS {
        lock_once(&client, key, &mut handed, "after kill -9").await;
    }

    // What everysec does lose, in an OS crash or power cut, is up to about a second of
    // writes not yet fsynced. Pretend the last fsync happened now...
    let fsynced = server.copy_of_disk();
    // ...hand out 200 more tokens quickly, within that second in practice (any prefix of
    // the AOF is a state a crash can leave, so the test does not depend on it)...
    lock_rounds(&client, 200, &mut handed, "after the last fsync").await;
    // ...and crash: the server comes back with the AOF as of the last fsync.
    server.crash_and_restart_from(fsynced.path());
    assert!(key_count(&server) > 0, "the restart did not load the AOF");
    for key in KEYS {
        lock_once(
            &client,
            key,
            &mut handed,
            "after the crash that lost a second",
        )
        .await;
    }
    lock_rounds(&client, 4, &mut handed, "later").await;
}

#[tokio::test]
async fn tokens_keep_increasing_when_a_lagging_replica_is_promoted() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary, &[]);
    replica.wait_until_caught_up_with(&primary, Duration::from_secs(10));
    let client = LockClient::connect(&primary.url()).await.unwrap();
    let mut handed = Handed::default();
    lock_rounds(&client, 10, &mut handed, "while the replica keeps up").await;
    replica.wait_until_caught_up_with(&primary, Duration::from_secs(10));

    // The replica falls behind. Stopping it is not enough on loopback: its kernel
    // would still buffer the stream and it would apply it on resuming. Cutting the link
    // from the primary's side too leaves what follows in the primary's backlog only,
    // as a partition or a slow link would.
    replica.pause();
    assert!(
        primary.kill_clients(&["TYPE", "replica"]) >= 1,
        "no replica link to cut"
    );
    lock_rounds(&client, 10, &mut handed, "while the replica lags").await;

    // The primary dies; an operator promotes the replica and points clients at it.
    primary.kill();
    replica.resume();
    assert_eq!(replica.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    assert!(key_count(&replica) > 0, "the replica never had the counter");
    let promoted = LockClient::connect(&replica.url()).await.unwrap();
    for key in KEYS {
        lock_once(&promoted, key, &mut handed, "on the promoted replica").await;
    }
    lock_rounds(&promoted, 4, &mut handed, "later").await;
}

#[tokio::test]
async fn redlock_tokens_keep_increasing_when_masters_restart_from_snapshots() {
    let mut masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_persistent(&STOCK_SAVE_POINTS))
        .collect();
    for master in &masters {
        master.vouch_for_its_data();
    }
    // A master restarted less than `max_lease` ago has forgotten locks that may still
    // be held, so its vote does not count until then; leases, the watchdog's too, stay
    // within it. Short, so that a restarted master is back within a lock's wait.
    let client = LockClient::builder_for(masters.iter().map(RedisServer::url))
        .max_lease(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(1))
        .renew_every(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let mut handed = Handed::default();
    let save_all = |masters: &[RedisServer]| {
        for master in masters {
            assert_eq!(master.cli(&["SAVE"]), "OK");
        }
    };

    // A rolling restart with locking in between: each master comes back from its
    // snapshot, behind the two others.
    lock_rounds(&client, 10, &mut handed, "before the snapshots").await;
    save_all(&masters);
    lock_rounds(&client, 10, &mut handed, "after the snapshots").await;
    for (index, master) in masters.iter_mut().enumerate() {
        master.crash_and_restart();
        assert!(key_count(master) > 0, "master {index} lost its snapshot");
        lock_rounds(
            &client,
            4,
            &mut handed,
            &format!("after master {index} restarted"),
        )
        .await;
    }

    // A rolling restart with no lock in between (never more than one master down):
    // every master is then behind, so the write-back of the majority's largest token
    // cannot carry the counter forward.
    save_all(&masters);
    lock_rounds(&client, 10, &mut handed, "after the second snapshots").await;
    for master in &mut masters {
        master.crash_and_restart();
    }
    for key in KEYS {
        lock_once(&client, key, &mut handed, "after every master restarted").await;
    }
    lock_rounds(&client, 4, &mut handed, "later").await;
}

/// The cluster node that replicates the master at `master`.
fn replica_of(cluster: &RedisCluster, master: usize) -> usize {
    let port = cluster.nodes[master].port().to_string();
    cluster
        .nodes
        .iter()
        .position(|node| {
            node.info_field("replication", "role").as_deref() == Some("slave")
                && node.info_field("replication", "master_port") == Some(port.clone())
        })
        .expect("the master has a replica")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_per_slot_tokens_keep_increasing_across_a_failover_to_a_lagging_replica() {
    let mut cluster = RedisCluster::start_with_replicas(3, 1);
    // Two lock names in one slot: they share that slot's counter.
    let keys = ["invoice:{7}", "report:{7}"];
    let master = cluster.master_of(keys[0]).expect("a master serves the key");
    let replica = replica_of(&cluster, master);
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let mut handed = Handed::default();
    for round in 0..10 {
        lock_once(
            &client,
            keys[round % 2],
            &mut handed,
            "while the replica keeps up",
        )
        .await;
    }
    cluster.nodes[replica]
        .wait_until_caught_up_with(&cluster.nodes[master], Duration::from_secs(10));

    // The replica falls behind (see the single-server test for why the link is cut too).
    cluster.nodes[replica].pause();
    assert!(
        cluster.nodes[master].kill_clients(&["TYPE", "replica"]) >= 1,
        "no replica link to cut"
    );
    for round in 0..10 {
        lock_once(
            &client,
            keys[round % 2],
            &mut handed,
            "while the replica lags",
        )
        .await;
    }

    // The master dies; the replica takes its slots over without waiting for a vote.
    cluster.nodes[master].kill();
    cluster.nodes[replica].resume();
    assert_eq!(
        cluster.nodes[replica].cli(&["CLUSTER", "FAILOVER", "TAKEOVER"]),
        "OK"
    );
    assert!(
        key_count(&cluster.nodes[replica]) > 0,
        "the replica never had the counter"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.master_of(keys[0]) != Some(replica) {
        assert!(
            Instant::now() < deadline,
            "the replica never took the slot over"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A new client on the live nodes; the cluster may answer CLUSTERDOWN for a moment.
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.pid().is_some())
        .map(RedisServer::url)
        .collect();
    let promoted = LockClient::cluster(seeds).await.unwrap();
    for key in keys {
        let mut guard = None;
        while guard.is_none() {
            match promoted
                .lock(key)
                .lease(Duration::from_secs(5))
                .wait(Duration::from_secs(2))
                .acquire()
                .await
            {
                Ok(acquired) => guard = Some(acquired),
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "never locked after the failover: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let guard = guard.unwrap();
        handed.record(key, guard.fencing_token(), "on the promoted replica");
        guard.release().await.unwrap();
    }
}

/// A `tracing` writer that keeps everything written to it.
#[derive(Debug, Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// What a client logs while it connects to `server` and takes and releases one lock.
async fn logs_of_a_client_of(server: &RedisServer) -> String {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // This test's runtime runs on this thread only, so a thread-local subscriber sees
    // everything the client logs, and nothing from tests on other threads.
    let _guard = common::on_this_thread(subscriber);
    let client = LockClient::connect(&server.url()).await.unwrap();
    let guard = client.lock("invoice").acquire().await.unwrap();
    guard.release().await.unwrap();
    captured.text()
}

#[tokio::test]
async fn a_warning_names_an_evicting_maxmemory_policy() {
    // Under memory pressure this policy may evict the fencing counter (tokens restart
    // from a lower value) or a held lock (a second owner gets in).
    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let logs = logs_of_a_client_of(&evicting).await;
    assert!(
        logs.contains("WARN") && logs.contains("maxmemory-policy") && logs.contains("allkeys-lru"),
        "no warning naming the policy; the client logged: {logs:?}"
    );

    // The default, `noeviction`, is what a lock needs: nothing to warn about.
    let safe = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let logs = logs_of_a_client_of(&safe).await;
    assert!(
        !logs.contains("maxmemory-policy"),
        "warned about noeviction: {logs:?}"
    );
}
