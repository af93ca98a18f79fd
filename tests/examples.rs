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

/// The draws of each round in the lottery's database, as (worker, token), by round
/// time.
fn draws_in_database(db: &std::path::Path) -> std::collections::BTreeMap<String, Vec<(i64, i64)>> {
    let connection = rusqlite::Connection::open(db).expect("open the lottery database");
    let mut query = connection
        .prepare("SELECT round_at, worker, token FROM draws ORDER BY id")
        .unwrap();
    let mut draws = std::collections::BTreeMap::<String, Vec<(i64, i64)>>::new();
    for row in query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
    {
        let (round, worker, token) = row.unwrap();
        draws.entry(round).or_default().push((worker, token));
    }
    draws
}

#[test]
fn lottery_draws_each_round_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lottery.db");
    let run = run_example(
        "lottery",
        &[
            "--workers",
            "3",
            "--rounds",
            "2",
            "--cron",
            "*/2 * * * * *",
            "--skew-ms",
            "1000",
            "--db",
            db.to_str().unwrap(),
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
        run.stdout.contains(
            "exactly-once check passed: 2 rounds, 2 draws in the database, one per round"
        ),
        "{}",
        run.stdout
    );
    // The database, read by the test: two rounds, one draw each.
    let draws = draws_in_database(&db);
    assert_eq!(draws.len(), 2, "{draws:?}");
    assert!(draws.values().all(|round| round.len() == 1), "{draws:?}");
}

#[test]
fn lottery_without_hold_at_least_is_caught_drawing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lottery.db");
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
            "--db",
            db.to_str().unwrap(),
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
    let draws = draws_in_database(&db);
    assert!(draws.values().any(|round| round.len() == 2), "{draws:?}");
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
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lottery.db");
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
            "--db",
            db.to_str().unwrap(),
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
        run.stdout.contains(
            "exactly-once check passed: 3 rounds, 3 draws in the database, one per round"
        ),
        "{}",
        run.stdout
    );
    // The database: one draw per round, each with the term of its drawer, and the
    // scheduler's fence at the new leader's term.
    let draws = draws_in_database(&db);
    assert_eq!(draws.len(), 3, "{draws:?}");
    let terms: Vec<u64> = draws
        .values()
        .map(|round| {
            assert_eq!(round.len(), 1, "{draws:?}");
            round[0].1 as u64
        })
        .collect();
    assert_eq!(terms, [old_term, new_term, new_term], "{draws:?}");
    let connection = rusqlite::Connection::open(&db).unwrap();
    let fence: i64 = connection
        .query_row(
            "SELECT fence FROM fences WHERE lock = 'lottery-scheduler'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert!(fence as u64 >= new_term, "fence {fence}, term {new_term}");
}

