//! Bad input, each a test: keys, durations, URLs and foreign values. Each gets a typed
//! error naming the key (the URL for connection errors), or works as documented; none
//! panics, hangs, or leaves anything behind.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockClientBuilder, LockError};
use redlock_testkit::RedisServer;

/// Nothing here may take long: an error is returned at once, a wait is bounded.
const NO_HANG: Duration = Duration::from_secs(15);

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(NO_HANG, future)
        .await
        .unwrap_or_else(|_| panic!("{what} hung for {NO_HANG:?}"))
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn keys(server: &RedisServer) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = raw(server).await.keys("*").await.unwrap();
    keys.sort();
    keys
}

/// Nothing left behind: Redis holds exactly `expected` keys, no channel is subscribed,
/// and the client tracks no key and renews no lock.
async fn assert_clean(server: &RedisServer, client: &LockClient, expected: &[&[u8]]) {
    let mut expected: Vec<Vec<u8>> = expected.iter().map(|key| key.to_vec()).collect();
    expected.sort();
    // Background clean-ups (a dropped guard, an unsubscribe) may still be in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let channels = server.cli(&["PUBSUB", "CHANNELS"]);
        let clean = keys(server).await == expected
            && channels.is_empty()
            && client.active_keys() == 0
            && client.watched_locks() == 0;
        if clean {
            return;
        }
        if Instant::now() > deadline {
            let shown = |keys: &[Vec<u8>]| -> Vec<String> {
                keys.iter()
                    .map(|key| String::from_utf8_lossy(key).into_owned())
                    .collect()
            };
            panic!(
                "left behind: keys {:?} (expected {:?}), channels {channels:?}, {} active keys, {} watched locks",
                shown(&keys(server).await),
                shown(&expected),
                client.active_keys(),
                client.watched_locks()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client setting refused at `connect()`: `InvalidOptions`, its message naming the
/// setting (there is no lock key yet).
fn assert_invalid_setting(error: &LockError, setting: &str) {
    assert!(
        matches!(error, LockError::InvalidOptions { .. }) && error.to_string().contains(setting),
        "expected InvalidOptions naming `{setting}`, got {error:?}"
    );
}

fn assert_invalid_options(error: &LockError, key: &str) {
    assert!(
        matches!(error, LockError::InvalidOptions { key: named, .. } if named == key),
        "expected InvalidOptions naming `{key}`, got {error:?}"
    );
}

#[tokio::test]
async fn an_empty_key_is_refused() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let error = bounded(
        "acquire",
        client.lock("").wait(Duration::from_secs(5)).acquire(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, LockError::InvalidKey { key, .. } if key.is_empty()),
        "{error:?}"
    );
    assert!(error.to_string().contains("empty"), "{error}");
    assert_clean(&server, &client, &[]).await;
}

#[tokio::test]
async fn a_one_mib_key_is_refused_with_a_short_message() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let key = "k".repeat(1 << 20);
    let error = bounded("acquire", client.lock(key.as_str()).acquire())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::InvalidKey { key: named, .. } if *named == key),
        "{:?}",
        error.to_string()
    );
    assert_eq!(error.key(), key, "the error carries the whole key");
    let message = error.to_string();
    assert!(message.len() < 400, "a {} byte message", message.len());
    assert!(message.contains("kkkk"), "{message}");
    // The longest key allowed works.
    let longest = "k".repeat(redlock_runtime::MAX_KEY_LEN);
    let guard = client
        .lock(longest.as_str())
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_clean(&server, &client, &[b"redlock:fence"]).await;
}

#[tokio::test]
async fn a_key_one_byte_over_max_key_len_is_refused() {
    // The boundary itself: the longest key allowed works (see
    // `a_one_mib_key_is_refused_with_a_short_message`), one byte more is refused.
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let long = "k".repeat(redlock_runtime::MAX_KEY_LEN + 1);
    let error = bounded("acquire", client.lock(long.as_str()).acquire())
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::InvalidKey { .. }), "{error}");
    assert_eq!(error.key(), long, "the error carries the whole key");
    assert_clean(&server, &client, &[]).await;
}

