//! Runs the examples with small parameters, so that they cannot rot: exit codes and the
//! lines a newcomer reads. Each run starts its own throwaway redis-server (REDLOCK_URL is
//! removed from the child's environment), never on port 6379.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory of the built example binaries (`target/<profile>/examples`).
///
/// `cargo test` builds the examples before it runs the tests, but `cargo test --test
/// examples` does not, so build them here too (a no-op when they are up to date).
fn examples_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        redlock_testkit::build::build_into_own_target(&[
            "--example",
            "lottery",
            "--example",
            "orders",
            "--example",
            "metrics",
        ])
        .join("examples")
    })
}

struct Run {
    success: bool,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs an example with `args`, killing it after `limit`.
fn run_example(name: &str, args: &[&str], limit: Duration) -> Run {
    let binary = examples_dir().join(name);
    let started = Instant::now();
    let mut child = Command::new(&binary)
        .args(args)
        .env_remove("REDLOCK_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("start {}: {error}", binary.display()));
    let pipe = |mut reader: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = reader.read_to_string(&mut text);
            text
        })
    };
    let stdout = pipe(Box::new(child.stdout.take().expect("stdout")));
    let stderr = pipe(Box::new(child.stderr.take().expect("stderr")));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} {args:?} still running after {limit:?}; output so far:\n{}",
                stdout.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = Run {
        success: status.success(),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
        took: started.elapsed(),
    };
    eprintln!(
        "--- {name} {} ({:.1?}, {status})\n{}{}",
        args.join(" "),
        run.took,
        run.stdout,
        run.stderr
    );
    run
}

fn round_line(stdout: &str, round: u32) -> &str {
    let prefix = format!("round {round} at ");
    stdout
        .lines()
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for round {round} in:\n{stdout}"))
}

#[test]
fn lottery_draws_each_round_exactly_once() {
    let run = run_example(
        "lottery",
        &[
            "--workers",
            "3",
            "--rounds",
            "2",
            "--every",
            "2",
            "--skew-ms",
            "1000",
        ],
        Duration::from_secs(60),
    );
    assert!(run.success, "the lottery failed:\n{}", run.stdout);
    assert!(run.stdout.contains("started a throwaway redis-server"));
    for round in 1..=2 {
        let line = round_line(&run.stdout, round);
        assert!(line.contains("drew, fencing token"), "{line}");
        assert!(line.contains("2 skipped"), "{line}");
        // The late worker found the lock kept by hold_at_least.
        assert!(line.contains("worker 3 fired"), "{line}");
    }
    assert!(
        run.stdout
            .contains("exactly-once check passed: 2 rounds, 2 draws in Redis, one per round"),
        "{}",
        run.stdout
    );
}

#[test]
fn lottery_without_hold_at_least_is_caught_drawing_twice() {
    let run = run_example(
        "lottery",
        &[
            "--workers",
            "2",
            "--rounds",
            "1",
            "--every",
            "2",
            "--skew-ms",
            "1000",
            "--without-hold-at-least",
        ],
        Duration::from_secs(60),
    );
    assert!(
        !run.success,
        "the check should have failed:\n{}",
        run.stdout
    );
    assert!(round_line(&run.stdout, 1).contains("DRAWN 2 TIMES"));
    assert!(run.stdout.contains("exactly-once check FAILED"));
    assert!(run.stdout.contains("was drawn 2 times"), "{}", run.stdout);
}

