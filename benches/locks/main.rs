//! The benchmark of BENCHMARKS.md: every scenario against a redis-server of its own,
//! for redlock and for rslock, with the limit each is measured against taken in the
//! same run. Prints one Markdown table, a `BENCH {...}` line per figure, and writes
//! the handoff-latency plot.
//!
//! `cargo bench --bench locks [-- --svg PATH] [-- --quick]` (see `scripts/bench.sh`).

mod contenders;
mod monitor;
mod scenarios;
mod stats;
mod svg;
mod system;

use std::time::{Duration, Instant};

use contenders::Lock;
use monitor::Monitor;
use redlock_testkit::RedisServer;
use scenarios::{Contention, Stop};
use stats::{Figure, Report, Verdict, median, micros, number, quantile};

/// Options from the command line (cargo passes `--bench` too; it is ignored).
#[derive(Debug)]
struct Options {
    svg: String,
    quick: bool,
    current_thread: bool,
}

impl Options {
    fn parse() -> Self {
        let mut options = Options {
            svg: "benches/handoff-latency.svg".to_owned(),
            quick: false,
            current_thread: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--svg" => options.svg = args.next().expect("--svg needs a path"),
                "--quick" => options.quick = true,
                "--current-thread" => options.current_thread = true,
                _ => {}
            }
        }
        options
    }
}

/// Interleaved blocks of the uncontended scenario, and their length.
const BLOCKS: usize = 10;
const BLOCK_LEN: usize = 500;
/// Tasks of the throughput scenario, and how long each of its rounds lasts.
const THROUGHPUT_TASKS: usize = 64;
const THROUGHPUT_ROUND: Duration = Duration::from_millis(1500);
/// The hold of every contended scenario, as asked of `tokio::time::sleep`: its timer
/// wheel rounds up to the next millisecond, so the real hold (measured) is about 1 ms.
const HOLD: Duration = Duration::from_micros(500);
/// Acquisitions per task in the fairness scenario.
const PER_TASK: usize = 20;
/// Waiter counts of the handoff and round-trip scenarios.
const WAITERS: [usize; 4] = [2, 16, 64, 256];
/// Locks held in the watchdog scenario, and its renewal period.
const WATCHED: usize = 10_000;
const RENEW_EVERY: Duration = Duration::from_millis(500);

fn main() {
    let options = Options::parse();
    let mut builder = if options.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = builder
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    runtime.block_on(run(options));
}

