//! Locks in watchdog mode: how many round trips a renewal tick takes (one pipeline,
//! not one per lock) and how much client memory each held lock costs.

use std::time::Duration;

use crate::context::Bench;
use crate::monitor::Monitor;
use crate::stats::{Figure, Verdict, median, number};
use crate::system;

/// Locks held, and their renewal period.
const WATCHED: usize = 10_000;
const RENEW_EVERY: Duration = Duration::from_millis(500);

/// Three rows and a note; `rtt` (µs) prices the sequential round trips the pipeline
/// saves.
pub async fn run(bench: &mut Bench, rtt: f64) {
    bench.progress("watchdog");
    let (url, port, scale) = (bench.url.as_str(), bench.server.port(), bench.scale);
    let report = &mut bench.report;
    let locks = WATCHED / scale;
    let mut info = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect for INFO");
    let client = redlock_runtime::LockClient::builder(url)
        .renew_every(RENEW_EVERY)
        .connect()
        .await
        .expect("connect the watchdog client");
    // Warm up: start the watchdog task and load the scripts before measuring memory.
    for _ in 0..2 {
        let guard = client
            .lock("bench:watchdog:warm")
            .acquire()
            .await
            .expect("warm-up");
        guard.release().await.expect("warm-up release");
    }
    let before = system::rss_bytes();
    let mut guards = Vec::with_capacity(locks);
    for chunk in (0..locks).collect::<Vec<_>>().chunks(500) {
        let mut set = tokio::task::JoinSet::new();
        for &index in chunk {
            let client = client.clone();
            set.spawn(async move {
                client
                    .lock(format!("bench:watchdog:{index}"))
                    .acquire()
                    .await
                    .expect("watchdog acquire")
            });
        }
        while let Some(guard) = set.join_next().await {
            guards.push(guard.expect("watchdog task"));
        }
    }
    let after = system::rss_bytes();
    assert_eq!(
        client.watched_locks(),
        locks,
        "every lock is in watchdog renewal"
    );
    // Memory in steady state: after a few renewals, before MONITOR (whose reader thread
    // lives in this process) is attached.
    let mut trend = Vec::new();
    for _ in 0..4 {
        tokio::time::sleep(RENEW_EVERY * 2).await;
        trend.push(system::rss_bytes());
    }
    let after_ticks = *trend.iter().max().unwrap_or(&after);
    // Socket reads Redis made while only the watchdog talks to it: a pipeline of N
    // commands arrives in a few 16 KiB reads, N separate round trips in N reads.
    let reads_before = server_stat(&mut info, "total_reads_processed").await;
    let calls_before = command_calls(&mut info, "evalsha").await;
    tokio::time::sleep(RENEW_EVERY * 4).await;
    let reads = server_stat(&mut info, "total_reads_processed").await - reads_before;
    let calls = command_calls(&mut info, "evalsha").await - calls_before;
    let window = RENEW_EVERY * 4;
    let mut monitor = Monitor::start(port, url).await;
    let (_, commands) = monitor.record(tokio::time::sleep(window)).await;
    monitor.stop();
    let renewals: Vec<_> = commands
        .iter()
        .filter(|c| !c.from_script && c.name == "EVALSHA")
        .collect();
    let others = commands.iter().filter(|c| !c.from_script).count() - renewals.len();
    // A tick's renewals reach Redis back to back; ticks are RENEW_EVERY apart.
    let mut bursts: Vec<(f64, f64, usize)> = Vec::new();
    for command in &renewals {
        match bursts.last_mut() {
            Some((_, last, count)) if command.at - *last < 0.1 => {
                *last = command.at;
                *count += 1;
            }
            _ => bursts.push((command.at, command.at, 1)),
        }
    }
    let ticks = (window.as_secs_f64() / RENEW_EVERY.as_secs_f64()).round();
    let first = bursts.first().map_or(0.0, |b| b.0);
    let starts: Vec<String> = bursts.iter().map(|b| number((b.0 - first) * 1e3)).collect();
    let sizes: Vec<f64> = bursts.iter().map(|b| b.2 as f64).collect();
    let spans: Vec<f64> = bursts.iter().map(|b| (b.1 - b.0) * 1e3).collect();
    let calls_per_tick = median(&sizes);
    let rounds_per_tick = bursts.len() as f64 / ticks;
    report.add(Figure {
        id: "watchdog_renewal_calls_per_tick".into(),
        scenario: format!("{locks} watchdog locks: renewal commands per tick"),
        redlock: Some(calls_per_tick),
        rslock: None,
        unit: "EVALSHA",
        limit: format!("{locks} (one per lock)"),
        ratio: "-".into(),
        target: "-".into(),
        verdict: Verdict::Info,
    });
    report.add(Figure {
        id: "watchdog_rounds_per_tick".into(),
        scenario: format!("{locks} watchdog locks: renewal round trips per tick"),
        redlock: Some(rounds_per_tick),
        rslock: None,
        unit: "",
        limit: "1 pipelined round".into(),
        ratio: format!(
            "{} socket reads per tick for {} calls",
            number(reads as f64 / 4.0),
            number(calls as f64 / 4.0)
        ),
        target: "1".into(),
        verdict: Verdict::of(
            (rounds_per_tick - 1.0).abs() < 0.01 && calls_per_tick as usize == locks,
        ),
    });
    let per_lock = after.saturating_sub(before) as f64 / locks as f64;
    let per_lock_ticks = after_ticks.saturating_sub(before) as f64 / locks as f64;
    report.add(Figure {
        id: "watchdog_rss_per_lock".into(),
        scenario: format!("{locks} watchdog locks: client RSS per held lock"),
        redlock: Some(per_lock.max(per_lock_ticks)),
        rslock: None,
        unit: "B",
        limit: "-".into(),
        ratio: format!("{} KiB", number(per_lock.max(per_lock_ticks) / 1024.0)),
        target: "≤ 2 KiB".into(),
        verdict: Verdict::of(per_lock.max(per_lock_ticks) <= 2048.0),
    });
    report.note(format!(
        "watchdog: renew_every {} ms, MONITOR window {} ms = {ticks} ticks; {} renewal bursts of {:?} EVALSHAs, \
         starting at {starts:?} ms, server-side spans {:?} ms under MONITOR ({locks} sequential round trips would take ≥ {} ms at RTT {} µs); \
         {others} other top-level commands; without MONITOR, over 4 ticks: {calls} EVALSHA calls arrived in {reads} socket reads \
         (INFO stats total_reads_processed, incl. the 2 INFO calls); \
         RSS {} MiB before, {} MiB after acquiring ({} B/lock), then every 2 ticks {:?} MiB; highest {} B/lock",
        RENEW_EVERY.as_millis(),
        window.as_millis(),
        bursts.len(),
        sizes.iter().map(|s| *s as usize).collect::<Vec<_>>(),
        spans.iter().map(|s| number(*s)).collect::<Vec<_>>(),
        number(locks as f64 * rtt / 1000.0),
        number(rtt),
        number(before as f64 / 1048576.0),
        number(after as f64 / 1048576.0),
        number(per_lock),
        trend.iter().map(|b| number(*b as f64 / 1048576.0)).collect::<Vec<_>>(),
        number(per_lock_ticks),
    ));
    let mut set = tokio::task::JoinSet::new();
    for guard in guards {
        set.spawn(guard.release());
    }
    while set.join_next().await.is_some() {}
}

/// A field of `INFO stats`.
async fn server_stat(connection: &mut redis::aio::MultiplexedConnection, field: &str) -> u64 {
    crate::redis_time::info_field(connection, "stats", field).await as u64
}

/// Calls of `command` so far (`INFO commandstats`).
async fn command_calls(connection: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    info.lines()
        .find_map(|line| {
            let fields = line
                .strip_prefix("cmdstat_")?
                .strip_prefix(command)?
                .strip_prefix(':')?;
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}
