//! Bad input, each a test: keys, durations, URLs and foreign values. Each gets a typed
//! error naming the key (the URL for connection errors), or works as documented; none
//! panics, hangs, or leaves anything behind.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError};
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
        "redlock:released:nested",
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

    // Zero client settings are refused at connect, with the URL named.
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
        assert!(
            matches!(&error, LockError::Connect { url, .. } if *url == server.url()),
            "{name}: {error:?}"
        );
        assert!(error.to_string().contains(name), "{name}: {error}");
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
    // Timeouts that never fire are legitimate: the client works.
    let patient = bounded(
        "connect",
        LockClient::builder(&server.url())
            .response_timeout(huge)
            .connect_timeout(huge)
            .connect(),
    )
    .await
    .unwrap();
    let guard = patient
        .lock("huge-settings")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_clean(&server, &patient, &[b"redlock:fence"]).await;

    // A watchdog lease beyond what Redis can store: refused at acquire, key named.
    let client = bounded(
        "connect",
        LockClient::builder(&server.url())
            .watchdog_lease(huge)
            .connect(),
    )
    .await;
    if let Ok(client) = client {
        let error = client.lock("huge-settings").acquire().await.unwrap_err();
        assert_invalid_options(&error, "huge-settings");
        assert_clean(&server, &client, &[b"redlock:fence"]).await;
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
    if let Ok(client) = client {
        let guard = client.lock("huge-settings").acquire().await.unwrap();
        bounded("lost()", guard.lost()).await;
        assert!(guard.is_lost());
        drop(guard);
        assert_clean(&server, &client, &[b"redlock:fence"]).await;
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
