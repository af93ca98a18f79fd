//! Mutual exclusion on one server: counts kept exact by tasks of several clients and by
//! several processes, and a release that comes after the lease leaves the new owner alone.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{client, raw};
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError};
use redlock_testkit::RedisServer;

/// The test that `four_processes_keep_an_exact_count` runs in each child process (a
/// rerun of this test binary): keep it equal to that test's name.
const CHILD_TEST: &str = "child_process_increments";

/// A non-atomic read-modify-write of a Redis counter under the lock: any overlap of two
/// holders loses an increment, so the final count is exact only under mutual exclusion.
async fn locked_increments(
    client: LockClient,
    url: String,
    rounds: usize,
    in_section: Arc<AtomicUsize>,
) {
    let mut data = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for _ in 0..rounds {
        let guard = client
            .lock("counter")
            .wait(Duration::from_secs(30))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        assert_eq!(
            in_section.fetch_add(1, Ordering::SeqCst),
            0,
            "two holders at once"
        );
        let value: i64 = data.get("count").await.unwrap_or(0);
        tokio::task::yield_now().await;
        let _: () = data.set("count", value + 1).await.unwrap();
        in_section.fetch_sub(1, Ordering::SeqCst);
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_tasks_keep_an_exact_count() {
    let server = RedisServer::start();
    // Four clients, eight tasks each: contention both inside a client (its tasks take
    // turns) and between clients (on the waitlist in Redis).
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&server).await);
    }
    let in_section = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            tokio::spawn(locked_increments(
                clients[i % 4].clone(),
                server.url(),
                50,
                in_section.clone(),
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let count: i64 = raw(&server).await.get("count").await.unwrap();
    assert_eq!(count, 32 * 50);
    let left: Vec<String> = raw(&server).await.keys("counter").await.unwrap();
    assert!(left.is_empty(), "the lock key outlived its last release");
}

/// Run by `four_processes_keep_an_exact_count` in child processes; a no-op otherwise.
/// Its name is [`CHILD_TEST`].
#[tokio::test]
async fn child_process_increments() {
    let Ok(url) = std::env::var("REDLOCK_TEST_CHILD_URL") else {
        return;
    };
    let client = LockClient::connect(&url).await.unwrap();
    let in_section = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(locked_increments(
                client.clone(),
                url.clone(),
                25,
                in_section.clone(),
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn four_processes_keep_an_exact_count() {
    let server = RedisServer::start();
    // Each child reruns this test binary, with only `child_process_increments`.
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
                .env("REDLOCK_TEST_CHILD_URL", server.url())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    let count: i64 = raw(&server).await.get("count").await.unwrap();
    assert_eq!(count, 4 * 4 * 25);
}

#[tokio::test]
async fn a_stale_release_is_lost_and_leaves_the_new_owner_alone() {
    let server = RedisServer::start();
    let first = client(&server).await;
    let second = client(&server).await;
    let stale = first
        .lock("stale")
        .lease(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    let fresh = second
        .lock("stale")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(stale.is_lost());
    assert!(fresh.fencing_token() > stale.fencing_token());
    let error = stale.release().await.unwrap_err();
    assert!(
        matches!(&error, LockError::Lost { key } if key == "stale"),
        "{error}"
    );
    let ttl: i64 = raw(&server).await.pttl("stale").await.unwrap();
    assert!(ttl > 5_000, "the new owner's lock was touched: pttl {ttl}");
    fresh.release().await.unwrap();
}
