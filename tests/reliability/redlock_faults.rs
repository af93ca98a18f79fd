//! The history checker over RedLock: five masters, worker processes contending, and
//! masters killed and restarted empty while they run. Never more than a minority is
//! faulty at once, counting a master restarted empty as faulty until its restart
//! quarantine (`max_lease`, 60 s by default) has passed: it must not vote before.

use std::time::Duration;

use redlock_testkit::RedisServer;

use crate::history::{self, Bounds};
use crate::store::FencedStore;
use crate::workers::WorkerSpec;

const PROCESSES: u32 = 3;
const TASKS: u32 = 4;
const HOLDS: u32 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_lost_and_restarted_empty_under_contention() {
    let mut masters: Vec<RedisServer> = (0..5)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let store_server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let mut spec = WorkerSpec::contender(&urls.join(","), &store_server.url(), dir.path(), "fleet");
    spec.tasks = TASKS;
    spec.holds = HOLDS;
    spec.wait = Duration::from_secs(30);
    spec.lease = Some(Duration::from_millis(400));
    spec.overrun_every = 40;
    let workers: Vec<_> = (0..PROCESSES).map(|_| spec.spawn()).collect();

    // While they run: one master dies, another forgets everything (restart without
    // persistence), then the dead one comes back empty. Two are faulty from then on
    // (both in their restart quarantine): the other three are still a majority.
    tokio::time::sleep(Duration::from_millis(700)).await;
    masters[1].kill();
    tokio::time::sleep(Duration::from_millis(700)).await;
    masters[3].restart();
    tokio::time::sleep(Duration::from_millis(700)).await;
    masters[1].restart();

    for worker in workers {
        worker.join(Duration::from_secs(120)).await;
    }
    let history = history::load(dir.path());
    let summary = history::assert_valid(&history, &Bounds::default());
    eprintln!("redlock faults: {summary:?}");
    assert_eq!(summary.holds, (PROCESSES * TASKS * HOLDS) as usize);
    if summary.errors > 0 {
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
            for line in text.lines().filter(|line| line.contains("error:")) {
                eprintln!("{line}");
            }
        }
    }
    assert_eq!(summary.errors, 0, "{summary:?}");
    let accepted = FencedStore::connect(&store_server.url())
        .await
        .accepted()
        .await;
    assert!(
        accepted.windows(2).all(|pair| pair[0] <= pair[1]),
        "the store took a write out of token order"
    );
    for survivor in &masters {
        assert_eq!(
            survivor.cli(&["EXISTS", "fleet"]),
            "0",
            "a lock key was left behind"
        );
    }
}
