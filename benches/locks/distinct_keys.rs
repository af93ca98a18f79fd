//! The uncontended and distinct-key scenarios at 1, 4, 16 and 64 tasks, without a
//! tracing subscriber and then with the one a service runs with (`fmt` at INFO).
//!
//! Every task cycles (acquire + release) on a key of its own for a round: a task's
//! cycle is uncontended whatever the number of tasks, so one run gives both figures,
//! the cycle's p50 (the uncontended figure at that many tasks) and the cycles per
//! second (the distinct-key throughput). Rounds alternate redlock and rslock; each
//! figure is the median of [`ROUNDS`]; the counters of [`crate::cost`] are read around
//! each round.
//!
//! A global subscriber cannot be removed once set, so [`run_with_tracing`] installs it
//! and must come after every other scenario (the order of [`crate::SCENARIOS`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::contenders::Lock;
use crate::context::{BLOCK_LEN, Bench};
use crate::cost::{self, Cost, Nesting, Reading};
use crate::scenarios;
use crate::stats::{Figure, Verdict, median, micros, number, quantile};

/// Task counts; 64 is also the throughput scenario's, whose rows stay its own.
pub const TASKS: [usize; 4] = [1, 4, 16, 64];
/// Task counts with rows of their own without a subscriber (64 has the throughput
/// scenario's; its figures here are the baseline of the row with tracing).
const ROW_TASKS: [usize; 3] = [1, 4, 16];
const ROUND: Duration = Duration::from_millis(400);
const ROUNDS: usize = 3;

/// One task count's figures: redlock's, then rslock's.
#[derive(Debug, Clone)]
pub struct Point {
    tasks: usize,
    /// PING p50 just before the rounds, µs.
    rtt: f64,
    /// Cycles per second, median of rounds.
    rate: [f64; 2],
    /// Cycle p50 (over every task's cycles of a round), median of rounds, µs.
    p50: [f64; 2],
    cost: [Cost; 2],
}

/// The figures at every task count of [`TASKS`], without a subscriber (empty when that
/// scenario did not run).
#[derive(Debug, Default)]
pub struct Sweep {
    points: Vec<Point>,
}

/// Bytes the INFO subscriber formatted (into nothing): how many events the path emits.
static LOGGED: AtomicU64 = AtomicU64::new(0);

/// A writer that drops what it is given and counts it.
struct Counting;

impl std::io::Write for Counting {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGGED.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `tasks` tasks, each cycling on a key of its own for `duration`: the cycles, the
/// time from the first start to the last end, and every cycle's duration.
pub async fn cycles(
    lock: &Lock,
    tasks: usize,
    duration: Duration,
    tag: &str,
) -> (usize, Duration, Vec<Duration>) {
    let started = Instant::now();
    let deadline = started + duration;
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let lock = lock.clone();
        let key = format!("bench:dk:{}:{tag}:{task}", lock.name());
        set.spawn(async move {
            let mut times = Vec::with_capacity(4096);
            let mut now = Instant::now();
            while now < deadline {
                lock.acquire(&key).await.release().await;
                let end = Instant::now();
                times.push(end - now);
                now = end;
            }
            times
        });
    }
    let mut times = Vec::new();
    while let Some(done) = set.join_next().await {
        times.extend(done.expect("distinct-key task"));
    }
    (times.len(), started.elapsed(), times)
}

