//! Writer wait under a stream of readers: reader tasks on several clients (standing for
//! processes) take the read lock of one key back to back with a short hold, so that the
//! key is never free of readers; a writer on a client of its own arrives every
//! [`INTERVAL`] and takes the write lock. Its wait (acquire call to return) in reader
//! holds and in PING round trips, beside the limit: what is left of the reader holds
//! in flight when it arrives (it cannot have the key before the last of them ends).
//!
//! Readers prefer writers (`SHARED_ACQUIRE` in redlock-runtime's `scripts.rs`): once the
//! writer is on the key's waitlist, a new reader waits too, so its wait stays near the
//! limit; without that it would wait for a moment with no reader inside, which a
//! back-to-back stream never leaves. A second pass under MONITOR checks it where it is
//! decided, in Redis: no reader may be let in between the writer's registration on the
//! waitlist and its acquisition (except one the key was reserved for, queued ahead of
//! it). Client-side instants cannot tell: a reader let in just before the writer
//! registered may see its reply after the writer's arrival.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockError};

use crate::contenders::{LEASE, WAIT};
use crate::context::{Bench, HOLD};
use crate::monitor::{Command, Monitor};
use crate::stats::{Figure, Verdict, median, micros, number, quantile};

/// Reader tasks, spread over [`READER_CLIENTS`] clients; the writer has one more.
const READERS: usize = 8;
const READER_CLIENTS: usize = 4;
/// Writer arrivals (divided by the scale, at least 10), and the pause before each.
const ARRIVALS: usize = 60;
const INTERVAL: Duration = Duration::from_millis(10);
/// Writer arrivals of the pass under MONITOR (divided by the scale, at least 5).
const MONITORED_ARRIVALS: usize = 20;
/// How long the writer waits before it counts as starved.
const WRITER_WAIT: Duration = Duration::from_secs(5);

/// One reader acquisition: acquire return, release call.
type Hold = (Instant, Instant);

/// One writer arrival: its acquire call, and its acquire return (`None`: timed out).
type Arrival = (Instant, Option<Instant>);

/// What a pass observed.
#[derive(Debug, Default)]
struct Stream {
    holds: Vec<Hold>,
    reader_waits: Vec<Duration>,
    arrivals: Vec<Arrival>,
    /// The writer and a reader inside at once.
    violations: usize,
}

