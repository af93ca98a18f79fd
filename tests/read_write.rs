//! The read-write lock on one server: readers share, a writer excludes them and is not
//! starved by a stream of readers, each reader's share has its own lease, tokens order
//! writes after reads, and nothing is left behind.

mod common;

use std::time::Duration;

use common::{client, raw};
use redis::AsyncCommands;
use redlock_runtime::LockError;
use redlock_testkit::RedisServer;

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn readers_share_and_a_writer_waits_for_them_all() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let first = a
        .read_lock("doc:7")
        .lease(10 * SECOND)
        .acquire()
        .await
        .unwrap();
    let second = b
        .read_lock("doc:7")
        .lease(10 * SECOND)
        .acquire()
        .await
        .unwrap();
    let third = a
        .read_lock("doc:7")
        .acquire()
        .await
        .expect("a second reader of the same client");
    assert!(second.fencing_token() > first.fencing_token());
    let busy = b
        .write_lock("doc:7")
        .acquire()
        .await
        .expect_err("readers hold it");
    assert!(busy.is_busy(), "{busy}");
    let plain = b
        .lock("doc:7")
        .acquire()
        .await
        .expect_err("a plain lock is the write lock");
    assert!(plain.is_busy(), "{plain}");
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.write_lock("doc:7").wait(10 * SECOND).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.unwrap();
    second.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!writer.is_finished(), "a reader is left");
    let before = third.fencing_token();
    third.release().await.unwrap();
    let written = tokio::time::timeout(2 * SECOND, writer)
        .await
        .expect("woken by the last reader's release")
        .unwrap()
        .unwrap();
    assert!(written.fencing_token() > before);
    let refused = a
        .read_lock("doc:7")
        .acquire()
        .await
        .expect_err("a writer holds it");
    assert!(refused.is_busy());
    written.release().await.unwrap();
    let mut redis = raw(&server).await;
    let keys: Vec<String> = redis.keys("*").await.unwrap();
    assert_eq!(
        keys,
        vec!["redlock:fence".to_owned()],
        "only the fencing counter is left"
    );
}

#[tokio::test]
async fn a_dead_readers_share_ends_with_its_own_lease() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    // The "dead" reader: a short fixed lease, never released (forgotten).
    let dead = a
        .read_lock("doc:1")
        .lease(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap();
    std::mem::forget(dead);
    // A live reader renewed by its watchdog.
    let live = b.read_lock("doc:1").acquire().await.unwrap();
    let started = std::time::Instant::now();
    // The writer gets in only once the live reader leaves, but the dead reader's share
    // must not outlive its 400 ms: releasing the live one after 1 s frees the key at once.
    tokio::time::sleep(SECOND).await;
    live.release().await.unwrap();
    let writer = a
        .write_lock("doc:1")
        .wait(SECOND)
        .acquire()
        .await
        .expect("free");
    assert!(started.elapsed() < 2 * SECOND);
    writer.release().await.unwrap();
}

