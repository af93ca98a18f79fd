//! Scheduled-job exclusivity: N worker processes run the same cron schedule, and each
//! round exactly one of them draws the lottery and records it in a SQL database.
//!
//! ```text
//! cargo run --release --example lottery                         # 4 workers, 3 rounds, every 5 s
//! cargo run --release --example lottery -- --cron "0 0 12 * * *" --rounds 1   # every day at noon
//! cargo run --release --example lottery -- --workers 6 --rounds 5 --cron "*/2 * * * * *" --skew-ms 1500
//! cargo run --release --example lottery -- --without-hold-at-least   # watch the check fail
//! cargo run --release --example lottery -- --mode leader --rounds 4 --every 3 --kill-leader-after 2
//! ```
//!
//! Run without `--worker`, this binary is the coordinator: it starts a throwaway
//! `redis-server` when `REDLOCK_URL` is unset (or uses `REDLOCK_URL`; a comma-separated
//! list means RedLock), creates the database (SQLite, a file in a temporary directory
//! or `--db`; the classic version of this job uses MySQL) with the users, spawns
//! `--workers` copies of itself with `--worker <i>`, renders what they report, and at
//! the end reads every round's draws back from the database and checks that each
//! round was drawn exactly once.
//!
//! The schedule is a cron expression (`--cron`, seconds first, UTC; the `cron` crate
//! parses it): the job's real one is `0 0 12 * * *`, every day at noon; the demo's
//! `*/5 * * * * *` (`--every 5` is short for it). Every worker computes the same fire
//! times, sleeps until each and calls `draw_winners`. The lock's key names the round,
//! so one worker wins it and the others skip. The last worker fires
//! `--skew-ms` late, like a process whose clock or scheduler lags: by then the winner
//! has long finished, and only `hold_at_least = "3s"` keeps the round's lock in place so
//! that the late worker does not draw the same round a second time.
//!
//! Each draw is written with the lock's fencing token, and the database refuses a
//! token below the highest it has recorded for that lock (`db::FENCE`, in the same
//! transaction as the draw).
//!
//! A worker can also join by hand, e.g. from another terminal (the coordinator prints
//! the database's path):
//! `REDLOCK_URL=redis://127.0.0.1:PORT/ cargo run --example lottery -- --worker 9 --db PATH`.
//!
//! `--mode leader`: instead of every worker firing each round, the workers elect one
//! scheduler (`client.election("lottery-scheduler")`, the watchdog lease `--lease-ms`)
//! and only the leader draws, writing each draw with its term (the election's fencing
//! token); the others wait as candidates. On election a leader first records its term
//! in the database, which then refuses any draw of an older term, and only then
//! looks which rounds are still to draw: a round drawn by an earlier leader is never
//! drawn again, and one whose time passed while nobody led is drawn at once. A leader
//! whose `lost()` fires stops drawing and campaigns again. The coordinator asks
//! `leader()` who leads once round `--kill-leader-after` is drawn, kills that worker
//! with SIGKILL, and measures how long the next one takes to be elected.

use std::collections::BTreeMap;
use std::fmt;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use redlock_runtime::{LockClient, LockError, distributed_lock};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

mod db;
mod schedule;

use db::{Db, Fenced};
use schedule::Schedule;

/// How many users are seeded, and how many of them win each round.
const USERS: u32 = 1000;
const WINNERS: usize = 10;

/// How the workers decide who draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Every worker fires each round; the round's `#[distributed_lock]` lets one draw.
    Round,
    /// The workers elect one scheduler (`client.election`); it alone draws every round.
    Leader,
}

#[derive(Debug, Clone, Parser)]
#[command(about = "Scheduled-job exclusivity: N workers, one draw per round")]
struct Args {
    /// `round`: a lock per round; `leader`: an elected scheduler draws every round.
    #[arg(long, value_enum, default_value_t = Mode::Round)]
    mode: Mode,
    /// Number of worker processes the coordinator starts.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Number of draws (rounds).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// The schedule: a cron expression, seconds first, UTC (`0 0 12 * * *`: every day
    /// at noon). Default: `*/<every> * * * * *`.
    #[arg(long, value_name = "EXPR")]
    cron: Option<String>,
    /// Short for `--cron "*/<every> * * * * *"`: a round every `every` seconds (a
    /// divisor of 60, so that the rounds stay evenly spaced across minutes).
    #[arg(long, default_value_t = 5)]
    every: u64,
    /// The SQLite database file (default: in a temporary directory, removed at the end).
    /// A worker joining by hand gives the coordinator's.
    #[arg(long)]
    db: Option<std::path::PathBuf>,
    /// How late the last worker fires each round, in milliseconds (0: nobody is late).
    /// Round mode only.
    #[arg(long, default_value_t = 1500)]
    skew_ms: u64,
    /// Leader mode: the watchdog lease of each worker's client, in milliseconds (renewed
    /// every third of it): how long a dead leader keeps the election.
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,
    /// Leader mode: once round N is drawn, the coordinator kills the leader with SIGKILL
    /// (0: never).
    #[arg(long, value_name = "N", default_value_t = 1)]
    kill_leader_after: u32,
    /// Draw with the same lock but without `hold_at_least`: a late worker then draws
    /// the round again, and the final check fails.
    #[arg(long)]
    without_hold_at_least: bool,
    /// Run as worker <ID> (set by the coordinator; use it by hand to join a running demo).
    #[arg(long, value_name = "ID")]
    worker: Option<u32>,
    /// Unix time (seconds) of the first round, set by the coordinator for its workers;
    /// without it a worker starts at the schedule's next fire time.
    #[arg(long, hide = true)]
    first: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// The job
// ---------------------------------------------------------------------------------------

/// One scheduled draw.
#[derive(Debug, Clone)]
struct Draw {
    round: u32,
    /// The instant the draw is scheduled for, as UTC text: it names the round's lock.
    date: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct UserId(u32);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user-{:04}", self.0)
    }
}

