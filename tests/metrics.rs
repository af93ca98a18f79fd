//! The locks' metrics (feature `metrics`) against a real redis-server, read through
//! metrics-util's debugging recorder: every metric and every label value of the crate
//! docs' table, each measured where the behaviour it counts really happens.
//!
//! One recorder is installed globally for the whole test binary (a local recorder does
//! not follow the tasks a client spawns: its watchdog, background releases). Its
//! snapshots drain what they read, so every read goes through [`Recorded`], which adds
//! each snapshot to running totals; each test then reads only the series of its own
//! `lock` labels, so the tests run in parallel without seeing each other.

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::{client, evalsha_calls, raw};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError, distributed_lock};
use redlock_testkit::{RedisCluster, RedisServer};

const ACQUIRE: &str = "redlock_acquire_seconds";
const HOLD: &str = "redlock_hold_seconds";
const LOST: &str = "redlock_lost_total";
const RENEWALS: &str = "redlock_renewals_total";
const RENEWAL_FAILURES: &str = "redlock_renewal_failures_total";
const HANDOFFS: &str = "redlock_handoffs_total";
const WAITING: &str = "redlock_waiting";

/// How long a test waits for something that happens within milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

/// One series: the metric's name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// Everything recorded so far, summed over every snapshot taken.
#[derive(Default)]
struct Totals {
    counters: HashMap<Series, u64>,
    /// Gauges are only incremented and decremented, so the values snapshots drain are
    /// deltas: their sum is the gauge.
    gauges: HashMap<Series, f64>,
    histograms: HashMap<Series, Vec<f64>>,
}

struct Recorded {
    snapshotter: Snapshotter,
    totals: Mutex<Totals>,
}

/// The global recorder, installed by the first test that asks.
fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only global recorder");
        Recorded {
            snapshotter,
            totals: Mutex::new(Totals::default()),
        }
    })
}

impl Recorded {
    /// Adds what was recorded since the last read to the totals, and reads them.
    fn read<T>(&self, read: impl FnOnce(&Totals) -> T) -> T {
        let mut totals = self.totals.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            labels.sort();
            let series = (key.name().to_owned(), labels);
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *totals.counters.entry(series).or_default() += n
                }
                (MetricKind::Gauge, DebugValue::Gauge(delta)) => {
                    *totals.gauges.entry(series).or_default() += delta.into_inner()
                }
                (MetricKind::Histogram, DebugValue::Histogram(values)) => totals
                    .histograms
                    .entry(series)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
                other => panic!("unexpected metric value {other:?}"),
            }
        }
        read(&totals)
    }
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let series = series(name, labels);
    recorded().read(|totals| totals.counters.get(&series).copied().unwrap_or(0))
}

fn gauge(name: &str, labels: &[(&str, &str)]) -> f64 {
    let series = series(name, labels);
    recorded().read(|totals| totals.gauges.get(&series).copied().unwrap_or(0.0))
}

fn histogram(name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let series = series(name, labels);
    recorded().read(|totals| totals.histograms.get(&series).cloned().unwrap_or_default())
}

/// Every series that carries `lock = label`, whatever the metric.
fn series_of(label: &str) -> Vec<Series> {
    let has = |series: &Series| {
        series
            .1
            .iter()
            .any(|(key, value)| key == "lock" && value == label)
    };
    recorded().read(|totals| {
        let mut all: Vec<Series> = totals
            .counters
            .keys()
            .chain(totals.gauges.keys())
            .chain(totals.histograms.keys())
            .filter(|series| has(series))
            .cloned()
            .collect();
        all.sort();
        all
    })
}

/// Polls `holds` until it is true, failing after [`PATIENCE`].
/// Installs the recorder before a test records anything.
fn record() {
    recorded();
}

