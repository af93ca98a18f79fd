//! Holders of the shared primitives that die: a reader process, a permit holder and a
//! leader killed with SIGKILL (no release, no more renewals) free what they held when
//! their own lease ends, and not before; a live holder's watchdog never keeps a dead
//! one's share alive; a leader that loses its lease (its key deleted, or Redis paused
//! past the lease) learns it through `lost()`.
//!
//! The dead holders are child processes (reruns of this test binary with only
//! `child_holds`) with a short watchdog lease; each prints `HELD <token>` once it holds.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockGuard};
use redlock_testkit::{RedisServer, signal};
use tokio::sync::mpsc;

/// The child test the holders run in: keep it equal to the function's name.
const HOLDER_CHILD: &str = "child_holds";

/// The watchdog lease of the dead readers and permit holders, and its renewal period.
const LEASE: Duration = Duration::from_millis(1500);
const RENEW: Duration = Duration::from_millis(300);
/// The leaders' watchdog lease and renewal period.
const LEADER_LEASE: Duration = Duration::from_secs(1);
const LEADER_RENEW: Duration = Duration::from_millis(300);
/// How late after a lease's end the next holder may get in: a retry timer and a
/// round trip or two, with room for a loaded machine.
const BOUND: Duration = Duration::from_secs(2);

/// A child process that holds something, killed at the latest when the test ends.
struct Holder {
    child: Child,
    /// The fencing tokens it printed.
    tokens: Vec<u64>,
}

impl Holder {
    /// Starts a child that takes `what` ("reader", "permits" or "leader") on `key` and
    /// waits until it says it holds it.
    fn start(server: &RedisServer, what: &str, key: &str) -> Holder {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", HOLDER_CHILD, "--nocapture", "--test-threads=1"])
            .env("REDLOCK_TEST_CHILD_URL", server.url())
            .env("REDLOCK_TEST_CHILD_ROLE", what)
            .env("REDLOCK_TEST_CHILD_KEY", key)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a holder process");
        let expected = if what == "permits" { 2 } else { 1 };
        let tokens = read_tokens(child.stdout.take().unwrap(), expected);
        Holder { child, tokens }
    }

