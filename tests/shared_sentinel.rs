//! The shared primitives through Redis Sentinel: read-write sharing and exclusion, the
//! semaphore's limit and the election on the primary the sentinels name; and, with
//! replica confirmation, a reader's share and a permit that survive a failover to the
//! confirmed replica (the new primary still refuses a writer and a permit too many).

use std::time::Duration;

use redlock_runtime::{LockClient, LockGuard};
use redlock_testkit::SentinelSetup;
use redlock_testkit::sentinel::SERVICE;

const SECOND: Duration = Duration::from_secs(1);

async fn sentinel_client(setup: &SentinelSetup, name: &str) -> LockClient {
    LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        .name(name)
        .connect()
        .await
        .expect("connect through the sentinels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shared_primitive_works_through_sentinel() {
    let setup = SentinelSetup::start();
    let a = sentinel_client(&setup, "sentinel-a").await;
    let b = sentinel_client(&setup, "sentinel-b").await;

    // Readers share; a writer waits for both and its token is above theirs.
    let first = a
        .read_lock("doc")
        .lease(10 * SECOND)
        .acquire()
        .await
        .unwrap();
    let second = b
        .read_lock("doc")
        .lease(10 * SECOND)
        .acquire()
        .await
        .unwrap();
    assert_eq!(setup.primary.cli(&["GET", "doc"]), "shared:0");
    let busy = b
        .write_lock("doc")
        .acquire()
        .await
        .expect_err("readers hold it");
    assert!(busy.is_busy(), "{busy}");
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.write_lock("doc").wait(10 * SECOND).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = a
        .read_lock("doc")
        .acquire()
        .await
        .expect_err("a writer waits");
    assert!(late.is_busy(), "{late}");
    let readers_max = first.fencing_token().max(second.fencing_token());
    first.release().await.unwrap();
    second.release().await.unwrap();
    let write = tokio::time::timeout(2 * SECOND, writer)
        .await
        .expect("woken by the last reader's release")
        .unwrap()
        .unwrap();
    assert!(write.fencing_token() > readers_max);
    write.release().await.unwrap();

    // The semaphore: 2 permits, a third waits until one is freed.
    let mut permits = vec![
        a.semaphore("partner-api", 2).acquire().await.unwrap(),
        b.semaphore("partner-api", 2).acquire().await.unwrap(),
    ];
    let full = a
        .semaphore("partner-api", 2)
        .acquire()
        .await
        .expect_err("2 of 2 taken");
    assert!(full.is_busy(), "{full}");
    let waiter = tokio::spawn({
        let a = a.clone();
        async move {
            a.semaphore("partner-api", 2)
                .wait(5 * SECOND)
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    permits.pop().unwrap().release().await.unwrap();
    permits.push(
        tokio::time::timeout(2 * SECOND, waiter)
            .await
            .expect("a freed permit wakes the waiter")
            .unwrap()
            .unwrap(),
    );
    for permit in permits {
        permit.release().await.unwrap();
    }

    // The election.
    let election = b.election("scheduler");
    let term = a.election("scheduler").campaign().await.unwrap();
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.holder(), "sentinel-a");
    let rival = election
        .clone()
        .wait(Duration::from_millis(300))
        .campaign()
        .await
        .expect_err("one leader at a time");
    assert!(rival.is_busy(), "{rival}");
    let first_term = term.fencing_token();
    term.release().await.unwrap();
    let next = election.clone().wait(2 * SECOND).campaign().await.unwrap();
    assert!(next.fencing_token() > first_term);
    next.release().await.unwrap();

    let mut left: Vec<String> = setup
        .primary
        .cli(&["KEYS", "*"])
        .lines()
        .map(str::to_owned)
        .collect();
    left.sort();
    assert_eq!(left, ["redlock:fence"], "only the fencing counter is left");
}

/// Releases `guard`, retrying while the client finds its way to the new primary.
async fn release_after_failover(guard: LockGuard) {
    // Its first command may still hit the dead primary; `extend` tells when it is back.
    for _ in 0..40 {
        if guard.extend(10 * SECOND).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    guard.release().await.expect("released on the new primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_shares_survive_a_failover() {
    let mut setup = SentinelSetup::start();
    let holder = LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        // Three times 500 ms: under the suite's load a replica's acknowledgement came
        // later than that once (Valkey pass, a clean clone's run).
        .confirm_replicas(1, Duration::from_millis(1500))
        .response_timeout(2 * SECOND)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let reader = holder
        .read_lock("doc")
        .lease(60 * SECOND)
        .acquire()
        .await
        .unwrap();
    let permit = holder
        .semaphore("partner-api", 1)
        .lease(60 * SECOND)
        .acquire()
        .await
        .unwrap();
    // WAIT confirmed both before the primary dies.
    assert_eq!(setup.replica.cli(&["GET", "doc"]), "shared:0");
    assert_eq!(setup.replica.cli(&["GET", "partner-api"]), "shared:1");
    setup.fail_over();

    let rival = LockClient::sentinel(setup.sentinel_urls(), SERVICE)
        .await
        .unwrap();
    let writer = rival
        .write_lock("doc")
        .acquire()
        .await
        .expect_err("the reader's share survived the failover");
    assert!(writer.is_busy(), "{writer}");
    let second_permit = rival
        .semaphore("partner-api", 1)
        .acquire()
        .await
        .expect_err("the permit survived the failover");
    assert!(second_permit.is_busy(), "{second_permit}");
    // A second reader shares the surviving read lock.
    let other_reader = rival
        .read_lock("doc")
        .lease(10 * SECOND)
        .acquire()
        .await
        .expect("readers still share after the failover");
    assert!(other_reader.fencing_token() > reader.fencing_token());
    other_reader.release().await.unwrap();

    release_after_failover(reader).await;
    release_after_failover(permit).await;
    let write = rival
        .write_lock("doc")
        .wait(5 * SECOND)
        .acquire()
        .await
        .expect("free once the surviving reader leaves");
    write.release().await.unwrap();
}
