//! Client processes: this test binary run again inside a host's namespace
//! (`ip netns exec <ns> <this binary> --exact child::client_process`), with what to do
//! in `REDLOCK_PARTITION_CLIENT`; without that variable the entry test does nothing.
//!
//! Every client records each `acquire`, hold, fenced write, loss and release in the
//! test's history directory (see the reliability suite's `history`), on the one clock
//! of the machine, so the checker sees all processes' holds side by side.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlock_runtime::{FencedKey, FencedWrite, LockClient, LockError, LockGuard};

use crate::clock;
use crate::history::{Attempt, AttemptResult, HoldId, Outcome, Recorder, Release, StoreWrite};
use crate::net::{Net, NetProcess};

const CLIENT_ENV: &str = "REDLOCK_PARTITION_CLIENT";

/// What one client process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Acquires once (attempting until it succeeds), writes, and watches its guard;
    /// writes again once the test creates `<dir>/late-write-<pid>`, releases once it
    /// creates `<dir>/release-<pid>`, and takes the key once more (and releases it)
    /// once it creates `<dir>/retake-<pid>`.
    Holder,
    /// Acquires (attempting until it succeeds or `run_for` has passed), writes,
    /// releases, exits.
    Taker,
    /// `tasks` tasks acquire, write, hold `hold`, write, release, over and over until
    /// `run_for` has passed.
    Contender,
}

/// A client process's settings.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub role: Role,
    /// `REDLOCK_URL`-style: one URL, several (RedLock), `sentinel:NAME:…`, `cluster:…`.
    pub lock_url: String,
    pub store_url: String,
    pub dir: PathBuf,
    pub key: String,
    pub wait: Duration,
    /// `None`: watchdog mode.
    pub lease: Option<Duration>,
    pub watchdog_lease: Duration,
    pub response_timeout: Duration,
    pub tasks: u32,
    pub hold: Duration,
    pub run_for: Duration,
    /// RedLock's `max_lease`.
    pub max_lease: Duration,
    /// `confirm_replicas(n, timeout)`.
    pub confirm: Option<(usize, Duration)>,
}

impl ClientSpec {
    pub fn new(role: Role, lock_url: &str, store_url: &str, dir: &Path, key: &str) -> Self {
        ClientSpec {
            role,
            lock_url: lock_url.to_owned(),
            store_url: store_url.to_owned(),
            dir: dir.to_owned(),
            key: key.to_owned(),
            wait: Duration::from_secs(5),
            lease: Some(Duration::from_millis(1500)),
            watchdog_lease: Duration::from_millis(1500),
            response_timeout: Duration::from_millis(500),
            tasks: 1,
            hold: Duration::from_millis(10),
            run_for: Duration::from_secs(10),
            max_lease: Duration::from_secs(2),
            confirm: None,
        }
    }

    fn encode(&self) -> String {
        let ms = |d: Duration| d.as_millis().to_string();
        let (replicas, confirm_ms) = self
            .confirm
            .map_or((0, 0), |(n, timeout)| (n, timeout.as_millis()));
        [
            format!("{:?}", self.role),
            self.lock_url.clone(),
            self.store_url.clone(),
            self.dir.display().to_string(),
            self.key.clone(),
            ms(self.wait),
            self.lease.map_or("0".into(), ms),
            ms(self.watchdog_lease),
            ms(self.response_timeout),
            self.tasks.to_string(),
            ms(self.hold),
            ms(self.run_for),
            ms(self.max_lease),
            replicas.to_string(),
            confirm_ms.to_string(),
        ]
        .join("\n")
    }

