//! Multi-key (issue 35): separate OS processes, a client each, transferring between two
//! accounts of a small set, each transfer holding both accounts' locks — what
//! `LockClient::lock_all` is for, measured against rslock, which has no multi-lock (a
//! user takes its two locks in a canonical order, sorted, with its own `acquire` and
//! retry settings, and releases both).
//!
//! Each child is this benchmark binary run again with [`CHILD_ENV`] set (see [`child`]),
//! as in the distributed scenario. It connects (to the lock server and to a *ledger*
//! server of its own), does one transfer between keys of its own (connections opened,
//! scripts loaded), says `ready` and waits for `go`, which the parent sends to every
//! child at once after reading Redis's counters. Then it makes [`TRANSFERS`] transfers:
//! it draws `(from, to)` among [`ACCOUNTS`] accounts, `from ≠ to`, names the two keys
//! in the drawn order (so that crossing orders happen), takes both, reads both
//! balances from the ledger, holds about 1 ms ([`HOLD`] of tokio sleep), writes
//! `from − 1` and `to + 1` back, and releases. The ledger's read-modify-write is not
//! atomic: only the locks keep the balances right. The ledger lives on a second
//! `redis-server` so that the lock server's CPU and commands are the locks' alone.
//!
//! Every transfer is written on the child's stdout with its instants on
//! `CLOCK_MONOTONIC` (asked, acquired, release called, release answered), from which the
//! parent derives transfers per second, the wait, and violations: two holds of one
//! account that overlap. The ledger's final balances are checked against the
//! transfers reported (and their sum against the opening sum). Redis's cost is read
//! from the processes' common start (`go`) to the last child's `done`: `INFO cpu`
//! (`used_cpu_user + used_cpu_sys`), `INFO stats` `total_commands_processed` (the
//! benchmark's own `INFO`s left out) and `INFO commandstats` by command.
//!
//! The same harness runs again with one key per transfer (`single`: the `from` account
//! alone, its balance read and written back unchanged): Redis's CPU and commands of one
//! single-key acquisition and release at the same process count, against which a
//! transfer's are set.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::context::{Bench, HOLD};
use crate::cost::process_cpu;
use crate::distributed::{CHILD_LIMIT, Running, monotonic_ns, read_until};
use crate::stats::{Figure, Verdict, micros, number, quantile};

/// The variable that makes the benchmark binary a child of this scenario.
pub const CHILD_ENV: &str = "REDLOCK_BENCH_MULTI_KEY_CHILD";

/// Process counts, each run for redlock then rslock, transfers then single keys.
const PROCESSES: [usize; 2] = [8, 16];
/// Accounts transferred between: few, so that transfers contend and cross.
const ACCOUNTS: usize = 4;
/// Transfers per process (`--multi-key-transfers N` overrides it; `--quick` divides it).
pub const TRANSFERS: usize = 25;
/// How long one acquisition may wait: far beyond any turn, so that a timeout means a
/// deadlock or a bug.
const WAIT: Duration = Duration::from_secs(30);
/// A fixed lease for every key, far longer than a hold or any wait here (rslock holds
/// its first key while it retries for the second: its lease must outlast that too).
const LEASE: Duration = Duration::from_secs(10);
/// Every account's balance at the start of a run.
const OPENING: i64 = 1_000;

/// Transfers between two accounts, or one account per acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Transfer,
    Single,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Transfer => "transfer",
            Mode::Single => "single",
        }
    }
}

/// What one child does.
#[derive(Debug, Clone)]
struct Spec {
    /// `redlock` or `rslock`.
    library: String,
    mode: Mode,
    url: String,
    ledger_url: String,
    /// The lock keys are `<prefix>:<account>`.
    prefix: String,
    index: usize,
    transfers: usize,
    seed: u64,
}

impl Spec {
    fn encode(&self) -> String {
        [
            self.library.clone(),
            self.mode.name().to_owned(),
            self.url.clone(),
            self.ledger_url.clone(),
            self.prefix.clone(),
            self.index.to_string(),
            self.transfers.to_string(),
            self.seed.to_string(),
        ]
        .join("\t")
    }

