//! `#[distributed_lock(keys = [...])]` against a real redis-server (issue 35): several
//! keys locked as one. Inside the body `current_locks()` has one lock per key, each with
//! its own fencing token, in canonical order, and `current_lock()` is the first; crossing
//! transfers do not deadlock and never overlap on an account; a busy key skips or times
//! out without leaving the other keys locked.
//!
//! Behaviour is observed, not timed: overlap counters per account, what Redis holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redlock_runtime::{LockClient, LockError, current_lock, current_locks, distributed_lock};
use redlock_testkit::RedisServer;

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// How many bodies run at once on one account, and the most that ever did.
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

/// What the body saw: `current_locks()` as (key, token), `current_lock()`, and the token
/// Redis records for each of those keys while the body runs.
#[derive(Debug)]
struct Seen {
    locks: Vec<(String, u64)>,
    first: Option<(String, u64)>,
    in_redis: Vec<Option<u64>>,
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "3s", lease = "10s", client = locks)]
async fn transfer(locks: &LockClient, from: u64, to: u64) -> Result<Seen, LockError> {
    let held: Vec<(String, u64)> = current_locks()
        .iter()
        .map(|lock| (lock.key().to_owned(), lock.fencing_token()))
        .collect();
    let mut in_redis = Vec::new();
    for (key, _) in &held {
        in_redis.push(locks.inspect(key).await?.map(|info| info.fencing_token()));
    }
    Ok(Seen {
        first: current_lock().map(|lock| (lock.key().to_owned(), lock.fencing_token())),
        locks: held,
        in_redis,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_locks_has_each_keys_own_lock_in_canonical_order() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    // Tokens come from one counter: take account:9 a few times so the two keys' tokens
    // could not be told apart by position alone.
    for _ in 0..3 {
        locks
            .lock("account:9")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    // Written from 9 to 10: canonical order sorts the keys, "account:10" first.
    let seen = transfer(&locks, 9, 10).await.unwrap();
    let keys: Vec<&str> = seen.locks.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["account:10", "account:9"], "{seen:?}");
    let tokens: Vec<Option<u64>> = seen.locks.iter().map(|(_, token)| Some(*token)).collect();
    assert_eq!(
        tokens, seen.in_redis,
        "each lock's token is its own key's: {seen:?}"
    );
    assert_ne!(seen.locks[0].1, seen.locks[1].1, "{seen:?}");
    assert_eq!(
        seen.first.as_ref(),
        seen.locks.first(),
        "current_lock() is the first"
    );

    // The same account twice is one key, locked once.
    let seen = transfer(&locks, 4, 4).await.unwrap();
    assert_eq!(seen.locks.len(), 1, "{seen:?}");
    assert_eq!(seen.locks[0].0, "account:4");
    assert_eq!(seen.in_redis, [Some(seen.locks[0].1)]);
    assert_eq!(seen.first.as_ref(), seen.locks.first());

    // Outside the body: nothing is current, nothing is held.
    assert!(current_locks().is_empty());
    assert_eq!(current_lock(), None);
    for key in ["account:4", "account:9", "account:10"] {
        assert_eq!(locks.inspect(key).await.unwrap(), None, "{key} still held");
    }
    assert_eq!(locks.active_keys(), 0);
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "60s", lease = "10s", client = locks)]
async fn counted_transfer(
    locks: LockClient,
    from: usize,
    to: usize,
    accounts: Arc<Vec<Overlap>>,
) -> Result<(), LockError> {
    accounts[from].enter();
    accounts[to].enter();
    tokio::time::sleep(Duration::from_millis(2)).await;
    accounts[from].leave();
    accounts[to].leave();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_transfers_all_complete_and_never_overlap_on_an_account() {
    let server = RedisServer::start();
    // Separate clients: exclusion between them is Redis's, not one client's turn.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&server).await);
    }
    let accounts = Arc::new((0..3).map(|_| Overlap::default()).collect::<Vec<_>>());
    // Every ordered pair of the three accounts: a→b beside b→a, in every task.
    let pairs = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)];
    let tasks: Vec<_> = (0..12)
        .map(|task| {
            let locks = clients[task % clients.len()].clone();
            let accounts = accounts.clone();
            tokio::spawn(async move {
                for round in 0..4 {
                    let (from, to) = pairs[(task + round) % pairs.len()];
                    counted_transfer(locks.clone(), from, to, accounts.clone()).await?;
                }
                Ok::<(), LockError>(())
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.unwrap().unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(50), all)
        .await
        .expect("crossing transfers did not all complete: a deadlock?");
    for (account, overlap) in accounts.iter().enumerate() {
        assert_eq!(overlap.max(), 1, "two bodies at once on account {account}");
    }
}

static BODY_RUNS: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(keys = ["account:<from>", "account:<to>"], on_busy = "skip", lease = "10s",
                   client = locks)]
async fn try_transfer(locks: &LockClient, from: u64, to: u64) -> Result<Option<usize>, LockError> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Some(current_locks().len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_when_one_key_is_held_elsewhere_leaves_the_other_free() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let other = client(&server).await;

    // The key held elsewhere last in canonical order (account:1 is taken first), then first.
    for (held_key, free_key) in [("account:2", "account:1"), ("account:1", "account:2")] {
        let held = other
            .lock(held_key)
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        assert_eq!(try_transfer(&locks, 1, 2).await.unwrap(), None);
        assert_eq!(BODY_RUNS.load(Ordering::SeqCst), 0, "the body ran");
        assert_eq!(locks.active_keys(), 0, "the skipped call holds a key");
        assert_eq!(
            locks.inspect(free_key).await.unwrap(),
            None,
            "{free_key} left locked"
        );
        // Free for anyone else at once, without waiting for a lease to run out.
        let free = other.lock(free_key).acquire().await.unwrap();
        free.release().await.unwrap();
        held.release().await.unwrap();
    }

    assert_eq!(try_transfer(&locks, 1, 2).await.unwrap(), Some(2));
    assert_eq!(BODY_RUNS.load(Ordering::SeqCst), 1);
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "200ms", client = locks)]
async fn short_wait(
    locks: &LockClient,
    from: u64,
    to: u64,
    ran: &AtomicBool,
) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_elsewhere_times_out_naming_that_key() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let other = client(&server).await;
    let held = other
        .lock("account:8")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();

    let ran = AtomicBool::new(false);
    let error = short_wait(&locks, 7, 8, &ran).await.unwrap_err();
    assert!(error.is_timeout() && error.is_busy(), "{error}");
    assert_eq!(error.key(), "account:8", "{error}");
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body ran without every lock"
    );
    assert_eq!(
        locks.inspect("account:7").await.unwrap(),
        None,
        "account:7 left locked"
    );
    assert_eq!(locks.active_keys(), 0);

    held.release().await.unwrap();
    short_wait(&locks, 7, 8, &ran).await.unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

