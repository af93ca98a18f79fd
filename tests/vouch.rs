//! Vouching for a new RedLock deployment (`LockClient::vouch_for_blank_masters`), and
//! the `NoQuorum` that names the masters sitting out, against real redis-server
//! processes (never port 6379).
//!
//! A master redlock never used sits out `max_lease` before it votes, since it cannot
//! be told from one that forgot every lock. Vouching marks masters that hold no
//! redlock data as a new deployment: they vote at once. It refuses them all, writing
//! nothing, when any holds a lock or a key of redlock's; and the mark names the Redis
//! process, so a master restarted after it sits out its quarantine as before.

use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockError};
use redlock_testkit::RedisServer;

/// The quarantine the tests' clients use: long enough that a test that passes cannot
/// have waited it out.
const MAX_LEASE: Duration = Duration::from_secs(60);

/// Three masters that redlock has never used.
fn three_blank_masters() -> Vec<RedisServer> {
    (0..3).map(|_| RedisServer::start()).collect()
}

async fn redlock(masters: &[RedisServer], max_lease: Duration) -> LockClient {
    LockClient::builder_for(masters.iter().map(RedisServer::url))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .max_lease(max_lease)
        .connect()
        .await
        .expect("connect to the masters")
}

/// The master's restart marker, or "" when it has none.
fn marker(master: &RedisServer) -> String {
    master.cli(&["GET", "redlock:boot"]).trim().to_owned()
}

/// The marker a vouch writes for the master's running process.
fn vouched_marker(master: &RedisServer) -> String {
    let run_id = master.info_field("server", "run_id").expect("a run_id");
    format!("{run_id}:0:vouched")
}

