//! Operating locks: `inspect`, `locks` and `force_unlock`, and the client's name that
//! they show, against real servers in every mode — one server, Redis Cluster, Sentinel
//! and RedLock — with holders and waiters in other OS processes, a holder in watchdog
//! mode evicted by another client, an annotated function aborted by a force-unlock, and
//! a database full of application keys that are not locks.
//!
//! A lock's Redis value is `<owner> <fencing token> <since ms> <client name>` (see
//! `scripts` in the runtime); these tests look at it behind the clients' backs too.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{client, raw};
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError, LockInfo, distributed_lock};
use redlock_testkit::sentinel::SERVICE;
use redlock_testkit::{RedisCluster, RedisServer, SentinelSetup};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The test that `a_holder_in_another_process_is_shown_by_its_name_and_token` runs in
/// a child process (a rerun of this test binary): keep it equal to that test's name.
const CHILD_HOLDER_TEST: &str = "child_holds_a_named_lock";
/// The test that `force_unlock_wakes_a_waiter_in_another_process_within_milliseconds`
/// runs in a child process: keep it equal to that test's name.
const CHILD_WAITER_TEST: &str = "child_waits_for_a_lock";
/// Environment of the child processes: the server's URL and the key.
const CHILD_URL: &str = "REDLOCK_TEST_OPERATE_URL";
const CHILD_KEY: &str = "REDLOCK_TEST_OPERATE_KEY";
/// What every report of a child on its stdout starts with (the test harness prints
/// text of its own around them).
const CHILD_REPORT: &str = "OPERATE-CHILD";

/// How long any "eventually" in these tests may take, on a busy 2-core machine.
const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `inspect(key)` until `done` holds of what it returns; panics after [`PATIENCE`].
async fn inspect_until(
    client: &LockClient,
    key: &str,
    what: &str,
    done: impl Fn(&Option<LockInfo>) -> bool,
) -> Option<LockInfo> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let info = client.inspect(key).await.expect("inspect");
        if done(&info) {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting for {what} on `{key}`; last seen: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The keys of a `locks` listing, in its order.
fn keys_of(listed: &[LockInfo]) -> Vec<&str> {
    listed.iter().map(LockInfo::key).collect()
}

/// The fencing token in a lock's raw Redis value (its second field).
fn token_in_value(value: &str) -> u64 {
    value
        .split(' ')
        .nth(1)
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("not a lock value: {value:?}"))
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros()
}

/// A rerun of this test binary running one child test, killed if the parent test fails
/// before it has finished with it.
struct ChildProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl ChildProcess {
    fn spawn(test: &str, url: &str, key: &str) -> Self {
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_URL, url)
            .env(CHILD_KEY, key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("rerun the test binary as a child process");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        ChildProcess {
            child,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("the child is running")
    }

    /// The fields after [`CHILD_REPORT`] of the child's next report.
    async fn report(&mut self, limit: Duration) -> Vec<String> {
        let reading = async {
            while let Some(line) = self.stdout.next_line().await.expect("read the child") {
                // The harness may have begun the line (`test … ... `) before the report.
                if let Some((_, report)) = line.split_once(CHILD_REPORT) {
                    return report.split_whitespace().map(str::to_owned).collect();
                }
            }
            panic!("the child process exited without reporting");
        };
        tokio::time::timeout(limit, reading)
            .await
            .expect("the child process did not report in time")
    }

    /// Closes the child's stdin (it releases its lock and exits) and checks it succeeded.
    async fn finish(mut self) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("the child process did not exit")
            .expect("wait for the child process");
        assert!(status.success(), "the child process failed: {status}");
    }
}

/// In a child process: waits until the parent closes stdin (or a minute has passed).
async fn until_parent_is_done() {
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::stdin().read_to_end(&mut rest),
    )
    .await;
}

/// Run by `a_holder_in_another_process_is_shown_by_its_name_and_token` in a child
/// process; a no-op otherwise. Its name is [`CHILD_HOLDER_TEST`].
#[tokio::test]
async fn child_holds_a_named_lock() {
    let (Ok(url), Ok(key)) = (std::env::var(CHILD_URL), std::env::var(CHILD_KEY)) else {
        return;
    };
    let client = LockClient::builder(&url)
        .name(format!("child-{}", std::process::id()))
        .connect()
        .await
        .unwrap();
    let guard = client
        .lock(key)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    println!("{CHILD_REPORT} holding {}", guard.fencing_token());
    until_parent_is_done().await;
    guard.release().await.unwrap();
}