    fn decode(text: &str) -> Self {
        let parts: Vec<&str> = text.split('\n').collect();
        assert_eq!(parts.len(), 15, "bad client spec {text:?}");
        let ms = |s: &str| Duration::from_millis(s.parse().expect("milliseconds"));
        let role = match parts[0] {
            "Holder" => Role::Holder,
            "Taker" => Role::Taker,
            "Contender" => Role::Contender,
            other => panic!("unknown role {other}"),
        };
        let replicas: usize = parts[13].parse().expect("replicas");
        ClientSpec {
            role,
            lock_url: parts[1].to_owned(),
            store_url: parts[2].to_owned(),
            dir: PathBuf::from(parts[3]),
            key: parts[4].to_owned(),
            wait: ms(parts[5]),
            lease: Some(ms(parts[6])).filter(|lease| !lease.is_zero()),
            watchdog_lease: ms(parts[7]),
            response_timeout: ms(parts[8]),
            tasks: parts[9].parse().expect("tasks"),
            hold: ms(parts[10]),
            run_for: ms(parts[11]),
            max_lease: ms(parts[12]),
            confirm: (replicas > 0).then(|| (replicas, ms(parts[14]))),
        }
    }

    /// Runs this client in host `host`'s namespace.
    pub fn spawn(&self, net: &Net, host: &str) -> NetProcess {
        let child = net
            .command(host, std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "child::client_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CLIENT_ENV, self.encode())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn a client process");
        NetProcess { child }
    }
}

/// The file by which the test tells this holder process to go on to `step`.
fn step_file(dir: &Path, step: &str) -> PathBuf {
    dir.join(format!("{step}-{}", std::process::id()))
}

