//! Grants: a release that makes the next waiter in line — another process, with a
//! client of its own — the holder at once, and tells only that waiter. The waiter holds
//! the key with no round trip of its own, the others are not woken, and a grant nobody
//! picks up (its waiter killed, stopped, timed out or cancelled at that moment) costs
//! the others about `reservation_grace` (100 ms) plus a round trip, never the lease.
//!
//! Each "instance" is a child process: this test binary run again with only
//! [`CHILD_TEST`] and a Redis spec in [`CHILD_ENV`]. It reads commands on its stdin
//! (acquire, release, …) and answers on its stdout with lines starting with [`MARK`];
//! it timestamps, with the system clock (shared by every process of the machine), its
//! calls and the runtime's timing events `script_sent` (an acquire attempt's script
//! sent) and `news_received` (a pub/sub message delivered to the client), which the
//! test then counts per process and per window of time. Bounds are correctness bounds
//! with wide margins (a waiter not left asleep until the lease ends), never speed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redlock_runtime::{LockClient, LockError, LockGuard};
use redlock_testkit::{RedisCluster, RedisServer, SentinelSetup};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber, span};

/// The test an instance process runs: keep it equal to [`instance_process`]'s name.
const CHILD_TEST: &str = "instance_process";

/// The `REDLOCK_URL`-style spec an instance connects to; unset in a normal run.
const CHILD_ENV: &str = "REDLOCK_GRANTS_INSTANCE";

/// What starts an instance's answers on its stdout (the test harness writes there too).
const MARK: &str = "@@ ";

/// The runtime's timing events' target.
const TIMING: &str = "redlock::timing";

/// The lease of every lock in these tests: what a waiter left asleep would cost.
const LEASE: Duration = Duration::from_secs(10);

/// How long, at most, a grant nobody picks up may keep the others waiting: the
/// documented bound is `reservation_grace` (100 ms) plus a round trip; this leaves a
/// wide margin for a loaded machine and stays far below [`LEASE`].
const PICK_UP_BOUND: Duration = Duration::from_secs(2);

/// How long, at most, the next waiter may take to hold the key after a release that
/// granted it: far below [`LEASE`], which is what a waiter not told would wait.
const GRANT_BOUND: Duration = Duration::from_secs(5);

/// How long an instance may take to answer anything (startup, a reply) on a machine
/// shared by several busy agents.
const ANSWER_LIMIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------
// The instance process.

/// The system clock in ns since the epoch: comparable across the test's processes.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos() as u64
}

/// Timing events with the system time they were seen at.
type Stamps = Arc<Mutex<Vec<(&'static str, u64)>>>;

/// A subscriber that timestamps the runtime's timing events and nothing else.
struct Recorder {
    stamps: Stamps,
}

impl Subscriber for Recorder {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && metadata.target() == TIMING
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
        let at = now_ns();
        // Fields are not needed: the name says which step it is.
        struct Ignore;
        impl Visit for Ignore {
            fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
        }
        event.record(&mut Ignore);
        self.stamps
            .lock()
            .unwrap()
            .push((event.metadata().name(), at));
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// Writes one answer line for the test.
fn say(words: &[String]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{MARK}{}", words.join(" "));
    let _ = out.flush();
}

macro_rules! say {
    ($($word:expr),* $(,)?) => { say(&[$($word.to_string()),*]) };
}

/// The name of an error's variant.
fn variant(error: &LockError) -> String {
    format!("{error:?}")
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Unknown")
        .to_string()
}

/// An instance: one client, at most one lock held, driven by commands on stdin:
/// - `acquire <write|read|permits:N> <key> <wait ms> <lease ms> <patience ms>`: answers `started
///   <ns>` at once, then `acquired <token> <ns> <is_lost> <lease_remaining ms>`, `failed <variant> <ns>`, or, when the
///   acquisition is dropped after `patience` (0: never), `cancelled <ns>`;
/// - `release` / `release_at <ns>` (at that system time): `released <start ns> <end
///   ns> <ok|Lost|…>`, or `released none` without a lock;
/// - `stall <ms>`: blocks the runtime's worker threads for that long (`stalling <ns>`
///   once they are);
/// - `status`: `status <is_lost> <lease_remaining ms>` of the lock held, or `status none`;
/// - `events`: `events <name>:<ns> …`, every timing event so far;
/// - `exit`, or the end of stdin (the test is gone): the process ends.
///
/// A no-op in a normal test run.
#[test]
fn instance_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let stamps = Stamps::default();
    tracing::subscriber::set_global_default(Recorder {
        stamps: stamps.clone(),
    })
    .expect("the instance's subscriber");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(serve(spec, stamps));
}

async fn serve(spec: String, stamps: Stamps) {
    let client = LockClient::builder_from_spec(&spec)
        .connect()
        .await
        .expect("the instance connects");
    let (commands, mut incoming) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if commands.send(line).is_err() {
                break;
            }
        }
    });
    let held: Arc<Mutex<Option<LockGuard>>> = Arc::default();
    say!("ready");
    while let Some(line) = incoming.recv().await {
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        match words.as_slice() {
            ["acquire", mode, key, wait, lease, patience] => {
                let ms = |text: &str| Duration::from_millis(text.parse().expect("ms"));
                let request = match (*mode, mode.strip_prefix("permits:")) {
                    (_, Some(permits)) => client.semaphore(*key, permits.parse().expect("permits")),
                    ("read", _) => client.read_lock(*key),
                    _ => client.lock(*key),
                }
                .wait(ms(wait))
                .lease(ms(lease));
                let patience = ms(patience);
                let held = held.clone();
                tokio::spawn(async move {
                    say!("started", now_ns());
                    let attempt = request.acquire();
                    let result = if patience.is_zero() {
                        Some(attempt.await)
                    } else {
                        tokio::time::timeout(patience, attempt).await.ok()
                    };
                    let at = now_ns();
                    match result {
                        None => say!("cancelled", at),
                        Some(Ok(guard)) => {
                            let token = guard.fencing_token();
                            let lost = guard.is_lost();
                            let remaining = guard.lease_remaining().as_millis();
                            // Kept before the answer: the test may release at once.
                            *held.lock().unwrap() = Some(guard);
                            say!("acquired", token, at, lost, remaining);
                        }
                        Some(Err(error)) => say!("failed", variant(&error), at),
                    }
                });
            }
            ["release"] => {
                tokio::spawn(release(held.clone(), None));
            }
            ["release_at", at] => {
                tokio::spawn(release(held.clone(), Some(at.parse().expect("ns"))));
            }
            ["stall", ms] => {
                // Both worker threads blocked: the runtime (its connections' readers
                // included) runs nothing for that long, as under a blocking call or a
                // starved CPU.
                let stall = Duration::from_millis(ms.parse().expect("ms"));
                let barrier = Arc::new(std::sync::Barrier::new(2));
                for first in [true, false] {
                    let barrier = barrier.clone();
                    tokio::spawn(async move {
                        barrier.wait();
                        if first {
                            say!("stalling", now_ns());
                        }
                        std::thread::sleep(stall);
                    });
                }
            }
            ["status"] => match &*held.lock().unwrap() {
                Some(guard) => say!(
                    "status",
                    guard.is_lost(),
                    guard.lease_remaining().as_millis()
                ),
                None => say!("status", "none"),
            },
            ["events"] => {
                let stamps = stamps.lock().unwrap().clone();
                let mut words = vec!["events".to_owned()];
                words.extend(stamps.iter().map(|(name, at)| format!("{name}:{at}")));
                say(&words);
            }
            ["exit"] => break,
            _ => panic!("unknown command {line:?}"),
        }
    }
}

