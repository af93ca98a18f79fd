//! `--profile SECONDS`: only redlock's uncontended acquire + release cycles, one task,
//! for that long, so that a profiler attached to the process (`scripts/profile.sh`:
//! `perf record`) sees the uncontended path and nothing else. With `PROFILE_LOCK=rslock`
//! in the environment, rslock's cycles instead, to hold the two side by side.

use std::time::{Duration, Instant};

use crate::context::Bench;
use crate::redis_time::info_field;
use crate::scenarios;

/// Cycles per block between two looks at the clock.
const BLOCK: usize = 500;

pub async fn run(bench: &Bench, seconds: f64) {
    bench.warm_up().await;
    let (name, lock) = match std::env::var("PROFILE_LOCK").as_deref() {
        Ok("rslock") => ("rslock", &bench.rslock),
        _ => ("redlock", &bench.redlock),
    };
    bench.progress(&format!("profile: {name} uncontended cycles"));
    let bytes_before = net_bytes(bench).await;
    let kernel_before = kernel_counts();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut cycles = 0;
    let mut samples = Vec::new();
    while Instant::now() < deadline {
        let block = scenarios::cycle_block(lock, "bench:profile", BLOCK).await;
        samples.extend(block.iter().map(|(a, r)| *a + *r));
        cycles += block.len();
    }
    let elapsed = started.elapsed();
    let kernel = kernel_counts();
    let bytes = net_bytes(bench).await;
    println!(
        "profile: per cycle, this process's read + write system calls {:.2}, context switches {:.2} (/proc/self/io, /proc/self/task/*/status)",
        (kernel.0 - kernel_before.0) / cycles as f64,
        (kernel.1 - kernel_before.1) / cycles as f64,
    );
    println!(
        "profile: bytes per cycle on the wire (INFO stats total_net_*_bytes): {:.0} to Redis, {:.0} back",
        (bytes.0 - bytes_before.0) / cycles as f64,
        (bytes.1 - bytes_before.1) / cycles as f64,
    );
    println!(
        "profile: {cycles} {name} uncontended cycles in {:.1} s: {:.0} cycles/s, mean {:.1} µs, p50 {:.1} µs",
        elapsed.as_secs_f64(),
        cycles as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / cycles as f64,
        crate::stats::micros(crate::stats::quantile(&samples, 0.5)),
    );
}

/// Redis's count of bytes read from and written to its clients so far.
async fn net_bytes(bench: &Bench) -> (f64, f64) {
    let mut connection = bench.ping.clone();
    (
        info_field(&mut connection, "stats", "total_net_input_bytes").await,
        info_field(&mut connection, "stats", "total_net_output_bytes").await,
    )
}

/// This process's read and write system calls (`/proc/self/io`: `syscr` + `syscw`) and
/// its threads' context switches, voluntary and not, so far.
fn kernel_counts() -> (f64, f64) {
    let field = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let calls = field(&io, "syscr:") + field(&io, "syscw:");
    let mut switches = 0.0;
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        switches += field(&status, "voluntary_ctxt_switches:")
            + field(&status, "nonvoluntary_ctxt_switches:");
    }
    (calls, switches)
}