#[tokio::test]
async fn keys_with_newlines_nul_bytes_spaces_and_emoji_work_byte_for_byte() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    let odd = [
        "line\nbreak",
        "nul\0byte",
        "\0",
        "  spaced key  ",
        " ",
        "🔒 lock ✨",
        "crlf\r\n*3\r\n$3\r\nDEL",
        "tab\tand\u{7f}del",
        // Names the library's own keys, but not at the start (that namespace is
        // refused: see `keys_in_the_reserved_namespace_are_refused`).
        "nested:redlock:released:x",
    ];
    for key in odd {
        let guard = client
            .lock(key)
            .lease(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        // Stored under exactly these bytes, and nothing else was created.
        assert_eq!(
            keys(&server).await,
            vec![b"redlock:fence".to_vec(), key.as_bytes().to_vec()]
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>(),
            "{key:?}"
        );
        // Another client is refused with an error naming the exact key, escaped in text.
        let error = other.lock(key).acquire().await.unwrap_err();
        assert!(error.is_timeout(), "{key:?}: {error:?}");
        assert_eq!(error.key(), key);
        assert!(!error.to_string().contains('\n') && !error.to_string().contains('\0'));
        // A waiter is woken by the release published on the key's channel, long before
        // the 20 s lease would have freed it.
        let waiter = {
            let other = other.clone();
            tokio::spawn(async move {
                let guard = other
                    .lock(key)
                    .wait(Duration::from_secs(10))
                    .lease(Duration::from_secs(5))
                    .acquire()
                    .await;
                let at = Instant::now();
                guard.map(|guard| (guard, at))
            })
        };
        let subscribed = async {
            while server
                .cli(&["PUBSUB", "NUMSUB", &format!("redlock:released:{key}")])
                .lines()
                .last()
                != Some("1")
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        // redis-cli cannot pass a NUL byte in an argument; for those, just give the
        // waiter a moment.
        if key.contains('\0') {
            tokio::time::sleep(Duration::from_millis(300)).await;
        } else {
            bounded("the waiter's subscription", subscribed).await;
        }
        let released = Instant::now();
        guard.release().await.unwrap();
        let (next, at) = bounded("the waiter", waiter)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{key:?}: the waiter failed: {e}"));
        assert!(
            at - released < Duration::from_secs(5),
            "{key:?}: the waiter was not woken by the release"
        );
        next.release().await.unwrap();
    }
    assert_clean(&server, &client, &[b"redlock:fence"]).await;
    assert_clean(&server, &other, &[b"redlock:fence"]).await;
}

#[tokio::test]
async fn zero_durations_are_refused_or_mean_no_wait() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let error = client
        .lock("zero")
        .lease(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert_invalid_options(&error, "zero");
    assert_clean(&server, &client, &[]).await;

    // A zero wait is one attempt: it takes a free lock, and fails at once on a held one.
    let guard = client
        .lock("zero")
        .wait(Duration::ZERO)
        .hold_at_least(Duration::ZERO)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    let started = Instant::now();
    let error = other
        .lock("zero")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_timeout() && error.key() == "zero", "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Extending by zero is refused and leaves the lock held.
    assert_invalid_options(&guard.extend(Duration::ZERO).await.unwrap_err(), "zero");
    assert!(!guard.is_lost());
    guard.release().await.unwrap(); // hold_at_least zero: deleted at once
    assert_clean(&server, &client, &[b"redlock:fence"]).await;

    // Zero client settings are refused at connect, with the setting named.
    type Setting = fn(redlock_runtime::LockClientBuilder) -> redlock_runtime::LockClientBuilder;
    let settings: [(&str, Setting); 4] = [
        ("watchdog_lease", |b| b.watchdog_lease(Duration::ZERO)),
        ("renew_every", |b| b.renew_every(Duration::ZERO)),
        ("response_timeout", |b| b.response_timeout(Duration::ZERO)),
        ("connect_timeout", |b| b.connect_timeout(Duration::ZERO)),
    ];
    for (name, setting) in settings {
        let error = setting(LockClient::builder(&server.url()))
            .connect()
            .await
            .unwrap_err();
        assert_invalid_setting(&error, name);
    }
}

#[tokio::test]
async fn one_millisecond_durations_work_as_documented() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();

    // A 1 ms lease: taken, then gone by itself; releasing it reports Lost.
    let guard = client
        .lock("tiny")
        .lease(Duration::from_millis(1))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(guard.is_lost());
    bounded("lost()", guard.lost()).await;
    assert!(guard.release().await.unwrap_err().is_lost());
    assert_clean(&server, &client, &[b"redlock:fence"]).await;

    // A 1 ms wait on a held lock: a timeout naming the key, at once.
    let guard = client
        .lock("tiny")
        .lease(Duration::from_secs(10))
        .hold_at_least(Duration::from_millis(1))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let error = other
        .lock("tiny")
        .wait(Duration::from_millis(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_timeout() && error.key() == "tiny", "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // hold_at_least of 1 ms, long passed: the release deletes the key.
    guard.release().await.unwrap();
    assert_clean(&server, &client, &[b"redlock:fence"]).await;

    // Extending to 1 ms works, and the lock then runs out by itself.
    let guard = client
        .lock("tiny")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    guard.extend(Duration::from_millis(1)).await.unwrap();
    bounded("lost()", guard.lost()).await;
    let next = other
        .lock("tiny")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(guard.release().await.unwrap_err().is_lost());
    next.release().await.unwrap();
    assert_clean(&server, &client, &[b"redlock:fence"]).await;
    assert_clean(&server, &other, &[b"redlock:fence"]).await;
}

#[tokio::test]
async fn huge_durations_are_refused_with_the_key_named() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    for (round, huge) in [Duration::from_secs(u64::MAX), Duration::MAX]
        .into_iter()
        .enumerate()
    {
        let before: &[&[u8]] = if round == 0 { &[] } else { &[b"redlock:fence"] };
        let error = client.lock("huge").lease(huge).acquire().await.unwrap_err();
        assert_invalid_options(&error, "huge");
        let error = client.lock("huge").wait(huge).acquire().await.unwrap_err();
        assert_invalid_options(&error, "huge");
        let error = client
            .lock("huge")
            .hold_at_least(huge)
            .acquire()
            .await
            .unwrap_err();
        assert_invalid_options(&error, "huge");
        assert_clean(&server, &client, before).await;

        let guard = client
            .lock("huge")
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        assert_invalid_options(&guard.extend(huge).await.unwrap_err(), "huge");
        assert!(!guard.is_lost());
        guard.release().await.unwrap();
        assert_clean(&server, &client, &[b"redlock:fence"]).await;
    }
}

#[tokio::test]
async fn huge_client_settings_are_refused_or_work() {
    let server = RedisServer::start();
    let huge = Duration::from_secs(u64::MAX);
    // The fencing counter exists whichever of the cases below are refused.
    let default = LockClient::connect(&server.url()).await.unwrap();
    let guard = default.lock("huge-settings").acquire().await.unwrap();
    guard.release().await.unwrap();
    assert_clean(&server, &default, &[b"redlock:fence"]).await;

    // Timeouts that never fire: the client works, or the setting is refused by name.
    type Setting = fn(redlock_runtime::LockClientBuilder) -> redlock_runtime::LockClientBuilder;
    let timeouts: [(&str, Setting); 2] = [
        ("response_timeout", |b| {
            b.response_timeout(Duration::from_secs(u64::MAX))
        }),
        ("connect_timeout", |b| {
            b.connect_timeout(Duration::from_secs(u64::MAX))
        }),
    ];
    for (name, setting) in timeouts {
        match bounded(
            "connect",
            setting(LockClient::builder(&server.url())).connect(),
        )
        .await
        {
            Ok(patient) => {
                let guard = patient
                    .lock("huge-settings")
                    .lease(Duration::from_secs(5))
                    .acquire()
                    .await
                    .unwrap();
                guard.release().await.unwrap();
                assert_clean(&server, &patient, &[b"redlock:fence"]).await;
            }
            Err(error) => assert_invalid_setting(&error, name),
        }
    }

    // A watchdog lease beyond what Redis can store: refused at acquire, key named.
    let client = bounded(
        "connect",
        LockClient::builder(&server.url())
            .watchdog_lease(huge)
            .connect(),
    )
    .await;
    match client {
        Ok(client) => {
            let error = client.lock("huge-settings").acquire().await.unwrap_err();
            assert_invalid_options(&error, "huge-settings");
            assert_clean(&server, &client, &[b"redlock:fence"]).await;
        }
        Err(error) => assert_invalid_setting(&error, "watchdog_lease"),
    }

    // A renewal interval that never comes: either refused at connect, or the lock lives
    // for its watchdog lease and is then reported lost, never silently kept.
    let client = bounded(
        "connect",
        LockClient::builder(&server.url())
            .watchdog_lease(Duration::from_millis(500))
            .renew_every(huge)
            .connect(),
    )
    .await;
    match client {
        Ok(client) => {
            let guard = client.lock("huge-settings").acquire().await.unwrap();
            bounded("lost()", guard.lost()).await;
            assert!(guard.is_lost());
            drop(guard);
            assert_clean(&server, &client, &[b"redlock:fence"]).await;
        }
        Err(error) => assert_invalid_setting(&error, "renew_every"),
    }
}

#[tokio::test]
async fn hold_at_least_longer_than_the_lease_is_refused() {
    let server = RedisServer::start();
    let client = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(500))
        .renew_every(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let error = client
        .lock("least")
        .lease(Duration::from_secs(1))
        .hold_at_least(Duration::from_millis(1001))
        .acquire()
        .await
        .unwrap_err();
    assert_invalid_options(&error, "least");
    assert!(error.to_string().contains("hold_at_least"), "{error}");
    assert_clean(&server, &client, &[]).await;

    // Equal is fine.
    let guard = client
        .lock("least")
        .lease(Duration::from_secs(1))
        .hold_at_least(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let ttl: i64 = raw(&server).await.pttl("least").await.unwrap();
    assert!(ttl > 0 && ttl <= 1000, "pttl {ttl}");

    // In watchdog mode the documented meaning holds even past the watchdog lease: an
    // early release keeps the key until hold_at_least has passed.
    let other = LockClient::connect(&server.url()).await.unwrap();
    let guard = client
        .lock("least-watchdog")
        .hold_at_least(Duration::from_millis(1500))
        .acquire()
        .await
        .unwrap();
    let acquired = Instant::now();
    guard.release().await.unwrap();
    let next = other
        .lock("least-watchdog")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    assert!(
        acquired.elapsed() >= Duration::from_millis(1400),
        "taken {:?} after acquisition, before hold_at_least",
        acquired.elapsed()
    );
    next.release().await.unwrap();
    let mut redis = raw(&server).await;
    let _: () = redis.del("least").await.unwrap(); // still kept by hold_at_least
    assert_clean(&server, &client, &[b"redlock:fence"]).await;
    assert_clean(&server, &other, &[b"redlock:fence"]).await;
}

#[tokio::test]
async fn malformed_urls_get_a_connect_error_without_the_password() {
    let port = redlock_testkit::free_port();
    let urls = [
        String::new(),
        "not a url".to_string(),
        "redis://".to_string(),
        "http://127.0.0.1:6379/".to_string(),
        "redis://127.0.0.1:99999/".to_string(),
        "redis://127.0.0.1:6379/not-a-db".to_string(),
        "redis://[::1/".to_string(),
        format!("redis://:hunter2@127.0.0.1:{port}/"),
        format!("redis://user:hunter2@127.0.0.1:{port}/%zz"),
    ];
    for url in &urls {
        let error = bounded(
            url,
            LockClient::builder(url)
                .connect_timeout(Duration::from_millis(500))
                .connect(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(error, LockError::Connect { .. }),
            "{url:?}: {error:?}"
        );
        let message = error.to_string();
        assert!(
            !message.contains("hunter2"),
            "{url:?}: the password leaked: {message}"
        );
        assert!(
            !format!("{error:?}").contains("hunter2"),
            "{url:?}: the password leaked: {error:?}"
        );
        assert_eq!(error.key(), "");
    }
}

#[tokio::test]
async fn unreachable_servers_fail_within_the_connect_timeout() {
    // Nothing listens: refused.
    let port = redlock_testkit::free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let started = Instant::now();
    let error = bounded(
        "connect",
        LockClient::builder(&url)
            .connect_timeout(Duration::from_millis(500))
            .connect(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, LockError::Connect { url: named, .. } if *named == url),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Something listens but never answers: the connect and response timeouts end it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://127.0.0.1:{}/", silent.local_addr().unwrap().port());
    let started = Instant::now();
    let error = bounded(
        "connect",
        LockClient::builder(&url)
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .connect(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, LockError::Connect { url: named, .. } if *named == url),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn a_key_holding_another_type_is_refused_and_left_untouched() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let mut redis = raw(&server).await;
    let _: () = redis.rpush("a-list", "x").await.unwrap();
    let _: () = redis.hset("a-hash", "f", "v").await.unwrap();
    let _: () = redis.sadd("a-set", "m").await.unwrap();
    let _: () = redis.zadd("a-zset", "m", 1).await.unwrap();
    let _: () = redis::cmd("XADD")
        .arg("a-stream")
        .arg("*")
        .arg("f")
        .arg("v")
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis.set("a-string", "not a lock").await.unwrap();
    let _: () = redis.pexpire("a-list", 60_000).await.unwrap(); // even with an expiry
    let foreign = [
        ("a-list", "list"),
        ("a-hash", "hash"),
        ("a-set", "set"),
        ("a-zset", "zset"),
        ("a-stream", "stream"),
        ("a-string", "string"),
    ];
    let mut before = Vec::new();
    for (key, _) in foreign {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(key)
            .query_async(&mut redis)
            .await
            .unwrap();
        before.push(dump);
    }
    for (key, found) in foreign {
        let started = Instant::now();
        let error = bounded(key, client.lock(key).wait(Duration::from_secs(5)).acquire())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, LockError::NotALock { key: named, found: kind } if named == key && kind == found),
            "{key}: {error:?}"
        );
        assert!(error.to_string().contains(key), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{key}: waited for a non-lock"
        );
        // Also in watchdog mode, with hold_at_least, and with a zero wait.
        let error = client
            .lock(key)
            .hold_at_least(Duration::from_millis(10))
            .acquire()
            .await
            .unwrap_err();
        assert!(
            matches!(error, LockError::NotALock { .. }),
            "{key}: {error:?}"
        );
    }
    for ((key, _), dump) in foreign.iter().zip(before) {
        let after: Vec<u8> = redis::cmd("DUMP")
            .arg(*key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(after, dump, "{key} was modified");
    }
    let ttl: i64 = redis.pttl("a-list").await.unwrap();
    assert!(ttl > 50_000, "the list's expiry was touched: {ttl}");
    let ttl: i64 = redis.pttl("a-string").await.unwrap();
    assert_eq!(ttl, -1, "the string got an expiry");
    let mut expected: Vec<&[u8]> = foreign.iter().map(|(key, _)| key.as_bytes()).collect();
    expected.sort();
    assert_clean(&server, &client, &expected).await;
}

/// How a builder setting is given a value.
type Setter = fn(LockClientBuilder, Duration) -> LockClientBuilder;

/// Every duration setting of the builder. `confirm_replicas` asks for one replica
/// (there is none, so an accepted acquisition fails with `NotReplicated`).
const SETTINGS: [(&str, Setter); 8] = [
    ("watchdog_lease", |b, d| b.watchdog_lease(d)),
    ("renew_every", |b, d| b.renew_every(d)),
    ("response_timeout", |b, d| b.response_timeout(d)),
    ("connect_timeout", |b, d| b.connect_timeout(d)),
    ("node_timeout", |b, d| b.node_timeout(d)),
    ("reservation_grace", |b, d| b.reservation_grace(d)),
    ("confirm_replicas", |b, d| b.confirm_replicas(1, d)),
    ("max_lease", |b, d| b.max_lease(d)),
];

const EDGES: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_millis(1),
    Duration::MAX,
];

/// The worker threads of `every_builder_setting_at_its_edges_errs_or_works`: a panic
/// on them, even in a task the library spawned (watchdog, notifications, background
/// clean-up) where no `JoinHandle` would show it, is recorded here.
const EDGE_THREADS: &str = "edge-settings";
static EDGE_PANICS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn record_panics_on_edge_threads() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(EDGE_THREADS) {
                EDGE_PANICS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(info.to_string());
            }
            previous(info);
        }));
    });
}

