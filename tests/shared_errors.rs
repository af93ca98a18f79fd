//! Bad input to the shared primitives gets typed errors, at once, and leaves Redis as
//! it was: 0 permits, empty and reserved names, keys holding an application's values,
//! a semaphore asked for with another count or as a read lock (and the other way
//! round), and read locks and semaphores on RedLock, where the election still works.

mod common;

use std::time::{Duration, Instant};

use common::client;
use redlock_runtime::{LockClient, LockError};
use redlock_testkit::RedisServer;

const SECOND: Duration = Duration::from_secs(1);

/// Every key on the server, sorted.
fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server
        .cli(&["KEYS", "*"])
        .lines()
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_semaphore_of_zero_permits_is_invalid() {
    let server = RedisServer::start();
    let client = client(&server).await;
    for wait in [Duration::ZERO, 5 * SECOND] {
        let started = Instant::now();
        let error = client
            .semaphore("partner-api", 0)
            .wait(wait)
            .acquire()
            .await
            .expect_err("0 permits");
        assert!(
            matches!(&error, LockError::InvalidOptions { key, .. } if key == "partner-api"),
            "{error:?}"
        );
        assert!(error.to_string().contains("0 permits"), "{error}");
        assert!(started.elapsed() < 4 * SECOND, "it waited: {error}");
    }
    assert!(keys(&server).is_empty(), "{:?}", keys(&server));
}

#[tokio::test]
async fn empty_and_reserved_names_are_invalid_keys() {
    let server = RedisServer::start();
    let client = client(&server).await;
    for name in ["", "redlock:fence", "redlock:holders:doc"] {
        let invalid = |error: LockError, what: &str| {
            assert!(
                matches!(&error, LockError::InvalidKey { key, .. } if key == name),
                "{what}({name:?}): {error:?}"
            );
        };
        invalid(
            client.read_lock(name).acquire().await.unwrap_err(),
            "read_lock",
        );
        invalid(
            client.write_lock(name).acquire().await.unwrap_err(),
            "write_lock",
        );
        invalid(
            client.semaphore(name, 3).acquire().await.unwrap_err(),
            "semaphore",
        );
        let election = client.election(name).wait(SECOND);
        invalid(election.campaign().await.unwrap_err(), "campaign");
        invalid(election.leader().await.unwrap_err(), "leader");
    }
    assert!(keys(&server).is_empty(), "{:?}", keys(&server));
}

#[tokio::test]
async fn keys_holding_an_applications_values_are_not_locks() {
    let server = RedisServer::start();
    let client = client(&server).await;
    server.cli(&["RPUSH", "jobs", "a", "b"]);
    server.cli(&["HSET", "profile", "name", "ada"]);
    server.cli(&["ZADD", "scores", "1", "ada"]);
    // A plain string without expiry: no lock redlock writes looks like that.
    server.cli(&["SET", "config", "hello"]);
    for (key, found) in [
        ("jobs", "list"),
        ("profile", "hash"),
        ("scores", "zset"),
        ("config", "string"),
    ] {
        let not_a_lock = |error: LockError, what: &str| {
            assert!(
                matches!(&error, LockError::NotALock { key: k, found: f } if k == key && f == found),
                "{what}({key}): {error:?}"
            );
            assert!(error.to_string().contains(found), "{error}");
        };
        let started = Instant::now();
        // With a wait: refused at once, not waited on.
        not_a_lock(
            client
                .read_lock(key)
                .wait(5 * SECOND)
                .acquire()
                .await
                .unwrap_err(),
            "read_lock",
        );
        not_a_lock(
            client
                .semaphore(key, 3)
                .wait(5 * SECOND)
                .acquire()
                .await
                .unwrap_err(),
            "semaphore",
        );
        not_a_lock(
            client
                .write_lock(key)
                .wait(5 * SECOND)
                .acquire()
                .await
                .unwrap_err(),
            "write_lock",
        );
        let election = client.election(key).wait(5 * SECOND);
        not_a_lock(election.campaign().await.unwrap_err(), "campaign");
        assert!(
            started.elapsed() < 4 * SECOND,
            "{key}: a refusal waited for the wait"
        );
        assert!(
            election.leader().await.unwrap().is_none(),
            "{key} is no leader's"
        );
    }
    // Every value is as the application left it.
    assert_eq!(server.cli(&["LRANGE", "jobs", "0", "-1"]), "a\nb");
    assert_eq!(server.cli(&["HGET", "profile", "name"]), "ada");
    assert_eq!(server.cli(&["ZSCORE", "scores", "ada"]), "1");
    assert_eq!(server.cli(&["GET", "config"]), "hello");
    assert_eq!(server.cli(&["PTTL", "config"]), "-1");
    assert_eq!(keys(&server), ["config", "jobs", "profile", "scores"]);
}