/// The charges of each order, as (fencing token, instance), read from the order
/// service's database after its run.
fn charges_in_database(
    db: &std::path::Path,
) -> std::collections::BTreeMap<u64, Vec<(i64, String)>> {
    let connection = rusqlite::Connection::open(db).expect("open the orders database");
    let mut orders = std::collections::BTreeMap::new();
    let mut ids = connection.prepare("SELECT id FROM orders").unwrap();
    for id in ids.query_map([], |row| row.get::<_, i64>(0)).unwrap() {
        orders.insert(id.unwrap() as u64, Vec::new());
    }
    let mut charges = connection
        .prepare("SELECT order_id, fence, instance FROM charges ORDER BY id")
        .unwrap();
    let rows = charges
        .query_map([], |row| {
            Ok((row.get::<_, i64>(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    for row in rows {
        let (order, fence, instance) = row.unwrap();
        orders
            .entry(order as u64)
            .or_insert_with(Vec::new)
            .push((fence, instance));
    }
    orders
}

/// Balance of each customer (one per order, same number), in cents.
fn balances_in_database(db: &std::path::Path) -> std::collections::BTreeMap<u64, (i64, i64)> {
    let connection = rusqlite::Connection::open(db).expect("open the orders database");
    let mut query = connection
        .prepare(
            "SELECT o.id, o.amount, c.balance FROM orders o JOIN customers c ON c.id = o.customer",
        )
        .unwrap();
    query
        .query_map([], |row| {
            Ok((row.get::<_, i64>(0)? as u64, (row.get(1)?, row.get(2)?)))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The accounts of the transfers as (id, balance in cents, fence), by id.
fn accounts_in_database(db: &std::path::Path) -> Vec<(u64, i64, i64)> {
    let connection = rusqlite::Connection::open(db).expect("open the orders database");
    let mut query = connection
        .prepare("SELECT id, balance, fence FROM accounts ORDER BY id")
        .unwrap();
    query
        .query_map([], |row| {
            Ok((row.get::<_, i64>(0)? as u64, row.get(1)?, row.get(2)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn orders_are_charged_exactly_once_across_instance_processes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    let run = run_example(
        "orders",
        &[
            "--scene",
            "payments,transfers",
            "--orders",
            "3",
            "--attempts",
            "6",
            "--transfers",
            "36",
            "--db",
            db.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(run.success, "orders failed:\n{}{}", run.stdout, run.stderr);
    let charges = charges_in_database(&db);
    let balances = balances_in_database(&db);
    for id in 1..=3 {
        assert_eq!(charges[&id].len(), 1, "order {id}: {:?}", charges[&id]);
        let (amount, balance) = balances[&id];
        assert_eq!(balance, 10_000 - amount, "order {id}'s customer");
    }
    // Different instances charged them: the requests went over HTTP to all three.
    // (Not asserted: which instance wins an order is up to the race.)
    assert!(
        run.stdout
            .contains("every order charged exactly once (counted in the database)")
    );
    // The transfers, crossing between the 4 accounts: all done, none waited out its
    // wait, none refused by the fence; no money made or lost.
    assert!(
        run.stdout
            .contains("transfers: 36 done, 0 timed out, 0 refused by the database, 0 failed"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(
            "sum of the balances: 4000.00 before, 4000.00 after: unchanged ✓; none negative"
        ),
        "{}",
        run.stdout
    );
    let accounts = accounts_in_database(&db);
    assert_eq!(accounts.len(), 4, "{accounts:?}");
    assert_eq!(
        accounts.iter().map(|(_, balance, _)| balance).sum::<i64>(),
        4 * 100_000,
        "{accounts:?}"
    );
    // Every account was written, each with a fencing token of its own lock.
    assert!(
        accounts
            .iter()
            .all(|&(_, balance, fence)| balance >= 0 && fence > 0),
        "{accounts:?}"
    );
    // Graceful shutdown: the payment under way when SIGTERM came was finished, once,
    // and its lock released; every instance exited 0.
    assert_eq!(charges[&100].len(), 1, "{:?}", charges[&100]);
    assert!(
        run.stdout.contains("order:100 after the exit: released"),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stdout.matches("exited: exit status: 0").count(),
        3,
        "{}",
        run.stdout
    );
}

#[test]
fn orders_without_the_lock_double_charge() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    let run = run_example(
        "orders",
        &[
            "--orders",
            "3",
            "--attempts",
            "6",
            "--without-lock",
            "--db",
            db.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(run.success, "{}", run.stdout);
    assert!(run.stdout.contains(" times ✗"), "{}", run.stdout);
    assert!(run.stdout.contains("double charges"), "{}", run.stdout);
    let charges = charges_in_database(&db);
    assert!(
        (1..=3).any(|id| charges[&id].len() > 1),
        "no double charge in the database: {charges:?}"
    );
    // The transfers' lost updates: money created or lost.
    let accounts = accounts_in_database(&db);
    let sum: i64 = accounts.iter().map(|(_, balance, _)| balance).sum();
    assert_ne!(sum, 4 * 100_000, "the sum did not change: {accounts:?}");
    assert!(
        run.stdout.contains(" created ✗") || run.stdout.contains(" lost ✗"),
        "{}",
        run.stdout
    );
}

#[test]
fn orders_pause_the_database_refuses_the_stale_write_of_a_sigstopped_instance() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    let run = run_example(
        "orders",
        &[
            "--scene",
            "pause",
            "--instances",
            "2",
            "--db",
            db.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(run.success, "orders failed:\n{}{}", run.stdout, run.stderr);
    // The paused instance's HTTP answer: 409, with its token and the newer one.
    let answer = run
        .stdout
        .lines()
        .find_map(|line| {
            line.split_once("a answers: 409 ")
                .map(|(_, json)| json.to_owned())
        })
        .unwrap_or_else(|| panic!("no 409 from instance a in:\n{}", run.stdout));
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let stale = answer["token"].as_u64().expect("a's token");
    let seen = answer["seen"].as_u64().expect("the newer token");
    assert!(stale < seen, "{answer}");
    assert_eq!(
        answer["result"],
        "refused by the database: stale fencing token"
    );
    // The database holds one charge, b's, with the newer token; a's write left nothing.
    let charges = charges_in_database(&db);
    assert_eq!(
        charges[&99],
        vec![(seen as i64, "b".to_owned())],
        "{charges:?}"
    );
    let (amount, balance) = balances_in_database(&db)[&99];
    assert_eq!(balance, 10_000 - amount);
    let connection = rusqlite::Connection::open(&db).unwrap();
    let fence: i64 = connection
        .query_row("SELECT fence FROM orders WHERE id = 99", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert_eq!(fence as u64, seen);
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
