//! Several keys locked as one (`LockClient::lock_all`, issue 35): own tokens per key,
//! all or nothing (a busy key, a dropped acquisition), crossing transfers between
//! processes (no deadlock, no overlap, tokens only going up), and every mode: one
//! server, Cluster (keys on different nodes), Sentinel, RedLock.

mod common;

use std::time::{Duration, Instant};

use common::raw;
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError};
use redlock_testkit::sentinel::SERVICE;
use redlock_testkit::{RedisCluster, RedisServer, SentinelSetup};

async fn named(url: &str, name: &str) -> LockClient {
    LockClient::builder(url)
        .name(name)
        .connect()
        .await
        .expect("connect")
}

/// Whether `key` exists in Redis (a lock not released is still there).
async fn exists(server: &RedisServer, key: &str) -> bool {
    raw(server).await.exists(key).await.unwrap()
}

#[tokio::test]
async fn two_keys_are_held_with_their_own_tokens_and_released_together() {
    let server = RedisServer::start();
    let client = named(&server.url(), "multi-holder").await;
    let before = |key: &'static str| {
        let client = client.clone();
        async move {
            let guard = client.lock(key).acquire().await.unwrap();
            let token = guard.fencing_token();
            guard.release().await.unwrap();
            token
        }
    };
    let (a0, b0) = (before("a").await, before("b").await);

    let both = client
        .lock_all(["b", "a"])
        .wait(Duration::from_secs(1))
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert_eq!(both.keys(), ["a", "b"]);
    let (a, b) = (
        both.fencing_token("a").unwrap(),
        both.fencing_token("b").unwrap(),
    );
    assert!(a > a0 && b > b0, "tokens went down: {a0}→{a}, {b0}→{b}");
    assert_ne!(a, b, "one token for two acquisitions");
    assert_eq!(both.fencing_token("c"), None);
    assert!(!both.is_lost());
    assert!(both.lease_remaining() > Duration::from_secs(9));
    // Each key shows its holder, with the token the guard was given.
    for (key, token) in [("a", a), ("b", b)] {
        let info = client.inspect(key).await.unwrap().expect("held");
        assert_eq!(info.holder(), "multi-holder");
        assert_eq!(info.fencing_token(), token);
    }
    let listed = client.locks("*").await.unwrap();
    assert_eq!(
        listed.iter().map(|info| info.key()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert!(format!("{both:?}").contains("MultiLockGuard"));

    both.release().await.unwrap();
    assert!(!exists(&server, "a").await && !exists(&server, "b").await);
    // The next acquisition of each key gets a larger token than the multi-lock's.
    assert!(before("a").await > a && before("b").await > b);
}

#[tokio::test]
async fn a_busy_key_times_out_and_the_others_are_free_at_once() {
    let server = RedisServer::start();
    let other = named(&server.url(), "other").await;
    let held = other
        .lock("b")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let client = named(&server.url(), "multi").await;
    let started = Instant::now();
    let error = client
        .lock_all(["a", "b"])
        .wait(Duration::from_millis(300))
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    match &error {
        LockError::Timeout { key, waited } => {
            assert_eq!(key, "b");
            assert!(*waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected a Timeout on b, got {other:?}"),
    }
    assert!(error.is_busy());
    // Given back before the error came: not at the end of its 30 s lease.
    assert!(!exists(&server, "a").await, "a is still held");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(client.inspect("b").await.unwrap().is_some());
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_key_named_twice_is_one_key_and_bad_input_takes_nothing() {
    let server = RedisServer::start();
    let client = named(&server.url(), "multi").await;
    let guard = client.lock_all(["a", "a", "b"]).acquire().await.unwrap();
    assert_eq!(guard.keys(), ["a", "b"]);
    guard.release().await.unwrap();

    let none: [&str; 0] = [];
    let error = client.lock_all(none).acquire().await.unwrap_err();
    assert!(
        matches!(&error, LockError::InvalidOptions { key, .. } if key == "(no keys)"),
        "{error:?}"
    );
    // A bad key among good ones: refused before anything is sent.
    let error = client
        .lock_all(["a", "redlock:fence", "b"])
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(&error, LockError::InvalidKey { .. }), "{error:?}");
    let error = client
        .lock_all(["a", "b"])
        .lease(Duration::from_secs(1))
        .hold_at_least(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::InvalidOptions { .. }),
        "{error:?}"
    );
    assert!(!exists(&server, "a").await && !exists(&server, "b").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquisition_gives_back_what_it_took_at_once() {
    let server = RedisServer::start();
    let other = named(&server.url(), "other").await;
    let held = other.lock("b").acquire().await.unwrap();
    let client = named(&server.url(), "multi").await;
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock_all(["a", "b"])
                .wait(Duration::from_secs(60))
                .lease(Duration::from_secs(60))
                .acquire()
                .await
        }
    });
    let limit = Instant::now() + Duration::from_secs(5);
    while client.inspect("a").await.unwrap().is_none() {
        assert!(Instant::now() < limit, "a was never taken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    acquiring.abort();
    let dropped = Instant::now();
    while exists(&server, "a").await {
        assert!(
            dropped.elapsed() < Duration::from_secs(1),
            "a still held a second after the acquisition was dropped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("a given back {:?} after the drop", dropped.elapsed());
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_dropped_during_its_one_step_gives_back_what_it_took() {
    let server = RedisServer::start();
    let client = named(&server.url(), "multi").await;
    // Writes (scripts included) wait 400 ms on the server: the one step is sent, and
    // the call is dropped before its answer, not knowing what it took.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(400)
        .arg("WRITE")
        .query_async(&mut raw(&server).await)
        .await
        .unwrap();
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        client
            .lock_all(["a", "b"])
            .lease(Duration::from_secs(60))
            .acquire(),
    )
    .await;
    assert!(dropped.is_err(), "answered during the pause: {dropped:?}");
    // Once the pause ends the step runs, and the clean-up it left releases both keys:
    // not at the end of their 60 s lease.
    let limit = Instant::now() + Duration::from_secs(5);
    while exists(&server, "a").await || exists(&server, "b").await {
        assert!(
            Instant::now() < limit,
            "a or b still held 5 s after the drop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And the client takes them again.
    let again = client.lock_all(["a", "b"]).acquire().await.unwrap();
    again.release().await.unwrap();
}

#[tokio::test]
async fn a_fixed_lease_shorter_than_the_wait_ends_it_before_a_held_key_runs_out() {
    let server = RedisServer::start();
    let other = named(&server.url(), "other").await;
    let held = other
        .lock("b")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let client = named(&server.url(), "multi").await;
    let error = client
        .lock_all(["a", "b"])
        .wait(Duration::from_secs(10))
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap_err();
    // `a` (taken first) would have run out while `b` was awaited: the call stops
    // waiting a tenth of the lease before, with a Timeout on `b`, holding nothing.
    match &error {
        LockError::Timeout { key, waited } => {
            assert_eq!(key, "b");
            assert!(*waited < Duration::from_secs(5), "waited {waited:?}");
        }
        other => panic!("expected a Timeout on b, got {other:?}"),
    }
    assert!(!exists(&server, "a").await, "a is still held");
    held.release().await.unwrap();
}

#[tokio::test]
async fn force_unlocking_one_key_loses_the_guard() {
    let server = RedisServer::start();
    let client = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(900))
        .connect()
        .await
        .unwrap();
    let guard = client.lock_all(["a", "b"]).acquire().await.unwrap();
    assert!(!guard.is_lost());
    let operator = named(&server.url(), "operator").await;
    assert!(operator.force_unlock("b").await.unwrap());
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() resolves within a couple of renewals");
    assert!(guard.is_lost());
    eprintln!("lost {:?} after the force-unlock", started.elapsed());
    let error = guard.release().await.unwrap_err();
    assert!(error.is_lost(), "{error:?}");
    // The key not forced was released all the same.
    assert!(!exists(&server, "a").await);
}

/// Takes `keys` with `client`, checks that `rival` (another client) can take neither
/// key nor both while they are held, and that it can take both once released.
async fn excludes_a_rival(client: &LockClient, rival: &LockClient, keys: [&str; 2]) {
    let guard = client
        .lock_all(keys)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert_eq!(guard.keys().len(), 2);
    for key in keys {
        assert!(guard.fencing_token(key).is_some());
        let error = rival.lock(key).acquire().await.unwrap_err();
        assert!(error.is_busy(), "{key}: {error:?}");
        assert!(rival.inspect(key).await.unwrap().is_some());
    }
    let error = rival
        .lock_all(keys)
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    guard.release().await.unwrap();
    let again = rival
        .lock_all(keys)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    again.release().await.unwrap();
}

#[tokio::test]
async fn keys_on_different_cluster_nodes_lock_together() {
    let cluster = RedisCluster::start(3);
    let connect = || async {
        LockClient::cluster(cluster.urls())
            .await
            .expect("connect to the cluster")
    };
    let (client, rival) = (connect().await, connect().await);
    // Two keys whose slots different masters serve.
    let first = "acct:1";
    let node = cluster.master_of(first).unwrap();
    let second = (2..100)
        .map(|i| format!("acct:{i}"))
        .find(|key| cluster.master_of(key).is_some_and(|other| other != node))
        .expect("a key on another master");
    assert_ne!(cluster.slot_of(first), cluster.slot_of(&second));
    excludes_a_rival(&client, &rival, [first, &second]).await;
    // Keys of one slot, through a hash tag.
    excludes_a_rival(&client, &rival, ["{t}a", "{t}b"]).await;
}

/// How many scripts the servers at `urls` have run so far (`EVALSHA` and `EVAL`).
fn scripts_run(urls: &[String]) -> u64 {
    urls.iter()
        .map(|url| {
            let mut connection = redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut connection)
                .unwrap();
            info.lines()
                .filter(|line| {
                    line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:")
                })
                .filter_map(|line| {
                    let calls = line.split("calls=").nth(1)?.split(',').next()?;
                    calls.parse::<u64>().ok()
                })
                .sum::<u64>()
        })
        .sum()
}

/// Takes `keys` with `client` (nothing else running on the servers at `urls`) and
/// returns the guard and how many scripts the acquisition ran.
async fn scripts_for(
    client: &LockClient,
    urls: &[String],
    keys: &[&str],
) -> (redlock_runtime::MultiLockGuard, u64) {
    let before = scripts_run(urls);
    let guard = client
        .lock_all(keys.iter().copied())
        .wait(Duration::from_secs(3))
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    (guard, scripts_run(urls) - before)
}

#[tokio::test]
async fn free_keys_on_one_server_are_taken_in_one_script() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let client = named(&server.url(), "one-step").await;
    let rival = named(&server.url(), "rival").await;
    let (all, scripts) = scripts_for(&client, &urls, &["c", "a", "b"]).await;
    assert_eq!(scripts, 1, "three free keys took {scripts} scripts");
    // Each key its own token, from the server's counter, in key order, each shown
    // with its holder as a single key's lock is.
    let tokens: Vec<u64> = ["a", "b", "c"]
        .iter()
        .map(|key| all.fencing_token(key).unwrap())
        .collect();
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    for (key, token) in ["a", "b", "c"].iter().zip(&tokens) {
        let info = client.inspect(key).await.unwrap().expect("held");
        assert_eq!((info.holder(), info.fencing_token()), ("one-step", *token));
    }
    assert!(all.lease_remaining() > Duration::from_secs(9));
    // Held: a rival's single key and its own several keys are refused.
    assert!(rival.lock("b").acquire().await.unwrap_err().is_busy());
    let error = rival.lock_all(["x", "c"]).acquire().await.unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    // The step stopped at `c`, the first key in order: `x` is free, not left behind.
    assert!(!exists(&server, "x").await, "x was left held");
    // The step takes `0`, then `a` is busy and the wait is over: `0` is given back.
    let error = rival.lock_all(["a", "0"]).acquire().await.unwrap_err();
    assert!(
        matches!(&error, LockError::Timeout { key, .. } if key == "a"),
        "{error:?}"
    );
    assert!(!exists(&server, "0").await, "0 was left held");
    all.release().await.unwrap();
    for key in ["a", "b", "c"] {
        assert!(!exists(&server, key).await, "{key} still held");
    }
    // A single key's lock afterwards gets a token above all three.
    let next = client.lock("a").acquire().await.unwrap();
    assert!(next.fencing_token() > tokens[2]);
    next.release().await.unwrap();

    // One key busy: the step takes the free keys before it, and the busy one is
    // awaited in its line.
    let held = rival
        .lock("b")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let before = scripts_run(&urls);
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock_all(["a", "b"])
                .wait(Duration::from_secs(5))
                .lease(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    // The step, `b`'s attempt, and a second once its subscription is live (a release
    // published before that would have been missed): none for `a` on its own.
    let scripts = scripts_run(&urls) - before;
    assert!((2..=3).contains(&scripts), "{scripts} scripts");
    let holder = client
        .inspect("a")
        .await
        .unwrap()
        .expect("a taken by the step");
    assert_eq!(holder.holder(), "one-step");
    let held_token = held.fencing_token();
    held.release().await.unwrap();
    let both = waiting.await.unwrap().unwrap();
    assert!(both.fencing_token("b").unwrap() > held_token);
    both.release().await.unwrap();
}

#[tokio::test]
async fn a_key_held_by_a_task_of_the_same_client_sends_the_keys_through_their_lines() {
    let server = RedisServer::start();
    let client = named(&server.url(), "same-client").await;
    let held = client
        .lock("b")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock_all(["b", "a"])
                .wait(Duration::from_secs(5))
                .lease(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // In order: `a` taken, `b` awaited behind the task that holds it.
    assert!(!waiting.is_finished());
    assert!(exists(&server, "a").await);
    held.release().await.unwrap();
    let both = waiting.await.unwrap().unwrap();
    assert_eq!(both.keys(), ["a", "b"]);
    assert!(!both.is_lost());
    both.release().await.unwrap();
    assert!(!exists(&server, "a").await && !exists(&server, "b").await);
}

#[tokio::test]
async fn cluster_keys_of_one_slot_are_taken_in_one_script_and_others_key_by_key() {
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let client = LockClient::cluster(cluster.urls()).await.expect("connect");
    let (tagged, scripts) = scripts_for(&client, &urls, &["{acct}:2", "{acct}:1"]).await;
    assert_eq!(scripts, 1, "two keys of one slot took {scripts} scripts");
    assert_eq!(tagged.keys(), ["{acct}:1", "{acct}:2"]);
    tagged.release().await.unwrap();
    // Two slots: a script per key, on the node of each, and no CROSSSLOT.
    let first = "acct:1";
    let second = (2..100)
        .map(|i| format!("acct:{i}"))
        .find(|key| cluster.slot_of(key) != cluster.slot_of(first))
        .unwrap();
    let (spread, scripts) = scripts_for(&client, &urls, &[first, &second]).await;
    assert_eq!(scripts, 2, "keys of two slots took {scripts} scripts");
    spread.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_locks_several_keys_and_excludes_another_client() {
    let setup = SentinelSetup::start();
    let connect = || async {
        LockClient::sentinel(setup.sentinel_urls(), SERVICE)
            .await
            .expect("connect through the sentinels")
    };
    let (client, rival) = (connect().await, connect().await);
    excludes_a_rival(&client, &rival, ["order:1", "order:2"]).await;
}

#[tokio::test]
async fn redlock_locks_several_keys_and_excludes_another_client() {
    let masters: Vec<_> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let connect = || async {
        LockClient::builder_for(masters.iter().map(RedisServer::url))
            .connect()
            .await
            .expect("connect to the masters")
    };
    let (client, rival) = (connect().await, connect().await);
    excludes_a_rival(&client, &rival, ["order:1", "order:2"]).await;
}

// Crossing transfers between processes.

/// The test that `crossing_transfers_between_processes` runs in each child process (a
/// rerun of this test binary): keep it equal to that test's name.
const CHILD_TEST: &str = "child_process_transfers";
const ACCOUNTS: usize = 4;
const START_BALANCE: i64 = 100;
const TASKS_PER_CHILD: usize = 2;
const TRANSFERS_PER_TASK: usize = 50;

/// Writes both accounts' new balances if each token is above the highest that wrote
/// that account (then recorded), else writes nothing and counts a refusal.
/// KEYS: balance and fence of the debited account, then of the credited one.
/// ARGV: the debited balance and token, the credited balance and token.
const FENCED_TRANSFER: &str = r"
for i = 0, 1 do
  local fence = tonumber(redis.call('GET', KEYS[2 + 2 * i]) or '0')
  if tonumber(ARGV[2 + 2 * i]) <= fence then
    redis.call('INCR', 'refused')
    return 0
  end
end
for i = 0, 1 do
  redis.call('SET', KEYS[1 + 2 * i], ARGV[1 + 2 * i])
  redis.call('SET', KEYS[2 + 2 * i], ARGV[2 + 2 * i])
end
return 1
";

/// The machine's monotonic clock, in ns: one clock for every process of the machine.
fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// One task of a child: transfers of one unit between two random accounts, locked in
/// the order drawn. A non-atomic read, then a fenced write: two holders of an account
/// at once would lose an update (the total would change) and show in the history.
async fn transfers(client: LockClient, url: String, child: String) {
    let mut data = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let script = redis::Script::new(FENCED_TRANSFER);
    for _ in 0..TRANSFERS_PER_TASK {
        let from = rand::random_range(0..ACCOUNTS);
        let to = (from + rand::random_range(1..ACCOUNTS)) % ACCOUNTS;
        let (from, to) = (format!("acct:{from}"), format!("acct:{to}"));
        let guard = match client
            .lock_all([from.as_str(), to.as_str()])
            .wait(Duration::from_secs(10))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
        {
            Ok(guard) => guard,
            Err(error) => {
                let _: () = data.rpush("errors", error.to_string()).await.unwrap();
                continue;
            }
        };
        let start = monotonic_ns();
        let balance = |key: String| {
            let mut data = data.clone();
            async move {
                let value: i64 = data.get(format!("balance:{key}")).await.unwrap();
                value
            }
        };
        let (from_balance, to_balance) = (balance(from.clone()).await, balance(to.clone()).await);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let written: i64 = script
            .key(format!("balance:{from}"))
            .key(format!("fence:{from}"))
            .key(format!("balance:{to}"))
            .key(format!("fence:{to}"))
            .arg(from_balance - 1)
            .arg(guard.fencing_token(&from).unwrap())
            .arg(to_balance + 1)
            .arg(guard.fencing_token(&to).unwrap())
            .invoke_async(&mut data)
            .await
            .unwrap();
        let end = monotonic_ns();
        guard.release().await.unwrap();
        for account in [&from, &to] {
            let record = format!("{start} {end} {child} {written}");
            let _: () = data
                .rpush(format!("history:{account}"), record)
                .await
                .unwrap();
        }
    }
}

/// Run by `crossing_transfers_between_processes` in child processes; a no-op otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process_transfers() {
    let Ok(url) = std::env::var("REDLOCK_TEST_MULTI_URL") else {
        return;
    };
    let child = std::env::var("REDLOCK_TEST_MULTI_CHILD").unwrap();
    let client = LockClient::connect(&url).await.unwrap();
    let tasks: Vec<_> = (0..TASKS_PER_CHILD)
        .map(|task| {
            tokio::spawn(transfers(
                client.clone(),
                url.clone(),
                format!("{child}.{task}"),
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn crossing_transfers_between_processes() {
    const CHILDREN: usize = 3;
    let server = RedisServer::start();
    let mut data = raw(&server).await;
    for account in 0..ACCOUNTS {
        let _: () = data
            .set(format!("balance:acct:{account}"), START_BALANCE)
            .await
            .unwrap();
    }
    let started = Instant::now();
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|child| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
                .env("REDLOCK_TEST_MULTI_URL", server.url())
                .env("REDLOCK_TEST_MULTI_CHILD", child.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // No deadlock: every child ends within the bound (each transfer waits at most 10 s).
    let bound = Duration::from_secs(90);
    for child in &mut children {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a child process failed: {status}");
                break;
            }
            if started.elapsed() > bound {
                for child in &mut children {
                    let _ = child.kill();
                }
                panic!("the children did not finish within {bound:?}: a deadlock?");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let took = started.elapsed();

    let errors: Vec<String> = data.lrange("errors", 0, -1).await.unwrap();
    assert!(errors.is_empty(), "acquisitions failed: {errors:?}");
    let refused: Option<u64> = data.get("refused").await.unwrap();
    assert_eq!(
        refused, None,
        "fenced writes were refused: a token went down"
    );
    let mut total = 0;
    let mut transfers = 0;
    for account in 0..ACCOUNTS {
        let balance: i64 = data.get(format!("balance:acct:{account}")).await.unwrap();
        total += balance;
        // No two holders of an account at once: its hold intervals do not overlap.
        let history: Vec<String> = data
            .lrange(format!("history:acct:{account}"), 0, -1)
            .await
            .unwrap();
        transfers += history.len();
        let mut holds: Vec<(u64, u64, String)> = history
            .iter()
            .map(|line| {
                let mut fields = line.split(' ');
                let start = fields.next().unwrap().parse().unwrap();
                let end = fields.next().unwrap().parse().unwrap();
                (start, end, line.clone())
            })
            .collect();
        holds.sort();
        for pair in holds.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "acct:{account} held twice at once: {:?} and {:?}",
                pair[0].2,
                pair[1].2
            );
        }
    }
    let expected = CHILDREN * TASKS_PER_CHILD * TRANSFERS_PER_TASK;
    assert_eq!(
        transfers,
        2 * expected,
        "every transfer is in two histories"
    );
    assert_eq!(total, ACCOUNTS as i64 * START_BALANCE);
    eprintln!("{expected} transfers by {CHILDREN} processes in {took:?}");
}

#[tokio::test]
async fn a_fixed_lease_counts_from_the_return_of_acquire() {
    let server = RedisServer::start();
    let other = named(&server.url(), "other").await;
    let held = other
        .lock("b")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let client = named(&server.url(), "multi").await;
    let lease = Duration::from_secs(2);
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock_all(["a", "b"])
                .wait(Duration::from_secs(10))
                .lease(lease)
                .acquire()
                .await
        }
    });
    // `a` is taken at once, and its lease runs while `b` is awaited.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    held.release().await.unwrap();
    let guard = acquiring.await.unwrap().unwrap();
    for key in ["a", "b"] {
        let ttl: i64 = raw(&server).await.pttl(key).await.unwrap();
        assert!(ttl > 1_700, "{key}: {ttl} ms left of a 2 s lease");
    }
    assert!(guard.lease_remaining() > Duration::from_millis(1_700));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn hold_at_least_counts_once_every_key_is_held() {
    let server = RedisServer::start();
    let client = named(&server.url(), "multi").await;
    let hold = Duration::from_millis(800);
    // A key given back is freed at once, whatever hold_at_least says.
    let other = named(&server.url(), "other").await;
    let held = other.lock("b").acquire().await.unwrap();
    let error = client
        .lock_all(["a", "b"])
        .wait(Duration::from_millis(200))
        .lease(Duration::from_secs(10))
        .hold_at_least(hold)
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    assert!(!exists(&server, "a").await, "a kept for hold_at_least");
    held.release().await.unwrap();
    // Acquired: a release right away keeps both keys for the rest of the hold.
    let guard = client
        .lock_all(["a", "b"])
        .lease(Duration::from_secs(10))
        .hold_at_least(hold)
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    for key in ["a", "b"] {
        let ttl: i64 = raw(&server).await.pttl(key).await.unwrap();
        assert!((1..=800).contains(&ttl), "{key}: pttl {ttl}");
    }
    tokio::time::sleep(hold).await;
    assert!(!exists(&server, "a").await && !exists(&server, "b").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_of_two_keys_is_not_overtaken_by_callers_of_one() {
    let server = RedisServer::start();
    // Two clients (as two processes) take `b` alone back to back, each holding it 50 ms:
    // `b` is never free for long.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut churn = Vec::new();
    for name in ["one", "two"] {
        let client = named(&server.url(), name).await;
        let stop = stop.clone();
        churn.push(tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let guard = client
                    .lock("b")
                    .wait(Duration::from_secs(10))
                    .lease(Duration::from_secs(5))
                    .acquire()
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                guard.release().await.unwrap();
                rounds += 1;
            }
            rounds
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = named(&server.url(), "multi").await;
    let started = Instant::now();
    let both = client
        .lock_all(["b", "a"])
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("served in its turn in b's line");
    let took = started.elapsed();
    both.release().await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut rounds = 0;
    for task in churn {
        rounds += task.await.unwrap();
    }
    // In line behind at most the holder and the other waiter: a few holds of 50 ms.
    assert!(took < Duration::from_secs(1), "took {took:?}");
    eprintln!("both keys after {took:?}; the single-key callers took b {rounds} times");
}

mod attribute_runtime {
    //! What the expansion of `#[distributed_lock(keys = [...])]` calls, called directly.

    use std::time::Duration;

    use redlock_runtime::__private::{Conversions, LockMode, LockSpec, run_locked, run_locked_all};
    use redlock_runtime::{LockClient, LockError, current_lock, current_locks};
    use redlock_testkit::RedisServer;

    use super::{exists, named};

    fn spec() -> LockSpec {
        LockSpec {
            wait: Duration::from_millis(300),
            lease: Some(Duration::from_secs(10)),
            hold_at_least: None,
            abort_on_lost: true,
            label: "acct:<id>",
            mode: LockMode::Exclusive,
        }
    }

    fn plain<T>() -> Conversions<Result<T, LockError>, T, LockError> {
        Conversions {
            into_result: |result| result,
            from_lock_error: |error| error,
            skipped: None,
        }
    }

    /// Every key's lock inside, the first as `current_lock`; a nested call on one of
    /// them (one key, or several) enters without waiting for itself.
    async fn nested(client: &LockClient) -> Result<Vec<(String, u64)>, LockError> {
        let locks = current_locks();
        let seen: Vec<(String, u64)> = locks
            .iter()
            .map(|lock| (lock.key().to_owned(), lock.fencing_token()))
            .collect();
        assert_eq!(current_lock().as_ref(), locks.first());
        let b = seen[1].1;
        let inner = run_locked(
            Some(client.clone()),
            "b".to_owned(),
            spec(),
            async { Ok(current_lock().unwrap().fencing_token()) },
            plain(),
        )
        .await?;
        assert_eq!(inner, b, "the nested call entered the lock held around it");
        let inner_all = run_locked_all(
            Some(client.clone()),
            vec!["b".to_owned(), "a".to_owned()],
            spec(),
            async { Ok(current_locks().len()) },
            plain(),
        )
        .await?;
        assert_eq!(inner_all, 2);
        Ok(seen)
    }

    #[tokio::test]
    async fn run_locked_all_holds_every_key_and_nested_calls_enter() {
        let server = RedisServer::start();
        let client = named(&server.url(), "macro").await;
        let seen = run_locked_all(
            Some(client.clone()),
            vec!["b".to_owned(), "a".to_owned(), "b".to_owned()],
            spec(),
            nested(&client),
            plain(),
        )
        .await
        .unwrap();
        assert_eq!(
            seen.iter().map(|(key, _)| key.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(current_locks().is_empty());
        assert!(!exists(&server, "a").await && !exists(&server, "b").await);
    }

    #[tokio::test]
    async fn a_busy_key_skips_or_fails_the_call_holding_nothing() {
        let server = RedisServer::start();
        let other = named(&server.url(), "other").await;
        let held = other.lock("b").acquire().await.unwrap();
        let client = named(&server.url(), "macro").await;
        let skipping = Conversions {
            into_result: |result| result,
            from_lock_error: |error| error,
            skipped: Some(|| Ok(None)),
        };
        let skipped: Option<u32> = run_locked_all(
            Some(client.clone()),
            vec!["a".to_owned(), "b".to_owned()],
            spec(),
            async { panic!("the body ran without its locks") },
            skipping,
        )
        .await
        .unwrap();
        assert_eq!(skipped, None);
        assert!(!exists(&server, "a").await);
        let error = run_locked_all(
            Some(client.clone()),
            vec!["a".to_owned(), "b".to_owned()],
            spec(),
            async { Ok(()) },
            plain(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&error, LockError::Timeout { key, .. } if key == "b"),
            "{error:?}"
        );
        let error = run_locked_all(
            Some(client.clone()),
            Vec::new(),
            spec(),
            async { Ok(()) },
            plain(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&error, LockError::InvalidOptions { .. }),
            "{error:?}"
        );
        held.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_key_lost_stops_the_body() {
        let server = RedisServer::start();
        let client = LockClient::builder(&server.url())
            .watchdog_lease(Duration::from_millis(900))
            .connect()
            .await
            .unwrap();
        let operator = named(&server.url(), "operator").await;
        let spec = LockSpec {
            lease: None,
            ..spec()
        };
        let error = run_locked_all(
            Some(client.clone()),
            vec!["a".to_owned(), "b".to_owned()],
            spec,
            async {
                assert!(operator.force_unlock("b").await.unwrap());
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(())
            },
            plain(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&error, LockError::Lost { key } if key == "b"),
            "{error:?}"
        );
        assert!(!exists(&server, "a").await);
    }
}
