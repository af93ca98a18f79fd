//! A replicated primary behind Redis Sentinel: replica confirmation, a lock that
//! survives a sentinel-driven failover, and the wait bound while the primary hangs (with
//! its one-server counterpart).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockError};
use redlock_testkit::sentinel::SERVICE;
use redlock_testkit::{RedisServer, SentinelSetup};

async fn confirming_client(setup: &SentinelSetup, replicas: usize) -> LockClient {
    LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        // Three times the 500 ms a quiet machine needs, under the response timeout: the
        // suite's passes side by side on two cores held a replica's acknowledgement past
        // 500 ms once.
        .confirm_replicas(replicas, Duration::from_millis(1500))
        .response_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect through the sentinels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_lock_survives_a_failover() {
    let mut setup = SentinelSetup::start();
    let holder = confirming_client(&setup, 1).await;
    let guard = holder
        .lock("invoice:7")
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    // WAIT confirmed it: the replica has the lock before the primary dies.
    assert_eq!(setup.replica.cli(&["EXISTS", "invoice:7"]), "1");
    setup.fail_over();
    assert_eq!(
        setup.replica.cli(&["EXISTS", "invoice:7"]),
        "1",
        "the new primary lost the lock"
    );

    // A client that arrives after the failover finds the lock held on the new primary.
    let rival = LockClient::sentinel(setup.sentinel_urls(), SERVICE)
        .await
        .unwrap();
    let error = rival
        .lock("invoice:7")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");

    // The holder's client follows the new primary: extend and release work there.
    // (Its first command may hit the dead primary, then it asks the sentinels again.)
    let mut extended = guard.extend(Duration::from_secs(60)).await;
    for _ in 0..20 {
        if extended.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        extended = guard.extend(Duration::from_secs(60)).await;
    }
    extended.expect("the holder never reached the new primary");
    let first_token = guard.fencing_token();
    guard.release().await.unwrap();
    let next = rival
        .lock("invoice:7")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(
        next.fencing_token() > first_token,
        "fencing went backwards across the failover"
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn too_few_replicas_undo_the_acquisition() {
    let setup = SentinelSetup::start();
    // Two confirmations asked for, one replica exists.
    let client = confirming_client(&setup, 2).await;
    let error = client
        .lock("audit")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::NotReplicated { key, confirmed: 1, needed: 2 } if key == "audit"),
        "{error}"
    );
    assert_eq!(
        setup.primary.cli(&["EXISTS", "audit"]),
        "0",
        "the undone lock was left behind"
    );
}

/// Resumes a server paused with SIGSTOP when dropped (also when the test panics), so
/// that nothing is left stopped behind it; declared after the setup it points into, so
/// dropped before it.
struct Resume<'a>(&'a RedisServer);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// Pauses `server` (SIGSTOP) until the returned guard is dropped.
fn paused(server: &RedisServer) -> Resume<'_> {
    server.pause();
    Resume(server)
}

/// Waits (polling `CLIENT LIST` on `server`) until some client is blocked in `WAIT`;
/// returns its id.
fn blocked_in_wait(server: &RedisServer) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let blocked = server.client_ids(|line| line.contains(" cmd=wait "));
        if let Some(&id) = blocked.first() {
            return id;
        }
        assert!(Instant::now() < deadline, "no client ever blocked in WAIT");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Closes the connections `clients` (ids from `CLIENT LIST`) and freezes `server`, with
/// no moment in between at which a reconnect could complete: the `CLIENT KILL`s and a
/// `CLIENT PAUSE … ALL` arrive in one write, which Redis runs back to back. A client
/// that reconnects then gets its TCP connection (the kernel accepts it) but never an
/// answer to its `HELLO`, as with a server that hangs. Then SIGSTOP, so that it stays
/// so however long the pause would last.
fn drop_clients_and_freeze<'a>(server: &'a RedisServer, clients: &[u64]) -> Resume<'a> {
    assert!(!clients.is_empty(), "no client connection to drop");
    let mut stream = TcpStream::connect(server.addr()).expect("connect to the server");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("set a read timeout");
    let mut commands = String::new();
    for id in clients {
        commands.push_str(&format!("CLIENT KILL ID {id}\r\n"));
    }
    commands.push_str("CLIENT PAUSE 60000 ALL\r\n");
    stream
        .write_all(commands.as_bytes())
        .expect("send CLIENT KILL and CLIENT PAUSE");
    let mut replies = BufReader::new(stream);
    for _ in 0..=clients.len() {
        let mut line = String::new();
        replies.read_line(&mut line).expect("read a reply");
        assert!(
            line.starts_with(':') || line.starts_with("+OK"),
            "unexpected reply: {line}"
        );
    }
    paused(server)
}