/// Releases the lock held, at system time `at` if given.
async fn release(held: Arc<Mutex<Option<LockGuard>>>, at: Option<u64>) {
    if let Some(at) = at {
        tokio::time::sleep(Duration::from_nanos(at.saturating_sub(now_ns()))).await;
    }
    let Some(guard) = held.lock().unwrap().take() else {
        say!("released", "none");
        return;
    };
    let start = now_ns();
    let result = guard.release().await;
    let end = now_ns();
    let outcome = match &result {
        Ok(()) => "ok".to_owned(),
        Err(error) => variant(error),
    };
    say!("released", start, end, outcome);
}

// ---------------------------------------------------------------------------------
// The test's side.

/// One answer of an instance.
#[derive(Debug, Clone)]
struct Reply {
    kind: String,
    fields: Vec<String>,
}

impl Reply {
    fn number(&self, index: usize) -> u64 {
        self.fields
            .get(index)
            .and_then(|field| field.parse().ok())
            .unwrap_or_else(|| panic!("no number at {index} in {self:?}"))
    }
}

/// What an `acquire` came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Acquired { token: u64, at: u64 },
    Failed { timeout: bool, at: u64 },
    Cancelled { at: u64 },
}

/// An instance process, killed on drop (so a failing test leaves none behind).
struct Instance {
    name: String,
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::Receiver<Reply>,
    pending: Vec<Reply>,
}

