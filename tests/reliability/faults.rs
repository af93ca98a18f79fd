//! Faults, each with the history checker on: a holder killed or stopped, Redis
//! restarted or paused, connections killed server-side.
//!
//! Bounds here are about correctness and liveness ("within the lease end plus a
//! second"), generous enough for a loaded two-core machine; none measures speed.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::LockClient;
use redlock_testkit::RedisServer;

use crate::clock;
use crate::history::{self, Bounds, History, Hold, Outcome, Recorder, Summary};
use crate::store::FencedStore;
use crate::workers::{self, Role, WorkerSpec, eventually};

/// A lock server, a separate store server, and a directory for the history.
struct Fixture {
    lock: RedisServer,
    store_server: RedisServer,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            lock: RedisServer::start(),
            store_server: RedisServer::start(),
            dir: tempfile::tempdir().expect("a history directory"),
        }
    }

    fn spec(&self, key: &str) -> WorkerSpec {
        WorkerSpec::contender(
            &self.lock.url(),
            &self.store_server.url(),
            self.dir.path(),
            key,
        )
    }

    async fn store(&self) -> FencedStore {
        FencedStore::connect(&self.store_server.url()).await
    }

    fn history(&self) -> History {
        history::load(self.dir.path())
    }

    fn check(&self, bounds: &Bounds) -> (History, Summary) {
        let history = self.history();
        let summary = history::assert_valid(&history, bounds);
        (history, summary)
    }

    /// Asserts that the lock key is gone, waiting out at most `lease` for it to expire.
    async fn assert_key_gone(&self, key: &str, lease: Duration) {
        let mut redis = redis::Client::open(self.lock.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let gone = eventually(lease + Duration::from_secs(1), async || {
            !redis.exists::<_, bool>(key).await.unwrap()
        })
        .await;
        assert!(gone, "lock `{key}` was left behind");
    }
}

fn only_hold_of(history: &History, proc: u32) -> Hold {
    let holds: Vec<&Hold> = history.holds.iter().filter(|h| h.id.proc == proc).collect();
    assert_eq!(
        holds.len(),
        1,
        "process {proc} should have held exactly once"
    );
    holds[0].clone()
}

