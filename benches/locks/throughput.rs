//! Throughput: many tasks cycling on distinct keys, redlock and rslock in alternating
//! rounds, against the ceiling redis-benchmark finds replaying the commands of a cycle.

use std::time::Duration;

use crate::context::Bench;
use crate::cost::{self, Cost, Nesting, Reading};
use crate::monitor::{Command, Monitor};
use crate::scenarios;
use crate::stats::{Figure, Verdict, median, number};
use crate::system;

/// Tasks of the throughput scenario, and how long each of its rounds lasts.
const TASKS: usize = 64;
const ROUND: Duration = Duration::from_millis(1500);

/// The commands of a cycle as each lock sends them, for redis-benchmark to replay.
#[derive(Debug)]
pub struct CycleCommands {
    /// redlock's acquire EVALSHA, on a random lock key and with a fixed owner.
    acquire: Vec<String>,
    /// redlock's release EVALSHA, the same way.
    release: Vec<String>,
    /// The hash of rslock's unlock script.
    rslock_unlock_sha: String,
    /// Which commands of a cycle run inside scripts, redlock's then rslock's (for the
    /// split of Redis's time in [`crate::cost`]).
    pub nesting: [Nesting; 2],
}

impl CycleCommands {
    /// Captures one cycle of each lock with MONITOR. Runs before any other cycle is
    /// measured, since it also loads the scripts.
    pub async fn capture(bench: &Bench) -> Self {
        let (redlock, rslock) = (&bench.redlock, &bench.rslock);
        // Load the scripts and learn their hashes (redis-benchmark sends the same EVALSHAs).
        let mut monitor = Monitor::start(bench.server.port(), &bench.url).await;
        for lock in [redlock, rslock] {
            scenarios::cycle_block(lock, &format!("bench:warm:{}", lock.name()), 1).await;
        }
        let (_, mut warm) = monitor
            .record(scenarios::cycle_block(redlock, "bench:warm:redlock", 1))
            .await;
        let (_, warm_rslock) = monitor
            .record(scenarios::cycle_block(rslock, "bench:warm:rslock", 1))
            .await;
        monitor.stop();
        let nesting = [Nesting::of(&warm), Nesting::of(&warm_rslock)];
        let rslock_unlock_sha = warm_rslock
            .iter()
            .find(|c| !c.from_script && c.name == "EVALSHA")
            .map(|c| c.args[0].clone())
            .expect("rslock's unlock EVALSHA");
        warm.retain(|c| !c.from_script);
        // One cycle sends the acquire script (on one server 3 keys: the lock, the fence
        // counter, the waitlist), then the release script (2 keys: the lock, the
        // waitlist): told apart by their order. redis-benchmark replays them as sent,
        // on a random lock key and with a fixed owner (so that some of its releases find
        // their own lock). The waitlist key stays the warm-up lock's, so a replayed
        // release that finds no lock of its own derives its companion keys (see
        // `scripts::companion_of`) from a mismatched pair: odd key names, the same work.
        let evalshas: Vec<&Command> = warm.iter().filter(|c| c.name == "EVALSHA").collect();
        let replay = |sent: Option<&&Command>| -> Vec<String> {
            let sent = sent.expect("the acquire and release EVALSHAs");
            let numkeys: usize = sent.args[1].parse().expect("EVALSHA's key count");
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
        assert!(
            evalshas.len() >= 2,
            "a cycle sends an acquire and a release EVALSHA"
        );
        CycleCommands {
            acquire: replay(evalshas.first()),
            release: replay(evalshas.last()),
            rslock_unlock_sha,
            nesting,
        }
    }
}

/// Rounds of each lock, then the redis-benchmark ceiling; one figure.
pub async fn run(bench: &mut Bench, sent: &CycleCommands) {
    bench.progress("throughput");
    let scale = bench.scale;
    let mut rounds = [Vec::new(), Vec::new()];
    let mut cpu = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    let mut costs = [Vec::new(), Vec::new()];
    for round in 0..3 {
        for (index, lock) in [&bench.redlock, &bench.rslock].into_iter().enumerate() {
            let tag = format!("r{round}");
            // The breakdown's readings enclose the figures' own (an INFO round trip and
            // a /proc read each side, nothing per cycle).
            let reading = Reading::before(&mut bench.ping).await;
            let (client_before, server_before) = (
                system::cpu_seconds(),
                redis_cpu_seconds(&mut bench.ping).await,
            );
            let duration = ROUND / scale as u32;
            let (counted, elapsed) =
                scenarios::throughput_counted(lock, TASKS, duration, &tag).await;
            let rate = counted as f64 / elapsed.as_secs_f64();
            let cycles = rate * duration.as_secs_f64();
            cpu[index]
                .0
                .push((system::cpu_seconds() - client_before) * 1e6 / cycles);
            cpu[index]
                .1
                .push((redis_cpu_seconds(&mut bench.ping).await - server_before) * 1e6 / cycles);
            rounds[index].push(rate);
            let after = Reading::after(&mut bench.ping).await;
            let rtt = crate::stats::quantile(
                &scenarios::ping_block(&mut bench.ping, 100 / scale).await,
                0.5,
            );
            costs[index].push(Cost::between(
                &reading,
                &after,
                counted,
                TASKS,
                elapsed,
                &sent.nesting[index],
                crate::stats::micros(rtt),
            ));
        }
    }
    let throughput = [median(&rounds[0]), median(&rounds[1])];
    bench.report.note(format!(
        "throughput, CPU per cycle (median of 3 rounds): redlock client {} µs + Redis {} µs; rslock client {} µs + Redis {} µs \
         (the client is this process: /proc/self/stat; Redis: INFO cpu used_cpu_user+sys)",
        number(median(&cpu[0].0)),
        number(median(&cpu[0].1)),
        number(median(&cpu[1].0)),
        number(median(&cpu[1].1)),
    ));
    let port = bench.server.port();
    let n = (60_000 / scale).to_string();
    let options_rb = ["-c", "64", "-P", "1", "-n", n.as_str(), "-r", "1000000"];
    let acquire_rps = system::redis_benchmark(
        port,
        &options_rb,
        &sent.acquire.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let release_rps = system::redis_benchmark(
        port,
        &options_rb,
        &sent.release.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let rslock_set_rps = system::redis_benchmark(
        port,
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
        port,
        &options_rb,
        &[
            "EVALSHA",
            &sent.rslock_unlock_sha,
            "1",
            "bench:rb2:__rand_int__",
            "benchowner",
        ],
    );
    // The replays leave up to 2 × n keys with a 10 s lease: deleted now, or their mass
    // expiry, 10 s later, lands on whichever scenario then runs (it showed as ~70 ms
    // stalls in the contention scenario's tail).
    let deleted = delete_matching(&mut bench.ping, "bench:rb*").await;
    bench.report.note(format!(
        "throughput limit: the {deleted} keys the redis-benchmark replays left were deleted"
    ));
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
            bench.report.note(format!(
                "throughput limit: redis-benchmark -c 64 -P 1 -n {n} -r 1000000 replaying redlock's acquire `{}` ({} req/s) \
                 and release `{}` ({} req/s); one cycle is one of each, so the ceiling is 1/(1/a + 1/r){theirs}",
                shown(&sent.acquire),
                number(*a),
                shown(&sent.release),
                number(*r)
            ));
            format!(
                "redis-benchmark {} cycles/s",
                number(1.0 / (1.0 / a + 1.0 / r))
            )
        }
        (a, r) => {
            bench
                .report
                .note(format!("redis-benchmark failed: {a:?} {r:?}"));
            "redis-benchmark failed".into()
        }
    };
    let vs = throughput[0] / throughput[1];
    bench.report.add(Figure {
        id: "throughput_64_tasks".into(),
        scenario: format!("throughput, {TASKS} tasks on distinct keys"),
        redlock: Some(throughput[0]),
        rslock: Some(throughput[1]),
        unit: "cycles/s",
        limit,
        ratio: format!("{} × rslock", number(vs)),
        target: "≥ 1.2 × rslock".into(),
        verdict: Verdict::of(vs >= 1.2),
    });
    cost::report(
        bench,
        &format!("throughput_{TASKS}_tasks"),
        &format!("throughput, {TASKS} tasks on distinct keys"),
        &[Cost::median(&costs[0]), Cost::median(&costs[1])],
        true,
    );
}

/// CPU seconds the Redis server has used (`INFO cpu`, user + system).
pub async fn redis_cpu_seconds(connection: &mut redis::aio::MultiplexedConnection) -> f64 {
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

/// Deletes every key matching `pattern` (SCAN + UNLINK); returns how many there were.
async fn delete_matching(
    connection: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
) -> usize {
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(connection)
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            let _: usize = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(connection)
                .await
                .expect("UNLINK");
            deleted += keys.len();
        }
        if next == 0 {
            return deleted;
        }
        cursor = next;
    }
}