    fn decode(text: &str) -> Self {
        let parts: Vec<&str> = text.split('\t').collect();
        assert_eq!(parts.len(), 8, "bad {CHILD_ENV} {text:?}");
        let number = |i: usize| -> u64 { parts[i].parse().expect("a number in the spec") };
        Spec {
            library: parts[0].to_owned(),
            mode: match parts[1] {
                "transfer" => Mode::Transfer,
                "single" => Mode::Single,
                other => panic!("unknown mode {other:?}"),
            },
            url: parts[2].to_owned(),
            ledger_url: parts[3].to_owned(),
            prefix: parts[4].to_owned(),
            index: number(5) as usize,
            transfers: number(6) as usize,
            seed: number(7),
        }
    }

    fn key(&self, account: usize) -> String {
        format!("{}:{account}", self.prefix)
    }
}

/// The ledger key of an account (on the ledger server).
fn ledger_key(account: usize) -> String {
    format!("ledger:{account}")
}

/// xorshift64: the same draws for both libraries and both modes at a process count.
fn next(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

// ----------------------------------------------------------------------------------
// The child.

enum Client {
    Redlock(redlock_runtime::LockClient),
    Rslock(rslock::LockManager),
}

/// The locks of one transfer, held.
enum Held {
    Redlock(redlock_runtime::MultiLockGuard),
    RedlockOne(redlock_runtime::LockGuard),
    /// In the order taken (sorted).
    Rslock(Vec<rslock::LockGuard>),
}

impl Client {
    /// Every key of `keys` (in the order the caller drew them), or an error line.
    async fn take(&self, keys: &[String]) -> Result<Held, String> {
        match self {
            Client::Redlock(client) if keys.len() == 1 => client
                .lock(keys[0].clone())
                .wait(WAIT)
                .lease(LEASE)
                .acquire()
                .await
                .map(Held::RedlockOne)
                .map_err(|error| error.to_string()),
            Client::Redlock(client) => client
                .lock_all(keys.iter().cloned())
                .wait(WAIT)
                .lease(LEASE)
                .acquire()
                .await
                .map(Held::Redlock)
                .map_err(|error| error.to_string()),
            // No multi-lock: the keys in a canonical order (sorted, so that no two
            // callers wait for each other crosswise), each with rslock's `acquire`,
            // which retries (its default 3 tries, up to 200 ms apart) until it has the
            // key; one wait for all of them, ours.
            Client::Rslock(manager) => {
                let mut sorted = keys.to_vec();
                sorted.sort();
                let deadline = tokio::time::Instant::now() + WAIT;
                let mut guards = Vec::with_capacity(sorted.len());
                for key in &sorted {
                    let taken =
                        tokio::time::timeout_at(deadline, manager.acquire(key.as_bytes(), LEASE))
                            .await;
                    let error = match taken {
                        Ok(Ok(guard)) => {
                            guards.push(guard);
                            continue;
                        }
                        Ok(Err(error)) => error.to_string(),
                        Err(_) => format!("timed out after {WAIT:?} on {key}"),
                    };
                    Held::Rslock(guards).release().await;
                    return Err(error);
                }
                Ok(Held::Rslock(guards))
            }
        }
    }
}

impl Held {
    async fn release(self) {
        match self {
            Held::Redlock(guard) => guard.release().await.expect("redlock release"),
            Held::RedlockOne(guard) => guard.release().await.expect("redlock release"),
            // Both at once, as redlock's guard does; rslock's release reports nothing.
            Held::Rslock(mut guards) => match (guards.pop(), guards.pop()) {
                (Some(a), Some(b)) => {
                    tokio::join!(a.release(), b.release());
                }
                (Some(a), None) => a.release().await,
                _ => {}
            },
        }
    }
}

/// The child's entry: `spec` is the value of [`CHILD_ENV`]. A multi-thread runtime
/// with tokio's defaults, as `#[tokio::main]` gives a service.
pub fn child(spec: &str) {
    let spec = Spec::decode(spec);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the child's tokio runtime")
        .block_on(child_loop(spec));
}

async fn child_loop(spec: Spec) {
    let client = match spec.library.as_str() {
        "redlock" => Client::Redlock(
            redlock_runtime::LockClient::connect(&spec.url)
                .await
                .expect("connect redlock"),
        ),
        "rslock" => Client::Rslock(rslock::LockManager::new(vec![spec.url.clone()])),
        other => panic!("unknown library {other:?}"),
    };
    let mut ledger = redis::Client::open(spec.ledger_url.as_str())
        .expect("the ledger's URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the ledger");
    let per_transfer = match spec.mode {
        Mode::Transfer => 2,
        Mode::Single => 1,
    };
    // One acquisition of keys of its own: connections opened, scripts loaded.
    let warm: Vec<String> = (0..per_transfer)
        .map(|i| format!("{}:warm:{}:{i}", spec.prefix, spec.index))
        .collect();
    client
        .take(&warm)
        .await
        .unwrap_or_else(|error| panic!("warm-up acquire of {warm:?}: {error}"))
        .release()
        .await;
    let _: Option<i64> = redis::cmd("GET")
        .arg("ledger:warm")
        .query_async(&mut ledger)
        .await
        .expect("ledger warm-up");

    let mut stdout = tokio::io::stdout();
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    stdout.write_all(b"ready\n").await.expect("write ready");
    stdout.flush().await.expect("flush ready");
    match stdin.next_line().await.expect("read go").as_deref() {
        Some("go") => {}
        other => panic!("expected go, read {other:?}"),
    }

    let mut rng = spec.seed;
    let mut lines = Vec::with_capacity(spec.transfers + 2);
    let cpu_before = process_cpu();
    for _ in 0..spec.transfers {
        let from = (next(&mut rng) % ACCOUNTS as u64) as usize;
        let to = (from + 1 + (next(&mut rng) % (ACCOUNTS as u64 - 1)) as usize) % ACCOUNTS;
        let accounts: Vec<usize> = match spec.mode {
            Mode::Transfer => vec![from, to],
            Mode::Single => vec![from],
        };
        let keys: Vec<String> = accounts.iter().map(|&a| spec.key(a)).collect();
        let ledger_keys: Vec<String> = accounts.iter().map(|&a| ledger_key(a)).collect();
        let asked = monotonic_ns();
        match client.take(&keys).await {
            Ok(held) => {
                let acquired = monotonic_ns();
                let balances: Vec<i64> = redis::cmd("MGET")
                    .arg(ledger_keys.as_slice())
                    .query_async(&mut ledger)
                    .await
                    .expect("read the balances");
                tokio::time::sleep(HOLD).await;
                let mut write = redis::cmd("MSET");
                match spec.mode {
                    Mode::Transfer => write
                        .arg(&ledger_keys[0])
                        .arg(balances[0] - 1)
                        .arg(&ledger_keys[1])
                        .arg(balances[1] + 1),
                    Mode::Single => write.arg(&ledger_keys[0]).arg(balances[0]),
                };
                let () = write
                    .query_async(&mut ledger)
                    .await
                    .expect("write the balances");
                let releasing = monotonic_ns();
                held.release().await;
                let released = monotonic_ns();
                let to = accounts.last().copied().unwrap_or(from);
                lines.push(format!(
                    "t {from} {to} {asked} {acquired} {releasing} {released}"
                ));
            }
            Err(error) => lines.push(format!("failed {asked} {}", error.replace('\n', " "))),
        }
    }
    let cpu = process_cpu() - cpu_before;
    lines.push(format!("cpu {}", cpu.as_nanos()));
    lines.push("done\n".to_owned());
    stdout
        .write_all(lines.join("\n").as_bytes())
        .await
        .expect("write the transfers");
    stdout.flush().await.expect("flush the transfers");
    // Connected until the parent has read Redis's counters; it closes stdin to end us.
    while let Ok(Some(_)) = stdin.next_line().await {}
}

// ----------------------------------------------------------------------------------
// The parent.

/// One transfer (or single-key acquisition), in [`monotonic_ns`]; `to == from` for one key.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    from: usize,
    to: usize,
    asked: u64,
    acquired: u64,
    releasing: u64,
    released: u64,
}

