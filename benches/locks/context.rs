//! What every scenario shares: the server, the two locks, a connection for PINGs and
//! INFO, the iteration scale, the report the figures and notes go to, and the
//! mutual-exclusion violations counted over every contended run.

use std::time::{Duration, Instant};

use redlock_testkit::RedisServer;

use crate::Options;
use crate::contenders::Lock;
use crate::scenarios;
use crate::stats::{Figure, Report, Verdict, micros, quantile};
use crate::system;

/// PINGs in a round-trip block, and cycles in an uncontended block.
pub const BLOCK_LEN: usize = 500;
/// The hold of every contended scenario, as asked of `tokio::time::sleep`: its timer
/// wheel rounds up to the next millisecond, so the real hold (measured) is about 1 ms.
pub const HOLD: Duration = Duration::from_micros(500);
/// Waiter counts of the handoff and round-trip scenarios.
pub const WAITERS: [usize; 4] = [2, 16, 64, 256];

/// The run's shared state, handed to each scenario in turn.
pub struct Bench {
    /// The date, machine, Redis and runtime: above the output and again above the table.
    pub header: String,
    pub began: Instant,
    pub url: String,
    /// One client shared by every task of a scenario, unless it says otherwise.
    pub redlock: Lock,
    pub rslock: Lock,
    /// The connection PING blocks and INFO readings go through.
    pub ping: redis::aio::MultiplexedConnection,
    /// Divides every iteration count: 4 with `--quick`, else 1.
    pub scale: usize,
    pub report: Report,
    /// Violations over every contended run: redlock's, rslock's.
    pub violations: [usize; 2],
    /// Declared last so that it is dropped last, after every connection to it.
    pub server: RedisServer,
}

impl Bench {
    /// Starts the server, prints the header and connects both locks.
    pub async fn start(options: &Options) -> Self {
        let began = Instant::now();
        let server = RedisServer::start();
        let url = server.url();
        let redis_version = server
            .cli(&["INFO", "server"])
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:").map(str::to_owned))
            .unwrap_or_default();
        let header = format!(
            "{} at {} | {} | Redis {redis_version} on 127.0.0.1:{} | tokio {}",
            system::now(),
            system::commit(),
            system::machine(),
            server.port(),
            if options.current_thread {
                "current-thread runtime".to_owned()
            } else {
                format!(
                    "multi-thread runtime, {} workers",
                    std::thread::available_parallelism().map_or(0, |n| n.get())
                )
            },
        );
        println!("# {header}");
        let report = Report::default();
        let scale = if options.quick { 4 } else { 1 };

        let redlock = Lock::redlock(&url).await;
        let rslock = Lock::rslock(&url);
        let ping = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect for PING");
        Bench {
            header,
            began,
            url,
            redlock,
            rslock,
            ping,
            scale,
            report,
            violations: [0, 0],
            server,
        }
    }

    /// Says on stderr which scenario starts, and when.
    pub fn progress(&self, scenario: &str) {
        eprintln!("[{:>5.1}s] {scenario}", self.began.elapsed().as_secs_f64());
    }

    /// Cycles of each lock before the first measurement, so that the first block does
    /// not pay for a cold start.
    pub async fn warm_up(&self) {
        for lock in [&self.redlock, &self.rslock] {
            scenarios::cycle_block(
                lock,
                &format!("bench:warm:{}", lock.name()),
                200 / self.scale,
            )
            .await;
        }
    }

    /// `tasks` fresh clients of each lock, one per task: how separate processes contend.
    pub async fn client_per_task(&self, tasks: usize) -> (Vec<Lock>, Vec<Lock>) {
        let mut redlocks = Vec::new();
        let mut rslocks = Vec::new();
        for _ in 0..tasks {
            redlocks.push(Lock::redlock(&self.url).await);
            rslocks.push(Lock::rslock(&self.url));
        }
        (redlocks, rslocks)
    }

    /// `n` fresh redlock clients (a connection each): how separate processes share a
    /// key. The lock family's scenarios use them directly (rslock has no read lock and
    /// no semaphore).
    pub async fn redlock_clients(&self, n: usize) -> Vec<redlock_runtime::LockClient> {
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            clients.push(
                redlock_runtime::LockClient::connect(&self.url)
                    .await
                    .expect("connect redlock"),
            );
        }
        clients
    }

    /// The PING round trip now, in µs: the p50 of a block, and the p50 of PINGs each
    /// sent after a [`HOLD`] of sleep (as a parked task sees it).
    pub async fn rtt_now(&mut self) -> (f64, f64) {
        let rtt = quantile(
            &scenarios::ping_block(&mut self.ping, BLOCK_LEN / self.scale).await,
            0.5,
        );
        let idle = quantile(
            &scenarios::idle_ping_block(&mut self.ping, 100 / self.scale, HOLD).await,
            0.5,
        );
        (micros(rtt), micros(idle))
    }

    /// The row that sums the violations of every contended run.
    pub fn report_violations(&mut self) {
        self.report.add(Figure {
            id: "mutual_exclusion_violations".into(),
            scenario: "mutual-exclusion violations, all contended runs".into(),
            redlock: Some(self.violations[0] as f64),
            rslock: Some(self.violations[1] as f64),
            unit: "",
            limit: "0".into(),
            ratio: "-".into(),
            target: "0".into(),
            verdict: Verdict::of(self.violations[0] == 0),
        });
    }
}