/// The lottery's database, as seen by one worker.
struct Store {
    db: Db,
    worker: u32,
    /// The fencing token of this worker's last recorded draw.
    last_token: std::sync::Mutex<u64>,
}

#[derive(Debug)]
enum LotteryError {
    Lock(LockError),
    Db(rusqlite::Error),
    /// The database refused the draw: a newer token had written.
    Stale {
        token: u64,
        seen: u64,
    },
}

impl fmt::Display for LotteryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LotteryError::Lock(error) => error.fmt(f),
            LotteryError::Db(error) => write!(f, "the database failed: {error}"),
            LotteryError::Stale { token, seen } => write!(
                f,
                "the database refused the draw: fencing token {token} is older than {seen}"
            ),
        }
    }
}

impl std::error::Error for LotteryError {}

impl From<LockError> for LotteryError {
    fn from(error: LockError) -> Self {
        LotteryError::Lock(error)
    }
}

impl From<rusqlite::Error> for LotteryError {
    fn from(error: rusqlite::Error) -> Self {
        LotteryError::Db(error)
    }
}

/// The scheduled job. `wait = "0s"` and `on_busy = "skip"`: a worker that finds the
/// round taken skips it quietly (`Ok(None)`, the body does not run) — the normal case
/// for every worker but one, not an error. `hold_at_least = "3s"`: the lock outlives
/// the (short) draw, so a worker that fires a little late still finds it taken.
#[distributed_lock(
    key = "lottery:<draw.date>",
    wait = "0s",
    lease = "30s",
    hold_at_least = "3s",
    on_busy = "skip"
)]
async fn draw_winners(draw: &Draw, store: &Store) -> Result<Option<Vec<UserId>>, LotteryError> {
    draw_and_record(draw, store).await.map(Some)
}

/// The same job without `hold_at_least` (`--without-hold-at-least`): the lock is gone
/// as soon as the draw is done.
#[distributed_lock(
    key = "lottery:<draw.date>",
    wait = "0s",
    lease = "30s",
    on_busy = "skip"
)]
async fn draw_winners_without_hold(
    draw: &Draw,
    store: &Store,
) -> Result<Option<Vec<UserId>>, LotteryError> {
    draw_and_record(draw, store).await.map(Some)
}

/// The body of the job: picks the winners and records them with the fencing token.
async fn draw_and_record(draw: &Draw, store: &Store) -> Result<Vec<UserId>, LotteryError> {
    let lock = redlock_runtime::current_lock().expect("called under #[distributed_lock]");
    let token = lock.fencing_token();
    let winners = pick_winners(store).await?;
    if let Fenced::Stale { seen } = record_draw(store, draw, lock.key(), token, &winners).await? {
        return Err(LotteryError::Stale { token, seen });
    }
    *store.last_token.lock().unwrap_or_else(|e| e.into_inner()) = lock.fencing_token();
    Ok(winners)
}

/// Picks the winners; takes a moment (notifying them, ...): far less than hold_at_least.
async fn pick_winners(store: &Store) -> Result<Vec<UserId>, rusqlite::Error> {
    let winners = store.db.pick(WINNERS).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(winners.into_iter().map(UserId).collect())
}

/// Records the draw in the database, fenced by `token` on `lock` (the round's lock,
/// or the election in leader mode): the database refuses a token below the highest it
/// has recorded for that lock.
async fn record_draw(
    store: &Store,
    draw: &Draw,
    lock: &str,
    token: u64,
    winners: &[UserId],
) -> Result<Fenced, rusqlite::Error> {
    let winners: Vec<String> = winners.iter().map(ToString::to_string).collect();
    store
        .db
        .record(lock, &draw.date, store.worker, token, &winners.join(","))
        .await
}

// ---------------------------------------------------------------------------------------
// Worker
// ---------------------------------------------------------------------------------------

