//! The default client (`#[distributed_lock]` without `client =`) when `REDLOCK_URL` names a
//! Redis that is not there: the call fails with an error that says Redis is unavailable
//! (`is_unavailable()`), not that the lock is busy, and names the key.
//!
//! The default client is process-global and `REDLOCK_URL` is read once, at the first
//! annotated call; setting an environment variable needs `unsafe` in edition 2024, which
//! the workspace forbids. So the test runs itself again as a child process with
//! `REDLOCK_URL` set to a loopback port with nothing listening, and the child makes the
//! call: a process of its own, whose environment is right from its start.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    let message = error.chain().to_string();
    assert!(message.contains("order:7"), "{message}");

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
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "a_default_client_that_cannot_connect_is_unavailable_not_busy",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("REDLOCK_URL", &url)
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the child (REDLOCK_URL={url}) failed:\n{stdout}\n{stderr}"
    );
    // The child ran the test, not nothing (a filter that matched no test also succeeds).
    assert!(stdout.contains("1 passed"), "{stdout}\n{stderr}");
}
