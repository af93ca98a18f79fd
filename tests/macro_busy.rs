//! `on_busy = "skip"` and the error predicates a handler branches on, against a real
//! redis-server: a scheduled job that finds the lock taken returns `Ok(None)` without
//! running its body; `is_busy` / `is_unavailable` tell a busy lock from a Redis outage.
//!
//! Written as a user tests their own annotated functions: the server comes from
//! `redlock_runtime::test_util` (feature `test-util`), the client is passed in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlock_runtime::test_util::RedisServer;
use redlock_runtime::{LockClient, LockError, distributed_lock};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(key = "draw:<day>", client = locks, on_busy = "skip", lease = "10s")]
async fn draw(locks: &LockClient, day: u32) -> Result<Option<u32>, LockError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Some(day))
}

#[distributed_lock(key = "plain:<day>", client = locks, lease = "10s")]
async fn plain(locks: &LockClient, day: u32) -> Result<u32, LockError> {
    Ok(day)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_skips_the_body_and_returns_none() {
    let server = RedisServer::start().unwrap();
    let locks = server.client().await.unwrap();
    let other = server.client().await.unwrap();

    // Free: the body runs.
    assert_eq!(draw(&locks, 1).await.unwrap(), Some(1));
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);

    // Held by another instance: `Ok(None)`, the body does not run, nothing is left behind.
    let held = other
        .lock("draw:2")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert_eq!(draw(&locks, 2).await.unwrap(), None);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran");
    assert_eq!(locks.active_keys(), 0);

    // Without `skip`, the same situation is an error that says it is busy.
    let held_plain = other
        .lock("plain:2")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let error = plain(&locks, 2).await.unwrap_err();
    assert!(error.is_busy() && !error.is_unavailable(), "{error}");

    held.release().await.unwrap();
    held_plain.release().await.unwrap();
    assert_eq!(draw(&locks, 2).await.unwrap(), Some(2));
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_unavailable_not_busy_even_with_skip() {
    let server = RedisServer::start().unwrap();
    let locks = LockClient::builder(&server.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    drop(server);
    // `skip` is for a busy lock only: an outage is still an error, and says so.
    let error = draw(&locks, 3).await.unwrap_err();
    assert!(error.is_unavailable() && !error.is_busy(), "{error:?}");
    let error = plain(&locks, 3).await.unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
}

#[test]
fn predicates_sort_every_kind_of_error() {
    let busy = LockError::Timeout {
        key: "k".into(),
        waited: Duration::ZERO,
    };
    assert!(busy.is_busy() && !busy.is_unavailable());
    let lost = LockError::Lost { key: "k".into() };
    assert!(!lost.is_busy() && !lost.is_unavailable());
    let quorum = LockError::NoQuorum {
        key: "k".into(),
        reached: 1,
        needed: 2,
        sitting_out: Vec::new(),
    };
    assert!(quorum.is_unavailable() && !quorum.is_busy());
    let bad = LockError::InvalidKey {
        key: String::new(),
        reason: "empty".into(),
    };
    assert!(!bad.is_unavailable() && !bad.is_busy());
}

#[distributed_lock(key = "user:<name>", client = locks, lease = "10s")]
async fn per_user(locks: &LockClient, name: &str) -> Result<String, LockError> {
    Ok(redlock_runtime::current_lock().unwrap().key().to_owned())
}

/// Documented: a placeholder that formats to "" is not refused; the key is `user:`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_placeholder_locks_the_key_without_it() {
    let server = RedisServer::start().unwrap();
    let locks = server.client().await.unwrap();
    assert_eq!(per_user(&locks, "").await.unwrap(), "user:");
    assert_eq!(per_user(&locks, "ann").await.unwrap(), "user:ann");
}
