//! Fenced writes (`FencedKey::write`): a resource in Redis takes a write only from a
//! writer whose fencing token is at least the highest it has seen — the stale writer
//! (a holder paused past its lease) is refused by Redis, in the same script as the
//! write.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, raw};
use redis::AsyncCommands;
use redlock_runtime::{FencedKey, FencedWrite, LockClient, LockError};
use redlock_testkit::{RedisCluster, RedisServer};

/// Takes the lock on `key` once and returns its token, releasing it at once: what a
/// holder has in hand when it gets to its write.
async fn token_of_one_hold(client: &LockClient, key: &str) -> u64 {
    let guard = client
        .lock(key)
        .wait(Duration::from_secs(10))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("lock");
    let token = guard.fencing_token();
    guard.release().await.expect("release");
    token
}

#[tokio::test]
async fn a_resource_with_no_history_takes_the_first_write() {
    let server = RedisServer::start();
    let mut data = raw(&server).await;
    let job = FencedKey::new("job-state:1");
    assert_eq!(job.seen(&mut data).await.unwrap(), None);
    let outcome = job
        .write(&mut data, 5, &[("state", "running")])
        .await
        .unwrap();
    assert_eq!(outcome, FencedWrite::Written { previous: None });
    assert_eq!(job.seen(&mut data).await.unwrap(), Some(5));
    let state: String = data.hget("job-state:1", "state").await.unwrap();
    assert_eq!(state, "running");
}

#[tokio::test]
async fn a_stale_token_is_refused_and_a_newer_one_accepted() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let mut data = raw(&server).await;
    let balance = FencedKey::new("balance:42");

    // A holds the lock first, B after A's lease; B writes first, then A wakes up.
    let a = token_of_one_hold(&locks, "account:42").await;
    let b = token_of_one_hold(&locks, "account:42").await;
    assert!(b > a);
    let written = balance
        .write(&mut data, b, &[("cents", 9_000)])
        .await
        .unwrap();
    assert_eq!(written, FencedWrite::Written { previous: None });

    let stale = balance
        .write(&mut data, a, &[("cents", 7_500)])
        .await
        .unwrap();
    assert_eq!(stale, FencedWrite::Stale { seen: b });
    let cents: i64 = data.hget("balance:42", "cents").await.unwrap();
    assert_eq!(cents, 9_000, "the stale write changed nothing");

    // The same holder writing again, then a newer holder.
    let again = balance
        .write(&mut data, b, &[("cents", 8_900)])
        .await
        .unwrap();
    assert_eq!(again, FencedWrite::Written { previous: Some(b) });
    let c = token_of_one_hold(&locks, "account:42").await;
    let newer = balance
        .write(&mut data, c, &[("cents", 8_000)])
        .await
        .unwrap();
    assert_eq!(newer, FencedWrite::Written { previous: Some(b) });
    let cents: i64 = data.hget("balance:42", "cents").await.unwrap();
    assert_eq!(cents, 8_000);
    assert_eq!(balance.seen(&mut data).await.unwrap(), Some(c));

    // Tokens beyond 2^53 (where a Lua number loses digits) compare exactly.
    let big = 1u64 << 60;
    let bigger = balance
        .write(&mut data, big + 1, &[("cents", 1)])
        .await
        .unwrap();
    assert!(matches!(bigger, FencedWrite::Written { .. }));
    let refused = balance
        .write(&mut data, big, &[("cents", 2)])
        .await
        .unwrap();
    assert_eq!(refused, FencedWrite::Stale { seen: big + 1 });
}

#[tokio::test]
async fn of_concurrent_writers_only_those_not_behind_a_newer_write_land() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    // Twenty holders in turn, each paused before its write; then all write at once.
    let mut tokens = Vec::new();
    for _ in 0..20 {
        tokens.push(token_of_one_hold(&locks, "report:9").await);
    }
    let newest = *tokens.iter().max().unwrap();
    let start = Arc::new(tokio::sync::Barrier::new(tokens.len()));
    let mut writers = Vec::new();
    for token in tokens.iter().copied() {
        let mut data = raw(&server).await;
        let start = start.clone();
        writers.push(tokio::spawn(async move {
            start.wait().await;
            let outcome = FencedKey::new("report-state:9")
                .write(&mut data, token, &[("by", token.to_string())])
                .await
                .unwrap();
            (token, outcome)
        }));
    }
    let mut written = 0;
    for writer in writers {
        let (token, outcome) = writer.await.unwrap();
        match outcome {
            FencedWrite::Written { previous } => {
                written += 1;
                assert!(
                    previous.is_none_or(|p| p <= token),
                    "{token} wrote over {previous:?}"
                );
            }
            FencedWrite::Stale { seen } => assert!(seen > token, "{token} refused by {seen}"),
        }
    }
    assert!(written >= 1);
    let mut data = raw(&server).await;
    let by: String = data.hget("report-state:9", "by").await.unwrap();
    assert_eq!(
        by,
        newest.to_string(),
        "the newest holder's write is the last"
    );
    let seen = FencedKey::new("report-state:9")
        .seen(&mut data)
        .await
        .unwrap();
    assert_eq!(seen, Some(newest));
}