// Issue: a confirmation's WAIT blocked the client's one multiplexed connection for its
// whole timeout, so every other lock of the client (its releases and extensions, and
// the watchdog's renewals) stalled behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_confirmation_does_not_block_other_locks() {
    let setup = SentinelSetup::start();
    // Confirmation timeout 3 s: the traffic below needs about 1.5 s while the WAIT is
    // pending, and is checked by order (the WAIT still pending), not by its speed.
    let client = LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        .confirm_replicas(1, Duration::from_secs(3))
        .response_timeout(Duration::from_secs(4))
        .connect_timeout(Duration::from_millis(500))
        .watchdog_lease(Duration::from_millis(600))
        .renew_every(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect through the sentinels");
    // Every acquisition of this client waits for a replica, so the other locks are
    // taken while the replica answers; only their extensions and releases (and the
    // watchdog's renewals) run during the blocked confirmation.
    let mut others = Vec::new();
    for id in 0..20 {
        others.push(
            client
                .lock(format!("other:{id}"))
                .lease(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let renewed = client.lock("renewed").acquire().await.unwrap();

    let replica_paused = paused(&setup.replica);
    let confirming = client.clone();
    let confirmed = tokio::spawn(async move {
        confirming
            .lock("confirmed")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
    });
    // The confirmation's WAIT is on the server, blocked: the replica cannot answer.
    tokio::task::block_in_place(|| blocked_in_wait(&setup.primary));
    let wait_seen = tokio::time::Instant::now();

    for guard in others {
        guard.extend(Duration::from_secs(30)).await.unwrap();
        guard.release().await.unwrap();
    }
    let pending_after_others = !confirmed.is_finished();
    // More than two watchdog leases: the watchdog lock survives only if renewed meanwhile.
    tokio::time::sleep_until(wait_seen + Duration::from_millis(1500)).await;
    let renewed_lost = renewed.is_lost();
    let pending_after_hold = !confirmed.is_finished();
    assert!(
        pending_after_others,
        "20 extensions and releases only got through after the confirmation's WAIT ended"
    );
    assert!(
        !renewed_lost,
        "the watchdog could not renew while a confirmation's WAIT was pending"
    );
    assert!(
        pending_after_hold,
        "the confirmation ended early: the scenario did not hold"
    );
    renewed.release().await.unwrap();

    let error = confirmed.await.unwrap().unwrap_err();
    assert!(
        matches!(
            &error,
            LockError::NotReplicated {
                confirmed: 0,
                needed: 1,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        setup.primary.cli(&["EXISTS", "confirmed"]),
        "0",
        "the unconfirmed lock was left behind"
    );
    drop(replica_paused);
}

/// How much longer than `wait + response timeout` an acquisition may take in the two
/// tests below: scheduling and a Sentinel round trip, not another connect timeout.
const MARGIN: Duration = Duration::from_millis(700);

// Issue: "acquire returns within wait + one response timeout" did not hold while the
// connection was being re-established: the reconnect's connect timeout (2 s here)
// stacked in front of the response timeout. The primary hangs (its connections were
// dropped, then it was frozen), and the sentinels have not failed over yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_stays_within_wait_plus_response_timeout_while_the_primary_is_unreachable() {
    let setup = SentinelSetup::start();
    let response_timeout = Duration::from_millis(500);
    let client = LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        .response_timeout(response_timeout)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect through the sentinels");
    // Connected, with the script loaded and a release subscription made.
    let guard = client
        .lock("warm")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();

    // The lock client's connections: all but the replica's link and the sentinels'.
    let ours = setup
        .primary
        .client_ids(|line| !line.contains(" name=sentinel-") && !line.contains(" flags=S "));
    let frozen = drop_clients_and_freeze(&setup.primary, &ours);
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let result = client
        .lock("invoice:9")
        .wait(wait)
        .lease(Duration::from_secs(5))
        .acquire()
        .await;
    let took = started.elapsed();
    drop(frozen);
    assert!(
        took < wait + response_timeout + MARGIN,
        "acquire took {took:?} (wait {wait:?}, response timeout {response_timeout:?}); \
         it ended with {:?}",
        result.map(|guard| guard.fencing_token())
    );
}

// The same bound on one server: the client's connection was dropped and the server
// hangs, so the reconnect cannot finish; the acquisition must not wait for it longer
// than its wait and one response timeout.
#[tokio::test]
async fn an_acquire_stays_within_wait_plus_response_timeout_while_one_server_hangs() {
    let server = RedisServer::start();
    let response_timeout = Duration::from_millis(500);
    let client = LockClient::builder(&server.url())
        .response_timeout(response_timeout)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let guard = client
        .lock("warm")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();

    let ours = server.client_ids(|_| true);
    let frozen = drop_clients_and_freeze(&server, &ours);
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let result = client
        .lock("invoice:9")
        .wait(wait)
        .lease(Duration::from_secs(5))
        .acquire()
        .await;
    let took = started.elapsed();
    drop(frozen);
    assert!(
        took < wait + response_timeout + MARGIN,
        "acquire took {took:?} (wait {wait:?}, response timeout {response_timeout:?}); \
         it ended with {:?}",
        result.map(|guard| guard.fencing_token())
    );
}

// Issue: when a confirmation's WAIT failed as if the primary had moved, the WAIT was
// sent again to the primary the sentinels named next — which never had the lock, and
// (a fresh connection having written nothing) confirms at once. A real failover to a
// replica that missed the lock is hard to time; the sentinels are made to name such a
// server instead: a primary of its own (with a replica, so that WAIT 1 is satisfied)
// that holds none of the old primary's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_is_never_counted_on_a_newly_promoted_primary() {
    let setup = SentinelSetup::start();
    let other = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let other_replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &other.port().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !other_replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "the other replica never synced");
        std::thread::sleep(Duration::from_millis(50));
    }
    let client = LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        .confirm_replicas(1, Duration::from_secs(3))
        .response_timeout(Duration::from_secs(4))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect through the sentinels");

    // The lock is written on the primary; its WAIT blocks (the replica is paused).
    let replica_paused = paused(&setup.replica);
    let confirming = client.clone();
    let confirmed = tokio::spawn(async move {
        confirming
            .lock("ledger")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
    });
    let waiting = tokio::task::block_in_place(|| blocked_in_wait(&setup.primary));

    // The sentinels now name the other server as the primary, as after a failover.
    for sentinel in &setup.sentinels {
        assert_eq!(sentinel.cli(&["SENTINEL", "REMOVE", SERVICE]), "OK");
        let port = other.port().to_string();
        let monitor = sentinel.cli(&["SENTINEL", "MONITOR", SERVICE, "127.0.0.1", &port, "2"]);
        assert_eq!(monitor, "OK");
    }
    for sentinel in &setup.sentinels {
        assert_eq!(sentinel.primary_port(), Some(other.port()));
    }
    // The WAIT's connection drops, as when the old primary goes away.
    assert_eq!(
        setup.primary.kill_clients(&["ID", &waiting.to_string()]),
        1,
        "the WAIT's connection was not found"
    );

    let result = tokio::time::timeout(Duration::from_secs(10), confirmed)
        .await
        .expect("the confirmed acquisition never ended")
        .unwrap();
    assert_eq!(
        other.cli(&["EXISTS", "ledger"]),
        "0",
        "the lock reached the other server"
    );
    assert!(
        result.is_err(),
        "the acquisition counted a confirmation from a primary that never had the lock \
         (token {:?})",
        result.as_ref().map(|guard| guard.fencing_token()).ok()
    );
    drop(replica_paused);
}