/// Redis's counters at one moment.
struct Counters {
    /// `INFO commandstats`: name → (calls, usec).
    commands: BTreeMap<String, (f64, f64)>,
    total_commands: f64,
    /// `used_cpu_user + used_cpu_sys`, seconds.
    cpu: f64,
}

/// `INFO commandstats`, `INFO cpu` and `INFO stats` in one round trip.
async fn counters(connection: &mut redis::aio::MultiplexedConnection) -> Counters {
    let (stats, cpu, totals): (String, String, String) = redis::pipe()
        .cmd("INFO")
        .arg("commandstats")
        .cmd("INFO")
        .arg("cpu")
        .cmd("INFO")
        .arg("stats")
        .query_async(connection)
        .await
        .expect("INFO commandstats, cpu, stats");
    let commands = stats
        .lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
        })
        .collect();
    let field = |text: &str, wanted: &[&str]| -> f64 {
        text.lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                wanted
                    .contains(&name)
                    .then(|| value.trim().parse::<f64>().ok())?
            })
            .sum()
    };
    Counters {
        commands,
        total_commands: field(&totals, &["total_commands_processed"]),
        cpu: field(&cpu, &["used_cpu_user", "used_cpu_sys"]),
    }
}

/// What one run (a library, a mode, a process count) observed.
#[derive(Debug, Default)]
struct Run {
    transfers: Vec<Transfer>,
    failed: usize,
    failures: Vec<String>,
    /// CPU time of every child over its loop.
    client_cpu: Duration,
    /// `total_commands_processed` over the loops, the benchmark's INFOs left out.
    commands: f64,
    /// Redis's CPU seconds over the loops.
    redis_cpu: f64,
    /// `INFO commandstats` over the loops: name → (calls, usec), INFO left out.
    by_command: BTreeMap<String, (f64, f64)>,
    /// The ledger's balances at the end.
    balances: Vec<i64>,
    /// From `go` to the last child's `done`.
    elapsed: Duration,
}

