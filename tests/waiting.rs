//! Waiting for a held lock: a waiter wakes on the release, not at the lease's end; a
//! holder stuck past its lease does not hold up the next turn in its own client; an
//! acquire dropped while it waits leaves no lock behind.

mod common;

use std::time::Duration;

use common::{client, next_owner_delay};
use redlock_testkit::RedisServer;

#[tokio::test]
async fn a_waiter_wakes_on_the_release_not_at_the_lease_end() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter_client = client(&server).await;
    let guard = holder
        .lock("wake")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let delay = next_owner_delay(guard, waiter_client).await;
    // Woken by the notification: milliseconds, where a poll or the lease would be seconds.
    assert!(
        delay < Duration::from_millis(500),
        "waiter woke {delay:?} after the release"
    );
}

#[tokio::test]
async fn a_holder_stuck_past_its_lease_does_not_block_its_own_clients_waiters() {
    let server = RedisServer::start();
    let client = client(&server).await;
    // The guard lives on (its task is stuck) and still has its turn in this client, but
    // its 300 ms lease has run out.
    let stuck = client
        .lock("stuck")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let next = client
        .lock("stuck")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a waiter of the same client was blocked by an expired holder");
    assert!(stuck.is_lost());
    assert!(next.fencing_token() > stuck.fencing_token());
    assert!(stuck.release().await.unwrap_err().is_lost());
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_dropped_acquire_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let client = client(&server).await;
    for micros in [0u64, 20, 50, 100, 200, 400, 800] {
        let attempt = client
            .lock("cancelled")
            .lease(Duration::from_secs(60))
            .acquire();
        let _ = tokio::time::timeout(Duration::from_micros(micros), attempt).await;
        // Whatever the attempt managed, the key is free again long before its 60 s lease.
        let guard = client
            .lock("cancelled")
            .wait(Duration::from_secs(5))
            .lease(Duration::from_secs(1))
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
}
