//! RedLock over five independent redis-server processes, with masters killed and
//! restarted empty.
//!
//! A master that may have lost data (its restart marker is missing or names another
//! Redis process) does not vote until the client's `max_lease` has passed since that
//! was noticed — a master redlock never used included, since it looks the same. Most
//! tests start masters vouched for ([`RedisServer::start_redlock_master`]: a marker as a
//! deployment in use has it), so that they measure their subject rather than that
//! quarantine; `a_first_deployment_costs_max_lease_once` and
//! `a_rolling_restart_of_every_master_admits_no_second_holder` start from blank ones.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError};
use redlock_testkit::RedisServer;

fn five_masters() -> Vec<RedisServer> {
    (0..5)
        .map(|_| RedisServer::start_redlock_master())
        .collect()
}

async fn redlock(masters: &[RedisServer]) -> LockClient {
    LockClient::builder_for(masters.iter().map(RedisServer::url))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the masters")
}

/// One lock and release with every master up and answering, before a test kills any:
/// the client's connections to every master are up and its scripts loaded.
async fn lock_once_with_all_up(client: &LockClient) {
    let guard = client
        .lock("warm-up")
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .expect("a lock with every master up");
    guard.release().await.unwrap();
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
    // A release is decided once a majority has answered; a slow master's part finishes
    // in the background, within its response timeout (0.5 s; three of them allowed
    // here, far below the 5 s lease a lock left behind would keep).
    for (n, master) in masters.iter().enumerate() {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
        while !keys_on(master, "shared").await.is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a lock key was left behind on master {n}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn two_masters_down_still_lock() {
    let mut masters = five_masters();
    let clients = [redlock(&masters).await, redlock(&masters).await];
    lock_once_with_all_up(&clients[0]).await;
    masters[0].kill();
    masters[3].kill();
    let tokens = exclusive_rounds(&clients, 4, 5).await;
    assert_eq!(tokens.len(), 20);
}

#[tokio::test]
async fn three_masters_down_is_no_quorum_within_the_wait() {
    let mut masters = five_masters();
    let client = redlock(&masters).await;
    // The two survivors vote (their markers are old), and `reached` is 2.
    lock_once_with_all_up(&client).await;
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

/// Redis's `INFO server` uptime, in whole seconds, of one master.
fn uptime(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|line| line.strip_prefix("uptime_in_seconds:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("uptime_in_seconds in INFO server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_empty_does_not_vote_until_max_lease_has_passed() {
    // Never more than a minority (two of five) is down at once, yet without a
    // quarantine the restarted masters 3, 4 and 5 (indices 2, 3, 4) would give a second
    // owner a majority while the first owner's lease on 1, 2 and 3 still runs.
    const MAX_LEASE: Duration = Duration::from_secs(3);
    let mut masters = five_masters();
    let client = || async {
        LockClient::builder_for(masters.iter().map(RedisServer::url))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(500))
            .max_lease(MAX_LEASE)
            // No lease may outlast max_lease, the watchdog's included.
            .watchdog_lease(MAX_LEASE)
            .renew_every(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect to the masters")
    };
    let a = client().await;
    let b = client().await;
    lock_once_with_all_up(&a).await;

    masters[3].kill();
    masters[4].kill();
    // Redis's `uptime_in_seconds` is the difference of two whole-second wall clocks,
    // so it runs up to 1 s ahead of the real time since the start. Restarting late in
    // a wall-clock second makes a quarantine that trusts it end measurably early,
    // every run, instead of by chance.
    late_in_a_wall_clock_second().await;
    let held = a
        .lock("restarted")
        .lease(MAX_LEASE)
        .acquire()
        .await
        .expect("A locks on masters 1, 2 and 3 (they served redlock before)");
    for index in [0, 1, 2] {
        assert_eq!(keys_on(&masters[index], "restarted").await.len(), 1);
    }

    // 4 and 5 come back empty, then 3 restarts empty: only 1 and 2 still know A holds
    // the lock. No master's process is older than `restarted_at` from here on.
    let restarted_at = Instant::now();
    masters[3].restart();
    masters[4].restart();
    masters[2].restart();
    for index in [2, 3, 4] {
        assert!(
            uptime(&masters[index]) < MAX_LEASE.as_secs(),
            "master {} restarted too slowly for this test",
            index + 1
        );
    }

    // B tries while A's lease still runs. A short wait rather than none rides over B's
    // connections to the restarted masters being re-established (a first attempt could
    // fail on a dropped connection and prove nothing); it ends long before A's lease.
    let attempt = b
        .lock("restarted")
        .wait(Duration::from_millis(500))
        .lease(MAX_LEASE)
        .acquire()
        .await;
    let a_still_held = !held.is_lost();
    match attempt {
        Ok(stolen) => panic!(
            "B locked `restarted` (token {}) on the restarted masters while A's lease still ran (A's guard lost: {})",
            stolen.fencing_token(),
            !a_still_held
        ),
        Err(error) => assert!(
            matches!(
                error,
                LockError::Timeout { .. } | LockError::NoQuorum { .. }
            ),
            "{error:?}"
        ),
    }
    assert!(
        a_still_held,
        "B's attempt ended after A's lease: it proves nothing"
    );

    // A releases. Only 1 and 2 still hold its key (3 forgot it, 4 and 5 never had
    // it), so the release may be confirmed, denied (Lost), or, with only 1 and 2
    // voting, undecided (NoQuorum).
    let a_token = held.fencing_token();
    let released = held.release().await;
    assert!(
        matches!(
            released,
            Ok(()) | Err(LockError::Lost { .. } | LockError::NoQuorum { .. })
        ),
        "{released:?}"
    );
    // Either way it deleted the key where A held it (perhaps in the background).
    let deadline = Instant::now() + Duration::from_secs(1);
    for index in [0, 1] {
        while !keys_on(&masters[index], "restarted").await.is_empty() {
            assert!(
                Instant::now() < deadline,
                "A's release left its key on master {}",
                index + 1
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // The same client B, not restarted, gets the lock once the restarted masters have
    // been up for max_lease: it needs one of them (1 and 2 are only two votes), and
    // none can vote before `restarted_at + MAX_LEASE`.
    let next = b
        .lock("restarted")
        .wait(MAX_LEASE + Duration::from_secs(5))
        .lease(MAX_LEASE)
        .acquire()
        .await
        .expect("B never got the lock after the quarantine ended");
    assert!(
        restarted_at.elapsed() >= MAX_LEASE,
        "B got a majority {:?} after the restarts, before any restarted master had been up \
         for max_lease (a lock taken on one just before it crashed could still run); \
         uptime_in_seconds reads {MAX_LEASE:?} up to 1 s early",
        restarted_at.elapsed()
    );
    assert!(next.fencing_token() > a_token, "fencing went backwards");
    let b_token = next.fencing_token();
    next.release().await.unwrap();

    // The restarted masters vote again: with 1 and 2 down, 3, 4 and 5 are the majority.
    masters[0].kill();
    masters[1].kill();
    let last = b
        .lock("restarted")
        .wait(MAX_LEASE + Duration::from_secs(2))
        .lease(MAX_LEASE)
        .acquire()
        .await
        .expect("masters 3, 4 and 5 never voted again");
    assert!(last.fencing_token() > b_token, "fencing went backwards");
    last.release().await.unwrap();
}

/// Sleeps until the wall clock is 750–900 ms into a second.
async fn late_in_a_wall_clock_second() {
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    let target = 750;
    let pause = if into < target {
        target - into
    } else {
        1000 - into + target
    };
    tokio::time::sleep(Duration::from_millis(u64::from(pause))).await;
}

/// Two clients of `masters` (a holder and a rival), each past its first lock.
async fn two_warm_clients(
    masters: &[RedisServer],
    response_timeout: Duration,
) -> (LockClient, LockClient) {
    let client = || async {
        LockClient::builder_for(masters.iter().map(RedisServer::url))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(response_timeout)
            .connect()
            .await
            .expect("connect to the masters")
    };
    let (holder, rival) = (client().await, client().await);
    lock_once_with_all_up(&holder).await;
    lock_once_with_all_up(&rival).await;
    (holder, rival)
}

/// SIGSTOPs a master; SIGCONTs it when dropped, panic or not, so that the kill on
/// drop reaps a running process.
struct Paused<'a>(&'a RedisServer);

impl<'a> Paused<'a> {
    fn new(server: &'a RedisServer) -> Self {
        server.pause();
        Paused(server)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_does_not_slow_release_extend_or_a_contended_acquire() {
    // A master that accepts commands and never answers (stopped, swapping, stuck in a
    // long script) is one of five: the other four are a majority and answer at once,
    // so no operation should wait for the response timeout.
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
    // Well under the response timeout; today each operation takes it in full.
    const PROMPT: Duration = Duration::from_millis(1500);
    let masters = five_masters();
    let (holder, rival) = two_warm_clients(&masters, RESPONSE_TIMEOUT).await;

    let paused = Paused::new(&masters[4]);
    let started = Instant::now();
    let guard = holder
        .lock("hung")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("four of five masters answer");
    eprintln!("acquire with a hung master: {:?}", started.elapsed());

    let started = Instant::now();
    guard.extend(Duration::from_secs(10)).await.unwrap();
    let extend_took = started.elapsed();

    // The rival's per-master timeout is a tenth of its 5 s lease; the four live masters
    // say at once that the lock is held.
    let started = Instant::now();
    let error = rival
        .lock("hung")
        .wait(Duration::from_millis(100))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    let contended_took = started.elapsed();
    assert!(error.is_timeout(), "{error:?}");

    let started = Instant::now();
    guard.release().await.unwrap();
    let release_took = started.elapsed();
    eprintln!(
        "with a hung master: extend {extend_took:?}, contended acquire {contended_took:?}, release {release_took:?}"
    );
    assert!(
        extend_took < PROMPT && contended_took < PROMPT && release_took < PROMPT,
        "waited on the hung master: extend took {extend_took:?}, a contended acquire with a \
         100 ms wait {contended_took:?}, release {release_took:?} (each should be < {PROMPT:?})"
    );

    // The release happened on the live masters (a majority confirmed it before it
    // returned; the fourth may still be finishing).
    let deadline = Instant::now() + Duration::from_secs(2);
    for master in &masters[..4] {
        while !keys_on(master, "hung").await.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the release left the key on {}",
                master.url()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_not_held_up_by_a_hung_master() {
    // A long wait used to hide nothing: the waiter subscribed on every master and
    // waited for each confirmation, so a hung master's SUBSCRIBE cost the whole
    // response timeout before the waiter could hear the release.
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
    let masters = five_masters();
    let (holder, rival) = two_warm_clients(&masters, RESPONSE_TIMEOUT).await;
    let paused = Paused::new(&masters[4]);
    let guard = holder
        .lock("hung-wait")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("four of five masters answer");
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        guard.release().await
    });
    let started = Instant::now();
    let next = rival
        .lock("hung-wait")
        .wait(Duration::from_secs(10))
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the rival gets the lock after the release");
    let took = started.elapsed();
    release.await.unwrap().unwrap();
    eprintln!("waiter with a hung master got the lock after {took:?}");
    assert!(
        took < Duration::from_millis(1500),
        "the waiter took {took:?} for a lock released after 200 ms (response timeout {RESPONSE_TIMEOUT:?})"
    );
    next.release().await.unwrap();
    drop(paused);
}

#[tokio::test]
async fn nothing_keeps_a_key_longer_than_max_lease() {
    // A restarted master sits out `max_lease`; a lock that could outlive it by an
    // extension or a minimum hold would be forgotten while still running.
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let client = LockClient::builder_for(masters.iter().map(RedisServer::url))
        .max_lease(Duration::from_secs(5))
        .watchdog_lease(Duration::from_secs(2))
        .renew_every(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let refused = |result: Result<_, LockError>, what: &str| match result {
        Err(LockError::InvalidOptions { reason, .. }) => {
            assert!(reason.contains("max_lease"), "{what}: {reason}")
        }
        other => panic!("{what}: expected InvalidOptions naming max_lease, got {other:?}"),
    };
    refused(
        client
            .lock("long")
            .lease(Duration::from_secs(6))
            .acquire()
            .await
            .map(drop),
        "lease",
    );
    refused(
        client
            .lock("long")
            .hold_at_least(Duration::from_secs(3600))
            .acquire()
            .await
            .map(drop),
        "hold_at_least",
    );
    let guard = client
        .lock("long")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    refused(guard.extend(Duration::from_secs(3600)).await, "extend");
    for master in &masters {
        let pttl: i64 = master.cli(&["PTTL", "long"]).trim().parse().unwrap();
        assert!(
            pttl <= 5_000,
            "a refused extend changed the expiry: {pttl} ms"
        );
    }
    guard.extend(Duration::from_secs(4)).await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_max_lease_elsewhere_does_not_shorten_the_quarantine() {
    // Clients with different `max_lease` share the masters' restart markers: one with
    // a short quarantine must not end the quarantine another relies on.
    let mut masters = five_masters();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let long = || {
        LockClient::builder_for(urls.clone())
            .max_lease(Duration::from_secs(30))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(500))
            .connect()
    };
    let a = long().await.unwrap();
    let b = long().await.unwrap();
    let short = LockClient::builder_for(urls.clone())
        .max_lease(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(1))
        .renew_every(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    lock_once_with_all_up(&a).await;
    // The sequence: 4 and 5 down, A locks on 1, 2, 3, 4 and 5 come back empty,
    // 3 restarts empty.
    masters[3].kill();
    masters[4].kill();
    let guard = a
        .lock("k")
        .wait(Duration::from_secs(2))
        .lease(Duration::from_secs(25))
        .acquire()
        .await
        .expect("A locks on the three masters up");
    masters[3].restart();
    masters[4].restart();
    masters[2].restart();
    // The short client notices the restarts and, after its own second, counts them.
    // (2.5 s: past a 1 s quarantine however it is counted, whole seconds included.)
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for round in 0..3 {
        let other = short
            .lock(format!("other-{round}"))
            .wait(Duration::from_secs(3))
            .lease(Duration::from_millis(500))
            .acquire()
            .await
            .expect("the short client votes with the restarted masters after 1 s");
        other.release().await.ok();
    }
    let attempt = b
        .lock("k")
        .wait(Duration::from_millis(500))
        .lease(Duration::from_secs(5))
        .acquire()
        .await;
    eprintln!(
        "B's attempt: {:?}",
        attempt.as_ref().map(|guard| guard.fencing_token())
    );
    assert!(
        attempt.is_err(),
        "B locked `k` through masters still in its 30 s quarantine while A held it"
    );
    assert!(!guard.is_lost());
    drop(guard);
}

#[tokio::test]
async fn a_master_that_lost_its_data_without_a_restart_does_not_vote_at_once() {
    // A flush (or a replica promoted behind the master's address) loses locks without
    // a restart: the process has run for longer than `max_lease`, but the data it
    // serves has not. The quarantine starts when the loss is noticed.
    let masters = five_masters();
    let client = || {
        LockClient::builder_for(masters.iter().map(RedisServer::url))
            .max_lease(Duration::from_secs(1))
            .watchdog_lease(Duration::from_secs(1))
            .renew_every(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(500))
            .connect()
    };
    let a = client().await.unwrap();
    let b = client().await.unwrap();
    lock_once_with_all_up(&a).await;
    // Every master has now run for longer than max_lease.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let guard = a
        .lock("flushed")
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    for master in &masters[2..] {
        master.cli(&["FLUSHALL"]);
    }
    let attempt = b
        .lock("flushed")
        .lease(Duration::from_secs(1))
        .acquire()
        .await;
    assert!(
        attempt.is_err(),
        "B locked through masters that had just lost A's lock"
    );
    drop(guard);
}

/// Three masters that redlock has never used (no restart marker).
fn three_blank_masters() -> Vec<RedisServer> {
    (0..3).map(|_| RedisServer::start()).collect()
}

async fn client_with_max_lease(masters: &[RedisServer], max_lease: Duration) -> LockClient {
    LockClient::builder_for(masters.iter().map(RedisServer::url))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .max_lease(max_lease)
        .watchdog_lease(max_lease)
        .renew_every(max_lease / 3)
        .connect()
        .await
        .expect("connect to the masters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_master_admits_no_second_holder() {
    // Issue 24, item 1: masters already in use, without persistence; A holds `k`; the
    // masters are upgraded one at a time, 300 ms apart (never more than one down), with
    // no lock traffic between. Every master then answers "no marker", as a first
    // deployment would: a new client B must not take that for one while A's lease runs.
    const MAX_LEASE: Duration = Duration::from_secs(10);
    const LEASE: Duration = Duration::from_secs(8);
    let mut masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let a = client_with_max_lease(&masters, MAX_LEASE).await;
    let held = a.lock("k").lease(LEASE).acquire().await.expect("A locks k");
    let lease_ends = Instant::now() + LEASE;
    for master in &mut masters {
        master.restart();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let restarts_done = Instant::now();
    for master in &masters {
        assert_eq!(
            master.cli(&["EXISTS", "k", "redlock:boot"]).trim(),
            "0",
            "a master kept data across its restart without persistence"
        );
    }

    // B, a new client, tries every 200 ms for as long as A's lease runs.
    let b = client_with_max_lease(&masters, MAX_LEASE).await;
    let first_attempt = Instant::now();
    let mut attempts = 0;
    while Instant::now() + Duration::from_millis(300) < lease_ends {
        match b.lock("k").lease(LEASE).acquire().await {
            Ok(stolen) => panic!(
                "B took k (token {}) {:?} after the rolling restart, while A's lease \
                 had {:?} to run",
                stolen.fencing_token(),
                restarts_done.elapsed(),
                lease_ends.saturating_duration_since(Instant::now())
            ),
            Err(error) => {
                assert!(
                    matches!(error, LockError::NoQuorum { reached: 0, .. }),
                    "every master is in quarantine: {error:?}"
                );
                attempts += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(attempts >= 10, "only {attempts} attempts during A's lease");

    // Availability comes back once any lock the masters forgot could have ended:
    // max_lease after B first found them blank.
    let next = b
        .lock("k")
        .wait(MAX_LEASE)
        .lease(LEASE)
        .acquire()
        .await
        .expect("B never got k after the quarantine");
    assert!(
        Instant::now() >= lease_ends,
        "B got k before A's lease ended"
    );
    assert!(
        first_attempt.elapsed() >= MAX_LEASE - Duration::from_millis(50),
        "B got k {:?} after it first found the masters blank, before max_lease",
        first_attempt.elapsed()
    );
    assert!(
        next.fencing_token() > held.fencing_token(),
        "fencing went backwards"
    );
    next.release().await.unwrap();
    drop(held);
}

#[tokio::test]
async fn a_first_deployment_costs_max_lease_once() {
    // A master never used looks like one that forgot everything: the first
    // acquisitions on blank masters answer NoQuorum until max_lease has passed since
    // the first of them; then every client, new ones included, locks at once.
    const MAX_LEASE: Duration = Duration::from_secs(2);
    let masters = three_blank_masters();
    let first = client_with_max_lease(&masters, MAX_LEASE).await;
    let started = Instant::now();
    let error = first
        .lock("first")
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .expect_err("a blank deployment voted at once");
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
    let guard = first
        .lock("first")
        .wait(MAX_LEASE + Duration::from_secs(3))
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .expect("the deployment never voted");
    assert!(
        started.elapsed() >= MAX_LEASE - Duration::from_millis(50),
        "voted {:?} after the first attempt, before max_lease",
        started.elapsed()
    );
    guard.release().await.unwrap();
    let newcomer = client_with_max_lease(&masters, MAX_LEASE).await;
    let guard = newcomer
        .lock("first")
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .expect("a new client of a deployment past its quarantine locks at once");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn an_older_clients_fresh_deployment_mark_is_quarantined_once() {
    // Clients before issue 24 marked masters they all found blank as a fresh deployment
    // (`<run_id>:0:blank`), which a rolling restart of every master also produced. Such
    // a mark is not trusted: the master sits out max_lease once, as a blank one does.
    const MAX_LEASE: Duration = Duration::from_secs(1);
    let masters = three_blank_masters();
    for master in &masters {
        let run_id = master.info_field("server", "run_id").unwrap();
        let mark = format!("{run_id}:0:blank");
        assert_eq!(master.cli(&["SET", "redlock:boot", &mark]).trim(), "OK");
    }
    let client = client_with_max_lease(&masters, MAX_LEASE).await;
    let error = client
        .lock("older")
        .lease(Duration::from_millis(500))
        .acquire()
        .await
        .expect_err("an older client's adoption was trusted");
    assert!(
        matches!(error, LockError::NoQuorum { reached: 0, .. }),
        "{error:?}"
    );
    let guard = client
        .lock("older")
        .wait(MAX_LEASE + Duration::from_secs(3))
        .lease(Duration::from_millis(500))
        .acquire()
        .await
        .expect("the masters never voted after their quarantine");
    guard.release().await.unwrap();
}