async fn until(what: &str, mut holds: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !holds() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn lost(label: &str, cause: &str) -> u64 {
    counter(LOST, &[("lock", label), ("cause", cause)])
}

/// `lost` by every cause.
fn lost_by_cause(label: &str) -> [u64; 3] {
    ["lease", "renewal", "forced"].map(|cause| lost(label, cause))
}

#[tokio::test]
async fn acquisitions_are_timed_by_outcome() {
    record();
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let label = "m-outcomes";

    let guard = holder
        .lock("m:outcomes")
        .label(label)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // Held by another client for the whole wait: a timeout, after the wait.
    let refused = other
        .lock("m:outcomes")
        .label(label)
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(refused.is_timeout(), "{refused}");
    // A key the application uses for something else: an error.
    let _: () = raw(&server).await.lpush("m:a-list", "x").await.unwrap();
    let error = other
        .lock("m:a-list")
        .label(label)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::NotALock { .. }), "{error}");
    guard.release().await.unwrap();

    let of = |outcome| histogram(ACQUIRE, &[("lock", label), ("outcome", outcome)]);
    assert_eq!(of("acquired").len(), 1);
    let timeout = of("timeout");
    assert_eq!(timeout.len(), 1);
    assert!(timeout[0] >= 0.2, "a timeout waited {} s", timeout[0]);
    assert_eq!(of("error").len(), 1);
    // The label is the one given, never the key.
    assert!(series_of("m:outcomes").is_empty());
}

