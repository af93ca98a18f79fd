//! RedLock over five independent redis-server processes, with masters killed and
//! restarted empty.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError};
use redlock_testkit::RedisServer;

fn five_masters() -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start()).collect()
}

async fn redlock(masters: &[RedisServer]) -> LockClient {
    LockClient::builder_for(masters.iter().map(RedisServer::url))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the masters")
}

async fn keys_on(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    connection.keys(pattern).await.unwrap()
}

async fn exclusive_rounds(clients: &[LockClient], tasks: usize, rounds: usize) -> Vec<u64> {
    let in_section = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let client = clients[task % clients.len()].clone();
            let in_section = in_section.clone();
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..rounds {
                    let guard = client
                        .lock("shared")
                        .wait(Duration::from_secs(20))
                        .lease(Duration::from_secs(5))
                        .acquire()
                        .await
                        .unwrap();
                    assert_eq!(
                        in_section.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    tokens.push(guard.fencing_token());
                    tokio::task::yield_now().await;
                    in_section.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for handle in handles {
        tokens.extend(handle.await.unwrap());
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_grants_and_excludes() {
    let masters = five_masters();
    let clients = [
        redlock(&masters).await,
        redlock(&masters).await,
        redlock(&masters).await,
    ];
    let mut tokens = exclusive_rounds(&clients, 6, 15).await;
    let count = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "a fencing token was handed out twice");
    for master in &masters {
        assert!(
            keys_on(master, "shared").await.is_empty(),
            "a lock key was left behind"
        );
    }
}

#[tokio::test]
async fn two_masters_down_still_lock() {
    let mut masters = five_masters();
    let clients = [redlock(&masters).await, redlock(&masters).await];
    masters[0].kill();
    masters[3].kill();
    let tokens = exclusive_rounds(&clients, 4, 5).await;
    assert_eq!(tokens.len(), 20);
}

#[tokio::test]
async fn three_masters_down_is_no_quorum_within_the_wait() {
    let mut masters = five_masters();
    let client = redlock(&masters).await;
    for index in [1, 2, 4] {
        masters[index].kill();
    }
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let error = client
        .lock("orphan")
        .wait(wait)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_err();
    // Bounded by the wait plus one per-node timeout (the response timeout at most).
    assert!(
        started.elapsed() < wait + Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            error,
            LockError::NoQuorum {
                reached: 2,
                needed: 3,
                ..
            }
        ),
        "{error}"
    );
    // The two survivors granted the lock, then the failed attempt took it back.
    for survivor in [&masters[0], &masters[3]] {
        assert!(
            keys_on(survivor, "orphan").await.is_empty(),
            "a lock key was left on a survivor"
        );
    }
}

#[tokio::test]
async fn a_master_restarted_empty_does_not_let_a_second_owner_in() {
    let mut masters = five_masters();
    let holder = redlock(&masters).await;
    let rival = redlock(&masters).await;
    let guard = holder
        .lock("held")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // One master forgets everything; four still hold the lock, a majority.
    masters[2].restart();
    let error = rival
        .lock("held")
        .wait(Duration::from_millis(500))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");
    // The rival's failed attempt did not leave its own key on the restarted master.
    assert!(keys_on(&masters[2], "held").await.is_empty());
    let first_token = guard.fencing_token();
    guard.release().await.unwrap();
    let next = rival
        .lock("held")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(next.fencing_token() > first_token, "fencing went backwards");
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_watchdog_lock_is_lost_when_the_majority_is() {
    let mut masters = five_masters();
    let client = LockClient::builder_for(masters.iter().map(RedisServer::url))
        .watchdog_lease(Duration::from_millis(900))
        .renew_every(Duration::from_millis(150))
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let guard = client.lock("watched").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost(), "renewal on all five failed");
    for index in [0, 1, 2] {
        masters[index].kill();
    }
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the guard never noticed it lost the majority");
    assert!(guard.is_lost());
}
