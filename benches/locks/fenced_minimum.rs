//! The yardstick of issue 34: the minimal fenced lock, and what redlock's uncontended
//! cycle costs the Redis server against it.
//!
//! The fenced minimum is the least a lock with fencing tokens can ask of Redis: one
//! small script that takes `max(counter + 1, server clock in µs)` as the token (`TIME`,
//! the counter's `SET … GET`) and sets the key if free, and a compare-and-delete. No
//! waiting, no line, no client name: it is only ever taken uncontended here.
//!
//! Rounds alternate redlock, the fenced minimum and rslock, each cycling (acquire +
//! release) for [`ROUND`] on keys of their own, at 1 and 64 tasks of one client.
//! Redis's counters are read around every round: its CPU (`INFO cpu`, user + sys) and
//! its commands (`INFO commandstats`, a script's inner calls included) per cycle. Each
//! figure is the median of [`ROUNDS`]; redlock's is set against the fenced minimum's
//! from the same rounds.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::contenders::Lock;
use crate::context::{BLOCK_LEN, Bench};
use crate::cost;
use crate::distinct_keys;
use crate::scenarios;
use crate::stats::{Figure, Verdict, median, micros, number, quantile};

const ROUND: Duration = Duration::from_millis(400);
const ROUNDS: usize = 5;
const TASKS: [usize; 2] = [1, 64];

/// Takes the key if free, with the next fencing token; 0 when busy.
const ACQUIRE: &str = r#"
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', token), 'GET'))
if last and last >= token then
  token = last + 1
  redis.call('SET', KEYS[2], string.format('%.0f', token))
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return token
end
return 0
"#;

/// Deletes the key if it still holds the owner's token.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// The minimal fenced lock: a connection, its two scripts, and owner tokens.
#[derive(Clone)]
pub struct FencedMinimum {
    connection: MultiplexedConnection,
    scripts: Arc<(redis::Script, redis::Script)>,
    owners: Arc<AtomicU64>,
}

impl fmt::Debug for FencedMinimum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FencedMinimum")
    }
}

/// A held fenced-minimum lock.
#[derive(Debug)]
pub struct FencedGuard {
    lock: FencedMinimum,
    key: String,
    owner: String,
}

