//! `mode = "read"`, `mode = "write"` and `permits = N` of the attribute against a real
//! redis-server: readers overlap, a writer excludes them, a semaphore caps concurrent
//! calls, a read nested in a write re-enters and a write nested in a read is refused
//! at once. The servers come from `redlock_runtime::test_util` (feature `test-util`),
//! as in a user's own tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlock_runtime::test_util::RedisServer;
use redlock_runtime::{LockClient, LockError, distributed_lock};

static READING: AtomicUsize = AtomicUsize::new(0);
static MOST_READING: AtomicUsize = AtomicUsize::new(0);
static CALLING: AtomicUsize = AtomicUsize::new(0);
static MOST_CALLING: AtomicUsize = AtomicUsize::new(0);

fn enter(now: &AtomicUsize, most: &AtomicUsize) {
    let inside = now.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(inside, Ordering::SeqCst);
}

#[distributed_lock(key = "doc:<id>", client = locks, mode = "read", wait = "5s")]
async fn read_doc(locks: &LockClient, id: u32) -> Result<u64, LockError> {
    enter(&READING, &MOST_READING);
    tokio::time::sleep(Duration::from_millis(200)).await;
    READING.fetch_sub(1, Ordering::SeqCst);
    Ok(redlock_runtime::current_lock().unwrap().fencing_token())
}

#[distributed_lock(key = "doc:<id>", client = locks, mode = "write", wait = "5s")]
async fn write_doc(locks: &LockClient, id: u32) -> Result<u64, LockError> {
    assert_eq!(READING.load(Ordering::SeqCst), 0, "a reader inside a write");
    // A read of the same key inside the write re-enters (no round trip, no wait).
    let nested = read_doc(locks, id).await?;
    let token = redlock_runtime::current_lock().unwrap().fencing_token();
    assert_eq!(nested, token, "the nested read runs under the write");
    Ok(token)
}

#[distributed_lock(key = "doc:<id>", client = locks, mode = "read", wait = "5s")]
async fn read_then_write(locks: &LockClient, id: u32) -> Result<u64, LockError> {
    write_doc(locks, id).await
}

#[distributed_lock(key = "partner", client = locks, permits = 2, wait = "10s", lease = "10s")]
async fn call_partner(locks: &LockClient) -> Result<(), LockError> {
    enter(&CALLING, &MOST_CALLING);
    tokio::time::sleep(Duration::from_millis(100)).await;
    CALLING.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_overlap_and_a_nested_read_reenters_a_write() {
    let server = RedisServer::start().unwrap();
    let a = server.client().await.unwrap();
    let b = server.client().await.unwrap();
    let readers: Vec<_> = (0..4)
        .map(|n| {
            let client = if n % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { read_doc(&client, 1).await })
        })
        .collect();
    for reader in readers {
        reader.await.unwrap().unwrap();
    }
    assert!(
        MOST_READING.load(Ordering::SeqCst) >= 2,
        "readers never overlapped"
    );
    let written = write_doc(&a, 1).await.unwrap();
    assert!(written > 0);
    assert_eq!(a.active_keys(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_inside_a_read_of_the_same_key_fails_at_once() {
    let server = RedisServer::start().unwrap();
    let a = server.client().await.unwrap();
    let started = std::time::Instant::now();
    let refused = read_then_write(&a, 2)
        .await
        .expect_err("would wait for itself");
    assert!(
        matches!(refused, LockError::WouldDeadlock { ref key } if key == "doc:2"),
        "{refused}"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "it waited");
    // Nothing is left: the read was released.
    let free = a.write_lock("doc:2").acquire().await.expect("free");
    free.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_cap_concurrent_calls() {
    let server = RedisServer::start().unwrap();
    let a = server.client().await.unwrap();
    let b = server.client().await.unwrap();
    let calls: Vec<_> = (0..8)
        .map(|n| {
            let client = if n % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { call_partner(&client).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(
        MOST_CALLING.load(Ordering::SeqCst),
        2,
        "at most 2, and 2 reached"
    );
}
