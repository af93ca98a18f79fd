//! History checks of the shared primitives on one server, with four processes of many
//! tasks each: every hold is recorded as an interval of the machine's monotonic clock
//! (read inside the hold: after the acquire returned, before the release was sent, so a
//! recorded interval lies within the real hold), pushed to a list on the same
//! throwaway server, and the parent checks the whole history afterwards.
//!
//! - Read-write: no write overlaps any other hold (read or write); reads do overlap,
//!   across processes too; a write's fencing token is above that of every hold that
//!   ended before it started.
//! - Semaphore of 3: never more than 3 holders at once, and 3 at some point.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError};
use redlock_testkit::RedisServer;

/// The child tests this file's parents run in rerun copies of the test binary: keep
/// them equal to the names of the functions below.
const RW_CHILD: &str = "child_read_write_holds";
const SEMAPHORE_CHILD: &str = "child_semaphore_holds";

const PROCESSES: usize = 4;
const TASKS_PER_PROCESS: usize = 6;
const PERMITS: u32 = 3;

/// The list every hold is pushed to: `kind process start_ns end_ns token released`
/// (`released`: 1 when its release said it was still held, 0 when it said `Lost`).
const HISTORY: &str = "history";

/// The machine's monotonic clock in ns: one clock for every process of the machine.
fn now_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Permit,
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    kind: Kind,
    process: usize,
    start: u64,
    end: u64,
    token: u64,
    /// Its release returned `Ok` (not `LockError::Lost`).
    released: bool,
}

impl Hold {
    fn encode(&self) -> String {
        let kind = match self.kind {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Permit => "permit",
        };
        format!(
            "{kind} {} {} {} {} {}",
            self.process, self.start, self.end, self.token, self.released as u8
        )
    }

    fn decode(line: &str) -> Hold {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 6, "a history line: {line:?}");
        let kind = match fields[0] {
            "read" => Kind::Read,
            "write" => Kind::Write,
            "permit" => Kind::Permit,
            other => panic!("unknown kind {other:?}"),
        };
        let number = |i: usize| fields[i].parse::<u64>().expect(line);
        Hold {
            kind,
            process: number(1) as usize,
            start: number(2),
            end: number(3),
            token: number(4),
            released: number(5) == 1,
        }
    }

    fn overlaps(&self, other: &Hold) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The largest number of holds (of those `counted`) whose recorded intervals overlap at
/// one instant, and whether such a peak of 2 or more had holds of several processes.
fn peak_concurrency(holds: &[Hold], counted: impl Fn(&Hold) -> bool) -> (usize, bool) {
    // Ends sort before starts at the same instant: touching intervals do not overlap.
    let mut events: Vec<(u64, bool, usize)> = holds
        .iter()
        .filter(|hold| counted(hold))
        .flat_map(|hold| {
            [
                (hold.start, true, hold.process),
                (hold.end, false, hold.process),
            ]
        })
        .collect();
    events.sort_by_key(|&(at, starts, _)| (at, starts));
    let mut inside = [0usize; PROCESSES];
    let (mut peak, mut across) = (0, false);
    for (_, starts, process) in events {
        if starts {
            inside[process] += 1;
        } else {
            inside[process] -= 1;
        }
        let now: usize = inside.iter().sum();
        peak = peak.max(now);
        if now >= 2 && inside.iter().filter(|&&n| n > 0).count() >= 2 {
            across = true;
        }
    }
    (peak, across)
}

/// Reruns this test binary with only `test`, once per process, with `env` and its index.
fn spawn_children(test: &str, url: &str, rounds: usize) -> Vec<ChildProcess> {
    (0..PROCESSES)
        .map(|index| {
            let child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .env("REDLOCK_TEST_CHILD_URL", url)
                .env("REDLOCK_TEST_CHILD_INDEX", index.to_string())
                .env("REDLOCK_TEST_CHILD_ROUNDS", rounds.to_string())
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn a child process");
            ChildProcess(child)
        })
        .collect()
}

/// A child process, killed if the test ends before it does.
struct ChildProcess(Child);