#[tokio::test]
async fn unlabelled_locks_share_the_dash_label() {
    record();
    let server = RedisServer::start();
    let holder = client(&server).await;
    // The only test of this binary that locks without a label.
    for key in ["m:unlabelled:1", "m:unlabelled:2"] {
        holder
            .lock(key)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(
        histogram(ACQUIRE, &[("lock", "-"), ("outcome", "acquired")]).len(),
        2
    );
    assert_eq!(histogram(HOLD, &[("lock", "-")]).len(), 2);
    assert!(series_of("m:unlabelled:1").is_empty());
}

#[tokio::test]
async fn a_release_ends_the_hold_and_nothing_is_lost() {
    record();
    let server = RedisServer::start();
    let holder = client(&server).await;
    let label = "m-hold";
    let guard = holder
        .lock("m:hold")
        .label(label)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await.unwrap();
    let held = histogram(HOLD, &[("lock", label)]);
    assert_eq!(held.len(), 1);
    assert!(held[0] >= 0.3, "held {} s after 300 ms", held[0]);
    assert_eq!(lost_by_cause(label), [0, 0, 0]);
}

#[tokio::test]
async fn a_lease_that_ran_out_is_lost_by_lease_and_held_for_the_lease() {
    record();
    let server = RedisServer::start();
    let holder = client(&server).await;
    let label = "m-lease";
    let guard = holder
        .lock("m:lease")
        .label(label)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(guard.release().await.unwrap_err().is_lost());
    assert_eq!(lost_by_cause(label), [1, 0, 0]);
    // Held until the lease ran out, not until the release found out.
    let held = histogram(HOLD, &[("lock", label)]);
    assert_eq!(held.len(), 1);
    assert!((held[0] - 0.3).abs() < 1e-3, "held {} s", held[0]);
}

#[tokio::test]
async fn a_lock_deleted_behind_its_holder_is_lost_by_renewal_once() {
    record();
    let server = RedisServer::start();
    let holder = client(&server).await;
    let label = "m-deleted";
    let guard = holder
        .lock("m:deleted")
        .label(label)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let _: () = raw(&server).await.del("m:deleted").await.unwrap();
    assert!(
        guard
            .extend(Duration::from_secs(10))
            .await
            .unwrap_err()
            .is_lost()
    );
    // The release finds it gone too: still one loss, one hold.
    assert!(guard.release().await.unwrap_err().is_lost());
    assert_eq!(lost_by_cause(label), [0, 1, 0]);
    assert_eq!(histogram(HOLD, &[("lock", label)]).len(), 1);
}

#[tokio::test]
async fn force_unlocked_locks_are_lost_as_forced_at_release_and_at_renewal() {
    record();
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(3))
        .renew_every(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let (operator, next) = (client(&server).await, client(&server).await);

    // A fixed lease, evicted, then taken by another client: its release says forced.
    let label = "m-forced-release";
    let guard = holder
        .lock("m:forced:release")
        .label(label)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(operator.force_unlock("m:forced:release").await.unwrap());
    // The marker is bounded: one key, gone with the lease it evicted.
    let marker_ttl: i64 = raw(&server)
        .await
        .pttl("redlock:forced:m:forced:release")
        .await
        .unwrap();
    assert!(
        marker_ttl > 0 && marker_ttl <= 10_000,
        "marker pttl {marker_ttl}"
    );
    let taken = next
        .lock("m:forced:release")
        .label("m-other")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(guard.release().await.unwrap_err().is_lost());
    assert_eq!(lost_by_cause(label), [0, 0, 1]);
    taken.release().await.unwrap();

    // Watchdog mode: the next renewal finds it evicted.
    let label = "m-forced-watchdog";
    let guard = holder
        .lock("m:forced:watchdog")
        .label(label)
        .acquire()
        .await
        .unwrap();
    assert!(operator.force_unlock("m:forced:watchdog").await.unwrap());
    tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("the watchdog never found the lock evicted");
    assert_eq!(lost_by_cause(label), [0, 0, 1]);
    assert_eq!(counter(RENEWAL_FAILURES, &[("lock", label)]), 1);
    assert!(guard.release().await.unwrap_err().is_lost());
    assert_eq!(lost_by_cause(label), [0, 0, 1], "counted once");
    assert_eq!(histogram(HOLD, &[("lock", label)]).len(), 1);

    // Found gone without an eviction (deleted by hand): renewal, not forced.
    let label = "m-deleted-watchdog";
    let guard = holder
        .lock("m:deleted:watchdog")
        .label(label)
        .acquire()
        .await
        .unwrap();
    let _: () = raw(&server).await.del("m:deleted:watchdog").await.unwrap();
    tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("the watchdog never found the lock gone");
    assert_eq!(lost_by_cause(label), [0, 1, 0]);
}

/// Holds `keys` (fixed lease) and, one in watchdog mode, has `operator` force-unlock them
/// all: every release, and the watchdog, must say forced, whatever the mode.
async fn every_force_unlock_is_told_apart(
    holder: &LockClient,
    operator: &LockClient,
    keys: &[&str],
    label: &str,
) {
    let mut guards = Vec::new();
    for key in keys {
        let guard = holder
            .lock(*key)
            .label(label)
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    let watched = holder
        .lock("m:forced:watched")
        .label(label)
        .acquire()
        .await
        .unwrap();
    for key in keys.iter().chain(&["m:forced:watched"]) {
        assert!(operator.force_unlock(key).await.unwrap(), "{key}");
    }
    for guard in guards {
        assert!(guard.release().await.unwrap_err().is_lost());
    }
    tokio::time::timeout(PATIENCE, watched.lost())
        .await
        .expect("the watchdog never found the lock evicted");
    assert_eq!(lost_by_cause(label), [0, 0, keys.len() as u64 + 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlocks_are_told_apart_with_redlock_and_on_a_cluster() {
    record();
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let redlock = || {
        LockClient::builder_for(masters.iter().map(RedisServer::url))
            .renew_every(Duration::from_millis(100))
            .connect()
    };
    let (holder, operator) = (redlock().await.unwrap(), redlock().await.unwrap());
    every_force_unlock_is_told_apart(
        &holder,
        &operator,
        &["m:redlock:1", "m:redlock:2"],
        "m-forced-redlock",
    )
    .await;

    // On a cluster the marker lives in the lock's slot: keys spread over the shards,
    // and one with a hash tag of its own.
    let cluster = RedisCluster::start(3);
    let on_cluster = || {
        LockClient::builder_for(cluster.urls())
            .cluster()
            .renew_every(Duration::from_millis(100))
            .connect()
    };
    let (holder, operator) = (on_cluster().await.unwrap(), on_cluster().await.unwrap());
    let keys = [
        "m:cluster:a",
        "m:cluster:b",
        "m:cluster:c",
        "{tenant-7}:m:cluster",
    ];
    let shards: std::collections::HashSet<_> = keys
        .iter()
        .filter_map(|key| cluster.master_of(key))
        .collect();
    assert!(shards.len() > 1, "the keys should span shards");
    every_force_unlock_is_told_apart(&holder, &operator, &keys, "m-forced-cluster").await;
}

#[tokio::test]
async fn the_watchdog_counts_renewals_per_lock_and_failures_while_redis_is_silent() {
    record();
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(800))
        .renew_every(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let label = "m-renewals";
    let first = holder
        .lock("m:renewals:1")
        .label(label)
        .acquire()
        .await
        .unwrap();
    let second = holder
        .lock("m:renewals:2")
        .label(label)
        .acquire()
        .await
        .unwrap();
    let renewals = || counter(RENEWALS, &[("lock", label)]);
    // Two locks: each tick counts two renewals.
    until("six renewals", || renewals() >= 6).await;
    assert_eq!(counter(RENEWAL_FAILURES, &[("lock", label)]), 0);
    second.release().await.unwrap();

    // The server stops answering for longer than the lease: renewals fail, then the
    // lease runs out.
    server.pause();
    let ran_out = tokio::time::timeout(PATIENCE, first.lost()).await;
    // Past Redis's own expiry too, so that no late renewal can find it alive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    ran_out.expect("the lock never ran out");
    until("the loss counted", || lost_by_cause(label) != [0, 0, 0]).await;
    assert_eq!(lost_by_cause(label), [1, 0, 0]);
    assert!(counter(RENEWAL_FAILURES, &[("lock", label)]) >= 1);
    assert!(first.release().await.is_err());
    assert_eq!(histogram(HOLD, &[("lock", label)]).len(), 2);
}

#[tokio::test]
async fn a_hand_off_between_two_tasks_of_a_client_is_counted_and_waiters_are_gauged() {
    record();
    let server = RedisServer::start();
    let locks = client(&server).await;
    let label = "m-handoff";
    let waiting = || gauge(WAITING, &[("lock", label)]);
    let first = locks
        .lock("m:handoff")
        .label(label)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let second = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("m:handoff")
                .label(label)
                .wait(PATIENCE)
                .lease(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap()
        }
    });
    until("the second task in line", || waiting() == 1.0).await;
    first.release().await.unwrap();
    let second = second.await.unwrap();
    assert_eq!(waiting(), 0.0);
    assert_eq!(
        counter(HANDOFFS, &[("lock", label), ("kind", "hand_off")]),
        1
    );
    // Nobody waits now: released in Redis, no hand-off.
    second.release().await.unwrap();
    assert_eq!(
        counter(HANDOFFS, &[("lock", label), ("kind", "hand_off")]),
        1
    );
    assert_eq!(histogram(HOLD, &[("lock", label)]).len(), 2);
}

#[tokio::test]
async fn a_grant_from_another_clients_release_is_counted_by_the_client_it_went_to() {
    record();
    let server = RedisServer::start();
    let (holder, waiter) = (client(&server).await, client(&server).await);
    let label = "m-grant";
    let grants = || counter(HANDOFFS, &[("lock", label), ("kind", "grant")]);
    let held = holder
        .lock("m:grant")
        .label(label)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let scripts_before = evalsha_calls(&server);
    let next = tokio::spawn(async move {
        waiter
            .lock("m:grant")
            .label(label)
            .wait(PATIENCE)
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap()
    });
    until("the waiter registered", || {
        server.cli(&["ZCARD", "redlock:waitlist:m:grant"]).trim() == "1"
    })
    .await;
    // And listens for its grant: a release before that finds nobody on the grant
    // channel and frees the key instead (seen once on a loaded fresh machine).
    until("the waiter listens for its grant", || {
        !server
            .cli(&["PUBSUB", "CHANNELS", "redlock:granted:*:m:grant"])
            .trim()
            .is_empty()
    })
    .await;
    // And has made its second attempt, which a fresh subscription calls for at once: a
    // release before it is answered grants the key to that attempt, which takes it as
    // its own rather than from the message (seen on a loaded fresh machine), and no
    // grant is counted.
    until("the waiter attempted again after subscribing", || {
        evalsha_calls(&server) >= scripts_before + 2
    })
    .await;
    held.release().await.unwrap();
    let next = next.await.unwrap();
    assert_eq!(grants(), 1);
    assert_eq!(
        counter(HANDOFFS, &[("lock", label), ("kind", "hand_off")]),
        0
    );
    // Nobody waits now: released in Redis, granted to no one.
    next.release().await.unwrap();
    assert_eq!(grants(), 1);
}

#[tokio::test]
async fn readers_waiting_on_a_writer_in_other_clients_are_granted_together() {
    record();
    let server = RedisServer::start();
    let writer = client(&server).await;
    let label = "m-grant-readers";
    let held = writer
        .write_lock("m:grant-readers")
        .label(label)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let mut readers = Vec::new();
    for n in 1..=3 {
        let reader = client(&server).await;
        readers.push(tokio::spawn(async move {
            let guard = reader
                .read_lock("m:grant-readers")
                .label(label)
                .wait(PATIENCE)
                .lease(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            (guard, reader)
        }));
        until("the reader registered", || {
            server
                .cli(&["ZCARD", "redlock:waitlist:m:grant-readers"])
                .trim()
                == n.to_string()
        })
        .await;
        // And listening: a grant that reaches no subscriber goes to the next in line,
        // and a reader still subscribing then takes its share with an attempt of its own
        // (seen under load: 2 grants, not 3).
        until("the reader listens", || {
            server
                .cli(&["PUBSUB", "CHANNELS", "redlock:granted:*:m:grant-readers"])
                .lines()
                .filter(|line| !line.trim().is_empty())
                .count()
                == n
        })
        .await;
    }
    let writer_token = held.fencing_token();
    held.release().await.unwrap();
    let mut guards = Vec::new();
    for reader in readers {
        guards.push(reader.await.unwrap());
    }
    // One release granted all three: each has a share of its own, a token above the
    // writer's, and they hold the key at once.
    assert_eq!(counter(HANDOFFS, &[("lock", label), ("kind", "grant")]), 3);
    assert!(
        guards
            .iter()
            .all(|(guard, _)| guard.fencing_token() > writer_token)
    );
    assert!(guards.iter().all(|(guard, _)| !guard.is_lost()));
    // Confirmed: each share lasts its lease, not the grace.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        guards
            .iter()
            .all(|(guard, _)| !guard.is_lost() && guard.lease_remaining() > Duration::from_secs(5))
    );
    let holders = server.cli(&["ZCARD", "redlock:holders:m:grant-readers"]);
    assert_eq!(holders.trim(), "3");
    for (guard, _) in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(server.cli(&["EXISTS", "m:grant-readers"]).trim(), "0");
}

#[tokio::test]
async fn a_freed_permit_is_granted_to_the_semaphores_next_waiter_in_another_client() {
    record();
    let server = RedisServer::start();
    let label = "m-grant-permits";
    let key = "m:grant-permits";
    let holders = client(&server).await;
    let take = |locks: LockClient, wait: Duration| async move {
        let guard = locks
            .semaphore(key, 2)
            .label(label)
            .wait(wait)
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        (guard, locks)
    };
    let (first, _) = take(holders.clone(), Duration::ZERO).await;
    let (second, _) = take(holders.clone(), Duration::ZERO).await;
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let locks = client(&server).await;
        waiters.push(tokio::spawn(take(locks, PATIENCE)));
        until("the waiter registered", || {
            server
                .cli(&["ZCARD", "redlock:waitlist:m:grant-permits"])
                .trim()
                == n.to_string()
        })
        .await;
    }
    let grants = || counter(HANDOFFS, &[("lock", label), ("kind", "grant")]);
    let third = waiters.remove(0);
    first.release().await.unwrap();
    let (third, _third_client) = third.await.unwrap();
    assert_eq!(grants(), 1, "the freed permit went to the first waiter");
    assert!(third.fencing_token() > second.fencing_token());
    let fourth = waiters.remove(0);
    second.release().await.unwrap();
    let (fourth, _fourth_client) = fourth.await.unwrap();
    assert_eq!(grants(), 2);
    // Confirmed: the granted permits last their lease, not the grace.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!third.is_lost() && !fourth.is_lost());
    assert_eq!(
        server
            .cli(&["ZCARD", "redlock:holders:m:grant-permits"])
            .trim(),
        "2"
    );
    let last = waiters.remove(0);
    third.release().await.unwrap();
    let (last, _last_client) = last.await.unwrap();
    assert_eq!(grants(), 3);
    fourth.release().await.unwrap();
    last.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", key]).trim(), "0");
}

#[tokio::test]
async fn tasks_waiting_for_a_holder_in_another_process_are_gauged_until_they_leave() {
    record();
    let server = RedisServer::start();
    let (holder, waiters) = (client(&server).await, client(&server).await);
    let label = "m-waiting";
    let waiting = || gauge(WAITING, &[("lock", label)]);
    let guard = holder
        .lock("m:waiting")
        .label("m-other")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // Three tasks of another client: the first waits for the holder's release in
    // Redis, the other two for their turn behind it.
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let waiters = waiters.clone();
            tokio::spawn(async move {
                waiters
                    .lock("m:waiting")
                    .label(label)
                    .wait(PATIENCE)
                    .lease(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
            })
        })
        .collect();
    until("three waiting tasks", || waiting() == 3.0).await;
    guard.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(waiting(), 0.0);
    assert_eq!(
        histogram(ACQUIRE, &[("lock", label), ("outcome", "acquired")]).len(),
        3
    );

    // A waiter that gives up leaves the gauge too.
    let guard = holder
        .lock("m:waiting")
        .label("m-other")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let gave_up = waiters
        .lock("m:waiting")
        .label(label)
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(gave_up.is_timeout());
    assert_eq!(waiting(), 0.0);
    guard.release().await.unwrap();
}

#[distributed_lock(key = "m-order:<id>", wait = "5s", lease = "5s", client = locks)]
async fn pay(id: u64, locks: &LockClient) -> Result<u64, LockError> {
    Ok(id)
}

#[tokio::test]
async fn the_attribute_labels_its_locks_with_the_key_template() {
    record();
    let server = RedisServer::start();
    let locks = client(&server).await;
    assert_eq!(pay(42, &locks).await.unwrap(), 42);
    assert_eq!(pay(43, &locks).await.unwrap(), 43);
    let template = "m-order:<id>";
    assert_eq!(
        histogram(ACQUIRE, &[("lock", template), ("outcome", "acquired")]).len(),
        2
    );
    assert_eq!(histogram(HOLD, &[("lock", template)]).len(), 2);
    for key in ["m-order:42", "m-order:43"] {
        assert!(series_of(key).is_empty(), "a series labelled {key}");
    }
}

#[tokio::test]
async fn force_unlocked_shares_are_lost_as_forced() {
    record();
    let server = RedisServer::start();
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(3))
        .renew_every(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let operator = client(&server).await;
    // Two readers and a permit in watchdog mode (renewal finds them evicted), and a
    // permit with a fixed lease (its release does).
    let (read, permit) = ("m-forced-reader", "m-forced-permit");
    let readers = [
        holder
            .read_lock("m:shared")
            .label(read)
            .acquire()
            .await
            .unwrap(),
        holder
            .read_lock("m:shared")
            .label(read)
            .acquire()
            .await
            .unwrap(),
    ];
    let watched = holder
        .semaphore("m:permits", 2)
        .label(permit)
        .acquire()
        .await
        .unwrap();
    let fixed = holder
        .semaphore("m:permits", 2)
        .label(permit)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(operator.force_unlock("m:shared").await.unwrap());
    assert!(operator.force_unlock("m:permits").await.unwrap());
    for guard in readers.iter().chain([&watched]) {
        tokio::time::timeout(PATIENCE, guard.lost())
            .await
            .expect("the watchdog never found the share evicted");
    }
    assert!(fixed.release().await.unwrap_err().is_lost());
    assert_eq!(lost_by_cause(read), [0, 0, 2]);
    assert_eq!(lost_by_cause(permit), [0, 0, 2]);
}