/// Waits until no master holds `key` (a failed attempt is undone in the background).
async fn until_gone_everywhere(masters: &[RedisServer], key: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while masters
        .iter()
        .any(|master| master.cli(&["EXISTS", key]).trim() != "0")
    {
        assert!(
            Instant::now() < deadline,
            "the failed attempt on {key} was not undone"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `error` is a one-line `NoQuorum` naming each of `masters` as sitting out, with how
/// long it has left: more than `at_least`, at most `MAX_LEASE`.
fn assert_names_sitting_out(error: &LockError, masters: &[&RedisServer], at_least: Duration) {
    let LockError::NoQuorum { sitting_out, .. } = error else {
        panic!("not NoQuorum: {error:?}");
    };
    let urls: Vec<String> = masters.iter().map(|master| master.url()).collect();
    let named: Vec<&String> = sitting_out.iter().map(|(url, _)| url).collect();
    assert_eq!(named, urls.iter().collect::<Vec<_>>(), "{error}");
    for (url, left) in sitting_out {
        assert!(
            *left > at_least && *left <= MAX_LEASE,
            "{url} sits out for {left:?} more"
        );
    }
    let message = error.to_string();
    assert!(!message.contains('\n'), "{message}");
    assert!(error.is_unavailable(), "{error:?}");
    for url in &urls {
        assert!(message.contains(&format!("{url} for ")), "{message}");
    }
    assert!(message.contains("redlock vouch"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_deployment_locks_at_once_after_vouching() {
    let masters = three_blank_masters();
    let client = redlock(&masters, MAX_LEASE).await;

    // Before: every master sits out max_lease, and the error names each with its time.
    let error = client
        .lock("first")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect_err("a blank deployment voted at once");
    println!("{error}");
    assert!(
        matches!(
            error,
            LockError::NoQuorum {
                reached: 0,
                needed: 2,
                ..
            }
        ),
        "{error:?}"
    );
    assert_names_sitting_out(
        &error,
        &masters.iter().collect::<Vec<_>>(),
        MAX_LEASE - Duration::from_secs(5),
    );
    // A master with the traces of that attempt is still blank: vouching works after it.
    until_gone_everywhere(&masters, "first").await;

    let started = Instant::now();
    assert_eq!(client.vouch_for_blank_masters().await.expect("vouch"), 3);
    for master in &masters {
        assert_eq!(marker(master), vouched_marker(master));
        // The counter those attempts left goes with them: one beside a vouched marker
        // means locks taken since.
        assert_eq!(master.cli(&["EXISTS", "redlock:fence"]).trim(), "0");
    }
    // Nothing to do a second time, as long as nothing was locked since.
    assert_eq!(client.vouch_for_blank_masters().await.expect("again"), 0);

    // After: this client and a new one lock at once, without a wait.
    let guard = client
        .lock("first")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the vouched-for masters vote at once");
    guard.release().await.unwrap();
    let newcomer = redlock(&masters, MAX_LEASE).await;
    let guard = newcomer
        .lock("first")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a new client of the deployment locks at once");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Once locks were taken, the deployment is in use: no more vouching.
    let error = client
        .vouch_for_blank_masters()
        .await
        .expect_err("vouched for a deployment in use");
    println!("{error}");
    assert!(matches!(error, LockError::NotBlank { .. }), "{error:?}");
    assert!(error.is_misconfigured(), "{error:?}");
    guard.release().await.unwrap();
}

/// What a master can hold that makes the vouch refuse every master: its name, the
/// commands that put it there, and the key and words the error must name.
struct UsedMaster {
    case: &'static str,
    setup: Vec<Vec<String>>,
    key: &'static str,
    found: &'static str,
}

fn used_masters() -> Vec<UsedMaster> {
    let owner = format!("{}:1a", "0123456789abcdef".repeat(2));
    let command = |args: &[&str]| args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>();
    vec![
        UsedMaster {
            case: "a lock key",
            setup: vec![command(&[
                "SET",
                "order:1",
                &format!("{owner} 1795404822378057 1795404822378 billing-7"),
                "PX",
                "60000",
            ])],
            key: "order:1",
            found: "a lock;",
        },
        UsedMaster {
            case: "a lock kept for hold_at_least",
            setup: vec![command(&[
                "SET",
                "report:daily",
                &format!("kept:{owner} 17 18~ reports-2"),
                "PX",
                "60000",
            ])],
            key: "report:daily",
            found: "a lock;",
        },
        UsedMaster {
            case: "a marker naming another process",
            setup: vec![command(&[
                "SET",
                "redlock:boot",
                "0123456789abcdef0123456789abcdef01234567:1795404822378057:blank",
            ])],
            key: "redlock:boot",
            found: "naming another Redis process",
        },
        UsedMaster {
            case: "a vouched marker of another process",
            setup: vec![command(&[
                "SET",
                "redlock:boot",
                "0123456789abcdef0123456789abcdef01234567:0:vouched",
            ])],
            key: "redlock:boot",
            found: "naming another Redis process",
        },
        UsedMaster {
            case: "a marker that is not one",
            setup: vec![command(&["HSET", "redlock:boot", "a", "b"])],
            key: "redlock:boot",
            found: "restart marker",
        },
        UsedMaster {
            case: "a waitlist",
            setup: vec![command(&["ZADD", "redlock:waitlist:order:1", "1", "w"])],
            key: "redlock:waitlist:order:1",
            found: "a key of redlock's",
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_holding_a_lock_or_a_marker_is_refused_and_nothing_is_written() {
    for used in used_masters() {
        let masters = three_blank_masters();
        // The server of the master in use, as the vouch names it (its URL).
        let in_use = &masters[1];
        for args in &used.setup {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            in_use.cli(&args);
        }
        let before = marker(in_use);
        let client = redlock(&masters, MAX_LEASE).await;
        let error = client.vouch_for_blank_masters().await.expect_err(used.case);
        println!("{}: {error}", used.case);
        let LockError::NotBlank { url, key, .. } = &error else {
            panic!("{}: {error:?}", used.case);
        };
        assert_eq!(url, &in_use.url(), "{}", used.case);
        assert_eq!(key, used.key, "{}", used.case);
        assert_eq!(error.key(), used.key);
        assert!(error.is_misconfigured(), "{}: {error:?}", used.case);
        let message = error.to_string();
        assert!(!message.contains('\n'), "{message}");
        for needle in [
            &format!("cannot vouch for the RedLock master {}", in_use.url()),
            used.found,
            &format!("it holds `{}`, ", used.key),
        ] {
            assert!(message.contains(needle), "{}: {message}", used.case);
        }
        // Nothing written: the blank masters stay unmarked, the used one as it was.
        assert_eq!(marker(&masters[0]), "", "{}", used.case);
        assert_eq!(marker(&masters[2]), "", "{}", used.case);
        assert_eq!(marker(in_use), before, "{}", used.case);
        // And the deployment still sits out its quarantine.
        let error = client.lock("after").acquire().await.expect_err(used.case);
        assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_used_before_are_refused_by_what_they_hold() {
    // One server's client took and released a lock: the fencing counter stays, with no
    // marker of a first quarantine beside it.
    let masters = three_blank_masters();
    let one_server = LockClient::connect(&masters[2].url()).await.unwrap();
    one_server
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let error = redlock(&masters, MAX_LEASE)
        .await
        .vouch_for_blank_masters()
        .await
        .expect_err("a master in use");
    println!("{error}");
    assert!(
        matches!(&error, LockError::NotBlank { url, key, .. }
            if *url == masters[2].url() && key == "redlock:fence"),
        "{error:?}"
    );
    assert!(error.to_string().contains("fencing counter"), "{error}");
    assert!(masters.iter().all(|master| marker(master).is_empty()));

    // Masters found blank longer ago than max_lease may have voted since: refused.
    let masters = three_blank_masters();
    let short = redlock(&masters, Duration::from_secs(1)).await;
    let error = short.lock("k").acquire().await.expect_err("blank");
    assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    until_gone_everywhere(&masters, "k").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let markers: Vec<String> = masters.iter().map(marker).collect();
    let error = short
        .vouch_for_blank_masters()
        .await
        .expect_err("masters past their first quarantine");
    println!("{error}");
    assert!(
        matches!(&error, LockError::NotBlank { key, .. } if key == "redlock:boot"),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("older than max_lease"),
        "{error}"
    );
    assert_eq!(masters.iter().map(marker).collect::<Vec<_>>(), markers);

    // A master that does not answer: every master must be looked at.
    let mut masters = three_blank_masters();
    let client = redlock(&masters, MAX_LEASE).await;
    masters[0].kill();
    let error = client
        .vouch_for_blank_masters()
        .await
        .expect_err("a master is down");
    println!("{error}");
    assert!(
        matches!(&error, LockError::Connect { url, .. } if *url == masters[0].url()),
        "{error:?}"
    );
    assert!(error.is_unavailable(), "{error:?}");
    assert!(marker(&masters[1]).is_empty() && marker(&masters[2]).is_empty());
}

#[tokio::test]
async fn one_server_has_nothing_to_vouch_for() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let error = client
        .vouch_for_blank_masters()
        .await
        .expect_err("not RedLock");
    println!("{error}");
    assert!(
        matches!(error, LockError::InvalidOptions { .. }),
        "{error:?}"
    );
    assert!(error.is_misconfigured());
    assert!(error.to_string().contains("RedLock masters"), "{error}");
    assert_eq!(marker(&server), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_after_vouching_admits_no_second_holder() {
    // A vouched-for deployment in use, without persistence: A holds `k`; every master
    // is restarted in turn, 300 ms apart. Each comes back as a new Redis process, which
    // the vouch's mark does not name: it sits out max_lease again, so no client takes
    // `k` while A's lease runs, and the error names the masters sitting out.
    const MAX_LEASE: Duration = Duration::from_secs(4);
    const LEASE: Duration = Duration::from_secs(3);
    let mut masters = three_blank_masters();
    let a = redlock(&masters, MAX_LEASE).await;
    assert_eq!(a.vouch_for_blank_masters().await.unwrap(), 3);
    let held = a.lock("k").lease(LEASE).acquire().await.expect("A locks k");
    let lease_ends = Instant::now() + LEASE;
    let run_ids: Vec<String> = masters
        .iter()
        .map(|master| master.info_field("server", "run_id").unwrap())
        .collect();
    for master in &mut masters {
        master.restart();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (master, before) in masters.iter().zip(&run_ids) {
        assert_ne!(&master.info_field("server", "run_id").unwrap(), before);
        assert_eq!(
            marker(master),
            "",
            "a master kept its mark across a restart"
        );
    }

    let b = redlock(&masters, MAX_LEASE).await;
    let mut attempts = 0;
    while Instant::now() + Duration::from_millis(300) < lease_ends {
        match b.lock("k").lease(LEASE).acquire().await {
            Ok(stolen) => panic!(
                "B took k (token {}) while A's lease had {:?} to run",
                stolen.fencing_token(),
                lease_ends.saturating_duration_since(Instant::now())
            ),
            Err(error) => {
                assert!(
                    matches!(error, LockError::NoQuorum { reached: 0, .. }),
                    "{error:?}"
                );
                if attempts == 0 {
                    println!("{error}");
                    let LockError::NoQuorum { sitting_out, .. } = &error else {
                        unreachable!()
                    };
                    let named: Vec<&str> = sitting_out.iter().map(|(u, _)| u.as_str()).collect();
                    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
                    assert_eq!(named, urls.iter().map(String::as_str).collect::<Vec<_>>());
                }
                attempts += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(attempts >= 5, "only {attempts} attempts during A's lease");
    for master in &masters {
        let marker = marker(master);
        assert!(
            marker.ends_with(":blank") && !marker.contains(":0:"),
            "a restarted master was not quarantined: {marker:?}"
        );
    }
    // Availability comes back with the quarantine's end, as after any restart.
    let next = b
        .lock("k")
        .wait(MAX_LEASE + Duration::from_secs(2))
        .lease(LEASE)
        .acquire()
        .await
        .expect("B never got k after the quarantine");
    assert!(Instant::now() >= lease_ends, "B got k during A's lease");
    assert!(next.fencing_token() > held.fencing_token());
    next.release().await.unwrap();
    drop(held);
}