/// An error, short enough for one line of the table.
fn brief(error: &LockError) -> String {
    let text = format!("{error:?}");
    match text.char_indices().nth(110) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Subscribers of `key`'s release channel on `server`.
async fn release_listeners(server: &RedisServer, key: &str) -> i64 {
    let reply: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(format!("redlock:released:{key}"))
        .query_async(&mut raw(server).await)
        .await
        .unwrap_or_default();
    reply.first().map_or(0, |(_, count)| *count)
}

/// Waits (at most 1 s: a client whose subscriptions cannot work goes on without)
/// until `count` clients listen for `key`'s release.
async fn until_listening(server: &RedisServer, key: &str, count: i64) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while release_listeners(server, key).await < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One case: `name` set to `value`, everything else default. `Ok` says what happened
/// (any typed error is fine once connected); `Err` is a broken promise.
async fn setting_at_an_edge(
    servers: &[RedisServer],
    name: &'static str,
    set: Setter,
    value: Duration,
    key: &str,
) -> Result<String, String> {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let single = servers.len() == 1;
    let client = match set(LockClient::builder_for(&urls), value).connect().await {
        Ok(client) => client,
        Err(error @ LockError::InvalidOptions { .. }) if error.to_string().contains(name) => {
            return Ok("refused at connect".into());
        }
        // Too short to connect in: the connect error is the documented outcome.
        Err(error @ LockError::Connect { .. })
            if matches!(name, "connect_timeout" | "response_timeout")
                && !value.is_zero()
                && value <= Duration::from_millis(1) =>
        {
            return Ok(format!("could not connect in time: {}", brief(&error)));
        }
        Err(error) => {
            return Err(format!(
                "connect: {} (expected InvalidOptions naming {name}, or a client)",
                brief(&error)
            ));
        }
    };
    let plain = || async {
        LockClient::builder_for(&urls)
            .connect()
            .await
            .map_err(|error| format!("a default client: {}", brief(&error)))
    };
    let mut steps = Vec::new();

    // A fixed lease.
    let fixed = format!("{key}/fixed");
    steps.push(
        match client
            .lock(fixed.as_str())
            .lease(Duration::from_secs(1))
            .wait(Duration::from_millis(500))
            .acquire()
            .await
        {
            Ok(guard) => match guard.release().await {
                Ok(()) => "locked".to_string(),
                Err(error) => format!("locked, release {}", brief(&error)),
            },
            Err(error) => format!("lock {}", brief(&error)),
        },
    );

    // Watchdog mode, held long enough for a very short renewal interval to run.
    let watched = format!("{key}/watched");
    steps.push(
        match client
            .lock(watched.as_str())
            .wait(Duration::from_millis(500))
            .acquire()
            .await
        {
            Ok(guard) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                match guard.release().await {
                    Ok(()) => "watchdog locked".to_string(),
                    Err(error) => format!("watchdog locked, release {}", brief(&error)),
                }
            }
            Err(error) => format!("watchdog lock {}", brief(&error)),
        },
    );

    // Waiting behind a default client's lock. On one server a second default client
    // joins the waitlist first, so the release is reserved for it and this client hears "reserved
    // for another" and waits out its own reservation_grace.
    let contended = format!("{key}/contended");
    let holder = plain().await?;
    let held = holder
        .lock(contended.as_str())
        .lease(Duration::from_secs(3))
        .acquire()
        .await
        .map_err(|error| format!("a default holder: {}", brief(&error)))?;
    let first_in_line = if single {
        let other = plain().await?;
        let key = contended.clone();
        let first = tokio::spawn(async move {
            let guard = other
                .lock(key)
                .wait(Duration::from_secs(5))
                .lease(Duration::from_secs(1))
                .acquire()
                .await?;
            guard.release().await
        });
        until_listening(&servers[0], &contended, 1).await;
        Some(first)
    } else {
        None
    };
    let waiter = {
        let client = client.clone();
        let key = contended.clone();
        tokio::spawn(async move {
            let guard = client
                .lock(key)
                .wait(Duration::from_secs(2))
                .lease(Duration::from_secs(1))
                .acquire()
                .await?;
            guard.release().await
        })
    };
    until_listening(&servers[0], &contended, if single { 2 } else { 1 }).await;
    held.release()
        .await
        .map_err(|error| format!("the default holder's release: {}", brief(&error)))?;
    // A panic in the waiter is this case's panic.
    let waited = waiter
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
    steps.push(match waited {
        Ok(()) => "waited and locked".to_string(),
        Err(error) => format!("waiting {}", brief(&error)),
    });
    if let Some(first) = first_in_line {
        first
            .await
            .unwrap()
            .map_err(|error| format!("the default client first in line: {}", brief(&error)))?;
    }

    // Releasing to a waiting default client: the reservation uses this client's
    // reservation_grace. The waiter gets the lock before its wait runs out.
    if single {
        let handed = format!("{key}/handed");
        if let Ok(guard) = client
            .lock(handed.as_str())
            .lease(Duration::from_secs(3))
            .acquire()
            .await
        {
            let other = plain().await?;
            let key = handed.clone();
            let next = tokio::spawn(async move {
                let guard = other
                    .lock(key)
                    .wait(Duration::from_secs(5))
                    .lease(Duration::from_secs(1))
                    .acquire()
                    .await?;
                guard.release().await
            });
            until_listening(&servers[0], &handed, 1).await;
            let released_at = Instant::now();
            let release = guard.release().await;
            let next = next.await.unwrap();
            steps.push(format!(
                "handed on (release {}, next owner {} after {:?})",
                release.map_or_else(|e| brief(&e), |()| "ok".into()),
                next.map_or_else(|e| brief(&e), |()| "locked".into()),
                released_at.elapsed()
            ));
        }
    }
    Ok(steps.join("; "))
}