impl Instance {
    /// Starts an instance connected to `spec` and waits until it has connected.
    fn start(name: &str, spec: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start an instance");
        let stdin = child.stdin.take().expect("its stdin");
        let stdout = child.stdout.take().expect("its stdout");
        let (sender, replies) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness's `test instance_process ... ` may start the first line.
                let Some((_, answer)) = line.split_once(MARK) else {
                    continue;
                };
                let mut words = answer.split_whitespace().map(str::to_owned);
                let kind = words.next().unwrap_or_default();
                if sender
                    .send(Reply {
                        kind,
                        fields: words.collect(),
                    })
                    .is_err()
                {
                    break;
                }
            }
        });
        let mut instance = Instance {
            name: name.to_owned(),
            child,
            stdin,
            replies,
            pending: Vec::new(),
        };
        instance.expect(&["ready"], ANSWER_LIMIT);
        instance
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|error| panic!("{} took no command: {error}", self.name));
    }

    /// Takes the first answer of one of `kinds` that came or comes within `limit`.
    fn poll(&mut self, kinds: &[&str], limit: Duration) -> Option<Reply> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(at) = self
                .pending
                .iter()
                .position(|reply| kinds.contains(&reply.kind.as_str()))
            {
                return Some(self.pending.remove(at));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.replies.recv_timeout(left) {
                Ok(reply) => self.pending.push(reply),
                Err(_) => return None,
            }
        }
    }

    fn expect(&mut self, kinds: &[&str], limit: Duration) -> Reply {
        self.poll(kinds, limit).unwrap_or_else(|| {
            panic!(
                "{} gave no {kinds:?} within {limit:?} (other answers: {:?})",
                self.name, self.pending
            )
        })
    }

    /// Starts an acquisition of `key`; returns the system time it started at.
    fn acquire(
        &mut self,
        mode: &str,
        key: &str,
        wait: Duration,
        patience: Option<Duration>,
    ) -> u64 {
        self.send(&format!(
            "acquire {mode} {key} {} {} {}",
            wait.as_millis(),
            LEASE.as_millis(),
            patience.map_or(0, |p| p.as_millis())
        ));
        self.expect(&["started"], ANSWER_LIMIT).number(0)
    }

    /// What the acquisition under way came to, within `limit`.
    fn outcome(&mut self, limit: Duration) -> Outcome {
        let reply = self.expect(&["acquired", "failed", "cancelled"], limit);
        match reply.kind.as_str() {
            "acquired" => Outcome::Acquired {
                token: reply.number(0),
                at: reply.number(1),
            },
            "failed" => Outcome::Failed {
                timeout: reply.fields[0] == "Timeout",
                at: reply.number(1),
            },
            _ => Outcome::Cancelled {
                at: reply.number(0),
            },
        }
    }

    /// The acquisition under way succeeded within `limit`: its token and when.
    fn acquired(&mut self, limit: Duration) -> (u64, u64) {
        match self.outcome(limit) {
            Outcome::Acquired { token, at } => (token, at),
            other => panic!("{}'s acquisition came to {other:?}", self.name),
        }
    }

    /// Acquires a free key: its fencing token.
    fn hold(&mut self, key: &str) -> u64 {
        self.acquire("write", key, Duration::from_secs(5), None);
        self.acquired(ANSWER_LIMIT).0
    }

    /// Releases its lock now; returns when the release started and ended.
    fn release(&mut self) -> (u64, u64) {
        self.send("release");
        self.released()
    }

    /// Releases its lock now, whatever the outcome (`Lost` included).
    fn release_any(&mut self) -> Reply {
        self.send("release");
        self.expect(&["released"], ANSWER_LIMIT)
    }

    fn released(&mut self) -> (u64, u64) {
        let reply = self.expect(&["released"], ANSWER_LIMIT);
        assert_eq!(
            reply.fields.get(2).map(String::as_str),
            Some("ok"),
            "{}'s release: {reply:?}",
            self.name
        );
        (reply.number(0), reply.number(1))
    }

    /// Its timing events so far: name, system time (ns).
    fn stamps(&mut self) -> Vec<(String, u64)> {
        self.send("events");
        let reply = self.expect(&["events"], ANSWER_LIMIT);
        reply
            .fields
            .iter()
            .filter_map(|field| {
                let (event, at) = field.split_once(':')?;
                Some((event.to_owned(), at.parse().ok()?))
            })
            .collect()
    }

    /// Its timing events named `name`, in `[from, to)` (system time, ns).
    fn events(&mut self, name: &str, from: u64, to: u64) -> usize {
        self.stamps()
            .iter()
            .filter(|(event, at)| event == name && (from..to).contains(at))
            .count()
    }

    fn signal(&self, name: &str) {
        redlock_testkit::signal(self.child.id(), name);
    }

    /// SIGKILL, and reap it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        self.kill();
    }
}

/// `a - b` as a duration, 0 when `b` is later.
fn since(a: u64, b: u64) -> Duration {
    Duration::from_nanos(a.saturating_sub(b))
}

/// Waits (polling) until `ready` holds; panics after `limit`, saying `what`.
fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How many wait on a key's waitlist, and how many clients listen for a grant of it
/// (one server, or a cluster).
type Waitlist<'a> = &'a dyn Fn(&str) -> (usize, usize);

/// How many wait on `key`'s waitlist on `server`, and listen for a grant of it.
fn waitlist_len(server: &RedisServer) -> impl Fn(&str) -> (usize, usize) + '_ {
    move |key| {
        let waiting = server
            .cli(&["ZCARD", &format!("redlock:waitlist:{key}")])
            .parse()
            .unwrap_or(0);
        let pattern = format!("redlock:granted:*:{key}");
        let listening = server
            .cli(&["PUBSUB", "CHANNELS", &pattern])
            .lines()
            .filter(|channel| !channel.trim().is_empty())
            .count();
        (waiting, listening)
    }
}

/// How long a waiter must have sent no acquire script, with every one answered, to
/// be taken for asleep (waiting for news).
const QUIET: Duration = Duration::from_millis(100);

/// Waits until `key`'s waitlist holds `len` waiters, as many clients listen for a
/// grant of it, and `waiter` (the last to join) is asleep: a waiter that has just
/// subscribed tries once more (a release may have come before its subscription), and
/// that attempt is no round trip after a release.
fn wait_in_line(waitlist: Waitlist<'_>, key: &str, len: usize, waiter: &mut Instance) {
    wait_until(ANSWER_LIMIT, &format!("{len} waiting on {key}"), || {
        waitlist(key) == (len, len)
    });
    wait_until(
        ANSWER_LIMIT,
        &format!("{} to wait quietly", waiter.name),
        || {
            let stamps = waiter.stamps();
            let at = |name: &str| -> Vec<u64> {
                stamps
                    .iter()
                    .filter(|(event, _)| event == name)
                    .map(|&(_, at)| at)
                    .collect()
            };
            let (sent, answered) = (at("script_sent"), at("script_answered"));
            let last = sent
                .iter()
                .chain(&answered)
                .max()
                .copied()
                .unwrap_or(u64::MAX);
            !sent.is_empty() && sent.len() == answered.len() && since(now_ns(), last) >= QUIET
        },
    );
}

/// Waits until Redis holds nothing but fencing counters (background clean-ups, and
/// companions' expiries, may take a moment); panics naming what is left. `keys` lists
/// every key (of every node).
fn wait_until_only_the_fence_is_left(keys: impl Fn() -> Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<String> = keys()
            .into_iter()
            .filter(|key| !key.is_empty() && !key.starts_with("redlock:fence"))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left in Redis after every lock was released: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every key of `server`.
fn keys_of(server: &RedisServer) -> impl Fn() -> Vec<String> + '_ {
    move || {
        server
            .cli(&["KEYS", "*"])
            .lines()
            .map(|key| key.trim().to_owned())
            .collect()
    }
}