async fn worker(args: &Args, id: u32) -> Result<(), Box<dyn std::error::Error>> {
    let client = LockClient::from_env().await?;
    redlock_runtime::set_default_client(client);
    let store = worker_store(args, id).await?;
    let late = Duration::from_millis(args.skew_ms);
    for (round, at) in (1..).zip(worker_schedule(args)?) {
        let draw = Draw {
            round,
            date: utc(at),
        };
        sleep_until_unix(Duration::from_secs(at) + late).await;
        let fired_late_ms = (unix_now_duration().saturating_sub(Duration::from_secs(at)))
            .as_millis()
            .min(u128::from(u64::MAX)) as u64;
        let outcome = if args.without_hold_at_least {
            draw_winners_without_hold(&draw, &store).await
        } else {
            draw_winners(&draw, &store).await
        };
        let prefix = format!(
            "EVENT round={} date={} worker={id} late_ms={fired_late_ms}",
            draw.round, draw.date
        );
        match outcome {
            Ok(Some(winners)) => {
                let token = *store.last_token.lock().unwrap_or_else(|e| e.into_inner());
                let winners: Vec<String> = winners.iter().map(ToString::to_string).collect();
                println!(
                    "{prefix} outcome=drew token={token} winners={}",
                    winners.join(",")
                );
            }
            Ok(None) => {
                // Who has it? The winner records the draw within a moment of locking.
                let taken_by = wait_for_record(&store, &draw.date).await?;
                println!(
                    "{prefix} outcome=skipped taken_by={}",
                    taken_by.as_deref().unwrap_or("?")
                );
            }
            Err(error) => {
                println!("{prefix} outcome=error message={error}");
            }
        }
    }
    Ok(())
}

