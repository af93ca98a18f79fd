//! A process that ends leaves no lock behind: its `main` returning right after a guard
//! was dropped, its work cut short in a `tokio::select!` by a shutdown signal, or SIGTERM
//! handled the documented way (`LockClient::shutdown`). Each is a child process (this
//! test binary run again with `--exact child_process` and the scenario in
//! `REDLOCK_SHUTDOWN_CHILD`); the key must be free as soon as the child has exited, in
//! every run, long before any lease could have run out.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_runtime::{LockClient, LockError, distributed_lock};
use redlock_testkit::RedisServer;

const CHILD_ENV: &str = "REDLOCK_SHUTDOWN_CHILD";
/// Runs of each scenario.
const RUNS: usize = 20;
/// Long enough that a key still there after the child exited was not released.
const LEASE: Duration = Duration::from_secs(60);

/// How a child process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// `main` returns right after dropping its guard; the client goes with it.
    MainReturns,
    /// An annotated call (default client) raced against `ctrl_c()` in a
    /// `tokio::select!`; SIGINT wins and `main` returns.
    SelectOnCtrlC,
    /// SIGTERM, handled as the crate docs show: `select!` on the work and the signal,
    /// then `LockClient::shutdown().await`. A spawned task holds a second lock.
    Sigterm,
    /// `main` returns right after dropping its guard when told to (a line on stdin),
    /// which the test does while Redis hangs.
    MainReturnsOnCue,
}

impl Ending {
    fn name(self) -> &'static str {
        match self {
            Ending::MainReturns => "main-returns",
            Ending::SelectOnCtrlC => "select-ctrl-c",
            Ending::Sigterm => "sigterm",
            Ending::MainReturnsOnCue => "main-returns-on-cue",
        }
    }

    fn parse(name: &str) -> Self {
        match name {
            "main-returns" => Ending::MainReturns,
            "select-ctrl-c" => Ending::SelectOnCtrlC,
            "sigterm" => Ending::Sigterm,
            "main-returns-on-cue" => Ending::MainReturnsOnCue,
            other => panic!("unknown scenario {other:?}"),
        }
    }
}

/// The child-process entry; a no-op in a normal test run. Like a program's `main`, it
/// ends the process as soon as the runtime has been dropped.
#[test]
fn child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split('\t').collect();
    let [ending, url, key, watchdog] = parts[..] else {
        panic!("bad child spec {spec:?}");
    };
    let (url, key) = (url.to_owned(), key.to_owned());
    let watchdog = watchdog == "watchdog";
    // RUST_LOG=redlock=debug shows what the child's client did, on the test's stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    match Ending::parse(ending) {
        Ending::MainReturns => main_returns(url, key, watchdog),
        Ending::SelectOnCtrlC => select_on_ctrl_c(url, key),
        Ending::Sigterm => sigterm(url, key),
        Ending::MainReturnsOnCue => main_returns_on_cue(url, key),
    }
    std::process::exit(0);
}

fn held() {
    println!("HELD");
}

#[tokio::main]
async fn main_returns(url: String, key: String, watchdog: bool) {
    let client = LockClient::connect(&url).await.expect("connect");
    let request = client.lock(key);
    let request = if watchdog {
        request
    } else {
        request.lease(LEASE)
    };
    let guard = request.acquire().await.expect("acquire");
    held();
    drop(guard);
}

#[tokio::main]
async fn main_returns_on_cue(url: String, key: String) {
    let client = LockClient::connect(&url).await.expect("connect");
    let guard = client
        .lock(key)
        .lease(LEASE)
        .acquire()
        .await
        .expect("acquire");
    held();
    tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
        .await
        .expect("the cue")
        .expect("stdin");
    drop(guard);
}

