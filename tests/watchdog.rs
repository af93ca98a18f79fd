//! The watchdog: a lock without a fixed lease is renewed for as long as its guard lives,
//! a dropped guard is released in the background, and a lock deleted behind the
//! holder's back is reported lost within a renewal interval.

mod common;

use std::time::{Duration, Instant};

use common::{client, raw};
use redis::AsyncCommands;
use redlock_runtime::LockClient;
use redlock_testkit::RedisServer;

#[tokio::test]
async fn the_watchdog_keeps_a_lock_past_three_leases_and_drop_releases_it() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(300))
        .renew_every(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let other = client(&server).await;
    let guard = holder.lock("watched").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!guard.is_lost());
    let ttl: i64 = raw(&server).await.pttl("watched").await.unwrap();
    assert!(ttl > 0 && ttl <= 300, "pttl {ttl}");
    assert!(
        other
            .lock("watched")
            .acquire()
            .await
            .unwrap_err()
            .is_timeout()
    );
    assert_eq!(holder.watched_locks(), 1);
    drop(guard);
    // Dropped, not released: the background release frees it long before the lease.
    let next = other
        .lock("watched")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    assert_eq!(holder.watched_locks(), 0);
    next.release().await.unwrap();
}

#[tokio::test]
async fn lost_fires_within_a_renew_interval_when_the_key_is_deleted() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(3))
        .renew_every(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let guard = holder.lock("deleted").acquire().await.unwrap();
    let _: () = raw(&server).await.del("deleted").await.unwrap();
    let deleted_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() never fired");
    // One renew interval, plus scheduling slack; far below the 3 s lease.
    assert!(
        deleted_at.elapsed() < Duration::from_millis(1500),
        "{:?}",
        deleted_at.elapsed()
    );
    assert!(guard.is_lost());
    assert!(guard.release().await.unwrap_err().is_lost());
}
