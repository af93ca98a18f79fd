//! A granted waiter confirms its grant (an extension to its lease, one script) a
//! quarter of the grace after the grant, not at once (issue 34): a hold shorter than
//! that never confirms, and its release frees the grant, so that a hand-off costs
//! Redis the release alone. A longer hold is confirmed to its lease in time; an
//! `extend` made first confirms in its place, to its own lease. On a current-thread
//! runtime a grant is confirmed at once (a timer there runs only when the holder's work
//! yields). (Each client here stands for a process of its own: clients share nothing
//! but Redis.)

mod common;

use std::time::{Duration, Instant};

use common::{evalsha_calls, raw, until_listening, until_waiting};
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockGuard};
use redlock_testkit::RedisServer;

const KEY: &str = "ledger-close";
const LEASE: Duration = Duration::from_secs(10);
/// Long enough that the short hold below ends well before its confirmation is due
/// (500 ms after the grant), on a loaded machine too.
const GRACE: Duration = Duration::from_secs(2);

async fn connect(server: &RedisServer) -> LockClient {
    LockClient::builder(&server.url())
        .reservation_grace(GRACE)
        .connect()
        .await
        .unwrap()
}

/// Until Redis has run no script for 200 ms: a waiter that just subscribed attempts
/// once more (a release may have gone unheard meanwhile).
async fn until_scripts_settle(server: &RedisServer) -> u64 {
    let mut seen = evalsha_calls(server);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = evalsha_calls(server);
        if now == seen {
            return now;
        }
        seen = now;
    }
}

