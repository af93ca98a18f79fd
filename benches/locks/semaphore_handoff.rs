//! Semaphore hand-off latency: [`PERMITS`] permits always held and waiters queued for
//! them (`PERMITS + waiters` tasks taking a permit, holding it for [`HOLD`] and asking
//! again, until a number of acquisitions); a hand-off is a holder's release call to the
//! acquire return of the waiter that takes the freed permit. In PING round trips taken
//! just before (back to back, and after an idle sleep as a parked waiter sees it),
//! beside the exclusive lock's hand-off at the same waiter count in this run (the
//! handoff scenario) — that is the same measurement with one "permit".
//!
//! Permits are interchangeable, so releases and acquisitions are paired first in,
//! first out: the `k`-th acquisition after the first `PERMITS` takes the `k`-th freed
//! permit. With waiters always queued a freed permit is taken as soon as the semaphore
//! lets one of them have it, so each pair is one hand-off.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_runtime::LockClient;

use crate::contenders::{LEASE, WAIT};
use crate::context::{Bench, HOLD};
use crate::handoff::{self, Curves};
use crate::stats::{Figure, Verdict, micros, number, quantile};

/// The semaphore's size.
const PERMITS: u32 = 4;
/// Waiter counts, each with one shared client (as the exclusive handoff scenario).
const WAITERS: [usize; 3] = [2, 16, 64];
/// Then this many waiters with the tasks spread over this many clients (separate
/// processes): a freed permit wakes the first waiter of every client.
const SPREAD: (usize, usize) = (16, 5);

/// What one run observed.
#[derive(Debug, Default)]
struct Run {
    acquisitions: usize,
    handoffs: Vec<Duration>,
    /// Most holders at once, and acquisitions that made them more than `PERMITS`.
    max_inside: usize,
    violations: usize,
    /// Acquisitions past the first `PERMITS` that found no freed permit to pair with.
    unpaired: usize,
    /// Release call to return, per release.
    releases: Vec<Duration>,
}

/// Two rows per waiter count, and a note.
pub async fn run(bench: &mut Bench, exclusive: Option<&Curves>) {
    let scale = bench.scale;
    let shared = bench.redlock_clients(1).await;
    let (spread_waiters, spread_clients) = SPREAD;
    let spread = bench.redlock_clients(spread_clients).await;
    let runs = WAITERS
        .iter()
        .map(|&w| (w, &shared[..]))
        .chain([(spread_waiters, &spread[..])]);
    for (waiters, clients) in runs {
        let tasks = PERMITS as usize + waiters;
        let across = if clients.len() == 1 {
            "one client".to_owned()
        } else {
            format!("{} clients", clients.len())
        };
        bench.progress(&format!("semaphore handoff, {waiters} waiters, {across}"));
        let (rtt, idle) = bench.rtt_now().await;
        let total = handoff::acquisitions(waiters, scale).max(2 * tasks);
        let name = format!("bench:semaphore:{waiters}:{}", clients.len());
        let run = measure(clients, &name, tasks, total).await;
        bench.violations[0] += run.violations;
        let versus = match exclusive.and_then(|curves| curves.redlock_at(waiters)) {
            Some(_) if clients.len() > 1 => "exclusive: measured on one client".to_owned(),
            Some((p50, p99, rtt)) => format!(
                "exclusive {} / {} RTT",
                number(p50 / rtt),
                number(p99 / rtt)
            ),
            None => "exclusive not measured".to_owned(),
        };
        let id_suffix = if clients.len() == 1 {
            String::new()
        } else {
            format!(".clients_{}", clients.len())
        };
        for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
            let mine = micros(quantile(&run.handoffs, q));
            bench.report.add(Figure {
                id: format!("semaphore_handoff_{label}.waiters_{waiters}{id_suffix}"),
                scenario: format!(
                    "semaphore of {PERMITS}, {waiters} waiters, {across}: handoff {label}"
                ),
                redlock: Some(mine),
                rslock: None,
                unit: "µs",
                limit: format!("RTT {} µs (idle {} µs)", number(rtt), number(idle)),
                ratio: if q == 0.5 {
                    format!(
                        "{} RTT ({} idle); {versus}",
                        number(mine / rtt),
                        number(mine / idle)
                    )
                } else {
                    format!("{} RTT ({} idle)", number(mine / rtt), number(mine / idle))
                },
                target: "-".into(),
                verdict: Verdict::Info,
            });
        }
        bench.report.note(format!(
            "semaphore handoff, {PERMITS} permits, {waiters} waiters, {across}: {tasks} tasks until {total} acquisitions \
             ({} made), {} hand-offs paired, {} unpaired; release call p50 {} µs = {} RTT; \
             most holders at once {} (above {PERMITS}: {})",
            run.acquisitions,
            run.handoffs.len(),
            run.unpaired,
            number(micros(quantile(&run.releases, 0.5))),
            number(micros(quantile(&run.releases, 0.5)) / rtt),
            run.max_inside,
            run.violations,
        ));
    }
}

/// `tasks` tasks of `clients` take permits of the semaphore `name` and hold each for
/// [`HOLD`], until `total` acquisitions were made in all.
async fn measure(clients: &[LockClient], name: &str, tasks: usize, total: usize) -> Run {
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let acquired = Arc::new(AtomicUsize::new(0));
    let freed = Arc::new(Mutex::new(VecDeque::<Instant>::new()));
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks + 1));
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let client = clients[task % clients.len()].clone();
        let name = name.to_owned();
        let (inside, max_inside, violations, acquired, freed) = (
            inside.clone(),
            max_inside.clone(),
            violations.clone(),
            acquired.clone(),
            freed.clone(),
        );
        let barrier = barrier.clone();
        set.spawn(async move {
            let (mut handoffs, mut releases, mut unpaired, mut count) =
                (Vec::new(), Vec::new(), 0, 0);
            barrier.wait().await;
            while acquired.load(Ordering::SeqCst) < total {
                let guard = client
                    .semaphore(name.as_str(), PERMITS)
                    .wait(WAIT)
                    .lease(LEASE)
                    .acquire()
                    .await
                    .unwrap_or_else(|error| panic!("semaphore acquire {name}: {error}"));
                let at = Instant::now();
                count += 1;
                let before = inside.fetch_add(1, Ordering::SeqCst);
                if before >= PERMITS as usize {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                max_inside.fetch_max(before + 1, Ordering::SeqCst);
                if acquired.fetch_add(1, Ordering::SeqCst) >= PERMITS as usize {
                    match freed.lock().unwrap().pop_front() {
                        Some(released) => handoffs.push(at.saturating_duration_since(released)),
                        None => unpaired += 1,
                    }
                }
                tokio::time::sleep(HOLD).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                let releasing = Instant::now();
                freed.lock().unwrap().push_back(releasing);
                guard.release().await.expect("semaphore release");
                releases.push(releasing.elapsed());
            }
            (handoffs, releases, unpaired, count)
        });
    }
    barrier.wait().await;
    let mut run = Run::default();
    while let Some(done) = set.join_next().await {
        let (handoffs, releases, unpaired, count) = done.expect("semaphore task");
        run.handoffs.extend(handoffs);
        run.releases.extend(releases);
        run.unpaired += unpaired;
        run.acquisitions += count;
    }
    run.max_inside = max_inside.load(Ordering::SeqCst);
    run.violations = violations.load(Ordering::SeqCst);
    run
}