impl ChildProcess {
    fn wait_success(mut self) {
        let status = self.0.wait().unwrap();
        assert!(status.success(), "a child process failed: {status}");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The child's settings, or `None` when this is not a child process.
fn child_settings() -> Option<(String, usize, usize)> {
    let url = std::env::var("REDLOCK_TEST_CHILD_URL").ok()?;
    let index = std::env::var("REDLOCK_TEST_CHILD_INDEX")
        .ok()?
        .parse()
        .ok()?;
    let rounds = std::env::var("REDLOCK_TEST_CHILD_ROUNDS")
        .ok()?
        .parse()
        .ok()?;
    Some((url, index, rounds))
}

async fn child_client(url: &str, index: usize) -> LockClient {
    LockClient::builder(url)
        .name(format!("history-child-{index}"))
        // Watchdog-mode holds (every other round) are renewed well within their lease.
        .watchdog_lease(Duration::from_secs(5))
        .renew_every(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect")
}

async fn history(url: &str) -> Vec<Hold> {
    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let lines: Vec<String> = redis.lrange(HISTORY, 0, -1).await.unwrap();
    lines.iter().map(|line| Hold::decode(line)).collect()
}

/// Every key left on the server but the history list.
fn keys_left(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server
        .cli(&["KEYS", "*"])
        .lines()
        .map(str::trim)
        .filter(|key| !key.is_empty() && *key != HISTORY)
        .filter(|key| !expiring_hand_off_evidence(server, key))
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

/// A hand-off's evidence (`redlock:forced:<key>` reading `handed:<owner>`): it expires
/// within three response timeouts (3 s by default) and a second, so it is not left behind.
fn expiring_hand_off_evidence(node: &RedisServer, key: &str) -> bool {
    key.contains("redlock:forced:")
        && node.cli(&["GET", key]).starts_with("handed:")
        && node
            .cli(&["PTTL", key])
            .trim()
            .parse::<i64>()
            .is_ok_and(|ms| (1..=10_000).contains(&ms))
}

/// Run by `four_processes_of_readers_and_writers_keep_a_clean_history` in each child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_read_write_holds() {
    let Some((url, index, rounds)) = child_settings() else {
        return;
    };
    let client = child_client(&url, index).await;
    let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
        .map(|task| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                let mut log = redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                for round in 0..rounds {
                    let kind = if rand::random_range(0..10) < 3 {
                        Kind::Write
                    } else {
                        Kind::Read
                    };
                    let request = match kind {
                        Kind::Read => client.read_lock("doc"),
                        _ => client.write_lock("doc"),
                    }
                    .wait(Duration::from_secs(60));
                    // Half fixed leases, half watchdog mode.
                    let request = if (round + task) % 2 == 0 {
                        request.lease(Duration::from_secs(10))
                    } else {
                        request
                    };
                    let guard = request.acquire().await.expect("acquire within the wait");
                    let start = now_ns();
                    let hold_us = match kind {
                        Kind::Read => rand::random_range(500..6_000),
                        _ => rand::random_range(0..2_000),
                    };
                    tokio::time::sleep(Duration::from_micros(hold_us)).await;
                    let end = now_ns();
                    let token = guard.fencing_token();
                    // Checked by the parent after the history (see `released`).
                    let released = match guard.release().await {
                        Ok(()) => true,
                        Err(LockError::Lost { .. }) => false,
                        Err(error) => panic!("release failed: {error}"),
                    };
                    let hold = Hold {
                        kind,
                        process: index,
                        start,
                        end,
                        token,
                        released,
                    };
                    let _: () = log.rpush(HISTORY, hold.encode()).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task of the child failed");
    }
}

#[tokio::test]
async fn four_processes_of_readers_and_writers_keep_a_clean_history() {
    let server = RedisServer::start();
    let started = Instant::now();
    let rounds = 40;
    for child in spawn_children(RW_CHILD, &server.url(), rounds) {
        child.wait_success();
    }
    let holds = history(&server.url()).await;
    assert_eq!(holds.len(), PROCESSES * TASKS_PER_PROCESS * rounds);
    let writes: Vec<&Hold> = holds.iter().filter(|h| h.kind == Kind::Write).collect();
    let reads = holds.len() - writes.len();
    assert!(
        !writes.is_empty() && reads > 0,
        "{} writes, {reads} reads",
        writes.len()
    );

    // No write overlaps any other hold.
    for (i, write) in holds.iter().enumerate() {
        if write.kind != Kind::Write {
            continue;
        }
        for (j, other) in holds.iter().enumerate() {
            assert!(
                i == j || !write.overlaps(other),
                "a write overlaps another hold: {write:?} and {other:?}"
            );
        }
    }

    // A write's token is above that of every hold that ended before it started.
    for write in &writes {
        for earlier in holds.iter().filter(|h| h.end < write.start) {
            assert!(
                write.token > earlier.token,
                "the write {write:?} has a token below the earlier hold {earlier:?}"
            );
        }
    }
    let mut tokens: Vec<u64> = holds.iter().map(|h| h.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), holds.len(), "two holds had the same token");

    // Readers really share: several at once, of several processes.
    let (peak, across) = peak_concurrency(&holds, |h| h.kind == Kind::Read);
    println!(
        "read/write history: {} holds ({} writes, {reads} reads), at most {peak} readers at \
         once, in {:?}",
        holds.len(),
        writes.len(),
        started.elapsed()
    );
    assert!(peak >= 2, "readers never overlapped (peak {peak})");
    assert!(across, "readers of different processes never overlapped");

    assert_eq!(
        keys_left(&server),
        vec!["redlock:fence".to_owned()],
        "only the fencing counter is left"
    );

    // Every hold was released while still held: its lease (10 s, or a watchdog's) never
    // ran out during a hold of a few ms, so a release must not say `Lost`.
    let lost: Vec<&Hold> = holds.iter().filter(|h| !h.released).collect();
    let lost_writes = lost.iter().filter(|h| h.kind == Kind::Write).count();
    assert!(
        lost.is_empty(),
        "{} of {} releases said Lost ({lost_writes} of them writes), though each hold lasted a \
         few ms under a 10 s lease or a watchdog; e.g. {:?}",
        lost.len(),
        holds.len(),
        &lost[..lost.len().min(3)]
    );
}

/// Run by `four_processes_never_hold_more_permits_than_the_semaphore_has` in each child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_semaphore_holds() {
    let Some((url, index, rounds)) = child_settings() else {
        return;
    };
    let client = child_client(&url, index).await;
    let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
        .map(|task| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                let mut log = redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                for round in 0..rounds {
                    let request = client
                        .semaphore("partner-api", PERMITS)
                        .wait(Duration::from_secs(60));
                    let request = if (round + task) % 2 == 0 {
                        request.lease(Duration::from_secs(10))
                    } else {
                        request
                    };
                    let guard = request.acquire().await.expect("a permit within the wait");
                    let start = now_ns();
                    tokio::time::sleep(Duration::from_micros(rand::random_range(1_000..8_000)))
                        .await;
                    let end = now_ns();
                    let token = guard.fencing_token();
                    let released = match guard.release().await {
                        Ok(()) => true,
                        Err(LockError::Lost { .. }) => false,
                        Err(error) => panic!("release failed: {error}"),
                    };
                    let hold = Hold {
                        kind: Kind::Permit,
                        process: index,
                        start,
                        end,
                        token,
                        released,
                    };
                    let _: () = log.rpush(HISTORY, hold.encode()).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task of the child failed");
    }
}

#[tokio::test]
async fn four_processes_never_hold_more_permits_than_the_semaphore_has() {
    let server = RedisServer::start();
    let started = Instant::now();
    let rounds = 30;
    for child in spawn_children(SEMAPHORE_CHILD, &server.url(), rounds) {
        child.wait_success();
    }
    let holds = history(&server.url()).await;
    assert_eq!(holds.len(), PROCESSES * TASKS_PER_PROCESS * rounds);
    let (peak, across) = peak_concurrency(&holds, |_| true);
    println!(
        "semaphore history: {} permits held, at most {peak} at once (of {PERMITS}), in {:?}",
        holds.len(),
        started.elapsed()
    );
    assert!(
        peak <= PERMITS as usize,
        "{peak} holders at once, above {PERMITS} permits"
    );
    assert_eq!(
        peak, PERMITS as usize,
        "the {PERMITS} permits were never all in use at once"
    );
    assert!(
        across,
        "permits were never held by several processes at once"
    );
    let lost = holds.iter().filter(|h| !h.released).count();
    assert_eq!(lost, 0, "releases said Lost of permits held a few ms");
    let mut tokens: Vec<u64> = holds.iter().map(|h| h.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), holds.len(), "two permits had the same token");
    assert_eq!(
        keys_left(&server),
        vec!["redlock:fence".to_owned()],
        "nothing but the fencing counter is left once no permit is held"
    );
}

/// The checker itself: it sees overlaps, peaks and holds of several processes.
#[test]
fn the_checker_sees_overlaps_and_peaks() {
    let hold = |kind, process, start, end| Hold {
        kind,
        process,
        start,
        end,
        token: 0,
        released: true,
    };
    let write = hold(Kind::Write, 0, 10, 20);
    assert!(write.overlaps(&hold(Kind::Read, 1, 19, 30)));
    assert!(write.overlaps(&hold(Kind::Read, 1, 0, 11)));
    assert!(write.overlaps(&hold(Kind::Read, 1, 12, 13)));
    assert!(!write.overlaps(&hold(Kind::Read, 1, 20, 30)), "touching");
    assert!(!write.overlaps(&hold(Kind::Read, 1, 0, 10)), "touching");
    let reads = [
        hold(Kind::Read, 0, 0, 10),
        hold(Kind::Read, 0, 5, 15),
        hold(Kind::Read, 2, 8, 12),
        hold(Kind::Read, 3, 12, 20),
    ];
    assert_eq!(peak_concurrency(&reads, |_| true), (3, true));
    assert_eq!(peak_concurrency(&reads[..2], |_| true), (2, false));
    assert_eq!(peak_concurrency(&reads[2..], |_| true), (1, false));
    let encoded = Hold {
        token: 42,
        released: false,
        ..reads[2]
    };
    let decoded = Hold::decode(&encoded.encode());
    assert_eq!(
        (decoded.kind, decoded.process, decoded.start, decoded.end),
        (Kind::Read, 2, 8, 12)
    );
    assert_eq!((decoded.token, decoded.released), (42, false));
}