async fn run(options: Options) {
    let began = Instant::now();
    let server = RedisServer::start();
    let url = server.url();
    let redis_version = server
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_default();
    let header = format!(
        "{} | {} | Redis {redis_version} on 127.0.0.1:{} | tokio {}",
        system::now(),
        system::machine(),
        server.port(),
        if options.current_thread {
            "current-thread runtime".to_owned()
        } else {
            format!(
                "multi-thread runtime, {} workers",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            )
        },
    );
    println!("# {header}");
    let mut report = Report::default();
    let scale = if options.quick { 4 } else { 1 };

    let redlock = Lock::redlock(&url).await;
    let rslock = Lock::rslock(&url);
    let mut ping = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect for PING");

    // Load the scripts and learn their hashes (redis-benchmark sends the same EVALSHAs).
    let mut monitor = Monitor::start(server.port(), &url).await;
    for lock in [&redlock, &rslock] {
        scenarios::cycle_block(lock, &format!("bench:warm:{}", lock.name()), 1).await;
    }
    let (_, mut warm) = monitor
        .record(scenarios::cycle_block(&redlock, "bench:warm:redlock", 1))
        .await;
    let (_, warm_rslock) = monitor
        .record(scenarios::cycle_block(&rslock, "bench:warm:rslock", 1))
        .await;
    monitor.stop();
    let rslock_unlock_sha = warm_rslock
        .iter()
        .find(|c| !c.from_script && c.name == "EVALSHA")
        .map(|c| c.args[0].clone())
        .expect("rslock's unlock EVALSHA");
    warm.retain(|c| !c.from_script);
    // One cycle sends the acquire script (5 keys: the lock, the fence counter, the
    // key's two waiter-queue keys and, on one server, the lock again in place of
    // RedLock's restart marker) and the release script (3 keys: the lock and the
    // queue keys). redis-benchmark replays them as sent, on a random lock
    // key and with a fixed owner (so that some of its releases find their own lock).
    let replay = |keys: &str| -> Vec<String> {
        let sent = warm
            .iter()
            .find(|c| {
                !c.from_script && c.name == "EVALSHA" && c.args.get(1).is_some_and(|n| n == keys)
            })
            .expect("the acquire and release EVALSHAs");
        let numkeys: usize = keys.parse().unwrap();
        let mut command = vec!["EVALSHA".to_owned()];
        for (index, arg) in sent.args.iter().enumerate() {
            command.push(match index {
                2 => "bench:rb:__rand_int__".to_owned(),
                i if i == 2 + numkeys => "benchowner".to_owned(),
                _ => arg.clone(),
            });
        }
        command
    };
    let acquire_command = replay("5");
    let release_command = replay("3");
    for lock in [&redlock, &rslock] {
        scenarios::cycle_block(lock, &format!("bench:warm:{}", lock.name()), 200 / scale).await;
    }

    // 1. Uncontended cycles, in blocks interleaved with PING blocks.
    eprintln!("[{:>5.1}s] uncontended", began.elapsed().as_secs_f64());
    let mut rtt_p50 = Vec::new();
    let mut p50 = [Vec::new(), Vec::new()];
    let mut ratio = [Vec::new(), Vec::new()];
    let mut parts = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for _ in 0..BLOCKS {
        let rtt = quantile(
            &scenarios::ping_block(&mut ping, BLOCK_LEN / scale).await,
            0.5,
        );
        rtt_p50.push(micros(rtt));
        for (index, lock) in [&redlock, &rslock].into_iter().enumerate() {
            let key = format!("bench:uncontended:{}", lock.name());
            let samples = scenarios::cycle_block(lock, &key, BLOCK_LEN / scale).await;
            let cycles: Vec<Duration> = samples.iter().map(|(a, r)| *a + *r).collect();
            let cycle = quantile(&cycles, 0.5);
            for (part, pick) in parts[index].iter_mut().zip([0, 1]) {
                let of: Vec<Duration> = samples
                    .iter()
                    .map(|s| if pick == 0 { s.0 } else { s.1 })
                    .collect();
                part.push(micros(quantile(&of, 0.5)) / micros(rtt));
            }
            p50[index].push(micros(cycle));
            ratio[index].push(micros(cycle) / micros(rtt));
        }
    }
    let rtt = median(&rtt_p50);
    let ratios = [median(&ratio[0]), median(&ratio[1])];
    // Where the time goes: the server's own time per cycle, from INFO commandstats.
    let mut server_time = Vec::new();
    for (lock, commands) in [
        (&redlock, &["evalsha"][..]),
        (&rslock, &["evalsha", "set"][..]),
    ] {
        let key = format!("bench:uncontended:{}", lock.name());
        let before = command_usec(&mut ping, commands).await;
        let n = BLOCK_LEN / scale;
        scenarios::cycle_block(lock, &key, n).await;
        let after = command_usec(&mut ping, commands).await;
        server_time.push((after - before) / n as f64);
    }
    let per_command = command_durations(&mut ping, &redlock, &rslock, 200 / scale).await;
    report.note(format!(
        "Redis's time per command, median from SLOWLOG with a 0 µs threshold: {per_command}"
    ));
    report.note(format!(
        "uncontended breakdown (median over blocks of p50 / block RTT p50): redlock acquire {} RTT + release {} RTT; \
         rslock acquire {} RTT + release {} RTT; Redis's own time per cycle (INFO commandstats usec): redlock {} µs, rslock {} µs",
        number(median(&parts[0][0])),
        number(median(&parts[0][1])),
        number(median(&parts[1][0])),
        number(median(&parts[1][1])),
        number(server_time[0]),
        number(server_time[1]),
    ));
    report.add(Figure {
        id: "uncontended_cycle_p50".into(),
        scenario: "uncontended acquire+release, 1 task, p50".into(),
        redlock: Some(median(&p50[0])),
        rslock: Some(median(&p50[1])),
        unit: "µs",
        limit: format!("RTT p50 {} µs", number(rtt)),
        ratio: format!(
            "{} RTT (rslock {} RTT)",
            number(ratios[0]),
            number(ratios[1])
        ),
        target: "≤ 2.2 RTT".into(),
        verdict: Verdict::of(ratios[0] <= 2.2),
    });
    report.note(format!(
        "uncontended: {BLOCKS} interleaved blocks of {} PINGs / redlock cycles / rslock cycles; \
         medians of the per-block p50s; the RTT ratio is the median of the per-block ratios; \
         block RTT p50s ranged {}–{} µs",
        BLOCK_LEN / scale,
        number(rtt_p50.iter().copied().fold(f64::INFINITY, f64::min)),
        number(rtt_p50.iter().copied().fold(0.0, f64::max)),
    ));

    // 2. Throughput on distinct keys, alternating rounds; the server's own ceiling.
    eprintln!("[{:>5.1}s] throughput", began.elapsed().as_secs_f64());
    let mut rounds = [Vec::new(), Vec::new()];
    let mut cpu = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    for round in 0..3 {
        for (index, lock) in [&redlock, &rslock].into_iter().enumerate() {
            let tag = format!("r{round}");
            let (client_before, server_before) =
                (system::cpu_seconds(), redis_cpu_seconds(&mut ping).await);
            let duration = THROUGHPUT_ROUND / scale as u32;
            let rate = scenarios::throughput(lock, THROUGHPUT_TASKS, duration, &tag).await;
            let cycles = rate * duration.as_secs_f64();
            cpu[index]
                .0
                .push((system::cpu_seconds() - client_before) * 1e6 / cycles);
            cpu[index]
                .1
                .push((redis_cpu_seconds(&mut ping).await - server_before) * 1e6 / cycles);
            rounds[index].push(rate);
        }
    }
    let throughput = [median(&rounds[0]), median(&rounds[1])];
    report.note(format!(
        "throughput, CPU per cycle (median of 3 rounds): redlock client {} µs + Redis {} µs; rslock client {} µs + Redis {} µs \
         (the client is this process: /proc/self/stat; Redis: INFO cpu used_cpu_user+sys)",
        number(median(&cpu[0].0)),
        number(median(&cpu[0].1)),
        number(median(&cpu[1].0)),
        number(median(&cpu[1].1)),
    ));
    let n = (60_000 / scale).to_string();
    let options_rb = ["-c", "64", "-P", "1", "-n", n.as_str(), "-r", "1000000"];
    let acquire_rps = system::redis_benchmark(
        server.port(),
        &options_rb,
        &acquire_command
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let release_rps = system::redis_benchmark(
        server.port(),
        &options_rb,
        &release_command
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let rslock_set_rps = system::redis_benchmark(
        server.port(),
        &options_rb,
        &[
            "SET",
            "bench:rb2:__rand_int__",
            "benchowner",
            "NX",
            "PX",
            "10000",
        ],
    );
    let rslock_unlock_rps = system::redis_benchmark(
        server.port(),
        &options_rb,
        &[
            "EVALSHA",
            &rslock_unlock_sha,
            "1",
            "bench:rb2:__rand_int__",
            "benchowner",
        ],
    );
    let limit = match (&acquire_rps, &release_rps) {
        (Ok(a), Ok(r)) => {
            let theirs = match (&rslock_set_rps, &rslock_unlock_rps) {
                (Ok(s), Ok(u)) => format!(
                    "; rslock's pair (SET NX PX {} req/s, unlock EVALSHA {} req/s) {} cycles/s",
                    number(*s),
                    number(*u),
                    number(1.0 / (1.0 / s + 1.0 / u))
                ),
                (s, u) => format!("; rslock's pair failed: {s:?} {u:?}"),
            };
            let shown = |command: &[String]| {
                let mut words = command.to_vec();
                words[1].truncate(8);
                words.join(" ")
            };
            report.note(format!(
                "throughput limit: redis-benchmark -c 64 -P 1 -n {n} -r 1000000 replaying redlock's acquire `{}` ({} req/s) \
                 and release `{}` ({} req/s); one cycle is one of each, so the ceiling is 1/(1/a + 1/r){theirs}",
                shown(&acquire_command),
                number(*a),
                shown(&release_command),
                number(*r)
            ));
            format!(
                "redis-benchmark {} cycles/s",
                number(1.0 / (1.0 / a + 1.0 / r))
            )
        }
        (a, r) => {
            report.note(format!("redis-benchmark failed: {a:?} {r:?}"));
            "redis-benchmark failed".into()
        }
    };
    let vs = throughput[0] / throughput[1];
    report.add(Figure {
        id: "throughput_64_tasks".into(),
        scenario: format!("throughput, {THROUGHPUT_TASKS} tasks on distinct keys"),
        redlock: Some(throughput[0]),
        rslock: Some(throughput[1]),
        unit: "cycles/s",
        limit,
        ratio: format!("{} × rslock", number(vs)),
        target: "≥ 1.2 × rslock".into(),
        verdict: Verdict::of(vs >= 1.2),
    });

    // 3. Contention: 16 and 64 tasks × 20 acquisitions of one key.
    let mut violations_total = [0usize, 0usize];
    for tasks in [16, 64] {
        eprintln!(
            "[{:>5.1}s] contention, {tasks} tasks",
            began.elapsed().as_secs_f64()
        );
        let mut runs = Vec::new();
        for lock in [&redlock, &rslock] {
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
        contention_figures(&mut report, tasks, "", &runs[0], &runs[1]);
        for (total, run) in violations_total.iter_mut().zip(&runs) {
            *total += run.violations;
        }
    }
    // The same with a client per task: how separate processes contend.
    let per_task_clients = async |tasks: usize| {
        let mut redlocks = Vec::new();
        let mut rslocks = Vec::new();
        for _ in 0..tasks {
            redlocks.push(Lock::redlock(&url).await);
            rslocks.push(Lock::rslock(&url));
        }
        (redlocks, rslocks)
    };
    for tasks in [16] {
        eprintln!(
            "[{:>5.1}s] contention, {tasks} clients",
            began.elapsed().as_secs_f64()
        );
        let (redlocks, rslocks) = per_task_clients(tasks).await;
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
        contention_figures(&mut report, tasks, ", a client per task", &a, &b);
        violations_total[0] += a.violations;
        violations_total[1] += b.violations;
    }

    // 4. Handoff latency against the number of waiters (one shared client each).
    let mut handoff_points: [Vec<(f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let mut rtts = Vec::new();
    for waiters in WAITERS {
        eprintln!(
            "[{:>5.1}s] handoff, {waiters} waiters",
            began.elapsed().as_secs_f64()
        );
        let total = handoff_total(waiters, scale);
        let rtt = micros(quantile(
            &scenarios::ping_block(&mut ping, BLOCK_LEN / scale).await,
            0.5,
        ));
        let idle_rtt = micros(quantile(
            &scenarios::idle_ping_block(&mut ping, 100 / scale, HOLD).await,
            0.5,
        ));
        rtts.push((waiters as f64, rtt));
        let mut runs = Vec::new();
        for lock in [&redlock, &rslock] {
            let key = format!("bench:handoff:{}:{waiters}", lock.name());
            runs.push(
                scenarios::contend(
                    std::slice::from_ref(lock),
                    &key,
                    waiters + 1,
                    Stop::Total(total),
                    HOLD,
                )
                .await,
            );
        }
        for (index, run) in runs.iter().enumerate() {
            violations_total[index] += run.violations;
            handoff_points[index].push((
                waiters as f64,
                micros(quantile(&run.handoffs, 0.5)),
                micros(quantile(&run.handoffs, 0.99)),
            ));
        }
        let (a, b) = (&runs[0], &runs[1]);
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            let mine = micros(quantile(&a.handoffs, q));
            let theirs = micros(quantile(&b.handoffs, q));
            report.add(Figure {
                id: format!("handoff_{name}.waiters_{waiters}"),
                scenario: format!("handoff latency {name}, {waiters} waiters"),
                redlock: Some(mine),
                rslock: Some(theirs),
                unit: "µs",
                limit: format!("RTT {} µs (idle {} µs)", number(rtt), number(idle_rtt)),
                ratio: format!(
                    "{} RTT ({} idle)",
                    number(mine / rtt),
                    number(mine / idle_rtt)
                ),
                target: if q == 0.5 {
                    "≤ 3 RTT".into()
                } else {
                    "-".into()
                },
                verdict: if q == 0.5 {
                    Verdict::of(mine <= 3.0 * rtt && a.violations == 0)
                } else {
                    Verdict::Info
                },
            });
        }
        report.note(format!(
            "handoff, {waiters} waiters: {} tasks until {total} acquisitions; release call p50 redlock {} µs, rslock {} µs; \
             handoffs to another task: redlock {}, rslock {}; re-acquired by the releasing task (barging): redlock {}, rslock {}",
            waiters + 1,
            number(micros(quantile(&a.releases, 0.5))),
            number(micros(quantile(&b.releases, 0.5))),
            a.handoffs.len(),
            b.handoffs.len(),
            a.reacquired_by_releaser,
            b.reacquired_by_releaser
        ));
    }

    // 5. Round trips per acquisition, counted with MONITOR in a separate pass.
    let mut monitor = Monitor::start(server.port(), &url).await;
    for waiters in WAITERS {
        eprintln!(
            "[{:>5.1}s] round trips, {waiters} waiters",
            began.elapsed().as_secs_f64()
        );
        let total = handoff_total(waiters, scale);
        let mut per_acquisition = Vec::new();
        let mut details = Vec::new();
        for lock in [&redlock, &rslock] {
            let key = format!("bench:rtt:{}:{waiters}", lock.name());
            let (run, commands) = monitor
                .record(scenarios::contend(
                    std::slice::from_ref(lock),
                    &key,
                    waiters + 1,
                    Stop::Total(total),
                    HOLD,
                ))
                .await;
            let counts = monitor::top_level(&commands);
            let top: usize = counts.values().sum();
            per_acquisition.push(top as f64 / run.acquisitions as f64);
            details.push(format!(
                "{}: {} acquisitions, {}",
                lock.name(),
                run.acquisitions,
                monitor::summary(&counts)
            ));
            violations_total[usize::from(lock.name() == "rslock")] += run.violations;
        }
        report.add(Figure {
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
        report.note(format!(
            "round trips, {waiters} waiters (top-level commands in the MONITOR window): {}",
            details.join("; ")
        ));
    }
    // The same with a client per task.
    for waiters in [16] {
        eprintln!(
            "[{:>5.1}s] round trips, {waiters} waiters, a client each",
            began.elapsed().as_secs_f64()
        );
        let total = handoff_total(waiters, scale);
        let (redlocks, rslocks) = per_task_clients(waiters + 1).await;
        let mut per_acquisition = Vec::new();
        let mut details = Vec::new();
        for locks in [&redlocks, &rslocks] {
            let name = locks[0].name();
            let key = format!("bench:rtt:{name}:{waiters}c");
            let (run, commands) = monitor
                .record(scenarios::contend(
                    locks,
                    &key,
                    waiters + 1,
                    Stop::Total(total),
                    HOLD,
                ))
                .await;
            let counts = monitor::top_level(&commands);
            let top: usize = counts.values().sum();
            per_acquisition.push(top as f64 / run.acquisitions as f64);
            details.push(format!(
                "{name}: {} acquisitions, {}",
                run.acquisitions,
                monitor::summary(&counts)
            ));
            violations_total[usize::from(name == "rslock")] += run.violations;
        }
        report.add(Figure {
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
        report.note(format!(
            "round trips, {waiters} waiters, a client per task: {}",
            details.join("; ")
        ));
    }

    monitor.stop();

    // 6. 10,000 locks in watchdog mode: renewal rounds per tick, memory per lock.
    eprintln!("[{:>5.1}s] watchdog", began.elapsed().as_secs_f64());
    watchdog(&mut report, &url, server.port(), rtt, scale).await;

    report.add(Figure {
        id: "mutual_exclusion_violations".into(),
        scenario: "mutual-exclusion violations, all contended runs".into(),
        redlock: Some(violations_total[0] as f64),
        rslock: Some(violations_total[1] as f64),
        unit: "",
        limit: "0".into(),
        ratio: "-".into(),
        target: "0".into(),
        verdict: Verdict::of(violations_total[0] == 0),
    });

    // The plot.
    let color = ["#1f77b4", "#d62728"];
    let mut series = Vec::new();
    for (index, name) in ["redlock", "rslock"].into_iter().enumerate() {
        for (dashed, label, pick) in [(false, "p50", 1), (true, "p99", 2)] {
            series.push(svg::Series {
                label: format!("{name} {label}"),
                color: color[index],
                dashed,
                points: handoff_points[index]
                    .iter()
                    .map(|p| (p.0, if pick == 1 { p.1 } else { p.2 }))
                    .collect(),
            });
        }
    }
    series.push(svg::Series {
        label: "PING RTT p50".into(),
        color: "#888888",
        dashed: true,
        points: rtts,
    });
    let plot = svg::handoff_plot(
        &format!("Handoff latency vs waiters — {}", system::now()),
        &series,
    );
    match std::fs::write(&options.svg, plot) {
        Ok(()) => report.note(format!("handoff plot written to {}", options.svg)),
        Err(error) => report.note(format!("could not write {}: {error}", options.svg)),
    }

    println!();
    println!("{header}");
    println!();
    print!("{}", report.table());
    println!();
    for note in &report.notes {
        println!("- {note}");
    }
    println!();
    println!("total run time {:.0} s", began.elapsed().as_secs_f64());
}

/// Total microseconds Redis spent in `commands` so far (`INFO commandstats`).
async fn command_usec(
    connection: &mut redis::aio::MultiplexedConnection,
    commands: &[&str],
) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            if !commands.contains(&name) {
                return None;
            }
            fields
                .split(',')
                .find_map(|field| field.strip_prefix("usec="))
                .and_then(|usec| usec.parse::<f64>().ok())
        })
        .sum()
}

/// How long Redis itself spends in each command of a cycle: every command goes to the
/// SLOWLOG (threshold 0) for `n` cycles of each lock; the median per command and script.
async fn command_durations(
    connection: &mut redis::aio::MultiplexedConnection,
    redlock: &Lock,
    rslock: &Lock,
    n: usize,
) -> String {
    async fn config(connection: &mut redis::aio::MultiplexedConnection, args: &[&str]) {
        let _: redis::Value = redis::cmd(args[0])
            .arg(&args[1..])
            .query_async(connection)
            .await
            .expect("SLOWLOG/CONFIG");
    }
    let mut parts = Vec::new();
    for lock in [redlock, rslock] {
        config(connection, &["CONFIG", "SET", "slowlog-max-len", "100000"]).await;
        config(
            connection,
            &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
        )
        .await;
        config(connection, &["SLOWLOG", "RESET"]).await;
        scenarios::cycle_block(lock, &format!("bench:slowlog:{}", lock.name()), n).await;
        config(
            connection,
            &["CONFIG", "SET", "slowlog-log-slower-than", "10000"],
        )
        .await;
        let entries: redis::Value = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(-1)
            .query_async(connection)
            .await
            .expect("SLOWLOG GET");
        config(connection, &["SLOWLOG", "RESET"]).await;
        let mut by_command: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            redis::Value::SimpleString(s) => s.clone(),
            other => format!("{other:?}"),
        };
        if let redis::Value::Array(entries) = entries {
            for entry in entries {
                let redis::Value::Array(fields) = entry else {
                    continue;
                };
                let (Some(redis::Value::Int(micros)), Some(redis::Value::Array(args))) =
                    (fields.get(2), fields.get(3))
                else {
                    continue;
                };
                let name = args
                    .first()
                    .map(text)
                    .unwrap_or_default()
                    .to_ascii_uppercase();
                if name == "CONFIG" || name == "SLOWLOG" {
                    continue;
                }
                // EVALSHA <sha> <numkeys>: tell the scripts apart by key and argument count.
                let label = if name == "EVALSHA" {
                    let keys = args.get(2).map(text).unwrap_or_default();
                    format!("EVALSHA({keys} keys, {} args)", args.len() - 3)
                } else {
                    name
                };
                by_command.entry(label).or_default().push(*micros as f64);
            }
        }
        parts.push(format!(
            "{}: {}",
            lock.name(),
            by_command
                .iter()
                .map(|(name, times)| format!(
                    "{name} {} µs (×{})",
                    number(median(times)),
                    times.len()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    parts.join("; ")
}

/// CPU seconds the Redis server has used (`INFO cpu`, user + system).
async fn redis_cpu_seconds(connection: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(connection)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys")
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

/// A field of `INFO stats`.
async fn server_stat(connection: &mut redis::aio::MultiplexedConnection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(connection)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|line| {
            line.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
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

/// Acquisitions of a handoff run: enough for every waiter to hold the lock twice.
fn handoff_total(waiters: usize, scale: usize) -> usize {
    (200 / scale).max(2 * (waiters + 1))
}

fn contention_figures(
    report: &mut Report,
    tasks: usize,
    suffix: &str,
    a: &Contention,
    b: &Contention,
) {
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

async fn watchdog(report: &mut Report, url: &str, port: u16, rtt: f64, scale: usize) {
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