/// The worker that drew `date`, once its draw is in the database (up to 2 s).
async fn wait_for_record(store: &Store, date: &str) -> Result<Option<String>, rusqlite::Error> {
    for _ in 0..40 {
        if let Some(worker) = store.db.drawn_by(date).await? {
            return Ok(Some(worker.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// A worker's view of the database; one that joined by hand makes sure the tables
/// and the users are there.
async fn worker_store(args: &Args, id: u32) -> Result<Store, Box<dyn std::error::Error>> {
    let path = args
        .db
        .clone()
        .ok_or("--worker needs --db, the database file of the run (the coordinator prints it)")?;
    let db = Db::new(path);
    if args.first.is_none() {
        db.create(USERS).await?;
    }
    Ok(Store {
        db,
        worker: id,
        last_token: std::sync::Mutex::new(0),
    })
}

/// The schedule's expression: `--cron`, or `*/<every> * * * * *`.
fn schedule_of(args: &Args) -> Result<Schedule, String> {
    match &args.cron {
        Some(expression) => Schedule::parse(expression),
        None => Schedule::parse(&format!("*/{} * * * * *", args.every.max(1))),
    }
}

/// A worker's fire times: `--rounds` of them from `--first` (the coordinator's), or
/// from now for a worker that joined by hand.
fn worker_schedule(args: &Args) -> Result<Vec<u64>, String> {
    let first = args.first.unwrap_or_else(|| unix_now() + 1);
    Ok(schedule_of(args)?.times(first, args.rounds))
}

// ---------------------------------------------------------------------------------------
// Leader mode: the worker
// ---------------------------------------------------------------------------------------

/// The election every worker campaigns in (the key of its lock, and the name of the
/// fence its terms raise in the database).
const ELECTION: &str = "lottery-scheduler";

/// The client name of worker `id`: what `leader()` reports as the holder.
fn worker_name(id: u32) -> String {
    format!("lottery-worker-{id}")
}

/// How a term of leadership ended.
enum Served {
    /// Every round is drawn: the leader resigns.
    AllDrawn,
    /// The lease was lost (`lost()` fired) or the store knows a newer term.
    Deposed,
}

async fn leader_worker(args: &Args, id: u32) -> Result<(), Box<dyn std::error::Error>> {
    let lease = Duration::from_millis(args.lease_ms);
    let url = std::env::var("REDLOCK_URL").unwrap_or_else(|_| redlock_runtime::DEFAULT_URL.into());
    let client = LockClient::builder_from_spec(&url)
        .name(worker_name(id))
        .watchdog_lease(lease)
        .renew_every(lease / 3)
        .connect()
        .await?;
    let store = worker_store(args, id).await?;
    let schedule: Vec<(u64, Draw)> = (1..)
        .zip(worker_schedule(args)?)
        .map(|(round, at)| {
            (
                at,
                Draw {
                    round,
                    date: utc(at),
                },
            )
        })
        .collect();
    // A candidate gives up a minute after the last round (it is normally elected, finds
    // nothing left to draw and resigns, once the last leader resigns).
    let last = schedule.last().map_or(0, |(at, _)| *at);
    let patience = Duration::from_secs(last.saturating_sub(unix_now()) + 60) + lease;
    let election = client.election(ELECTION).wait(patience);
    loop {
        let term = election.campaign().await?;
        let token = term.fencing_token();
        println!(
            "LEADER event=elected worker={id} term={token} at_ms={}",
            unix_ms()
        );
        // The term goes into the database before anything is looked at: from here on,
        // a draw by an earlier leader is refused, so none can land after the check below.
        let claimed = store.db.claim(ELECTION, token).await?;
        let served = if claimed == Fenced::Written {
            lead(&term, &schedule, &store).await?
        } else {
            Served::Deposed
        };
        match served {
            Served::Deposed => {
                println!(
                    "LEADER event=deposed worker={id} term={token} at_ms={}",
                    unix_ms()
                );
                drop(term);
            }
            Served::AllDrawn => {
                println!(
                    "LEADER event=resigned worker={id} term={token} at_ms={}",
                    unix_ms()
                );
                // Resigning hands the election to the next candidate at once.
                let _ = term.release().await;
                return Ok(());
            }
        }
    }
}

/// Draws every round of `schedule` not drawn yet, each at its time (at once if its time
/// has passed), for as long as `term` lasts.
async fn lead(
    term: &redlock_runtime::LockGuard,
    schedule: &[(u64, Draw)],
    store: &Store,
) -> Result<Served, LotteryError> {
    for (at, draw) in schedule {
        let drawn = !store.db.draws(&draw.date).await?.is_empty();
        if drawn {
            continue; // by an earlier leader
        }
        tokio::select! {
            biased;
            () = term.lost() => return Ok(Served::Deposed),
            () = sleep_until_unix(Duration::from_secs(*at)) => {}
        }
        let late_ms = (unix_now_duration().saturating_sub(Duration::from_secs(*at)))
            .as_millis()
            .min(u128::from(u64::MAX)) as u64;
        let prefix = format!(
            "EVENT round={} date={} worker={} late_ms={late_ms}",
            draw.round, draw.date, store.worker
        );
        let recorded = tokio::select! {
            biased;
            () = term.lost() => return Ok(Served::Deposed),
            recorded = draw_as_leader(draw, store, term.fencing_token()) => recorded,
        };
        match recorded {
            Ok(Ok(winners)) => {
                let winners: Vec<String> = winners.iter().map(ToString::to_string).collect();
                println!(
                    "{prefix} outcome=drew token={} winners={}",
                    term.fencing_token(),
                    winners.join(",")
                );
            }
            Ok(Err(newest)) => {
                println!(
                    "{prefix} outcome=refused message=the database refused the draw: term {} is older than term {newest}",
                    term.fencing_token()
                );
                return Ok(Served::Deposed);
            }
            Err(error) => println!("{prefix} outcome=error message={error}"),
        }
    }
    Ok(Served::AllDrawn)
}

/// Draws one round and records it fenced by `term`: `Ok(Err(newest))` when the
/// database has seen a newer term and refused it.
async fn draw_as_leader(
    draw: &Draw,
    store: &Store,
    term: u64,
) -> Result<Result<Vec<UserId>, u64>, rusqlite::Error> {
    let winners = pick_winners(store).await?;
    Ok(
        match record_draw(store, draw, ELECTION, term, &winners).await? {
            Fenced::Written => Ok(winners),
            Fenced::Stale { seen } => Err(seen),
        },
    )
}

// ---------------------------------------------------------------------------------------
// Coordinator
// ---------------------------------------------------------------------------------------

/// What a worker reported about one round.
#[derive(Debug, Clone)]
struct Event {
    round: u32,
    date: String,
    worker: u32,
    late_ms: u64,
    outcome: Outcome,
}

#[derive(Debug, Clone)]
enum Outcome {
    Drew { token: String, winners: Vec<String> },
    Skipped { taken_by: String },
    Error { message: String },
}

fn parse_event(line: &str) -> Option<Event> {
    let rest = line.strip_prefix("EVENT ")?;
    // `message=` comes last and may contain spaces.
    let (rest, message) = match rest.split_once(" message=") {
        Some((rest, message)) => (rest, Some(message.to_owned())),
        None => (rest, None),
    };
    let fields: BTreeMap<&str, &str> = rest
        .split(' ')
        .filter_map(|field| field.split_once('='))
        .collect();
    let outcome = match *fields.get("outcome")? {
        "drew" => Outcome::Drew {
            token: fields.get("token")?.to_string(),
            winners: fields
                .get("winners")?
                .split(',')
                .map(str::to_owned)
                .collect(),
        },
        "skipped" => Outcome::Skipped {
            taken_by: fields.get("taken_by")?.to_string(),
        },
        _ => Outcome::Error {
            message: message.unwrap_or_default(),
        },
    };
    Some(Event {
        round: fields.get("round")?.parse().ok()?,
        date: fields.get("date")?.to_string(),
        worker: fields.get("worker")?.parse().ok()?,
        late_ms: fields.get("late_ms")?.parse().ok()?,
        outcome,
    })
}

/// A line a worker printed, parsed.
#[derive(Debug, Clone)]
enum Report {
    Round(Event),
    Leader(LeaderEvent),
}

/// Leader mode: what a worker reported about its leadership.
#[derive(Debug, Clone)]
struct LeaderEvent {
    kind: LeaderKind,
    worker: u32,
    term: u64,
    /// Unix time in milliseconds, on the worker's clock (the same machine's).
    at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaderKind {
    Elected,
    Deposed,
    Resigned,
}

fn parse_leader_event(line: &str) -> Option<LeaderEvent> {
    let rest = line.strip_prefix("LEADER ")?;
    let fields: BTreeMap<&str, &str> = rest
        .split(' ')
        .filter_map(|field| field.split_once('='))
        .collect();
    Some(LeaderEvent {
        kind: match *fields.get("event")? {
            "elected" => LeaderKind::Elected,
            "deposed" => LeaderKind::Deposed,
            "resigned" => LeaderKind::Resigned,
            _ => return None,
        },
        worker: fields.get("worker")?.parse().ok()?,
        term: fields.get("term")?.parse().ok()?,
        at_ms: fields.get("at_ms")?.parse().ok()?,
    })
}

async fn coordinator(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    if args.workers == 0 || args.rounds == 0 || args.every == 0 {
        return Err("--workers, --rounds and --every must be above zero".into());
    }
    let schedule = schedule_of(args)?;
    // Give the workers a moment to start: the first round is the schedule's first
    // fire time two seconds from now or later.
    let times = schedule.times(unix_now() + 2, args.rounds);
    if times.len() < args.rounds as usize {
        return Err(format!(
            "--cron {:?} fires only {} more times, not --rounds {}",
            schedule.expression(),
            times.len(),
            args.rounds
        )
        .into());
    }
    let gap = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .min()
        .unwrap_or(u64::MAX);
    match args.mode {
        Mode::Round => {
            if args.skew_ms >= gap.saturating_mul(1000) {
                return Err(format!(
                    "--skew-ms ({}) must be shorter than the time between rounds ({gap} s)",
                    args.skew_ms
                )
                .into());
            }
        }
        Mode::Leader => {
            if args.without_hold_at_least {
                return Err("--without-hold-at-least is for --mode round (the leader takes no lock per round)".into());
            }
            if args.kill_leader_after > 0 && args.kill_leader_after >= args.rounds {
                return Err(format!(
                    "--kill-leader-after ({}) must be below --rounds ({}), so that a round is left for the next leader",
                    args.kill_leader_after, args.rounds
                )
                .into());
            }
            if args.kill_leader_after > 0 && args.workers < 2 {
                return Err(
                    "--kill-leader-after needs --workers 2 or more, to have someone take over"
                        .into(),
                );
            }
        }
    }
    // A throwaway server unless REDLOCK_URL names one (or several: RedLock).
    let (_server, url) = redlock_testkit::redlock_url_or_throwaway_server();
    let dir = tempfile::Builder::new()
        .prefix("redlock-lottery-")
        .tempdir()?;
    let db = Db::new(
        args.db
            .clone()
            .unwrap_or_else(|| dir.path().join("lottery.db")),
    );
    db.create(USERS).await?;
    println!(
        "database: {} (SQLite, shared by the workers)",
        db.path().display()
    );
    let first = times[0];
    let cron = schedule.expression();
    match args.mode {
        Mode::Round => {
            let hold = if args.without_hold_at_least {
                "WITHOUT hold_at_least"
            } else {
                "hold_at_least = 3s"
            };
            println!(
                "{} workers, {} rounds on the schedule \"{cron}\" (cron, UTC) from {}; {hold}",
                args.workers,
                args.rounds,
                utc(first),
            );
            if args.skew_ms > 0 {
                println!(
                    "worker {} fires {} ms late each round (a slow clock or a busy scheduler)",
                    args.workers, args.skew_ms
                );
            }
        }
        Mode::Leader => {
            println!(
                "leader mode: {} workers campaign in the election \"{ELECTION}\" (watchdog lease {} ms, \
                 renewed every {} ms); the leader alone draws {} rounds on the schedule \"{cron}\" \
                 (cron, UTC) from {}",
                args.workers,
                args.lease_ms,
                args.lease_ms / 3,
                args.rounds,
                utc(first),
            );
            if args.kill_leader_after > 0 {
                println!(
                    "once round {} is drawn, the coordinator asks leader() who leads and kills that worker with SIGKILL",
                    args.kill_leader_after
                );
            }
        }
    }
    println!();

    let exe = std::env::current_exe()?;
    let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel::<Report>();
    let mut children = Vec::new();
    for id in 1..=args.workers {
        let skew = if id == args.workers && args.mode == Mode::Round {
            args.skew_ms
        } else {
            0
        };
        let mut command = Command::new(&exe);
        command
            .args(["--worker", &id.to_string()])
            .args(["--first", &first.to_string()])
            .args(["--cron", cron])
            .arg("--db")
            .arg(db.path())
            .args(["--rounds", &args.rounds.to_string()])
            .args(["--skew-ms", &skew.to_string()])
            .env("REDLOCK_URL", &url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if args.without_hold_at_least {
            command.arg("--without-hold-at-least");
        }
        if args.mode == Mode::Leader {
            command
                .args(["--mode", "leader"])
                .args(["--lease-ms", &args.lease_ms.to_string()]);
        }
        let mut child = command.spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let reports_tx = reports_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let report = match parse_event(&line) {
                    Some(event) => Some(Report::Round(event)),
                    None => parse_leader_event(&line).map(Report::Leader),
                };
                match report {
                    Some(report) => {
                        let _ = reports_tx.send(report);
                    }
                    None => println!("  [worker {id}] {line}"),
                }
            }
        });
        children.push((id, child));
    }
    drop(reports_tx);

    match args.mode {
        Mode::Round => follow_rounds(args, &db, &times, reports, children).await,
        Mode::Leader => follow_leader(args, &url, &db, &times, reports, children).await,
    }
}

/// Round mode: renders the rounds as the workers report them, then checks.
async fn follow_rounds(
    args: &Args,
    db: &Db,
    times: &[u64],
    mut reports: tokio::sync::mpsc::UnboundedReceiver<Report>,
    children: Vec<(u32, tokio::process::Child)>,
) -> Result<bool, Box<dyn std::error::Error>> {
    // Render each round as soon as every worker has reported on it.
    let mut rounds: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    let mut rendered = 0;
    let deadline = tokio::time::Instant::now() + until_after(times, Duration::from_secs(30));
    loop {
        let report = tokio::select! {
            report = reports.recv() => report,
            () = tokio::time::sleep_until(deadline) => {
                println!("workers did not report in time");
                None
            }
        };
        let Some(report) = report else { break };
        let Report::Round(event) = report else {
            continue;
        };
        let round = event.round;
        let reports = rounds.entry(round).or_default();
        reports.push(event);
        if reports.len() == args.workers as usize {
            print_round(reports);
            rendered += 1;
        }
    }
    let mut ok = true;
    for (id, mut child) in children {
        let status = child.wait().await?;
        if !status.success() {
            println!("worker {id} exited with {status}");
            ok = false;
        }
    }
    // Rounds that not every worker reported on.
    if rendered < rounds.len() {
        for reports in rounds.values().filter(|r| r.len() < args.workers as usize) {
            print_round(reports);
        }
    }

    print_summary(&rounds);
    let checked = check(db, args, times, &rounds).await?;
    Ok(ok && checked)
}

/// Leader mode: the worker the coordinator killed.
struct Killed {
    worker: u32,
    term: u64,
    at_ms: u64,
}

/// Leader mode: renders the elections and the draws as the workers report them, kills
/// the leader once round `--kill-leader-after` is drawn, then checks.
async fn follow_leader(
    args: &Args,
    url: &str,
    db: &Db,
    times: &[u64],
    mut reports: tokio::sync::mpsc::UnboundedReceiver<Report>,
    mut children: Vec<(u32, tokio::process::Child)>,
) -> Result<bool, Box<dyn std::error::Error>> {
    let lease_ms = args.lease_ms;
    // The coordinator's own client, only to ask who leads.
    let observer = LockClient::builder_from_spec(url)
        .name("lottery-coordinator")
        .connect()
        .await?;
    let election = observer.election(ELECTION);

    let mut ok = true;
    let mut rounds: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    // Each worker's latest election: (term, at_ms).
    let mut elected: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut last_term = 0;
    let mut killed: Option<Killed> = None;
    // (worker, term, ms after the kill)
    let mut takeover: Option<(u32, u64, u64)> = None;
    // Elected once every round was drawn: found nothing to do and resigned.
    let mut idle: Vec<u32> = Vec::new();
    let all_drawn = |rounds: &BTreeMap<u32, Vec<Event>>| {
        (1..=args.rounds).all(|round| {
            rounds.get(&round).is_some_and(|reports| {
                reports
                    .iter()
                    .any(|e| matches!(e.outcome, Outcome::Drew { .. }))
            })
        })
    };
    let deadline = tokio::time::Instant::now()
        + until_after(times, Duration::from_secs(30))
        + Duration::from_millis(lease_ms);
    loop {
        let report = tokio::select! {
            report = reports.recv() => report,
            () = tokio::time::sleep_until(deadline) => {
                println!("workers did not report in time");
                ok = false;
                None
            }
        };
        let Some(report) = report else { break };
        match report {
            Report::Leader(LeaderEvent {
                kind: LeaderKind::Elected,
                worker,
                term,
                at_ms,
            }) => {
                if term <= last_term {
                    println!(
                        "TERM DID NOT INCREASE: worker {worker} elected in term {term} after term {last_term}"
                    );
                    ok = false;
                }
                let previous = last_term;
                last_term = last_term.max(term);
                elected.insert(worker, (term, at_ms));
                if all_drawn(&rounds) {
                    idle.push(worker);
                    continue;
                }
                let at = clock_ms(at_ms);
                match &killed {
                    Some(dead) if takeover.is_none() => {
                        let after = at_ms.saturating_sub(dead.at_ms);
                        println!(
                            "{at}  worker {worker} elected, term {term}: took over {after} ms after the SIGKILL \
                             (watchdog lease {lease_ms} ms)"
                        );
                        takeover = Some((worker, term, after));
                    }
                    _ if previous > 0 => println!(
                        "{at}  worker {worker} elected scheduler, term {term} (after term {previous})"
                    ),
                    _ => {
                        let candidates: Vec<String> = (1..=args.workers)
                            .filter(|&id| id != worker)
                            .map(|id| id.to_string())
                            .collect();
                        let waiting = match candidates.len() {
                            0 => String::new(),
                            1 => format!("; worker {} waits as a candidate", candidates[0]),
                            _ => format!("; workers {} wait as candidates", candidates.join(", ")),
                        };
                        println!("{at}  worker {worker} elected scheduler, term {term}{waiting}");
                    }
                }
            }
            Report::Leader(LeaderEvent {
                kind: LeaderKind::Deposed,
                worker,
                term,
                at_ms,
            }) => println!(
                "{}  worker {worker} lost its lease in term {term} (lost() fired): stopped drawing, campaigns again",
                clock_ms(at_ms)
            ),
            Report::Leader(LeaderEvent {
                kind: LeaderKind::Resigned,
                ..
            }) => {}
            Report::Round(event) => {
                let at_ms = times[event.round as usize - 1] * 1000;
                print_leader_round(&event, elected.get(&event.worker).copied(), at_ms);
                let round = event.round;
                let drew = matches!(event.outcome, Outcome::Drew { .. });
                rounds.entry(round).or_default().push(event);
                if drew && round == args.kill_leader_after && killed.is_none() {
                    // Who leads, as Redis says: the holder of the election's lock.
                    let Some(leader) = election.leader().await? else {
                        println!("leader() names nobody: nothing to kill");
                        ok = false;
                        continue;
                    };
                    let Some((id, child)) = children
                        .iter_mut()
                        .find(|(id, _)| worker_name(*id) == leader.holder())
                    else {
                        println!("leader() names {}, not one of our workers", leader.holder());
                        ok = false;
                        continue;
                    };
                    let pid = child.id().unwrap_or(0);
                    let at_ms = unix_ms();
                    child.start_kill()?; // SIGKILL
                    println!(
                        "{}  leader() names {} (term {}): SIGKILL to worker {id} (pid {pid})",
                        clock_ms(at_ms),
                        leader.holder(),
                        leader.fencing_token()
                    );
                    killed = Some(Killed {
                        worker: *id,
                        term: leader.fencing_token(),
                        at_ms,
                    });
                }
            }
        }
    }
    for (id, mut child) in children {
        let status = child.wait().await?;
        let was_killed = killed.as_ref().is_some_and(|k| k.worker == id);
        if !status.success() && !was_killed {
            println!("worker {id} exited with {status}");
            ok = false;
        }
    }

    print_summary(&rounds);
    if args.kill_leader_after > 0 {
        match (&killed, takeover) {
            (Some(dead), Some((worker, term, after))) => {
                let margin = if after <= lease_ms {
                    "within the lease".to_owned()
                } else {
                    format!("{} ms past the lease", after - lease_ms)
                };
                println!(
                    "takeover: worker {worker} took over {after} ms after worker {} was killed with SIGKILL \
                     (watchdog lease {lease_ms} ms: {margin}); term {} -> {term}",
                    dead.worker, dead.term
                );
            }
            (Some(dead), None) => {
                println!(
                    "takeover: nobody took over after worker {} was killed",
                    dead.worker
                );
                ok = false;
            }
            (None, _) => {
                println!("the leader was never killed");
                ok = false;
            }
        }
    }
    if !idle.is_empty() {
        let idle: Vec<String> = idle.iter().map(ToString::to_string).collect();
        println!(
            "after the last round the leader resigned; then worker{} {} {} elected in turn, found nothing left to draw and resigned too",
            if idle.len() == 1 { "" } else { "s" },
            idle.join(", "),
            if idle.len() == 1 { "was" } else { "were" }
        );
    }
    let checked = check(db, args, times, &rounds).await?;
    Ok(ok && checked)
}

/// Leader mode: one line per draw, as it is reported. `elected`: the drawer's latest
/// election (term, at_ms); `at_ms`: the round's time.
fn print_leader_round(event: &Event, elected: Option<(u64, u64)>, at_ms: u64) {
    let time = &event.date[11..19];
    match &event.outcome {
        Outcome::Drew { token, .. } => {
            let mut line = format!(
                "round {} at {time}: worker {} drew, term {token}",
                event.round, event.worker
            );
            if event.late_ms >= 250 {
                line.push_str(&format!(", {} ms late", event.late_ms));
                if elected.is_some_and(|(_, elected_at)| elected_at > at_ms) {
                    line.push_str(" (no leader at its time: drawn on taking over)");
                }
            }
            println!("{line}");
        }
        Outcome::Skipped { taken_by } => println!(
            "round {} at {time}: worker {} skipped it, taken by worker {taken_by}",
            event.round, event.worker
        ),
        Outcome::Error { message } => println!(
            "round {} at {time}: worker {} failed: {message}",
            event.round, event.worker
        ),
    }
}

fn print_round(reports: &[Event]) {
    let first = &reports[0];
    let drew: Vec<&Event> = reports
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Drew { .. }))
        .collect();
    let skipped = reports
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Skipped { .. }))
        .count();
    let late_skips: Vec<&Event> = reports
        .iter()
        .filter(|e| e.late_ms >= 250 && matches!(e.outcome, Outcome::Skipped { .. }))
        .collect();
    let time = &first.date[11..19];
    let winner = match drew.as_slice() {
        [] => "none of our workers drew".to_owned(),
        [one] => match &one.outcome {
            Outcome::Drew { token, .. } => {
                format!("worker {} drew, fencing token {token}", one.worker)
            }
            _ => unreachable!(),
        },
        many => format!(
            "DRAWN {} TIMES, by workers {}",
            many.len(),
            many.iter()
                .map(|e| format!("{} (+{} ms)", e.worker, e.late_ms))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut seen: Vec<&str> = reports
        .iter()
        .filter_map(|e| match &e.outcome {
            Outcome::Skipped { taken_by } => Some(taken_by.as_str()),
            _ => None,
        })
        .collect();
    seen.sort_unstable();
    seen.dedup();
    let mut line = format!(
        "round {} at {time}: {winner}; {skipped} skipped",
        first.round
    );
    if !seen.is_empty() {
        line.push_str(&format!(", finding it taken by worker {}", seen.join("/")));
    }
    for late in late_skips {
        line.push_str(&format!(
            " (worker {} fired {} ms late: lock still held by hold_at_least)",
            late.worker, late.late_ms
        ));
    }
    println!("{line}");
    for event in reports {
        if let Outcome::Error { message } = &event.outcome {
            println!("  worker {} failed: {message}", event.worker);
        }
    }
}

fn print_summary(rounds: &BTreeMap<u32, Vec<Event>>) {
    println!();
    println!(
        "{:<6} {:<9} {:<7} {:<17} {:>5} {:>8}  winners",
        "round", "UTC", "winner", "fencing token", "drew", "skipped"
    );
    for (round, reports) in rounds {
        let drew: Vec<&Event> = reports
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Drew { .. }))
            .collect();
        let skipped = reports
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Skipped { .. }))
            .count();
        let (winner, token, winners) = match drew.first().map(|e| (e.worker, &e.outcome)) {
            Some((worker, Outcome::Drew { token, winners })) => {
                let shown = winners[..3.min(winners.len())].join(" ");
                (
                    worker.to_string(),
                    token.clone(),
                    format!("{shown} … ({} in all)", winners.len()),
                )
            }
            _ => ("-".into(), "-".into(), String::new()),
        };
        println!(
            "{:<6} {:<9} {:<7} {:<17} {:>5} {:>8}  {winners}",
            round,
            &reports[0].date[11..19],
            winner,
            token,
            drew.len(),
            skipped
        );
    }
    println!();
}