#[test]
fn every_builder_setting_at_its_edges_errs_or_works() {
    // Each setting at zero, 1 ns, 1 ms and Duration::MAX, on one server and on three
    // RedLock masters: connect() refuses it with InvalidOptions naming it, or the client
    // works, its operations succeeding or failing with a typed error. Nothing panics
    // (not even in a background task) and nothing hangs.
    const CASE_LIMIT: Duration = Duration::from_secs(10);
    record_panics_on_edge_threads();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(EDGE_THREADS)
        .enable_all()
        .build()
        .unwrap();
    let single = std::sync::Arc::new(vec![RedisServer::start()]);
    let masters = std::sync::Arc::new(
        (0..3)
            .map(|_| RedisServer::start_redlock_master())
            .collect::<Vec<_>>(),
    );
    let mut broken = Vec::new();
    runtime.block_on(async {
        // Independent cases run side by side (each on its own keys), a few at a time.
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
        let mut cases = Vec::new();
        for (name, set) in SETTINGS {
            for value in EDGES {
                for servers in [&single, &masters] {
                    let servers = servers.clone();
                    let slots = slots.clone();
                    let topology = if servers.len() == 1 {
                        "one server"
                    } else {
                        "RedLock"
                    };
                    let label = format!("{name}({value:?}) on {topology}");
                    let key = format!("edge:{name}:{}:{}", value.as_nanos(), servers.len());
                    let task = tokio::spawn(async move {
                        let _slot = slots.acquire().await.unwrap();
                        let started = Instant::now();
                        let outcome = tokio::time::timeout(
                            CASE_LIMIT,
                            setting_at_an_edge(&servers, name, set, value, &key),
                        )
                        .await;
                        (outcome, started.elapsed())
                    });
                    cases.push((label, task));
                }
            }
        }
        for (label, task) in cases {
            match task.await {
                Ok((Ok(Ok(what)), took)) => eprintln!("ok    {label} [{took:.1?}]: {what}"),
                Ok((Ok(Err(what)), took)) => {
                    eprintln!("WRONG {label} [{took:.1?}]: {what}");
                    broken.push(format!("{label}: {what}"));
                }
                Ok((Err(_), _)) => {
                    eprintln!("HUNG  {label}: still running after {CASE_LIMIT:?}");
                    broken.push(format!("{label}: hung for {CASE_LIMIT:?}"));
                }
                Err(error) => {
                    let panic = error.try_into_panic().map_or_else(
                        |_| "cancelled".to_string(),
                        |panic| {
                            panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default()
                        },
                    );
                    eprintln!("PANIC {label}: {panic}");
                    broken.push(format!("{label}: panicked: {panic}"));
                }
            }
        }
    });
    // Let the clients' background tasks run down (and panic, if they would) on the
    // recorded threads before counting.
    runtime.shutdown_timeout(Duration::from_secs(2));
    let panics = std::mem::take(&mut *EDGE_PANICS.lock().unwrap_or_else(|e| e.into_inner()));
    assert!(
        broken.is_empty() && panics.is_empty(),
        "{} of {} cases broke a promise:\n  {}\npanics on the runtime's threads (background tasks included):\n  {}",
        broken.len(),
        SETTINGS.len() * EDGES.len() * 2,
        broken.join("\n  "),
        panics.join("\n  ")
    );
}