// ---------------------------------------------------------------------------------
// The tests.

/// A holds `key`; B, in another process, waits for it (registered on the waitlist);
/// A releases: B holds the key without having sent an attempt of its own after the
/// release, with a fencing token above A's, long before A's lease would have ended.
/// Then, well past the grace, B's confirmation has made the lock B's for the whole
/// lease, in Redis (`pttl`: the key's time to live in ms) and for B's guard.
fn next_waiter_holds_without_a_round_trip(
    spec: &str,
    waitlist: Waitlist<'_>,
    pttl: &dyn Fn(&str) -> i64,
    key: &str,
) {
    let mut a = Instance::start("A", spec);
    let mut b = Instance::start("B", spec);
    let a_token = a.hold(key);
    b.acquire("write", key, Duration::from_secs(20), None);
    wait_in_line(waitlist, key, 1, &mut b);
    let (released_at, _) = a.release();
    let (b_token, b_at) = b.acquired(ANSWER_LIMIT);
    assert!(
        since(b_at, released_at) < GRANT_BOUND,
        "B held the key {:?} after A's release",
        since(b_at, released_at)
    );
    assert!(b_token > a_token, "B's token {b_token} <= A's {a_token}");
    eprintln!(
        "{key}: B held the key {} µs after A's release began",
        since(b_at, released_at).as_micros()
    );
    let attempts = b.events("script_sent", released_at, b_at);
    assert_eq!(
        attempts, 0,
        "B sent {attempts} acquire script(s) between A's release and holding the key"
    );
    let news = b.events("news_received", released_at, b_at + 1);
    assert!(news >= 1, "B held the key without being told (no message)");
    std::thread::sleep(Duration::from_millis(500));
    let left = pttl(key);
    assert!(
        left > LEASE.as_millis() as i64 / 2,
        "B's grant was not confirmed to its lease: the key lives {left} ms more"
    );
    b.send("status");
    let status = b.expect(&["status"], ANSWER_LIMIT);
    assert_eq!(
        status.fields[0], "false",
        "B's guard after its grant: {status:?}"
    );
    assert!(
        status.number(1) > LEASE.as_millis() as u64 / 2,
        "B's guard does not count on its confirmed lease: {status:?}"
    );
    b.release();
}

#[test]
fn the_next_waiter_in_another_process_holds_the_key_without_a_round_trip_of_its_own() {
    let server = RedisServer::start();
    let pttl = |key: &str| server.cli(&["PTTL", key]).parse().unwrap_or(-2);
    next_waiter_holds_without_a_round_trip(&server.url(), &waitlist_len(&server), &pttl, "k");
    wait_until_only_the_fence_is_left(keys_of(&server));
}

#[test]
fn a_grant_wakes_only_the_granted_client() {
    let server = RedisServer::start();
    let waitlist = waitlist_len(&server);
    let spec = server.url();
    let mut a = Instance::start("A", &spec);
    let mut line: Vec<Instance> = ["B", "C", "D"]
        .iter()
        .map(|name| Instance::start(name, &spec))
        .collect();
    let mut tokens = vec![a.hold("k")];
    for (place, waiter) in line.iter_mut().enumerate() {
        waiter.acquire("write", "k", Duration::from_secs(30), None);
        wait_in_line(&waitlist, "k", place + 1, waiter);
    }
    // Each holder in turn releases; the next in line must hold the key, and nobody
    // behind it may have heard of it (nor of the confirmation the new holder sends in
    // the background, which the pause before each release leaves time for) but the
    // waiter right behind it, told when the grant would lapse and that it will not.
    let (mut released_at, _) = a.release();
    for turn in 0..line.len() {
        let (token, at) = line[turn].acquired(ANSWER_LIMIT);
        assert!(
            since(at, released_at) < GRANT_BOUND,
            "waiter {turn} held the key {:?} after the release",
            since(at, released_at)
        );
        tokens.push(token);
        let news = line[turn].events("news_received", released_at, at + 1);
        assert!(
            news >= 1,
            "{} held the key without being told",
            line[turn].name
        );
        std::thread::sleep(Duration::from_millis(300));
        for later in &mut line[turn + 1..] {
            assert!(
                later
                    .poll(&["acquired", "failed"], Duration::ZERO)
                    .is_none(),
                "{} got the key out of turn (FIFO across processes)",
                later.name
            );
        }
        let (next_release, _) = line[turn].release();
        for later in turn + 1..line.len() {
            let woken = line[later].events("news_received", released_at, next_release);
            let attempts = line[later].events("script_sent", released_at, next_release);
            // The next in line alone is told when the grant would lapse (`N`) and that
            // it was confirmed (`C`) (issue 34). It attempts once if the confirmation
            // reached it after the grace (a loaded machine: seen in the suite), finding
            // the key held; nobody behind it hears anything or attempts.
            let (told, tries) = if later == turn + 1 { (2, 1) } else { (0, 0) };
            assert!(
                woken <= told && attempts <= tries,
                "{} was woken {woken} time(s), and attempted {attempts} time(s), by a \
                 release granted to {}",
                line[later].name,
                line[turn].name
            );
        }
        released_at = next_release;
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens A, B, C, D do not increase: {tokens:?}"
    );
    wait_until_only_the_fence_is_left(keys_of(&server));
}