/// Reads every round's draws back from the database: exactly one each.
async fn check(
    db: &Db,
    args: &Args,
    times: &[u64],
    rounds: &BTreeMap<u32, Vec<Event>>,
) -> Result<bool, rusqlite::Error> {
    let mut failures = Vec::new();
    for (round, at) in (1..).zip(times) {
        let date = utc(*at);
        let draws = db.draws(&date).await?;
        let reported = rounds.get(&round).and_then(|reports| {
            reports.iter().find_map(|e| match &e.outcome {
                Outcome::Drew { token, .. } => Some((e.worker.to_string(), token.clone())),
                _ => None,
            })
        });
        match draws.as_slice() {
            [] => failures.push(format!("round {round} ({date}) was never drawn")),
            [(worker, token)] => {
                let recorded = (worker.to_string(), token.to_string());
                // `None`: a worker that joined by hand (not one of ours) drew it.
                if reported
                    .as_ref()
                    .is_some_and(|reported| *reported != recorded)
                {
                    failures.push(format!(
                        "round {round}: the database says worker {} with token {}, the workers said {:?}",
                        recorded.0, recorded.1, reported
                    ));
                }
            }
            many => failures.push(format!(
                "round {round} ({date}) was drawn {} times, by worker@token {}",
                many.len(),
                many.iter()
                    .map(|(worker, token)| format!("{worker}@{token}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        }
    }
    if failures.is_empty() {
        println!(
            "exactly-once check passed: {} rounds, {} draws in the database, one per round",
            args.rounds, args.rounds
        );
        Ok(true)
    } else {
        println!("exactly-once check FAILED:");
        for failure in &failures {
            println!("  {failure}");
        }
        if args.without_hold_at_least {
            println!(
                "  (--without-hold-at-least: the winner released the lock as soon as it was done, \
                 so the late worker found it free and drew again; hold_at_least = \"3s\" prevents this)"
            );
        }
        Ok(false)
    }
}

// ---------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------

/// From now until `margin` after the last of `times` (Unix seconds).
fn until_after(times: &[u64], margin: Duration) -> Duration {
    let last = times.last().copied().unwrap_or(0);
    Duration::from_secs(last.saturating_sub(unix_now())) + margin
}

fn unix_now_duration() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn unix_ms() -> u64 {
    unix_now_duration().as_millis().min(u128::from(u64::MAX)) as u64
}

/// `12:00:05.123` (UTC) for a Unix time in milliseconds.
fn clock_ms(ms: u64) -> String {
    format!("{}.{:03}", &utc(ms / 1000)[11..19], ms % 1000)
}

fn unix_now() -> u64 {
    unix_now_duration().as_secs()
}

async fn sleep_until_unix(at: Duration) {
    let now = unix_now_duration();
    if at > now {
        tokio::time::sleep(at - now).await;
    }
}

/// `2025-06-01T12:00:05Z` for a Unix time in seconds.
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match args.worker {
        Some(id) => {
            let run = match args.mode {
                Mode::Round => worker(&args, id).await,
                Mode::Leader => leader_worker(&args, id).await,
            };
            match run {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("worker {id}: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        None => match coordinator(&args).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(error) => {
                eprintln!("lottery: {error}");
                ExitCode::FAILURE
            }
        },
    }
}