#[tokio::test]
async fn shares_asked_for_as_another_kind_name_both_kinds() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let permit = a
        .semaphore("partner-api", 3)
        .lease(10 * SECOND)
        .acquire()
        .await
        .unwrap();
    let reader = a
        .read_lock("doc")
        .lease(10 * SECOND)
        .acquire()
        .await
        .unwrap();

    let started = Instant::now();
    let other_count = b
        .semaphore("partner-api", 5)
        .wait(5 * SECOND)
        .acquire()
        .await
        .expect_err("another count");
    assert!(
        matches!(
            &other_count,
            LockError::PermitsMismatch { key, requested: 5, existing: 3 } if key == "partner-api"
        ),
        "{other_count:?}"
    );
    let message = other_count.to_string();
    assert!(
        message.contains("5 permits") && message.contains("3 permits"),
        "{message}"
    );
    let one = b
        .semaphore("partner-api", 1)
        .acquire()
        .await
        .expect_err("another count");
    assert!(
        matches!(
            one,
            LockError::PermitsMismatch {
                requested: 1,
                existing: 3,
                ..
            }
        ),
        "{one:?}"
    );

    let read_of_semaphore = b
        .read_lock("partner-api")
        .wait(5 * SECOND)
        .acquire()
        .await
        .expect_err("a read lock on a semaphore");
    assert!(
        matches!(
            &read_of_semaphore,
            LockError::PermitsMismatch { key, requested: 0, existing: 3 } if key == "partner-api"
        ),
        "{read_of_semaphore:?}"
    );
    assert!(
        read_of_semaphore.to_string().contains("read-write lock"),
        "{read_of_semaphore}"
    );

    let semaphore_of_read = b
        .semaphore("doc", 2)
        .wait(5 * SECOND)
        .acquire()
        .await
        .expect_err("a semaphore on a read lock");
    assert!(
        matches!(
            &semaphore_of_read,
            LockError::PermitsMismatch { key, requested: 2, existing: 0 } if key == "doc"
        ),
        "{semaphore_of_read:?}"
    );
    assert!(
        started.elapsed() < 4 * SECOND,
        "a mismatch waited for the wait"
    );

    // The holders were left alone: their releases find their shares.
    assert!(!permit.is_lost() && !reader.is_lost());
    permit.release().await.unwrap();
    reader.release().await.unwrap();
    // And once free, the name may be used with another count.
    let resized = b.semaphore("partner-api", 5).acquire().await.unwrap();
    resized.release().await.unwrap();
    assert_eq!(keys(&server), ["redlock:fence"]);
}

#[tokio::test]
async fn redlock_refuses_read_locks_and_semaphores_but_elects_a_leader() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let a = LockClient::builder_for(&urls)
        .name("redlock-a")
        .connect()
        .await
        .unwrap();
    let b = LockClient::builder_for(&urls)
        .name("redlock-b")
        .connect()
        .await
        .unwrap();
    let not_available = |error: LockError, what: &str, key: &str| {
        assert!(
            matches!(&error, LockError::InvalidOptions { key: k, .. } if k == key),
            "{what}: {error:?}"
        );
        assert!(
            error.to_string().contains("not available with RedLock"),
            "{what}: {error}"
        );
    };
    not_available(
        a.read_lock("doc").acquire().await.unwrap_err(),
        "read_lock",
        "doc",
    );
    not_available(
        a.read_lock("doc")
            .wait(5 * SECOND)
            .lease(10 * SECOND)
            .acquire()
            .await
            .unwrap_err(),
        "read_lock with a wait",
        "doc",
    );
    not_available(
        a.semaphore("partner-api", 2).acquire().await.unwrap_err(),
        "semaphore",
        "partner-api",
    );
    // Nothing was sent: no master has anything but the restart marker the test kit
    // wrote.
    for server in &servers {
        assert_eq!(keys(server), ["redlock:boot"]);
    }

    // The election is an exclusive lock: RedLock runs it.
    let election = a.election("scheduler");
    let term = election.campaign().await.expect("elected on RedLock");
    let info = b
        .election("scheduler")
        .leader()
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(info.holder(), "redlock-a");
    assert_eq!(info.fencing_token(), term.fencing_token());
    let rival = b
        .election("scheduler")
        .wait(Duration::from_millis(300))
        .campaign()
        .await
        .expect_err("one leader at a time");
    assert!(rival.is_busy(), "{rival}");
    let first = term.fencing_token();
    term.release().await.unwrap();
    let next = b
        .election("scheduler")
        .wait(5 * SECOND)
        .campaign()
        .await
        .unwrap();
    assert!(next.fencing_token() > first);
    assert_eq!(
        election
            .leader()
            .await
            .unwrap()
            .map(|info| info.holder().to_owned()),
        Some("redlock-b".to_owned())
    );
    next.release().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
}
