//! A nested `#[distributed_lock]` call on a key its task holds re-enters that lock; it
//! does not run its body as if the lock were held once the lock is lost. The enclosing
//! call is `on_lost = "continue"` with a short lease, so that it outlives its lease and
//! another client takes the key, as in issue 24's scenario.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redlock_runtime::{LockClient, LockError, LockGuard, current_lock, distributed_lock};
use redlock_testkit::RedisServer;

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// What the nested call saw.
#[derive(Debug)]
struct Nested {
    result: Result<(), LockError>,
    ran: bool,
    saw_lost: Option<bool>,
}

/// Holds `job:<id>` for 300 ms and keeps going after that (`on_lost = "continue"`): waits
/// until `other` has taken the key, then makes the nested call `nested`.
#[distributed_lock(key = "job:<id>", lease = "300ms", on_lost = "continue", client = locks)]
async fn outer_outlives_its_lease(
    locks: &LockClient,
    other: &LockClient,
    id: u64,
    nested: Which,
) -> Result<(Nested, LockGuard), LockError> {
    // Another client waits for the key and gets it once the lease has run out.
    let taken = other
        .lock(format!("job:{id}"))
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the other client takes the key after the lease ran out");
    assert!(current_lock().expect("inside").is_lost());
    let ran = AtomicBool::new(false);
    let mut saw_lost = None;
    let result = match nested {
        Which::Abort => inner_abort(locks, id, &ran).await,
        Which::Continue => inner_continue(locks, id, &ran, &mut saw_lost).await,
    };
    let nested = Nested {
        result,
        ran: ran.load(Ordering::SeqCst),
        saw_lost,
    };
    Ok((nested, taken))
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Abort,
    Continue,
}

/// The default `on_lost = "abort"`.
#[distributed_lock(key = "job:<id>", client = locks)]
async fn inner_abort(locks: &LockClient, id: u64, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "job:<id>", on_lost = "continue", client = locks)]
async fn inner_continue(
    locks: &LockClient,
    id: u64,
    ran: &AtomicBool,
    saw_lost: &mut Option<bool>,
) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    *saw_lost = current_lock().map(|lock| lock.is_lost());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_call_into_a_lost_lock_returns_lost_without_running() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let (nested, taken) = outer_outlives_its_lease(&locks, &other, 1, Which::Abort)
        .await
        .expect("the outer call continues (on_lost = \"continue\")");
    assert!(
        !nested.ran,
        "the nested body ran while another client held the key"
    );
    match nested.result {
        Err(LockError::Lost { key }) => assert_eq!(key, "job:1"),
        other => panic!("the nested call returned {other:?}, not Lost"),
    }
    taken
        .release()
        .await
        .expect("the other client still holds the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_continue_call_into_a_lost_lock_runs_knowing_it_is_lost() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let (nested, taken) = outer_outlives_its_lease(&locks, &other, 2, Which::Continue)
        .await
        .expect("the outer call continues (on_lost = \"continue\")");
    assert!(nested.ran, "on_lost = \"continue\" runs the body");
    assert!(nested.result.is_ok(), "{:?}", nested.result);
    assert_eq!(
        nested.saw_lost,
        Some(true),
        "current_lock() in the nested body did not say the lock was lost"
    );
    taken
        .release()
        .await
        .expect("the other client still holds the key");
}

/// Re-enters while the lock is held, then outlives the lease inside the nested body.
#[distributed_lock(key = "slow:<id>", lease = "300ms", on_lost = "continue", client = locks)]
async fn outer_then_slow_inner(
    locks: &LockClient,
    id: u64,
    finished: &AtomicBool,
) -> Result<Result<(), LockError>, LockError> {
    Ok(slow_inner(locks, id, finished).await)
}

#[distributed_lock(key = "slow:<id>", client = locks)]
async fn slow_inner(locks: &LockClient, id: u64, finished: &AtomicBool) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_abort_call_is_stopped_when_the_lock_is_lost_while_it_runs() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let finished = AtomicBool::new(false);
    let nested = outer_then_slow_inner(&locks, 3, &finished)
        .await
        .expect("the outer call continues (on_lost = \"continue\")");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the nested body ran on past the lease"
    );
    assert!(
        nested.as_ref().is_err_and(LockError::is_lost),
        "the nested call returned {nested:?}, not Lost"
    );
}
