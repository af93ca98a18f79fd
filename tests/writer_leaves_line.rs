//! A writer that leaves the line lets the readers behind it in. Readers prefer a waiting
//! writer (they queue behind it, see `tests/writer_preference.rs`); when that writer
//! gives up — its wait runs out, its acquisition is dropped, or its process is killed —
//! the readers queued behind it join the readers holding the key: at once when it gave
//! up, and when its waitlist registration lapses (at most 3 s after its last attempt:
//! one attempt a second while readers hold the key, plus 2 s of slack) when it died.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, raw};
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError, LockGuard};
use redlock_testkit::RedisServer;

const KEY: &str = "doc";
const WAITLIST: &str = "redlock:waitlist:doc";
/// The first reader's lease: far longer than any bound below, so that the key stays
/// held in shares throughout and nothing but the writer's departure can let R2 in.
const READ_LEASE: Duration = Duration::from_secs(20);
/// How long the second reader is willing to wait: before the fix it waited all of it.
const R2_WAIT: Duration = Duration::from_secs(12);
/// How soon after the writer gave up the second reader must be in (it is told at once;
/// the rest is room for a loaded machine).
const GAVE_UP_BOUND: Duration = Duration::from_secs(2);
/// How soon after the writer's process was killed the second reader must be in: its
/// registration lapses at most 3 s after its last attempt, then the reader retries.
const KILLED_BOUND: Duration = Duration::from_secs(6);

/// The child test `readers_get_in_soon_after_a_waiting_writer_is_killed` runs in its
/// writer process: keep it equal to the function's name.
const WRITER_CHILD: &str = "child_waits_to_write";

/// A child process, killed if the test ends before it does.
struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Run by `readers_get_in_soon_after_a_waiting_writer_is_killed` in the writer's
/// process: waits to write `KEY` for a minute (until killed).
#[tokio::test]
async fn child_waits_to_write() {
    let Ok(url) = std::env::var("REDLOCK_TEST_CHILD_URL") else {
        return;
    };
    let client = LockClient::connect(&url).await.unwrap();
    let _ = client
        .write_lock(KEY)
        .wait(Duration::from_secs(60))
        .lease(Duration::from_secs(5))
        .acquire()
        .await;
}

/// R1 holds a share of `KEY` with a long lease.
async fn first_reader(server: &RedisServer) -> (LockClient, LockGuard) {
    let r1 = client(server).await;
    let guard = r1.read_lock(KEY).lease(READ_LEASE).acquire().await.unwrap();
    (r1, guard)
}