/// A holds `key`, B then C wait; `fault` strikes B just before A releases; C must hold
/// the key within [`PICK_UP_BOUND`]. Returns C and its token, still holding.
fn grant_to_a_dead_waiter(
    spec: &str,
    waitlist: Waitlist<'_>,
    key: &str,
    fault: impl FnOnce(&mut Instance),
) -> (Instance, Instance, u64) {
    let mut a = Instance::start("A", spec);
    let mut b = Instance::start("B", spec);
    let mut c = Instance::start("C", spec);
    let a_token = a.hold(key);
    b.acquire("write", key, Duration::from_secs(30), None);
    wait_in_line(waitlist, key, 1, &mut b);
    c.acquire("write", key, Duration::from_secs(30), None);
    wait_in_line(waitlist, key, 2, &mut c);
    fault(&mut b);
    let (released_at, _) = a.release();
    let (c_token, c_at) = c.acquired(ANSWER_LIMIT);
    assert!(
        since(c_at, released_at) < PICK_UP_BOUND,
        "{key}: C held the key {:?} after A's release (the grant bound is reservation_grace + \
         a round trip; the lease is {LEASE:?})",
        since(c_at, released_at)
    );
    assert!(c_token > a_token, "C's token {c_token} <= A's {a_token}");
    eprintln!(
        "{key}: C held the key {} µs after A's release began",
        since(c_at, released_at).as_micros()
    );
    (b, c, c_token)
}

#[test]
fn a_granted_waiter_killed_just_before_the_release_costs_at_most_the_grace() {
    let server = RedisServer::start();
    let (spec, waitlist) = (server.url(), waitlist_len(&server));

    // Killed: the kernel closes its connections, Redis may or may not have seen it yet.
    let (_, mut c, _) = grant_to_a_dead_waiter(&spec, &waitlist, "killed", Instance::kill);
    c.release();

    // Stopped: Redis still sees its connections, the grant is delivered and never
    // confirmed; it lapses after the grace.
    let (mut b, mut c, _) =
        grant_to_a_dead_waiter(&spec, &waitlist, "stopped", |b| b.signal("STOP"));
    c.release();
    b.kill();
    wait_until_only_the_fence_is_left(keys_of(&server));
}

/// A waiter stalled as the key is granted to it, for a little longer than the grace,
/// finds on resuming a grant that lapsed and went to the next in line: its
/// acquisition must go on waiting, not hand it a lock another holds. Stalled by
/// SIGSTOP (the process), then by a blocked runtime (its worker threads busy).
#[test]
fn a_waiter_resumed_after_its_grant_lapsed_is_not_given_a_lock_another_holds() {
    let server = RedisServer::start();
    let (spec, waitlist) = (server.url(), waitlist_len(&server));
    let mut taken = Vec::new();
    for key in ["stopped", "blocked"] {
        let stall = |b: &mut Instance| {
            if key == "stopped" {
                b.signal("STOP");
            } else {
                b.send("stall 400");
                b.expect(&["stalling"], ANSWER_LIMIT);
            }
        };
        let (mut b, mut c, c_token) = grant_to_a_dead_waiter(&spec, &waitlist, key, stall);
        b.signal("CONT");
        if let Some(reply) = b.poll(&["acquired"], Duration::from_secs(1)) {
            taken.push(format!(
                "{key}: B, resumed, was given the key while C (token {c_token}) held it: \
                 {reply:?} (token, at, is_lost, lease_remaining ms); the key holds {:?}",
                server.cli(&["GET", key])
            ));
            b.release_any();
            c.release();
            continue;
        }
        let (c_released, _) = c.release();
        // B is still waiting (its wait is 30 s): it gets the key after C.
        match b.outcome(ANSWER_LIMIT) {
            Outcome::Acquired { token, at } => {
                assert!(
                    at >= c_released,
                    "{key}: B held the key before C released it"
                );
                assert!(token > c_token, "{key}: B's token {token} <= C's {c_token}");
                b.release();
            }
            other => panic!("{key}: B, resumed, did not get the key after C: {other:?}"),
        }
    }
    assert!(
        taken.is_empty(),
        "a lapsed grant was taken for a lock:\n{}",
        taken.join("\n")
    );
    wait_until_only_the_fence_is_left(keys_of(&server));
}

/// When A releases, relative to the end of B's wait (or patience), in ms: the race
/// between B giving up and the grant reaching it is a few ms wide.
const OFFSETS_MS: [i64; 7] = [-30, -3, -1, 0, 1, 3, 30];

#[test]
fn a_granted_waiter_that_timed_out_or_was_cancelled_passes_the_key_on() {
    granted_waiter_gives_up_and_the_next_gets_the_key("write");
}

#[test]
fn a_granted_reader_that_timed_out_or_was_cancelled_passes_its_share_on() {
    granted_waiter_gives_up_and_the_next_gets_the_key("read");
}

