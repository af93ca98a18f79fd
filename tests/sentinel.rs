//! A replicated primary behind Redis Sentinel: replica confirmation, and a lock that
//! survives a sentinel-driven failover.

use std::time::Duration;

use redlock_runtime::{LockClient, LockError};
use redlock_testkit::SentinelSetup;
use redlock_testkit::sentinel::SERVICE;

async fn confirming_client(setup: &SentinelSetup, replicas: usize) -> LockClient {
    LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        .confirm_replicas(replicas, Duration::from_millis(500))
        .response_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect through the sentinels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_lock_survives_a_failover() {
    let mut setup = SentinelSetup::start();
    let holder = confirming_client(&setup, 1).await;
    let guard = holder
        .lock("invoice:7")
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    // WAIT confirmed it: the replica has the lock before the primary dies.
    assert_eq!(setup.replica.cli(&["EXISTS", "invoice:7"]), "1");
    setup.fail_over();
    assert_eq!(
        setup.replica.cli(&["EXISTS", "invoice:7"]),
        "1",
        "the new primary lost the lock"
    );

    // A client that arrives after the failover finds the lock held on the new primary.
    let rival = LockClient::sentinel(setup.sentinel_urls(), SERVICE)
        .await
        .unwrap();
    let error = rival
        .lock("invoice:7")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");

    // The holder's client follows the new primary: extend and release work there.
    // (Its first command may hit the dead primary, then it asks the sentinels again.)
    let mut extended = guard.extend(Duration::from_secs(60)).await;
    for _ in 0..20 {
        if extended.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        extended = guard.extend(Duration::from_secs(60)).await;
    }
    extended.expect("the holder never reached the new primary");
    let first_token = guard.fencing_token();
    guard.release().await.unwrap();
    let next = rival
        .lock("invoice:7")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(
        next.fencing_token() > first_token,
        "fencing went backwards across the failover"
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn too_few_replicas_undo_the_acquisition() {
    let setup = SentinelSetup::start();
    // Two confirmations asked for, one replica exists.
    let client = confirming_client(&setup, 2).await;
    let error = client
        .lock("audit")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::NotReplicated { key, confirmed: 1, needed: 2 } if key == "audit"),
        "{error}"
    );
    assert_eq!(
        setup.primary.cli(&["EXISTS", "audit"]),
        "0",
        "the undone lock was left behind"
    );
}