/// Waits until the value of `KEY` no longer carries the grant's mark; how long that took
/// from `since`. Panics if the key is gone first (the grant lapsed) or after `limit`.
async fn until_confirmed(
    redis: &mut redis::aio::MultiplexedConnection,
    since: Instant,
    limit: Duration,
) -> Duration {
    loop {
        let value: Option<String> = redis.get(KEY).await.unwrap();
        let value = value.expect("the grant lapsed unconfirmed: the key is gone");
        if !unconfirmed(&value) {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "not confirmed within {limit:?}: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A holds `KEY`; `waiters` clients wait for it in line, in order; A's release grants the
/// first. Returns the first waiter's guard (granted), the others' pending acquisitions,
/// and when A's release began.
async fn grant_to_the_first_of(
    server: &RedisServer,
    waiters: usize,
) -> (LockGuard, Vec<tokio::task::JoinHandle<LockGuard>>, Instant) {
    let observer = connect(server).await;
    let holder = connect(server).await;
    let held = holder.lock(KEY).lease(LEASE).acquire().await.unwrap();
    let mut pending = Vec::new();
    for count in 1..=waiters {
        pending.push(wait_for_key(connect(server).await));
        until_waiting(&observer, KEY, count).await;
        until_listening(server, KEY, count).await;
    }
    let released_at = Instant::now();
    held.release().await.unwrap();
    let first = pending.remove(0).await.unwrap();
    (first, pending, released_at)
}

fn wait_for_key(client: LockClient) -> tokio::task::JoinHandle<LockGuard> {
    common::wait_for_key(client, KEY, LEASE)
}

/// The grant's mark (`scripts::UNCONFIRMED`): the start time, the third field of the
/// value, begins with `0` until the confirmation rewrites it.
fn unconfirmed(value: &str) -> bool {
    value
        .split(' ')
        .nth(2)
        .is_some_and(|since| since.starts_with('0'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_held_shorter_than_a_quarter_of_its_grace_is_never_confirmed() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    let observer = connect(&server).await;
    let holder = connect(&server).await;
    let held = holder.lock(KEY).lease(LEASE).acquire().await.unwrap();
    // B waits first, C behind it: A's release grants B and tells C of the grant's
    // lapse (`N`), so that A's client checks nothing after its release.
    let b = wait_for_key(connect(&server).await);
    until_waiting(&observer, KEY, 1).await;
    until_listening(&server, KEY, 1).await;
    let c = wait_for_key(connect(&server).await);
    until_waiting(&observer, KEY, 2).await;
    until_listening(&server, KEY, 2).await;

    let before = until_scripts_settle(&server).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let b = b.await.unwrap();
    let value: String = redis.get(KEY).await.unwrap();
    assert!(
        unconfirmed(&value),
        "B's grant, just made, is already confirmed: {value:?}"
    );
    // A short hold: B releases at once, its confirmation not due yet.
    b.release().await.unwrap();
    let b_released = released_at.elapsed();
    let scripts = evalsha_calls(&server) - before;
    assert!(
        b_released < GRACE / 4,
        "B released {b_released:?} after A's release: past its confirmation's due time"
    );
    assert_eq!(
        scripts, 2,
        "A's release and B's release ran {scripts} scripts in all: B confirmed its grant"
    );

    // C, granted by B's release, holds on: its confirmation comes a quarter of the
    // grace (500 ms) after the grant, and makes the lock C's for its lease. Counted from
    // before B's release, which made the grant.
    let c = c.await.unwrap();
    let value: String = redis.get(KEY).await.unwrap();
    assert!(unconfirmed(&value), "C's grant, just made: {value:?}");
    let confirmed_after = until_confirmed(&mut redis, released_at, GRACE).await;
    eprintln!("C's grant was confirmed {confirmed_after:?} after B's release began");
    // Not before it is due (the client's estimate of the grant's time may be a few ms
    // early), and before the grant would have lapsed (checked above).
    assert!(
        confirmed_after >= GRACE / 4 - Duration::from_millis(20),
        "C confirmed {confirmed_after:?} after its grant, before it was due"
    );
    let left: i64 = redis.pttl(KEY).await.unwrap();
    assert!(
        left > GRACE.as_millis() as i64,
        "C's confirmed lock lives {left} ms more: not its lease"
    );
    // The guard learns from the confirmation's reply, which may come just after Redis
    // shows it.
    let limit = Instant::now() + Duration::from_secs(5);
    while c.lease_remaining() <= GRACE {
        assert!(Instant::now() < limit, "{:?}", c.lease_remaining());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!c.is_lost());
    c.release().await.unwrap();
}

/// An `extend` made before the grant's confirmation is due confirms in its place: the
/// lease it sets stands, longer or shorter than the acquisition's (a confirmation sent
/// later to the acquisition's lease would undo it; a shortened lease is announced to
/// the waiters, and must stay short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_before_the_confirmation_is_due_confirms_to_its_own_lease() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    for lease in [LEASE * 3, Duration::from_secs(3)] {
        let (b, _, released_at) = grant_to_the_first_of(&server, 1).await;
        b.extend(lease).await.unwrap();
        assert!(
            released_at.elapsed() < GRACE / 4,
            "extended past the confirmation's due time"
        );
        let value: String = redis.get(KEY).await.unwrap();
        assert!(!unconfirmed(&value), "extended, still marked: {value:?}");
        // Well past the confirmation's due time (500 ms after the grant).
        tokio::time::sleep(GRACE / 4 + Duration::from_millis(500)).await;
        let left: i64 = redis.pttl(KEY).await.unwrap();
        let expected = lease.as_millis() as i64;
        assert!(
            left <= expected && left > expected - 3_000,
            "extended to {lease:?}, the key lives {left} ms more"
        );
        assert!(!b.is_lost());
        assert!(b.lease_remaining() <= lease, "{:?}", b.lease_remaining());
        b.release().await.unwrap();
    }
}

/// A grant not confirmed yet counts on the grace (100 ms here): too little for a task of
/// the same client to pick the lock up and reach Redis before it lapses. Its release
/// goes through Redis, and says the lock was released, not lost; the other task gets
/// the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_grant_is_released_in_redis_not_handed_to_a_task_of_its_client() {
    let server = RedisServer::start();
    let observer = LockClient::connect(&server.url()).await.unwrap();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let held = holder.lock(KEY).lease(LEASE).acquire().await.unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let first = wait_for_key(waiter.clone());
    until_waiting(&observer, KEY, 1).await;
    until_listening(&server, KEY, 1).await;
    // The second task waits for its client's turn, behind the first.
    let second = wait_for_key(waiter.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let first = first.await.unwrap();
    first
        .release()
        .await
        .expect("an unconfirmed grant released at once was reported lost");
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second task never got the key")
        .unwrap();
    assert!(!second.is_lost());
    second.release().await.unwrap();
}

/// On a current-thread runtime a grant is confirmed at once: a timer there would run
/// only when the holder's work yields.
#[tokio::test]
async fn on_a_current_thread_runtime_a_grant_is_confirmed_at_once() {
    let server = RedisServer::start();
    let mut redis = raw(&server).await;
    let (b, _, released_at) = grant_to_the_first_of(&server, 1).await;
    let confirmed_after = until_confirmed(&mut redis, released_at, GRACE).await;
    assert!(
        confirmed_after < GRACE / 4,
        "confirmed {confirmed_after:?} after the release: not at once"
    );
    b.release().await.unwrap();
}