/// A holds the key, B (a `b_kind` waiter) is first in line and C (a writer) second; A
/// releases around the moment B gives up (its wait ends, or its acquisition is dropped),
/// so that B is granted the key (a share of it, for a reader) as it leaves, or just
/// after: C must get the key within the pick-up bound, and nothing be left behind.
fn granted_waiter_gives_up_and_the_next_gets_the_key(b_kind: &str) {
    let server = RedisServer::start();
    let waitlist = waitlist_len(&server);
    let spec = server.url();
    let mut a = Instance::start("A", &spec);
    let mut b = Instance::start("B", &spec);
    let mut c = Instance::start("C", &spec);
    // B's wait (or patience) ends this long after it started; A releases around then.
    let patience = Duration::from_millis(1000);
    let mut seen = Vec::new();
    for (round, offset_ms) in OFFSETS_MS.repeat(2).into_iter().enumerate() {
        let cancel = round >= OFFSETS_MS.len();
        let key = format!("k{round}");
        a.hold(&key);
        let b_started = if cancel {
            b.acquire(b_kind, &key, Duration::from_secs(30), Some(patience))
        } else {
            b.acquire(b_kind, &key, patience, None)
        };
        wait_in_line(&waitlist, &key, 1, &mut b);
        c.acquire("write", &key, Duration::from_secs(30), None);
        wait_in_line(&waitlist, &key, 2, &mut c);
        let release_at =
            (b_started + patience.as_nanos() as u64).saturating_add_signed(offset_ms * 1_000_000);
        let in_time = now_ns() < release_at;
        a.send(&format!("release_at {release_at}"));
        let (a_released, _) = a.released();
        // B either got the key just in time (then it releases it at once) or gave up.
        let b_outcome = b.outcome(ANSWER_LIMIT);
        let free_at = match b_outcome {
            Outcome::Acquired { .. } => b.release().0,
            Outcome::Failed { timeout, .. } => {
                assert!(timeout && !cancel, "B's acquisition: {b_outcome:?}");
                a_released
            }
            Outcome::Cancelled { .. } => {
                assert!(cancel, "B's acquisition: {b_outcome:?}");
                a_released
            }
        };
        let (_, c_at) = c.acquired(ANSWER_LIMIT);
        assert!(
            since(c_at, free_at) < PICK_UP_BOUND,
            "round {round} (B {}, release {offset_ms:+} ms from its end): C held the key \
             {:?} after it was free ({b_outcome:?})",
            if cancel { "cancelled" } else { "timed out" },
            since(c_at, free_at)
        );
        c.release();
        wait_until_only_the_fence_is_left(keys_of(&server));
        // Informative: a message reaching B after it gave up (a grant made to it that
        // it passed on), and how long C waited.
        let b_done = match b_outcome {
            Outcome::Acquired { at, .. }
            | Outcome::Failed { at, .. }
            | Outcome::Cancelled { at } => at,
        };
        let late_news = b.events("news_received", b_done, u64::MAX);
        seen.push(format!(
            "{offset_ms:+} ms {}{}: B {}, {late_news} message(s) after; C after {} µs",
            if cancel { "cancel" } else { "timeout" },
            if in_time { "" } else { " (late)" },
            match b_outcome {
                Outcome::Acquired { .. } => "held it",
                Outcome::Failed { .. } => "timed out",
                Outcome::Cancelled { .. } => "cancelled",
            },
            since(c_at, free_at).as_micros()
        ));
    }
    eprintln!(
        "release relative to the end of B's wait:\n{}",
        seen.join("\n")
    );
}

#[test]
fn readers_behind_a_writer_all_get_in_when_it_releases() {
    let server = RedisServer::start();
    let waitlist = waitlist_len(&server);
    let spec = server.url();
    let mut writer = Instance::start("A", &spec);
    let mut readers: Vec<Instance> = ["R1", "R2", "R3"]
        .iter()
        .map(|name| Instance::start(name, &spec))
        .collect();
    writer.acquire("write", "doc", Duration::from_secs(5), None);
    let (writer_token, _) = writer.acquired(ANSWER_LIMIT);
    for (place, reader) in readers.iter_mut().enumerate() {
        reader.acquire("read", "doc", Duration::from_secs(30), None);
        wait_in_line(&waitlist, "doc", place + 1, reader);
    }
    let (released_at, _) = writer.release();
    // Every reader holds its share before any lets go: together.
    for reader in &mut readers {
        let (token, at) = reader.acquired(ANSWER_LIMIT);
        assert!(
            since(at, released_at) < GRANT_BOUND,
            "{} got in {:?} after the writer's release",
            reader.name,
            since(at, released_at)
        );
        assert!(
            token > writer_token,
            "{}'s token {token} <= the writer's",
            reader.name
        );
    }
    for reader in &mut readers {
        reader.release();
    }
    wait_until_only_the_fence_is_left(keys_of(&server));
}

// ---------------------------------------------------------------------------------
// Cluster: the grant goes out on the key's shard (sharded pub/sub, SPUBLISH).

/// How many wait on `key`'s waitlist on `cluster`, and listen for a grant of it
/// (sharded channels): their names start with a hash tag the client picks for the
/// key's slot, so they are looked for on every node.
fn cluster_waitlist_len(cluster: &RedisCluster) -> impl Fn(&str) -> (usize, usize) + '_ {
    move |key| {
        let mut total = (0, 0);
        for node in &cluster.nodes {
            let names = node.cli(&["KEYS", &format!("*redlock:waitlist:{key}")]);
            total.0 += names
                .lines()
                .filter(|name| !name.trim().is_empty())
                .map(|name| node.cli(&["ZCARD", name.trim()]).parse().unwrap_or(0))
                .sum::<usize>();
            let pattern = format!("*redlock:granted:*:{key}");
            total.1 += node
                .cli(&["PUBSUB", "SHARDCHANNELS", &pattern])
                .lines()
                .filter(|channel| !channel.trim().is_empty())
                .count();
        }
        total
    }
}