#[tokio::test]
async fn a_waiting_writer_goes_before_new_readers() {
    let server = RedisServer::start();
    let (a, b, c) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let reader = a
        .read_lock("doc:2")
        .lease(10 * SECOND)
        .acquire()
        .await
        .unwrap();
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.write_lock("doc:2").wait(10 * SECOND).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = c
        .read_lock("doc:2")
        .acquire()
        .await
        .expect_err("a writer waits");
    assert!(late.is_busy(), "{late}");
    let late_reader = tokio::spawn({
        let c = c.clone();
        async move { c.read_lock("doc:2").wait(10 * SECOND).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    reader.release().await.unwrap();
    let written = tokio::time::timeout(2 * SECOND, writer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !late_reader.is_finished(),
        "the reader waits for the writer"
    );
    written.release().await.unwrap();
    let read = tokio::time::timeout(2 * SECOND, late_reader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    read.release().await.unwrap();
}

#[tokio::test]
async fn a_semaphore_never_lets_more_than_its_permits_in() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let mut held = Vec::new();
    for n in 0..3 {
        let c = if n % 2 == 0 { &a } else { &b };
        held.push(
            c.semaphore("api", 3)
                .lease(10 * SECOND)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let full = b
        .semaphore("api", 3)
        .acquire()
        .await
        .expect_err("3 of 3 taken");
    assert!(full.is_busy(), "{full}");
    let other = b
        .semaphore("api", 5)
        .acquire()
        .await
        .expect_err("another count");
    assert!(
        matches!(
            other,
            LockError::PermitsMismatch {
                requested: 5,
                existing: 3,
                ..
            }
        ),
        "{other}"
    );
    assert!(
        other.to_string().contains("3 permits") && other.to_string().contains("5 permits"),
        "{other}"
    );
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.semaphore("api", 3).wait(5 * SECOND).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.pop().unwrap().release().await.unwrap();
    let got = tokio::time::timeout(SECOND, waiter)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    held.push(got);
    for permit in held {
        permit.release().await.unwrap();
    }
    let mut redis = raw(&server).await;
    let keys: Vec<String> = redis.keys("*").await.unwrap();
    assert_eq!(keys, vec!["redlock:fence".to_owned()]);
    let zero = a
        .semaphore("api", 0)
        .acquire()
        .await
        .expect_err("0 permits");
    assert!(matches!(zero, LockError::InvalidOptions { .. }), "{zero}");
}

#[tokio::test]
async fn an_election_has_one_leader_and_terms_increase() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let election = a.election("scheduler");
    assert!(election.leader().await.unwrap().is_none());
    let term = election.campaign().await.unwrap();
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.holder(), a.name());
    assert_eq!(leader.fencing_token(), term.fencing_token());
    let contender = tokio::spawn({
        let b = b.clone();
        async move { b.election("scheduler").campaign().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!contender.is_finished());
    let first = term.fencing_token();
    term.release().await.unwrap();
    let next = tokio::time::timeout(SECOND, contender)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > first);
    let timed = a
        .election("scheduler")
        .wait(Duration::from_millis(100))
        .campaign()
        .await;
    assert!(timed.expect_err("b leads").is_busy());
    next.release().await.unwrap();
}

#[tokio::test]
async fn hold_at_least_keeps_a_share_after_an_early_release() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let reader = a
        .read_lock("doc:9")
        .lease(10 * SECOND)
        .hold_at_least(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let released = std::time::Instant::now();
    reader.release().await.unwrap();
    let refused = b.write_lock("doc:9").acquire().await.expect_err("kept");
    assert!(refused.is_busy(), "{refused}");
    // Another reader may still join a kept read; a writer waits for the minimum hold.
    let other = b.read_lock("doc:9").acquire().await.expect("readers share");
    other.release().await.unwrap();
    let writer = b
        .write_lock("doc:9")
        .wait(5 * SECOND)
        .acquire()
        .await
        .unwrap();
    let after = released.elapsed();
    assert!(
        after >= Duration::from_millis(550),
        "writer in after {after:?}"
    );
    assert!(after < 3 * SECOND, "writer in after {after:?}");
    writer.release().await.unwrap();

    // A semaphore's permit kept for its minimum hold still counts against the limit.
    let permit = a
        .semaphore("jobs", 1)
        .lease(10 * SECOND)
        .hold_at_least(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    permit.release().await.unwrap();
    assert!(
        b.semaphore("jobs", 1)
            .acquire()
            .await
            .unwrap_err()
            .is_busy()
    );
    let next = b
        .semaphore("jobs", 1)
        .wait(5 * SECOND)
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}

/// A lone share released at once with `hold_at_least` equal to its lease is kept for
/// nearly all of it: the lock's expiry is then already right for the kept share, and
/// the release leaves it alone. Every key of the share still expires: none is left
/// behind when its holder never comes back.
#[tokio::test]
async fn a_share_kept_for_its_whole_lease_leaves_every_key_expiring() {
    let server = RedisServer::start();
    let a = client(&server).await;
    for (key, request) in [
        ("doc:kept", a.read_lock("doc:kept")),
        ("jobs:kept", a.semaphore("jobs:kept", 2)),
    ] {
        let share = request
            .lease(10 * SECOND)
            .hold_at_least(10 * SECOND)
            .acquire()
            .await
            .unwrap();
        share.release().await.unwrap();
        for companion in [
            key.to_owned(),
            format!("redlock:holders:{key}"),
            format!("redlock:names:{key}"),
        ] {
            let pttl: i64 = server.cli(&["PTTL", &companion]).trim().parse().unwrap();
            assert!(
                pttl > 0 && pttl <= 10_000,
                "{companion} of a kept share: PTTL {pttl} (-1: it never expires)"
            );
        }
    }
}

/// A reader's share whose key was deleted by hand is gone for good, even when the key
/// later comes to another reader through a reservation (a writer took the free key
/// and released it to that reader waiting in line): the stale entry in the holders set
/// must not be revived, so the first reader's extension and release find it lost.
#[tokio::test]
async fn a_share_deleted_by_hand_does_not_come_back_through_a_reservation() {
    let server = RedisServer::start();
    let (a, b, c) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let mut redis = raw(&server).await;
    let stale = a
        .read_lock("doc:11")
        .lease(30 * SECOND)
        .acquire()
        .await
        .unwrap();
    // Deleted by hand: the holders set (which expires with the share) still names it.
    let _: () = redis.del("doc:11").await.unwrap();
    let writer = b
        .write_lock("doc:11")
        .lease(10 * SECOND)
        .acquire()
        .await
        .expect("the key is free");
    let reader = tokio::spawn(async move {
        c.read_lock("doc:11")
            .wait(10 * SECOND)
            .lease(10 * SECOND)
            .acquire()
            .await
    });
    // The reader queues behind the write; the write's release reserves the key for it.
    let deadline = std::time::Instant::now() + 10 * SECOND;
    loop {
        let line: u64 = redis.zcard("redlock:waitlist:doc:11").await.unwrap();
        if line > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reader never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writer.release().await.unwrap();
    let fresh = reader
        .await
        .unwrap()
        .expect("the reader takes its reservation");
    let holders: Vec<String> = redis.zrange("redlock:holders:doc:11", 0, -1).await.unwrap();
    assert_eq!(holders.len(), 1, "only the new reader holds: {holders:?}");
    let extended = stale.extend(30 * SECOND).await;
    assert!(
        matches!(extended, Err(LockError::Lost { .. })),
        "the deleted share came back: {extended:?}"
    );
    assert!(
        stale.release().await.is_err(),
        "the deleted share came back"
    );
    fresh
        .release()
        .await
        .expect("the new reader's share was held");
}
