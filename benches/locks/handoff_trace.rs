//! `--trace-handoff`: where the time of a hand-off goes, step by step. The handoff
//! scenario's runs (redlock only, one shared client, 2 / 16 / 64 / 256 waiters) with a
//! subscriber that timestamps the runtime's timing events (target `redlock::timing`,
//! TRACE) and two of the benchmark's own: the holder's release call and the next
//! holder's acquire return. A hand-off through the baton (the lock passed to the next
//! task of the client) is then five steps:
//!
//! 1. release call → baton left: the releasing task stops its watchdog entry and
//!    leaves its owner token in the key's slot, passing the turn;
//! 2. baton left → turn taken: the next in line is woken and runs (tokio's fair mutex,
//!    then the scheduler);
//! 3. turn taken → script sent: the attempt is prepared (owner token, request);
//! 4. script sent → answered: one round trip through redis-rs, the acquire script in
//!    Redis, and the wake-up of the task when the reply comes;
//! 5. answered → acquire returned: the guard is built and the call returns.
//!
//! Every ninth release goes through Redis instead (`MAX_HANDOFFS_IN_A_ROW`); those are
//! counted and left out. Means add up to the mean total exactly; medians are shown too.
//! Step 4 is set against a PING round trip taken just before through the same kind of
//! connection, and against Redis's own time per EVALSHA in the run (`INFO commandstats`).
//!
//! Its own process (like `--profile`): the subscriber is the global default, which
//! cannot be removed, and must not be in place while other scenarios run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber, span};

use crate::context::{BLOCK_LEN, Bench, HOLD, WAITERS};
use crate::handoff;
use crate::redis_time::{command_stats, slowlog_by_command, slowlog_everything};
use crate::scenarios::{self, Stop};
use crate::stats::{median, micros, number, quantile};
use crate::system;

/// The target the runtime's timing events go to (`redlock_runtime`'s `metrics::TIMING`).
const TARGET: &str = "redlock::timing";

