//! The waitlist: waiting clients line up in Redis (`redlock:waitlist:*` and
//! `redlock:waitlist-expiry:*`), a release wakes only the first in line, and a first-in-line
//! waiter that died costs the others only the reservation grace.

mod common;

use std::time::Duration;

use common::{client, evalsha_calls, next_owner_delay, take_turns};
use redlock_runtime::LockClient;
use redlock_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_clients_join_the_waitlist_and_a_release_wakes_only_the_first() {
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&server).await);
    }
    let before = evalsha_calls(&server);
    let tokens = take_turns(clients, "shared-by-processes", 10, Duration::from_millis(1)).await;
    assert_eq!(tokens.len(), 80);
    let calls = evalsha_calls(&server) - before;
    // 80 acquisitions by 8 clients. Waking every client on each release costs about 8
    // attempts per acquisition; with the waitlist a waiter tries about twice (once to
    // take its place, once when named), plus the release: 3.5–4.5 here, 5.5 allowed for
    // a loaded machine.
    assert!(
        calls < 80 * 11 / 2,
        "{calls} scripts for 80 acquisitions by 8 clients"
    );
    let left = server.cli(&["KEYS", "redlock:waitlist*"]);
    assert!(left.is_empty(), "the waitlist outlived its waiters: {left}");
}

#[tokio::test]
async fn a_dead_waiter_first_on_the_waitlist_costs_the_others_only_the_grace() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = LockClient::builder(&server.url())
        .reservation_grace(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let guard = holder
        .lock("job")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    // A waiter of a process that died, first on the waitlist, its registration still valid.
    server.cli(&["ZADD", "redlock:waitlist:job", "1", "ghost"]);
    server.cli(&[
        "ZADD",
        "redlock:waitlist-expiry:job",
        "99999999999999",
        "ghost",
    ]);
    // The release reserves the key for the ghost; the live waiter takes it when the
    // 100 ms reservation runs out, not at the 20 s lease's end.
    let delay = next_owner_delay(guard, waiter).await;
    assert!(
        delay < Duration::from_secs(2),
        "the live waiter waited {delay:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_not_left_asleep_when_the_key_passes_to_a_shorter_lease() {
    // Found by the model check (tests/model.rs): a waiter sleeps until the end of the
    // lease it was told. When the key passes to a holder with a shorter lease (here by a
    // reservation; a hand-off inside a client is the same) and that holder dies, the key
    // is free while the waiter sleeps on — unless the new lease is announced (`T:<ms>`).
    let server = RedisServer::start();
    let (holder, first, second) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let held = holder
        .lock("mixed")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // `first` joins the waitlist before `second`, so the release reserves the key for it.
    let first_waits = tokio::spawn(async move {
        let guard = first
            .lock("mixed")
            .wait(Duration::from_secs(10))
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        // Its process dies holding the lock: no release, the lease runs out.
        std::mem::forget(guard);
        std::time::Instant::now()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second_waits = tokio::spawn(async move {
        // Told "10 s left" by its first attempt.
        let guard = second
            .lock("mixed")
            .wait(Duration::from_secs(9))
            .lease(Duration::from_secs(1))
            .acquire()
            .await;
        (guard, std::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let first_died_at = first_waits.await.unwrap();
    let (guard, second_got_at) = second_waits.await.unwrap();
    let guard = guard.expect("the second waiter gets the key once the short lease ends");
    let delay = second_got_at - first_died_at;
    eprintln!("the second waiter got the key {delay:?} after the first took it (lease 300 ms)");
    assert!(
        delay < Duration::from_secs(2),
        "the second waiter slept {delay:?} on a key whose 300 ms holder had died \
         (it had been told 10 s)"
    );
    guard.release().await.unwrap();
}
