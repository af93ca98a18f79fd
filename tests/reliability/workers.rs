//! Workers: tasks that take one key over and over and record every hold, in this
//! process or in child processes.
//!
//! A child process is this test binary run again with `--exact workers::worker_process`
//! and the worker's settings in `REDLOCK_RELIABILITY_WORKER`; without that variable the
//! entry test does nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redlock_runtime::{LockClient, LockError, LockGuard};

use crate::clock;
use crate::history::{self, Attempt, AttemptResult, Outcome, Recorder, Release, StoreWrite};
use crate::store::FencedStore;

const WORKER_ENV: &str = "REDLOCK_RELIABILITY_WORKER";

/// What one worker process (or group of in-process tasks) does.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub role: Role,
    pub lock_url: String,
    pub store_url: String,
    pub dir: PathBuf,
    pub key: String,
    pub tasks: u32,
    /// Holds each task completes before it stops.
    pub holds: u32,
    pub wait: Duration,
    /// `None`: watchdog mode.
    pub lease: Option<Duration>,
    /// Every this many holds, a task outlives its lease before its last write (0: never).
    pub overrun_every: u32,
    /// Task 0 of each process asks with this short wait instead, to collect timeouts.
    pub impatient_wait: Option<Duration>,
}

/// What a worker process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Tasks that acquire, write, release, `holds` times each.
    Contender,
    /// One acquisition, one write, then a sleep of `wait` (during which the test
    /// interferes: SIGKILL, SIGSTOP), then a check of the guard, a late write and the
    /// release.
    Holder,
}

impl WorkerSpec {
    pub fn contender(lock_url: &str, store_url: &str, dir: &Path, key: &str) -> Self {
        WorkerSpec {
            role: Role::Contender,
            lock_url: lock_url.to_owned(),
            store_url: store_url.to_owned(),
            dir: dir.to_owned(),
            key: key.to_owned(),
            tasks: 4,
            holds: 50,
            wait: Duration::from_secs(20),
            lease: Some(Duration::from_secs(2)),
            overrun_every: 0,
            impatient_wait: None,
        }
    }

    fn encode(&self) -> String {
        let millis = |d: Option<Duration>| d.map_or(-1, |d| d.as_millis() as i128);
        [
            match self.role {
                Role::Contender => "contender".to_string(),
                Role::Holder => "holder".to_string(),
            },
            self.lock_url.clone(),
            self.store_url.clone(),
            self.dir.display().to_string(),
            self.key.clone(),
            self.tasks.to_string(),
            self.holds.to_string(),
            self.wait.as_millis().to_string(),
            millis(self.lease).to_string(),
            self.overrun_every.to_string(),
            millis(self.impatient_wait).to_string(),
        ]
        .join("\t")
    }

    fn decode(text: &str) -> Self {
        let parts: Vec<&str> = text.split('\t').collect();
        assert_eq!(parts.len(), 11, "bad worker spec {text:?}");
        let millis = |s: &str| -> Option<Duration> {
            let n: i128 = s.parse().expect("a number of milliseconds");
            (n >= 0).then(|| Duration::from_millis(n as u64))
        };
        WorkerSpec {
            role: if parts[0] == "holder" {
                Role::Holder
            } else {
                Role::Contender
            },
            lock_url: parts[1].to_owned(),
            store_url: parts[2].to_owned(),
            dir: PathBuf::from(parts[3]),
            key: parts[4].to_owned(),
            tasks: parts[5].parse().expect("tasks"),
            holds: parts[6].parse().expect("holds"),
            wait: millis(parts[7]).expect("wait"),
            lease: millis(parts[8]),
            overrun_every: parts[9].parse().expect("overrun_every"),
            impatient_wait: millis(parts[10]),
        }
    }

    /// Runs this spec in a child process (killed on drop); its stdout is discarded,
    /// its stderr kept.
    pub fn spawn(&self) -> WorkerProcess {
        let child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "workers::worker_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WORKER_ENV, self.encode())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a worker process");
        WorkerProcess { child }
    }
}

/// A worker child process; killed on drop, so that a failing test leaves none behind.
#[derive(Debug)]
pub struct WorkerProcess {
    child: Child,
}

impl WorkerProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for it to exit, killing it if it takes longer than `limit`; panics unless
    /// it exited successfully.
    pub async fn join(mut self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll a worker process") {
                assert!(
                    status.success(),
                    "worker process {} failed: {status}",
                    self.pid()
                );
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                self.kill();
                panic!("worker process {} hung for {limit:?}", self.pid());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The child-process entry; a no-op in a normal test run.
#[test]
fn worker_process() {
    let Ok(text) = std::env::var(WORKER_ENV) else {
        return;
    };
    let spec = WorkerSpec::decode(&text);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async move {
            // `lock_url` is REDLOCK_URL-style: a comma-separated list means RedLock.
            let client = LockClient::builder_from_spec(&spec.lock_url)
                // Generous: the workers connect before any fault, and a loaded machine
                // (the suite's passes side by side on two cores) is no fault to fail on.
                .connect_timeout(Duration::from_secs(5))
                .connect()
                .await
                .expect("connect to the lock's Redis");
            let store = FencedStore::connect(&spec.store_url).await;
            let recorder = Recorder::in_dir(&spec.dir);
            match spec.role {
                Role::Contender => run_contenders(&spec, &client, &store, &recorder).await,
                Role::Holder => run_holder(&spec, &client, &store, &recorder).await,
            }
        });
}

