//! The `redlock` command (`redlock-runtime/src/bin/redlock.rs`, feature `cli`), run as a
//! subprocess against throwaway redis-server processes: what an on-call engineer types
//! and reads — the table, the JSON, the exit codes, the one-line errors, `watch` — and
//! that it agrees with what the API (`inspect`, `locks`) reports. REDLOCK_URL is removed
//! from the child's environment unless a test sets it; never port 6379.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::raw;
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError, LockGuard, LockInfo};
use redlock_testkit::RedisServer;

/// The holder name every test's locks carry, as the CLI must show it.
const HOLDER: &str = "billing-7";

/// How long one run of the command may take before it is killed.
const RUN_LIMIT: Duration = Duration::from_secs(20);

/// The built `redlock` binary (`target/<profile>/redlock`).
///
/// It is a binary of the `redlock-runtime` crate behind its `cli` feature, which `cargo
/// test` does not build for the root package: build it here, once, into the same target
/// directory (a no-op when it is up to date).
fn binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        redlock_testkit::build::build_into_own_target(&[
            "-p",
            "redlock-runtime",
            "--features",
            "cli",
            "--bin",
            "redlock",
        ])
        .join("redlock")
    })
}

/// The command with a clean environment: no REDLOCK_URL, no RUST_LOG, and
/// RUST_BACKTRACE=1, so that a panic would show its backtrace.
fn command(args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_remove("REDLOCK_URL")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A child process killed (and reaped) when dropped: a failing test leaves none behind.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Debug)]
struct Run {
    /// The exit code; `None` when a signal ended the process.
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `redlock args` with `env` added, killing it after [`RUN_LIMIT`].
fn run_blocking(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = command(args);
    command.envs(env.iter().copied());
    let mut child = Running(
        command
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", binary().display())),
    );
    let pipe = |mut reader: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = reader.read_to_string(&mut text);
            text
        })
    };
    let stdout = pipe(Box::new(child.0.stdout.take().expect("stdout")));
    let stderr = pipe(Box::new(child.0.stderr.take().expect("stderr")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait for redlock") {
            break status;
        }
        if started.elapsed() > RUN_LIMIT {
            drop(child);
            panic!(
                "redlock {args:?} still running after {RUN_LIMIT:?}; output so far:\n{}",
                stdout.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let run = Run {
        code: status.code(),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    };
    eprintln!(
        "--- redlock {} ({status})\n{}{}",
        args.join(" "),
        run.stdout,
        run.stderr
    );
    run
}

/// [`run_blocking`] off the runtime's threads, so the test's own clients keep renewing.
async fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        run_blocking(&args, &env)
    })
    .await
    .expect("the run did not panic")
}

/// `redlock --url <server> args…`
async fn run_on(server: &RedisServer, args: &[&str]) -> Run {
    let url = server.url();
    let mut full = vec!["--url", url.as_str()];
    full.extend_from_slice(args);
    run(&full, &[]).await
}

/// The client whose locks the command is asked about, named as an operator would see it.
async fn billing(server: &RedisServer) -> LockClient {
    // Build the command first: on a clean checkout that takes longer than the leases
    // the tests hold while they run it.
    tokio::task::spawn_blocking(|| {
        binary();
    })
    .await
    .expect("the build did not panic");
    LockClient::builder(&server.url())
        .name(HOLDER)
        .connect()
        .await
        .expect("connect")
}

async fn hold(client: &LockClient, key: &str) -> LockGuard {
    client
        .lock(key)
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap_or_else(|error| panic!("lock {key}: {error}"))
}

/// The table's rows (header and `(no locks)` left out), each split into its six cells
/// (holder names and keys here have no spaces; the header's do).
fn rows(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .skip(1)
        .filter(|line| *line != "(no locks)")
        .map(|line| line.split_whitespace().collect())
        .collect()
}

