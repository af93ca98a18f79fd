//! Contention: many tasks taking turns on one key, with one shared client and with a
//! client per task (how separate processes contend). Utilisation, wait p99, fairness
//! and mutual-exclusion violations of each run.

use crate::context::{Bench, HOLD};
use crate::scenarios::{self, Contention, Stop};
use crate::stats::{Figure, Report, Verdict, micros, number};

/// Acquisitions per task.
const PER_TASK: usize = 20;

/// 16 and 64 tasks on one shared client, then 16 tasks with a client each.
pub async fn run(bench: &mut Bench) {
    let scale = bench.scale;
    for tasks in [16, 64] {
        bench.progress(&format!("contention, {tasks} tasks"));
        let mut runs = Vec::new();
        for lock in [&bench.redlock, &bench.rslock] {
            let key = format!("bench:contended:{}:{tasks}", lock.name());
            let run = scenarios::contend(
                std::slice::from_ref(lock),
                &key,
                tasks,
                Stop::PerTask(PER_TASK / scale),
                HOLD,
            )
            .await;
            runs.push(run);
        }
        report_figures(&mut bench.report, tasks, "", &runs[0], &runs[1]);
        for (total, run) in bench.violations.iter_mut().zip(&runs) {
            *total += run.violations;
        }
    }
    for tasks in [16] {
        bench.progress(&format!("contention, {tasks} clients"));
        let (redlocks, rslocks) = bench.client_per_task(tasks).await;
        let a = scenarios::contend(
            &redlocks,
            &format!("bench:contended:redlock:{tasks}c"),
            tasks,
            Stop::PerTask(PER_TASK / scale),
            HOLD,
        )
        .await;
        let b = scenarios::contend(
            &rslocks,
            &format!("bench:contended:rslock:{tasks}c"),
            tasks,
            Stop::PerTask(PER_TASK / scale),
            HOLD,
        )
        .await;
        report_figures(&mut bench.report, tasks, ", a client per task", &a, &b);
        bench.violations[0] += a.violations;
        bench.violations[1] += b.violations;
    }
}

/// The four rows of a run, redlock `a` against rslock `b`, and a note. `suffix` names
/// the variant in the rows (empty for one shared client).
fn report_figures(report: &mut Report, tasks: usize, suffix: &str, a: &Contention, b: &Contention) {
    let id_suffix = if suffix.is_empty() {
        String::new()
    } else {
        ".client_per_task".into()
    };
    let clean = a.violations == 0;
    report.add(Figure {
        id: format!("utilisation.tasks_{tasks}{id_suffix}"),
        scenario: format!(
            "{tasks} tasks × {} acquisitions of one key{suffix}: utilisation",
            a.acquisitions / tasks
        ),
        redlock: Some(a.utilisation()),
        rslock: Some(b.utilisation()),
        unit: "",
        limit: "1.0".into(),
        ratio: format!("mean hold {} µs", number(micros(a.mean_hold()))),
        target: "≥ 0.9".into(),
        verdict: Verdict::of(clean && a.utilisation() >= 0.9),
    });
    let limit = |run: &Contention| micros(run.mean_hold()) * tasks as f64 / 1000.0;
    let p99 = |run: &Contention| micros(run.wait_p99()) / 1000.0;
    report.add(Figure {
        id: format!("wait_p99.tasks_{tasks}{id_suffix}"),
        scenario: format!("{tasks} tasks{suffix}: wait p99"),
        redlock: Some(p99(a)),
        rslock: Some(p99(b)),
        unit: "ms",
        limit: format!("tasks × mean hold {} ms", number(limit(a))),
        ratio: format!(
            "{} × limit (rslock {})",
            number(p99(a) / limit(a)),
            number(p99(b) / limit(b))
        ),
        target: "≤ 2 × limit".into(),
        verdict: Verdict::of(clean && p99(a) <= 2.0 * limit(a)),
    });
    report.add(Figure {
        id: format!("fairness.tasks_{tasks}{id_suffix}"),
        scenario: format!("{tasks} tasks{suffix}: fairness (longest task wait / median)"),
        redlock: Some(a.fairness()),
        rslock: Some(b.fairness()),
        unit: "",
        limit: "1".into(),
        ratio: "-".into(),
        target: "≤ 2".into(),
        verdict: Verdict::of(clean && a.fairness() <= 2.0),
    });
    report.add(Figure {
        id: format!("violations.tasks_{tasks}{id_suffix}"),
        scenario: format!("{tasks} tasks{suffix}: mutual-exclusion violations (max inside)"),
        redlock: Some(a.violations as f64),
        rslock: Some(b.violations as f64),
        unit: "",
        limit: "0".into(),
        ratio: format!("max inside {} (rslock {})", a.max_inside, b.max_inside),
        target: "0".into(),
        verdict: Verdict::of(clean),
    });
    report.note(format!(
        "{tasks} tasks{suffix}: elapsed redlock {} ms, rslock {} ms; mean hold rslock {} µs; \
         re-acquired by the releasing task: redlock {}, rslock {} of {}",
        number(a.elapsed.as_secs_f64() * 1e3),
        number(b.elapsed.as_secs_f64() * 1e3),
        number(micros(b.mean_hold())),
        a.reacquired_by_releaser,
        b.reacquired_by_releaser,
        b.acquisitions
    ));
}
