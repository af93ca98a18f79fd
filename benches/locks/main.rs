//! The benchmark of BENCHMARKS.md: every scenario against a redis-server of its own,
//! for redlock and for rslock, with the limit each is measured against taken in the
//! same run. Prints one Markdown table, a `BENCH {...}` line per figure, and writes
//! the handoff-latency plot.
//!
//! `cargo bench --bench locks [-- --svg PATH] [-- --quick] [-- --only NAME,NAME]`
//! (see `scripts/bench.sh`); `-- --profile SECONDS` runs only redlock's uncontended
//! cycles, for a profiler (see `scripts/profile.sh`); `-- --trace-handoff` splits a
//! hand-off's time into its steps (see `handoff_trace`); `-- --distributed-holds N`
//! sets the holds per process of the distributed scenario, `-- --multi-key-transfers N`
//! the transfers per process of the multi-key one. Run with
//! `REDLOCK_BENCH_DISTRIBUTED_CHILD` (or `REDLOCK_BENCH_MULTI_KEY_CHILD`) set, the binary
//! is one of that scenario's child processes instead (see `distributed`, `multi_key`).
//!
//! Each scenario is a module of its own; `run` below calls them in the order the
//! figures appear, which is also the order they are measured in. `--only` runs the
//! scenarios named (see [`SCENARIOS`]) and no other.

mod contenders;
mod contention;
mod context;
mod cost;
mod distinct_keys;
mod distributed;
mod fenced_minimum;
mod grant_minimum;
mod grant_trace;
mod handoff;
mod handoff_trace;
mod monitor;
mod multi_key;
mod profile;
mod read_throughput;
mod redis_time;
mod round_trips;
mod scenarios;
mod semaphore_handoff;
mod stats;
mod svg;
mod system;
mod throughput;
mod uncontended;
mod watchdog;
mod writer_wait;

use context::Bench;
use throughput::CycleCommands;
use uncontended::Uncontended;

/// The scenarios `--only` can name, in the order they run. `tracing_info` installs a
/// global tracing subscriber, which cannot be removed: it stays last.
const SCENARIOS: [&str; 14] = [
    "uncontended",
    "fenced_minimum",
    "throughput",
    "contention",
    "handoff",
    "round_trips",
    "watchdog",
    "read_throughput",
    "writer_wait",
    "semaphore_handoff",
    "distributed",
    "multi_key",
    "distinct_keys",
    "tracing_info",
];

/// Options from the command line (cargo passes `--bench` too; it is ignored).
#[derive(Debug)]
struct Options {
    svg: String,
    quick: bool,
    current_thread: bool,
    /// The scenarios to run; every one when `None`.
    only: Option<Vec<String>>,
    /// `--profile SECONDS`: only redlock's uncontended cycles, for that long.
    profile: Option<f64>,
    /// `--trace-handoff`: only the hand-off runs, timed step by step.
    trace_handoff: bool,
    /// `--distributed-holds N`: holds per process of the distributed scenario.
    distributed_holds: Option<usize>,
    /// `--multi-key-transfers N`: transfers per process of the multi-key scenario.
    multi_key_transfers: Option<usize>,
}

impl Options {
    fn parse() -> Self {
        let mut options = Options {
            svg: "benches/handoff-latency.svg".to_owned(),
            quick: false,
            current_thread: false,
            only: None,
            profile: None,
            trace_handoff: false,
            distributed_holds: None,
            multi_key_transfers: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--svg" => options.svg = args.next().expect("--svg needs a path"),
                "--quick" => options.quick = true,
                "--current-thread" => options.current_thread = true,
                "--trace-handoff" => options.trace_handoff = true,
                "--profile" => {
                    let seconds = args.next().expect("--profile needs a number of seconds");
                    options.profile = Some(seconds.parse().expect("--profile SECONDS"));
                }
                "--distributed-holds" => {
                    let holds = args.next().expect("--distributed-holds needs a number");
                    options.distributed_holds = Some(
                        holds
                            .parse()
                            .expect("--distributed-holds N (holds per process)"),
                    );
                }
                "--multi-key-transfers" => {
                    let transfers = args.next().expect("--multi-key-transfers needs a number");
                    options.multi_key_transfers = Some(
                        transfers
                            .parse()
                            .expect("--multi-key-transfers N (transfers per process)"),
                    );
                }
                "--only" => {
                    let names = args.next().expect("--only needs scenario names");
                    let names: Vec<String> = names.split(',').map(str::to_owned).collect();
                    for name in &names {
                        assert!(
                            SCENARIOS.contains(&name.as_str()),
                            "unknown scenario {name:?}; the scenarios: {}",
                            SCENARIOS.join(", ")
                        );
                    }
                    options.only = Some(names);
                }
                _ => {}
            }
        }
        options
    }

    /// Whether the scenario `name` runs.
    fn runs(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|n| n == name))
    }
}

