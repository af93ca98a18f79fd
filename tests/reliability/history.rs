//! What really happened: the records workers write, and the checker that judges them.
//!
//! Every worker (task of any process) appends one line per event to its process's file
//! in a shared directory, as soon as the event happens, so a process killed mid-hold
//! leaves its acquisition behind. Instants are CLOCK_MONOTONIC nanoseconds
//! ([`crate::clock::now`]), comparable across the processes of one machine.
//!
//! Lines (space-separated `name=value` after the kind):
//! - `attempt proc task seq t_req t_ret wait result` — every call to `acquire`;
//! - `acquired proc task seq token t_req t_acq lease` — lease 0 in watchdog mode;
//! - `write proc task seq token start end accepted` — a write to the fenced store;
//! - `released proc task seq t_start t_end outcome lost_before` — the call to `release`;
//! - `lost proc task seq t_lost` — when the guard said the lock was lost (its `lost()`
//!   resolved), for holders that watch it.
//!
//! A hold is the span `[t_acq, t_start of its release]`: from the moment its holder
//! knew it had the lock to the moment it began to give it up, i.e. the span in which it
//! acted as the owner.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock;

/// Identifies one acquisition: process, task within it, sequence number within the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HoldId {
    pub proc: u32,
    pub task: u32,
    pub seq: u64,
}

impl std::fmt::Display for HoldId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.proc, self.task, self.seq)
    }
}

/// How a call to `acquire` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    Acquired,
    Timeout,
    /// Any other error, by its variant name.
    Error(String),
}

#[derive(Debug, Clone)]
pub struct Attempt {
    pub id: HoldId,
    pub t_req: u64,
    pub t_ret: u64,
    pub wait: u64,
    pub result: AttemptResult,
}

#[derive(Debug, Clone, Copy)]
pub struct StoreWrite {
    pub start: u64,
    pub end: u64,
    pub accepted: bool,
}

/// How a hold ended, as its worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `release` returned Ok.
    Released,
    /// `release` returned `Lost`: the lease had run out (or another owner took it).
    Lost,
    /// `release` failed otherwise (Redis unreachable); a fixed lease still expires.
    ReleaseFailed,
}

#[derive(Debug, Clone, Copy)]
pub struct Release {
    pub t_start: u64,
    pub t_end: u64,
    pub outcome: Outcome,
    /// `guard.is_lost()` just before the release.
    pub lost_before: bool,
}

#[derive(Debug, Clone)]
pub struct Hold {
    pub id: HoldId,
    pub token: u64,
    pub t_req: u64,
    pub t_acq: u64,
    /// The fixed lease in nanoseconds; `None` in watchdog mode.
    pub lease: Option<u64>,
    pub writes: Vec<StoreWrite>,
    /// `None` when the process died holding it (or it never released).
    pub release: Option<Release>,
    /// When its guard said the lock was lost, if the worker watched for that.
    pub lost_at: Option<u64>,
}

impl Hold {
    /// The end of the span in which the holder acted as owner (`u64::MAX`: never ended).
    pub fn end(&self) -> u64 {
        self.release.map_or(u64::MAX, |release| release.t_start)
    }

    /// When the lease ran out at the earliest, if it had a fixed lease: Redis counted
    /// it from when it ran the script, which was after `t_req`.
    pub fn earliest_expiry(&self) -> Option<u64> {
        self.lease.map(|lease| self.t_req + lease)
    }

    /// When the lease ran out at the latest, if it had a fixed lease and was never released.
    pub fn latest_expiry(&self) -> Option<u64> {
        self.lease.map(|lease| self.t_acq + lease)
    }
}

/// Everything the workers of one test recorded.
#[derive(Debug, Default)]
pub struct History {
    pub attempts: Vec<Attempt>,
    pub holds: Vec<Hold>,
}

/// Appends records to one file; shared by the tasks of a process.
#[derive(Debug, Clone)]
pub struct Recorder {
    file: Arc<Mutex<File>>,
    proc: u32,
}

impl Recorder {
    /// The recorder of this process, writing `dir/history-<pid>.log`.
    pub fn in_dir(dir: &Path) -> Self {
        Self::with_proc(dir, std::process::id())
    }

