//! The workloads: round-trip blocks, uncontended cycles, throughput, contention.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::contenders::Lock;
use crate::stats::{median, quantile};

/// `n` PINGs one after another; each one's round trip.
pub async fn ping_block(
    connection: &mut redis::aio::MultiplexedConnection,
    n: usize,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(connection)
            .await
            .expect("PING");
        samples.push(started.elapsed());
    }
    samples
}

/// `n` PINGs, each after `idle` of sleep: the round trip as a task that was parked
/// (as a waiter is when the lock is handed to it) sees it.
pub async fn idle_ping_block(
    connection: &mut redis::aio::MultiplexedConnection,
    n: usize,
    idle: Duration,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        tokio::time::sleep(idle).await;
        samples.extend(ping_block(connection, 1).await);
    }
    samples
}

/// `n` acquire+release cycles of one free key; each cycle's acquire and release times.
pub async fn cycle_block(lock: &Lock, key: &str, n: usize) -> Vec<(Duration, Duration)> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let guard = lock.acquire(key).await;
        let acquired = Instant::now();
        guard.release().await;
        samples.push((acquired - started, acquired.elapsed()));
    }
    samples
}

/// `tasks` tasks, each cycling on a key of its own for `duration`: the cycles, and the
/// time from the first task's start to the last one's end (cycles per second = their
/// ratio).
pub async fn throughput_counted(
    lock: &Lock,
    tasks: usize,
    duration: Duration,
    tag: &str,
) -> (usize, Duration) {
    let started = Instant::now();
    let deadline = started + duration;
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let lock = lock.clone();
        let key = format!("bench:tp:{}:{tag}:{task}", lock.name());
        set.spawn(async move {
            let mut cycles = 0u64;
            while Instant::now() < deadline {
                lock.acquire(&key).await.release().await;
                cycles += 1;
            }
            cycles
        });
    }
    let mut cycles = 0;
    while let Some(done) = set.join_next().await {
        cycles += done.expect("throughput task");
    }
    (cycles as usize, started.elapsed())
}

/// When the tasks of a contention run stop.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// Each task acquires this many times.
    PerTask(usize),
    /// The tasks keep going until this many acquisitions were made in all.
    Total(usize),
}

/// What a contention run observed.
#[derive(Debug, Default)]
pub struct Contention {
    pub acquisitions: usize,
    /// Acquire call to return, per acquisition.
    pub waits: Vec<Duration>,
    /// Acquire return to release call, per acquisition.
    pub holds: Vec<Duration>,
    /// Sum of each task's waits.
    pub task_waits: Vec<Duration>,
    /// Release call of the previous holder to the acquire return of the next, when the
    /// next is another task.
    pub handoffs: Vec<Duration>,
    /// Release call to return, per acquisition.
    pub releases: Vec<Duration>,
    /// Acquisitions by the task that held the lock just before (it barged back in).
    pub reacquired_by_releaser: usize,
    /// First acquire call to last release return.
    pub elapsed: Duration,
    /// Acquisitions that found another task inside the critical section.
    pub violations: usize,
    /// Most tasks ever inside the critical section at once.
    pub max_inside: usize,
}

impl Contention {
    pub fn utilisation(&self) -> f64 {
        self.holds.iter().sum::<Duration>().as_secs_f64() / self.elapsed.as_secs_f64()
    }

    pub fn mean_hold(&self) -> Duration {
        self.holds.iter().sum::<Duration>() / self.holds.len().max(1) as u32
    }

    pub fn wait_p99(&self) -> Duration {
        quantile(&self.waits, 0.99)
    }

    /// Longest total wait of a task over the median task's.
    pub fn fairness(&self) -> f64 {
        let totals: Vec<f64> = self.task_waits.iter().map(Duration::as_secs_f64).collect();
        let longest = totals.iter().copied().fold(0.0, f64::max);
        longest / median(&totals)
    }
}

struct Shared {
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    violations: AtomicUsize,
    acquired: AtomicUsize,
    /// The task that released last, and when it called release.
    last_release: Mutex<Option<(usize, Instant)>>,
}

/// `tasks` tasks contend for `key`, each holding it for `hold` (a tokio sleep, so a
/// little longer; the real hold is measured). Task `i` uses `locks[i % locks.len()]`:
/// one shared client, or a client per task.
pub async fn contend(
    locks: &[Lock],
    key: &str,
    tasks: usize,
    stop: Stop,
    hold: Duration,
) -> Contention {
    let shared = Arc::new(Shared {
        inside: AtomicUsize::new(0),
        max_inside: AtomicUsize::new(0),
        violations: AtomicUsize::new(0),
        acquired: AtomicUsize::new(0),
        last_release: Mutex::new(None),
    });
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks + 1));
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let lock = locks[task % locks.len()].clone();
        let key = key.to_owned();
        let shared = shared.clone();
        let barrier = barrier.clone();
        set.spawn(async move {
            let mut waits = Vec::new();
            let mut holds = Vec::new();
            let mut handoffs = Vec::new();
            let mut releases = Vec::new();
            let mut reacquired = 0;
            barrier.wait().await;
            let mut done = 0;
            loop {
                match stop {
                    Stop::PerTask(n) if done >= n => break,
                    Stop::Total(n) if shared.acquired.load(Ordering::SeqCst) >= n => break,
                    _ => {}
                }
                let asked = Instant::now();
                let guard = lock.acquire(&key).await;
                let acquired = Instant::now();
                // For `--trace-handoff` (off without its subscriber).
                tracing::trace!(name: "acquired", target: "redlock::timing", "bench: acquired");
                let before = shared.inside.fetch_add(1, Ordering::SeqCst);
                if before > 0 {
                    shared.violations.fetch_add(1, Ordering::SeqCst);
                }
                shared.max_inside.fetch_max(before + 1, Ordering::SeqCst);
                shared.acquired.fetch_add(1, Ordering::SeqCst);
                let previous = *shared.last_release.lock().unwrap();
                match previous {
                    Some((holder, _)) if holder == task => reacquired += 1,
                    Some((_, released)) => {
                        handoffs.push(acquired.saturating_duration_since(released))
                    }
                    None => {}
                }
                waits.push(acquired - asked);
                tokio::time::sleep(hold).await;
                shared.inside.fetch_sub(1, Ordering::SeqCst);
                let releasing = Instant::now();
                tracing::trace!(name: "release_called", target: "redlock::timing", "bench: releasing");
                holds.push(releasing - acquired);
                *shared.last_release.lock().unwrap() = Some((task, releasing));
                guard.release().await;
                releases.push(releasing.elapsed());
                done += 1;
            }
            (waits, holds, handoffs, releases, reacquired, Instant::now())
        });
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut result = Contention::default();
    let mut finished = started;
    while let Some(done) = set.join_next().await {
        let (waits, holds, handoffs, releases, reacquired, end) = done.expect("contending task");
        result.releases.extend(releases);
        result.task_waits.push(waits.iter().sum());
        result.waits.extend(waits);
        result.holds.extend(holds);
        result.handoffs.extend(handoffs);
        result.reacquired_by_releaser += reacquired;
        finished = finished.max(end);
    }
    result.elapsed = finished - started;
    result.acquisitions = result.holds.len();
    result.violations = shared.violations.load(Ordering::SeqCst);
    result.max_inside = shared.max_inside.load(Ordering::SeqCst);
    result
}