fn main() {
    // A child process of the distributed scenario: this binary run again by it.
    if let Ok(spec) = std::env::var(distributed::CHILD_ENV) {
        distributed::child(&spec);
        return;
    }
    // A child process of the multi-key scenario.
    if let Ok(spec) = std::env::var(multi_key::CHILD_ENV) {
        multi_key::child(&spec);
        return;
    }
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
    let mut bench = Bench::start(&options).await;
    if let Some(seconds) = options.profile {
        profile::run(&bench, seconds).await;
        return;
    }
    if options.trace_handoff {
        handoff_trace::run(&mut bench).await;
        return;
    }
    // Before any other cycle: capturing a cycle is what loads the scripts.
    let cycle_commands = CycleCommands::capture(&bench).await;
    let [ours, theirs] = &cycle_commands.nesting;
    bench.report.note(format!(
        "the commands of one cycle (MONITOR), which the split of Redis's time goes by: redlock {}; rslock {}",
        ours.summary(),
        theirs.summary()
    ));
    bench.warm_up().await;

    let mut rtt = None;
    if options.runs("uncontended") {
        let uncontended = Uncontended::measure(&mut bench, &cycle_commands.nesting).await;
        // Measured after the uncontended blocks, reported within their breakdown.
        let server_time = redis_time::run(&mut bench).await;
        uncontended.report(&mut bench, server_time);
        rtt = Some(uncontended.rtt());
    }
    // redlock's uncontended cycle against the minimal fenced lock's (issue 34).
    if options.runs("fenced_minimum") {
        fenced_minimum::run(&mut bench).await;
    }
    if options.runs("throughput") {
        throughput::run(&mut bench, &cycle_commands).await;
    }
    if options.runs("contention") {
        contention::run(&mut bench).await;
    }
    let mut handoff_curves = None;
    if options.runs("handoff") {
        handoff_curves = Some(handoff::run(&mut bench).await);
    }
    if options.runs("round_trips") {
        round_trips::run(&mut bench).await;
    }
    if options.runs("watchdog") {
        let rtt = match rtt {
            Some(rtt) => rtt,
            None => bench.rtt_now().await.0,
        };
        watchdog::run(&mut bench, rtt).await;
    }
    // The lock family: read-write lock and semaphore (redlock only: rslock has neither).
    if options.runs("read_throughput") {
        read_throughput::run(&mut bench).await;
    }
    if options.runs("writer_wait") {
        writer_wait::run(&mut bench).await;
    }
    if options.runs("semaphore_handoff") {
        semaphore_handoff::run(&mut bench, handoff_curves.as_ref()).await;
    }
    // Separate processes, a client each, on one key (redlock and rslock).
    if options.runs("distributed") {
        distributed::run(&mut bench, options.distributed_holds).await;
    }
    // Separate processes, a client each, transferring between two of a few accounts:
    // two keys per transfer (redlock's lock_all, rslock's two locks in sorted order).
    if options.runs("multi_key") {
        multi_key::run(&mut bench, options.multi_key_transfers).await;
    }
    // Last: the same scenario without, then with a tracing subscriber (a global one
    // cannot be removed, so nothing may run after it).
    let mut without_subscriber = distinct_keys::Sweep::default();
    if options.runs("distinct_keys") {
        without_subscriber = distinct_keys::run(&mut bench, &cycle_commands.nesting).await;
    }
    if options.runs("tracing_info") {
        distinct_keys::run_with_tracing(&mut bench, &cycle_commands.nesting, &without_subscriber)
            .await;
    }
    bench.report_violations();

    let report = &mut bench.report;
    match handoff_curves.map(|curves| std::fs::write(&options.svg, curves.plot())) {
        Some(Ok(())) => report.note(format!("handoff plot written to {}", options.svg)),
        Some(Err(error)) => report.note(format!("could not write {}: {error}", options.svg)),
        None => report.note("handoff not run: plot not written"),
    }
    println!();
    println!("{}", bench.header);
    println!();
    print!("{}", report.table());
    println!();
    for note in &report.notes {
        println!("- {note}");
    }
    println!();
    println!(
        "total run time {:.0} s",
        bench.began.elapsed().as_secs_f64()
    );
}