/// Runs `spec.tasks` contender tasks on `client` until each has its holds.
pub async fn run_contenders(
    spec: &WorkerSpec,
    client: &LockClient,
    store: &FencedStore,
    recorder: &Recorder,
) {
    let tasks: Vec<_> = (0..spec.tasks)
        .map(|task| {
            let (spec, client, store, recorder) = (
                spec.clone(),
                client.clone(),
                store.clone(),
                recorder.clone(),
            );
            tokio::spawn(async move { contend(&spec, task, &client, &store, &recorder).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("a contender task panicked");
    }
}

async fn contend(
    spec: &WorkerSpec,
    task: u32,
    client: &LockClient,
    store: &FencedStore,
    recorder: &Recorder,
) {
    let wait = match spec.impatient_wait {
        Some(short) if task == 0 => short,
        _ => spec.wait,
    };
    let mut seq = 0;
    let mut done = 0;
    while done < spec.holds {
        seq += 1;
        let id = recorder.id(task, seq);
        let Some(guard) = acquire(client, spec, wait, recorder, id).await else {
            // A timeout or an error: try again (an impatient task after a short pause).
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        done += 1;
        write(store, recorder, id, guard.fencing_token()).await;
        let overrun = spec.overrun_every > 0 && seq % u64::from(spec.overrun_every) == 0;
        match spec.lease {
            Some(lease) if overrun => {
                // Outlive the lease, then write once more: a stale writer.
                tokio::time::sleep(lease + lease / 2).await;
                write(store, recorder, id, guard.fencing_token()).await;
            }
            _ => {
                // Short holds, some a little longer: a wider window for an overlap to show.
                if seq % 5 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                } else {
                    tokio::task::yield_now().await;
                }
                write(store, recorder, id, guard.fencing_token()).await;
            }
        }
        release(guard, recorder, id).await;
    }
}

/// One call to `acquire`, recorded; the guard on success.
pub async fn acquire(
    client: &LockClient,
    spec: &WorkerSpec,
    wait: Duration,
    recorder: &Recorder,
    id: history::HoldId,
) -> Option<LockGuard> {
    let mut request = client.lock(spec.key.as_str()).wait(wait);
    if let Some(lease) = spec.lease {
        request = request.lease(lease);
    }
    let t_req = clock::now();
    let result = request.acquire().await;
    let t_ret = clock::now();
    recorder.attempt(&Attempt {
        id,
        t_req,
        t_ret,
        wait: clock::nanos(wait),
        result: match &result {
            Ok(_) => AttemptResult::Acquired,
            Err(LockError::Timeout { .. }) => AttemptResult::Timeout,
            Err(error) => AttemptResult::Error(variant(error)),
        },
    });
    let guard = result.ok()?;
    recorder.acquired(
        id,
        guard.fencing_token(),
        t_req,
        t_ret,
        spec.lease.map(clock::nanos),
    );
    Some(guard)
}

/// One write to the fenced store, recorded; true when accepted.
pub async fn write(
    store: &FencedStore,
    recorder: &Recorder,
    id: history::HoldId,
    token: u64,
) -> bool {
    let start = clock::now();
    let accepted = store.write(token).await;
    let end = clock::now();
    recorder.write(
        id,
        token,
        StoreWrite {
            start,
            end,
            accepted,
        },
    );
    accepted
}

/// The release of a guard, recorded.
pub async fn release(guard: LockGuard, recorder: &Recorder, id: history::HoldId) -> Outcome {
    let lost_before = guard.is_lost();
    let t_start = clock::now();
    let result = guard.release().await;
    let t_end = clock::now();
    let outcome = match result {
        Ok(()) => Outcome::Released,
        Err(LockError::Lost { .. }) => Outcome::Lost,
        Err(_) => Outcome::ReleaseFailed,
    };
    recorder.released(
        id,
        Release {
            t_start,
            t_end,
            outcome,
            lost_before,
        },
    );
    outcome
}

/// Acquires once, writes, sleeps `spec.wait` (the test interferes meanwhile), then
/// records whether the guard knows it is lost, writes again with its token, releases.
async fn run_holder(
    spec: &WorkerSpec,
    client: &LockClient,
    store: &FencedStore,
    recorder: &Recorder,
) {
    let id = recorder.id(0, 1);
    let guard = acquire(client, spec, Duration::from_secs(10), recorder, id)
        .await
        .expect("the holder acquires a free lock");
    write(store, recorder, id, guard.fencing_token()).await;
    tokio::time::sleep(spec.wait).await;
    // The late write: with a lost lock the store must refuse it.
    write(store, recorder, id, guard.fencing_token()).await;
    release(guard, recorder, id).await;
}

/// The name of an error's variant, for the history.
pub fn variant(error: &LockError) -> String {
    let debug = format!("{error:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Unknown")
        .to_string()
}

/// Waits (polling, up to `limit`) until `ready` holds; false if it never did.
pub async fn eventually(limit: Duration, mut ready: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if ready().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
