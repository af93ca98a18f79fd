//! `--profile SECONDS`: only redlock's uncontended acquire + release cycles, one task,
//! for that long, so that a profiler attached to the process (`scripts/profile.sh`:
//! `perf record`) sees the uncontended path and nothing else. With `PROFILE_LOCK=rslock`
//! in the environment, rslock's cycles instead, to hold the two side by side.

use std::time::{Duration, Instant};

use crate::context::Bench;
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
    println!(
        "profile: {cycles} {name} uncontended cycles in {:.1} s: {:.0} cycles/s, mean {:.1} µs, p50 {:.1} µs",
        elapsed.as_secs_f64(),
        cycles as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / cycles as f64,
        crate::stats::micros(crate::stats::quantile(&samples, 0.5)),
    );
}
