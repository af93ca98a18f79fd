//! Where the time of a cycle goes, for one lock and one block of cycles: Redis's own
//! time (`INFO commandstats`, split by command and script), this process's CPU time
//! (user + system, `CLOCK_PROCESS_CPUTIME_ID`), and the remainder (network and
//! scheduling), read as counter deltas around the block.
//!
//! Redis 7 counts a command a script runs under its own name *and* inside the script's
//! `EVALSHA`, whose time includes it. Which commands of a lock's cycle run inside its
//! scripts is learnt once, from one cycle under MONITOR ([`Nesting`]); a script's own
//! overhead is then its `EVALSHA` time less the commands nested in it, and Redis's time
//! per cycle is the sum of the top-level commands (each script counted once).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::context::Bench;
use crate::monitor::Command;
use crate::stats::{Figure, Verdict, median, number};

/// The commands that run a script: their time includes the commands nested in them.
const SCRIPTS: [&str; 5] = ["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"];
/// A figure of the breakdown: its id under `cost.<scenario>.`, what it is, how it is
/// read from a [`Cost`], its unit.
type BreakdownFigure = (&'static str, &'static str, fn(&Cost) -> f64, &'static str);

/// The figures [`report`] gives rows of (their `BENCH` lines are the rows').
const ROW_KEYS: [&str; 3] = ["redis_us", "client_cpu_us", "remainder_us"];
/// What the benchmark itself sends around a block (the readings): not the lock's.
const OURS: [&str; 1] = ["info"];

/// How a lock's cycle sends each command, by lower-case name: how many times at top
/// level and how many times from a script, in one cycle recorded under MONITOR.
#[derive(Debug, Default, Clone)]
pub struct Nesting {
    top: BTreeMap<String, usize>,
    nested: BTreeMap<String, usize>,
}

impl Nesting {
    pub fn of(commands: &[Command]) -> Self {
        let mut nesting = Nesting::default();
        for command in commands {
            let counts = if command.from_script {
                &mut nesting.nested
            } else {
                &mut nesting.top
            };
            *counts.entry(command.name.to_ascii_lowercase()).or_default() += 1;
        }
        nesting
    }

    /// The share of `name`'s calls that scripts make: 0 for a command the recorded
    /// cycle did not send (e.g. a background task's), which is then counted top-level.
    fn nested_share(&self, name: &str) -> f64 {
        let nested = self.nested.get(name).copied().unwrap_or(0) as f64;
        let top = self.top.get(name).copied().unwrap_or(0) as f64;
        if nested == 0.0 {
            0.0
        } else {
            nested / (nested + top)
        }
    }

    /// `SET 1, EVALSHA 1 (in scripts: GET 1, DEL 1)`, for the notes.
    pub fn summary(&self) -> String {
        let list = |counts: &BTreeMap<String, usize>| {
            counts
                .iter()
                .map(|(name, n)| format!("{} {n}", name.to_ascii_uppercase()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("{} (in scripts: {})", list(&self.top), list(&self.nested))
    }
}

/// This process's CPU time so far, user + system, every thread (live or ended), in
/// nanoseconds' resolution.
pub fn process_cpu() -> Duration {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// The counters at one moment: this process's CPU time, Redis's per-command calls and
/// microseconds (`INFO commandstats`) and its CPU time (`INFO cpu`).
#[derive(Debug, Clone)]
pub struct Reading {
    cpu: Duration,
    /// This process's user and system time in clock ticks (`/proc/self/stat`): too
    /// coarse for the total, enough for its split.
    ticks: (u64, u64),
    /// Name (lower case, `config|set` for subcommands) → (calls, usec).
    commands: BTreeMap<String, (u64, u64)>,
    redis_cpu: f64,
}

impl Reading {
    /// Before a block: Redis's counters first, then the process's clock, so that
    /// reading INFO is left out of the block's CPU time.
    pub async fn before(connection: &mut redis::aio::MultiplexedConnection) -> Self {
        let (commands, redis_cpu) = redis_counters(connection).await;
        Reading {
            cpu: process_cpu(),
            ticks: user_system_ticks(),
            commands,
            redis_cpu,
        }
    }

    /// After a block: the process's clock first, then Redis's counters.
    pub async fn after(connection: &mut redis::aio::MultiplexedConnection) -> Self {
        let cpu = process_cpu();
        let ticks = user_system_ticks();
        let (commands, redis_cpu) = redis_counters(connection).await;
        Reading {
            cpu,
            ticks,
            commands,
            redis_cpu,
        }
    }
}

/// utime and stime of `/proc/self/stat` (the 14th and 15th fields), in clock ticks.
fn user_system_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let mut fields = rest.split_whitespace().skip(11);
    let mut next = || fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// `INFO commandstats` and `INFO cpu` in one round trip (two commands, so that Redis
/// before 7, whose INFO takes one section, reads them too).
pub async fn redis_counters(
    connection: &mut redis::aio::MultiplexedConnection,
) -> (BTreeMap<String, (u64, u64)>, f64) {
    let (stats, cpu): (String, String) = redis::pipe()
        .cmd("INFO")
        .arg("commandstats")
        .cmd("INFO")
        .arg("cpu")
        .query_async(connection)
        .await
        .expect("INFO commandstats, INFO cpu");
    let commands = stats
        .lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
        })
        .collect();
    let redis_cpu = cpu
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys")
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum();
    (commands, redis_cpu)
}

/// One block's (or round's) cost per cycle of one lock, in µs.
#[derive(Debug, Clone, Default)]
pub struct Cost {
    pub tasks: usize,
    pub cycles: f64,
    /// Elapsed time over cycles: the inverse of the throughput.
    pub wall: f64,
    /// Tasks × elapsed over cycles: how long one task's cycle took (the wall time of a
    /// cycle; the same as `wall` with one task).
    pub cycle: f64,
    /// This process's CPU time (user + system, every thread).
    pub client: f64,
    /// This process's user and system clock ticks over the block(s): their split is the
    /// system (kernel) share of `client` (ticks are too coarse for the total).
    pub client_ticks: (f64, f64),
    /// Redis's time in the lock's commands (`INFO commandstats` usec of the top-level
    /// commands; a script's includes the commands it runs).
    pub redis: f64,
    /// Redis's process CPU (`INFO cpu`, user + system): its commands plus its event
    /// loop, reading and writing the sockets.
    pub redis_process: f64,
    /// `cycle − redis − client`: network and scheduling (and, with more than one task,
    /// waiting behind the other tasks).
    pub remainder: f64,
    /// The remainder in PING round trips (the RTT measured next to the block).
    pub remainder_rtt: f64,
    pub rtt: f64,
    /// The split of `redis`: item → (µs per cycle, calls per cycle). Items are
    /// `EVALSHA own` (the scripts less what they run), `SET in scripts`, `SET`.
    pub items: BTreeMap<String, (f64, f64)>,
}

impl Cost {
    /// The cost of `cycles` cycles run by `tasks` tasks in `elapsed`, between two readings.
    pub fn between(
        before: &Reading,
        after: &Reading,
        cycles: usize,
        tasks: usize,
        elapsed: Duration,
        nesting: &Nesting,
        rtt: f64,
    ) -> Self {
        let n = cycles.max(1) as f64;
        let mut items: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let mut scripts = Vec::new();
        let (mut script_usec, mut script_calls, mut nested_usec) = (0.0, 0.0, 0.0);
        let mut total = 0.0;
        for (name, &(calls, usec)) in &after.commands {
            if OURS.contains(&name.as_str()) {
                continue;
            }
            let (calls0, usec0) = before.commands.get(name).copied().unwrap_or((0, 0));
            let (calls, usec) = (
                calls.saturating_sub(calls0) as f64,
                usec.saturating_sub(usec0) as f64,
            );
            if calls == 0.0 {
                continue;
            }
            if SCRIPTS.contains(&name.as_str()) {
                scripts.push(name.to_ascii_uppercase());
                script_usec += usec;
                script_calls += calls;
                total += usec;
                continue;
            }
            let share = nesting.nested_share(name);
            let label = name.to_ascii_uppercase();
            if share > 0.0 {
                nested_usec += usec * share;
                items.insert(
                    format!("{label} in scripts"),
                    (usec * share / n, calls * share / n),
                );
            }
            if share < 1.0 {
                total += usec * (1.0 - share);
                items.insert(label, (usec * (1.0 - share) / n, calls * (1.0 - share) / n));
            }
        }
        if !scripts.is_empty() {
            items.insert(
                format!("{} own", scripts.join("+")),
                ((script_usec - nested_usec) / n, script_calls / n),
            );
        }
        let micros = |d: Duration| d.as_secs_f64() * 1e6;
        let wall = micros(elapsed) / n;
        let cycle = wall * tasks as f64;
        let redis = total / n;
        let client = micros(after.cpu.saturating_sub(before.cpu)) / n;
        let remainder = cycle - redis - client;
        let (user, system) = (
            after.ticks.0.saturating_sub(before.ticks.0) as f64,
            after.ticks.1.saturating_sub(before.ticks.1) as f64,
        );
        Cost {
            tasks,
            cycles: n,
            wall,
            cycle,
            client,
            client_ticks: (user, system),
            redis,
            redis_process: (after.redis_cpu - before.redis_cpu) * 1e6 / n,
            remainder,
            remainder_rtt: remainder / rtt,
            rtt,
            items,
        }
    }

    /// The median of each figure over blocks or rounds (an item missing from a block
    /// counts as 0 there).
    pub fn median(costs: &[Cost]) -> Cost {
        let of = |pick: fn(&Cost) -> f64| median(&costs.iter().map(pick).collect::<Vec<_>>());
        let mut items = BTreeMap::new();
        for name in costs.iter().flat_map(|c| c.items.keys()) {
            if items.contains_key(name) {
                continue;
            }
            let pick = |i: usize| {
                median(
                    &costs
                        .iter()
                        .map(|c| c.items.get(name).map_or(0.0, |item| [item.0, item.1][i]))
                        .collect::<Vec<_>>(),
                )
            };
            items.insert(name.clone(), (pick(0), pick(1)));
        }
        Cost {
            tasks: costs.first().map_or(1, |c| c.tasks),
            cycles: costs.iter().map(|c| c.cycles).sum(),
            wall: of(|c| c.wall),
            cycle: of(|c| c.cycle),
            client: of(|c| c.client),
            client_ticks: (
                costs.iter().map(|c| c.client_ticks.0).sum(),
                costs.iter().map(|c| c.client_ticks.1).sum(),
            ),
            redis: of(|c| c.redis),
            redis_process: of(|c| c.redis_process),
            remainder: of(|c| c.remainder),
            remainder_rtt: of(|c| c.remainder_rtt),
            rtt: of(|c| c.rtt),
            items,
        }
    }

    /// `top level [EVALSHA own 29.1 µs ×2]; in scripts [DEL 0.68 µs ×1, …]`.
    pub fn split(&self) -> String {
        let part = |nested: bool| {
            self.items
                .iter()
                .filter(|(name, _)| name.ends_with(" in scripts") == nested)
                .map(|(name, (usec, calls))| {
                    format!(
                        "{} {} µs ×{}",
                        name.trim_end_matches(" in scripts"),
                        number(*usec),
                        number(*calls)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!("top level [{}]; in scripts [{}]", part(false), part(true))
    }

    /// The system (kernel) share of the client CPU time, from every tick of the blocks
    /// (NaN when none fell).
    pub fn client_sys_share(&self) -> f64 {
        self.client_ticks.1 / (self.client_ticks.0 + self.client_ticks.1)
    }

    /// Cores kept busy: Redis's process CPU and this process's over the elapsed time.
    pub fn busy_cores(&self) -> f64 {
        (self.redis_process + self.client) / self.wall
    }

    /// `cycle 190 µs = Redis 37.1 + client CPU 25.2 + remainder 128 (2.31 RTT)`, and
    /// with more than one task the elapsed time per cycle and the cores kept busy.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "cycle {} µs = Redis {} + client CPU {} (system {} %) + remainder {} ({} RTT)",
            number(self.cycle),
            number(self.redis),
            number(self.client),
            number(self.client_sys_share() * 100.0),
            number(self.remainder),
            number(self.remainder_rtt),
        );
        if self.tasks > 1 {
            text.push_str(&format!(
                " (a task's cycle: {} tasks × elapsed/cycles {} µs; cores busy {})",
                self.tasks,
                number(self.wall),
                number(self.busy_cores()),
            ));
        }
        text
    }
}

/// How the breakdown is taken: said in the first breakdown's note only.
const HOW: &str = "(Redis: INFO commandstats usec deltas over the cycles; a script's own time is its \
    EVALSHA usec less the commands it runs. Client CPU: this process's user+sys time \
    (CLOCK_PROCESS_CPUTIME_ID) over each lock's own blocks, which includes the other lock's idle \
    background tasks; its system share from /proc/self/stat ticks. On loopback most of the network is \
    CPU time, the kernel's TCP path charged as system time to the process that sends, so the remainder \
    is mostly waiting for wake-ups. Per-cycle figures are means over a block's or round's cycles, then \
    medians over blocks or rounds.)";
static EXPLAINED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A figure for scripts only: its `BENCH` line, no row in the table.
fn detail(bench: &mut Bench, id: String, scenario: String, values: [f64; 2], unit: &'static str) {
    bench.report.detail(Figure {
        id,
        scenario,
        redlock: Some(values[0]),
        rslock: Some(values[1]),
        unit,
        limit: "-".into(),
        ratio: if values[1] > 0.0 {
            format!("{} × rslock", number(values[0] / values[1]))
        } else {
            "-".into()
        },
        target: "-".into(),
        verdict: Verdict::Info,
    });
}

/// Reports `costs` (redlock's, rslock's) of the scenario `label`: a note with the
/// breakdown and the split of Redis's time, a `BENCH` line per figure and per item of
/// the split (ids under `cost.<id>.`), and, with `rows`, three rows of the table: Redis
/// time, client CPU and remainder per cycle.
pub fn report(bench: &mut Bench, id: &str, label: &str, costs: &[Cost; 2], rows: bool) {
    let [ours, theirs] = costs;
    let how = if EXPLAINED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        String::new()
    } else {
        format!(" {HOW}")
    };
    bench.report.note(format!(
        "{label}, per cycle: redlock {}; Redis {}; Redis process CPU (INFO cpu: commands, event loop, socket I/O) {} µs. \
         rslock {}; Redis {}; Redis process CPU {} µs; RTT p50 {} µs.{how}",
        ours.summary(),
        ours.split(),
        number(ours.redis_process),
        theirs.summary(),
        theirs.split(),
        number(theirs.redis_process),
        number(ours.rtt),
    ));
    let figures: [BreakdownFigure; 10] = [
        ("cycle_us", "wall time per cycle", |c| c.cycle, "µs"),
        ("wall_per_cycle_us", "elapsed / cycles", |c| c.wall, "µs"),
        ("redis_us", "Redis time per cycle", |c| c.redis, "µs"),
        ("client_cpu_us", "client CPU per cycle", |c| c.client, "µs"),
        (
            "client_system_share",
            "system share of the client CPU",
            Cost::client_sys_share,
            "",
        ),
        ("remainder_us", "remainder per cycle", |c| c.remainder, "µs"),
        (
            "remainder_rtt",
            "remainder per cycle",
            |c| c.remainder_rtt,
            "RTT",
        ),
        (
            "redis_process_cpu_us",
            "Redis process CPU per cycle",
            |c| c.redis_process,
            "µs",
        ),
        ("cycles", "cycles measured", |c| c.cycles, ""),
        (
            "busy_cores",
            "cores busy (Redis + client CPU / elapsed)",
            Cost::busy_cores,
            "",
        ),
    ];
    for (key, what, pick, unit) in figures {
        if rows && ROW_KEYS.contains(&key) {
            continue; // the row's own BENCH line has it
        }
        detail(
            bench,
            format!("cost.{id}.{key}"),
            format!("{label}: {what}"),
            [pick(ours), pick(theirs)],
            unit,
        );
    }
    let names: std::collections::BTreeSet<&String> =
        ours.items.keys().chain(theirs.items.keys()).collect();
    for name in names {
        let get = |c: &Cost, i: usize| c.items.get(name).map_or(0.0, |item| [item.0, item.1][i]);
        let slug = name.to_ascii_lowercase().replace([' ', '+', '|'], "_");
        detail(
            bench,
            format!("cost.{id}.redis.{slug}_us"),
            format!("{label}: Redis time per cycle in {name}"),
            [get(ours, 0), get(theirs, 0)],
            "µs",
        );
        detail(
            bench,
            format!("cost.{id}.redis.{slug}_calls"),
            format!("{label}: calls per cycle of {name}"),
            [get(ours, 1), get(theirs, 1)],
            "",
        );
    }
    if !rows {
        return;
    }
    let redis_vs = ours.redis / theirs.redis;
    bench.report.add(Figure {
        id: format!("cost.{id}.redis_us"),
        scenario: format!("{label}: Redis time per cycle (INFO commandstats)"),
        redlock: Some(ours.redis),
        rslock: Some(theirs.redis),
        unit: "µs",
        limit: format!("1.3 × rslock = {} µs", number(1.3 * theirs.redis)),
        ratio: format!("{} × rslock", number(redis_vs)),
        target: "≤ 1.3 × rslock".into(),
        verdict: Verdict::of(redis_vs <= 1.3),
    });
    let client_vs = ours.client / theirs.client;
    bench.report.add(Figure {
        id: format!("cost.{id}.client_cpu_us"),
        scenario: format!("{label}: client CPU per cycle (user+sys)"),
        redlock: Some(ours.client),
        rslock: Some(theirs.client),
        unit: "µs",
        limit: format!(
            "rslock {} µs; system time {} % (rslock {} %)",
            number(theirs.client),
            number(ours.client_sys_share() * 100.0),
            number(theirs.client_sys_share() * 100.0),
        ),
        ratio: format!("{} × rslock", number(client_vs)),
        target: "≤ rslock".into(),
        verdict: Verdict::of(client_vs <= 1.0),
    });
    bench.report.add(Figure {
        id: format!("cost.{id}.remainder_us"),
        scenario: format!(
            "{label}: remainder per cycle (network + scheduling{})",
            if ours.tasks > 1 {
                " + waiting behind the other tasks"
            } else {
                ""
            }
        ),
        redlock: Some(ours.remainder),
        rslock: Some(theirs.remainder),
        unit: "µs",
        limit: if ours.tasks > 1 {
            format!(
                "RTT p50 {} µs; elapsed/cycles {} µs (rslock {}), cores busy {} ({})",
                number(ours.rtt),
                number(ours.wall),
                number(theirs.wall),
                number(ours.busy_cores()),
                number(theirs.busy_cores()),
            )
        } else {
            format!("RTT p50 {} µs", number(ours.rtt))
        },
        ratio: format!(
            "{} RTT (rslock {} RTT)",
            number(ours.remainder_rtt),
            number(theirs.remainder_rtt)
        ),
        target: "-".into(),
        verdict: Verdict::Info,
    });
}
