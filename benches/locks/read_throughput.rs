//! Read throughput as readers grow: 1, 4, 16 and 64 tasks spread over up to 4 clients
//! (standing for processes), then 64 over 16 clients, each taking the read lock of one
//! key, holding it for [`READ_HOLD`] and letting go, in a loop for a fixed time.
//! Acquisitions per second, and utilisation = Σ hold / wall time, which exceeds 1 only
//! if readers really hold the key at the same time (at most: the number of readers).
//! Beside each: the same tasks taking the exclusive lock (`write_lock`) the same way,
//! whose utilisation cannot exceed 1, and the PING round trip taken just before.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_runtime::LockClient;

use crate::contenders::{LEASE, WAIT};
use crate::context::Bench;
use crate::stats::{Figure, Verdict, micros, number, quantile};
use crate::{redis_time, system, throughput};

/// Reader tasks and the clients they are spread over (task `i` uses client `i %
/// clients`), per run. One client has one acquire in flight per key at a time (its
/// tasks take turns), so the last run, with more clients, shows what that costs.
const RUNS: [(usize, usize); 5] = [(1, 1), (4, 4), (16, 4), (64, 4), (64, 16)];
/// The hold asked of `tokio::time::sleep` (the real hold, measured, is a little longer).
const READ_HOLD: Duration = Duration::from_millis(2);
/// How long the tasks of one run keep acquiring (divided by the scale).
const ROUND: Duration = Duration::from_millis(300);

/// What one run observed.
#[derive(Debug, Default)]
struct Run {
    acquisitions: usize,
    /// Acquire return to release call, summed.
    held: Duration,
    /// First acquire call to last release return.
    elapsed: Duration,
    /// Acquire call to return, per acquisition.
    waits: Vec<Duration>,
    /// Most tasks inside at once.
    max_inside: usize,
    /// Exclusive runs only: acquisitions that found another task inside.
    violations: usize,
    /// CPU per acquisition, µs: this process (the clients), Redis, and Redis's own time
    /// in the scripts (`INFO commandstats`, EVALSHA).
    cpu: (f64, f64, f64),
}

impl Run {
    fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }

    fn utilisation(&self) -> f64 {
        self.held.as_secs_f64() / self.elapsed.as_secs_f64()
    }

    /// The share of one core Redis (one thread) used during the run.
    fn redis_busy(&self) -> f64 {
        self.cpu.1 * self.rate() / 1e6
    }

    fn mean_hold(&self) -> Duration {
        self.held / self.acquisitions.max(1) as u32
    }
}

/// A read run and an exclusive run per reader count; two rows and a note each.
pub async fn run(bench: &mut Bench) {
    let most = RUNS.iter().map(|run| run.1).max().unwrap_or(1);
    let clients = bench.redlock_clients(most).await;
    let duration = ROUND / bench.scale as u32;
    for (readers, spread) in RUNS {
        bench.progress(&format!(
            "read throughput, {readers} readers, {spread} clients"
        ));
        let (rtt, _) = bench.rtt_now().await;
        let used = &clients[..spread];
        let read = measure(
            bench,
            used,
            &format!("bench:read:{readers}:{spread}"),
            readers,
            true,
        )
        .await;
        let excl = measure(
            bench,
            used,
            &format!("bench:excl:{readers}:{spread}"),
            readers,
            false,
        )
        .await;
        bench.violations[0] += excl.violations;
        let on = format!(
            "{readers} reader{} on {} client{}",
            if readers == 1 { "" } else { "s" },
            used.len(),
            if used.len() == 1 { "" } else { "s" }
        );
        bench.report.add(Figure {
            id: format!("read_throughput.readers_{readers}.clients_{spread}"),
            scenario: format!(
                "read lock, {on}, hold {} ms: acquisitions/s",
                READ_HOLD.as_millis()
            ),
            redlock: Some(read.rate()),
            rslock: None,
            unit: "acq/s",
            limit: format!(
                "write lock {} acq/s; RTT {} µs; Redis {} busy",
                number(excl.rate()),
                number(rtt),
                number(read.redis_busy())
            ),
            ratio: format!("{} × write lock", number(read.rate() / excl.rate())),
            target: "-".into(),
            verdict: Verdict::Info,
        });
        let overlap = readers > 1;
        bench.report.add(Figure {
            id: format!("read_utilisation.readers_{readers}.clients_{spread}"),
            scenario: format!("read lock, {on}: utilisation (Σ hold / wall)"),
            redlock: Some(read.utilisation()),
            rslock: None,
            unit: "",
            limit: format!(
                "write lock {} (≤ 1); ≤ {readers}",
                number(excl.utilisation())
            ),
            ratio: format!(
                "{} × write lock; {} of {readers}",
                number(read.utilisation() / excl.utilisation()),
                number(read.utilisation() / readers as f64)
            ),
            target: if overlap { "> 1".into() } else { "-".into() },
            verdict: if overlap {
                Verdict::of(read.utilisation() > 1.0 && excl.violations == 0)
            } else {
                Verdict::Info
            },
        });
        bench.report.note(format!(
            "read throughput, {on}, {} ms per run: read {} acquisitions, mean hold {} µs, most inside at once {}, \
             acquire p50 {} µs = {} RTT (p99 {} µs), CPU per acquisition + release {} µs here + {} µs Redis ({} µs of it in the scripts), i.e. {} cores here and {} of Redis's one thread; \
             write lock {} acquisitions, mean hold {} µs, most inside {}, acquire p50 {} µs (p99 {} µs); RTT p50 {} µs",
            duration.as_millis(),
            read.acquisitions,
            number(micros(read.mean_hold())),
            read.max_inside,
            number(micros(quantile(&read.waits, 0.5))),
            number(micros(quantile(&read.waits, 0.5)) / rtt),
            number(micros(quantile(&read.waits, 0.99))),
            number(read.cpu.0),
            number(read.cpu.1),
            number(read.cpu.2),
            number(read.cpu.0 * read.rate() / 1e6),
            number(read.redis_busy()),
            excl.acquisitions,
            number(micros(excl.mean_hold())),
            excl.max_inside,
            number(micros(quantile(&excl.waits, 0.5))),
            number(micros(quantile(&excl.waits, 0.99))),
            number(rtt),
        ));
    }
}