impl Run {
    fn count(&self) -> f64 {
        self.transfers.len().max(1) as f64
    }

    /// Transfers per second, from the first ask to the last release's reply.
    fn per_second(&self) -> f64 {
        let first = self.transfers.iter().map(|t| t.asked).min().unwrap_or(0);
        let last = self.transfers.iter().map(|t| t.released).max().unwrap_or(0);
        self.transfers.len() as f64 / (last.saturating_sub(first).max(1) as f64 / 1e9)
    }

    fn wait_p99_ms(&self) -> f64 {
        let waits: Vec<Duration> = self
            .transfers
            .iter()
            .map(|t| Duration::from_nanos(t.acquired - t.asked))
            .collect();
        micros(quantile(&waits, 0.99)) / 1e3
    }

    fn mean_hold_us(&self) -> f64 {
        let held: u64 = self
            .transfers
            .iter()
            .map(|t| t.releasing - t.acquired)
            .sum();
        held as f64 / self.count() / 1e3
    }

    /// Holds of an account that began before an earlier hold of it ended.
    fn violations(&self) -> usize {
        let mut violations = 0;
        for account in 0..ACCOUNTS {
            let mut holds: Vec<(u64, u64)> = self
                .transfers
                .iter()
                .filter(|t| t.from == account || t.to == account)
                .map(|t| (t.acquired, t.releasing))
                .collect();
            holds.sort_unstable();
            let mut end = 0;
            for (start, stop) in holds {
                if start < end {
                    violations += 1;
                }
                end = end.max(stop);
            }
        }
        violations
    }

    /// Accounts whose final balance is not what the reported transfers make it, and
    /// whether the sum is the opening sum.
    fn ledger_check(&self) -> (usize, bool) {
        let mut expected = [OPENING; ACCOUNTS];
        for t in &self.transfers {
            if t.from != t.to {
                expected[t.from] -= 1;
                expected[t.to] += 1;
            }
        }
        let off = expected
            .iter()
            .zip(&self.balances)
            .filter(|(e, b)| e != b)
            .count()
            + ACCOUNTS.saturating_sub(self.balances.len());
        let conserved = self.balances.iter().sum::<i64>() == OPENING * ACCOUNTS as i64;
        (off, conserved)
    }

    fn redis_cpu_us(&self) -> f64 {
        self.redis_cpu * 1e6 / self.count()
    }

    fn commands_per(&self) -> f64 {
        self.commands / self.count()
    }

    fn client_cpu_us(&self) -> f64 {
        micros(self.client_cpu) / self.count()
    }