/// Every key of every node of `cluster`.
fn cluster_keys(cluster: &RedisCluster) -> impl Fn() -> Vec<String> + '_ {
    move || {
        cluster
            .nodes
            .iter()
            .flat_map(|node| {
                node.cli(&["KEYS", "*"])
                    .lines()
                    .map(|key| key.trim().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

fn cluster_spec(cluster: &RedisCluster) -> String {
    format!("cluster:{}", cluster.urls().join(","))
}

#[test]
fn on_a_cluster_the_next_waiter_in_another_process_holds_the_key_without_a_round_trip() {
    let cluster = RedisCluster::start(3);
    let waitlist = cluster_waitlist_len(&cluster);
    let spec = cluster_spec(&cluster);
    let pttl = |key: &str| {
        cluster.nodes[0]
            .cli(&["-c", "PTTL", key])
            .parse()
            .unwrap_or(-2)
    };
    next_waiter_holds_without_a_round_trip(&spec, &waitlist, &pttl, "{grant}k");
    // A grant nobody picks up lapses after the grace on a cluster too.
    let (mut b, mut c, _) =
        grant_to_a_dead_waiter(&spec, &waitlist, "{grant}stopped", |b| b.signal("STOP"));
    c.release();
    b.kill();
    wait_until_only_the_fence_is_left(cluster_keys(&cluster));
}

#[test]
fn on_a_cluster_a_grant_reaches_a_waiter_whose_slot_moved_while_it_waited() {
    let cluster = RedisCluster::start(3);
    let waitlist = cluster_waitlist_len(&cluster);
    let spec = cluster_spec(&cluster);
    let key = "{moving}k";
    let mut a = Instance::start("A", &spec);
    let mut b = Instance::start("B", &spec);
    let a_token = a.hold(key);
    b.acquire("write", key, Duration::from_secs(30), None);
    wait_in_line(&waitlist, key, 1, &mut b);
    // The lock, its waitlist and its fencing counter move to another master; B's
    // subscription to its grant channel was on the old one (Redis unsubscribes it).
    let slot = cluster.slot_of(key);
    let source = cluster.master_of(key).expect("a master serves the key");
    let target = (source + 1) % cluster.nodes.len();
    cluster.start_migration(slot, source, target);
    cluster.finish_migration(slot, source, target);
    assert_eq!(
        cluster.master_of(key),
        Some(target),
        "the slot did not move"
    );
    let (released_at, _) = a.release();
    let (b_token, b_at) = b.acquired(ANSWER_LIMIT);
    assert!(
        since(b_at, released_at) < GRANT_BOUND,
        "B held the key {:?} after A's release on the slot's new master (the lease is \
         {LEASE:?})",
        since(b_at, released_at)
    );
    assert!(b_token > a_token, "B's token {b_token} <= A's {a_token}");
    b.release();
    wait_until_only_the_fence_is_left(cluster_keys(&cluster));
}

// ---------------------------------------------------------------------------------
// Sentinel: a failover while a grant is in flight.

/// Through Sentinel: A holds `k`, B waits in line for it, and the replica has caught up
/// with both. Returns the spec, A, B and A's token.
fn a_holds_and_b_waits_through_sentinel(
    setup: &SentinelSetup,
) -> (String, Instance, Instance, u64) {
    let spec = format!(
        "sentinel:{}:{}",
        redlock_testkit::sentinel::SERVICE,
        setup.sentinel_urls().join(",")
    );
    let mut a = Instance::start("A", &spec);
    let mut b = Instance::start("B", &spec);
    let a_token = a.hold("k");
    b.acquire("write", "k", Duration::from_secs(30), None);
    wait_in_line(&waitlist_len(&setup.primary), "k", 1, &mut b);
    setup
        .replica
        .wait_until_caught_up_with(&setup.primary, ANSWER_LIMIT);
    (spec, a, b, a_token)
}

#[test]
fn through_sentinel_a_failover_with_a_grant_in_flight_keeps_tokens_rising_and_nobody_stuck() {
    let mut setup = SentinelSetup::start();
    let (spec, mut a, mut b, a_token) = a_holds_and_b_waits_through_sentinel(&setup);
    // The grant is made, and the primary killed before B's confirmation is known to
    // have reached the replica (replication is asynchronous: it may or may not have).
    a.release();
    setup.fail_over();
    // B holds the key: by the grant, or, if its message was lost with the primary, by
    // an attempt on the new one once the lease it was told ends at the latest.
    let (b_token, _) = b.acquired(LEASE + ANSWER_LIMIT);
    assert!(b_token > a_token, "B's token {b_token} <= A's {a_token}");
    let mut c = Instance::start("C", &spec);
    c.acquire("write", "k", Duration::from_secs(30), None);
    std::thread::sleep(Duration::from_millis(300));
    // B's lock may have been lost in the failover (documented); its release says so
    // rather than hang.
    b.send("release");
    let b_release = b.expect(&["released"], ANSWER_LIMIT);
    assert!(
        matches!(
            b_release.fields.get(2).map(String::as_str),
            Some("ok" | "Lost")
        ),
        "B's release after the failover: {b_release:?}"
    );
    let (c_token, _) = c.acquired(LEASE + ANSWER_LIMIT);
    assert!(c_token > b_token, "C's token {c_token} <= B's {b_token}");
    c.release();
    wait_until_only_the_fence_is_left(keys_of(&setup.replica));
}

#[test]
fn through_sentinel_a_waiter_is_granted_the_key_on_the_new_primary_after_a_failover() {
    let mut setup = SentinelSetup::start();
    let (_spec, mut a, mut b, a_token) = a_holds_and_b_waits_through_sentinel(&setup);
    // The lock and B's place in line survive on the promoted replica; B's grant
    // channel was subscribed on the old primary.
    setup.fail_over();
    let (released_at, _) = a.release();
    let (b_token, b_at) = b.acquired(LEASE + ANSWER_LIMIT);
    assert!(
        since(b_at, released_at) < GRANT_BOUND,
        "B held the key {:?} after A's release on the new primary (the lease is {LEASE:?})",
        since(b_at, released_at)
    );
    assert!(b_token > a_token, "B's token {b_token} <= A's {a_token}");
    b.release();
    wait_until_only_the_fence_is_left(keys_of(&setup.replica));
}

#[test]
fn permits_freed_in_one_process_go_to_as_many_waiters_in_others() {
    let server = RedisServer::start();
    let spec = server.url();
    let mode = "permits:2";
    let mut holders: Vec<Instance> = ["H1", "H2"]
        .iter()
        .map(|name| Instance::start(name, &spec))
        .collect();
    let mut waiters: Vec<Instance> = ["W1", "W2", "W3"]
        .iter()
        .map(|name| Instance::start(name, &spec))
        .collect();
    let mut tokens = Vec::new();
    for holder in &mut holders {
        holder.acquire(mode, "pool", Duration::from_secs(5), None);
        tokens.push(holder.acquired(ANSWER_LIMIT).0);
    }
    for waiter in &mut waiters {
        waiter.acquire(mode, "pool", Duration::from_secs(30), None);
        // Its first attempt found both permits taken: it waits.
        wait_until(ANSWER_LIMIT, &format!("{} to wait", waiter.name), || {
            waiter.events("script_answered", 0, u64::MAX) >= 1
        });
    }
    // Each permit freed goes to one waiter (which one is not said across processes),
    // long before the holders' leases would have ended; never to two.
    let mut holding = Vec::new();
    for holder in &mut holders {
        let (released_at, _) = holder.release();
        let deadline = Instant::now() + GRANT_BOUND;
        let got = loop {
            let answered = waiters.iter_mut().enumerate().find_map(|(at, waiter)| {
                let reply = waiter.poll(&["acquired", "failed"], Duration::ZERO)?;
                Some((at, reply))
            });
            if let Some((at, reply)) = answered {
                assert_eq!(reply.kind, "acquired", "{}: {reply:?}", waiters[at].name);
                assert!(
                    since(reply.number(1), released_at) < GRANT_BOUND,
                    "{} got the permit {:?} after it was freed",
                    waiters[at].name,
                    since(reply.number(1), released_at)
                );
                tokens.push(reply.number(0));
                break waiters.remove(at);
            }
            assert!(
                Instant::now() < deadline,
                "no waiter got the permit freed by {} within {GRANT_BOUND:?}",
                holder.name
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        holding.push(got);
    }
    std::thread::sleep(Duration::from_millis(300));
    let last = &mut waiters[0];
    assert!(
        last.poll(&["acquired"], Duration::ZERO).is_none(),
        "{} got a third permit of two",
        last.name
    );
    holding[0].release();
    let (token, _) = last.acquired(ANSWER_LIMIT);
    tokens.push(token);
    for holder in holding.iter_mut().skip(1).chain(waiters.iter_mut()) {
        holder.release();
    }
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        5,
        "a fencing token was given twice: {tokens:?}"
    );
    wait_until_only_the_fence_is_left(keys_of(&server));
}

#[test]
fn readers_at_the_head_of_the_line_are_granted_together_and_a_writer_behind_them_waits() {
    let server = RedisServer::start();
    let waitlist = waitlist_len(&server);
    let spec = server.url();
    let mut a = Instance::start("A", &spec);
    // In line: R1, R2, then the writer W, then R3 (a reader behind a waiting writer
    // waits behind it).
    let mut line: Vec<(Instance, &str)> = [
        ("R1", "read"),
        ("R2", "read"),
        ("W", "write"),
        ("R3", "read"),
    ]
    .into_iter()
    .map(|(name, mode)| (Instance::start(name, &spec), mode))
    .collect();
    let a_token = a.hold("doc");
    for (place, (instance, mode)) in line.iter_mut().enumerate() {
        instance.acquire(mode, "doc", Duration::from_secs(30), None);
        wait_in_line(&waitlist, "doc", place + 1, instance);
    }
    let (released_at, _) = a.release();
    let mut tokens = vec![a_token];
    for (reader, _) in &mut line[..2] {
        let (token, at) = reader.acquired(ANSWER_LIMIT);
        assert!(
            since(at, released_at) < GRANT_BOUND,
            "{} got in {:?} after the release",
            reader.name,
            since(at, released_at)
        );
        let attempts = reader.events("script_sent", released_at, at);
        assert_eq!(
            attempts, 0,
            "{} sent {attempts} acquire script(s) between the release and its share",
            reader.name
        );
        tokens.push(token);
    }
    std::thread::sleep(Duration::from_millis(300));
    for (later, _) in &mut line[2..] {
        assert!(
            later
                .poll(&["acquired", "failed"], Duration::ZERO)
                .is_none(),
            "{} got in with the readers ahead of it",
            later.name
        );
    }
    line[0].0.release();
    let (last_share_released, _) = line[1].0.release();
    let (w_token, w_at) = line[2].0.acquired(ANSWER_LIMIT);
    assert!(
        w_at >= last_share_released,
        "W held the key with readers in it"
    );
    assert!(
        since(w_at, last_share_released) < GRANT_BOUND,
        "W held the key {:?} after the last reader left",
        since(w_at, last_share_released)
    );
    tokens.push(w_token);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        line[3].0.poll(&["acquired"], Duration::ZERO).is_none(),
        "R3 got in while the writer held the key"
    );
    let (w_released, _) = line[2].0.release();
    let (r3_token, r3_at) = line[3].0.acquired(ANSWER_LIMIT);
    assert!(r3_at >= w_released, "R3 got in before W released");
    line[3].0.release();
    // Readers granted together share one fencing token or get one each: either way
    // each writer's token is above every earlier one.
    assert!(
        tokens[1] > a_token && tokens[2] > a_token,
        "a reader's token is not above the writer before: {tokens:?}"
    );
    assert!(
        w_token > tokens[1] && w_token > tokens[2] && r3_token > w_token,
        "tokens out of order: A, R1, R2, W, then R3 {r3_token}: {tokens:?}"
    );
    wait_until_only_the_fence_is_left(keys_of(&server));
}