/// `tasks` tasks of `clients` take `key` (read locks if `read`, else the write lock)
/// and hold it for [`READ_HOLD`], again and again for [`ROUND`] (over the scale); an
/// acquire still waiting then is dropped (acquire is cancellation-safe). Also the CPU
/// this process and Redis used meanwhile.
async fn measure(
    bench: &mut Bench,
    clients: &[LockClient],
    key: &str,
    tasks: usize,
    read: bool,
) -> Run {
    let duration = ROUND / bench.scale as u32;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks + 1));
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let client = clients[task % clients.len()].clone();
        let key = key.to_owned();
        let (inside, max_inside, violations) =
            (inside.clone(), max_inside.clone(), violations.clone());
        let barrier = barrier.clone();
        set.spawn(async move {
            barrier.wait().await;
            let deadline = tokio::time::Instant::now() + duration;
            let (mut held, mut waits) = (Duration::ZERO, Vec::new());
            let mut end = Instant::now();
            while tokio::time::Instant::now() < deadline {
                let request = if read {
                    client.read_lock(key.as_str())
                } else {
                    client.write_lock(key.as_str())
                };
                let asked = Instant::now();
                let acquire = request.wait(WAIT).lease(LEASE).acquire();
                let Ok(acquired) = tokio::time::timeout_at(deadline, acquire).await else {
                    break;
                };
                let guard = acquired.unwrap_or_else(|error| panic!("acquire {key}: {error}"));
                let at = Instant::now();
                waits.push(at - asked);
                let before = inside.fetch_add(1, Ordering::SeqCst);
                if !read && before > 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                max_inside.fetch_max(before + 1, Ordering::SeqCst);
                tokio::time::sleep(READ_HOLD).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                held += at.elapsed();
                guard.release().await.expect("release");
                end = Instant::now();
            }
            (held, waits, end)
        });
    }
    let cpu_before = (
        system::thread_cpu_seconds(),
        throughput::redis_cpu_seconds(&mut bench.ping).await,
        redis_time::command_usec(&mut bench.ping, &["evalsha"]).await,
    );
    barrier.wait().await;
    let started = Instant::now();
    let mut run = Run::default();
    let mut finished = started;
    while let Some(done) = set.join_next().await {
        let (held, waits, end) = done.expect("reader task");
        run.held += held;
        run.acquisitions += waits.len();
        run.waits.extend(waits);
        finished = finished.max(end);
    }
    run.elapsed = finished - started;
    let per = |seconds: f64| seconds * 1e6 / run.acquisitions.max(1) as f64;
    run.cpu = (
        per(system::thread_cpu_seconds() - cpu_before.0),
        per(throughput::redis_cpu_seconds(&mut bench.ping).await - cpu_before.1),
        per(
            redis_time::command_usec(&mut bench.ping, &["evalsha"]).await / 1e6
                - cpu_before.2 / 1e6,
        ),
    );
    run.max_inside = max_inside.load(Ordering::SeqCst);
    run.violations = violations.load(Ordering::SeqCst);
    run
}
