//! The benchmark of BENCHMARKS.md: every scenario against a redis-server of its own,
//! for redlock and for rslock, with the limit each is measured against taken in the
//! same run. Prints one Markdown table, a `BENCH {...}` line per figure, and writes
//! the handoff-latency plot.
//!
//! `cargo bench --bench locks [-- --svg PATH] [-- --quick]` (see `scripts/bench.sh`).
//!
//! Each scenario is a module of its own; `run` below calls them in the order the
//! figures appear, which is also the order they are measured in.

mod contenders;
mod contention;
mod context;
mod handoff;
mod monitor;
mod redis_time;
mod round_trips;
mod scenarios;
mod stats;
mod svg;
mod system;
mod throughput;
mod uncontended;
mod watchdog;

use context::Bench;
use throughput::CycleCommands;
use uncontended::Uncontended;

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
    let mut bench = Bench::start(&options).await;
    // Before any other cycle: capturing a cycle is what loads the scripts.
    let cycle_commands = CycleCommands::capture(&bench).await;
    bench.warm_up().await;

    let uncontended = Uncontended::measure(&mut bench).await;
    // Measured after the uncontended blocks, reported within their breakdown.
    let server_time = redis_time::run(&mut bench).await;
    uncontended.report(&mut bench, server_time);
    throughput::run(&mut bench, &cycle_commands).await;
    contention::run(&mut bench).await;
    let handoff_curves = handoff::run(&mut bench).await;
    round_trips::run(&mut bench).await;
    watchdog::run(&mut bench, uncontended.rtt()).await;
    bench.report_violations();

    let report = &mut bench.report;
    match std::fs::write(&options.svg, handoff_curves.plot()) {
        Ok(()) => report.note(format!("handoff plot written to {}", options.svg)),
        Err(error) => report.note(format!("could not write {}: {error}", options.svg)),
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