/// Rounds at every task count of [`TASKS`]; `label` names the subscriber state in the
/// progress lines and in the round's keys.
async fn sweep(bench: &mut Bench, nesting: &[Nesting; 2], label: &str) -> Vec<Point> {
    let scale = bench.scale;
    let mut points = Vec::new();
    for tasks in TASKS {
        bench.progress(&format!("distinct keys, {}, {label}", tasks_label(tasks)));
        let rtt = micros(quantile(
            &scenarios::ping_block(&mut bench.ping, BLOCK_LEN / scale).await,
            0.5,
        ));
        let mut rates = [Vec::new(), Vec::new()];
        let mut p50s = [Vec::new(), Vec::new()];
        let mut costs = [Vec::new(), Vec::new()];
        for round in 0..ROUNDS {
            for (index, lock) in [bench.redlock.clone(), bench.rslock.clone()]
                .iter()
                .enumerate()
            {
                let tag = format!("{label}:{tasks}:{round}");
                let before = Reading::before(&mut bench.ping).await;
                let (n, elapsed, times) = cycles(lock, tasks, ROUND / scale as u32, &tag).await;
                let after = Reading::after(&mut bench.ping).await;
                rates[index].push(n as f64 / elapsed.as_secs_f64());
                p50s[index].push(micros(quantile(&times, 0.5)));
                costs[index].push(Cost::between(
                    &before,
                    &after,
                    n,
                    tasks,
                    elapsed,
                    &nesting[index],
                    rtt,
                ));
            }
        }
        points.push(Point {
            tasks,
            rtt,
            rate: [median(&rates[0]), median(&rates[1])],
            p50: [median(&p50s[0]), median(&p50s[1])],
            cost: [Cost::median(&costs[0]), Cost::median(&costs[1])],
        });
    }
    points
}

fn tasks_label(tasks: usize) -> String {
    if tasks == 1 {
        "1 task".to_owned()
    } else {
        format!("{tasks} tasks")
    }
}

/// The scenario without a subscriber: rows at 1, 4 and 16 tasks, the breakdown at every
/// count; returns the figures for [`run_with_tracing`] to compare with.
pub async fn run(bench: &mut Bench, nesting: &[Nesting; 2]) -> Sweep {
    // What this process burns with nothing to do (tokio, the clients' background
    // tasks): the client CPU per cycle includes it for the length of a round.
    let idle = Duration::from_millis(200 / bench.scale as u64);
    let cpu = cost::process_cpu();
    tokio::time::sleep(idle).await;
    let idle_cpu = (cost::process_cpu() - cpu).as_secs_f64() / idle.as_secs_f64();
    let points = sweep(bench, nesting, "no subscriber").await;
    for point in &points {
        let name = tasks_label(point.tasks);
        if ROW_TASKS.contains(&point.tasks) {
            add_rows(bench, point, None, "");
        }
        cost::report(
            bench,
            &format!("distinct_keys_{}_tasks", point.tasks),
            &format!("distinct keys, {name}, no subscriber"),
            &point.cost,
            false,
        );
    }
    bench.report.note(format!(
        "distinct keys at 1/4/16/64 tasks: every task cycles on a key of its own (so each cycle is uncontended) for \
         {} ms per round, {ROUNDS} rounds alternating redlock and rslock, medians; one run gives the cycle p50 \
         (over every task's cycles) and the cycles per second; the RTT is a block of {} PINGs before each count. \
         Without a subscriber this process used {} ms of CPU per second idle (tokio and the clients' background \
         tasks), within the client CPU per cycle. These tasks run on the runtime's workers, next to \
         the connection's own task; the uncontended scenario's cycles run in `block_on` on the main thread, \
         so each of its round trips also hands over between threads (compare the two 1-task p50s and client \
         CPUs). The 64-task throughput row is the throughput scenario's \
         (1.5 s rounds); this scenario's 64-task figures are the base of the row with tracing",
        (ROUND / bench.scale as u32).as_millis(),
        BLOCK_LEN / bench.scale,
        number(idle_cpu * 1e3),
    ));
    Sweep { points }
}