/// Waits for process `proc` to record its acquisition.
async fn acquired_by(fixture: &Fixture, proc: u32) -> Hold {
    let ready = eventually(Duration::from_secs(15), async || {
        fixture
            .history()
            .holds
            .iter()
            .any(|hold| hold.id.proc == proc)
    })
    .await;
    assert!(ready, "process {proc} never acquired the lock");
    only_hold_of(&fixture.history(), proc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_succeeded_at_its_lease_end() {
    let fixture = Fixture::new();
    let lease = Duration::from_secs(2);
    let mut holder_spec = fixture.spec("killed");
    holder_spec.role = Role::Holder;
    holder_spec.lease = Some(lease);
    holder_spec.wait = Duration::from_secs(600); // it sleeps holding the lock until killed
    let mut holder = holder_spec.spawn();
    let held = acquired_by(&fixture, holder.pid()).await;

    let mut spec = fixture.spec("killed");
    spec.tasks = 3;
    spec.holds = 20;
    spec.lease = Some(Duration::from_millis(500));
    let contenders: Vec<_> = (0..2).map(|_| spec.spawn()).collect();
    // Let them connect and start waiting, then kill the holder mid-lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.kill();
    for contender in contenders {
        contender.join(Duration::from_secs(60)).await;
    }

    let bounds = Bounds {
        killed: HashSet::from([holder.pid()]),
        ..Bounds::default()
    };
    let (history, summary) = fixture.check(&bounds);
    eprintln!("killed holder: {summary:?}");
    assert_eq!(summary.holds, 1 + 2 * 3 * 20);
    let first = history
        .holds
        .iter()
        .filter(|hold| hold.id.proc != held.id.proc)
        .min_by_key(|hold| hold.t_acq)
        .unwrap();
    let lease_end = held.earliest_expiry().unwrap();
    assert!(
        first.t_acq + clock::nanos(bounds.expiry_slack) >= lease_end,
        "taken {:?} before the killed holder's lease ran out",
        clock::span(first.t_acq, lease_end)
    );
    let latest_end = held.latest_expiry().unwrap();
    assert!(
        first.t_acq <= latest_end + clock::nanos(Duration::from_secs(1)),
        "taken only {:?} after the killed holder's lease ran out",
        clock::span(latest_end, first.t_acq)
    );
    assert!(first.token > held.token);
    eprintln!(
        "killed holder: succeeded {:?} after its lease could first have run out",
        clock::span(lease_end, first.t_acq)
    );
    fixture.assert_key_gone("killed", spec.lease.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_learns_it_lost_and_its_late_write_is_refused() {
    let fixture = Fixture::new();
    let lease = Duration::from_millis(1000);
    let mut holder_spec = fixture.spec("stopped");
    holder_spec.role = Role::Holder;
    holder_spec.lease = Some(lease);
    holder_spec.wait = Duration::from_millis(500); // its work: shorter than the lease
    let holder = holder_spec.spawn();
    let held = acquired_by(&fixture, holder.pid()).await;
    redlock_testkit::signal(holder.pid(), "STOP");
    let stopped_at = clock::now();

    let mut spec = fixture.spec("stopped");
    spec.tasks = 2;
    spec.holds = 15;
    spec.lease = Some(Duration::from_millis(300));
    let contenders: Vec<_> = (0..2).map(|_| spec.spawn()).collect();
    // Keep it stopped until a successor has written with a newer token.
    let store = fixture.store().await;
    let taken_over = eventually(Duration::from_secs(15), async || {
        store.highest().await > held.token
    })
    .await;
    redlock_testkit::signal(holder.pid(), "CONT");
    assert!(taken_over, "nobody took over from the stopped holder");
    holder.join(Duration::from_secs(30)).await;
    for contender in contenders {
        contender.join(Duration::from_secs(60)).await;
    }

    let (history, summary) = fixture.check(&Bounds::default());
    eprintln!("stopped holder: {summary:?}");
    let stale = only_hold_of(&history, held.id.proc);
    let late = stale.writes.last().unwrap();
    assert!(
        stopped_at < held.t_acq + clock::nanos(holder_spec.wait),
        "the holder was stopped only after its work was done; the test proves nothing"
    );
    assert!(late.start > stale.earliest_expiry().unwrap());
    assert!(
        !late.accepted,
        "the store took the stale holder's late write"
    );
    let release = stale.release.unwrap();
    assert!(release.lost_before, "the resumed guard did not report lost");
    assert_eq!(release.outcome, Outcome::Lost);
    assert!(summary.overlaps >= 1 && summary.rejected_writes >= 1);
    fixture
        .assert_key_gone("stopped", spec.lease.unwrap())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_lock_is_lost_at_the_next_renewal_after_redis_restarts_empty() {
    let mut fixture = Fixture::new();
    let renew_every = Duration::from_millis(250);
    // A long watchdog lease: losing the lock must come from the renewal finding it
    // gone, not from the lease running out.
    let holder_client = LockClient::builder(&fixture.lock.url())
        .watchdog_lease(Duration::from_secs(10))
        .renew_every(renew_every)
        .response_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let contender_client = LockClient::connect(&fixture.lock.url()).await.unwrap();
    let store = fixture.store().await;
    let holder_log = Recorder::with_proc(fixture.dir.path(), 1);
    let contender_log = Recorder::with_proc(fixture.dir.path(), 2);

    let mut holder_spec = fixture.spec("restarted");
    holder_spec.lease = None;
    let id = holder_log.id(0, 1);
    let guard = workers::acquire(
        &holder_client,
        &holder_spec,
        Duration::ZERO,
        &holder_log,
        id,
    )
    .await
    .expect("a free lock");
    assert!(workers::write(&store, &holder_log, id, guard.fencing_token()).await);
    tokio::time::sleep(renew_every * 3).await;
    assert!(!guard.is_lost(), "the watchdog let the lock go");

    // Contenders wait for the lock (their retry would come only at the 10 s lease end),
    // then Redis restarts empty under everyone.
    let mut spec = fixture.spec("restarted");
    spec.tasks = 2;
    spec.holds = 20;
    spec.lease = Some(Duration::from_millis(500));
    let contenders = {
        let (spec, store, log) = (spec.clone(), store.clone(), contender_log.clone());
        tokio::spawn(async move {
            workers::run_contenders(&spec, &contender_client, &store, &log).await;
        })
    };
    let waiting = eventually(Duration::from_secs(5), async || {
        !fixture.lock.client_ids(listens).is_empty()
    })
    .await;
    assert!(waiting, "the contenders never started waiting");
    tokio::task::block_in_place(|| fixture.lock.restart());
    let restarted = Instant::now();
    let restarted_at = clock::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the guard never noticed the lock was gone");
    let noticed = restarted.elapsed();
    assert!(guard.is_lost());
    // Stale from here on: once a successor has written, the late write must be refused.
    let token = guard.fencing_token();
    assert!(
        eventually(Duration::from_secs(10), async || store.highest().await
            > token)
        .await
    );
    assert!(!workers::write(&store, &holder_log, id, token).await);
    assert_eq!(
        workers::release(guard, &holder_log, id).await,
        Outcome::Lost
    );
    contenders.await.unwrap();
    assert_eq!(holder_client.watched_locks(), 0);

    let (history, summary) = fixture.check(&Bounds::default());
    eprintln!("restart: lost after {noticed:?}; {summary:?}");
    assert!(
        noticed < Duration::from_secs(3),
        "lost only {noticed:?} after the restart (renewal every {renew_every:?})"
    );
    assert!(
        history
            .holds
            .iter()
            .filter(|h| h.id.proc == 2)
            .all(|h| h.token > token),
        "a token after the restart is not above the one before it"
    );
    // The waiters re-checked when their connection dropped: they did not sleep until
    // the lease end they had been told.
    let first = history
        .holds
        .iter()
        .filter(|h| h.id.proc == 2)
        .map(|h| h.t_acq)
        .min()
        .unwrap();
    assert!(
        clock::span(restarted_at, first) < Duration::from_secs(3),
        "the first waiter took the lock {:?} after the restart",
        clock::span(restarted_at, first)
    );
    fixture
        .assert_key_gone("restarted", spec.lease.unwrap())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_fails_acquires_in_time_and_work_resumes_after() {
    let fixture = Fixture::new();
    let response_timeout = Duration::from_millis(500);
    let wait = Duration::from_millis(300);
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(
            LockClient::builder(&fixture.lock.url())
                .response_timeout(response_timeout)
                .connect_timeout(response_timeout)
                .connect()
                .await
                .unwrap(),
        );
    }
    let store = fixture.store().await;
    let mut spec = fixture.spec("paused");
    spec.wait = wait;
    spec.lease = Some(Duration::from_secs(1));
    let stop = Arc::new(AtomicBool::new(false));
    let resumed_at = Arc::new(std::sync::Mutex::new(None::<u64>));
    let mut tasks = Vec::new();
    for (n, client) in clients.iter().enumerate() {
        let log = Recorder::with_proc(fixture.dir.path(), n as u32 + 1);
        for task in 0..3 {
            let (spec, client, store, log, stop) = (
                spec.clone(),
                client.clone(),
                store.clone(),
                log.clone(),
                stop.clone(),
            );
            let resumed_at = resumed_at.clone();
            tasks.push(tokio::spawn(async move {
                // Returns how many holds began after Redis was resumed.
                let mut seq = 0;
                let mut after_resume = 0;
                while !stop.load(Ordering::SeqCst) {
                    seq += 1;
                    let id = log.id(task, seq);
                    let t_req = clock::now();
                    let Some(guard) = workers::acquire(&client, &spec, spec.wait, &log, id).await
                    else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    if resumed_at.lock().unwrap().is_some_and(|at| t_req > at) {
                        after_resume += 1;
                    }
                    workers::write(&store, &log, id, guard.fencing_token()).await;
                    workers::release(guard, &log, id).await;
                }
                after_resume
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    fixture.lock.pause();
    // Stopped once `kill -STOP` has returned.
    let paused = clock::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Replies may flow as soon as SIGCONT is sent, before `kill -CONT` returns.
    let resuming = clock::now();
    fixture.lock.resume();
    *resumed_at.lock().unwrap() = Some(clock::now());
    // Work resumes with the same clients: give every task time for a few holds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let after_resume = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("a task hung")
            .unwrap();
        assert!(
            after_resume > 0,
            "a task never acquired again after Redis resumed"
        );
    }

    // The bound of the issue: an acquire fails within its wait plus the response timeout.
    let bounds = Bounds {
        wait_overshoot: response_timeout + Duration::from_millis(250),
        ..Bounds::default()
    };
    let (history, summary) = fixture.check(&bounds);
    eprintln!("pause: {summary:?}");
    let during: Vec<_> = history
        .attempts
        .iter()
        .filter(|a| a.t_req > paused && a.t_ret < resuming)
        .collect();
    assert!(
        !during.is_empty(),
        "no acquire was tried while Redis was paused"
    );
    let succeeded: Vec<String> = during
        .iter()
        .filter(|a| a.result == history::AttemptResult::Acquired)
        .map(|a| {
            format!(
                "{} asked {:?} after the pause, returned {:?} before the resume",
                a.id,
                clock::span(paused, a.t_req),
                clock::span(a.t_ret, resuming)
            )
        })
        .collect();
    assert!(
        succeeded.is_empty(),
        "acquires succeeded while Redis was paused: {succeeded:#?}"
    );
    fixture.assert_key_gone("paused", spec.lease.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_connections_are_killed_the_next_acquire_works() {
    let fixture = Fixture::new();
    let client = LockClient::connect(&fixture.lock.url()).await.unwrap();
    let store = fixture.store().await;
    let log = Recorder::with_proc(fixture.dir.path(), 1);
    let mut spec = fixture.spec("cut");
    spec.lease = Some(Duration::from_secs(1));
    for round in 1..=8 {
        let killed = fixture.lock.kill_clients(&["TYPE", "normal"])
            + fixture.lock.kill_clients(&["TYPE", "pubsub"]);
        assert!(killed > 0, "round {round}: no connection to kill");
        // Odd rounds ask at once, with a wait that covers the reconnection; even rounds
        // make a single attempt (no wait) once the client has had a moment to notice.
        let wait = if round % 2 == 1 {
            Duration::from_secs(3)
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Duration::ZERO
        };
        let id = log.id(0, round);
        let guard = workers::acquire(&client, &spec, wait, &log, id)
            .await
            .unwrap_or_else(|| panic!("round {round}: the acquire after CLIENT KILL failed"));
        workers::write(&store, &log, id, guard.fencing_token()).await;
        assert_eq!(workers::release(guard, &log, id).await, Outcome::Released);
    }
    fixture.check(&Bounds::default());
    fixture.assert_key_gone("cut", Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_off_from_redis_does_not_miss_the_release() {
    let fixture = Fixture::new();
    let holder = LockClient::connect(&fixture.lock.url()).await.unwrap();
    let store = fixture.store().await;
    let holder_log = Recorder::with_proc(fixture.dir.path(), 1);
    let waiter_log = Recorder::with_proc(fixture.dir.path(), 2);
    let mut holder_spec = fixture.spec("deaf");
    holder_spec.lease = Some(Duration::from_secs(30));
    let mut waiter_spec = holder_spec.clone();
    waiter_spec.lease = Some(Duration::from_secs(2));
    // The release comes at different moments of the waiter's reconnection.
    let delays_ms = [0u64, 0, 0, 1, 1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100, 200];
    for (round, delay) in delays_ms.into_iter().enumerate() {
        let round = round as u64 + 1;
        let waiter = LockClient::connect(&fixture.lock.url()).await.unwrap();
        let id = holder_log.id(0, round);
        let guard = workers::acquire(&holder, &holder_spec, Duration::ZERO, &holder_log, id)
            .await
            .expect("the lock is free between rounds");
        let waiting = {
            let (spec, store, log) = (waiter_spec.clone(), store.clone(), waiter_log.clone());
            tokio::spawn(async move {
                let id = log.id(0, round);
                let guard =
                    workers::acquire(&waiter, &spec, Duration::from_secs(10), &log, id).await?;
                let acquired = clock::now();
                workers::write(&store, &log, id, guard.fencing_token()).await;
                workers::release(guard, &log, id).await;
                Some(acquired)
            })
        };
        // Once the waiter listens for releases, cut its connection, then release.
        let subscribed = eventually(Duration::from_secs(5), async || {
            !fixture.lock.client_ids(listens).is_empty()
        })
        .await;
        assert!(subscribed, "round {round}: the waiter never subscribed");
        for client_id in fixture.lock.client_ids(listens) {
            fixture.lock.kill_clients(&["ID", &client_id.to_string()]);
        }
        tokio::time::sleep(Duration::from_millis(delay)).await;
        workers::write(&store, &holder_log, id, guard.fencing_token()).await;
        let released = clock::now();
        assert_eq!(
            workers::release(guard, &holder_log, id).await,
            Outcome::Released
        );
        let acquired = waiting
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {round} (release {delay} ms after the cut): the waiter missed the release and timed out"));
        assert!(
            clock::span(released, acquired) < Duration::from_secs(3),
            "round {round}: the waiter took the lock only {:?} after the release",
            clock::span(released, acquired)
        );
    }
    fixture.check(&Bounds::default());
    fixture.assert_key_gone("deaf", Duration::ZERO).await;
}

/// A `CLIENT LIST` line of a connection subscribed to some channel: a waiter's (the
/// key's release channel, and on one server its client's grant channel too).
fn listens(line: &str) -> bool {
    line.split(' ')
        .any(|field| field.strip_prefix("sub=").is_some_and(|n| n != "0"))
}
