//! Helpers shared by the behaviour tests (exclusion, waiting, hand_off, waitlist,
//! watchdog, fencing, releases, credentials, errors_say_why), included with `mod common;`.
//!
//! They use the runtime crate and the `redis` client, which the test kit
//! (`tests/support/`, the package's library) cannot depend on. Each test binary compiles
//! this module and uses a part of it, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockGuard};
use redlock_testkit::RedisServer;

/// A client with default settings, standing for a process of its own: clients share
/// nothing but Redis.
pub async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// A plain connection of the test's own, for looking at Redis behind the clients' backs.
pub async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Lets `waiter` (another client, so no hand-off) wait for `held`'s key, releases `held`
/// 300 ms later, and returns how long after the release call the waiter had the lock.
pub async fn next_owner_delay(held: LockGuard, waiter: LockClient) -> Duration {
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

/// `client`'s waiter for `key` (for up to 20 s, then holding it with `lease`), in a task
/// of its own: its guard when it got the key.
pub fn wait_for_key(
    client: LockClient,
    key: &str,
    lease: Duration,
) -> tokio::task::JoinHandle<LockGuard> {
    let key = key.to_owned();
    tokio::spawn(async move {
        client
            .lock(key)
            .wait(Duration::from_secs(20))
            .lease(lease)
            .acquire()
            .await
            .unwrap()
    })
}

/// Waits (up to 10 s) until `key` has at least `count` waiters in line, as `inspect`
/// (of `observer`, any client) reports them.
pub async fn until_waiting(observer: &LockClient, key: &str, count: usize) {
    let limit = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = observer
            .inspect(key)
            .await
            .unwrap()
            .map_or(0, |info| info.waiting());
        if waiting >= count {
            return;
        }
        assert!(Instant::now() < limit, "{waiting} waiting, not {count}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 10 s) until at least `count` clients listen for grants of `key` (none
/// at all when `count` is 0): a waiter that listens hears its grant, or `N`.
pub async fn until_listening(server: &RedisServer, key: &str, count: usize) {
    let limit = Instant::now() + Duration::from_secs(10);
    let pattern = format!("redlock:granted:*:{key}");
    loop {
        let listening = server
            .cli(&["PUBSUB", "CHANNELS", &pattern])
            .lines()
            .filter(|line| !line.trim().is_empty())
            .count();
        if (count > 0 && listening >= count) || (count == 0 && listening == 0) {
            return;
        }
        assert!(Instant::now() < limit, "{listening} listening, not {count}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes `key` at once (a 5 s lease) and releases it: the fencing token it was given.
pub async fn token_of(client: &LockClient, key: &str) -> u64 {
    let guard = client
        .lock(key)
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|error| panic!("could not lock {key:?}: {error}"));
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    token
}

/// Makes `subscriber` this thread's default until the guard is dropped, beside a global
/// subscriber that drops everything, set once per test binary (with it,
/// tracing-subscriber's `log` → `tracing` bridge, so that the redis crate's `log`
/// records reach the thread's subscriber too). The global one is needed: with a
/// thread's subscriber the only one registered, tracing caches a call site's interest
/// from the default subscriber of whichever thread reaches it first, and another test's
/// thread would cache "never" for what this one waits to see.
pub fn on_this_thread(
    subscriber: impl tracing::Subscriber + Send + Sync + 'static,
) -> tracing::subscriber::DefaultGuard {
    use tracing_subscriber::util::SubscriberInitExt;
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        let _ = tracing_subscriber::registry().try_init();
    });
    tracing::subscriber::set_default(subscriber)
}

/// Calls of EVALSHA so far, from Redis's own statistics.
pub fn evalsha_calls(server: &RedisServer) -> u64 {
    command_calls(server, "evalsha")
}

/// Calls of `command` (lower case) so far, scripts' calls included, from Redis's own
/// statistics.
pub fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()).map(str::to_owned))
        .and_then(|rest| rest.split(',').next().and_then(|calls| calls.parse().ok()))
        .unwrap_or(0)
}

/// One task per entry of `clients` takes `key` `rounds` times, holding it for `hold`;
/// asserts that no two ever held it at once and returns every fencing token handed out.
/// A client may appear several times: its tasks then wait for their turns inside it,
/// while different clients wait on the waitlist in Redis.
pub async fn take_turns(
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
