//! Handoff latency against the number of waiters (one shared client each): from the
//! holder's release call to the next waiter's acquire return, against a PING round
//! trip taken just before, back to back and after an idle sleep as a parked waiter
//! sees it.

use crate::context::{BLOCK_LEN, Bench, HOLD, WAITERS};
use crate::scenarios::{self, Stop};
use crate::stats::{Figure, Verdict, micros, number, quantile};
use crate::svg;
use crate::system;

/// Acquisitions of a handoff run: enough for every waiter to hold the lock twice.
pub fn acquisitions(waiters: usize, scale: usize) -> usize {
    (200 / scale).max(2 * (waiters + 1))
}

/// What the plot shows, per waiter count.
#[derive(Debug)]
pub struct Curves {
    /// (waiters, handoff p50 µs, handoff p99 µs): redlock's, rslock's.
    handoffs: [Vec<(f64, f64, f64)>; 2],
    /// (waiters, PING RTT p50 µs).
    rtts: Vec<(f64, f64)>,
}

/// A run of each lock per waiter count; two rows and a note each.
pub async fn run(bench: &mut Bench) -> Curves {
    let scale = bench.scale;
    let mut handoff_points: [Vec<(f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let mut rtts = Vec::new();
    for waiters in WAITERS {
        bench.progress(&format!("handoff, {waiters} waiters"));
        let total = acquisitions(waiters, scale);
        let rtt = micros(quantile(
            &scenarios::ping_block(&mut bench.ping, BLOCK_LEN / scale).await,
            0.5,
        ));
        let idle_rtt = micros(quantile(
            &scenarios::idle_ping_block(&mut bench.ping, 100 / scale, HOLD).await,
            0.5,
        ));
        rtts.push((waiters as f64, rtt));
        let mut runs = Vec::new();
        for lock in [&bench.redlock, &bench.rslock] {
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
            bench.violations[index] += run.violations;
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
            bench.report.add(Figure {
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
        bench.report.note(format!(
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
    Curves {
        handoffs: handoff_points,
        rtts,
    }
}

impl Curves {
    /// redlock's handoff p50 and p99 and the PING RTT p50 of its run at `waiters`
    /// waiters (µs), if that count was measured.
    pub fn redlock_at(&self, waiters: usize) -> Option<(f64, f64, f64)> {
        let at = self.handoffs[0].iter().find(|p| p.0 == waiters as f64)?;
        let rtt = self.rtts.iter().find(|p| p.0 == waiters as f64)?;
        Some((at.1, at.2, rtt.1))
    }

    /// The plot as SVG: p50 and p99 of each lock, and the PING RTT. Dated when drawn.
    pub fn plot(self) -> String {
        let color = ["#1f77b4", "#d62728"];
        let mut series = Vec::new();
        for (index, name) in ["redlock", "rslock"].into_iter().enumerate() {
            for (dashed, label, pick) in [(false, "p50", 1), (true, "p99", 2)] {
                series.push(svg::Series {
                    label: format!("{name} {label}"),
                    color: color[index],
                    dashed,
                    points: self.handoffs[index]
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
            points: self.rtts,
        });
        svg::handoff_plot(
            &format!("Handoff latency vs waiters — {}", system::now()),
            &series,
        )
    }
}