/// Run by `force_unlock_wakes_a_waiter_in_another_process_within_milliseconds` in a
/// child process; a no-op otherwise. Its name is [`CHILD_WAITER_TEST`].
#[tokio::test]
async fn child_waits_for_a_lock() {
    let (Ok(url), Ok(key)) = (std::env::var(CHILD_URL), std::env::var(CHILD_KEY)) else {
        return;
    };
    let client = LockClient::builder(&url)
        .name(format!("waiter-{}", std::process::id()))
        .connect()
        .await
        .unwrap();
    let guard = client
        .lock(key)
        .wait(Duration::from_secs(20))
        .lease(Duration::from_secs(30))
        .acquire()
        .await;
    let at = unix_micros();
    let guard = guard.unwrap();
    println!("{CHILD_REPORT} acquired {at} {}", guard.fencing_token());
    until_parent_is_done().await;
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_one_server_shows_name_token_ttl_hold_time_and_waiters() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .name("billing-7")
        .connect()
        .await
        .unwrap();
    assert_eq!(holder.name(), "billing-7");
    let observer = client(&server).await;
    let default_name = observer.name().to_owned();
    let suffix = format!(":{}", std::process::id());
    assert!(
        default_name.ends_with(&suffix) && default_name.len() > suffix.len(),
        "the default name {default_name:?} is not `<hostname>{suffix}`"
    );

    assert_eq!(observer.inspect("invoice:42").await.unwrap(), None);

    let lease = Duration::from_secs(20);
    let guard = holder
        .lock("invoice:42")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let first = observer.inspect("invoice:42").await.unwrap().expect("held");
    assert_eq!(first.key(), "invoice:42");
    assert_eq!(first.holder(), "billing-7");
    assert_eq!(first.fencing_token(), guard.fencing_token());
    assert!(
        first.ttl() > Duration::ZERO && first.ttl() <= lease,
        "{first:?}"
    );
    assert!(first.held_for() < Duration::from_secs(5), "{first:?}");
    assert_eq!(first.waiting(), 0);
    assert!(!first.is_kept());

    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = observer.inspect("invoice:42").await.unwrap().expect("held");
    assert!(
        later.held_for() >= first.held_for() + Duration::from_millis(200),
        "held_for did not grow: {:?} then {:?}",
        first.held_for(),
        later.held_for()
    );
    assert!(later.ttl() < first.ttl(), "a fixed lease's ttl runs down");
    assert_eq!(later.fencing_token(), first.fencing_token());

    // Two other clients (processes, as far as Redis can tell) wait in line for it.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let url = server.url();
            tokio::spawn(async move {
                let waiter = LockClient::connect(&url).await.unwrap();
                let guard = waiter
                    .lock("invoice:42")
                    .wait(Duration::from_secs(30))
                    .lease(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                let token = guard.fencing_token();
                guard.release().await.unwrap();
                token
            })
        })
        .collect();
    let info = inspect_until(&observer, "invoice:42", "two waiters", |info| {
        info.as_ref().is_some_and(|info| info.waiting() == 2)
    })
    .await
    .unwrap();
    assert_eq!(info.holder(), "billing-7", "a waiter took the held lock");

    let token = guard.fencing_token();
    guard.release().await.unwrap();
    for waiter in waiters {
        let next = tokio::time::timeout(PATIENCE, waiter)
            .await
            .expect("a waiter never got the lock")
            .unwrap();
        assert!(next > token);
    }
    assert_eq!(observer.inspect("invoice:42").await.unwrap(), None);
}