impl FencedMinimum {
    pub async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).expect("the fenced minimum's URL");
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect the fenced minimum");
        FencedMinimum {
            connection,
            scripts: Arc::new((redis::Script::new(ACQUIRE), redis::Script::new(RELEASE))),
            owners: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Takes `key` for `lease`, trying again every millisecond while it is busy.
    pub async fn acquire(&self, key: &str, lease: Duration) -> FencedGuard {
        let owner = format!(
            "{:032x}:{:x}",
            std::process::id(),
            self.owners.fetch_add(1, Ordering::Relaxed)
        );
        loop {
            let token: u64 = self
                .scripts
                .0
                .key(key)
                .key("bench:fenced-minimum:counter")
                .arg(&owner)
                .arg(lease.as_millis() as u64)
                .invoke_async(&mut self.connection.clone())
                .await
                .expect("the fenced minimum's acquire");
            if token > 0 {
                return FencedGuard {
                    lock: self.clone(),
                    key: key.to_owned(),
                    owner,
                };
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

impl FencedGuard {
    pub async fn release(self) {
        let _: i64 = self
            .lock
            .scripts
            .1
            .key(&self.key)
            .arg(&self.owner)
            .invoke_async(&mut self.lock.connection.clone())
            .await
            .expect("the fenced minimum's release");
    }
}

/// One lock's round: cycles per second, cycle p50 (µs), Redis CPU (µs) and commands
/// per cycle.
#[derive(Debug, Default, Clone, Copy)]
struct Round {
    rate: f64,
    p50: f64,
    redis_cpu: f64,
    commands: f64,
}

/// Redis's CPU (s) and the calls of every command but INFO, so far.
async fn counters(connection: &mut MultiplexedConnection) -> (f64, f64) {
    let (commands, cpu) = cost::redis_counters(connection).await;
    let calls = commands
        .iter()
        .filter(|(name, _)| !name.starts_with("info"))
        .map(|(_, &(calls, _))| calls as f64)
        .sum();
    (cpu, calls)
}

/// The rounds at each task count of [`TASKS`], and their figures.
pub async fn run(bench: &mut Bench) {
    let fenced = Lock::Fenced(FencedMinimum::connect(&bench.url).await);
    let locks = [bench.redlock.clone(), fenced, bench.rslock.clone()];
    for tasks in TASKS {
        bench.progress(&format!("fenced minimum, {tasks} task(s)"));
        let rtt = micros(quantile(
            &scenarios::ping_block(&mut bench.ping, BLOCK_LEN / bench.scale).await,
            0.5,
        ));
        let mut rounds: [Vec<Round>; 3] = Default::default();
        for round in 0..ROUNDS {
            for (index, lock) in locks.iter().enumerate() {
                let tag = format!("fenced-minimum:{tasks}:{round}");
                let (cpu0, calls0) = counters(&mut bench.ping).await;
                let (n, elapsed, times) =
                    distinct_keys::cycles(lock, tasks, ROUND / bench.scale as u32, &tag).await;
                let (cpu1, calls1) = counters(&mut bench.ping).await;
                let n_f = n.max(1) as f64;
                rounds[index].push(Round {
                    rate: n as f64 / elapsed.as_secs_f64(),
                    p50: micros(quantile(&times, 0.5)),
                    redis_cpu: (cpu1 - cpu0) * 1e6 / n_f,
                    // The INFO that read the counters before is counted; the one after not.
                    commands: (calls1 - calls0 - 1.0).max(0.0) / n_f,
                });
            }
        }
        let of = |index: usize, pick: fn(&Round) -> f64| -> f64 {
            median(&rounds[index].iter().map(pick).collect::<Vec<_>>())
        };
        let [redlock, fenced, rslock] = [0, 1, 2].map(|index| Round {
            rate: of(index, |r| r.rate),
            p50: of(index, |r| r.p50),
            redis_cpu: of(index, |r| r.redis_cpu),
            commands: of(index, |r| r.commands),
        });
        let label = if tasks == 1 {
            "1 task".to_owned()
        } else {
            format!("{tasks} tasks")
        };
        let cpu_ratio = redlock.redis_cpu / fenced.redis_cpu;
        bench.report.add(Figure {
            id: format!("fenced_minimum.redis_cpu_per_cycle.tasks_{tasks}"),
            scenario: format!(
                "uncontended, distinct keys, {label}: Redis CPU per acquire + release (INFO cpu)"
            ),
            redlock: Some(redlock.redis_cpu),
            rslock: Some(rslock.redis_cpu),
            unit: "µs",
            limit: format!("fenced minimum {} µs", number(fenced.redis_cpu)),
            ratio: format!("{} × fenced minimum", number(cpu_ratio)),
            target: "≤ 1.1 × fenced minimum".into(),
            verdict: Verdict::of(cpu_ratio <= 1.1),
        });
        bench.report.add(Figure {
            id: format!("fenced_minimum.commands_per_cycle.tasks_{tasks}"),
            scenario: format!(
                "uncontended, distinct keys, {label}: Redis commands per acquire + release (scripts' calls included)"
            ),
            redlock: Some(redlock.commands),
            rslock: Some(rslock.commands),
            unit: "",
            limit: format!("fenced minimum {}", number(fenced.commands)),
            ratio: format!("{} × fenced minimum", number(redlock.commands / fenced.commands)),
            target: "-".into(),
            verdict: Verdict::Info,
        });
        let rate_ratio = redlock.rate / fenced.rate;
        if tasks > 1 {
            bench.report.add(Figure {
                id: format!("fenced_minimum.cycles_per_second.tasks_{tasks}"),
                scenario: format!("uncontended, distinct keys, {label}: cycles per second"),
                redlock: Some(redlock.rate),
                rslock: Some(rslock.rate),
                unit: "/s",
                limit: format!("fenced minimum {}/s", number(fenced.rate)),
                ratio: format!("{} × fenced minimum", number(rate_ratio)),
                target: "≥ 0.95 × fenced minimum".into(),
                verdict: Verdict::of(rate_ratio >= 0.95),
            });
        } else {
            let (ours, theirs) = (redlock.p50 / rtt, fenced.p50 / rtt);
            bench.report.add(Figure {
                id: "fenced_minimum.cycle_p50.tasks_1".into(),
                scenario: "uncontended, 1 task: acquire + release p50".into(),
                redlock: Some(redlock.p50),
                rslock: Some(rslock.p50),
                unit: "µs",
                limit: format!(
                    "RTT {} µs; fenced minimum {} µs = {} RTT",
                    number(rtt),
                    number(fenced.p50),
                    number(theirs)
                ),
                ratio: format!(
                    "{} RTT = {} × the fenced minimum's",
                    number(ours),
                    number(ours / theirs)
                ),
                target: "≤ 1.02 × the fenced minimum's RTT ratio".into(),
                verdict: Verdict::of(ours / theirs <= 1.02),
            });
        }
    }
    bench.report.note(format!(
        "fenced minimum: {ROUNDS} rounds of {} ms per lock, alternating redlock, the fenced \
         minimum and rslock, at 1 and 64 tasks of one client on keys of their own; medians \
         of the rounds; Redis's counters read around each round",
        ROUND.as_millis() / bench.scale as u128,
    ));
}