/// Four rows and a note.
pub async fn run(bench: &mut Bench) {
    bench.progress("writer wait under a reader stream");
    let (rtt, _) = bench.rtt_now().await;
    let clients = bench.redlock_clients(READER_CLIENTS + 1).await;
    let arrivals = (ARRIVALS / bench.scale).max(10);
    let seen = stream(&clients, "bench:writer-wait", arrivals).await;

    bench.progress("writer wait under a reader stream, under MONITOR");
    let key = "bench:writer-wait:monitored";
    let mut monitor = Monitor::start(bench.server.port(), &bench.url).await;
    let monitored_arrivals = (MONITORED_ARRIVALS / bench.scale).max(5);
    let (monitored, commands) = monitor
        .record(stream(&clients, key, monitored_arrivals))
        .await;
    monitor.stop();
    let order = ServerOrder::of(&commands, key);
    bench.violations[0] += seen.violations + monitored.violations;

    let hold =
        seen.holds.iter().map(|(a, r)| *r - *a).sum::<Duration>() / seen.holds.len().max(1) as u32;
    let hold = micros(hold);
    let mut waits = Vec::new();
    let mut limits = Vec::new();
    let mut excess = Vec::new();
    let mut admitted = Vec::new();
    // Arrival to the last reader admitted after it (by its acquire return), to the last
    // reader's release call (the key free of readers), and from then to the writer's
    // acquisition.
    let (mut latest_admission, mut readers_done, mut takeover) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut starved = 0;
    for &(arrived, acquired) in &seen.arrivals {
        let Some(acquired) = acquired else {
            starved += 1;
            continue;
        };
        // What is left of the reader holds in flight at the arrival.
        let left = seen
            .holds
            .iter()
            .filter(|(a, r)| *a <= arrived && arrived < *r)
            .map(|(_, r)| *r - arrived)
            .max()
            .unwrap_or_default();
        let wait = acquired - arrived;
        waits.push(wait);
        limits.push(left);
        excess.push(micros(wait) - micros(left));
        let after: Vec<&Hold> = seen
            .holds
            .iter()
            .filter(|(a, _)| arrived < *a && *a < acquired)
            .collect();
        admitted.push(after.len() as f64);
        latest_admission.push(
            after
                .iter()
                .map(|(a, _)| *a - arrived)
                .max()
                .unwrap_or_default(),
        );
        let last_release = seen
            .holds
            .iter()
            .filter(|(a, r)| *a < acquired && arrived < *r)
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(arrived);
        readers_done.push(last_release.saturating_duration_since(arrived));
        takeover.push(acquired.saturating_duration_since(last_release));
    }
    starved += monitored.arrivals.iter().filter(|a| a.1.is_none()).count();
    let scenario = format!("writer, {READERS} readers back to back on {READER_CLIENTS} clients");
    for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
        let wait = micros(quantile(&waits, q));
        let limit = micros(quantile(&limits, q));
        bench.report.add(Figure {
            id: format!("writer_wait_{name}.readers_{READERS}"),
            scenario: format!("{scenario}: wait {name}"),
            redlock: Some(wait),
            rslock: None,
            unit: "µs",
            limit: format!(
                "reader hold left {} µs (hold {} µs, RTT {} µs)",
                number(limit),
                number(hold),
                number(rtt)
            ),
            ratio: format!(
                "{} holds, {} RTT; limit + {} RTT",
                number(wait / hold),
                number(wait / rtt),
                number((wait - limit) / rtt)
            ),
            target: "-".into(),
            verdict: Verdict::Info,
        });
    }
    bench.report.add(Figure {
        id: format!("writer_starved.readers_{READERS}"),
        scenario: format!(
            "{scenario}: not acquired within {} s",
            WRITER_WAIT.as_secs()
        ),
        redlock: Some(starved as f64),
        rslock: None,
        unit: "",
        limit: "0".into(),
        ratio: format!(
            "of {} arrivals",
            seen.arrivals.len() + monitored.arrivals.len()
        ),
        target: "0".into(),
        verdict: Verdict::of(starved == 0),
    });
    bench.report.add(Figure {
        id: format!("readers_after_writer_queued.readers_{READERS}"),
        scenario: format!("{scenario}: readers let in after it queued (Redis, MONITOR)"),
        redlock: Some(order.barged as f64),
        rslock: None,
        unit: "",
        limit: "0".into(),
        ratio: format!(
            "{} writer acquisitions seen, {} after registering; {} reserved readers queued ahead",
            order.acquisitions, order.registered, order.reserved_ahead
        ),
        target: "0".into(),
        verdict: Verdict::of(
            order.barged == 0 && order.registered > 0 && monitored.violations == 0,
        ),
    });
    bench.report.note(format!(
        "writer wait: {READERS} reader tasks on {READER_CLIENTS} clients, read lock held {} µs (asked {} µs) back to back, \
         {} reader acquisitions; the writer (a client of its own) arrived {} times, {} ms apart, holding {} µs (asked); \
         wait minus the reader hold left at its arrival: p50 {} µs = {} RTT, max {} µs; the wait in two parts (p50 / max): \
         arrival to the last reader's release call {} / {} µs, then to the writer's acquisition {} / {} µs = {} RTT p50; \
         readers whose acquire returned between the writer's arrival and its acquisition: median {}, max {}, the last \
         {} / {} µs after the arrival (let in before the writer registered: the MONITOR pass counts in Redis); \
         reader wait p50 {} µs, p99 {} µs; writer and readers inside together: {}; RTT p50 {} µs. \
         MONITOR pass ({} arrivals, key {key}): registration to acquisition in Redis p50 {} µs",
        number(hold),
        HOLD.as_micros(),
        seen.holds.len(),
        seen.arrivals.len(),
        INTERVAL.as_millis(),
        HOLD.as_micros(),
        number(median(&excess)),
        number(median(&excess) / rtt),
        number(excess.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
        number(micros(quantile(&readers_done, 0.5))),
        number(micros(quantile(&readers_done, 1.0))),
        number(micros(quantile(&takeover, 0.5))),
        number(micros(quantile(&takeover, 1.0))),
        number(micros(quantile(&takeover, 0.5)) / rtt),
        number(median(&admitted)),
        number(admitted.iter().copied().fold(0.0, f64::max)),
        number(micros(quantile(&latest_admission, 0.5))),
        number(micros(quantile(&latest_admission, 1.0))),
        number(micros(quantile(&seen.reader_waits, 0.5))),
        number(micros(quantile(&seen.reader_waits, 0.99))),
        seen.violations + monitored.violations,
        number(rtt),
        monitored.arrivals.len(),
        number(median(&order.queued_for)),
    ));
}

