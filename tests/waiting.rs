//! Waiting for a held lock: a waiter wakes on the release, not at the lease's end (and
//! only a lock some attempt found busy is released with a message); a holder stuck past
//! its lease does not hold up the next turn in its own client, even after the waiter
//! that watched it gave up, or when the lock was handed to it by another task; an
//! acquire dropped while it waits leaves no lock behind; a lease cut short by `extend`
//! is announced, so a holder that then dies costs its waiters only that lease.

mod common;

use std::time::Duration;

use common::{client, command_calls, next_owner_delay, raw};
use redis::AsyncCommands;
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

/// A lock nobody found busy is released without a message (no one can be listening for
/// it); one that a waiter found busy is marked contended, and its release reaches the
/// waiter at once.
#[tokio::test]
async fn only_a_lock_someone_found_busy_is_released_with_a_message() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter_client = client(&server).await;
    let before = command_calls(&server, "publish");
    for _ in 0..20 {
        let guard = holder.lock("quiet").acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    assert_eq!(
        command_calls(&server, "publish"),
        before,
        "an uncontended release published"
    );

    let guard = holder
        .lock("busy")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let mut redis = raw(&server).await;
    let value: String = redis.get("busy").await.unwrap();
    assert!(
        !value.contains("~ "),
        "contended before anyone waited: {value}"
    );
    let waiting = tokio::spawn(async move {
        waiter_client
            .lock("busy")
            .wait(Duration::from_secs(15))
            .acquire()
            .await
    });
    // The waiter's first attempt finds the lock busy and marks it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let value: String = redis.get("busy").await.unwrap();
        if value.contains("~ ") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never contended: {value}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let contended_at = command_calls(&server, "publish");
    guard.release().await.unwrap();
    // Woken by the message: far sooner than the 20 s lease.
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter slept through a contended release")
        .unwrap()
        .unwrap();
    assert!(command_calls(&server, "publish") > contended_at);
    assert!(next.fencing_token() > 0);
    next.release().await.unwrap();
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
async fn a_waiter_that_gives_up_passes_the_watch_over_a_stuck_holder_on() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let stuck = client
        .lock("stuck-watch")
        .lease(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap();
    // The first waiter watches the holder's lease on behalf of all, then gives up.
    let first = tokio::spawn(
        client
            .lock("stuck-watch")
            .wait(Duration::from_millis(100))
            .acquire(),
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn(
        client
            .lock("stuck-watch")
            .wait(Duration::from_secs(5))
            .acquire(),
    );
    assert!(first.await.unwrap().unwrap_err().is_timeout());
    let next = second
        .await
        .unwrap()
        .expect("nobody watched the stuck holder's lease after the first waiter left");
    assert!(stuck.is_lost());
    assert!(next.fencing_token() > stuck.fencing_token());
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_lock_handed_off_is_watched_by_its_own_lease() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let first = client
        .lock("handed-watch")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // Lines up first (so it watches the first holder), then takes the lock by a
    // hand-off with a short lease, and gets stuck holding it.
    let taker = tokio::spawn(
        client
            .lock("handed-watch")
            .wait(Duration::from_secs(5))
            .lease(Duration::from_millis(300))
            .acquire(),
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let last = tokio::spawn(
        client
            .lock("handed-watch")
            .wait(Duration::from_secs(5))
            .acquire(),
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.release().await.unwrap();
    let stuck = taker.await.unwrap().unwrap();
    // Its 300 ms lease, not the 30 s one of the lock it was handed, lets the last in.
    let next = last
        .await
        .unwrap()
        .expect("the last waiter still watched the previous holder's lease");
    assert!(stuck.is_lost());
    assert!(next.fencing_token() > stuck.fencing_token());
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

/// Waits until a waiter of another client is on `key`'s waitlist: its attempt found
/// the lock busy and told it the lease.
async fn until_someone_waits(server: &RedisServer, key: &str) {
    let mut redis = raw(server).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while redis
        .zcard::<_, u64>(format!("redlock:waitlist:{key}"))
        .await
        .unwrap()
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "nobody waits on {key}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Guarantee 3 for the lease in force: a holder that shortens its lease with `extend`
/// and then dies (its guard never released, its client gone) costs the waiters that
/// short lease, not the long one they were told when they found the lock busy.
#[tokio::test]
async fn a_lease_shortened_by_extend_is_announced_to_waiters() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter_client = client(&server).await;
    let guard = holder
        .lock("shortened")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(
        waiter_client
            .lock("shortened")
            .wait(Duration::from_secs(12))
            .acquire(),
    );
    until_someone_waits(&server, "shortened").await;
    shorten_then_die(
        guard,
        Some(holder),
        waiting,
        started,
        "the waiter slept until its deadline on a key that had expired",
    )
    .await;
}

/// The same through a reader's share: the writer waiting behind a read lock was told
/// when the last share ends; a reader that shortens its share and dies frees it then.
#[tokio::test]
async fn a_share_shortened_by_extend_is_announced_to_waiters() {
    let server = RedisServer::start();
    let reader = client(&server).await;
    let writer_client = client(&server).await;
    let share = reader
        .read_lock("shortened-share")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(
        writer_client
            .write_lock("shortened-share")
            .wait(Duration::from_secs(12))
            .acquire(),
    );
    until_someone_waits(&server, "shortened-share").await;
    shorten_then_die(
        share,
        Some(reader),
        waiting,
        started,
        "the writer slept until its deadline on a key whose share had expired",
    )
    .await;
}

/// And inside one client: a task in line for the client's turn behind a holder that
/// shortened its lease and was then forgotten (never released) takes the key when
/// that short lease ends, not when the long one read before the extend would have.
#[tokio::test]
async fn a_lease_shortened_by_extend_wakes_the_same_clients_waiters() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let guard = client
        .lock("shortened-local")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(
        client
            .lock("shortened-local")
            .wait(Duration::from_secs(12))
            .acquire(),
    );
    // In line for the turn, asleep on the holder's 30 s lease.
    tokio::time::sleep(Duration::from_millis(100)).await;
    shorten_then_die(
        guard,
        None,
        waiting,
        started,
        "the same client's waiter slept on the lease read before the extend",
    )
    .await;
}

/// With RedLock a waiter listens on every master, whichever its attempts marked
/// contended: the shortened lease is announced on every master, as a release is.
#[tokio::test]
async fn a_lease_shortened_by_extend_is_announced_on_redlock_masters() {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let connect =
        || redlock_runtime::LockClient::builder_for(masters.iter().map(RedisServer::url)).connect();
    let holder = connect().await.unwrap();
    let waiter_client = connect().await.unwrap();
    let guard = holder
        .lock("shortened-redlock")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(
        waiter_client
            .lock("shortened-redlock")
            .wait(Duration::from_secs(12))
            .acquire(),
    );
    // RedLock keeps no waitlist: give the waiter time to find the lock busy and listen.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shorten_then_die(
        guard,
        Some(holder),
        waiting,
        started,
        "the waiter slept until its deadline on a key that had expired",
    )
    .await;
}

/// A semaphore's waiter was told when the first permit's lease ends: a permit cut
/// short by `extend` (its holder then dead) is announced too.
#[tokio::test]
async fn a_permit_shortened_by_extend_is_announced_to_waiters() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter_client = client(&server).await;
    let permit = holder
        .semaphore("shortened-permit", 1)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(
        waiter_client
            .semaphore("shortened-permit", 1)
            .wait(Duration::from_secs(12))
            .acquire(),
    );
    // A semaphore keeps no waitlist: give the waiter time to find every permit taken.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shorten_then_die(
        permit,
        Some(holder),
        waiting,
        started,
        "the waiter slept until its deadline on a permit that had expired",
    )
    .await;
}

/// The tail every shortened-lease test shares: `guard`'s holder cuts its lease to
/// 300 ms and dies (nothing is released; with `holder`, its client goes too), so the key
/// expires with the short lease; the waiter must then have it within seconds of that
/// end — not at its 12 s deadline, nor at the 30 s it was told.
async fn shorten_then_die(
    guard: redlock_runtime::LockGuard,
    holder: Option<redlock_runtime::LockClient>,
    waiting: tokio::task::JoinHandle<
        Result<redlock_runtime::LockGuard, redlock_runtime::LockError>,
    >,
    started: std::time::Instant,
    slept: &str,
) {
    guard.extend(Duration::from_millis(300)).await.unwrap();
    std::mem::forget(guard);
    drop(holder);
    let next = waiting.await.unwrap().expect(slept);
    let took = started.elapsed();
    println!("the waiter had the key {took:?} after it began to wait");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    next.release().await.unwrap();
}
