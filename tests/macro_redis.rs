//! `#[distributed_lock]` against a real redis-server: exclusion, parallelism, timeouts,
//! lost locks, reentrancy, release on every way out, `current_lock()`.
//!
//! Behaviour is observed, not timed: overlap counters and barriers for exclusion and
//! parallelism; "acquired well before the lease could have run out" for releases.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockError, current_lock, distributed_lock};
use redlock_testkit::RedisServer;
use tokio::sync::Barrier;

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// How many bodies run at once, and the most that ever did.
#[derive(Default)]
struct Overlap {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Overlap {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

#[distributed_lock(key = "order:<id>", wait = "30s", lease = "10s", client = locks)]
async fn exclusive_section(
    locks: LockClient,
    id: u64,
    overlap: Arc<Overlap>,
    barrier: Option<Arc<Barrier>>,
) -> Result<(), LockError> {
    overlap.enter();
    match barrier {
        // Only returns once every caller is inside at the same time.
        Some(barrier) => {
            barrier.wait().await;
        }
        None => tokio::time::sleep(Duration::from_millis(20)).await,
    }
    overlap.leave();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_id_serialises() {
    let server = RedisServer::start();
    // Two clients: exclusion inside one client (its turn) and between clients (Redis).
    let clients = [client(&server).await, client(&server).await];
    let overlap = Arc::new(Overlap::default());
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(exclusive_section(
                clients[i % 2].clone(),
                42,
                overlap.clone(),
                None,
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(overlap.max(), 1, "two bodies ran at once on the same key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_ids_run_in_parallel() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let overlap = Arc::new(Overlap::default());
    let barrier = Arc::new(Barrier::new(4));
    let tasks: Vec<_> = (0..4)
        .map(|id| {
            tokio::spawn(exclusive_section(
                locks.clone(),
                id,
                overlap.clone(),
                Some(barrier.clone()),
            ))
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.unwrap().unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect("different ids did not all run at the same time");
    assert_eq!(overlap.max(), 4);
}

#[distributed_lock(key = "order:<id>", wait = "200ms", client = locks)]
async fn short_wait(locks: &LockClient, id: u64, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn timeout_returns_the_error_without_running_the_body() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let other = client(&server).await;
    let held = other.lock("order:7").acquire().await.unwrap();

    let ran = AtomicBool::new(false);
    let error = short_wait(&locks, 7, &ran).await.unwrap_err();
    assert!(error.is_timeout(), "{error}");
    assert_eq!(error.key(), "order:7");
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");

    held.release().await.unwrap();
    short_wait(&locks, 7, &ran).await.unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

#[distributed_lock(key = "job:<id>", lease = "200ms", client = locks)]
async fn outlives_its_lease(
    locks: &LockClient,
    id: u64,
    finished: &AtomicBool,
) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "job:<id>", lease = "200ms", on_lost = "continue", client = locks)]
async fn outlives_its_lease_and_continues(
    locks: &LockClient,
    id: u64,
    finished: &AtomicBool,
) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn expired_lease_aborts_the_body() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let finished = AtomicBool::new(false);
    let error = outlives_its_lease(&locks, 1, &finished).await.unwrap_err();
    assert!(error.is_lost(), "{error}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the body ran on without the lock"
    );
}

#[tokio::test]
async fn expired_lease_with_on_lost_continue_lets_the_body_finish() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let finished = AtomicBool::new(false);
    outlives_its_lease_and_continues(&locks, 1, &finished)
        .await
        .unwrap();
    assert!(finished.load(Ordering::SeqCst));
}

#[distributed_lock(key = "watched:<id>", client = locks)]
async fn watched(
    locks: &LockClient,
    id: u64,
    server: &RedisServer,
    finished: &AtomicBool,
) -> Result<(), LockError> {
    // Delete the key behind the lock's back; the watchdog's next renewal finds it gone.
    assert_eq!(server.cli(&["DEL", &format!("watched:{id}")]), "1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn deleted_key_aborts_the_body_in_watchdog_mode() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(600))
        .renew_every(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let finished = AtomicBool::new(false);
    let error = watched(&locks, 5, &server, &finished).await.unwrap_err();
    assert!(error.is_lost(), "{error}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the body ran on without the lock"
    );
}

#[distributed_lock(key = "account:<id>", wait = "0s", client = locks)]
async fn outer(locks: &LockClient, id: u64) -> Result<(u64, u64), LockError> {
    let outer_token = current_lock()
        .expect("inside the outer lock")
        .fencing_token();
    // Same key, same task: `wait = "0s"` would time out if this tried to lock again.
    let inner_token = inner(locks, id).await?;
    Ok((outer_token, inner_token))
}

#[distributed_lock(key = "account:<id>", wait = "0s", client = locks)]
async fn inner(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    let current = current_lock().expect("inside the inner call");
    assert_eq!(current.key(), format!("account:{id}"));
    Ok(current.fencing_token())
}

#[tokio::test]
async fn nested_call_on_the_same_key_reenters() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let (outer_token, inner_token) = tokio::time::timeout(Duration::from_secs(5), outer(&locks, 3))
        .await
        .expect("the nested call deadlocked")
        .unwrap();
    assert_eq!(
        outer_token, inner_token,
        "the nested call took a second lock"
    );
    // Released by the outermost call: free again.
    assert!(current_lock().is_none());
    inner(&locks, 3).await.unwrap();
}

#[distributed_lock(key = "shared:<id>", wait = "10s", client = locks)]
async fn spawns_a_contender(locks: LockClient, id: u64) -> Result<bool, LockError> {
    let outer_done = Arc::new(AtomicBool::new(false));
    let contender = tokio::spawn(contender(locks.clone(), id, outer_done.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let finished_early = contender.is_finished();
    outer_done.store(true, Ordering::SeqCst);
    // The contender can only finish after this call has returned and released.
    tokio::spawn(async move { contender.await.unwrap() });
    Ok(finished_early)
}

static CONTENDER_SAW_OUTER_DONE: AtomicBool = AtomicBool::new(false);

#[distributed_lock(key = "shared:<id>", wait = "10s", client = locks)]
async fn contender(
    locks: LockClient,
    id: u64,
    outer_done: Arc<AtomicBool>,
) -> Result<(), LockError> {
    CONTENDER_SAW_OUTER_DONE.store(outer_done.load(Ordering::SeqCst), Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn another_task_with_the_same_key_waits() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let finished_early = spawns_a_contender(locks.clone(), 9).await.unwrap();
    assert!(
        !finished_early,
        "a spawned task entered while the key was held"
    );
    // The contender gets the lock once the outer call released it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !CONTENDER_SAW_OUTER_DONE.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the contender never got the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Long enough that acquiring "at once" afterwards proves the lock was released.
const LONG_LEASE: Duration = Duration::from_secs(30);

#[distributed_lock(key = "exit:<id>", lease = "30s", client = locks)]
async fn panics(locks: LockClient, id: u64) -> Result<(), LockError> {
    panic!("the body panics while holding exit:{id}");
}

#[distributed_lock(key = "exit:<id>", lease = "30s", client = locks)]
async fn hangs(locks: &LockClient, id: u64) -> Result<(), LockError> {
    std::future::pending::<()>().await;
    Ok(())
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(error) => write!(f, "{error}"),
            AppError::Parse(error) => write!(f, "not a number: {error}"),
        }
    }
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

#[distributed_lock(key = "exit:<id>", lease = "30s", client = locks)]
async fn fails_with_question_mark(
    locks: &LockClient,
    id: u64,
    text: &str,
) -> Result<u64, AppError> {
    let n: u64 = text.parse().map_err(AppError::Parse)?;
    Ok(n + id)
}

#[distributed_lock(key = "exit:<id>", wait = "10s", lease = "30s", client = locks)]
async fn quick(locks: &LockClient, id: u64) -> Result<(), LockError> {
    Ok(())
}

/// Acquires `exit:<id>` and checks it was free well before `LONG_LEASE` could run out.
async fn assert_acquired_at_once(locks: &LockClient, id: u64) {
    let started = Instant::now();
    quick(locks, id).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited < LONG_LEASE / 10,
        "waited {waited:?}: the lock was not released, it expired"
    );
}

#[tokio::test]
async fn released_on_panic() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let panicked = tokio::spawn(panics(locks.clone(), 1)).await.unwrap_err();
    assert!(panicked.is_panic());
    assert_acquired_at_once(&locks, 1).await;
}

#[tokio::test]
async fn released_on_question_mark() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let error = fails_with_question_mark(&locks, 2, "not a number")
        .await
        .unwrap_err();
    assert!(matches!(error, AppError::Parse(_)), "{error}");
    assert_acquired_at_once(&locks, 2).await;
    assert_eq!(fails_with_question_mark(&locks, 2, "40").await.unwrap(), 42);
}

#[tokio::test]
async fn released_on_cancellation() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let cancelled = tokio::time::timeout(Duration::from_millis(200), hangs(&locks, 3)).await;
    assert!(cancelled.is_err(), "the hanging body returned");
    assert_acquired_at_once(&locks, 3).await;
}

#[distributed_lock(key = "token:{<id>}", client = locks)]
async fn report_lock(locks: &LockClient, id: u64) -> Result<(String, u64), LockError> {
    let current = current_lock().expect("current_lock() inside the body");
    Ok((current.key().to_owned(), current.fencing_token()))
}

#[tokio::test]
async fn current_lock_returns_the_key_and_fencing_token() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    assert!(
        current_lock().is_none(),
        "no lock outside an annotated call"
    );
    let (key, first) = report_lock(&locks, 11).await.unwrap();
    assert_eq!(key, "token:{11}");
    let (_, second) = report_lock(&locks, 11).await.unwrap();
    assert!(
        second > first,
        "fencing tokens must increase: {first} then {second}"
    );
    // The token is the one Redis handed out: the next builder acquisition gets a larger one.
    let guard = locks.lock("token:{11}").acquire().await.unwrap();
    assert!(guard.fencing_token() > second);
    guard.release().await.unwrap();
}

// The only test in this binary that touches the process-wide default client.
#[distributed_lock(key = "default:<name>", wait = "1s")]
async fn with_default_client(name: &str) -> Result<String, LockError> {
    Ok(current_lock().unwrap().key().to_owned())
}

#[tokio::test]
async fn default_client_is_used_without_client_argument() {
    let server = RedisServer::start();
    redlock_runtime::set_default_client(client(&server).await);
    assert_eq!(with_default_client("a").await.unwrap(), "default:a");
    // The lock really lives on that server.
    let other = client(&server).await;
    let guard = other.lock("default:b").acquire().await.unwrap();
    let error = with_default_client("b").await.unwrap_err();
    assert!(error.is_timeout(), "{error}");
    guard.release().await.unwrap();
}

struct Orders {
    locks: LockClient,
    id: u64,
    overlap: Overlap,
}

impl Orders {
    #[distributed_lock(key = "orders:<self.id>", wait = "10s", client = self.locks)]
    async fn process(&self) -> Result<u64, LockError> {
        self.overlap.enter();
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.overlap.leave();
        Ok(self.id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_lock_on_self_fields() {
    let server = RedisServer::start();
    let orders = Arc::new(Orders {
        locks: client(&server).await,
        id: 8,
        overlap: Overlap::default(),
    });
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let orders = orders.clone();
            tokio::spawn(async move { orders.process().await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), 8);
    }
    assert_eq!(orders.overlap.max(), 1);
}
