//! A stream of readers does not starve a writer: readers of three processes arrive back
//! to back and keep the key held all the time (the control), yet a writer that starts
//! waiting gets the lock within a bounded wait, every time; and a write handed to a
//! reader of its own client while another client's writer waits is released, not lost.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, raw};
use redis::AsyncCommands;
use redlock_runtime::LockClient;
use redlock_testkit::RedisServer;

/// The child test `a_stream_of_readers_does_not_starve_a_writer` runs in each reader
/// process: keep it equal to the function's name.
const READERS_CHILD: &str = "child_reads_back_to_back";

const KEY: &str = "config";
const READER_PROCESSES: usize = 3;
const READERS_PER_PROCESS: usize = 4;
/// How long each reader holds its share.
const READ_HOLD: Duration = Duration::from_millis(150);
/// How long a writer may wait: a few reader holds (a waiting writer needs only the
/// readers already in to leave), with room for a loaded machine.
const WRITER_BOUND: Duration = Duration::from_millis(10 * 150);

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

/// Run by `a_stream_of_readers_does_not_starve_a_writer` in each reader process: its
/// readers take `KEY` back to back, each holding it for `READ_HOLD`, until the key
/// `stop` exists; every read counts in `reads`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_reads_back_to_back() {
    let Ok(url) = std::env::var("REDLOCK_TEST_CHILD_URL") else {
        return;
    };
    let index: usize = std::env::var("REDLOCK_TEST_CHILD_INDEX")
        .unwrap()
        .parse()
        .unwrap();
    let client = LockClient::connect(&url).await.unwrap();
    let tasks: Vec<_> = (0..READERS_PER_PROCESS)
        .map(|task| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                let mut redis = redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                // Staggered over one hold, across every reader of every process: a
                // reader arrives every READ_HOLD / 12.
                let slot = (task * READER_PROCESSES + index) as u32;
                let all = (READER_PROCESSES * READERS_PER_PROCESS) as u32;
                tokio::time::sleep(READ_HOLD * slot / all).await;
                loop {
                    let stop: bool = redis.exists("stop").await.unwrap();
                    if stop {
                        break;
                    }
                    let reader = client
                        .read_lock(KEY)
                        .wait(Duration::from_secs(60))
                        .lease(Duration::from_secs(10))
                        .acquire()
                        .await
                        .expect("a reader gets in within the wait");
                    tokio::time::sleep(READ_HOLD).await;
                    reader.release().await.expect("released within its lease");
                    let _: () = redis.incr("reads", 1).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a reader task failed");
    }
}

/// Samples whether `KEY` exists every few ms for `window`: the share of samples that
/// found it held.
async fn held_fraction(redis: &mut redis::aio::MultiplexedConnection, window: Duration) -> f64 {
    let (mut held, mut samples) = (0u32, 0u32);
    let until = Instant::now() + window;
    while Instant::now() < until {
        let exists: bool = redis.exists(KEY).await.unwrap();
        samples += 1;
        held += exists as u32;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    f64::from(held) / f64::from(samples)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_readers_does_not_starve_a_writer() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    let children: Vec<ChildProcess> = (0..READER_PROCESSES)
        .map(|index| {
            ChildProcess(
                Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", READERS_CHILD, "--nocapture", "--test-threads=1"])
                    .env("REDLOCK_TEST_CHILD_URL", server.url())
                    .env("REDLOCK_TEST_CHILD_INDEX", index.to_string())
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    // Until every process reads.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reads: Option<u64> = redis.get("reads").await.unwrap();
        if reads.unwrap_or(0) >= (READER_PROCESSES * READERS_PER_PROCESS) as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "the readers never got going");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The control: without a writer waiting, the readers keep the key held throughout,
    // so a writer that waited for a free key would wait for ever.
    let control = held_fraction(&mut redis, Duration::from_secs(3)).await;
    println!(
        "control: the key was held in {:.1} % of samples over 3 s",
        control * 100.0
    );
    assert!(
        control >= 0.95,
        "the reader stream left the key free too often ({:.1} % held): no control",
        control * 100.0
    );

    let writer = client(&server).await;
    let mut waits = Vec::new();
    for round in 0..5 {
        let reads_before: u64 = redis.get("reads").await.unwrap();
        let asked = Instant::now();
        let write = writer
            .write_lock(KEY)
            .wait(Duration::from_secs(30))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .expect("the writer gets in while readers keep arriving");
        let waited = asked.elapsed();
        println!("round {round}: the writer waited {waited:?}");
        waits.push(waited);
        // While it writes, no reader holds a share: the key is the writer's own lock.
        let value: String = redis.get(KEY).await.unwrap();
        assert!(
            !value.starts_with("shared:"),
            "a writer holds a key held in shares: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        write.release().await.expect("released within its lease");
        // The readers come back at once, and the stream fills up again.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let reads_after: u64 = redis.get("reads").await.unwrap();
        assert!(
            reads_after > reads_before,
            "the readers did not come back after the write"
        );
        let refilled = held_fraction(&mut redis, Duration::from_millis(300)).await;
        assert!(
            refilled >= 0.9,
            "the reader stream did not resume after the write ({:.1} % held)",
            refilled * 100.0
        );
    }
    let longest = waits.iter().max().copied().unwrap();
    println!(
        "the writer's longest wait: {longest:?} (bound {WRITER_BOUND:?}, reader hold {READ_HOLD:?})"
    );
    assert!(
        longest <= WRITER_BOUND,
        "a writer waited {longest:?} for a stream of readers (bound {WRITER_BOUND:?})"
    );

    let _: () = redis.set("stop", 1).await.unwrap();
    for mut child in children {
        let status = child.0.wait().unwrap();
        assert!(status.success(), "a reader process failed: {status}");
    }
    let mut keys: Vec<String> = redis.keys("*").await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        ["reads", "redlock:fence", "stop"],
        "only the counters are left"
    );
}

/// A writer releases while a reader of its own client waits in line behind it (so the
/// write is handed off to that reader) and a writer of another client waits on the
/// Redis waitlist: the write was held to the end, and its release must say so. Both
/// waiters then get in, one after the other, with tokens above the write's.
#[tokio::test]
async fn a_write_handed_to_a_local_reader_while_a_remote_writer_waits_is_released() {
    let server = RedisServer::start();
    let (local, remote) = (client(&server).await, client(&server).await);
    let lease = Duration::from_secs(10);
    let write = local
        .write_lock("doc")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    // Each waiter holds for 100 ms and releases: (token, held from, held until).
    let hold = |request: redlock_runtime::LockRequest| async move {
        let guard = request
            .wait(Duration::from_secs(10))
            .lease(lease)
            .acquire()
            .await?;
        let from = Instant::now();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (token, until) = (guard.fencing_token(), Instant::now());
        guard.release().await?;
        Ok::<_, redlock_runtime::LockError>((token, from, until))
    };
    let remote_writer = tokio::spawn(hold(remote.write_lock("doc")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let local_reader = tokio::spawn(hold(local.read_lock("doc")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = write.fencing_token();
    let released = write.release().await;

    let (writer_token, writer_from, writer_until) = remote_writer
        .await
        .unwrap()
        .expect("the remote writer gets in");
    let (reader_token, reader_from, reader_until) = local_reader
        .await
        .unwrap()
        .expect("the local reader gets in");
    assert!(writer_token > first && reader_token > first);
    assert!(
        writer_until <= reader_from || reader_until <= writer_from,
        "the remote writer and the local reader held the key at once"
    );
    released.expect("the write was held until its release, which must not say Lost");
}