#[distributed_lock(key = "<key>", wait = "5s")]
async fn endless_work(key: &str) -> Result<(), LockError> {
    let _ = key;
    held();
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn select_on_ctrl_c(url: String, key: String) {
    let client = LockClient::connect(&url).await.expect("connect");
    redlock_runtime::set_default_client(client);
    tokio::select! {
        result = endless_work(&key) => result.expect("the work"),
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[tokio::main]
async fn sigterm(url: String, key: String) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let client = LockClient::connect(&url).await.expect("connect");
    // Another task of the program holds a lock of its own, and is not cancelled.
    let worker = client.clone();
    let other = format!("{key}:worker");
    let (taken, worker_holds) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let guard = worker.lock(other).acquire().await.expect("worker lock");
        let _ = taken.send(());
        std::future::pending::<()>().await;
        drop(guard);
    });
    worker_holds.await.expect("the worker's lock");
    let work = async {
        let _guard = client.lock(&key).lease(LEASE).acquire().await?;
        held();
        std::future::pending::<()>().await;
        Ok::<(), LockError>(())
    };
    tokio::select! {
        result = work => result.expect("the work"),
        _ = terminate.recv() => {}
    }
    client.shutdown().await.expect("shutdown");
}

/// Starts `ending` in a child process holding `key` (stdin piped) and waits until it
/// holds it.
fn start_child(ending: Ending, server: &RedisServer, key: &str, watchdog: bool) -> ChildProcess {
    let mode = if watchdog { "watchdog" } else { "lease" };
    let mut child = ChildProcess(
        Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                [ending.name(), &server.url(), key, mode].join("\t"),
            )
            .env_remove("REDLOCK_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a child process"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    // The harness writes `test child_process ... ` before the child's own line.
    let holding = BufReader::new(stdout)
        .lines()
        .any(|line| line.is_ok_and(|line| line.ends_with("HELD")));
    assert!(holding, "{ending:?}: the child never held {key}");
    child
}

/// Waits for the child to exit successfully (killing it after 20 s); how long it took.
fn wait_for_exit(ending: Ending, child: &mut ChildProcess) -> Duration {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait for the child") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{ending:?}: the child hung"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(status.success(), "{ending:?}: the child failed: {status}");
    started.elapsed()
}

/// A child running `ending`, killed on drop.
struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `ending` in a child process holding `key`; returns once it has exited.
fn run_child(ending: Ending, server: &RedisServer, key: &str, watchdog: bool) {
    let mut child = start_child(ending, server, key, watchdog);
    match ending {
        Ending::MainReturns | Ending::MainReturnsOnCue => {}
        Ending::SelectOnCtrlC => redlock_testkit::signal(child.0.id(), "INT"),
        Ending::Sigterm => redlock_testkit::signal(child.0.id(), "TERM"),
    }
    wait_for_exit(ending, &mut child);
}

/// Runs `ending` RUNS times; returns the runs whose keys were still held once the
/// child had exited (checked at once: one round trip), with what was held.
async fn runs_leaving_locks(ending: Ending, keys_per_run: &[&str]) -> Vec<String> {
    let server = RedisServer::start();
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut left = Vec::new();
    for run in 0..RUNS {
        let key = format!("shutdown:{}:{run}", ending.name());
        // The child is watched with blocking calls (its stdout, its exit).
        tokio::task::block_in_place(|| run_child(ending, &server, &key, run % 2 == 0));
        let mut held = Vec::new();
        for suffix in keys_per_run {
            let key = format!("{key}{suffix}");
            let ttl: i64 = redis.pttl(&key).await.unwrap();
            if ttl != -2 {
                held.push(format!("{key} (pttl {ttl} ms)"));
            }
        }
        if !held.is_empty() {
            left.push(held.join(", "));
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_as_main_returns_is_released_before_the_process_exits() {
    let left = runs_leaving_locks(Ending::MainReturns, &[""]).await;
    assert!(
        left.is_empty(),
        "held after exit in {} of {RUNS} runs: {left:?}",
        left.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_cut_short_by_ctrl_c_in_a_select_leaves_the_key_free() {
    let left = runs_leaving_locks(Ending::SelectOnCtrlC, &[""]).await;
    assert!(
        left.is_empty(),
        "held after exit in {} of {RUNS} runs: {left:?}",
        left.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_through_shutdown_frees_every_lock_of_the_process() {
    let left = runs_leaving_locks(Ending::Sigterm, &["", ":worker"]).await;
    assert!(
        left.is_empty(),
        "held after exit in {} of {RUNS} runs: {left:?}",
        left.len()
    );
}

/// The release a runtime's shutdown sends must not hang the exit when Redis does not
/// answer: the exit waits for it no longer than its bound (1 s with default settings).
#[test]
fn an_exit_while_redis_hangs_waits_for_the_release_no_longer_than_its_bound() {
    use std::io::Write;
    let server = RedisServer::start();
    for run in 0..3 {
        let ending = Ending::MainReturnsOnCue;
        let mut child = start_child(ending, &server, &format!("hang:{run}"), false);
        server.pause();
        let cue = child.0.stdin.as_mut().expect("stdin").write_all(b"go\n");
        let took = cue.map(|()| wait_for_exit(ending, &mut child));
        server.resume();
        let took = took.expect("cue the child");
        eprintln!("run {run}: exited {took:?} after its cue");
        assert!(took < Duration::from_secs(8), "exit delayed by {took:?}");
    }
}

#[tokio::test]
async fn after_shutdown_an_acquisition_is_refused_naming_its_key() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let clone = client.clone();
    client.shutdown().await.unwrap();
    for request in [
        clone.lock("order:1").lease(LEASE),
        client.read_lock("doc:1"),
        client.semaphore("api", 2),
    ] {
        let error = request.acquire().await.expect_err("refused after shutdown");
        assert!(matches!(error, LockError::ShutDown { .. }), "{error:?}");
        assert!(!error.key().is_empty());
        assert!(error.to_string().contains("shut down"), "{error}");
    }
    let error = client
        .election("leader")
        .campaign()
        .await
        .expect_err("refused");
    assert!(matches!(error, LockError::ShutDown { .. }), "{error:?}");
    // Twice does no harm.
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_releases_the_locks_held_by_live_guards_and_tells_them() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let watched = client.lock("held:watchdog").acquire().await.unwrap();
    let leased = client
        .lock("held:lease")
        .lease(LEASE)
        .acquire()
        .await
        .unwrap();
    let kept = client
        .lock("held:kept")
        .lease(LEASE)
        .hold_at_least(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let reader = client.read_lock("held:shared").acquire().await.unwrap();
    assert_eq!(client.watched_locks(), 2);
    client.shutdown().await.unwrap();
    for key in ["held:watchdog", "held:lease", "held:shared"] {
        let exists: bool = redis.exists(key).await.unwrap();
        assert!(!exists, "{key} still held after shutdown");
    }
    // `hold_at_least` still keeps the key for the rest of its minimum hold.
    let ttl: i64 = redis.pttl("held:kept").await.unwrap();
    assert!(ttl > 0 && ttl <= 20_000, "held:kept: pttl {ttl}");
    assert_eq!(client.watched_locks(), 0);
    for guard in [&watched, &leased, &kept, &reader] {
        assert!(guard.is_lost(), "{} not told", guard.key());
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() resolves");
    }
    let error = leased
        .extend(LEASE)
        .await
        .expect_err("extend after shutdown");
    assert!(matches!(error, LockError::ShutDown { .. }), "{error:?}");
    let error = watched
        .release()
        .await
        .expect_err("released by the shutdown");
    assert!(
        matches!(error, LockError::ShutDown { ref key } if key == "held:watchdog"),
        "{error:?}"
    );
    drop((leased, kept, reader));
}

#[tokio::test]
async fn an_acquisition_waiting_at_shutdown_takes_nothing_when_it_is_woken() {
    let server = RedisServer::start();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let held = holder.lock("busy").lease(LEASE).acquire().await.unwrap();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("busy")
                .wait(Duration::from_secs(20))
                .lease(LEASE)
                .acquire()
                .await
        }
    });
    while holder.inspect("busy").await.unwrap().unwrap().waiting() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    client.shutdown().await.unwrap();
    held.release().await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the release")
        .unwrap()
        .expect_err("refused after shutdown");
    assert!(matches!(refused, LockError::ShutDown { .. }), "{refused:?}");
    // The release granted the key to the waiting acquisition (its client still
    // listened), which refused it and released it in the background: gone soon.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while holder.inspect("busy").await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a grant refused after shutdown was left held"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[distributed_lock(key = "report:<day>", lease = "10s")]
async fn report(day: u32) -> Result<u32, LockError> {
    Ok(day)
}

#[tokio::test]
async fn after_shutdown_default_client_an_annotated_call_is_refused() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    redlock_runtime::set_default_client(client);
    assert_eq!(report(1).await.unwrap(), 1);
    redlock_runtime::shutdown_default_client().await.unwrap();
    let error = report(2).await.expect_err("refused after shutdown");
    assert!(
        matches!(error, LockError::ShutDown { ref key } if key == "report:2"),
        "{error:?}"
    );
}

/// A client whose release granted the key to a waiter that cannot confirm it (its
/// process stalled, its connection open) checks a grace later that the grant was
/// picked up, and passes it on if not. A shutdown right after that release waits for
/// the check (issue 33): a process that exits when `shutdown` returns must not take the
/// check with it, which left the next waiter asleep until the lease it was told.
#[test]
fn shutdown_waits_for_the_grant_checks_of_its_releases() {
    next_waiter_after_a_granting_release_and_shutdown("shutdown:grant", false);
}

/// The same with the guard dropped just before `shutdown()`: its release runs in the
/// background, and the grant check it starts comes after shutdown began to wait.
#[test]
fn shutdown_waits_for_the_grant_check_of_a_release_still_in_the_background() {
    next_waiter_after_a_granting_release_and_shutdown("shutdown:grant-dropped", true);
}

fn next_waiter_after_a_granting_release_and_shutdown(key: &'static str, drop_guard: bool) {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(name)
            .build()
            .unwrap()
    };
    let waitlist = || -> usize {
        server
            .cli(&["ZCARD", &format!("redlock:waitlist:{key}")])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let limit = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < limit, "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    };

    // The holder, on a runtime the test drops as a process's exit would.
    let holder_runtime = runtime("holder");
    let holder = holder_runtime.block_on(LockClient::connect(&url)).unwrap();
    let guard = holder_runtime
        .block_on(holder.lock(key).lease(LEASE).acquire())
        .unwrap();

    // The first waiter, on a thread of its own that the test blocks later.
    let (stalled_tx, stalled_rx) = std::sync::mpsc::channel();
    let stalled_url = url.clone();
    let stalled = std::thread::spawn(move || {
        let stalled_runtime = runtime("stalled");
        stalled_runtime.block_on(async move {
            let client = LockClient::connect(&stalled_url).await.unwrap();
            stalled_tx.send(tokio::runtime::Handle::current()).unwrap();
            let acquired = client
                .lock(key)
                .wait(Duration::from_secs(30))
                .lease(Duration::from_secs(10))
                .acquire()
                .await;
            if let Ok(guard) = acquired {
                let _ = guard.release().await;
            }
        });
    });
    let stalled_handle = stalled_rx.recv().unwrap();
    until("the first waiter in line", &|| waitlist() == 1);

    // The next waiter, which must get the key within the grace and some slack.
    let next_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let next_url = url.clone();
    let next = next_runtime.spawn(async move {
        let client = LockClient::connect(&next_url).await.unwrap();
        let guard = client
            .lock(key)
            .wait(Duration::from_secs(30))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let got_it = Instant::now();
        guard.release().await.unwrap();
        got_it
    });
    until("the next waiter in line", &|| waitlist() == 2);

    // The first waiter's only thread stops: the grant reaches its connection, unread.
    stalled_handle.spawn(async { std::thread::sleep(Duration::from_secs(4)) });
    std::thread::sleep(Duration::from_millis(100));
    holder_runtime.block_on(async {
        if drop_guard {
            drop(guard);
        } else {
            guard.release().await.unwrap();
        }
        holder.shutdown().await.unwrap();
    });
    let exited = Instant::now();
    drop(holder_runtime);

    let got_it = next_runtime.block_on(next).unwrap();
    let after_exit = got_it.saturating_duration_since(exited);
    assert!(
        after_exit < Duration::from_secs(2),
        "the next waiter got the key {after_exit:?} after the releasing process exited: \
         the grant check went with it"
    );
    stalled.join().unwrap();
}