/// The client-process entry; a no-op in a normal test run.
#[test]
fn client_process() {
    let Ok(text) = std::env::var(CLIENT_ENV) else {
        return;
    };
    let spec = ClientSpec::decode(&text);
    // A panic anywhere in the process (a background task's too, which tokio would
    // swallow) leaves a file for the test to find (`Fixture::history`).
    let dir = spec.dir.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let name = format!("panic-{}-{}.txt", std::process::id(), clock::now());
        let _ = std::fs::write(dir.join(name), info.to_string());
        previous(info);
    }));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async move {
            let mut builder = LockClient::builder_from_spec(&spec.lock_url)
                .connect_timeout(spec.response_timeout)
                .response_timeout(spec.response_timeout)
                .watchdog_lease(spec.watchdog_lease)
                .max_lease(spec.max_lease.max(spec.watchdog_lease));
            if let Some((replicas, timeout)) = spec.confirm {
                builder = builder.confirm_replicas(replicas, timeout);
            }
            let client = builder
                .connect()
                .await
                .expect("connect to the lock's Redis");
            let store = redis::Client::open(spec.store_url.as_str())
                .expect("store url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect to the store");
            let recorder = Recorder::in_dir(&spec.dir);
            match spec.role {
                Role::Holder => hold_and_watch(&spec, &client, &store, &recorder).await,
                Role::Taker => take_once(&spec, &client, &store, &recorder).await,
                Role::Contender => {
                    let tasks: Vec<_> = (0..spec.tasks)
                        .map(|task| {
                            let (spec, client, store, recorder) = (
                                spec.clone(),
                                client.clone(),
                                store.clone(),
                                recorder.clone(),
                            );
                            tokio::spawn(async move {
                                contend(&spec, task, &client, &store, &recorder).await
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("a contender task panicked");
                    }
                }
            }
            // Bounded: the client may still be cut off from some server.
            let _ = tokio::time::timeout(Duration::from_secs(5), client.shutdown()).await;
        });
}

async fn hold_and_watch(
    spec: &ClientSpec,
    client: &LockClient,
    store: &MultiplexedConnection,
    recorder: &Recorder,
) {
    let id = recorder.id(0, 1);
    let guard = loop {
        if let Some(guard) = acquire(client, spec, recorder, id).await {
            break guard;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    write(store, spec, recorder, id, guard.fencing_token()).await;
    let guard = std::sync::Arc::new(guard);
    let watcher = {
        let (guard, recorder) = (guard.clone(), recorder.clone());
        tokio::spawn(async move {
            guard.lost().await;
            recorder.lost(id, clock::now());
        })
    };
    wait_for(&step_file(&spec.dir, "late-write")).await;
    // The late write: with its lock gone, the store must refuse it.
    write(store, spec, recorder, id, guard.fencing_token()).await;
    wait_for(&step_file(&spec.dir, "release")).await;
    watcher.abort();
    let _ = watcher.await;
    let guard = std::sync::Arc::into_inner(guard).expect("the watcher let go of the guard");
    release(guard, recorder, id).await;
    // The same client, its network healed, takes the key once more: its connection
    // must work again, not time out on what the partition left queued in its socket.
    wait_for(&step_file(&spec.dir, "retake")).await;
    let id = recorder.id(0, 2);
    if let Some(guard) = acquire(client, spec, recorder, id).await {
        release(guard, recorder, id).await;
    }
}

async fn take_once(
    spec: &ClientSpec,
    client: &LockClient,
    store: &MultiplexedConnection,
    recorder: &Recorder,
) {
    let start = clock::now();
    let mut seq = 0;
    while clock::span(start, clock::now()) < spec.run_for {
        seq += 1;
        let id = recorder.id(0, seq);
        if let Some(guard) = acquire(client, spec, recorder, id).await {
            write(store, spec, recorder, id, guard.fencing_token()).await;
            release(guard, recorder, id).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{} never acquired {} in {:?}",
        std::process::id(),
        spec.key,
        spec.run_for
    );
}

async fn contend(
    spec: &ClientSpec,
    task: u32,
    client: &LockClient,
    store: &MultiplexedConnection,
    recorder: &Recorder,
) {
    let start = clock::now();
    let mut seq = 0;
    while clock::span(start, clock::now()) < spec.run_for {
        seq += 1;
        let id = recorder.id(task, seq);
        let Some(guard) = acquire(client, spec, recorder, id).await else {
            // Unreachable Redis fails fast at times: do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        write(store, spec, recorder, id, guard.fencing_token()).await;
        tokio::time::sleep(spec.hold).await;
        write(store, spec, recorder, id, guard.fencing_token()).await;
        release(guard, recorder, id).await;
    }
}

/// One call to `acquire`, recorded; the guard on success.
async fn acquire(
    client: &LockClient,
    spec: &ClientSpec,
    recorder: &Recorder,
    id: HoldId,
) -> Option<LockGuard> {
    let mut request = client.lock(spec.key.as_str()).wait(spec.wait);
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
        wait: clock::nanos(spec.wait),
        result: match &result {
            Ok(_) => AttemptResult::Acquired,
            Err(LockError::Timeout { .. }) => AttemptResult::Timeout,
            Err(error) => {
                if std::env::var_os("REDLOCK_PARTITION_TRACE").is_some() {
                    eprintln!(
                        "{id}: acquire failed after {:?}: {error:?}",
                        clock::span(t_req, t_ret)
                    );
                }
                AttemptResult::Error(variant(error))
            }
        },
    });
    let guard = result.ok()?;
    // In watchdog mode the history's lease is the watchdog lease: Redis's key lives at
    // least that long after the acquisition, so a takeover before it is an overlap.
    let lease = spec.lease.unwrap_or(spec.watchdog_lease);
    recorder.acquired(
        id,
        guard.fencing_token(),
        t_req,
        t_ret,
        Some(clock::nanos(lease)),
    );
    Some(guard)
}

/// One fenced write to the store (`FencedKey`), recorded; true when written.
async fn write(
    store: &MultiplexedConnection,
    spec: &ClientSpec,
    recorder: &Recorder,
    id: HoldId,
    token: u64,
) -> bool {
    let resource = FencedKey::new(format!("resource:{}", spec.key));
    let mut connection = store.clone();
    let start = clock::now();
    let written = resource
        .write(&mut connection, token, &[("by", std::process::id())])
        .await
        .expect("the store answers (it is never cut off)");
    let end = clock::now();
    let accepted = matches!(written, FencedWrite::Written { .. });
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
async fn release(guard: LockGuard, recorder: &Recorder, id: HoldId) -> Outcome {
    let lost_before = guard.is_lost();
    let t_start = clock::now();
    let result = guard.release().await;
    let t_end = clock::now();
    let outcome = match result {
        Ok(()) => Outcome::Released,
        Err(LockError::Lost { .. }) => Outcome::Lost,
        Err(error) => {
            eprintln!("{id}: release failed: {error:?}");
            Outcome::ReleaseFailed
        }
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

async fn wait_for(path: &Path) {
    while !path.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The name of an error's variant, for the history.
fn variant(error: &LockError) -> String {
    let debug = format!("{error:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Unknown")
        .to_string()
}