/// One timing event: when, which, and its `baton` field if it has one.
type Stamp = (Instant, &'static str, Option<bool>);

/// A subscriber that hands each of the runtime's timing events to `on_event` as it
/// happens: every other callsite is off, so spans and other events cost what they cost
/// without a subscriber. This trace's and `grant_trace`'s.
pub struct TimingEvents<F>(pub F);

struct Baton(Option<bool>);

impl Visit for Baton {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "baton" {
            self.0 = Some(value);
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<F: Fn(&Event<'_>) + Send + Sync + 'static> Subscriber for TimingEvents<F> {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && metadata.target() == TARGET
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        (self.0)(event);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// The five steps of one hand-off through the baton (see the module's docs).
#[derive(Debug, Default, Clone, Copy)]
struct Steps([Duration; 5]);

/// The steps of every hand-off through the baton in `stamps`, and how many hand-offs
/// went through Redis instead.
fn hand_offs(stamps: &[Stamp]) -> (Vec<Steps>, usize) {
    let mut complete = Vec::new();
    let mut through_redis = 0;
    // The times seen so far of the hand-off under way: release call, baton left, turn
    // taken (with the baton), script sent, answered.
    let mut seen: Vec<Instant> = Vec::new();
    for &(at, name, baton) in stamps {
        match (name, seen.len()) {
            ("release_called", _) => seen = vec![at],
            ("baton_left", 1) => seen.push(at),
            ("turn_taken", 2) if baton == Some(true) => seen.push(at),
            ("turn_taken", 1) if baton == Some(false) => {
                // Released in Redis: no baton.
                through_redis += 1;
                seen.clear();
            }
            ("script_sent", 3) | ("script_answered", 4) => seen.push(at),
            ("acquired", 5) => {
                let mut steps = Steps::default();
                for (step, pair) in steps.0.iter_mut().zip(seen.windows(2)) {
                    *step = pair[1] - pair[0];
                }
                steps.0[4] = at - seen[4];
                complete.push(steps);
                seen.clear();
            }
            _ => {}
        }
    }
    (complete, through_redis)
}

pub async fn run(bench: &mut Bench) {
    let stamps = Arc::new(Mutex::new(Vec::new()));
    let recorder = TimingEvents({
        let stamps = stamps.clone();
        move |event: &Event<'_>| {
            let at = Instant::now();
            let mut baton = Baton(None);
            event.record(&mut baton);
            stamps
                .lock()
                .unwrap()
                .push((at, event.metadata().name(), baton.0));
        }
    });
    if let Err(error) = tracing::subscriber::set_global_default(recorder) {
        println!("trace-handoff: could not install the subscriber: {error}");
        return;
    }
    bench.warm_up().await;
    println!(
        "hand-off through the baton, step by step (µs: mean / p50); redlock, one shared client, hold {HOLD:?} as asked"
    );
    println!(
        "{:>7} {:>6} {:>9} {:>17} {:>17} {:>17} {:>17} {:>17} {:>17} {:>7} {:>9} {:>10} {:>9}",
        "waiters",
        "n",
        "via Redis",
        "1 release→baton",
        "2 baton→turn",
        "3 turn→sent",
        "4 sent→answered",
        "5 answered→ret",
        "total",
        "RTT",
        "EVALSHA",
        "4−RTT−exec",
        "CPU/hand"
    );
    for waiters in WAITERS {
        let total = 4 * handoff::acquisitions(waiters, bench.scale);
        let rtt = micros(quantile(
            &scenarios::ping_block(&mut bench.ping, BLOCK_LEN / bench.scale).await,
            0.5,
        ));
        let key = format!("bench:trace-handoff:{waiters}");
        stamps.lock().unwrap().clear();
        let stats_before = command_stats(&mut bench.ping).await;
        slowlog_everything(&mut bench.ping).await;
        let cpu_before = system::cpu_seconds();
        let run = scenarios::contend(
            std::slice::from_ref(&bench.redlock),
            &key,
            waiters + 1,
            Stop::Total(total),
            HOLD,
        )
        .await;
        let cpu = system::cpu_seconds() - cpu_before;
        let durations: Vec<String> = slowlog_by_command(&mut bench.ping)
            .await
            .iter()
            .filter(|(_, times)| times.len() >= 10)
            .map(|(name, times)| {
                format!("{name} {}× p50 {} µs", times.len(), number(median(times)))
            })
            .collect();
        let durations = durations.join("; ");
        let stats = command_stats(&mut bench.ping).await;
        let delta = |name: &str| -> (f64, f64) {
            let (calls, usec) = stats.get(name).copied().unwrap_or_default();
            let (calls_before, usec_before) = stats_before.get(name).copied().unwrap_or_default();
            (calls - calls_before, usec - usec_before)
        };
        let (calls, usec) = delta("evalsha");
        let exec = usec / calls.max(1.0);
        // Redis's time per acquisition, by command (the scripts' own commands are
        // counted under their names too, and within EVALSHA's time).
        let per_acquisition = run.acquisitions.max(1) as f64;
        let mut by_command: Vec<(String, f64, f64)> = stats
            .keys()
            .filter(|name| !matches!(name.as_str(), "info" | "ping"))
            .map(|name| {
                let (calls, usec) = delta(name);
                (
                    name.clone(),
                    calls / per_acquisition,
                    usec / per_acquisition,
                )
            })
            .filter(|(_, calls, _)| *calls > 0.0)
            .collect();
        by_command.sort_by(|a, b| b.2.total_cmp(&a.2));
        let (steps, through_redis) = hand_offs(&stamps.lock().unwrap());
        if steps.is_empty() {
            println!("{waiters:>7}: no hand-off through the baton was seen");
            continue;
        }
        let column = |index: usize| -> (f64, f64) {
            let values: Vec<f64> = steps.iter().map(|s| micros(s.0[index])).collect();
            (
                values.iter().sum::<f64>() / values.len() as f64,
                median(&values),
            )
        };
        let totals: Vec<f64> = steps
            .iter()
            .map(|s| micros(s.0.iter().sum::<Duration>()))
            .collect();
        let cells: Vec<String> = (0..5)
            .map(|i| {
                let (mean, p50) = column(i);
                format!("{:>7} / {:>7}", number(mean), number(p50))
            })
            .collect();
        let mean_total = totals.iter().sum::<f64>() / totals.len() as f64;
        let (round_trip, _) = column(3);
        println!(
            "{waiters:>7} {:>6} {through_redis:>9} {} {:>7} / {:>7} {:>7} {:>9} {:>10} {:>9}",
            steps.len(),
            cells.join(" "),
            number(mean_total),
            number(median(&totals)),
            number(rtt),
            number(exec),
            number(round_trip - rtt - exec),
            number(cpu * 1e6 / run.acquisitions.max(1) as f64),
        );
        println!(
            "BENCH {{\"trace_handoff\":{waiters},\"n\":{},\"through_redis\":{through_redis},\"steps_mean_us\":[{}],\"steps_p50_us\":[{}],\"total_mean_us\":{:.1},\"total_p50_us\":{:.1},\"handoff_p50_us\":{:.1},\"rtt_us\":{rtt:.1},\"evalsha_us\":{exec:.1},\"cpu_us_per_acquisition\":{:.1},\"violations\":{}}}",
            steps.len(),
            (0..5)
                .map(|i| format!("{:.1}", column(i).0))
                .collect::<Vec<_>>()
                .join(","),
            (0..5)
                .map(|i| format!("{:.1}", column(i).1))
                .collect::<Vec<_>>()
                .join(","),
            mean_total,
            median(&totals),
            micros(quantile(&run.handoffs, 0.5)),
            cpu * 1e6 / run.acquisitions.max(1) as f64,
            run.violations,
        );
        println!(
            "        Redis per acquisition (calls, µs): {}",
            by_command
                .iter()
                .map(|(name, calls, usec)| format!("{name} {calls:.2}× {usec:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("        Redis µs per command (SLOWLOG, threshold 0): {durations}");
    }
}