    /// A recorder for a "process" number of one's own choosing (in-process workers
    /// that stand for separate clients).
    pub fn with_proc(dir: &Path, proc: u32) -> Self {
        let path = dir.join(format!("history-{proc}.log"));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        Recorder {
            file: Arc::new(Mutex::new(file)),
            proc,
        }
    }

    pub fn id(&self, task: u32, seq: u64) -> HoldId {
        HoldId {
            proc: self.proc,
            task,
            seq,
        }
    }

    fn line(&self, line: String) {
        // One write per line, to a file opened for appending: a process killed at any
        // moment leaves whole lines behind.
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(line.as_bytes()).expect("write the history");
    }

    pub fn attempt(&self, attempt: &Attempt) {
        let result = match &attempt.result {
            AttemptResult::Acquired => "acquired".to_string(),
            AttemptResult::Timeout => "timeout".to_string(),
            AttemptResult::Error(kind) => format!("error:{kind}"),
        };
        let id = attempt.id;
        self.line(format!(
            "attempt proc={} task={} seq={} t_req={} t_ret={} wait={} result={result}\n",
            id.proc, id.task, id.seq, attempt.t_req, attempt.t_ret, attempt.wait
        ));
    }

    pub fn acquired(&self, id: HoldId, token: u64, t_req: u64, t_acq: u64, lease: Option<u64>) {
        self.line(format!(
            "acquired proc={} task={} seq={} token={token} t_req={t_req} t_acq={t_acq} lease={}\n",
            id.proc,
            id.task,
            id.seq,
            lease.unwrap_or(0)
        ));
    }

    pub fn write(&self, id: HoldId, token: u64, write: StoreWrite) {
        self.line(format!(
            "write proc={} task={} seq={} token={token} start={} end={} accepted={}\n",
            id.proc,
            id.task,
            id.seq,
            write.start,
            write.end,
            u8::from(write.accepted)
        ));
    }

    /// The guard of `id` said its lock was lost at `t_lost`.
    // Only the partition suite's holders (tests/partitions) watch their guards.
    #[allow(dead_code)]
    pub fn lost(&self, id: HoldId, t_lost: u64) {
        self.line(format!(
            "lost proc={} task={} seq={} t_lost={t_lost}\n",
            id.proc, id.task, id.seq
        ));
    }

    pub fn released(&self, id: HoldId, release: Release) {
        let outcome = match release.outcome {
            Outcome::Released => "released",
            Outcome::Lost => "lost",
            Outcome::ReleaseFailed => "failed",
        };
        self.line(format!(
            "released proc={} task={} seq={} t_start={} t_end={} outcome={outcome} lost_before={}\n",
            id.proc,
            id.task,
            id.seq,
            release.t_start,
            release.t_end,
            u8::from(release.lost_before)
        ));
    }
}

/// Reads every `history-*.log` in `dir`.
pub fn load(dir: &Path) -> History {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the history directory")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("history-") && name.ends_with(".log"))
        })
        .collect();
    files.sort();
    let mut text = String::new();
    for path in files {
        text.push_str(&std::fs::read_to_string(&path).expect("read a history file"));
    }
    parse(&text)
}