/// Waits `for_ms` holding both keys, then says it reached its end.
#[distributed_lock(keys = ["job:<a>", "job:<b>"], client = locks)]
async fn long_job(
    locks: &LockClient,
    a: u64,
    b: u64,
    for_ms: u64,
    reached_end: &AtomicBool,
) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(for_ms)).await;
    reached_end.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(keys = ["job:<a>", "job:<b>"], on_lost = "continue", client = locks)]
async fn long_job_that_continues(
    locks: &LockClient,
    a: u64,
    b: u64,
    for_ms: u64,
    reached_end: &AtomicBool,
) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(for_ms)).await;
    reached_end.store(true, Ordering::SeqCst);
    Ok(())
}

/// Force-unlocks `job:2` once both job keys are held by `locks`.
async fn force_unlock_job_2_when_held(server: &RedisServer) {
    let operator = client(server).await;
    let limit = std::time::Instant::now() + Duration::from_secs(5);
    while operator.inspect("job:2").await.unwrap().is_none() {
        assert!(std::time::Instant::now() < limit, "job:2 never taken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(operator.force_unlock("job:2").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_lost_aborts_the_body_or_lets_it_continue_as_on_lost_says() {
    let server = RedisServer::start();
    // A short watchdog lease: a renewal finds the forced key gone within a third of it.
    let locks = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(900))
        .connect()
        .await
        .unwrap();

    // on_lost = "abort" (the default): the body is dropped, and the call says which key.
    let reached_end = AtomicBool::new(false);
    let (result, ()) = tokio::join!(
        long_job(&locks, 1, 2, 10_000, &reached_end),
        force_unlock_job_2_when_held(&server)
    );
    let error = result.unwrap_err();
    assert!(error.is_lost(), "{error:?}");
    assert_eq!(error.key(), "job:2", "{error}");
    assert!(!reached_end.load(Ordering::SeqCst), "the body ran on");
    // The other key was released with the call.
    assert_eq!(locks.inspect("job:1").await.unwrap(), None);

    // on_lost = "continue": the body finishes, and its result stands.
    let reached_end = AtomicBool::new(false);
    let (result, ()) = tokio::join!(
        long_job_that_continues(&locks, 1, 2, 2_000, &reached_end),
        force_unlock_job_2_when_held(&server)
    );
    result.unwrap();
    assert!(reached_end.load(Ordering::SeqCst));
    assert_eq!(locks.inspect("job:1").await.unwrap(), None);
    assert_eq!(locks.active_keys(), 0);
}

#[distributed_lock(keys = ["daily:<a>", "daily:<b>"], lease = "10s", hold_at_least = "1500ms",
                   on_busy = "skip", client = locks)]
async fn daily_job(locks: &LockClient, a: u64, b: u64) -> Result<Option<()>, LockError> {
    Ok(Some(()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_at_least_keeps_every_key_after_a_quick_body() {
    let server = RedisServer::start();
    let first = client(&server).await;
    let late = client(&server).await;
    assert_eq!(daily_job(&first, 1, 2).await.unwrap(), Some(()));
    // Returned, but both keys are kept: a copy of the job firing a little late skips.
    assert_eq!(daily_job(&late, 2, 1).await.unwrap(), None);
    for key in ["daily:1", "daily:2"] {
        assert!(
            first.inspect(key).await.unwrap().is_some(),
            "{key} not kept"
        );
    }
    // And once the time has passed both are free.
    let limit = std::time::Instant::now() + Duration::from_secs(6);
    while first.inspect("daily:1").await.unwrap().is_some()
        || first.inspect("daily:2").await.unwrap().is_some()
    {
        assert!(std::time::Instant::now() < limit, "kept past hold_at_least");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(daily_job(&late, 2, 1).await.unwrap(), Some(()));
}