/// The readers on `clients` (all but the last) take `key`'s read lock back to back
/// while the writer (the last client) arrives `arrivals` times.
async fn stream(clients: &[LockClient], key: &str, arrivals: usize) -> Stream {
    let readers_inside = Arc::new(AtomicUsize::new(0));
    let writer_inside = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = tokio::task::JoinSet::new();
    for task in 0..READERS {
        let client = clients[task % READER_CLIENTS].clone();
        let key = key.to_owned();
        let (inside, writer, violations, stop) = (
            readers_inside.clone(),
            writer_inside.clone(),
            violations.clone(),
            stop.clone(),
        );
        readers.spawn(async move {
            let (mut holds, mut waits) = (Vec::<Hold>::new(), Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let asked = Instant::now();
                let guard = client
                    .read_lock(key.as_str())
                    .wait(WAIT)
                    .lease(LEASE)
                    .acquire()
                    .await
                    .unwrap_or_else(|error| panic!("read acquire {key}: {error}"));
                let acquired = Instant::now();
                waits.push(acquired - asked);
                inside.fetch_add(1, Ordering::SeqCst);
                if writer.load(Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(HOLD).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                holds.push((acquired, Instant::now()));
                guard.release().await.expect("read release");
            }
            (holds, waits)
        });
    }
    // Let the stream settle before the first arrival.
    tokio::time::sleep(INTERVAL).await;
    let writer = &clients[READER_CLIENTS];
    let mut seen = Stream::default();
    for _ in 0..arrivals {
        tokio::time::sleep(INTERVAL).await;
        let arrived = Instant::now();
        match writer
            .write_lock(key)
            .wait(WRITER_WAIT)
            .lease(LEASE)
            .acquire()
            .await
        {
            Ok(guard) => {
                let acquired = Instant::now();
                writer_inside.store(true, Ordering::SeqCst);
                if readers_inside.load(Ordering::SeqCst) > 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(HOLD).await;
                writer_inside.store(false, Ordering::SeqCst);
                guard.release().await.expect("write release");
                seen.arrivals.push((arrived, Some(acquired)));
            }
            Err(LockError::Timeout { .. }) => seen.arrivals.push((arrived, None)),
            Err(error) => panic!("write acquire {key}: {error}"),
        }
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(done) = readers.join_next().await {
        let (holds, waits) = done.expect("reader task");
        seen.holds.extend(holds);
        seen.reader_waits.extend(waits);
    }
    seen.violations = violations.load(Ordering::SeqCst);
    seen
}

/// What Redis did on the key, in the order it did it (the commands the scripts ran).
#[derive(Debug, Default)]
struct ServerOrder {
    /// Writer acquisitions, and those that followed a registration on the waitlist
    /// (the others found the key free of readers).
    acquisitions: usize,
    registered: usize,
    /// Readers let in (`SET key shared:0`) between the writer's registration and its
    /// acquisition, other than one the key was reserved for.
    barged: usize,
    /// Readers let in on a reservation made for them in that interval: readers queued
    /// ahead of the writer, first in line (fair, not barging).
    reserved_ahead: usize,
    /// Registration to acquisition, µs, per writer acquisition that registered.
    queued_for: Vec<f64>,
}

impl ServerOrder {
    fn of(commands: &[Command], key: &str) -> Self {
        let waitlist = format!("redlock:waitlist:{key}");
        let mut order = ServerOrder::default();
        let mut registered_at: Option<f64> = None;
        let mut reserved_for_reader = false;
        for command in commands.iter().filter(|c| c.from_script) {
            let arg = |i: usize| command.args.get(i).map_or("", String::as_str);
            match command.name.as_str() {
                // `ZADD waitlist NX <ms> <id>`: readers' ids start with `r:`.
                "ZADD" if arg(0) == waitlist && !arg(3).starts_with("r:") => {
                    registered_at.get_or_insert(command.at);
                }
                "SET" if arg(0) == key => {
                    let value = arg(1);
                    if value.starts_with("reserved:") {
                        reserved_for_reader = value.starts_with("reserved:r:");
                    } else if value.starts_with("shared:") {
                        if registered_at.is_some() {
                            if reserved_for_reader {
                                order.reserved_ahead += 1;
                            } else {
                                order.barged += 1;
                            }
                        }
                        reserved_for_reader = false;
                    } else {
                        // The writer's lock.
                        order.acquisitions += 1;
                        if let Some(at) = registered_at.take() {
                            order.registered += 1;
                            order.queued_for.push((command.at - at) * 1e6);
                        }
                        reserved_for_reader = false;
                    }
                }
                _ => {}
            }
        }
        order
    }
}
