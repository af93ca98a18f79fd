//! Releases that must free a lock for everyone, and nothing an acquisition or a release
//! leaves behind: hold_at_least releases waking other processes' waiters, a client's own
//! stale holder, try-locks that must not join the waitlist, acquires dropped mid-way, a body whose
//! lock vanished, renewals racing releases and extends, an early release keeping the key
//! for hold_at_least, releases interrupted mid-way.
//!
//! Each `LockClient` stands for a process of its own: clients share nothing but Redis.
//! Times are liveness bounds chosen far from the leases involved, never speed limits.

mod common;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, raw};
use rand::Rng;
use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError, LockGuard, current_lock, distributed_lock};
use redlock_testkit::{RedisServer, redis_cli};

/// Polls until none of `keys` exists on `server`, at most `limit`; returns how long it
/// took, or the keys still there (with their PTTLs) when the limit ran out.
async fn gone_within(
    server: &RedisServer,
    keys: &[String],
    limit: Duration,
) -> Result<Duration, Vec<(String, i64)>> {
    let mut connection = raw(server).await;
    let started = Instant::now();
    loop {
        let mut left = Vec::new();
        for key in keys {
            let pttl: i64 = connection.pttl(key).await.unwrap();
            if pttl != -2 {
                left.push((key.clone(), pttl));
            }
        }
        if left.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            return Err(left);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------------------
// 1. A hold_at_least release wakes other processes' waiters when the minimum hold ends.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_at_least_wakes_other_processes_waiters_when_the_minimum_hold_ends() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = client(&server).await;
    const LEASE: Duration = Duration::from_secs(10);
    const HOLD: Duration = Duration::from_secs(1);

    // Taken before the acquire is sent: the minimum hold counts from a later instant,
    // so "at least HOLD after this" is a sound lower bound for the hand-over.
    let before_acquire = Instant::now();
    let guard = holder
        .lock("nightly-report")
        .lease(LEASE)
        .hold_at_least(HOLD)
        .acquire()
        .await
        .unwrap();
    let token = guard.fencing_token();

    // The other process starts waiting while the key is held: its first attempt is told
    // the holder has ~10 s left, so only a message can wake it earlier than that.
    let waiting = tokio::spawn(async move {
        let result = waiter
            .lock("nightly-report")
            .wait(Duration::from_secs(8))
            .lease(Duration::from_secs(5))
            .acquire()
            .await;
        let at = Instant::now();
        result.map(|guard| (guard, at))
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // The early release keeps the key until the minimum hold has passed.
    guard.release().await.unwrap();
    assert_eq!(
        server.cli(&["EXISTS", "nightly-report"]),
        "1",
        "released before the minimum hold, the key must stay until it ends"
    );

    let (next, got_at) = waiting
        .await
        .unwrap()
        .expect("the other process's waiter never got the key (it waited 8 s)");
    let after = got_at.duration_since(before_acquire);
    assert!(
        after >= HOLD - Duration::from_millis(10),
        "the waiter got the key {after:?} after the acquisition, inside the minimum hold of {HOLD:?}"
    );
    // Liveness, not speed: the point is "at the end of the hold", not "at the 10 s lease".
    assert!(
        after < Duration::from_millis(2500),
        "the waiter got the key {after:?} after the acquisition: woken by the lease ({LEASE:?}), \
         not by the end of the minimum hold ({HOLD:?})"
    );
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// 2. A client's own holder whose lease ran out blocks neither its try-locks nor its waiters;
//    a task of the client waiting for the key does not block its try-locks.

#[tokio::test]
async fn a_try_lock_succeeds_when_its_own_clients_stale_holder_has_run_out() {
    let server = RedisServer::start();
    let client = client(&server).await;

    // A waiting acquire of the same client, while the stale guard lives on (its task is
    // stuck): it gets the key once the 200 ms lease has run out, long before its 2 s wait.
    let before = Instant::now();
    let stale = client
        .lock("invoice:waiting")
        .lease(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    let next = client
        .lock("invoice:waiting")
        .wait(Duration::from_secs(2))
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a waiter of the same client was blocked by a holder whose lease had run out");
    assert!(
        before.elapsed() >= Duration::from_millis(200),
        "got the key {:?} after the first acquisition, inside its 200 ms lease",
        before.elapsed()
    );
    assert!(stale.is_lost());
    assert!(next.fencing_token() > stale.fencing_token());
    let error = stale.release().await.unwrap_err();
    assert!(matches!(&error, LockError::Lost { .. }), "{error}");
    assert!(!next.is_lost());
    next.release().await.unwrap();

    // A try-lock (wait = 0) of the same client: Redis says the key is free, and that is
    // what counts, not the turn the stale guard still has in this client.
    let stale = client
        .lock("invoice:try")
        .lease(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        server.cli(&["EXISTS", "invoice:try"]),
        "0",
        "the 200 ms lease should have run out in Redis"
    );
    let fresh = client
        .lock("invoice:try")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a try-lock was refused although Redis has the key free (its own client's stale guard lives on)");
    assert!(stale.is_lost());
    assert!(fresh.fencing_token() > stale.fencing_token());
    // The stale guard's release finds the lock gone and leaves the new one alone.
    let error = stale.release().await.unwrap_err();
    assert!(
        matches!(&error, LockError::Lost { key } if key == "invoice:try"),
        "{error}"
    );
    assert!(!fresh.is_lost());
    let pttl: i64 = raw(&server).await.pttl("invoice:try").await.unwrap();
    assert!(
        pttl > 5_000,
        "the new holder's lock was touched by the stale release: pttl {pttl}"
    );
    fresh.release().await.unwrap();
}

/// A task of the client waits for the key (it has the client's turn there) while the
/// key is free in Redis: the lock it waits for vanished behind its holder's back, in
/// another process, and nothing told the waiter, which sleeps until the lease it was
/// told. A try-lock of the same client asks Redis and gets the key; the waiter keeps
/// waiting, and the try-lock's release wakes it.
#[tokio::test]
async fn a_try_lock_succeeds_on_a_free_key_while_a_task_of_its_client_waits_for_it() {
    let server = RedisServer::start();
    let elsewhere = client(&server).await;
    let client = client(&server).await;
    let mut redis = raw(&server).await;
    let contended = |value: &Option<String>| value.as_deref().is_some_and(|v| v.contains("~ "));
    let stale = elsewhere
        .lock("report")
        .lease(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let waiter = tokio::spawn(
        client
            .lock("report")
            .wait(Duration::from_secs(15))
            .lease(Duration::from_secs(5))
            .acquire(),
    );
    // Its attempt found the key busy (and marked it): it has the turn and waits.
    loop {
        let value: Option<String> = redis.get("report").await.unwrap();
        if contended(&value) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(2500),
            "never waited: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _: () = redis.del("report").await.unwrap();
    let tried = client
        .lock("report")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .expect("a try-lock was refused while the key was free in Redis (a task of its client waited for it)");
    assert!(tried.fencing_token() > stale.fencing_token());
    // The waiter wakes at the end of the 3 s it was told, finds the try-lock's lock busy
    // and waits on: it must not have taken the key meanwhile.
    loop {
        let value: Option<String> = redis.get("report").await.unwrap();
        if contended(&value) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiter never tried again: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !waiter.is_finished(),
        "the waiter took a key the try-lock held"
    );
    let tried_token = tried.fencing_token();
    let released_at = Instant::now();
    tried.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter slept through the try-lock's release (its lease was 20 s)")
        .unwrap()
        .expect("the waiter gave up");
    eprintln!(
        "the waiter had the key {:?} after the try-lock's release",
        released_at.elapsed()
    );
    assert!(next.fencing_token() > tried_token);
    assert!(stale.release().await.unwrap_err().is_lost());
    next.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", "report"]), "0");
}

// ---------------------------------------------------------------------------------------
// 3. A try-lock that fails leaves nothing in Redis, so nothing can outlive its process.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_try_lock_leaves_no_claim() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let latecomer = client(&server).await;
    let guard = holder
        .lock("slot")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();

    // Process B: a runtime of its own, shut down right after its try-lock failed, like a
    // short-lived process that exits. Whatever it left for background tasks never happens.
    let url = server.url();
    let port = server.port();
    let (attempt, queued, expiries) = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let observed = runtime.block_on(async {
            let b = LockClient::connect(&url).await.unwrap();
            let attempt = b.lock("slot").acquire().await.map(|g| g.fencing_token());
            // Looked at with a blocking call before this runtime runs anything else: a
            // registration that a background task would undo later is still there.
            let queued = redis_cli(port, &["EXISTS", "redlock:waitlist:slot"]);
            let expiries = redis_cli(port, &["EXISTS", "redlock:waitlist-expiry:slot"]);
            (attempt, queued, expiries)
        });
        drop(runtime);
        observed
    })
    .await
    .unwrap();
    let error = attempt.expect_err("the try-lock got a key that another client holds");
    assert!(error.is_timeout(), "{error}");

    // Anyone's try-lock right after the holder's release must get the key: no
    // reservation for the process that is gone.
    guard.release().await.unwrap();
    let next = latecomer
        .lock("slot")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|error| {
            panic!(
                "a try-lock right after the release was refused ({error}): the key went to a \
                 waiter that had exited (after B's failed try-lock, redlock:waitlist:slot existed: \
                 {queued}, redlock:waitlist-expiry:slot: {expiries})"
            )
        });
    assert_eq!(
        queued, "0",
        "a try-lock that would not wait joined the waitlist"
    );
    assert_eq!(
        expiries, "0",
        "a try-lock that would not wait registered an expiry on the waitlist"
    );
    next.release().await.unwrap();
    let left = server.cli(&["KEYS", "redlock:waitlist*"]);
    assert!(left.is_empty(), "waitlist keys left behind: {left}");
}

// ---------------------------------------------------------------------------------------
// 4. An acquire future dropped at any point leaves no lock behind.

#[tokio::test]
async fn an_acquire_dropped_during_the_replica_confirmation_leaves_no_lock() {
    let server = RedisServer::start();
    // No replica exists: WAIT blocks for its whole 2 s timeout, and the acquire with it.
    const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);
    let client = LockClient::builder(&server.url())
        .confirm_replicas(1, CONFIRM_TIMEOUT)
        .connect()
        .await
        .unwrap();
    let attempt = client
        .lock("replicated")
        .lease(Duration::from_secs(30))
        .acquire();
    let outcome = tokio::time::timeout(Duration::from_millis(300), attempt).await;
    let dropped_at = Instant::now();
    assert!(
        outcome.is_err(),
        "the acquire ended within 300 ms although WAIT blocks 2 s: {outcome:?}"
    );
    // The drop did come during the confirmation: the lock's connection is still blocked
    // in WAIT. (Observed rather than assumed, or the test would prove nothing.)
    let blocked_in_wait = server.client_ids(|line| line.contains(" cmd=wait "));
    assert!(
        !blocked_in_wait.is_empty(),
        "no connection is blocked in WAIT: {}",
        server.cli(&["CLIENT", "LIST"])
    );

    // Gone long before its 30 s lease. The clean-up may have to queue behind the WAIT on
    // the client's one connection, hence a bound past the 2 s confirmation timeout.
    let limit = CONFIRM_TIMEOUT + Duration::from_secs(3);
    match gone_within(&server, &["replicated".to_owned()], limit).await {
        Ok(_) => {}
        Err(left) => panic!(
            "an acquire dropped during the replica confirmation left the lock behind, \
             {:?} after the drop: {left:?} (key, pttl ms)",
            dropped_at.elapsed()
        ),
    }
    let keys = server.cli(&["KEYS", "*"]);
    assert_eq!(keys, "redlock:fence", "left behind: {keys}");
}

/// The same over three RedLock masters, where an acquire goes through more steps
/// (an attempt on every master, the fencing write-back, the undo of a failed attempt):
/// acquires dropped after random delays, each followed by a look at every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_acquire_dropped_at_any_point_leaves_no_lock_on_any_master() {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let client = LockClient::builder_for(masters.iter().map(RedisServer::url))
        .connect()
        .await
        .unwrap();
    let mut connections = Vec::new();
    for master in &masters {
        connections.push(raw(master).await);
    }
    let mut rng = rand::rng();
    let (mut completed, mut dropped) = (0, 0);
    for round in 0..300 {
        // From "before the first poll's I/O completes" to "after a whole acquisition"
        // (tokio's timer fires on millisecond ticks, at a random phase of the attempt).
        let micros = rng.random_range(0..1500u64);
        let attempt = client
            .lock("spread")
            .lease(Duration::from_secs(30))
            .acquire();
        let what = match tokio::time::timeout(Duration::from_micros(micros), attempt).await {
            Ok(result) => {
                completed += 1;
                // The key was free on every master and nothing else wants it.
                let guard = result.unwrap_or_else(|error| {
                    panic!("round {round}: an undisturbed acquire of a free key failed: {error:?}")
                });
                guard.release().await.unwrap();
                "an acquire that completed (then released)"
            }
            Err(_) => {
                dropped += 1;
                "an acquire dropped"
            }
        };
        let started = Instant::now();
        loop {
            let mut held_on = Vec::new();
            for (index, connection) in connections.iter_mut().enumerate() {
                let pttl: i64 = connection.pttl("spread").await.unwrap();
                if pttl != -2 {
                    held_on.push((index, pttl));
                }
            }
            if held_on.is_empty() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "round {round}: {what} after {micros} µs left the lock on \
                 (master, pttl ms) {held_on:?}, {:?} later (lease 30 s)",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    // Both kinds happened, or the rounds covered less than they claim.
    assert!(
        completed > 0 && dropped > 0,
        "completed {completed}, dropped {dropped}"
    );
}

// ---------------------------------------------------------------------------------------
// 5. Under the attribute, a body that ran to its end returns its result.

/// The test's WARN (and ERROR) events, each as its fields' `name=value` pairs.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        // Levels compare by verbosity: WARN and ERROR are the ones at most WARN.
        if *event.metadata().level() > tracing::Level::WARN {
            return;
        }
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                let _ = write!(self.0, " {}={:?}", field.name(), value);
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

// `on_lost = "abort"` (the default) stops a body when the lock is lost; this body is
// never stopped: nothing tells the client, with a fixed lease and no renewal, that the
// key was deleted, and the body runs to its end.
#[distributed_lock(key = "ledger:<id>", wait = "1s", lease = "10s", on_lost = "abort", client = locks)]
async fn deletes_its_own_lock(
    locks: &LockClient,
    id: u64,
    server: &RedisServer,
    token: &AtomicU64,
) -> Result<u64, LockError> {
    token.store(current_lock().unwrap().fencing_token(), Ordering::SeqCst);
    // The key vanishes behind the holder's back (an operator, a FLUSHDB, a failover).
    assert_eq!(server.cli(&["DEL", &format!("ledger:{id}")]), "1");
    Ok(42)
}

#[distributed_lock(key = "ledger:<id>", wait = "1s", lease = "300ms", on_lost = "continue", client = locks)]
async fn outlives_its_lease_and_looks(
    locks: &LockClient,
    id: u64,
) -> Result<(bool, bool), LockError> {
    let lost_at_start = current_lock().unwrap().is_lost();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lost_at_end = current_lock().unwrap().is_lost();
    Ok((lost_at_start, lost_at_end))
}

#[distributed_lock(key = "ledger:<id>", wait = "1s", lease = "300ms", on_lost = "abort", client = locks)]
async fn stopped_when_its_lease_runs_out(
    locks: &LockClient,
    id: u64,
    finished: &AtomicBool,
) -> Result<u64, LockError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(7)
}

// current_thread: the whole test, background tasks included, runs on this thread, where
// the capturing subscriber is the default.
#[tokio::test]
async fn a_body_that_completed_returns_its_result_even_if_the_lock_vanished() {
    let warnings = Warnings::default();
    let _subscriber = {
        use tracing_subscriber::layer::SubscriberExt;
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()))
    };
    let server = RedisServer::start();
    let locks = client(&server).await;

    // The key deleted mid-body: the completed body's result stands ...
    let token = AtomicU64::new(0);
    let result = deletes_its_own_lock(&locks, 1, &server, &token).await;
    assert_eq!(
        result.as_ref().ok(),
        Some(&42),
        "a body that ran to its end lost its result: {result:?}"
    );
    // ... and the lost lock is reported, with its key and fencing token.
    let token = token.load(Ordering::SeqCst).to_string();
    let warnings = warnings.all();
    assert!(
        warnings
            .iter()
            .any(|fields| fields.contains("ledger:1") && fields.contains(&token)),
        "no warning names the lost lock ledger:1 and its token {token}: {warnings:#?}"
    );

    // A body that outlived its lease (on_lost = "continue") sees, before it returns, that
    // the lock may be gone; its result stands too.
    let (lost_at_start, lost_at_end) = outlives_its_lease_and_looks(&locks, 2).await.unwrap();
    assert!(!lost_at_start, "is_lost() right after the acquisition");
    assert!(
        lost_at_end,
        "is_lost() was false 500 ms into a 300 ms lease"
    );

    // Only a body stopped by on_lost = "abort" returns Lost.
    let finished = AtomicBool::new(false);
    let error = stopped_when_its_lease_runs_out(&locks, 3, &finished)
        .await
        .unwrap_err();
    assert!(error.is_lost(), "{error}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the body ran on after its lease ran out"
    );
}

// ---------------------------------------------------------------------------------------
// 6. and 7.: renewals racing a release or an extend of the same lock.
//
// A renewal round picks the client's watched locks, builds one pipeline of them and sends
// it; a release or extend of one of those locks can reach Redis in between, or have its
// reply handled before the round's. Other watchdog locks of the same client ("ballast")
// make each round longer at every step, so the races happen often enough to be caught
// in a few hundred tries; they widen the windows, they do not create them.

/// Takes `count` watchdog locks on `client` (named `ballast:<i>`), concurrently.
async fn ballast(client: &LockClient, count: usize) -> Vec<LockGuard> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        let client = client.clone();
        tasks.spawn(async move { client.lock(format!("ballast:{i}")).acquire().await });
    }
    let mut guards = Vec::with_capacity(count);
    while let Some(guard) = tasks.join_next().await {
        guards.push(guard.unwrap().unwrap());
    }
    guards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_never_undoes_a_hold_at_least_release() {
    let server = RedisServer::start();
    const WATCHDOG_LEASE: Duration = Duration::from_secs(5);
    const HOLD: Duration = Duration::from_millis(300);
    let client = LockClient::builder(&server.url())
        .watchdog_lease(WATCHDOG_LEASE)
        .renew_every(Duration::from_millis(1))
        .connect()
        .await
        .unwrap();
    let ballast = ballast(&client, 1000).await;
    let mut connection = raw(&server).await;
    let mut rng = rand::rng();
    let mut kept = Vec::new();
    for round in 0..50 {
        let key = format!("kept:{round}");
        let guard = client
            .lock(key.as_str())
            .hold_at_least(HOLD)
            .acquire()
            .await
            .unwrap();
        // Held long enough for renewal rounds to include it, released at a random phase
        // of them, well inside the minimum hold: the release keeps the key.
        tokio::time::sleep(Duration::from_micros(rng.random_range(0..20_000))).await;
        guard.release().await.unwrap();
        let pttl: i64 = connection.pttl(&key).await.unwrap();
        assert!(
            pttl > 0 && pttl <= HOLD.as_millis() as i64,
            "{key}: right after a release that keeps it for the rest of {HOLD:?}, pttl {pttl}"
        );
        kept.push(key);
    }
    // Every kept key goes when its minimum hold ends. One that a renewal set back to the
    // watchdog lease lives ~5 s more: the bound is far from both.
    let limit = HOLD + Duration::from_millis(1500);
    if let Err(left) = gone_within(&server, &kept, limit).await {
        panic!(
            "after a hold_at_least release, a renewal set the key's expiry back to the \
             watchdog lease ({WATCHDOG_LEASE:?}): (key, pttl ms) {left:?}"
        );
    }
    drop(ballast);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_extend_racing_a_renewal_never_leaves_the_guard_optimistic() {
    let server = RedisServer::start();
    let client = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(2))
        .renew_every(Duration::from_millis(1))
        .connect()
        .await
        .unwrap();
    let ballast = ballast(&client, 1000).await;
    let guard = client.lock("lease").acquire().await.unwrap();
    let mut connection = raw(&server).await;
    let mut rng = rand::rng();
    // Redis counts expiries in whole milliseconds.
    const SLACK: Duration = Duration::from_millis(5);
    // Looks at which the guard counted on some time at all: a guard that always says
    // zero would pass every comparison and prove nothing.
    let mut informative = 0;
    for round in 0..200 {
        let lease = Duration::from_millis(rng.random_range(50..500));
        guard.extend(lease).await.unwrap();
        // A renewal answered around the extend is handled by its own task, maybe a
        // little later: look a few times, until the next renewal would hide it.
        for look in 0..3 {
            // The guard claims the key lives until (read + remaining). Between the two
            // reads only a renewal can move Redis's expiry, and only later; Redis's
            // expiry at the PTTL read is at most (reply + pttl). So a truthful guard has
            // remaining <= pttl + (reply - read), whatever the scheduling.
            let read = Instant::now();
            let remaining = guard.lease_remaining();
            let pttl: i64 = connection.pttl("lease").await.unwrap();
            let window = read.elapsed();
            assert!(pttl > 0, "round {round}: the lock is gone (pttl {pttl})");
            let redis_side = Duration::from_millis(pttl as u64);
            assert!(
                remaining <= redis_side + window + SLACK,
                "round {round}, look {look}: after extend({lease:?}) the guard counts on \
                 {remaining:?} more, Redis has {redis_side:?} left (read {window:?} apart)"
            );
            if !remaining.is_zero() {
                informative += 1;
            }
            tokio::task::yield_now().await;
        }
    }
    assert!(
        informative >= 50,
        "the guard counted on no time left at {} of 600 looks, although Redis had the lock",
        600 - informative
    );
    // Once nothing races them, renewals alone bring the estimate back up: the lock is
    // held, and the guard says so again within a few renewal rounds.
    let settled = Instant::now();
    while guard.is_lost() || guard.lease_remaining() < Duration::from_millis(500) {
        assert!(
            settled.elapsed() < Duration::from_secs(2),
            "a renewed lock still counts as lost or nearly run out {:?} after the last \
             extend: lease_remaining {:?}, is_lost {}",
            settled.elapsed(),
            guard.lease_remaining(),
            guard.is_lost()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    guard.release().await.unwrap();
    drop(ballast);
}

// ---------------------------------------------------------------------------------------
// 8. An early release keeps the key until the minimum hold ends.

#[tokio::test]
async fn hold_at_least_keeps_the_key_after_an_early_release() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let guard = client
        .lock("job")
        .lease(Duration::from_secs(30))
        .hold_at_least(Duration::from_millis(1500))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let ttl: i64 = raw(&server).await.pttl("job").await.unwrap();
    assert!(ttl > 0 && ttl <= 1500, "pttl {ttl}");
    assert!(client.lock("job").acquire().await.unwrap_err().is_timeout());
    let again = client
        .lock("job")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    again.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// 9. A release future dropped at any point still frees the lock.

#[tokio::test]
async fn an_interrupted_release_still_frees_the_lock() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let other = client(&server).await;
    for micros in [0u64, 30, 100, 300] {
        let guard = holder
            .lock("interrupted")
            .lease(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        let _ = tokio::time::timeout(Duration::from_micros(micros), guard.release()).await;
        // Freed in the background long before the 60 s lease.
        let next = other
            .lock("interrupted")
            .wait(Duration::from_secs(5))
            .lease(Duration::from_secs(1))
            .acquire()
            .await
            .expect("an interrupted release left the lock behind");
        next.release().await.unwrap();
    }
}