/// Waits until a waiter of the kind `reader` says (readers' ids start with `r:`) is on
/// the waitlist.
async fn queued(redis: &mut redis::aio::MultiplexedConnection, reader: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line: Vec<String> = redis.zrange(WAITLIST, 0, -1).await.unwrap();
        if line.iter().any(|id| id.starts_with("r:") == reader) {
            return;
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until a writer is on the waitlist.
async fn writer_in_line(redis: &mut redis::aio::MultiplexedConnection) {
    queued(redis, false).await
}

/// A writer in a process of its own, waiting to write `KEY` (see `child_waits_to_write`).
fn writer_process(server: &RedisServer) -> ChildProcess {
    ChildProcess(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", WRITER_CHILD, "--nocapture", "--test-threads=1"])
            .env("REDLOCK_TEST_CHILD_URL", server.url())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// R2 (a client of its own) asks for a share while the writer waits: it queues behind
/// the writer. Returns its task, which yields when it got in.
async fn second_reader_queues(
    server: &RedisServer,
) -> tokio::task::JoinHandle<Result<(LockGuard, Instant), LockError>> {
    let r2 = client(server).await;
    let task = tokio::spawn(async move {
        let guard = r2
            .read_lock(KEY)
            .wait(R2_WAIT)
            .lease(Duration::from_secs(10))
            .acquire()
            .await?;
        Ok((guard, Instant::now()))
    });
    // Writer preference: R2 does not join R1 while the writer waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !task.is_finished(),
        "the second reader got in past a waiting writer"
    );
    task
}

/// R2 got in, `bound` after the writer left at the latest, sharing the key with R1.
async fn second_reader_got_in(
    task: tokio::task::JoinHandle<Result<(LockGuard, Instant), LockError>>,
    left_at: Instant,
    bound: Duration,
    r1: LockGuard,
) {
    let (r2, entered) = task
        .await
        .unwrap()
        .expect("the second reader gets in once the writer left the line");
    let after = entered.saturating_duration_since(left_at);
    println!("the second reader got in {after:?} after the writer left (bound {bound:?})");
    assert!(
        after <= bound,
        "the second reader got in {after:?} after the writer left the line (bound {bound:?})"
    );
    // Both readers hold it at once: R2 joined R1's share.
    r2.release().await.expect("R2's share was held");
    r1.release().await.expect("R1's share was held");
}

#[tokio::test]
async fn readers_behind_a_writer_that_timed_out_get_in_at_once() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    let (_r1_client, r1) = first_reader(&server).await;
    let w = client(&server).await;
    let writer = tokio::spawn(async move {
        let outcome = w
            .write_lock(KEY)
            .wait(Duration::from_millis(1500))
            .lease(Duration::from_secs(5))
            .acquire()
            .await;
        (outcome, Instant::now())
    });
    writer_in_line(&mut redis).await;
    let r2 = second_reader_queues(&server).await;
    let (outcome, gave_up_at) = writer.await.unwrap();
    let error = outcome.expect_err("readers hold the key for the writer's whole wait");
    assert!(matches!(error, LockError::Timeout { .. }), "{error}");
    second_reader_got_in(r2, gave_up_at, GAVE_UP_BOUND, r1).await;
}

#[tokio::test]
async fn readers_behind_a_writer_whose_acquisition_was_dropped_get_in_at_once() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    let (_r1_client, r1) = first_reader(&server).await;
    let w = client(&server).await;
    let writer = tokio::spawn(async move {
        w.write_lock(KEY)
            .wait(Duration::from_secs(60))
            .lease(Duration::from_secs(5))
            .acquire()
            .await
    });
    writer_in_line(&mut redis).await;
    let r2 = second_reader_queues(&server).await;
    // Cancelled: the acquisition's future is dropped mid-wait.
    writer.abort();
    let cancelled_at = Instant::now();
    assert!(writer.await.unwrap_err().is_cancelled());
    second_reader_got_in(r2, cancelled_at, GAVE_UP_BOUND, r1).await;
}

#[tokio::test]
async fn readers_get_in_soon_after_a_waiting_writer_is_killed() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    let (_r1_client, r1) = first_reader(&server).await;
    let mut writer = writer_process(&server);
    writer_in_line(&mut redis).await;
    let r2 = second_reader_queues(&server).await;
    // SIGKILL: the writer leaves nothing behind but its waitlist registration.
    writer.0.kill().unwrap();
    writer.0.wait().unwrap();
    let killed_at = Instant::now();
    second_reader_got_in(r2, killed_at, KILLED_BOUND, r1).await;
}

/// The writer queued while a write lock held the key, so its registration was made for
/// that lock's whole lease; the key then went to a reader waiting ahead of it, and the
/// writer's process was killed. Readers arriving behind it still get in within the
/// same bound, not at the end of the write lock's lease.
#[tokio::test]
async fn readers_get_in_soon_after_a_writer_killed_while_queued_behind_a_write() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    let w0 = client(&server).await;
    let write = w0
        .write_lock(KEY)
        .lease(READ_LEASE)
        .acquire()
        .await
        .unwrap();
    // R1 queues first, behind the write lock.
    let r1_client = client(&server).await;
    let r1 = tokio::spawn(async move {
        r1_client
            .read_lock(KEY)
            .wait(Duration::from_secs(30))
            .lease(READ_LEASE)
            .acquire()
            .await
    });
    queued(&mut redis, true).await;
    let mut writer = writer_process(&server);
    writer_in_line(&mut redis).await;
    writer.0.kill().unwrap();
    writer.0.wait().unwrap();
    let killed_at = Instant::now();
    // The write's release reserves the key for R1, first in line: readers hold it now.
    write.release().await.unwrap();
    let r1 = r1.await.unwrap().expect("R1 takes its reservation");
    let r2 = client(&server).await;
    let (r2, entered) = tokio::spawn(async move {
        let guard = r2
            .read_lock(KEY)
            .wait(R2_WAIT)
            .lease(Duration::from_secs(10))
            .acquire()
            .await?;
        Ok::<_, LockError>((guard, Instant::now()))
    })
    .await
    .unwrap()
    .expect("the second reader gets in once the dead writer's registration lapsed");
    let after = entered.saturating_duration_since(killed_at);
    println!(
        "the second reader got in {after:?} after the writer was killed (bound {KILLED_BOUND:?})"
    );
    assert!(
        after <= KILLED_BOUND,
        "the second reader got in {after:?} after the writer was killed (bound {KILLED_BOUND:?})"
    );
    r2.release().await.expect("R2's share was held");
    r1.release().await.expect("R1's share was held");
}