/// Parses history lines (see the module docs).
pub fn parse(text: &str) -> History {
    let mut attempts = Vec::new();
    let mut holds: BTreeMap<HoldId, Hold> = BTreeMap::new();
    let mut writes: Vec<(HoldId, StoreWrite)> = Vec::new();
    let mut releases: Vec<(HoldId, Release)> = Vec::new();
    let mut losses: Vec<(HoldId, u64)> = Vec::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let mut words = line.split(' ');
        let kind = words.next().unwrap_or_default();
        let fields: HashMap<&str, &str> = words
            .map(|word| word.split_once('=').unwrap_or((word, "")))
            .collect();
        let text_of = |name: &str| -> &str {
            fields
                .get(name)
                .copied()
                .unwrap_or_else(|| panic!("history line without {name}: {line}"))
        };
        let number = |name: &str| -> u64 {
            text_of(name)
                .parse()
                .unwrap_or_else(|_| panic!("history line with a bad {name}: {line}"))
        };
        let id = HoldId {
            proc: number("proc") as u32,
            task: number("task") as u32,
            seq: number("seq"),
        };
        match kind {
            "attempt" => {
                let result = match text_of("result") {
                    "acquired" => AttemptResult::Acquired,
                    "timeout" => AttemptResult::Timeout,
                    other => AttemptResult::Error(
                        other.strip_prefix("error:").unwrap_or(other).to_string(),
                    ),
                };
                attempts.push(Attempt {
                    id,
                    t_req: number("t_req"),
                    t_ret: number("t_ret"),
                    wait: number("wait"),
                    result,
                });
            }
            "acquired" => {
                let lease = number("lease");
                holds.insert(
                    id,
                    Hold {
                        id,
                        token: number("token"),
                        t_req: number("t_req"),
                        t_acq: number("t_acq"),
                        lease: (lease > 0).then_some(lease),
                        writes: Vec::new(),
                        release: None,
                        lost_at: None,
                    },
                );
            }
            "write" => writes.push((
                id,
                StoreWrite {
                    start: number("start"),
                    end: number("end"),
                    accepted: number("accepted") == 1,
                },
            )),
            "released" => {
                let outcome = match text_of("outcome") {
                    "released" => Outcome::Released,
                    "lost" => Outcome::Lost,
                    "failed" => Outcome::ReleaseFailed,
                    other => panic!("unknown outcome {other}: {line}"),
                };
                releases.push((
                    id,
                    Release {
                        t_start: number("t_start"),
                        t_end: number("t_end"),
                        outcome,
                        lost_before: number("lost_before") == 1,
                    },
                ));
            }
            "lost" => losses.push((id, number("t_lost"))),
            other => panic!("unknown history record {other}: {line}"),
        }
    }
    for (id, write) in writes {
        holds
            .get_mut(&id)
            .unwrap_or_else(|| panic!("a write of {id}, which was never acquired"))
            .writes
            .push(write);
    }
    for (id, release) in releases {
        holds
            .get_mut(&id)
            .unwrap_or_else(|| panic!("a release of {id}, which was never acquired"))
            .release = Some(release);
    }
    for (id, t_lost) in losses {
        holds
            .get_mut(&id)
            .unwrap_or_else(|| panic!("a loss of {id}, which was never acquired"))
            .lost_at = Some(t_lost);
    }
    History {
        attempts,
        holds: holds.into_values().collect(),
    }
}

/// Tolerances of the checker. None of them is about speed: each only absorbs clock
/// granularity or the scheduling noise of a loaded machine.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// How far past its `wait` an `acquire` may return (the last attempt's round trip,
    /// or the response timeout when Redis does not answer).
    pub wait_overshoot: Duration,
    /// Redis counts expiries in whole milliseconds of its own clock.
    pub expiry_slack: Duration,
    /// Processes that were killed: their unreleased holds expired instead.
    pub killed: HashSet<u32>,
    /// How much later than a new holder's acquisition the old holder may have recorded
    /// that its guard said lost: the old holder's timer and the new holder's reply
    /// fire at the same lease end, and either process may be scheduled late.
    pub lost_slack: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            wait_overshoot: Duration::from_secs(1),
            expiry_slack: Duration::from_millis(2),
            killed: HashSet::new(),
            lost_slack: Duration::from_millis(500),
        }
    }
}

/// What the checker saw in a history that passed.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub holds: usize,
    pub attempts: usize,
    pub timeouts: usize,
    pub errors: usize,
    /// Holds that ended with `release` returning `Lost`, or whose process died.
    pub lost: usize,
    /// Pairs of holds that overlapped because the earlier had lost its lease.
    pub overlaps: usize,
    pub rejected_writes: usize,
    /// The largest amount by which an `acquire` outlived its `wait`.
    pub worst_overshoot: Duration,
}

/// Checks a history; panics listing every violation found.
pub fn assert_valid(history: &History, bounds: &Bounds) -> Summary {
    let (summary, violations) = check(history, bounds);
    if !violations.is_empty() {
        let mut message = format!(
            "{} violation(s) in a history of {} holds:\n",
            violations.len(),
            history.holds.len()
        );
        for violation in violations.iter().take(25) {
            let _ = writeln!(message, "  - {violation}");
        }
        panic!("{message}");
    }
    summary
}

