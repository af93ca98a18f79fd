//! Redis round trips per acquisition: the handoff runs again, in a separate pass under
//! MONITOR (which slows Redis, so the handoff latencies are taken without it), counting
//! the top-level commands per acquisition; with one shared client, then a client per
//! task.

use crate::contenders::Lock;
use crate::context::{Bench, HOLD, WAITERS};
use crate::handoff;
use crate::monitor::{self, Monitor};
use crate::scenarios::{self, Stop};
use crate::stats::{Figure, Verdict, number};

/// A row and a note per waiter count, then the same for 16 waiters with a client each.
pub async fn run(bench: &mut Bench) {
    let scale = bench.scale;
    let mut monitor = Monitor::start(bench.server.port(), &bench.url).await;
    for waiters in WAITERS {
        bench.progress(&format!("round trips, {waiters} waiters"));
        let total = handoff::acquisitions(waiters, scale);
        let mut per_acquisition = Vec::new();
        let mut details = Vec::new();
        for lock in [bench.redlock.clone(), bench.rslock.clone()] {
            let key = format!("bench:rtt:{}:{waiters}", lock.name());
            let locks = std::slice::from_ref(&lock);
            let (per, detail) = count(bench, &mut monitor, locks, &key, waiters, total).await;
            per_acquisition.push(per);
            details.push(detail);
        }
        bench.report.add(Figure {
            id: format!("round_trips_per_acquisition.waiters_{waiters}"),
            scenario: format!("Redis round trips per acquisition, {waiters} waiters"),
            redlock: Some(per_acquisition[0]),
            rslock: Some(per_acquisition[1]),
            unit: "",
            limit: "2".into(),
            ratio: format!("{} × limit", number(per_acquisition[0] / 2.0)),
            target: "≤ 4, flat".into(),
            verdict: Verdict::of(per_acquisition[0] <= 4.0),
        });
        bench.report.note(format!(
            "round trips, {waiters} waiters (top-level commands in the MONITOR window): {}",
            details.join("; ")
        ));
    }
    for waiters in [16] {
        bench.progress(&format!("round trips, {waiters} waiters, a client each"));
        let total = handoff::acquisitions(waiters, scale);
        let (redlocks, rslocks) = bench.client_per_task(waiters + 1).await;
        let mut per_acquisition = Vec::new();
        let mut details = Vec::new();
        for locks in [&redlocks, &rslocks] {
            let key = format!("bench:rtt:{}:{waiters}c", locks[0].name());
            let (per, detail) = count(bench, &mut monitor, locks, &key, waiters, total).await;
            per_acquisition.push(per);
            details.push(detail);
        }
        bench.report.add(Figure {
            id: format!("round_trips_per_acquisition.waiters_{waiters}.client_per_task"),
            scenario: format!(
                "Redis round trips per acquisition, {waiters} waiters, a client per task"
            ),
            redlock: Some(per_acquisition[0]),
            rslock: Some(per_acquisition[1]),
            unit: "",
            limit: "2".into(),
            ratio: format!("{} × limit", number(per_acquisition[0] / 2.0)),
            target: "≤ 4, flat".into(),
            verdict: Verdict::of(per_acquisition[0] <= 4.0),
        });
        bench.report.note(format!(
            "round trips, {waiters} waiters, a client per task: {}",
            details.join("; ")
        ));
    }
    monitor.stop();
}

/// `waiters + 1` tasks of `locks` contend for `key` under MONITOR until `total`
/// acquisitions: top-level commands per acquisition, and the note's detail.
async fn count(
    bench: &mut Bench,
    monitor: &mut Monitor,
    locks: &[Lock],
    key: &str,
    waiters: usize,
    total: usize,
) -> (f64, String) {
    let name = locks[0].name();
    let (run, commands) = monitor
        .record(scenarios::contend(
            locks,
            key,
            waiters + 1,
            Stop::Total(total),
            HOLD,
        ))
        .await;
    let counts = monitor::top_level(&commands);
    let top: usize = counts.values().sum();
    bench.violations[usize::from(name == "rslock")] += run.violations;
    (
        top as f64 / run.acquisitions as f64,
        format!(
            "{name}: {} acquisitions, {}",
            run.acquisitions,
            monitor::summary(&counts)
        ),
    )
}
