//! Thousands of holds from several processes, with stale writers and impatient waiters
//! mixed in, checked by the history checker.

use std::time::Duration;

use redis::AsyncCommands;
use redlock_testkit::RedisServer;

use crate::history::{self, Bounds};
use crate::store::FencedStore;
use crate::workers::WorkerSpec;

const PROCESSES: u32 = 4;
const TASKS: u32 = 5;
const HOLDS: u32 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_and_tasks_leave_a_history_the_checker_accepts() {
    let lock_server = RedisServer::start();
    let store_server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = WorkerSpec::contender(
        &lock_server.url(),
        &store_server.url(),
        dir.path(),
        "contended",
    );
    spec.tasks = TASKS;
    spec.holds = HOLDS;
    spec.wait = Duration::from_secs(20);
    spec.lease = Some(Duration::from_millis(250));
    // One hold in 50 sleeps past its lease and writes late; one task per process only
    // waits 5 ms, so timeouts are exercised too.
    spec.overrun_every = 50;
    spec.impatient_wait = Some(Duration::from_millis(5));
    let workers: Vec<_> = (0..PROCESSES).map(|_| spec.spawn()).collect();
    for worker in workers {
        worker.join(Duration::from_secs(90)).await;
    }

    let history = history::load(dir.path());
    let summary = history::assert_valid(&history, &Bounds::default());
    eprintln!("contention: {summary:?}");
    assert_eq!(summary.holds, (PROCESSES * TASKS * HOLDS) as usize);
    assert!(summary.attempts >= summary.holds + summary.timeouts);
    // The branches of the checker that only faults reach were reached.
    assert!(summary.lost > 0, "no hold outlived its lease: {summary:?}");
    assert!(
        summary.overlaps > 0,
        "no stale holder overlapped a new one: {summary:?}"
    );
    assert!(
        summary.rejected_writes > 0,
        "no stale write was refused: {summary:?}"
    );
    assert!(
        summary.timeouts > 0,
        "no impatient acquire timed out: {summary:?}"
    );
    assert_eq!(summary.errors, 0, "{summary:?}");

    // The store took writes in token order, and the lock left nothing behind.
    let accepted = FencedStore::connect(&store_server.url())
        .await
        .accepted()
        .await;
    assert!(accepted.windows(2).all(|pair| pair[0] <= pair[1]));
    let mut redis = redis::Client::open(lock_server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let exists: bool = redis.exists("contended").await.unwrap();
    assert!(!exists, "the lock outlived its last release");
}