/// Checks a history; returns what it saw and every violation.
///
/// 1. Every acquisition was released, or expired (its `release` said `Lost`, or its
///    process was killed).
/// 2. Fencing tokens are unique and strictly increase in acquisition order: when one
///    acquisition certainly came before another (it returned before the other was
///    asked for), its token is smaller.
/// 3. No two holds overlap, unless the earlier one had lost its lease; then the later
///    one was acquired no earlier than the earlier's lease could have run out (and,
///    where the earlier holder watched its guard, not before that guard said lost,
///    give or take `bounds.lost_slack`), has the larger token, and every write the
///    stale holder made after the new holder's first accepted write was rejected by
///    the store.
/// 4. The store rejected only writers that had lost their lock.
/// 5. No `acquire` returned later than its `wait` plus `bounds.wait_overshoot`, and
///    every successful one left an acquisition record.
pub fn check(history: &History, bounds: &Bounds) -> (Summary, Vec<String>) {
    let mut violations = Vec::new();
    let mut summary = Summary {
        holds: history.holds.len(),
        attempts: history.attempts.len(),
        ..Summary::default()
    };

    // 1. Released or expired.
    for hold in &history.holds {
        match hold.release {
            None if bounds.killed.contains(&hold.id.proc) => summary.lost += 1,
            None => violations.push(format!(
                "hold {} (token {}) was never released, and its process was not killed",
                hold.id, hold.token
            )),
            Some(release) => {
                if release.outcome == Outcome::Lost {
                    summary.lost += 1;
                }
                if release.outcome == Outcome::ReleaseFailed && hold.lease.is_none() {
                    violations.push(format!(
                        "hold {} failed to release in watchdog mode: nothing bounds its life",
                        hold.id
                    ));
                }
            }
        }
    }

    // 2. Tokens: unique, and increasing in acquisition order.
    let mut seen = HashMap::new();
    for hold in &history.holds {
        if let Some(other) = seen.insert(hold.token, hold.id) {
            violations.push(format!(
                "token {} was given to both {other} and {}",
                hold.token, hold.id
            ));
        }
    }
    let mut by_acquisition: Vec<&Hold> = history.holds.iter().collect();
    by_acquisition.sort_by_key(|hold| (hold.t_acq, hold.id));
    // highest[i]: the holder of the largest token among the first i+1 acquisitions.
    let mut highest: Vec<&Hold> = Vec::with_capacity(by_acquisition.len());
    for hold in &by_acquisition {
        let best = match highest.last() {
            Some(best) if best.token >= hold.token => best,
            _ => hold,
        };
        highest.push(best);
    }
    for hold in &by_acquisition {
        // Acquisitions that returned before this one was asked for.
        let before = by_acquisition.partition_point(|earlier| earlier.t_acq < hold.t_req);
        if before > 0 {
            let earlier = highest[before - 1];
            if earlier.token >= hold.token {
                violations.push(format!(
                    "token {} of {} is not above token {} of {}, acquired {:?} before it was asked for",
                    hold.token,
                    hold.id,
                    earlier.token,
                    earlier.id,
                    clock::span(earlier.t_acq, hold.t_req)
                ));
            }
        }
    }

    // 3. Overlaps: a sweep over the holds in acquisition order.
    let mut open: Vec<&Hold> = Vec::new();
    for later in &by_acquisition {
        open.retain(|earlier| earlier.end() > later.t_acq);
        for earlier in &open {
            summary.overlaps += 1;
            check_overlap(earlier, later, bounds, &mut violations);
        }
        open.push(later);
    }

    // 4. Rejected writes belong to holders that had lost the lock.
    for hold in &history.holds {
        for _rejected in hold.writes.iter().filter(|write| !write.accepted) {
            summary.rejected_writes += 1;
            let expired = match hold.release {
                None => bounds.killed.contains(&hold.id.proc),
                Some(release) => release.outcome == Outcome::Lost,
            };
            if !expired {
                violations.push(format!(
                    "the store rejected a write of {} (token {}), which had not lost its lock",
                    hold.id, hold.token
                ));
            }
        }
    }

    // 5. Waits.
    let acquired: HashSet<HoldId> = history.holds.iter().map(|hold| hold.id).collect();
    for attempt in &history.attempts {
        let took = attempt.t_ret.saturating_sub(attempt.t_req);
        let overshoot = Duration::from_nanos(took.saturating_sub(attempt.wait));
        summary.worst_overshoot = summary.worst_overshoot.max(overshoot);
        if overshoot > bounds.wait_overshoot {
            violations.push(format!(
                "acquire {} ({:?}) returned after {:?}, past its wait of {:?}",
                attempt.id,
                attempt.result,
                Duration::from_nanos(took),
                Duration::from_nanos(attempt.wait)
            ));
        }
        match &attempt.result {
            AttemptResult::Acquired if !acquired.contains(&attempt.id) => violations.push(format!(
                "acquire {} succeeded but left no acquisition record",
                attempt.id
            )),
            AttemptResult::Acquired => {}
            AttemptResult::Timeout => summary.timeouts += 1,
            AttemptResult::Error(_) => summary.errors += 1,
        }
    }
    (summary, violations)
}