    /// SIGKILL: no release, no renewal, nothing more from it.
    fn kill(&mut self) -> Instant {
        signal(self.child.id(), "KILL");
        let killed_at = Instant::now();
        let _ = self.child.wait();
        killed_at
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads the child's output until it has printed `expected` `HELD <token>` lines.
fn read_tokens(stdout: ChildStdout, expected: usize) -> Vec<u64> {
    let mut tokens = Vec::new();
    let mut lines = BufReader::new(stdout).lines();
    while tokens.len() < expected {
        let line = lines
            .next()
            .expect("the holder process ended before it held")
            .expect("read the holder's output");
        // The harness's `test child_holds ... ` may precede it on the line.
        if let Some((_, token)) = line.split_once("HELD ") {
            tokens.push(token.trim().parse().expect("a token"));
        }
    }
    tokens
}

/// A client with a short watchdog lease, named `name`.
async fn short_lease_client(
    server: &RedisServer,
    name: &str,
    lease: Duration,
    renew: Duration,
) -> LockClient {
    LockClient::builder(&server.url())
        .name(name)
        .watchdog_lease(lease)
        .renew_every(renew)
        .connect()
        .await
        .expect("connect")
}

/// The key's remaining lease in Redis (ms), read just now; panics if it has none.
fn pttl(server: &RedisServer, key: &str) -> Duration {
    let ms: i64 = server.cli(&["PTTL", key]).parse().unwrap();
    assert!(ms > 0, "{key} has no lease left: PTTL {ms}");
    Duration::from_millis(ms as u64)
}

/// Every key left on the server, sorted.
fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server
        .cli(&["KEYS", "*"])
        .lines()
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

/// Run in the holder processes (see [`Holder::start`]); a no-op otherwise. Holds until
/// it is killed.
#[tokio::test]
async fn child_holds() {
    let Ok(url) = std::env::var("REDLOCK_TEST_CHILD_URL") else {
        return;
    };
    let role = std::env::var("REDLOCK_TEST_CHILD_ROLE").unwrap();
    let key = std::env::var("REDLOCK_TEST_CHILD_KEY").unwrap();
    let (lease, renew) = match role.as_str() {
        "leader" => (LEADER_LEASE, LEADER_RENEW),
        _ => (LEASE, RENEW),
    };
    let client = LockClient::builder(&url)
        .name(format!("{role}-child"))
        .watchdog_lease(lease)
        .renew_every(renew)
        .connect()
        .await
        .unwrap();
    // Watchdog mode everywhere: only the death of the process ends the leases.
    let guards: Vec<LockGuard> = match role.as_str() {
        "reader" => vec![client.read_lock(key).acquire().await.unwrap()],
        "permits" => vec![
            client.semaphore(key.as_str(), 2).acquire().await.unwrap(),
            client.semaphore(key.as_str(), 2).acquire().await.unwrap(),
        ],
        "leader" => vec![client.election(key).campaign().await.unwrap()],
        other => panic!("unknown role {other}"),
    };
    for guard in &guards {
        println!("HELD {}", guard.fencing_token());
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
    panic!("the holder was not killed");
}

/// Asserts that what the killed holder held was freed at `freed_at`, after the end of
/// its lease (`lease_left` after `measured_at`, read before the kill) and within
/// `lease` + [`BOUND`] of the kill.
fn assert_freed_at_lease_end(
    what: &str,
    measured_at: Instant,
    lease_left: Duration,
    killed_at: Instant,
    freed_at: Instant,
    lease: Duration,
) {
    let after_kill = freed_at.duration_since(killed_at);
    println!(
        "{what}: free {after_kill:?} after the kill (lease {lease:?}, {lease_left:?} left \
         before it)"
    );
    // 50 ms for the gap between the PTTL read and the clock read after it.
    assert!(
        freed_at + Duration::from_millis(50) >= measured_at + lease_left,
        "{what}: freed {:?} before its lease ended",
        (measured_at + lease_left).duration_since(freed_at)
    );
    assert!(
        after_kill <= lease + BOUND,
        "{what}: freed {after_kill:?} after the kill (lease {lease:?} + bound {BOUND:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_readers_share_frees_at_its_lease_end() {
    let server = RedisServer::start();
    let mut reader = Holder::start(&server, "reader", "doc");
    let writer_client = LockClient::connect(&server.url()).await.unwrap();
    let writer = tokio::spawn(async move {
        let guard = writer_client
            .write_lock("doc")
            .wait(Duration::from_secs(20))
            .lease(Duration::from_secs(10))
            .acquire()
            .await;
        (guard, Instant::now())
    });
    // Alive, the reader keeps its share past its lease: its watchdog renews it.
    tokio::time::sleep(2 * LEASE).await;
    assert!(
        !writer.is_finished(),
        "the writer got in beside a live reader"
    );

    let measured_at = Instant::now();
    let lease_left = pttl(&server, "doc");
    let killed_at = reader.kill();
    let (guard, freed_at) = writer.await.unwrap();
    let guard = guard.expect("the writer gets in once the dead reader's lease ends");
    assert_freed_at_lease_end(
        "the dead reader's share",
        measured_at,
        lease_left,
        killed_at,
        freed_at,
        LEASE,
    );
    assert!(guard.fencing_token() > reader.tokens[0]);
    guard.release().await.unwrap();
    assert_eq!(keys(&server), ["redlock:fence"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_readers_watchdog_does_not_keep_a_dead_readers_share() {
    let server = RedisServer::start();
    let mut dead = Holder::start(&server, "reader", "doc");
    let live_client = short_lease_client(&server, "live-reader", LEASE, RENEW).await;
    let live = live_client.read_lock("doc").acquire().await.unwrap();
    let killed_at = dead.kill();

    // Well past the dead reader's lease, the live one's watchdog has renewed its own
    // share several times.
    tokio::time::sleep_until((killed_at + LEASE + BOUND).into()).await;
    assert!(!live.is_lost(), "the live reader lost its share");
    assert_eq!(
        server.cli(&["EXISTS", "doc"]),
        "1",
        "the live reader holds it"
    );

    // Once the live reader leaves, nothing holds the key: a writer's single attempt
    // (no wait) gets in. Had the renewals carried the dead share along, it would not.
    live.release()
        .await
        .expect("the live reader's share was its own");
    let writer = LockClient::connect(&server.url()).await.unwrap();
    let write = writer
        .write_lock("doc")
        .acquire()
        .await
        .expect("the dead reader's share ended with its own lease");
    write.release().await.unwrap();
    assert_eq!(keys(&server), ["redlock:fence"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_permit_holders_permits_return_at_their_lease_end() {
    let server = RedisServer::start();
    // The child holds both permits of the semaphore.
    let mut holder = Holder::start(&server, "permits", "partner-api");
    let client = LockClient::connect(&server.url()).await.unwrap();
    let full = client
        .semaphore("partner-api", 2)
        .acquire()
        .await
        .expect_err("both permits are taken");
    assert!(full.is_busy(), "{full}");
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            let permit = client
                .semaphore("partner-api", 2)
                .wait(Duration::from_secs(20))
                .lease(Duration::from_secs(10))
                .acquire()
                .await;
            (permit, Instant::now())
        }
    });
    // Alive, the holder keeps its permits past their lease.
    tokio::time::sleep(2 * LEASE).await;
    assert!(
        !waiter.is_finished(),
        "a third holder got in beside the 2 permits"
    );

    let measured_at = Instant::now();
    let lease_left = pttl(&server, "partner-api");
    let killed_at = holder.kill();
    let (first, freed_at) = waiter.await.unwrap();
    let first = first.expect("a permit returns at the dead holder's lease end");
    assert_freed_at_lease_end(
        "the dead holder's permit",
        measured_at,
        lease_left,
        killed_at,
        freed_at,
        LEASE,
    );
    // Its other permit came back too; the semaphore still counts 2.
    let second = client
        .semaphore("partner-api", 2)
        .wait(Duration::from_secs(3))
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the dead holder's second permit returned");
    let third = client
        .semaphore("partner-api", 2)
        .acquire()
        .await
        .expect_err("2 permits are held again");
    assert!(third.is_busy(), "{third}");
    let dead_max = *holder.tokens.iter().max().unwrap();
    assert!(first.fencing_token() > dead_max && second.fencing_token() > dead_max);
    first.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(
        keys(&server),
        ["redlock:fence"],
        "nothing is left once no permit is held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_its_lease() {
    let server = RedisServer::start();
    let mut leader = Holder::start(&server, "leader", "scheduler");
    let old_term = leader.tokens[0];
    let observer = LockClient::connect(&server.url()).await.unwrap();
    let election = observer.election("scheduler");
    let info = election.leader().await.unwrap().expect("a leader");
    assert_eq!(info.holder(), "leader-child");
    assert_eq!(info.fencing_token(), old_term);

    // Two candidates campaign; each reports when it is elected.
    let (elected, mut elections) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for name in ["candidate-b", "candidate-c"] {
        let client = short_lease_client(&server, name, LEADER_LEASE, LEADER_RENEW).await;
        let elected = elected.clone();
        candidates.push(tokio::spawn(async move {
            let term = client.election("scheduler").campaign().await;
            let _ = elected.send((client.name().to_owned(), term, Instant::now()));
        }));
    }
    // The live leader keeps leading past its lease.
    tokio::time::sleep(LEADER_LEASE * 5 / 2).await;
    assert!(
        elections.try_recv().is_err(),
        "a candidate was elected beside a live leader"
    );

    let measured_at = Instant::now();
    let lease_left = pttl(&server, "scheduler");
    let killed_at = leader.kill();
    let (winner, term, elected_at) =
        tokio::time::timeout(LEADER_LEASE + 2 * BOUND, elections.recv())
            .await
            .expect("a candidate is elected after the leader's death")
            .unwrap();
    let term = term.expect("elected");
    assert_freed_at_lease_end(
        "the dead leader's term",
        measured_at,
        lease_left,
        killed_at,
        elected_at,
        LEADER_LEASE,
    );
    assert!(
        term.fencing_token() > old_term,
        "the new term {} is not above the dead leader's {old_term}",
        term.fencing_token()
    );
    let info = election.leader().await.unwrap().expect("a leader");
    assert_eq!(info.holder(), winner);
    assert_eq!(info.fencing_token(), term.fencing_token());

    // One leader at a time: the other candidate waits while the winner leads (its
    // watchdog renews it past its lease).
    tokio::time::sleep(LEADER_LEASE * 2).await;
    assert!(
        elections.try_recv().is_err(),
        "two candidates were elected at once"
    );
    assert!(!term.is_lost());

    // The winner resigns: the other is elected at once, in a later term.
    let first_term = term.fencing_token();
    term.release().await.unwrap();
    let (next, next_term, _) = tokio::time::timeout(BOUND, elections.recv())
        .await
        .expect("the other candidate is elected when the winner resigns")
        .unwrap();
    let next_term = next_term.expect("elected");
    assert_ne!(next, winner);
    assert!(next_term.fencing_token() > first_term);
    let info = election.leader().await.unwrap().expect("a leader");
    assert_eq!(info.holder(), next);
    next_term.release().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
    for candidate in candidates {
        candidate.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_key_is_deleted_learns_it_lost() {
    let server = RedisServer::start();
    let a = short_lease_client(&server, "leader-a", LEADER_LEASE, LEADER_RENEW).await;
    let b = short_lease_client(&server, "leader-b", LEADER_LEASE, LEADER_RENEW).await;
    let term = a.election("scheduler").campaign().await.unwrap();
    assert_eq!(server.cli(&["DEL", "scheduler"]), "1");
    let deleted_at = Instant::now();
    tokio::time::timeout(LEADER_LEASE + BOUND, term.lost())
        .await
        .expect("the leader learns it lost its lease");
    println!(
        "the leader learned it lost {:?} after its key was deleted",
        deleted_at.elapsed()
    );
    assert!(term.is_lost());

    let next = b
        .election("scheduler")
        .wait(Duration::from_secs(5))
        .campaign()
        .await
        .expect("another candidate is elected");
    assert!(next.fencing_token() > term.fencing_token());
    let info = a
        .election("scheduler")
        .leader()
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(info.holder(), "leader-b");
    let resigned = term.release().await.expect_err("the old term was lost");
    assert!(resigned.is_lost(), "{resigned}");
    // The lost term's release left the new leader alone.
    assert!(!next.is_lost());
    assert_eq!(
        a.election("scheduler")
            .leader()
            .await
            .unwrap()
            .map(|info| info.fencing_token()),
        Some(next.fencing_token())
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_by_a_paused_redis_learns_it_lost() {
    let server = RedisServer::start();
    let a = short_lease_client(&server, "leader-a", LEADER_LEASE, LEADER_RENEW).await;
    let b = short_lease_client(&server, "leader-b", LEADER_LEASE, LEADER_RENEW).await;
    let term = a.election("scheduler").campaign().await.unwrap();
    // Renewed past its lease while Redis answers.
    tokio::time::sleep(LEADER_LEASE * 2).await;
    assert!(!term.is_lost());

    server.pause();
    let paused_at = Instant::now();
    let learned = tokio::time::timeout(LEADER_LEASE + BOUND, term.lost()).await;
    let after = paused_at.elapsed();
    // Redis's clock runs on while it is stopped: the lease is over there too.
    tokio::time::sleep(LEADER_LEASE.saturating_sub(after) + Duration::from_millis(200)).await;
    server.resume();
    learned.expect("the leader learns it lost its lease while Redis does not answer");
    println!("the leader learned it lost {after:?} after Redis was paused");
    assert!(term.is_lost());

    let next = b
        .election("scheduler")
        .wait(Duration::from_secs(5))
        .campaign()
        .await
        .expect("another candidate is elected once Redis answers again");
    assert!(next.fencing_token() > term.fencing_token());
    let info = b
        .election("scheduler")
        .leader()
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(info.holder(), "leader-b");
    let resigned = term.release().await.expect_err("the old term was lost");
    assert!(resigned.is_lost(), "{resigned}");
    assert!(!next.is_lost());
    next.release().await.unwrap();
}