    /// `EVALSHA 3.0 ×(45 µs), PUBLISH 1.0 ×(2 µs), …` per transfer, by calls.
    fn split(&self) -> String {
        let mut items: Vec<(&String, &(f64, f64))> = self.by_command.iter().collect();
        items.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        items
            .iter()
            .map(|(name, (calls, usec))| {
                format!(
                    "{} ×{} ({} µs)",
                    name.to_ascii_uppercase(),
                    number(calls / self.count()),
                    number(usec / self.count())
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `processes` children of `library` in `mode`, started together.
async fn run_once(
    bench: &mut Bench,
    ledger: &mut redis::aio::MultiplexedConnection,
    ledger_url: &str,
    library: &str,
    mode: Mode,
    processes: usize,
    transfers: usize,
) -> Run {
    let prefix = format!("bench:multi:{library}:{}:{processes}", mode.name());
    let mut opening = redis::cmd("MSET");
    for account in 0..ACCOUNTS {
        opening.arg(ledger_key(account)).arg(OPENING);
    }
    let () = opening.query_async(ledger).await.expect("open the ledger");
    let exe = std::env::current_exe().expect("the benchmark binary");
    let mut children = Vec::with_capacity(processes);
    for index in 0..processes {
        let spec = Spec {
            library: library.to_owned(),
            mode,
            url: bench.url.clone(),
            ledger_url: ledger_url.to_owned(),
            prefix: prefix.clone(),
            index,
            transfers,
            seed: 0x9E37_79B9_7F4A_7C15 ^ (((processes as u64) << 32) | (index as u64 + 1)),
        };
        let mut child = Command::new(&exe)
            .env(CHILD_ENV, spec.encode())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a multi-key child");
        let stdin = child.stdin.take().expect("the child's stdin");
        let stdout = BufReader::new(child.stdout.take().expect("the child's stdout")).lines();
        children.push(Running {
            child,
            stdin,
            stdout,
        });
    }
    for running in &mut children {
        read_until(running, "ready").await;
    }
    let before = counters(&mut bench.ping).await;
    let started = std::time::Instant::now();
    for running in &mut children {
        running.stdin.write_all(b"go\n").await.expect("send go");
        running.stdin.flush().await.expect("send go");
    }
    let mut run = Run::default();
    for running in children.iter_mut() {
        for line in read_until(running, "done").await {
            let mut fields = line.split(' ');
            match fields.next() {
                Some("t") => {
                    let mut next = || -> u64 {
                        fields
                            .next()
                            .and_then(|f| f.parse().ok())
                            .unwrap_or_else(|| panic!("bad transfer line {line:?}"))
                    };
                    run.transfers.push(Transfer {
                        from: next() as usize,
                        to: next() as usize,
                        asked: next(),
                        acquired: next(),
                        releasing: next(),
                        released: next(),
                    });
                }
                Some("failed") => {
                    run.failed += 1;
                    if run.failures.len() < 3 {
                        run.failures.push(line.clone());
                    }
                }
                Some("cpu") => {
                    let nanos: u64 = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
                    run.client_cpu += Duration::from_nanos(nanos);
                }
                _ => panic!("unexpected line from a multi-key child: {line:?}"),
            }
        }
    }
    run.elapsed = started.elapsed();
    let after = counters(&mut bench.ping).await;
    // The INFOs of both readings are the benchmark's: counted by name and left out.
    let info_calls = |c: &Counters| c.commands.get("info").map_or(0.0, |v| v.0);
    run.commands =
        after.total_commands - before.total_commands - (info_calls(&after) - info_calls(&before));
    run.redis_cpu = after.cpu - before.cpu;
    for (name, &(calls, usec)) in &after.commands {
        if name == "info" {
            continue;
        }
        let (calls0, usec0) = before.commands.get(name).copied().unwrap_or((0.0, 0.0));
        if calls > calls0 {
            run.by_command
                .insert(name.clone(), (calls - calls0, usec - usec0));
        }
    }
    let keys: Vec<String> = (0..ACCOUNTS).map(ledger_key).collect();
    run.balances = redis::cmd("MGET")
        .arg(keys.as_slice())
        .query_async(ledger)
        .await
        .expect("read the ledger");
    for mut running in children {
        drop(running.stdin);
        let status = tokio::time::timeout(CHILD_LIMIT, running.child.wait())
            .await
            .expect("a multi-key child did not exit")
            .expect("wait for a multi-key child");
        assert!(status.success(), "a multi-key child failed: {status}");
    }
    run
}

/// Per process count: transfers and single keys of each library; rows and notes.
pub async fn run(bench: &mut Bench, transfers: Option<usize>) {
    let transfers = transfers.unwrap_or((TRANSFERS / bench.scale).max(5));
    let ledger_server = redlock_testkit::RedisServer::start();
    let ledger_url = ledger_server.url();
    let mut ledger = redis::Client::open(ledger_url.as_str())
        .expect("the ledger's URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the ledger");
    for processes in PROCESSES {
        bench.progress(&format!("multi_key, {processes} processes"));
        let mut runs = BTreeMap::new();
        for mode in [Mode::Transfer, Mode::Single] {
            for library in ["redlock", "rslock"] {
                let run = run_once(
                    bench,
                    &mut ledger,
                    &ledger_url,
                    library,
                    mode,
                    processes,
                    transfers,
                )
                .await;
                runs.insert((mode.name(), library), run);
            }
        }
        let a = &runs[&("transfer", "redlock")];
        let b = &runs[&("transfer", "rslock")];
        let sa = &runs[&("single", "redlock")];
        let sb = &runs[&("single", "rslock")];
        let violations = [a.violations(), b.violations()];
        let single_violations = [sa.violations(), sb.violations()];
        bench.violations[0] += violations[0] + single_violations[0];
        bench.violations[1] += violations[1] + single_violations[1];
        let (off_a, conserved_a) = a.ledger_check();
        let (off_b, conserved_b) = b.ledger_check();
        let clean = violations[0] == 0 && a.failed == 0 && off_a == 0 && conserved_a;
        let scenario = format!(
            "{processes} processes × {transfers} transfers between 2 of {ACCOUNTS} accounts"
        );
        let id = |name: &str| format!("multi_key.{name}.processes_{processes}");

        let (ta, tb) = (a.per_second(), b.per_second());
        bench.report.add(Figure {
            id: id("transfers_per_second"),
            scenario: format!("{scenario}: transfers/s"),
            redlock: Some(ta),
            rslock: Some(tb),
            unit: "/s",
            limit: format!(
                "mean hold {} µs (rslock {} µs)",
                number(a.mean_hold_us()),
                number(b.mean_hold_us())
            ),
            ratio: format!("{} × rslock", number(ta / tb)),
            target: "≥ 1.5 × rslock".into(),
            verdict: Verdict::of(clean && ta / tb >= 1.5),
        });
        bench.report.add(Figure {
            id: id("wait_p99"),
            scenario: format!("{processes} processes: transfer's wait p99 (ask → both keys held)"),
            redlock: Some(a.wait_p99_ms()),
            rslock: Some(b.wait_p99_ms()),
            unit: "ms",
            limit: format!(
                "single key: {} ms (rslock {})",
                number(sa.wait_p99_ms()),
                number(sb.wait_p99_ms())
            ),
            ratio: format!("{} × rslock", number(a.wait_p99_ms() / b.wait_p99_ms())),
            target: "-".into(),
            verdict: Verdict::Info,
        });
        let (ca, cb) = (a.redis_cpu_us(), b.redis_cpu_us());
        let (csa, csb) = (sa.redis_cpu_us(), sb.redis_cpu_us());
        bench.report.add(Figure {
            id: id("redis_cpu_per_transfer_us"),
            scenario: format!(
                "{processes} processes: Redis CPU per transfer (INFO cpu user+sys, from the common start)"
            ),
            redlock: Some(ca),
            rslock: Some(cb),
            unit: "µs",
            limit: format!(
                "one single-key acquisition {} µs (rslock {} µs)",
                number(csa),
                number(csb)
            ),
            ratio: format!("{} × single (rslock {})", number(ca / csa), number(cb / csb)),
            target: "≤ 2 × single".into(),
            verdict: Verdict::of(clean && ca / csa <= 2.0),
        });
        let (na, nb) = (a.commands_per(), b.commands_per());
        let (nsa, nsb) = (sa.commands_per(), sb.commands_per());
        bench.report.add(Figure {
            id: id("commands_per_transfer"),
            scenario: format!(
                "{processes} processes: Redis commands per transfer (total_commands_processed, scripts' calls included)"
            ),
            redlock: Some(na),
            rslock: Some(nb),
            unit: "",
            limit: format!(
                "one single-key acquisition {} (rslock {})",
                number(nsa),
                number(nsb)
            ),
            ratio: format!("{} × single (rslock {})", number(na / nsa), number(nb / nsb)),
            target: "-".into(),
            verdict: Verdict::Info,
        });
        bench.report.add(Figure {
            id: id("single_key_per_second"),
            scenario: format!(
                "{processes} processes: one key per acquisition (the same harness), acquisitions/s"
            ),
            redlock: Some(sa.per_second()),
            rslock: Some(sb.per_second()),
            unit: "/s",
            limit: "-".into(),
            ratio: format!("{} × rslock", number(sa.per_second() / sb.per_second())),
            target: "-".into(),
            verdict: Verdict::Info,
        });
        bench.report.add(Figure {
            id: id("client_cpu_per_transfer_us"),
            scenario: format!(
                "{processes} processes: client CPU per transfer, all processes' loops (user+sys)"
            ),
            redlock: Some(a.client_cpu_us()),
            rslock: Some(b.client_cpu_us()),
            unit: "µs",
            limit: format!(
                "single key {} µs (rslock {} µs)",
                number(sa.client_cpu_us()),
                number(sb.client_cpu_us())
            ),
            ratio: format!("{} × rslock", number(a.client_cpu_us() / b.client_cpu_us())),
            target: "-".into(),
            verdict: Verdict::Info,
        });
        bench.report.add(Figure {
            id: id("violations"),
            scenario: format!(
                "{processes} processes: violations (overlapping holds of an account)"
            ),
            redlock: Some(violations[0] as f64),
            rslock: Some(violations[1] as f64),
            unit: "",
            limit: "0".into(),
            ratio: format!(
                "single key: {} (rslock {})",
                single_violations[0], single_violations[1]
            ),
            target: "0".into(),
            verdict: Verdict::of(violations[0] == 0 && single_violations[0] == 0),
        });
        bench.report.add(Figure {
            id: id("timeouts"),
            scenario: format!(
                "{processes} processes: timeouts and failed acquisitions (wait {} s: a deadlock would end here)",
                WAIT.as_secs()
            ),
            redlock: Some(a.failed as f64),
            rslock: Some(b.failed as f64),
            unit: "",
            limit: "0".into(),
            ratio: format!("single key: {} (rslock {})", sa.failed, sb.failed),
            target: "0".into(),
            verdict: Verdict::of(a.failed == 0 && sa.failed == 0),
        });
        bench.report.add(Figure {
            id: id("ledger_accounts_off"),
            scenario: format!(
                "{processes} processes: ledger accounts off the reported transfers (non-atomic read-modify-write under the locks)"
            ),
            redlock: Some(off_a as f64),
            rslock: Some(off_b as f64),
            unit: "",
            limit: "0".into(),
            ratio: format!(
                "balances conserved: {} (rslock {}); single key off {} (rslock {})",
                if conserved_a { "yes" } else { "NO" },
                if conserved_b { "yes" } else { "NO" },
                sa.ledger_check().0,
                sb.ledger_check().0
            ),
            target: "0, conserved".into(),
            verdict: Verdict::of(off_a == 0 && conserved_a),
        });
        for ((mode, library), run) in &runs {
            bench.report.note(format!(
                "multi_key, {processes} processes, {library} {mode}: {} done, {} failed{}; \
                 go → last done {} ms; Redis CPU {} ms, commands {}; per {}: {}",
                run.transfers.len(),
                run.failed,
                if run.failures.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", run.failures.join("; "))
                },
                number(run.elapsed.as_secs_f64() * 1e3),
                number(run.redis_cpu * 1e3),
                run.commands,
                if *mode == "transfer" {
                    "transfer"
                } else {
                    "acquisition"
                },
                run.split()
            ));
        }
    }
    bench.report.note(format!(
        "multi_key: redlock takes both keys with lock_all([from, to]) (drawn order; it \
         sorts them), a fixed lease of {} s (no watchdog), wait {} s; rslock 0.10 \
         (LockManager defaults: 3 tries up to 200 ms apart, `acquire` looping) takes them \
         sorted, one after the other, and releases both at once. Each transfer reads both \
         balances from a ledger on a second redis-server, sleeps {} µs (tokio rounds it up \
         to about 1 ms) and writes them back; the lock server sees only the locks. \
         Redis CPU and commands from the processes' common start (go) to the last child's \
         done, the benchmark's INFOs left out; 'single' is the same harness with the \
         from account alone",
        LEASE.as_secs(),
        WAIT.as_secs(),
        HOLD.as_micros()
    ));
}
