//! Hand-offs: a release passing the lock to the next task of the same client inside that
//! task's acquire script. One script per acquisition, no starvation of other clients,
//! and nothing left behind when waiters give up half-way.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{client, evalsha_calls, take_turns};
use redlock_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_next_task_in_one_script() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let before = evalsha_calls(&server);
    let mut tokens = take_turns(vec![client; 8], "relay", 20, Duration::from_micros(200)).await;
    let calls = evalsha_calls(&server) - before;
    // 160 acquisitions: a plain release + acquire would be 320 scripts; a hand-off is
    // one script for both, and only every ninth release goes through Redis on its own.
    assert!(calls < 230, "{calls} scripts for 160 acquisitions");
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 160, "a fencing token was handed out twice");
    assert_eq!(
        server.cli(&["EXISTS", "relay"]),
        "0",
        "the lock outlived its last release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_offs_inside_a_client_do_not_starve_other_clients() {
    let server = RedisServer::start();
    let busy = client(&server).await;
    let outsider = client(&server).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let busy = busy.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let guard = busy
                        .lock("hot")
                        .wait(Duration::from_secs(30))
                        .lease(Duration::from_secs(5))
                        .acquire()
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..5 {
        let guard = outsider
            .lock("hot")
            .wait(Duration::from_secs(10))
            .lease(Duration::from_secs(5))
            .acquire()
            .await
            .expect("another client's waiter starved behind the hand-offs");
        guard.release().await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_offs_survive_waiters_that_give_up_mid_way() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let in_section = Arc::new(AtomicUsize::new(0));
    let acquired = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..12u64)
        .map(|task| {
            let client = client.clone();
            let in_section = in_section.clone();
            let acquired = acquired.clone();
            tokio::spawn(async move {
                for round in 0..30u64 {
                    // Some waiters give up at odd moments: while waiting for their turn,
                    // when their turn has come (a hand-off is on its way to them), or with
                    // their acquire script in flight.
                    let patience = Duration::from_micros(50 + (task * 131 + round * 977) % 3000);
                    let attempt = client
                        .lock("fickle")
                        .wait(Duration::from_secs(10))
                        .lease(Duration::from_secs(5))
                        .acquire();
                    let Ok(Ok(guard)) = tokio::time::timeout(patience, attempt).await else {
                        continue;
                    };
                    assert_eq!(
                        in_section.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    acquired.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    in_section.fetch_sub(1, Ordering::SeqCst);
                    if round % 3 == 0 {
                        drop(guard); // released in the background
                    } else {
                        guard.release().await.unwrap();
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(acquired.load(Ordering::SeqCst) > 0);
    // Whatever was abandoned where, the key is free again promptly (not after 5 s).
    let guard = client
        .lock("fickle")
        .wait(Duration::from_secs(2))
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .expect("an abandoned hand-off left the lock behind");
    guard.release().await.unwrap();
    assert_eq!(client.active_keys(), 0, "the client still tracks the key");
}