fn check_overlap(earlier: &Hold, later: &Hold, bounds: &Bounds, violations: &mut Vec<String>) {
    let overlap = clock::span(later.t_acq, earlier.end().min(later.end()));
    let lost = match earlier.release {
        None => bounds.killed.contains(&earlier.id.proc),
        Some(release) => release.outcome == Outcome::Lost,
    };
    if !lost {
        violations.push(format!(
            "holds {} (token {}) and {} (token {}) overlap by {overlap:?}, and the earlier had not lost its lease ({:?})",
            earlier.id,
            earlier.token,
            later.id,
            later.token,
            earlier.release.map(|release| release.outcome)
        ));
        return;
    }
    if later.token <= earlier.token {
        violations.push(format!(
            "{} took over from {}, which had lost its lease, with a token {} not above its {}",
            later.id, earlier.id, later.token, earlier.token
        ));
    }
    if let Some(expiry) = earlier.earliest_expiry()
        && later.t_acq + clock::nanos(bounds.expiry_slack) < expiry
    {
        violations.push(format!(
            "{} acquired {:?} before the lease of {} could have run out",
            later.id,
            clock::span(later.t_acq, expiry),
            earlier.id
        ));
    }
    if let Some(lost_at) = earlier.lost_at
        && later.t_acq + clock::nanos(bounds.lost_slack) < lost_at
    {
        violations.push(format!(
            "{} acquired {:?} before the guard of {} said its lock was lost",
            later.id,
            clock::span(later.t_acq, lost_at),
            earlier.id
        ));
    }
    let Some(first_accepted) = later
        .writes
        .iter()
        .filter(|write| write.accepted)
        .map(|write| write.end)
        .min()
    else {
        return;
    };
    for write in &earlier.writes {
        if write.start > first_accepted && write.accepted {
            violations.push(format!(
                "the store accepted a stale write of {} (token {}) made after {} (token {}) had written",
                earlier.id, earlier.token, later.id, later.token
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The checker must catch what it claims to catch: synthetic histories.
    use super::*;

    const MS: u64 = 1_000_000;

    fn lines(text: &str) -> History {
        parse(text)
    }

    fn hold(seq: u64, token: u64, from_ms: u64, to_ms: u64, outcome: &str) -> String {
        let (req, acq, rel) = (from_ms * MS, from_ms * MS + MS / 2, to_ms * MS);
        format!(
            "attempt proc=1 task=0 seq={seq} t_req={req} t_ret={acq} wait={} result=acquired\n\
             acquired proc=1 task=0 seq={seq} token={token} t_req={req} t_acq={acq} lease={}\n\
             write proc=1 task=0 seq={seq} token={token} start={acq} end={} accepted=1\n\
             released proc=1 task=0 seq={seq} t_start={rel} t_end={} outcome={outcome} lost_before=0\n",
            1000 * MS,
            100 * MS,
            acq + 1,
            rel + MS
        )
    }

    fn violations(history: &History) -> Vec<String> {
        check(history, &Bounds::default()).1
    }

    #[test]
    fn a_clean_history_passes() {
        let history = lines(&(hold(1, 10, 0, 5, "released") + &hold(2, 11, 6, 9, "released")));
        assert_eq!(violations(&history), Vec::<String>::new());
    }

    #[test]
    fn overlapping_holds_are_caught() {
        let history = lines(&(hold(1, 10, 0, 5, "released") + &hold(2, 11, 3, 9, "released")));
        let found = violations(&history);
        assert!(found.iter().any(|v| v.contains("overlap")), "{found:?}");
    }

    #[test]
    fn an_overlap_before_the_lease_ran_out_is_caught_even_if_lost() {
        let history = lines(&(hold(1, 10, 0, 500, "lost") + &hold(2, 11, 50, 60, "released")));
        let found = violations(&history);
        assert!(
            found.iter().any(|v| v.contains("before the lease")),
            "{found:?}"
        );
    }

    #[test]
    fn a_takeover_after_the_lease_is_fine_but_needs_a_larger_token() {
        let fine = lines(&(hold(1, 10, 0, 500, "lost") + &hold(2, 11, 101, 120, "released")));
        assert_eq!(violations(&fine), Vec::<String>::new());
        let smaller = lines(&(hold(1, 10, 0, 500, "lost") + &hold(2, 9, 101, 120, "released")));
        let found = violations(&smaller);
        assert!(found.iter().any(|v| v.contains("not above")), "{found:?}");
    }

    #[test]
    fn tokens_must_increase_and_be_unique() {
        let history = lines(&(hold(1, 10, 0, 5, "released") + &hold(2, 10, 6, 9, "released")));
        let found = violations(&history);
        assert!(
            found.iter().any(|v| v.contains("given to both")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|v| v.contains("is not above")),
            "{found:?}"
        );
    }

    #[test]
    fn a_takeover_before_the_old_guard_said_lost_is_caught() {
        let mut text = hold(1, 10, 0, 1500, "lost") + &hold(2, 11, 101, 120, "released");
        // The old holder's guard said lost only 1.1 s after the new holder acquired.
        text.push_str(&format!("lost proc=1 task=0 seq=1 t_lost={}\n", 1200 * MS));
        let found = violations(&lines(&text));
        assert!(
            found.iter().any(|v| v.contains("before the guard")),
            "{found:?}"
        );
        let mut timely = hold(1, 10, 0, 500, "lost") + &hold(2, 11, 101, 120, "released");
        timely.push_str(&format!("lost proc=1 task=0 seq=1 t_lost={}\n", 100 * MS));
        assert_eq!(violations(&lines(&timely)), Vec::<String>::new());
    }

    #[test]
    fn an_accepted_stale_write_is_caught() {
        let mut text = hold(1, 10, 0, 500, "lost") + &hold(2, 11, 101, 120, "released");
        text.push_str(&format!(
            "write proc=1 task=0 seq=1 token=10 start={} end={} accepted=1\n",
            130 * MS,
            131 * MS
        ));
        let found = violations(&lines(&text));
        assert!(found.iter().any(|v| v.contains("stale write")), "{found:?}");
    }

    #[test]
    fn a_rejected_write_of_a_holder_in_good_standing_is_caught() {
        let mut text = hold(1, 10, 0, 5, "released");
        text.push_str(&format!(
            "write proc=1 task=0 seq=1 token=10 start={} end={} accepted=0\n",
            2 * MS,
            3 * MS
        ));
        let found = violations(&lines(&text));
        assert!(
            found.iter().any(|v| v.contains("had not lost")),
            "{found:?}"
        );
    }

    #[test]
    fn unreleased_holds_and_long_waits_are_caught() {
        let text = format!(
            "attempt proc=1 task=0 seq=1 t_req=0 t_ret={} wait={} result=timeout\n\
             acquired proc=2 task=0 seq=1 token=5 t_req=0 t_acq=1 lease=0\n",
            3000 * MS,
            1000 * MS
        );
        let history = lines(&text);
        let found = violations(&history);
        assert!(
            found.iter().any(|v| v.contains("never released")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|v| v.contains("past its wait")),
            "{found:?}"
        );
        let killed = Bounds {
            killed: HashSet::from([2]),
            wait_overshoot: Duration::from_secs(5),
            ..Bounds::default()
        };
        assert_eq!(check(&history, &killed).1, Vec::<String>::new());
    }
}