/// Installs the subscriber a service runs with (`tracing_subscriber::fmt()` at INFO,
/// writing into a counting sink, and the `log` bridge its `init` sets up) and runs the
/// scenario again: a row per task count for the cycle p50 and the throughput, against
/// the figures `without` it. Every scenario after this one would run with it.
pub async fn run_with_tracing(bench: &mut Bench, nesting: &[Nesting; 2], without: &Sweep) {
    let installed = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(|| Counting)
        .try_init();
    if let Err(error) = installed {
        bench
            .report
            .note(format!("tracing subscriber not installed: {error}"));
        return;
    }
    // An event the subscriber must write: proof that it is in place.
    tracing::info!("bench: tracing subscriber at INFO installed");
    let check = LOGGED.load(Ordering::Relaxed);
    let points = sweep(bench, nesting, "tracing INFO").await;
    let logged = LOGGED.load(Ordering::Relaxed) - check;
    for point in &points {
        let base = without.points.iter().find(|p| p.tasks == point.tasks);
        add_rows(bench, point, base, ", tracing INFO subscriber");
        cost::report(
            bench,
            &format!("distinct_keys_{}_tasks_tracing_info", point.tasks),
            &format!("distinct keys, {}, tracing INFO", tasks_label(point.tasks)),
            &point.cost,
            false,
        );
    }
    bench.report.note(format!(
        "tracing INFO: `tracing_subscriber::fmt().with_max_level(INFO)` set as the global default with its `log` \
         bridge (`try_init`), writing into a sink that counts: {logged} bytes of log lines during these rounds \
         ({} check line before them). redlock emits through `tracing` (spans and events at DEBUG, warnings at \
         WARN); rslock has no logging of its own (neither `log` nor `tracing`); redis-rs, under both, logs \
         through `log`, which the bridge forwards at INFO and above. Installed after every other scenario (a \
         global subscriber cannot be removed), right after the rounds without it; rslock runs the same \
         code with and without, so its ratio is the drift of the machine between the two sweeps, and \
         \"net\" is redlock's ratio over rslock's",
        if check > 0 { "a" } else { "no" },
    ));
}

/// The p50 and throughput rows of one task count; with `base` (the figures without a
/// subscriber) the ratios are to it, else to rslock.
fn add_rows(bench: &mut Bench, point: &Point, base: Option<&Point>, suffix: &str) {
    let name = tasks_label(point.tasks);
    let id_suffix = if suffix.is_empty() {
        String::new()
    } else {
        ".tracing_info".to_owned()
    };
    let ratios = [point.p50[0] / point.rtt, point.p50[1] / point.rtt];
    let (p50_ratio, p50_limit) = match base {
        Some(base) => (
            format!(
                "{} × without (rslock {} ×: {} × net); {} RTT",
                number(point.p50[0] / base.p50[0]),
                number(point.p50[1] / base.p50[1]),
                number(point.p50[0] / base.p50[0] / (point.p50[1] / base.p50[1])),
                number(ratios[0]),
            ),
            format!(
                "without: {} µs, rslock {} µs",
                number(base.p50[0]),
                number(base.p50[1])
            ),
        ),
        None => (
            format!(
                "{} RTT (rslock {} RTT); {} × rslock",
                number(ratios[0]),
                number(ratios[1]),
                number(point.p50[0] / point.p50[1]),
            ),
            format!("RTT p50 {} µs", number(point.rtt)),
        ),
    };
    bench.report.add(Figure {
        id: format!("distinct_keys_p50.tasks_{}{id_suffix}", point.tasks),
        scenario: format!("uncontended, {name} on distinct keys, cycle p50{suffix}"),
        redlock: Some(point.p50[0]),
        rslock: Some(point.p50[1]),
        unit: "µs",
        limit: p50_limit,
        ratio: p50_ratio,
        target: "-".into(),
        verdict: Verdict::Info,
    });
    let (rate_ratio, rate_limit) = match base {
        Some(base) => (
            format!(
                "{} × without (rslock {} ×: {} × net); {} × rslock",
                number(point.rate[0] / base.rate[0]),
                number(point.rate[1] / base.rate[1]),
                number(point.rate[0] / base.rate[0] / (point.rate[1] / base.rate[1])),
                number(point.rate[0] / point.rate[1]),
            ),
            format!(
                "without: {}, rslock {} cycles/s",
                number(base.rate[0]),
                number(base.rate[1])
            ),
        ),
        None => (
            format!("{} × rslock", number(point.rate[0] / point.rate[1])),
            "-".to_owned(),
        ),
    };
    bench.report.add(Figure {
        id: format!("distinct_keys_throughput.tasks_{}{id_suffix}", point.tasks),
        scenario: format!("throughput, {name} on distinct keys{suffix}"),
        redlock: Some(point.rate[0]),
        rslock: Some(point.rate[1]),
        unit: "cycles/s",
        limit: rate_limit,
        ratio: rate_ratio,
        target: "-".into(),
        verdict: Verdict::Info,
    });
}
