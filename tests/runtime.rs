//! The runtime against a real redis-server: exclusion, expiry, watchdog, wake-up,
//! fencing, hold_at_least, bad input.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError, LockGuard};
use redlock_testkit::RedisServer;

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// Lets `waiter` queue for `held`'s key, releases `held` 300 ms later, and returns how
/// long after the release call the waiter had the lock.
async fn handover_delay(held: LockGuard, waiter: LockClient) -> Duration {
    let key = held.key().to_owned();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock(key)
            .wait(Duration::from_secs(15))
            .lease(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    waiting.await.unwrap().duration_since(released_at)
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A non-atomic read-modify-write of a Redis counter under the lock: any overlap of two
/// holders loses an increment, so the final count is exact only under mutual exclusion.
async fn locked_increments(
    client: LockClient,
    url: String,
    rounds: usize,
    in_section: Arc<AtomicUsize>,
) {
    let mut data = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for _ in 0..rounds {
        let guard = client
            .lock("counter")
            .wait(Duration::from_secs(30))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        assert_eq!(
            in_section.fetch_add(1, Ordering::SeqCst),
            0,
            "two holders at once"
        );
        let value: i64 = data.get("count").await.unwrap_or(0);
        tokio::task::yield_now().await;
        let _: () = data.set("count", value + 1).await.unwrap();
        in_section.fetch_sub(1, Ordering::SeqCst);
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_tasks_keep_an_exact_count() {
    let server = RedisServer::start();
    // Four clients, eight tasks each: contention both inside a client (its FIFO queue)
    // and between clients (in Redis).
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&server).await);
    }
    let in_section = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            tokio::spawn(locked_increments(
                clients[i % 4].clone(),
                server.url(),
                50,
                in_section.clone(),
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let count: i64 = raw(&server).await.get("count").await.unwrap();
    assert_eq!(count, 32 * 50);
    let left: Vec<String> = raw(&server).await.keys("counter").await.unwrap();
    assert!(left.is_empty(), "the lock key outlived its last release");
}

/// Run by `four_processes_keep_an_exact_count` in child processes; a no-op otherwise.
#[tokio::test]
async fn child_process_increments() {
    let Ok(url) = std::env::var("REDLOCK_TEST_CHILD_URL") else {
        return;
    };
    let client = LockClient::connect(&url).await.unwrap();
    let in_section = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(locked_increments(
                client.clone(),
                url.clone(),
                25,
                in_section.clone(),
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn four_processes_keep_an_exact_count() {
    let server = RedisServer::start();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "child_process_increments",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("REDLOCK_TEST_CHILD_URL", server.url())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    let count: i64 = raw(&server).await.get("count").await.unwrap();
    assert_eq!(count, 4 * 4 * 25);
}

#[tokio::test]
async fn a_stale_release_is_lost_and_leaves_the_new_owner_alone() {
    let server = RedisServer::start();
    let first = client(&server).await;
    let second = client(&server).await;
    let stale = first
        .lock("stale")
        .lease(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap();
    let fresh = second
        .lock("stale")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(stale.is_lost());
    assert!(fresh.fencing_token() > stale.fencing_token());
    let error = stale.release().await.unwrap_err();
    assert!(
        matches!(&error, LockError::Lost { key } if key == "stale"),
        "{error}"
    );
    let ttl: i64 = raw(&server).await.pttl("stale").await.unwrap();
    assert!(ttl > 5_000, "the new owner's lock was touched: pttl {ttl}");
    fresh.release().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_keeps_a_lock_past_three_leases_and_drop_releases_it() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(300))
        .renew_every(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let other = client(&server).await;
    let guard = holder.lock("watched").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!guard.is_lost());
    let ttl: i64 = raw(&server).await.pttl("watched").await.unwrap();
    assert!(ttl > 0 && ttl <= 300, "pttl {ttl}");
    assert!(
        other
            .lock("watched")
            .acquire()
            .await
            .unwrap_err()
            .is_timeout()
    );
    assert_eq!(holder.watched_locks(), 1);
    drop(guard);
    // Dropped, not released: the background release frees it long before the lease.
    let next = other
        .lock("watched")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    assert_eq!(holder.watched_locks(), 0);
    next.release().await.unwrap();
}

#[tokio::test]
async fn lost_fires_within_a_renew_interval_when_the_key_is_deleted() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(3))
        .renew_every(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let guard = holder.lock("deleted").acquire().await.unwrap();
    let _: () = raw(&server).await.del("deleted").await.unwrap();
    let deleted_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() never fired");
    // One renew interval, plus scheduling slack; far below the 3 s lease.
    assert!(
        deleted_at.elapsed() < Duration::from_millis(1500),
        "{:?}",
        deleted_at.elapsed()
    );
    assert!(guard.is_lost());
    assert!(guard.release().await.unwrap_err().is_lost());
}

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
    let delay = handover_delay(guard, waiter_client).await;
    // Woken by the notification: milliseconds, where a poll or the lease would be seconds.
    assert!(
        delay < Duration::from_millis(500),
        "waiter woke {delay:?} after the release"
    );
}

#[tokio::test]
async fn fencing_tokens_increase_even_across_a_redis_restart() {
    let mut server = RedisServer::start();
    let client = client(&server).await;
    let mut last = 0;
    for key in ["a", "b", "a", "c", "a"] {
        let guard = client
            .lock(key)
            .lease(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        assert!(guard.fencing_token() > last);
        last = guard.fencing_token();
        guard.release().await.unwrap();
    }
    server.restart();
    // The client reconnects by itself, reloads its scripts, and tokens keep growing.
    let guard = client
        .lock("a")
        .wait(Duration::from_secs(10))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(
        guard.fencing_token() > last,
        "{} <= {last}",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
    // Distinct keys leave nothing behind but the one shared counter.
    let keys: Vec<String> = raw(&server).await.keys("*").await.unwrap();
    assert_eq!(keys, vec!["redlock:fence".to_string()]);
}

#[tokio::test]
async fn hold_at_least_keeps_the_key_after_an_early_release() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let guard = client
        .lock("job")
        .lease(Duration::from_secs(30))
        .hold_at_least(Duration::from_millis(1500))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let ttl: i64 = raw(&server).await.pttl("job").await.unwrap();
    assert!(ttl > 0 && ttl <= 1500, "pttl {ttl}");
    assert!(client.lock("job").acquire().await.unwrap_err().is_timeout());
    let again = client
        .lock("job")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    again.release().await.unwrap();
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

#[tokio::test]
async fn bad_input_gets_a_typed_error_naming_the_key() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let error = client.lock("").acquire().await.unwrap_err();
    assert!(matches!(error, LockError::InvalidKey { .. }), "{error}");
    let long = "k".repeat(redlock_runtime::MAX_KEY_LEN + 1);
    let error = client.lock(long).acquire().await.unwrap_err();
    assert!(matches!(error, LockError::InvalidKey { .. }), "{error}");
    let error = client
        .lock("zero")
        .lease(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::InvalidOptions { key, .. } if key == "zero"),
        "{error}"
    );
    let error = client
        .lock("hold")
        .lease(Duration::from_secs(1))
        .hold_at_least(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::InvalidOptions { .. }), "{error}");
    let _: () = raw(&server).await.rpush("a-list", "x").await.unwrap();
    let error = client
        .lock("a-list")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::NotALock { found, .. } if found == "list"),
        "{error}"
    );
    assert!(error.to_string().contains("a-list"));
    let len: i64 = raw(&server).await.llen("a-list").await.unwrap();
    assert_eq!(len, 1, "the foreign value was touched");
    let nothing_left: Vec<String> = raw(&server).await.keys("zero").await.unwrap();
    assert!(nothing_left.is_empty());
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_fail_fast() {
    let error = LockClient::connect("not a url").await.unwrap_err();
    assert!(matches!(error, LockError::Connect { .. }), "{error}");
    let port = redlock_testkit::free_port();
    let started = Instant::now();
    let error = LockClient::builder(&format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::Connect { .. }), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_holder_stuck_past_its_lease_does_not_block_its_own_clients_waiters() {
    let server = RedisServer::start();
    let client = client(&server).await;
    // The guard lives on (its task is stuck), but its 300 ms lease has run out.
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

/// Calls of EVALSHA so far, from Redis's own statistics.
fn evalsha_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// One task per entry of `clients` (a client may appear several times) takes `key`
/// `rounds` times, holding it for `hold`; asserts that no two ever held it at once and
/// returns every fencing token handed out.
async fn take_turns(
    clients: Vec<LockClient>,
    key: &str,
    rounds: usize,
    hold: Duration,
) -> Vec<u64> {
    let in_section = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let in_section = in_section.clone();
            let key = key.to_owned();
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..rounds {
                    let guard = client
                        .lock(key.as_str())
                        .wait(Duration::from_secs(30))
                        .lease(Duration::from_secs(5))
                        .acquire()
                        .await
                        .unwrap();
                    assert_eq!(
                        in_section.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    tokio::time::sleep(hold).await;
                    in_section.fetch_sub(1, Ordering::SeqCst);
                    tokens.push(guard.fencing_token());
                    guard.release().await.unwrap();
                }
                tokens
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.extend(task.await.unwrap());
    }
    tokens
}

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
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
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
                    // Some waiters give up at odd moments: while queued, while holding the
                    // baton, or with their acquire script in flight.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_clients_queue_in_redis_and_a_release_wakes_only_the_first() {
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
    // attempts per acquisition; with the queue a waiter tries about twice (once to take
    // its place, once when named), plus the release: 3.5–4.5 here, 5.5 allowed for a
    // loaded machine.
    assert!(
        calls < 80 * 11 / 2,
        "{calls} scripts for 80 acquisitions by 8 clients"
    );
    let left = server.cli(&["KEYS", "redlock:queue*"]);
    assert!(left.is_empty(), "the queue outlived its waiters: {left}");
}

#[tokio::test]
async fn a_waiter_that_died_first_in_line_costs_the_others_only_the_grace() {
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
    // A waiter of a process that died, first in line, its registration still valid.
    server.cli(&["ZADD", "redlock:queue:job", "1", "ghost"]);
    server.cli(&[
        "ZADD",
        "redlock:queue-expiry:job",
        "99999999999999",
        "ghost",
    ]);
    // The release reserves the key for the ghost; the live waiter takes it when the
    // 100 ms reservation runs out, not at the 20 s lease's end.
    let delay = handover_delay(guard, waiter).await;
    assert!(
        delay < Duration::from_secs(2),
        "the live waiter waited {delay:?}"
    );
}

#[tokio::test]
async fn an_interrupted_release_still_frees_the_lock() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let other = client(&server).await;
    for micros in [0u64, 30, 100, 300] {
        let guard = holder
            .lock("interrupted")
            .lease(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        let _ = tokio::time::timeout(Duration::from_micros(micros), guard.release()).await;
        // Freed in the background long before the 60 s lease.
        let next = other
            .lock("interrupted")
            .wait(Duration::from_secs(5))
            .lease(Duration::from_secs(1))
            .acquire()
            .await
            .expect("an interrupted release left the lock behind");
        next.release().await.unwrap();
    }
}
