//! Uncontended acquire + release, one task, against the round trip of a PING: blocks of
//! PINGs, redlock cycles and rslock cycles interleaved, so that each ratio compares
//! figures taken at the same moment of a noisy machine.

use std::time::{Duration, Instant};

use crate::context::{BLOCK_LEN, Bench};
use crate::cost::{self, Cost, Nesting, Reading};
use crate::scenarios;
use crate::stats::{Figure, Verdict, median, micros, number, quantile};

/// Interleaved blocks of PINGs, redlock cycles and rslock cycles.
const BLOCKS: usize = 10;

/// Per-block p50s, in µs or RTT; each pair is redlock's, then rslock's.
#[derive(Debug)]
pub struct Uncontended {
    /// PING p50 of each block.
    rtt_p50: Vec<f64>,
    /// Cycle p50 of each block.
    p50: [Vec<f64>; 2],
    /// Cycle p50 over the same block's PING p50.
    ratio: [Vec<f64>; 2],
    /// Acquire p50 and release p50 over the same block's PING p50.
    parts: [[Vec<f64>; 2]; 2],
    /// Where each block's time went (counters read around the block's cycles).
    costs: [Vec<Cost>; 2],
}

impl Uncontended {
    /// `nesting`: which commands of each lock's cycle run in its scripts (redlock's,
    /// rslock's), for the split of Redis's time.
    pub async fn measure(bench: &mut Bench, nesting: &[Nesting; 2]) -> Self {
        bench.progress("uncontended");
        let scale = bench.scale;
        let mut rtt_p50 = Vec::new();
        let mut p50 = [Vec::new(), Vec::new()];
        let mut ratio = [Vec::new(), Vec::new()];
        let mut parts = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
        let mut costs = [Vec::new(), Vec::new()];
        for _ in 0..BLOCKS {
            let rtt = quantile(
                &scenarios::ping_block(&mut bench.ping, BLOCK_LEN / scale).await,
                0.5,
            );
            rtt_p50.push(micros(rtt));
            for (index, lock) in [&bench.redlock, &bench.rslock].into_iter().enumerate() {
                let key = format!("bench:uncontended:{}", lock.name());
                // Counters around the block (outside its timed cycles) for the breakdown.
                let before = Reading::before(&mut bench.ping).await;
                let started = Instant::now();
                let samples = scenarios::cycle_block(lock, &key, BLOCK_LEN / scale).await;
                let elapsed = started.elapsed();
                let after = Reading::after(&mut bench.ping).await;
                costs[index].push(Cost::between(
                    &before,
                    &after,
                    samples.len(),
                    1,
                    elapsed,
                    &nesting[index],
                    micros(rtt),
                ));
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
        Uncontended {
            rtt_p50,
            p50,
            ratio,
            parts,
            costs,
        }
    }

    /// The median of the blocks' PING p50s, in µs.
    pub fn rtt(&self) -> f64 {
        median(&self.rtt_p50)
    }

    /// The figure and its notes. `server_time` (Redis's own time per cycle, µs, from
    /// [`crate::redis_time`]) joins the breakdown, which is why reporting waits for it.
    pub fn report(&self, bench: &mut Bench, server_time: [f64; 2]) {
        let rtt = self.rtt();
        let ratios = [median(&self.ratio[0]), median(&self.ratio[1])];
        let parts = &self.parts;
        bench.report.note(format!(
            "uncontended breakdown (median over blocks of p50 / block RTT p50): redlock acquire {} RTT + release {} RTT; \
             rslock acquire {} RTT + release {} RTT; Redis's own time per cycle (INFO commandstats usec): redlock {} µs, rslock {} µs",
            number(median(&parts[0][0])),
            number(median(&parts[0][1])),
            number(median(&parts[1][0])),
            number(median(&parts[1][1])),
            number(server_time[0]),
            number(server_time[1]),
        ));
        bench.report.add(Figure {
            id: "uncontended_cycle_p50".into(),
            scenario: "uncontended acquire+release, 1 task, p50".into(),
            redlock: Some(median(&self.p50[0])),
            rslock: Some(median(&self.p50[1])),
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
        cost::report(
            bench,
            "uncontended_1_task",
            "uncontended, 1 task",
            &[Cost::median(&self.costs[0]), Cost::median(&self.costs[1])],
            true,
        );
        bench.report.note(format!(
            "uncontended: {BLOCKS} interleaved blocks of {} PINGs / redlock cycles / rslock cycles; \
             medians of the per-block p50s; the RTT ratio is the median of the per-block ratios; \
             block RTT p50s ranged {}–{} µs",
            BLOCK_LEN / bench.scale,
            number(self.rtt_p50.iter().copied().fold(f64::INFINITY, f64::min)),
            number(self.rtt_p50.iter().copied().fold(0.0, f64::max)),
        ));
    }
}
