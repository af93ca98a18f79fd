//! Client settings: one not given follows those given (`renew_every` a third of the
//! watchdog lease, the watchdog lease at most RedLock's `max_lease`); only given
//! settings that contradict each other are refused, naming them.

mod common;

use std::time::Duration;

use common::raw;
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError};
use redlock_testkit::RedisServer;

/// The remaining lease of `key` on `server`, in ms (negative: no such key).
async fn pttl(server: &RedisServer, key: &str) -> i64 {
    raw(server).await.pttl(key).await.unwrap()
}

fn refused_naming(result: Result<LockClient, LockError>, names: &[&str]) {
    match result {
        Err(LockError::InvalidOptions { reason, .. }) => {
            for name in names {
                assert!(reason.contains(name), "{name}: {reason}");
            }
        }
        other => panic!("expected InvalidOptions naming {names:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_short_watchdog_lease_alone_is_renewed_at_a_third_of_it() {
    let server = RedisServer::start();
    // Refused before: the default renew_every (10 s) was longer than the lease.
    let client = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    assert_eq!(client.watchdog_lease(), Duration::from_secs(2));
    let guard = client.lock("short-lease").acquire().await.unwrap();
    assert!(pttl(&server, "short-lease").await <= 2_000);
    // Well past the lease: only renewals (every ~667 ms) keep the key.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(!guard.is_lost());
    let left = pttl(&server, "short-lease").await;
    assert!(left > 0 && left <= 2_000, "pttl {left}");
    guard.release().await.unwrap();
    assert_eq!(pttl(&server, "short-lease").await, -2);

    // Given together and contradicting: refused, naming both.
    refused_naming(
        LockClient::builder(&server.url())
            .watchdog_lease(Duration::from_secs(2))
            .renew_every(Duration::from_secs(10))
            .connect()
            .await,
        &["renew_every", "watchdog_lease"],
    );
}

#[tokio::test]
async fn redlock_max_lease_alone_shortens_the_watchdog_lease() {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let urls = || masters.iter().map(RedisServer::url);
    // Refused before: the default watchdog lease (30 s) was longer than max_lease.
    let client = LockClient::builder_for(urls())
        .max_lease(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    assert_eq!(client.watchdog_lease(), Duration::from_secs(10));
    let guard = client.lock("capped").acquire().await.unwrap();
    for master in &masters {
        let left = pttl(master, "capped").await;
        assert!(left > 0 && left <= 10_000, "pttl {left}");
    }
    // Past the first renewal (a third of the lease, ~3.3 s): renewed, the lease was
    // set anew. Without a renewal ~5.5 s would be left.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert!(!guard.is_lost());
    let renewed = masters_holding_above(&masters, "capped", 7_000).await;
    assert!(renewed >= 2, "renewed on {renewed} of 3 masters");
    guard.release().await.unwrap();

    // A watchdog lease alone works with RedLock too, renewed within its lease.
    let client = LockClient::builder_for(urls())
        .watchdog_lease(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let guard = client.lock("short-lease").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(!guard.is_lost());
    guard.release().await.unwrap();

    // Given together and contradicting: refused, naming both.
    refused_naming(
        LockClient::builder_for(urls())
            .max_lease(Duration::from_secs(10))
            .watchdog_lease(Duration::from_secs(30))
            .connect()
            .await,
        &["watchdog_lease", "max_lease"],
    );
    refused_naming(
        LockClient::builder_for(urls())
            .max_lease(Duration::from_secs(10))
            .renew_every(Duration::from_secs(10))
            .connect()
            .await,
        &["renew_every", "max_lease"],
    );
}

/// How many of `masters` hold `key` with more than `above` ms left.
async fn masters_holding_above(masters: &[RedisServer], key: &str, above: i64) -> usize {
    let mut count = 0;
    for master in masters {
        if pttl(master, key).await > above {
            count += 1;
        }
    }
    count
}