/// The number right after `marker` in `line`.
fn number_after(line: &str, marker: &str) -> u64 {
    let rest = line
        .split_once(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in {line:?}"))
        .1;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {marker:?} in {line:?}"))
}

#[test]
fn lottery_leader_is_replaced_within_the_lease_after_a_sigkill() {
    let lease_ms = 1000;
    let run = run_example(
        "lottery",
        &[
            "--mode",
            "leader",
            "--workers",
            "3",
            "--rounds",
            "3",
            "--every",
            "1",
            "--lease-ms",
            "1000",
            "--kill-leader-after",
            "1",
        ],
        Duration::from_secs(60),
    );
    assert!(run.success, "the lottery failed:\n{}", run.stdout);
    // One leader at first, the two others candidates.
    assert!(
        run.stdout
            .lines()
            .any(|line| line.contains("elected scheduler") && line.ends_with("wait as candidates")),
        "{}",
        run.stdout
    );
    // The coordinator killed the worker leader() named, right after round 1.
    let kill = run
        .stdout
        .lines()
        .find(|line| line.contains("SIGKILL to worker "))
        .unwrap_or_else(|| panic!("no kill in:\n{}", run.stdout));
    let killed = number_after(kill, "SIGKILL to worker ");
    assert!(
        kill.contains(&format!("leader() names lottery-worker-{killed} ")),
        "{kill}"
    );
    let first = round_line(&run.stdout, 1);
    assert_eq!(number_after(first, ": worker "), killed, "{first}");
    let old_term = number_after(first, "term ");
    // Another worker took over once the dead leader's lease ran out (not before: at most
    // one leader within a lease), and no later than the lease plus a small bound.
    let takeover = run
        .stdout
        .lines()
        .find(|line| line.starts_with("takeover: worker "))
        .unwrap_or_else(|| panic!("no takeover in:\n{}", run.stdout));
    let successor = number_after(takeover, "takeover: worker ");
    assert_ne!(successor, killed, "{takeover}");
    let after_ms = number_after(takeover, "took over ");
    assert!(
        (lease_ms / 2..=lease_ms + 1000).contains(&after_ms),
        "took over {after_ms} ms after the kill, the lease is {lease_ms} ms: {takeover}"
    );
    let new_term = number_after(takeover, " -> ");
    assert_eq!(number_after(takeover, "; term "), old_term, "{takeover}");
    assert!(new_term > old_term, "{takeover}");
    // The new leader drew the rest, in its term, and nothing twice.
    for round in 2..=3 {
        let line = round_line(&run.stdout, round);
        assert_eq!(number_after(line, ": worker "), successor, "{line}");
        assert_eq!(number_after(line, "term "), new_term, "{line}");
    }
    assert!(
        run.stdout
            .contains("exactly-once check passed: 3 rounds, 3 draws in Redis, one per round"),
        "{}",
        run.stdout
    );
}

#[test]
fn orders_are_charged_exactly_once_and_stale_writes_are_fenced() {
    let run = run_example(
        "orders",
        &["--orders", "3", "--attempts", "6"],
        Duration::from_secs(60),
    );
    assert!(run.success, "orders failed:\n{}", run.stdout);
    assert_eq!(run.stdout.matches("charged once ✓").count(), 3);
    assert!(run.stdout.contains("every order charged exactly once"));
    assert!(run.stdout.contains("the ledger rejected the write"));
    assert!(run.stdout.contains("fencing check passed"));
}

#[test]
fn orders_without_the_lock_double_charge() {
    let run = run_example(
        "orders",
        &["--orders", "3", "--attempts", "6", "--without-lock"],
        Duration::from_secs(60),
    );
    assert!(run.success, "{}", run.stdout);
    assert!(run.stdout.contains(" times ✗"), "{}", run.stdout);
    assert!(run.stdout.contains("double charges"), "{}", run.stdout);
}

#[test]
fn metrics_are_scraped_from_the_prometheus_exporter() {
    let run = run_example("metrics", &[], Duration::from_secs(60));
    assert!(run.success, "metrics failed:\n{}{}", run.stdout, run.stderr);
    for line in [
        "# TYPE redlock_acquire_seconds histogram",
        // The attribute's three orders: one series, labelled with the key's template.
        r#"redlock_acquire_seconds_count{lock="order:<id>",outcome="acquired"} 3"#,
        r#"redlock_hold_seconds_count{lock="order:<id>"} 3"#,
        r#"redlock_acquire_seconds_count{lock="export",outcome="timeout"} 1"#,
        r#"redlock_lost_total{lock="invoice",cause="forced"} 1"#,
        r#"redlock_waiting{lock="report"} 0"#,
    ] {
        assert!(
            run.stdout.lines().any(|got| got == line),
            "no line {line:?} in:\n{}",
            run.stdout
        );
    }
    assert!(
        run.stdout
            .contains(r#"redlock_renewals_total{lock="export"} "#),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("order:1"), "an id in a label");
}