fn assert_header(table: &str) {
    let header = table.lines().next().unwrap_or_default();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>().join(" "),
        "KEY HOLDER HELD FOR TTL FENCING TOKEN WAITING",
        "{table}"
    );
}

/// Asserts `run` failed as the command promises: exit code 2, nothing on stdout and
/// exactly one line on stderr, `redlock: …`, with no trace of a panic or a backtrace.
fn assert_one_line_error(run: &Run) -> &str {
    assert_eq!(run.code, Some(2), "{run:?}");
    assert_eq!(run.stdout, "", "{run:?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line on stderr: {run:?}");
    assert!(lines[0].starts_with("redlock: "), "{run:?}");
    let lower = run.stderr.to_lowercase();
    for trace in ["panicked", "backtrace", "stack backtrace", "rust_backtrace"] {
        assert!(!lower.contains(trace), "{trace:?} on stderr: {run:?}");
    }
    lines[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_prints_a_table_of_every_lock_and_no_application_keys() {
    let server = RedisServer::start();
    let client = billing(&server).await;
    let guards = [
        hold(&client, "order:1").await,
        hold(&client, "order:2").await,
        hold(&client, "invoice:9").await,
    ];
    // Application keys the command must not take for locks, one of them matching
    // `order:*`; and redlock's own keys (the fencing counter) exist by now.
    let mut data = raw(&server).await;
    let _: () = data.set("order:app", "hello").await.unwrap();
    let _: () = data.hset("order:hash", "field", "1").await.unwrap();
    let _: () = data.set("config:limit", "42").await.unwrap();

    let all = run_on(&server, &["list"]).await;
    assert_eq!(all.code, Some(0), "{all:?}");
    assert_header(&all.stdout);
    let listed = rows(&all.stdout);
    let keys: Vec<&str> = listed.iter().map(|row| row[0]).collect();
    assert_eq!(keys, ["invoice:9", "order:1", "order:2"], "{}", all.stdout);
    for guard in &guards {
        let row = listed
            .iter()
            .find(|row| row[0] == guard.key())
            .expect("a row per lock");
        assert_eq!(row.len(), 6, "{row:?}");
        assert_eq!(row[1], HOLDER, "{row:?}");
        assert_eq!(row[4], guard.fencing_token().to_string(), "{row:?}");
        assert_eq!(row[5], "0", "{row:?}");
    }
    for other in ["order:app", "order:hash", "config:limit", "redlock:"] {
        assert!(
            !all.stdout.contains(other),
            "{other} listed:\n{}",
            all.stdout
        );
    }

    let orders = run_on(&server, &["list", "order:*"]).await;
    assert_eq!(orders.code, Some(0), "{orders:?}");
    assert_header(&orders.stdout);
    let keys: Vec<&str> = rows(&orders.stdout).iter().map(|row| row[0]).collect();
    assert_eq!(keys, ["order:1", "order:2"], "{}", orders.stdout);

    let none = run_on(&server, &["list", "nothing:*"]).await;
    assert_eq!(none.code, Some(0), "{none:?}");
    assert_header(&none.stdout);
    assert!(rows(&none.stdout).is_empty(), "{}", none.stdout);
    assert!(none.stdout.contains("(no locks)"), "{}", none.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_json_matches_what_the_api_reports() {
    let server = RedisServer::start();
    let client = billing(&server).await;
    let first = hold(&client, "order:1").await;
    let second = hold(&client, "order:2").await;
    // Another process waits for order:2: one entry on its waitlist.
    let waiter = LockClient::builder(&server.url())
        .name("billing-8")
        .connect()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let _ = waiter
            .lock("order:2")
            .wait(Duration::from_secs(60))
            .acquire()
            .await;
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .inspect("order:2")
        .await
        .unwrap()
        .map(|info| info.waiting())
        != Some(1)
    {
        assert!(Instant::now() < deadline, "the waiter never showed up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let before: Vec<LockInfo> = client.locks("*").await.unwrap();
    let listed = run_on(&server, &["list", "--json"]).await;
    let after: Vec<LockInfo> = client.locks("*").await.unwrap();
    assert_eq!(listed.code, Some(0), "{listed:?}");
    let json: serde_json::Value = serde_json::from_str(&listed.stdout)
        .unwrap_or_else(|error| panic!("not JSON ({error}):\n{}", listed.stdout));
    let array = json.as_array().expect("a JSON array");
    assert_eq!(array.len(), 2, "{json}");
    assert_eq!(before.len(), 2);
    for ((object, info), later) in array.iter().zip(&before).zip(&after) {
        assert_eq!(object["key"], info.key(), "{object}");
        assert_eq!(object["holder"], HOLDER, "{object}");
        assert_eq!(object["holder"], info.holder(), "{object}");
        assert_eq!(object["fencing_token"], info.fencing_token(), "{object}");
        assert_eq!(object["waiting"], info.waiting(), "{object}");
        assert_eq!(object["kept"], false, "{object}");
        // Time moves between the three looks: the command's falls in between.
        let ms = |name: &str| {
            object[name]
                .as_u64()
                .unwrap_or_else(|| panic!("{name} is not a number: {object}"))
        };
        let millis = |duration: Duration| duration.as_millis() as u64;
        let (ttl, held_for) = (ms("ttl_ms"), ms("held_for_ms"));
        assert!(
            millis(later.ttl()) <= ttl && ttl <= millis(info.ttl()),
            "ttl_ms {ttl} not between the API's {:?} and {:?}",
            info.ttl(),
            later.ttl()
        );
        assert!(
            millis(info.held_for()) <= held_for && held_for <= millis(later.held_for()),
            "held_for_ms {held_for} not between the API's {:?} and {:?}",
            info.held_for(),
            later.held_for()
        );
        assert!(ttl <= 60_000, "{object}");
    }
    assert_eq!(array[0]["fencing_token"], first.fencing_token());
    assert_eq!(array[1]["fencing_token"], second.fencing_token());
    assert_eq!(array[0]["waiting"], 0);
    assert_eq!(array[1]["waiting"], 1);
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_or_says_the_key_is_free() {
    let server = RedisServer::start();
    let client = billing(&server).await;
    let guard = hold(&client, "order:42").await;

    let held = run_on(&server, &["inspect", "order:42"]).await;
    assert_eq!(held.code, Some(0), "{held:?}");
    assert_header(&held.stdout);
    let listed = rows(&held.stdout);
    assert_eq!(listed.len(), 1, "{}", held.stdout);
    assert_eq!(listed[0][..2], ["order:42", HOLDER], "{}", held.stdout);
    assert_eq!(listed[0][4], guard.fencing_token().to_string());

    let free = run_on(&server, &["inspect", "order:43"]).await;
    assert_eq!(free.code, Some(1), "{free:?}");
    // "No such key" is an error line on stderr, like every other.
    assert_eq!(free.stdout, "", "{free:?}");
    assert_eq!(free.stderr.trim(), "redlock: order:43 is free", "{free:?}");

    let json = run_on(&server, &["inspect", "order:42", "--json"]).await;
    assert_eq!(json.code, Some(0), "{json:?}");
    let object: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(object["key"], "order:42", "{object}");
    assert_eq!(object["holder"], HOLDER, "{object}");
    assert_eq!(object["fencing_token"], guard.fencing_token(), "{object}");
    assert_eq!(object["waiting"], 0, "{object}");

    let json = run_on(&server, &["inspect", "order:43", "--json"]).await;
    assert_eq!(json.code, Some(1), "{json:?}");
    let null: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert!(null.is_null(), "{json:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_refuses_without_force_and_evicts_the_holder_with_it() {
    let server = RedisServer::start();
    let client = billing(&server).await;
    let guard = hold(&client, "order:42").await;

    let refused = run_on(&server, &["unlock", "order:42"]).await;
    let message = assert_one_line_error(&refused);
    assert!(message.contains("--force"), "{message}");
    let still = client.inspect("order:42").await.unwrap();
    assert_eq!(
        still
            .as_ref()
            .map(|info| (info.holder(), info.fencing_token())),
        Some((HOLDER, guard.fencing_token())),
        "the refused unlock freed the lock"
    );

    let forced = run_on(&server, &["unlock", "order:42", "--force"]).await;
    assert_eq!(forced.code, Some(0), "{forced:?}");
    assert!(forced.stdout.contains("order:42"), "{forced:?}");
    assert!(
        forced.stdout.contains(&format!("evicted {HOLDER} ")),
        "{forced:?}"
    );
    assert!(
        forced
            .stdout
            .contains(&format!("token {}", guard.fencing_token())),
        "{forced:?}"
    );
    assert_eq!(client.inspect("order:42").await.unwrap(), None);
    // The evicted holder finds out at its release, which leaves the key alone.
    match guard.release().await {
        Err(LockError::Lost { key }) => assert_eq!(key, "order:42"),
        other => panic!("the evicted holder's release returned {other:?}"),
    }

    let free = run_on(&server, &["unlock", "order:42", "--force"]).await;
    assert_eq!(free.code, Some(1), "{free:?}");
    assert_eq!(free.stdout, "", "{free:?}");
    assert!(
        free.stderr.starts_with("redlock: order:42 was free"),
        "{free:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_url_in_the_environment_stands_for_url() {
    let server = RedisServer::start();
    let client = billing(&server).await;
    let guard = hold(&client, "order:42").await;
    let url = server.url();

    let from_env = run(&["inspect", "order:42"], &[("REDLOCK_URL", &url)]).await;
    assert_eq!(from_env.code, Some(0), "{from_env:?}");
    assert_eq!(rows(&from_env.stdout)[0][..2], ["order:42", HOLDER]);

    let listed = run(&["list"], &[("REDLOCK_URL", &url)]).await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    assert_eq!(rows(&listed.stdout).len(), 1, "{listed:?}");

    // --url wins over the environment.
    let both = run(
        &["--url", &url, "inspect", "order:42"],
        &[("REDLOCK_URL", "redis://127.0.0.1:1/")],
    )
    .await;
    assert_eq!(both.code, Some(0), "{both:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_line_on_stderr_without_a_backtrace() {
    // Nothing listens on port 1.
    let unreachable = run(&["--url", "redis://127.0.0.1:1/", "list"], &[]).await;
    let message = assert_one_line_error(&unreachable);
    assert!(message.contains("127.0.0.1:1"), "{message}");

    let from_env = run(
        &["inspect", "k"],
        &[("REDLOCK_URL", "redis://127.0.0.1:1/")],
    )
    .await;
    assert_one_line_error(&from_env);

    for bad in ["not a url", "redis://127.0.0.1:99999/", "http://127.0.0.1/"] {
        let run = run(&["--url", bad, "list"], &[]).await;
        assert_one_line_error(&run);
    }

    // A password in the URL is not repeated in the error.
    let secret = run(&["--url", "redis://:hunter2@127.0.0.1:1/", "list"], &[]).await;
    let message = assert_one_line_error(&secret);
    assert!(!message.contains("hunter2"), "{message}");

    for args in [
        &["list"][..],
        &["inspect", "order:42"],
        &["--url", "", "list"],
    ] {
        let none = run(args, &[]).await;
        let message = assert_one_line_error(&none);
        assert!(message.contains("REDLOCK_URL"), "{message}");
    }

    // Usage mistakes too, and `unlock` without --force is refused before connecting.
    let usage = run(&["list", "--bogus"], &[]).await;
    let message = assert_one_line_error(&usage);
    assert!(message.contains("--bogus"), "{message}");
    let missing = run(&["unlock"], &[]).await;
    let message = assert_one_line_error(&missing);
    assert!(message.contains("<KEY>"), "{message}");
    let unforced = run(&["--url", "redis://127.0.0.1:1/", "unlock", "k"], &[]).await;
    let message = assert_one_line_error(&unforced);
    assert!(message.contains("--force"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_the_holder_until_interrupted() {
    let server = RedisServer::start();
    let client = billing(&server).await;
    let url = server.url();
    let mut child = Running(
        command(&["--url", &url, "watch", "order:42", "--every", "50ms"])
            .spawn()
            .expect("start redlock watch"),
    );
    let pid = child.0.id();
    let (lines, seen) = mpsc::channel::<String>();
    let stdout = child.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            eprintln!("watch: {line}");
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut transcript = Vec::new();
    // The next line containing `needle`, within 10 s.
    let mut next = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match seen.recv_timeout(left) {
                Ok(line) => {
                    transcript.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(error) => {
                    panic!("no line with {needle:?} ({error}); watch printed: {transcript:#?}")
                }
            }
        }
    };

    tokio::task::block_in_place(|| {
        next("watching order:42 every 50ms");
        next("order:42 is free");
    });
    let guard = hold(&client, "order:42").await;
    let token = guard.fencing_token();
    let held = tokio::task::block_in_place(|| next(&format!("order:42 held by {HOLDER}")));
    assert!(held.contains(&format!("token {token}")), "{held}");
    guard.release().await.unwrap();
    tokio::task::block_in_place(|| next("order:42 is free"));

    redlock_testkit::signal(pid, "INT");
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait for redlock watch") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "redlock watch still running 5 s after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success() || status.signal() == Some(2),
        "redlock watch ended with {status} after SIGINT"
    );
    let mut stderr = String::new();
    let _ = child
        .0
        .stderr
        .take()
        .map(|mut err| err.read_to_string(&mut stderr));
    assert_eq!(stderr, "", "watch wrote to stderr");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_permits_are_shown_and_unlock_force_evicts_them() {
    let server = RedisServer::start();
    let client = billing(&server).await;
    let other = LockClient::builder(&server.url())
        .name("nightly-report")
        .connect()
        .await
        .unwrap();
    let share = |request: redlock_runtime::LockRequest| async move {
        request
            .lease(Duration::from_secs(60))
            .acquire()
            .await
            .expect("a share")
    };
    let readers = [
        share(client.read_lock("doc:7")).await,
        share(other.read_lock("doc:7")).await,
    ];
    let permits = [
        share(client.semaphore("partner-api", 3)).await,
        share(other.semaphore("partner-api", 3)).await,
    ];
    let shares_of = |stdout: &str, what: &str| {
        stdout
            .lines()
            .filter(|line| line.trim_start().starts_with(&format!("{what} held by ")))
            .count()
    };
    // Each share's line names its client and gives its guard's token.
    let assert_named = |stdout: &str, what: &str, guards: &[redlock_runtime::LockGuard]| {
        for (name, guard) in [HOLDER, "nightly-report"].into_iter().zip(guards) {
            let token = guard.fencing_token();
            assert!(
                stdout.lines().any(|line| {
                    let line = line.trim_start();
                    line.starts_with(&format!("{what} held by {name} (client "))
                        && line.contains(&format!("), token {token}, ttl "))
                }),
                "{name}'s {what} with token {token}: {stdout}"
            );
        }
    };

    // Not "free": the readers, each on its own line under the key's row.
    let inspected = run_on(&server, &["inspect", "doc:7"]).await;
    assert_eq!(inspected.code, Some(0), "{inspected:?}");
    assert_header(&inspected.stdout);
    let row: Vec<&str> = inspected
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(row[..3], ["doc:7", "2", "readers"], "{inspected:?}");
    assert_eq!(shares_of(&inspected.stdout, "reader"), 2, "{inspected:?}");
    assert_named(&inspected.stdout, "reader", &readers);

    let json = run_on(&server, &["inspect", "doc:7", "--json"]).await;
    let object: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(object["kind"], "read", "{object}");
    let shares = object["shares"].as_array().expect("shares");
    assert_eq!(shares.len(), 2, "{object}");
    for share in shares {
        let ttl = share["ttl_ms"].as_u64().unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "{object}");
        assert_eq!(share["client_id"].as_str().unwrap().len(), 32, "{object}");
    }
    let mut named: Vec<(String, u64)> = shares
        .iter()
        .map(|share| {
            let name = share["name"].as_str().expect("a name").to_owned();
            (name, share["fencing_token"].as_u64().expect("a token"))
        })
        .collect();
    named.sort();
    let mut expected = vec![
        (HOLDER.to_owned(), readers[0].fencing_token()),
        ("nightly-report".to_owned(), readers[1].fencing_token()),
    ];
    expected.sort();
    assert_eq!(named, expected, "{object}");

    let listed = run_on(&server, &["list"]).await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    assert!(!listed.stdout.contains("(no locks)"), "{listed:?}");
    assert!(listed.stdout.contains("2 of 3 permits"), "{listed:?}");
    assert_eq!(shares_of(&listed.stdout, "permit"), 2, "{listed:?}");
    assert_eq!(shares_of(&listed.stdout, "reader"), 2, "{listed:?}");
    assert_named(&listed.stdout, "permit", &permits);
    assert_named(&listed.stdout, "reader", &readers);
    let json = run_on(&server, &["list", "--json"]).await;
    let rows: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let semaphore = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["key"] == "partner-api")
        .expect("the semaphore is listed");
    assert_eq!(semaphore["kind"], "semaphore", "{rows}");
    assert_eq!(semaphore["permits"], 3, "{rows}");
    assert_eq!(semaphore["shares"].as_array().unwrap().len(), 2, "{rows}");

    // A forced unlock evicts every share; their holders find out at their release.
    for (key, evicted, guards) in [
        ("doc:7", "2 readers", &readers),
        ("partner-api", "2 of 3 permits", &permits),
    ] {
        let forced = run_on(&server, &["unlock", key, "--force"]).await;
        assert_eq!(forced.code, Some(0), "{forced:?}");
        assert!(
            forced
                .stdout
                .starts_with(&format!("freed {key}: evicted {evicted} (")),
            "{forced:?}"
        );
        // Each evicted share by name, client and token.
        for (name, guard) in [HOLDER, "nightly-report"].into_iter().zip(guards) {
            let token = guard.fencing_token();
            assert!(
                forced.stdout.contains(&format!("{name} (client "))
                    && forced.stdout.contains(&format!("), token {token}, ttl ")),
                "{name}'s share with token {token}: {forced:?}"
            );
        }
        assert_eq!(client.inspect(key).await.unwrap(), None);
    }
    for guard in readers.into_iter().chain(permits) {
        let error = guard.release().await.unwrap_err();
        assert!(error.is_lost(), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vouch_lets_a_new_deployment_vote_at_once_and_refuses_a_used_master_in_one_line() {
    // Build the command first (see `billing`).
    tokio::task::spawn_blocking(|| {
        binary();
    })
    .await
    .expect("the build did not panic");
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let mut args = vec!["vouch"];
    args.extend(urls.iter().map(String::as_str));

    let vouched = run(&args, &[]).await;
    assert_eq!(vouched.code, Some(0), "{vouched:?}");
    assert_eq!(
        vouched.stdout, "vouched for 3 masters: they vote at once\n",
        "{vouched:?}"
    );
    for master in &masters {
        let run_id = master.info_field("server", "run_id").unwrap();
        assert_eq!(
            master.cli(&["GET", "redlock:boot"]).trim(),
            format!("{run_id}:0:vouched")
        );
    }
    // Again, with the masters from REDLOCK_URL: nothing left to do.
    let again = run(&["vouch"], &[("REDLOCK_URL", &urls.join(","))]).await;
    assert_eq!(again.code, Some(0), "{again:?}");
    assert!(
        again.stdout.starts_with("nothing to vouch for"),
        "{again:?}"
    );
    // A client of the deployment locks at once, with the default max_lease.
    let client = LockClient::builder_for(&urls).connect().await.unwrap();
    let guard = client
        .lock("order:42")
        .acquire()
        .await
        .expect("the vouched-for masters vote at once");

    // Now it is in use: refused, in one line naming the master and the key.
    let refused = run(&args, &[]).await;
    let message = assert_one_line_error(&refused);
    assert!(
        message.starts_with(&format!(
            "redlock: cannot vouch for the RedLock master {}: it holds ",
            urls[0]
        )),
        "{message}"
    );
    guard.release().await.unwrap();

    // A new deployment with a lock on one master: refused, nothing written anywhere.
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let owner = format!("{}:7", "ab12".repeat(8));
    masters[2].cli(&[
        "SET",
        "order:7",
        &format!("{owner} 1795404822378057 1795404822378 billing-7"),
        "PX",
        "60000",
    ]);
    let spec = masters
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let refused = run(&["vouch", &spec, "--max-lease", "10s"], &[]).await;
    let message = assert_one_line_error(&refused);
    for needle in [masters[2].url().as_str(), "it holds `order:7`, a lock;"] {
        assert!(message.contains(needle), "{needle:?}: {message}");
    }
    for master in &masters {
        assert_eq!(master.cli(&["EXISTS", "redlock:boot"]).trim(), "0");
    }

    // One server has no quarantine to end: a one-line mistake, not a silent success.
    let one = run(&["--url", &masters[0].url(), "vouch"], &[]).await;
    let message = assert_one_line_error(&one);
    assert!(message.contains("RedLock masters"), "{message}");
}

/// Several keys locked as one (`lock_all`, issue 35) are each an ordinary lock: `list`
/// shows every key held by the multi-lock's client with that key's own token, and
/// `unlock --force` of one key makes the multi-lock's guard lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_of_a_multi_lock_is_listed_and_unlocking_one_loses_the_guard() {
    let server = RedisServer::start();
    // Built first by `billing`; the multi-lock's client renews often, so that a key
    // force-unlocked is noticed within a second.
    billing(&server).await;
    let client = LockClient::builder(&server.url())
        .name(HOLDER)
        .watchdog_lease(Duration::from_millis(900))
        .connect()
        .await
        .expect("connect");
    let guard = client
        .lock_all(["account:2", "account:1"])
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let listed = run_on(&server, &["list"]).await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    assert_header(&listed.stdout);
    let rows = rows(&listed.stdout);
    assert_eq!(rows.len(), 2, "{}", listed.stdout);
    for (row, key) in rows.iter().zip(["account:1", "account:2"]) {
        assert_eq!(row[0], key, "{}", listed.stdout);
        assert_eq!(row[1], HOLDER, "{}", listed.stdout);
        let token = guard.fencing_token(key).unwrap().to_string();
        assert!(
            row.contains(&token.as_str()),
            "{key}'s token {token}:\n{}",
            listed.stdout
        );
    }
    let unlocked = run_on(&server, &["unlock", "account:2", "--force"]).await;
    assert_eq!(unlocked.code, Some(0), "{unlocked:?}");
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the guard never noticed one of its keys was force-unlocked");
    assert!(guard.is_lost());
    let error = guard
        .release()
        .await
        .expect_err("a lost multi-lock released");
    assert!(error.is_lost(), "{error}");
    assert_eq!(
        server.cli(&["EXISTS", "account:1"]),
        "0",
        "the other key stayed"
    );
}
