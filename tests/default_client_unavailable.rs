//! The default client (`#[distributed_lock]` without `client =`) when `REDLOCK_URL` names a
//! Redis that is not there: the call fails with an error that says Redis is unavailable
//! (`is_unavailable()`), not that the lock is busy, and names the key.
//!
//! The default client is process-global and `REDLOCK_URL` is read once, at the first
//! annotated call; setting an environment variable needs `unsafe` in edition 2024, which
//! the workspace forbids. So the test runs itself again as a child process with
//! `REDLOCK_URL` set to a loopback port with nothing listening, and the child makes the
//! call: a process of its own, whose environment is right from its start.
//!
//! Concurrent first calls, with `REDLOCK_URL` naming a listener that never answers,
//! share one connection attempt: each returns within its own bound (its `wait` plus the
//! response timeout), not one connect timeout after another. With a Redis that answers,
//! they share the one client that attempt connects.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_runtime::{LockError, distributed_lock};

/// Set in the child process, which makes the call.
const CHILD: &str = "REDLOCK_TEST_DEFAULT_CLIENT_CHILD";

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(key = "order:<id>", wait = "1s", lease = "10s")]
async fn pay_order(id: u64) -> Result<u64, LockError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock(key = "report:<day>", on_busy = "skip")]
async fn nightly_report(day: u32) -> Result<Option<u32>, LockError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Some(day))
}

async fn in_the_child() {
    let error = pay_order(7).await.unwrap_err();
    assert!(error.is_unavailable(), "not unavailable: {error:?}");
    assert!(!error.is_busy(), "busy: {error:?}");
    assert_eq!(error.key(), "order:7", "{error:?}");
    // One line that says where, why and what to do (tests/errors_say_why.rs has the rest).
    let message = error.to_string();
    assert!(message.contains("order:7"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    for needle in [
        "REDLOCK_URL=redis://127.0.0.1:",
        "refused",
        "set_default_client",
    ] {
        assert!(message.contains(needle), "{needle:?} missing: {message}");
    }

    // `on_busy = "skip"` skips a busy lock only: Redis being unreachable is still an
    // error, the same kind.
    let error = nightly_report(1).await.unwrap_err();
    assert!(error.is_unavailable() && !error.is_busy(), "{error:?}");
    assert_eq!(error.key(), "report:1", "{error:?}");

    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        0,
        "a body ran without its lock"
    );
}

#[test]
fn a_default_client_that_cannot_connect_is_unavailable_not_busy() {
    if std::env::var_os(CHILD).is_some() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(in_the_child());
        return;
    }
    // A loopback port nothing listens on (free a moment ago; never 6379).
    let url = format!("redis://127.0.0.1:{}/", redlock_testkit::free_port());
    run_child(
        "a_default_client_that_cannot_connect_is_unavailable_not_busy",
        &url,
    );
}

/// Runs the test `name` again in a child process with `REDLOCK_URL` set to `url`.
fn run_child(name: &str, url: &str) {
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("REDLOCK_URL", url)
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the child (REDLOCK_URL={url}) failed:\n{stdout}\n{stderr}"
    );
    // What the child printed (its calls' times), shown with --nocapture.
    println!("{stdout}");
    // The child ran the test, not nothing (a filter that matched no test also succeeds).
    assert!(stdout.contains("1 passed"), "{stdout}\n{stderr}");
}

/// The default client's response timeout (`ClientConfig`'s default).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
/// The `wait` of `concurrent_call`.
const WAIT: Duration = Duration::from_millis(500);
/// How many first calls start at once.
const CALLS: usize = 6;

#[distributed_lock(key = "first:<n>", wait = "500ms")]
async fn concurrent_call(n: usize) -> Result<usize, LockError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(n)
}

async fn concurrent_calls_in_the_child() {
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|n| {
            tokio::spawn(async move {
                let result = concurrent_call(n).await;
                (n, result, started.elapsed())
            })
        })
        .collect();
    // Each call's bound, with room for a loaded machine: the old code's last call
    // returned after CALLS connect attempts one after another (~6 × 3 s).
    let bound = WAIT + RESPONSE_TIMEOUT + Duration::from_secs(2);
    let mut returned = Vec::new();
    for call in calls {
        let (n, result, elapsed) = call.await.expect("the call panicked");
        println!("call {n}: {elapsed:?}: {result:?}");
        returned.push((n, result, elapsed));
    }
    for (n, result, elapsed) in returned {
        let error = result.expect_err("no Redis answers: the call must fail");
        assert!(error.is_unavailable(), "call {n}: {error:?}");
        assert_eq!(error.key(), format!("first:{n}"), "{error:?}");
        assert!(
            elapsed < bound,
            "call {n} returned after {elapsed:?}, beyond its bound ({WAIT:?} wait + \
             {RESPONSE_TIMEOUT:?} response timeout): the first calls connected one after another"
        );
    }
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        0,
        "a body ran without its lock"
    );
}

#[test]
fn concurrent_first_calls_to_an_unanswering_default_client_each_return_within_their_bound() {
    if std::env::var_os(CHILD).is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(concurrent_calls_in_the_child());
        return;
    }
    // A listener that never accepts: connections complete in the kernel's backlog, and
    // nothing ever answers the handshake (each attempt runs into a timeout).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = silent.local_addr().expect("its address").port();
    run_child(
        "concurrent_first_calls_to_an_unanswering_default_client_each_return_within_their_bound",
        &format!("redis://127.0.0.1:{port}/"),
    );
    drop(silent);
}

async fn concurrent_calls_succeed_in_the_child() {
    let calls: Vec<_> = (0..CALLS)
        .map(|n| tokio::spawn(concurrent_call(n)))
        .collect();
    for (n, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.expect("the call panicked").expect("locked"), n);
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), CALLS);
}

#[test]
fn concurrent_first_calls_share_one_default_client() {
    if std::env::var_os(CHILD).is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(concurrent_calls_succeed_in_the_child());
        return;
    }
    let server = redlock_testkit::RedisServer::start();
    let connections = || -> u64 {
        server
            .info_field("stats", "total_connections_received")
            .expect("INFO stats")
            .parse()
            .expect("a count")
    };
    // What one client connecting and locking once costs, made here.
    let before = connections();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let client = redlock_runtime::LockClient::connect(&server.url())
                .await
                .expect("connect");
            let guard = client
                .lock("first:reference")
                .acquire()
                .await
                .expect("lock");
            guard.release().await.expect("release");
        });
    let one_client = connections() - before;
    println!("one client: {one_client} connections");

    let before = connections();
    run_child(
        "concurrent_first_calls_share_one_default_client",
        &server.url(),
    );
    assert_eq!(
        connections() - before,
        one_client,
        "{CALLS} concurrent first calls did not share one default client"
    );
}