#[tokio::test]
async fn a_lock_kept_for_hold_at_least_is_shown_as_kept_until_force_unlocked() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .name("nightly job")
        .connect()
        .await
        .unwrap();
    let observer = client(&server).await;
    let guard = holder
        .lock("report:daily")
        .lease(Duration::from_secs(20))
        .hold_at_least(Duration::from_secs(15))
        .acquire()
        .await
        .unwrap();
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let kept = observer
        .inspect("report:daily")
        .await
        .unwrap()
        .expect("kept by hold_at_least");
    assert!(kept.is_kept(), "{kept:?}");
    assert_eq!(
        kept.holder(),
        "nightly job",
        "a name with spaces runs to the end"
    );
    assert_eq!(kept.fencing_token(), token);
    assert_eq!(
        keys_of(&observer.locks("*").await.unwrap()),
        ["report:daily"]
    );
    assert!(observer.force_unlock("report:daily").await.unwrap());
    assert_eq!(observer.inspect("report:daily").await.unwrap(), None);
    let next = observer
        .lock("report:daily")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("free once force-unlocked");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_holder_in_another_process_is_shown_by_its_name_and_token() {
    let server = RedisServer::start();
    let observer = client(&server).await;
    let mut child = ChildProcess::spawn(CHILD_HOLDER_TEST, &server.url(), "export:9");
    let report = child.report(Duration::from_secs(30)).await;
    assert_eq!(report[0], "holding", "{report:?}");
    let token: u64 = report[1].parse().unwrap();

    let info = observer
        .inspect("export:9")
        .await
        .unwrap()
        .expect("held by the child");
    assert_eq!(info.holder(), format!("child-{}", child.pid()));
    assert_eq!(info.fencing_token(), token);
    assert_ne!(info.holder(), observer.name());
    let listed = observer.locks("export:*").await.unwrap();
    assert_eq!(keys_of(&listed), ["export:9"]);
    assert_eq!(listed[0].holder(), info.holder());
    assert_eq!(listed[0].fencing_token(), token);

    child.finish().await;
    assert_eq!(
        observer.inspect("export:9").await.unwrap(),
        None,
        "the child's release did not free it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_evicts_a_watchdog_holder_whose_late_release_is_lost() {
    let server = RedisServer::start();
    let evicted = LockClient::builder(&server.url())
        .name("evicted")
        .watchdog_lease(Duration::from_secs(3))
        .renew_every(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let operator = LockClient::builder(&server.url())
        .name("operator")
        .connect()
        .await
        .unwrap();
    let successor = LockClient::builder(&server.url())
        .name("successor")
        .connect()
        .await
        .unwrap();

    assert!(
        !operator.force_unlock("ledger").await.unwrap(),
        "a free key"
    );

    let guard = evicted.lock("ledger").acquire().await.unwrap();
    // Kept past its 3 s lease by the watchdog, so force_unlock is the only way out.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(!guard.is_lost());
    let info = operator.inspect("ledger").await.unwrap().expect("held");
    assert_eq!(info.holder(), "evicted");
    assert!(info.ttl() <= Duration::from_secs(3), "{info:?}");

    assert!(operator.force_unlock("ledger").await.unwrap());
    let unlocked_at = Instant::now();
    assert_eq!(operator.inspect("ledger").await.unwrap(), None);
    let next = successor
        .lock("ledger")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .expect("free once force-unlocked");
    assert!(
        next.fencing_token() > guard.fencing_token(),
        "tokens not ordered: {} after {}",
        next.fencing_token(),
        guard.fencing_token()
    );

    // Within a renewal (300 ms) plus slack, well before the 3 s lease could have run
    // out on its own: the renewal found it gone.
    tokio::time::timeout(Duration::from_millis(1500), guard.lost())
        .await
        .expect("the evicted holder did not learn it had lost the lock at its next renewal");
    assert!(guard.is_lost());
    assert!(
        unlocked_at.elapsed() < Duration::from_millis(2000),
        "lost after {:?}, not within a renewal",
        unlocked_at.elapsed()
    );
    let error = guard.release().await.unwrap_err();
    assert!(
        matches!(&error, LockError::Lost { key } if key == "ledger"),
        "{error}"
    );
    // The late release left the successor's lock alone, and the watchdog stopped.
    let info = operator.inspect("ledger").await.unwrap().expect("held");
    assert_eq!(info.holder(), "successor");
    assert_eq!(info.fencing_token(), next.fencing_token());
    assert_eq!(evicted.watched_locks(), 0);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_wakes_a_waiter_in_another_process_within_milliseconds() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .name("stuck-holder")
        .connect()
        .await
        .unwrap();
    let operator = client(&server).await;
    let guard = holder
        .lock("batch:5")
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let mut child = ChildProcess::spawn(CHILD_WAITER_TEST, &server.url(), "batch:5");
    let waiter = format!("waiter-{}", child.pid());
    // The child is in line on the Redis waitlist before the lock is freed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = operator.inspect("batch:5").await.unwrap().expect("held");
        assert_eq!(info.holder(), "stuck-holder");
        if info.waiting() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the child never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let unlocking_at = unix_micros();
    assert!(operator.force_unlock("batch:5").await.unwrap());
    let report = child.report(PATIENCE).await;
    assert_eq!(report[0], "acquired", "{report:?}");
    let acquired_at: u128 = report[1].parse().unwrap();
    let token: u64 = report[2].parse().unwrap();
    let delay = Duration::from_micros(acquired_at.saturating_sub(unlocking_at) as u64);
    // Woken by the release message: milliseconds, where the 60 s lease or the 20 s
    // wait would be seconds.
    assert!(
        delay < Duration::from_millis(500),
        "the waiter took the lock {delay:?} after the force-unlock"
    );
    let info = operator.inspect("batch:5").await.unwrap().expect("held");
    assert_eq!(info.holder(), waiter);
    assert_eq!(info.fencing_token(), token);
    assert!(token > guard.fencing_token());
    assert_eq!(info.waiting(), 0);

    // The evicted holder's release is lost and leaves the child's lock alone.
    assert!(guard.release().await.unwrap_err().is_lost());
    let info = operator.inspect("batch:5").await.unwrap().expect("held");
    assert_eq!(info.holder(), waiter);
    child.finish().await;
    assert_eq!(operator.inspect("batch:5").await.unwrap(), None);
}

#[distributed_lock(key = "nightly:<id>", client = locks, on_lost = "abort")]
async fn nightly_report(
    locks: &LockClient,
    id: u64,
    started: &AtomicBool,
    finished: &AtomicBool,
) -> Result<(), LockError> {
    started.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_aborts_an_annotated_function_in_watchdog_mode() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .name("nightly-runner")
        .watchdog_lease(Duration::from_secs(3))
        .renew_every(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let operator = client(&server).await;
    let (started, finished) = (AtomicBool::new(false), AtomicBool::new(false));
    let job = nightly_report(&locks, 7, &started, &finished);
    let evict = async {
        let info = inspect_until(&operator, "nightly:7", "the job's lock", Option::is_some)
            .await
            .unwrap();
        assert_eq!(info.holder(), "nightly-runner");
        assert!(info.ttl() <= Duration::from_secs(3), "not watchdog mode");
        assert!(operator.force_unlock("nightly:7").await.unwrap());
        Instant::now()
    };
    let (result, unlocked_at) =
        tokio::time::timeout(Duration::from_secs(15), async { tokio::join!(job, evict) })
            .await
            .expect("the body was not aborted");
    let stopped_after = unlocked_at.elapsed();
    assert!(started.load(Ordering::SeqCst));
    let error = result.unwrap_err();
    assert!(
        matches!(&error, LockError::Lost { key } if key == "nightly:7"),
        "{error}"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "the body ran on without the lock"
    );
    assert!(
        stopped_after < Duration::from_secs(3),
        "aborted {stopped_after:?} after the force-unlock, not within a renewal"
    );
    assert_eq!(operator.inspect("nightly:7").await.unwrap(), None);
    assert_eq!(locks.watched_locks(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_among_ten_thousand_other_keys_lists_only_the_locks() {
    let server = RedisServer::start();
    let mut data = raw(&server).await;
    // 10,000 keys of an application: strings (some with spaces, some with a lease, some
    // almost shaped like a lock), hashes, lists, sets and sorted sets.
    let mut pipe = redis::pipe();
    for i in 0..10_000 {
        match i % 10 {
            0 => {
                pipe.set(format!("order:data:{i}"), format!("value {i}"))
                    .ignore();
            }
            1 => {
                pipe.set(format!("app:text:{i}"), "a b c").ignore();
            }
            2 => {
                // Three fields and no name, with a lease: not what redlock writes.
                pipe.pset_ex(format!("order:cache:{i}"), "x 1 2", 600_000)
                    .ignore();
            }
            3 => {
                // Four fields with numbers in the middle and a lease, but an owner
                // redlock never writes; or a field that is not a number.
                let value = if i % 20 == 3 {
                    "user 1 2 name"
                } else {
                    "owner 12 not-a-time name"
                };
                pipe.pset_ex(format!("order:note:{i}"), value, 600_000)
                    .ignore();
            }
            4 => {
                pipe.set(format!("counter:{i}"), i).ignore();
            }
            5 => {
                pipe.hset(format!("order:hash:{i}"), "field", "x 1 2 y")
                    .ignore();
            }
            6 => {
                pipe.rpush(format!("order:list:{i}"), "x 1 2 y").ignore();
            }
            7 => {
                pipe.sadd(format!("app:set:{i}"), "x 1 2 y").ignore();
            }
            8 => {
                pipe.zadd(format!("app:zset:{i}"), "x 1 2 y", i).ignore();
            }
            _ => {
                pipe.set_ex(format!("session:{i}"), "user 42", 600).ignore();
            }
        }
    }
    // Shaped like a lock, but without the lease every lock has.
    pipe.set("order:legacy", "x 1 2 y").ignore();
    let () = pipe.query_async(&mut data).await.unwrap();
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut data).await.unwrap();
    assert_eq!(size, 10_001);

    let billing = LockClient::builder(&server.url())
        .name("billing-7")
        .connect()
        .await
        .unwrap();
    let night = LockClient::builder(&server.url())
        .name("night shift worker")
        .connect()
        .await
        .unwrap();
    let observer = client(&server).await;
    let first = billing
        .lock("order:1")
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let second = night
        .lock("order:2")
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    // Watchdog mode.
    let third = billing.lock("invoice:9").acquire().await.unwrap();
    // A waiter in line for order:1 gives it a waitlist; the fencing counter exists.
    let url = server.url();
    let waiter = tokio::spawn(async move {
        let waiter = LockClient::connect(&url).await.unwrap();
        let guard = waiter
            .lock("order:1")
            .wait(Duration::from_secs(30))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
    });
    inspect_until(&observer, "order:1", "a waiter", |info| {
        info.as_ref().is_some_and(|info| info.waiting() == 1)
    })
    .await;
    let own: Vec<String> = data.keys("redlock:*").await.unwrap();
    assert!(own.iter().any(|key| key == "redlock:fence"), "{own:?}");
    assert!(
        own.iter().any(|key| key.starts_with("redlock:waitlist:")),
        "{own:?}"
    );

    let all = tokio::time::timeout(Duration::from_secs(30), observer.locks("*"))
        .await
        .expect("locks(\"*\") took too long")
        .unwrap();
    assert_eq!(keys_of(&all), ["invoice:9", "order:1", "order:2"]);
    assert_eq!(all[0].holder(), "billing-7");
    assert_eq!(all[0].fencing_token(), third.fencing_token());
    assert_eq!(all[1].holder(), "billing-7");
    assert_eq!(all[1].fencing_token(), first.fencing_token());
    assert_eq!(all[1].waiting(), 1);
    assert_eq!(all[2].holder(), "night shift worker");
    assert_eq!(all[2].fencing_token(), second.fencing_token());
    assert_eq!(all[2].waiting(), 0);

    let orders = observer.locks("order:*").await.unwrap();
    assert_eq!(keys_of(&orders), ["order:1", "order:2"]);
    assert_eq!(
        keys_of(&observer.locks("order:[2-9]").await.unwrap()),
        ["order:2"]
    );
    assert!(observer.locks("nothing:*").await.unwrap().is_empty());

    // Application keys are not locks, whatever their type or shape, and force_unlock
    // leaves them alone.
    for key in [
        "order:data:0",
        "app:text:1",
        "order:cache:2",
        "order:note:3",
        "order:note:13",
        "counter:4",
        "order:hash:5",
        "order:list:6",
        "app:set:7",
        "app:zset:8",
        "session:9",
        "order:legacy",
        "missing",
    ] {
        assert_eq!(observer.inspect(key).await.unwrap(), None, "{key}");
        assert!(!observer.force_unlock(key).await.unwrap(), "{key}");
    }
    let legacy: String = data.get("order:legacy").await.unwrap();
    assert_eq!(legacy, "x 1 2 y");
    let field: String = data.hget("order:hash:5", "field").await.unwrap();
    assert_eq!(field, "x 1 2 y");
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut data).await.unwrap();
    assert!(
        size >= 10_001 + 3,
        "an application key is gone: {size} keys"
    );

    first.release().await.unwrap();
    tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter never got order:1")
        .unwrap();
    second.release().await.unwrap();
    third.release().await.unwrap();
    assert!(observer.locks("*").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_locks_lists_every_primary_and_force_unlock_frees() {
    let cluster = RedisCluster::start(3);
    let holder = LockClient::builder_for(cluster.urls())
        .cluster()
        .name("cluster-holder")
        .connect()
        .await
        .unwrap();
    let observer = LockClient::builder_for(cluster.urls())
        .cluster()
        .name("cluster-observer")
        .connect()
        .await
        .unwrap();
    // Two lock keys on each of the three masters.
    let mut per_master = [0usize; 3];
    let mut keys = Vec::new();
    for id in 0.. {
        let key = format!("order:{id}");
        let master = cluster.master_of(&key).expect("a master for every slot");
        if per_master[master] < 2 {
            per_master[master] += 1;
            keys.push(key);
        }
        if per_master.iter().all(|&count| count == 2) {
            break;
        }
    }
    keys.sort();
    // Application keys beside them, on every master too.
    let mut data = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    for id in 0..60 {
        let () = data.set(format!("order:app:{id}"), "a b c").await.unwrap();
        let () = data
            .hset(format!("order:hash:{id}"), "x", "y 1 2 z")
            .await
            .unwrap();
    }
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            holder
                .lock(key.as_str())
                .lease(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap(),
        );
    }

    let listed = observer.locks("*").await.unwrap();
    assert_eq!(keys_of(&listed), keys, "not every primary was scanned");
    for (info, guard) in listed.iter().zip(&guards) {
        assert_eq!(info.holder(), "cluster-holder");
        assert_eq!(info.fencing_token(), guard.fencing_token());
    }
    assert_eq!(observer.inspect("order:app:0").await.unwrap(), None);

    // A waiter in another client is counted on the waitlist in the lock's slot.
    let waited = keys[0].clone();
    let urls = cluster.urls();
    let waiting_key = waited.clone();
    let waiter = tokio::spawn(async move {
        let waiter = LockClient::builder_for(urls)
            .cluster()
            .name("cluster-waiter")
            .connect()
            .await
            .unwrap();
        let guard = waiter
            .lock(waiting_key)
            .wait(Duration::from_secs(30))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let token = guard.fencing_token();
        // Held until the parent has seen it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        guard.release().await.unwrap();
        token
    });
    inspect_until(&observer, &waited, "a waiter", |info| {
        info.as_ref().is_some_and(|info| info.waiting() == 1)
    })
    .await;

    // Force-unlock one key on every master; the waited one goes to its waiter.
    let mut guards = guards.into_iter();
    let mut evicted = Vec::new();
    for key in &keys {
        assert!(observer.force_unlock(key).await.unwrap(), "{key}");
        evicted.push(guards.next().unwrap());
    }
    let info = inspect_until(&observer, &waited, "the waiter's lock", |info| {
        info.as_ref()
            .is_some_and(|info| info.holder() == "cluster-waiter")
    })
    .await
    .unwrap();
    assert!(info.fencing_token() > evicted[0].fencing_token());
    for key in &keys[1..] {
        assert_eq!(observer.inspect(key).await.unwrap(), None, "{key}");
    }
    for guard in evicted {
        assert!(guard.release().await.unwrap_err().is_lost());
    }
    let token = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter never finished")
        .unwrap();
    assert_eq!(token, info.fencing_token());
    assert!(observer.locks("*").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_inspect_shows_the_holder() {
    let setup = SentinelSetup::start();
    let holder = LockClient::builder_for(setup.sentinel_urls())
        .sentinel(SERVICE)
        .name("sentinel-holder")
        .connect()
        .await
        .unwrap();
    let observer = LockClient::sentinel(setup.sentinel_urls(), SERVICE)
        .await
        .unwrap();
    let guard = holder
        .lock("invoice:7")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let info = observer.inspect("invoice:7").await.unwrap().expect("held");
    assert_eq!(info.holder(), "sentinel-holder");
    assert_eq!(info.fencing_token(), guard.fencing_token());
    assert!(info.ttl() <= Duration::from_secs(30));
    let listed = observer.locks("*").await.unwrap();
    assert_eq!(keys_of(&listed), ["invoice:7"]);
    assert_eq!(listed[0].holder(), "sentinel-holder");
    assert!(observer.force_unlock("invoice:7").await.unwrap());
    assert_eq!(observer.inspect("invoice:7").await.unwrap(), None);
    assert!(guard.release().await.unwrap_err().is_lost());
}

async fn redlock_client(masters: &[RedisServer], name: &str) -> LockClient {
    LockClient::builder_for(masters.iter().map(RedisServer::url))
        .name(name)
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the masters")
}

/// Three RedLock masters in use (vouched for: each votes at once), and a holder's and
/// an observer's client of them. One lock is taken and released first, so that the
/// scripts are loaded on every master and the tests' first acquisitions are answered
/// by all three alike (a master still loading its script answers late, with a larger
/// token of its own that the write-back then replaces).
async fn three_masters() -> (Vec<RedisServer>, LockClient, LockClient) {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let holder = redlock_client(&masters, "redlock-holder").await;
    let observer = redlock_client(&masters, "redlock-observer").await;
    holder
        .lock("warm-up")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    (masters, holder, observer)
}

/// The raw lock value on each master (`None` where the key is missing).
fn values_on(masters: &[RedisServer], key: &str) -> Vec<Option<String>> {
    masters
        .iter()
        .map(|master| {
            let value = master.cli(&["GET", key]);
            (!value.is_empty()).then_some(value)
        })
        .collect()
}

/// Waits until every master holds `key`: an acquisition returns once a majority has
/// granted it, and the last master may answer a moment later.
async fn held_on_every_master(masters: &[RedisServer], key: &str) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let values = values_on(masters, key);
        if values.iter().all(Option::is_some) {
            return values.into_iter().flatten().collect();
        }
        assert!(Instant::now() < deadline, "a master never got `{key}`");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redlock_inspect_shows_the_token_the_holder_was_given() {
    let (masters, holder, observer) = three_masters().await;
    for id in 0..5 {
        let key = format!("payout:{id}");
        let guard = holder
            .lock(key.as_str())
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let values = held_on_every_master(&masters, &key).await;
        let info = observer.inspect(&key).await.unwrap().expect("held");
        assert_eq!(info.holder(), "redlock-holder");
        // The token a resource sees with the holder's writes is the one an operator
        // must see, or comparing them misleads.
        assert_eq!(
            info.fencing_token(),
            guard.fencing_token(),
            "`{key}`: inspect shows a token the holder was not given; values on the masters: {values:?}"
        );
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redlock_inspect_reports_the_majoritys_view_and_force_unlock_frees_every_master() {
    let (mut masters, holder, observer) = three_masters().await;
    let lease = Duration::from_secs(30);
    let guard = holder
        .lock("payout:3")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let values = held_on_every_master(&masters, "payout:3").await;
    // A waiter of another client: RedLock keeps no waitlist, so none is counted.
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let waiter = tokio::spawn(async move {
        let waiter = LockClient::builder_for(urls)
            .name("redlock-waiter")
            .connect()
            .await
            .unwrap();
        let guard = waiter
            .lock("payout:3")
            .wait(Duration::from_secs(20))
            .lease(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        let token = guard.fencing_token();
        guard.release().await.unwrap();
        token
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let info = observer.inspect("payout:3").await.unwrap().expect("held");
    assert_eq!(info.holder(), "redlock-holder");
    assert_eq!(info.waiting(), 0);
    assert!(
        info.ttl() > Duration::ZERO && info.ttl() <= lease,
        "{info:?}"
    );
    // Documented: the largest token among the masters that agree.
    let largest = values.iter().map(|value| token_in_value(value)).max();
    assert_eq!(Some(info.fencing_token()), largest, "{values:?}");

    // The key gone from one master: the other two still agree on the holder.
    assert_eq!(masters[0].cli(&["DEL", "payout:3"]), "1");
    let info = observer.inspect("payout:3").await.unwrap().expect("held");
    assert_eq!(info.holder(), "redlock-holder");
    assert_eq!(info.waiting(), 0);
    let largest_left = values[1..].iter().map(|value| token_in_value(value)).max();
    assert_eq!(Some(info.fencing_token()), largest_left, "{values:?}");
    assert_eq!(
        keys_of(&observer.locks("payout:*").await.unwrap()),
        ["payout:3"]
    );

    // Freed on every master, whoever holds it; the waiter gets it next.
    assert!(observer.force_unlock("payout:3").await.unwrap());
    for value in values_on(&masters, "payout:3").into_iter().flatten() {
        assert!(
            !value.ends_with(" redlock-holder"),
            "the evicted lock is left on a master: {value:?}"
        );
    }
    let next = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter never got the lock")
        .unwrap();
    assert!(next > guard.fencing_token());
    assert!(guard.release().await.unwrap_err().is_lost());

    // With one master stopped, the two left still report the lock, and free it.
    let guard = holder
        .lock("payout:4")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    held_on_every_master(&masters, "payout:4").await;
    masters[2].kill();
    let started = Instant::now();
    let info = observer.inspect("payout:4").await.unwrap().expect("held");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(info.holder(), "redlock-holder");
    assert_eq!(info.waiting(), 0);
    assert_eq!(keys_of(&observer.locks("*").await.unwrap()), ["payout:4"]);
    assert!(observer.force_unlock("payout:4").await.unwrap());
    assert_eq!(values_on(&masters[..2], "payout:4"), [None, None]);
    assert_eq!(observer.inspect("payout:4").await.unwrap(), None);
    assert!(guard.release().await.unwrap_err().is_lost());
}

#[tokio::test]
async fn bad_keys_and_names_are_refused_by_name() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let error = client.inspect("").await.unwrap_err();
    assert!(
        matches!(&error, LockError::InvalidKey { key, .. } if key.is_empty()),
        "{error}"
    );
    for key in ["redlock:fence", "redlock:waitlist:order:1"] {
        let error = client.force_unlock(key).await.unwrap_err();
        assert!(
            matches!(&error, LockError::InvalidKey { key: named, .. } if named == key),
            "{error}"
        );
        assert!(error.to_string().contains(key), "{error}");
        let error = client.inspect(key).await.unwrap_err();
        assert!(matches!(error, LockError::InvalidKey { .. }), "{error}");
    }
    let error = client.force_unlock(&"k".repeat(2000)).await.unwrap_err();
    assert!(matches!(error, LockError::InvalidKey { .. }), "{error}");
    let error = client.locks("").await.unwrap_err();
    assert!(matches!(error, LockError::InvalidKey { .. }), "{error}");
    // redlock's own keys are never listed, even when the pattern names them.
    assert!(client.locks("redlock:*").await.unwrap().is_empty());

    for name in [
        String::new(),
        "tab\there".to_owned(),
        "line\nbreak".to_owned(),
        "n".repeat(201),
    ] {
        let error = LockClient::builder(&server.url())
            .name(name.clone())
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(&error, LockError::InvalidOptions { reason, .. } if reason.contains("name")),
            "{name:?}: {error}"
        );
    }
    let longest = LockClient::builder(&server.url())
        .name("n".repeat(200))
        .connect()
        .await
        .unwrap();
    let guard = longest
        .lock("long-name")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let info = client.inspect("long-name").await.unwrap().expect("held");
    assert_eq!(info.holder(), "n".repeat(200));
    guard.release().await.unwrap();
}

/// Runs one operation, which must fail, within `limit`.
async fn fails_within<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    operation: impl Future<Output = Result<T, LockError>>,
) -> LockError {
    let started = Instant::now();
    let result = tokio::time::timeout(limit, operation)
        .await
        .unwrap_or_else(|_| panic!("{what} hung for {limit:?}"));
    let error = result.expect_err(what);
    assert!(started.elapsed() < limit, "{what}: {:?}", started.elapsed());
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_on_a_dead_or_hung_server_fail_within_bounds() {
    let mut server = RedisServer::start();
    let client = LockClient::builder(&server.url())
        .response_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    assert_eq!(client.inspect("job").await.unwrap(), None);
    let limit = Duration::from_secs(10);

    // Hung: SIGSTOP, the socket stays open and nothing answers.
    server.pause();
    let resume = ResumeOnDrop(&server);
    let error = fails_within("inspect (hung)", limit, client.inspect("job")).await;
    assert_eq!(error.key(), "job", "{error}");
    let error = fails_within("force_unlock (hung)", limit, client.force_unlock("job")).await;
    assert_eq!(error.key(), "job", "{error}");
    fails_within("locks (hung)", limit, client.locks("*")).await;
    drop(resume);

    // Dead: connections refused.
    server.kill();
    let error = fails_within("inspect (dead)", limit, client.inspect("job")).await;
    assert_eq!(error.key(), "job", "{error}");
    fails_within("force_unlock (dead)", limit, client.force_unlock("job")).await;
    fails_within("locks (dead)", limit, client.locks("*")).await;
}

/// Resumes a server paused with SIGSTOP when dropped, also when the test panics.
struct ResumeOnDrop<'a>(&'a RedisServer);

impl Drop for ResumeOnDrop<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

#[tokio::test]
async fn evict_returns_the_lock_it_freed() {
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .name("billing-7")
        .connect()
        .await
        .unwrap();
    let operator = client(&server).await;
    assert!(operator.evict("order:7").await.unwrap().is_none(), "free");
    let guard = holder
        .lock("order:7")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let evicted = operator
        .evict("order:7")
        .await
        .unwrap()
        .expect("it was held");
    assert_eq!(evicted.key(), "order:7");
    assert_eq!(evicted.holder(), "billing-7");
    assert_eq!(evicted.fencing_token(), guard.fencing_token());
    assert!(evicted.ttl() > Duration::from_secs(25), "{evicted:?}");
    assert!(operator.inspect("order:7").await.unwrap().is_none());
    assert!(guard.release().await.unwrap_err().is_lost());
}

/// A client named `name` whose watchdog renews every 300 ms (a 3 s lease).
async fn renewing_client(server: &RedisServer, name: &str) -> LockClient {
    LockClient::builder(&server.url())
        .name(name)
        .watchdog_lease(Duration::from_secs(3))
        .renew_every(Duration::from_millis(300))
        .connect()
        .await
        .unwrap()
}

/// The keys left on `server`, sorted.
async fn keys_left(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = raw(server).await.keys("*").await.unwrap();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_share_name_is_left_once_no_share_is_held() {
    let server = RedisServer::start();
    let a = renewing_client(&server, "reader-a").await;
    let b = renewing_client(&server, "reader-b").await;
    let short = client(&server).await;
    let names = |key: &str| format!("redlock:names:{key}");
    let named = |info: Option<LockInfo>| -> Vec<String> {
        let info = info.expect("held in shares");
        info.shares().iter().map(|s| s.name().to_owned()).collect()
    };

    // Released: each release takes its share's name along, the last one the rest.
    let first = a.read_lock("doc:1").acquire().await.unwrap();
    let second = b.read_lock("doc:1").acquire().await.unwrap();
    first.release().await.unwrap();
    let left: HashMap<String, String> = raw(&server).await.hgetall(names("doc:1")).await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(named(b.inspect("doc:1").await.unwrap()), ["reader-b"]);
    second.release().await.unwrap();
    assert_eq!(keys_left(&server).await, ["redlock:fence"]);

    // A reader that dies (a 400 ms lease, never released): its name goes with its
    // share at its lease's end, while a live reader's watchdog renews its own.
    let dead = short
        .read_lock("doc:2")
        .lease(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap();
    std::mem::forget(dead);
    let live = b.read_lock("doc:2").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(named(b.inspect("doc:2").await.unwrap()), ["reader-b"]);
    let left: i64 = raw(&server).await.hlen(names("doc:2")).await.unwrap();
    assert_eq!(left, 1, "the dead reader's name is left");
    live.release().await.unwrap();
    // And alone: everything expires with its lease.
    let dead = short
        .semaphore("api", 2)
        .lease(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap();
    std::mem::forget(dead);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(keys_left(&server).await, ["redlock:fence"]);

    // Kept for its minimum hold: shown with its name until that ends, then gone.
    let kept = a
        .semaphore("jobs", 1)
        .lease(Duration::from_secs(10))
        .hold_at_least(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let token = kept.fencing_token();
    kept.release().await.unwrap();
    let info = b.inspect("jobs").await.unwrap().expect("kept");
    let share = &info.shares()[0];
    assert!(share.is_kept());
    assert_eq!((share.name(), share.fencing_token()), ("reader-a", token));
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(keys_left(&server).await, ["redlock:fence"]);

    // Force-unlocked: only the eviction markers stay, with the leases they evicted.
    let reader = a.read_lock("doc:3").acquire().await.unwrap();
    let permit = b.semaphore("api", 2).acquire().await.unwrap();
    assert!(short.force_unlock("doc:3").await.unwrap());
    assert!(short.force_unlock("api").await.unwrap());
    assert_eq!(
        keys_left(&server).await,
        [
            "redlock:fence",
            "redlock:forced:api",
            "redlock:forced:doc:3"
        ]
    );
    for guard in [reader, permit] {
        tokio::time::timeout(Duration::from_millis(2500), guard.lost())
            .await
            .expect("an evicted share did not learn it was lost");
        assert!(guard.release().await.unwrap_err().is_lost());
    }
    assert_eq!(
        keys_left(&server).await,
        [
            "redlock:fence",
            "redlock:forced:api",
            "redlock:forced:doc:3"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_permit_holders_are_shown_and_force_unlock_evicts_them() {
    use redlock_runtime::LockKind;
    let server = RedisServer::start();
    let a = renewing_client(&server, "reader-a").await;
    let b = renewing_client(&server, "reader-b").await;
    let operator = client(&server).await;
    let readers = [
        a.read_lock("doc:7").acquire().await.unwrap(),
        b.read_lock("doc:7").acquire().await.unwrap(),
    ];
    let permits = [
        a.semaphore("partner-api", 3).acquire().await.unwrap(),
        b.semaphore("partner-api", 3).acquire().await.unwrap(),
    ];

    // Shown, not "free": each share with its client and its own lease.
    let read = operator
        .inspect("doc:7")
        .await
        .unwrap()
        .expect("held by readers");
    assert_eq!(read.kind(), LockKind::Read);
    assert_eq!(read.holder(), "2 readers");
    let semaphore = operator
        .inspect("partner-api")
        .await
        .unwrap()
        .expect("held");
    assert_eq!(semaphore.kind(), LockKind::Semaphore { permits: 3 });
    assert_eq!(semaphore.holder(), "2 of 3 permits");
    for info in [&read, &semaphore] {
        let shares = info.shares();
        assert_eq!(shares.len(), 2, "{info:?}");
        assert_ne!(shares[0].client_id(), shares[1].client_id(), "{info:?}");
        for share in shares {
            assert!(share.ttl() > Duration::ZERO && share.ttl() <= Duration::from_secs(3));
            assert!(!share.is_kept());
        }
        assert!(info.ttl() > Duration::ZERO && info.ttl() <= Duration::from_secs(3));
    }
    // One client's shares carry the same id.
    let ids = |info: &LockInfo| {
        let mut ids: Vec<String> = info
            .shares()
            .iter()
            .map(|s| s.client_id().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&read), ids(&semaphore));
    // Each share with its client's name and its guard's fencing token.
    let named = |info: &LockInfo| {
        let mut named: Vec<(String, u64)> = info
            .shares()
            .iter()
            .map(|s| (s.name().to_owned(), s.fencing_token()))
            .collect();
        named.sort();
        named
    };
    assert_eq!(
        named(&read),
        [
            ("reader-a".to_owned(), readers[0].fencing_token()),
            ("reader-b".to_owned(), readers[1].fencing_token()),
        ]
    );
    assert_eq!(
        named(&semaphore),
        [
            ("reader-a".to_owned(), permits[0].fencing_token()),
            ("reader-b".to_owned(), permits[1].fencing_token()),
        ]
    );
    assert!(readers[0].fencing_token() > 0 && permits[1].fencing_token() > 0);
    let listed = operator.locks("*").await.unwrap();
    assert_eq!(keys_of(&listed), ["doc:7", "partner-api"]);
    assert_eq!(listed[0].shares().len(), 2);
    assert_eq!(listed[1].kind(), LockKind::Semaphore { permits: 3 });

    // A forced unlock evicts every share, leaves the eviction marker naming each
    // evicted share, and frees the key for a writer at once.
    assert!(operator.force_unlock("doc:7").await.unwrap());
    let evicted = operator
        .evict("partner-api")
        .await
        .unwrap()
        .expect("evicted");
    assert_eq!(
        named(&evicted),
        named(&semaphore),
        "what was evicted, named"
    );
    let unlocked_at = Instant::now();
    assert_eq!(operator.inspect("doc:7").await.unwrap(), None);
    assert_eq!(operator.inspect("partner-api").await.unwrap(), None);
    for key in ["doc:7", "partner-api"] {
        let marker: String = raw(&server)
            .await
            .get(format!("redlock:forced:{key}"))
            .await
            .unwrap();
        assert_eq!(marker.split(' ').count(), 2, "{key}: {marker}");
        let holders: i64 = raw(&server)
            .await
            .exists(format!("redlock:holders:{key}"))
            .await
            .unwrap();
        assert_eq!(holders, 0, "{key}: shares left behind");
        let names: i64 = raw(&server)
            .await
            .exists(format!("redlock:names:{key}"))
            .await
            .unwrap();
        assert_eq!(names, 0, "{key}: share names left behind");
    }
    let writer = operator
        .write_lock("doc:7")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("free once force-unlocked");

    // The evicted holders learn it at their next renewal (300 ms), far before their
    // 3 s leases would have run out; their late releases are Lost.
    for guard in readers.into_iter().chain(permits) {
        tokio::time::timeout(Duration::from_millis(2500), guard.lost())
            .await
            .expect("an evicted share did not learn it was lost at its next renewal");
        let error = guard.release().await.unwrap_err();
        assert!(error.is_lost(), "{error}");
    }
    assert!(unlocked_at.elapsed() < Duration::from_secs(3));
    let info = operator
        .inspect("doc:7")
        .await
        .unwrap()
        .expect("the writer");
    assert_eq!(info.kind(), LockKind::Exclusive);
    assert_eq!(info.fencing_token(), writer.fencing_token());
    writer.release().await.unwrap();
    assert_eq!(a.watched_locks() + b.watched_locks(), 0);
}