#[tokio::test]
async fn bad_input_is_a_typed_error_naming_the_key() {
    let server = RedisServer::start();
    let mut data = raw(&server).await;
    let _: () = data.set("plain-string", "x").await.unwrap();
    let error = FencedKey::new("plain-string")
        .write(&mut data, 1, &[("a", 1)])
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::Redis { key, .. } if key == "plain-string"),
        "{error:?}"
    );
    let error = FencedKey::new("redlock:fence")
        .write(&mut data, 1, &[("a", 1)])
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::InvalidKey { .. }), "{error:?}");
    let error = FencedKey::new("job:1")
        .write(&mut data, 1, &[("redlock:fence", 1)])
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LockError::InvalidOptions { key, .. } if key == "job:1"),
        "{error:?}"
    );
    assert!(!data.exists::<_, bool>("job:1").await.unwrap());
}

#[tokio::test]
async fn on_a_cluster_the_write_goes_to_the_resource_keys_slot() {
    let cluster = RedisCluster::start(3);
    let locks = LockClient::cluster(cluster.urls())
        .await
        .expect("cluster client");
    let mut data = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    // Resources spread over the slots, each fenced by its own lock's tokens.
    for n in 0..6 {
        let lock = format!("job:{n}");
        let older = token_of_one_hold(&locks, &lock).await;
        let newer = token_of_one_hold(&locks, &lock).await;
        let state = FencedKey::new(format!("job-state:{n}"));
        let written = state
            .write(&mut data, newer, &[("state", "done")])
            .await
            .unwrap();
        assert_eq!(written, FencedWrite::Written { previous: None });
        let refused = state
            .write(&mut data, older, &[("state", "lost")])
            .await
            .unwrap();
        assert_eq!(refused, FencedWrite::Stale { seen: newer });
        let value: String = data.hget(format!("job-state:{n}"), "state").await.unwrap();
        assert_eq!(value, "done");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_the_fence_holds_on_the_new_primary_after_a_failover() {
    use redlock_testkit::SentinelSetup;
    use redlock_testkit::sentinel::SERVICE;
    let mut setup = SentinelSetup::start();
    let locks = LockClient::sentinel(setup.sentinel_urls(), SERVICE)
        .await
        .expect("sentinel client");
    let urls = setup.sentinel_urls();
    let primary = || async {
        redis::sentinel::SentinelClient::build(
            urls.clone(),
            SERVICE,
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
    };
    let mut data = primary().await;
    let older = token_of_one_hold(&locks, "job:3").await;
    let newer = token_of_one_hold(&locks, "job:3").await;
    let state = FencedKey::new("job-state:3");
    let written = state
        .write(&mut data, newer, &[("state", "done")])
        .await
        .unwrap();
    assert_eq!(written, FencedWrite::Written { previous: None });
    // Replicated before the primary goes: the fence is data like any other.
    let replicas: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut data)
        .await
        .unwrap();
    assert_eq!(replicas, 1);
    setup.fail_over();
    let mut data = primary().await;
    let refused = state
        .write(&mut data, older, &[("state", "lost")])
        .await
        .unwrap();
    assert_eq!(refused, FencedWrite::Stale { seen: newer });
}

#[tokio::test]
async fn with_redlock_the_tokens_fence_a_resource_on_the_data_server() {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let locks = LockClient::redlock(masters.iter().map(RedisServer::url))
        .await
        .expect("redlock client");
    // The resource lives on the application's own Redis, not on the lock masters.
    let data_server = RedisServer::start();
    let mut data = raw(&data_server).await;
    let older = token_of_one_hold(&locks, "ledger:5").await;
    let newer = token_of_one_hold(&locks, "ledger:5").await;
    assert!(newer > older);
    let ledger = FencedKey::new("ledger-state:5");
    let written = ledger
        .write(&mut data, newer, &[("total", 10)])
        .await
        .unwrap();
    assert_eq!(written, FencedWrite::Written { previous: None });
    let refused = ledger
        .write(&mut data, older, &[("total", 7)])
        .await
        .unwrap();
    assert_eq!(refused, FencedWrite::Stale { seen: newer });
}