#[tokio::test]
async fn keys_in_the_reserved_namespace_are_refused() {
    // The library keeps its own keys under `redlock:` (the fencing counter, waiter
    // waitlists, restart markers; releases are published on `redlock:released:<key>`). A
    // lock named into that namespace could overwrite or expire them, so it is refused
    // before anything is sent, on one server and on RedLock masters alike.
    let reserved = [
        "redlock:fence",
        "redlock:boot",
        "redlock:anything",
        "redlock:released:job",
        "redlock:waitlist:job",
        "redlock:waitlist-expiry:job",
        "redlock:",
        // A Cluster's companion keys (`{<slot tag>}redlock:…`): refused in every mode,
        // so that a name accepted on one server is accepted on a Cluster too.
        "{x1}redlock:waitlist:job",
        "{tag}redlock:holders:job",
    ];
    let single = vec![RedisServer::start()];
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    for servers in [&single, &masters] {
        let client = LockClient::builder_for(servers.iter().map(RedisServer::url))
            .connect()
            .await
            .unwrap();
        // The library's own keys exist (the fencing counter, with RedLock the restart
        // marker), and a lock is held.
        let warm = client
            .lock("job")
            .lease(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap();
        let before = snapshot(servers).await;
        let mut wrong = Vec::new();
        for key in reserved {
            let attempts = [
                ("lease", client.lock(key).lease(Duration::from_secs(5))),
                ("watchdog", client.lock(key)),
                (
                    "hold_at_least",
                    client
                        .lock(key)
                        .lease(Duration::from_secs(5))
                        .hold_at_least(Duration::from_secs(1)),
                ),
                ("wait", client.lock(key).wait(Duration::from_secs(5))),
            ];
            for (mode, attempt) in attempts {
                let started = Instant::now();
                match bounded(key, attempt.acquire()).await {
                    Err(LockError::InvalidKey { key: named, reason })
                        if named == key && reason.contains("redlock:") =>
                    {
                        if started.elapsed() > Duration::from_secs(2) {
                            wrong.push(format!(
                                "{key:?} ({mode}): refused only after {:?}",
                                started.elapsed()
                            ));
                        }
                    }
                    Err(error) => wrong.push(format!("{key:?} ({mode}): {error:?}")),
                    Ok(guard) => {
                        wrong.push(format!(
                            "{key:?} ({mode}): locked, token {}",
                            guard.fencing_token()
                        ));
                        let _ = guard.release().await;
                    }
                }
            }
        }
        let after = snapshot(servers).await;
        assert!(
            wrong.is_empty(),
            "{} server(s): keys in the reserved namespace were not refused with InvalidKey naming `redlock:`:\n  {}",
            servers.len(),
            wrong.join("\n  ")
        );
        assert_unchanged(&before, &after);
        for server in servers {
            assert_eq!(
                server.cli(&["PUBSUB", "CHANNELS"]),
                "",
                "a channel was subscribed"
            );
        }
        warm.release().await.unwrap();
        assert_eq!(client.active_keys(), 0);
        assert_eq!(client.watched_locks(), 0);
    }
}

/// Every key of every server with its value (`DUMP`) and remaining lease (`PTTL`).
type Snapshot = Vec<Vec<(Vec<u8>, Vec<u8>, i64)>>;

/// Also when it was begun and finished.
async fn snapshot(servers: &[RedisServer]) -> (Instant, Snapshot, Instant) {
    let begun = Instant::now();
    let mut all = Vec::new();
    for server in servers {
        let mut redis = raw(server).await;
        let mut entries = Vec::new();
        for key in keys(server).await {
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .unwrap();
            let ttl: i64 = redis.pttl(&key).await.unwrap();
            entries.push((key, dump, ttl));
        }
        all.push(entries);
    }
    (begun, all, Instant::now())
}

/// The same keys and values; every expiry unchanged (none added, removed, or
/// extended: a lease only ran down by the time between the snapshots).
fn assert_unchanged(before: &(Instant, Snapshot, Instant), after: &(Instant, Snapshot, Instant)) {
    // The most that can have passed between two readings of one key.
    let elapsed = (after.2 - before.0).as_millis() as i64 + 2;
    let shown = |key: &[u8]| String::from_utf8_lossy(key).into_owned();
    for (server, (was, now)) in before.1.iter().zip(&after.1).enumerate() {
        let names = |entries: &[(Vec<u8>, Vec<u8>, i64)]| -> Vec<String> {
            entries.iter().map(|(key, _, _)| shown(key)).collect()
        };
        assert_eq!(names(now), names(was), "server {server}: the keys changed");
        for ((key, dump_was, ttl_was), (_, dump_now, ttl_now)) in was.iter().zip(now) {
            assert_eq!(
                dump_now,
                dump_was,
                "server {server}: {} changed",
                shown(key)
            );
            let expiry_kept = if *ttl_was < 0 {
                ttl_now == ttl_was
            } else {
                *ttl_now >= 0 && (0..=elapsed).contains(&(ttl_was - ttl_now))
            };
            assert!(
                expiry_kept,
                "server {server}: the expiry of {} went from {ttl_was} ms to {ttl_now} ms",
                shown(key)
            );
        }
    }
}
