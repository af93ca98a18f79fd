//! A throwaway `redis-server` for testing your own code (feature `test-util`), and
//! throwaway RedLock masters ([`RedlockMasters`]).
//!
//! Redis is never mocked here, in our tests or in yours: [`RedisServer::start`] runs a
//! real `redis-server` (the one on `PATH`, or the path in the environment variable
//! `REDIS_SERVER`) as a child process on a free port of 127.0.0.1, in a temporary
//! directory of its own, without persistence, and waits until it answers.
//! [`RedisServer::client`] connects a [`LockClient`] to it. Dropping the handle kills
//! the server, waits for it to exit and removes its directory — also when the test
//! panics. Each test starts its own server (a few milliseconds, a few megabytes), so
//! tests running in parallel never see each other's keys.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dev-dependencies]
//! # The same source as under [dependencies] (path, git or version), with the feature.
//! redlock-runtime = { path = "../redlock/redlock-runtime", features = ["test-util"] }
//! tokio = { version = "1", features = ["macros", "rt"] }
//! ```
//!
//! A test of an annotated function, with another instance holding the lock:
//!
//! ```rust,test_harness
//! use redlock_runtime::test_util::RedisServer;
//! use redlock_runtime::{LockClient, LockError, distributed_lock};
//!
//! // The code under test takes its client as an argument: `client = locks`.
//! #[distributed_lock(key = "order:<id>", wait = "1s", lease = "5s", client = locks)]
//! async fn pay_order(locks: &LockClient, id: u64) -> Result<u64, LockError> {
//!     Ok(id)
//! }
//!
//! #[tokio::test]
//! async fn an_order_is_paid_under_its_lock() {
//!     let redis = RedisServer::start().expect("start redis-server");
//!     let locks = redis.client().await.expect("connect");
//!     assert_eq!(pay_order(&locks, 42).await.unwrap(), 42);
//!
//!     // Another instance holds the order: the call waits its 1 s, then says busy.
//!     let other = redis.client().await.expect("connect");
//!     let held = other.lock("order:42").acquire().await.unwrap();
//!     let error = pay_order(&locks, 42).await.unwrap_err();
//!     assert!(error.is_busy(), "{error}");
//!     held.release().await.unwrap();
//! }
//! ```
//!
//! # The default client in tests
//! Pass the client explicitly, as above: `client = …` takes any expression in scope of
//! the function — a parameter, `self.locks` of your service's state, a reference or an
//! `Arc` of a [`LockClient`] (see the attribute's `client` argument). Code that names no
//! client uses the default client instead, and that one does not fit `#[tokio::test]`
//! well: [`set_default_client`](crate::set_default_client) is process-global, a client
//! lives in the tokio runtime that created it, and `#[tokio::test]` builds a runtime of
//! its own for each test, while the tests of a binary run in parallel threads. Two tests
//! that each set it replace each other's client (and point each other at the wrong
//! server), and a client whose test has ended has lost its background tasks with that
//! test's runtime: its locks still go through, but nothing renews a lock held with the
//! watchdog (it is lost after the watchdog lease) and no release message wakes its
//! waiters (they find the lock free only when they try again, at the latest at the
//! end of their `wait`). For code that relies on the default client, give such a test
//! a test binary of its own (one `tests/<name>.rs` file with one test) that starts the
//! server and calls `redlock_runtime::set_default_client(redis.client().await?)` first.
//!
//! # RedLock
//! [`RedlockMasters::start`] starts several servers as the masters of a new RedLock
//! deployment, vouched for ([`LockClient::vouch_for_blank_masters`]): their clients
//! lock at once, where masters redlock never used would first sit out `max_lease`
//! (60 s by default) answering [`LockError::NoQuorum`].
//!
//! ```rust,test_harness
//! use std::time::Duration;
//! use redlock_runtime::test_util::RedlockMasters;
//!
//! #[tokio::test]
//! async fn a_report_runs_once_across_three_masters() {
//!     let masters = RedlockMasters::start(3).await.expect("start 3 masters");
//!     let locks = masters.client().await.expect("connect");
//!     let guard = locks
//!         .lock("report:daily")
//!         .lease(Duration::from_secs(5))
//!         .acquire()
//!         .await
//!         .expect("the masters vote at once");
//!     // Another instance, with the `REDLOCK_URL` your service would read:
//!     let other = redlock_runtime::LockClient::builder_from_spec(&masters.spec())
//!         .connect()
//!         .await
//!         .unwrap();
//!     assert!(other.lock("report:daily").acquire().await.is_err());
//!     guard.release().await.unwrap();
//! }
//! ```
//!
//! # When it cannot start
//! [`RedisServer::start`] returns an [`io::Error`]: [`io::ErrorKind::NotFound`] when
//! there is no `redis-server` (the message says how to install it),
//! [`io::ErrorKind::TimedOut`] when it did not answer within 10 s, and otherwise what
//! the server wrote as it exited. A port taken between choosing it and the server's
//! bind is retried on another port. A test process killed outright (`SIGKILL`) cannot
//! run the handle's drop: its server then stays until killed.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{LockClient, LockError};

/// How long a freshly spawned server gets to answer.
const STARTUP_LIMIT: Duration = Duration::from_secs(10);

/// Ports tried when another process takes the chosen one before the server binds it.
const PORT_ATTEMPTS: usize = 5;

/// The environment variable naming the `redis-server` binary to run.
const BINARY_VAR: &str = "REDIS_SERVER";

/// How to get the binary, in the one line of the "not found" error.
const INSTALL: &str = "install it, e.g. `sudo apt-get install redis-server` (Debian/Ubuntu) \
                       or `brew install redis` (macOS)";

/// The server's log file, in its directory: what it says when it exits at start.
const LOG_FILE: &str = "redis.log";

/// A throwaway `redis-server` child process on a free 127.0.0.1 port, in its own temp
/// dir, no persistence; killed (and waited for) on drop, including when the test
/// panics. See the [module docs](self).
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    // Only dropped: after `Drop::drop` has killed the server, so the directory goes last.
    _dir: TempDir,
}

impl RedisServer {
    /// Starts a server and returns once it answers, within about 10 s.
    ///
    /// Blocks the calling thread while it waits (a few milliseconds as a rule), like
    /// the rest of a test's setup. The binary is `redis-server` on `PATH`, or the path
    /// in the environment variable `REDIS_SERVER` when it is set. It listens on
    /// 127.0.0.1 only, saves nothing (`--save ""`, `--appendonly no`) and runs in a new
    /// temporary directory. Errors: see the [module docs](self#when-it-cannot-start).
    pub fn start() -> io::Result<RedisServer> {
        let binary = Binary::find();
        let dir = TempDir::create()?;
        let mut port_taken = io::Error::new(io::ErrorKind::AddrInUse, "no port tried");
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            match spawn(&binary, port, dir.path()) {
                Ok(child) => {
                    return Ok(RedisServer {
                        child,
                        port,
                        _dir: dir,
                    });
                }
                Err(Failed::PortTaken(error)) => port_taken = error,
                Err(Failed::Other(error)) => return Err(error),
            }
        }
        Err(port_taken)
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A [`LockClient`] with default settings, connected to this server. Call it again
    /// for another client: one per instance of your service that a test plays.
    pub async fn client(&self) -> Result<LockClient, LockError> {
        LockClient::connect(&self.url()).await
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL cannot be ignored or delayed by the server, so the wait that reaps
        // it returns promptly: the drop does not hang, even in a panicking test.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Throwaway RedLock masters: [`RedisServer`]s started as the masters of a new
/// deployment and vouched for, so that their clients lock at once (see the
/// [module docs](self#redlock)). Dropping it kills them all.
#[derive(Debug)]
pub struct RedlockMasters {
    servers: Vec<RedisServer>,
}

impl RedlockMasters {
    /// Starts `masters` servers (as [`RedisServer::start`] does, blocking the calling
    /// thread while they start) and vouches for them with a client of their own
    /// ([`LockClient::vouch_for_blank_masters`]). Use an odd number: 3 or 5. One
    /// master is one server, which never sits a quarantine out: nothing to vouch for.
    ///
    /// Errors: those of [`RedisServer::start`]; [`io::ErrorKind::InvalidInput`] for 0
    /// masters; and a vouch that failed, as an error of kind `Other` with its message.
    pub async fn start(masters: usize) -> io::Result<RedlockMasters> {
        if masters == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "RedlockMasters::start(0): a deployment needs at least one master (3 or 5 for RedLock)",
            ));
        }
        let servers = (0..masters)
            .map(|_| RedisServer::start())
            .collect::<io::Result<Vec<_>>>()?;
        let started = RedlockMasters { servers };
        if masters > 1 {
            let vouched = async {
                let client = started.client().await?;
                client.vouch_for_blank_masters().await?;
                client.shutdown().await
            };
            vouched
                .await
                .map_err(|error: LockError| io::Error::other(error.to_string()))?;
        }
        Ok(started)
    }

    /// Each master's URL, in order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The masters as one `REDLOCK_URL` (comma-separated), for
    /// [`LockClient::from_env`] or [`LockClient::builder_from_spec`].
    pub fn spec(&self) -> String {
        self.urls().join(",")
    }

    /// The servers, in order: their ports, their URLs.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The servers, to stop some: a dropped [`RedisServer`] is killed. A master
    /// started again in its place is a new process, which sits out `max_lease` as
    /// after any restart.
    pub fn into_servers(self) -> Vec<RedisServer> {
        self.servers
    }

    /// A RedLock [`LockClient`] over every master, with default settings. Call it
    /// again for another client: one per instance of your service that a test plays.
    pub async fn client(&self) -> Result<LockClient, LockError> {
        LockClient::redlock(self.urls()).await
    }
}

/// The program to run, and where its name came from (for the "not found" error).
struct Binary {
    program: PathBuf,
    from_var: bool,
}

impl Binary {
    fn find() -> Binary {
        match std::env::var_os(BINARY_VAR) {
            Some(path) if !path.is_empty() => {
                let path = PathBuf::from(path);
                // The server runs in its own directory: a relative path (`bin/redis-server`)
                // is made absolute from ours first. A bare name is looked up on PATH.
                let program = match path.components().count() {
                    1 => path,
                    _ => std::path::absolute(&path).unwrap_or(path),
                };
                Binary {
                    program,
                    from_var: true,
                }
            }
            // Looked up on PATH by the spawn.
            _ => Binary {
                program: PathBuf::from("redis-server"),
                from_var: false,
            },
        }
    }

    /// The one-line error for a binary that is not there.
    fn not_found(&self) -> io::Error {
        let message = if self.from_var {
            format!(
                "redis-server not found at `{}` (REDIS_SERVER): {INSTALL}, \
                 or set REDIS_SERVER to its path",
                self.program.display()
            )
        } else {
            format!(
                "redis-server not found on PATH (or REDIS_SERVER): {INSTALL}, \
                 or set REDIS_SERVER to its path"
            )
        };
        io::Error::new(io::ErrorKind::NotFound, message)
    }
}

/// Why one start failed.
enum Failed {
    /// The port was taken before the server bound it: worth another port.
    PortTaken(io::Error),
    /// Anything else: another port would not help.
    Other(io::Error),
}

/// Spawns the server on `port` in `dir` and waits until it answers.
fn spawn(binary: &Binary, port: u16, dir: &Path) -> Result<Child, Failed> {
    let mut child = Command::new(&binary.program)
        // Relative to its directory, so that no path needs quoting in its arguments.
        .current_dir(dir)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--dir", ".", "--logfile", LOG_FILE, "--loglevel", "warning"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Where it complains about its arguments, before it opens its log.
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| {
            Failed::Other(match error.kind() {
                io::ErrorKind::NotFound => binary.not_found(),
                kind => io::Error::new(
                    kind,
                    format!("cannot run `{}`: {error}", binary.program.display()),
                ),
            })
        })?;
    // Redis reports its directory as an absolute path with the links resolved.
    let ours = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let deadline = Instant::now() + STARTUP_LIMIT;
    loop {
        match dir_of_server(port) {
            Some(theirs) if theirs == ours => return Ok(child),
            // Another server took the port first: ours exits when its bind fails.
            Some(theirs) => {
                kill(&mut child);
                return Err(Failed::PortTaken(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "port {port} was taken by another redis-server (its dir is {}, not {})",
                        theirs.display(),
                        ours.display()
                    ),
                )));
            }
            None => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            let said = what_it_said(&mut child, dir);
            let error =
                io::Error::other(format!("redis-server exited at start ({status}): {said}"));
            return Err(if said.contains("in use") {
                Failed::PortTaken(error)
            } else {
                Failed::Other(error)
            });
        }
        if Instant::now() >= deadline {
            kill(&mut child);
            return Err(Failed::Other(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "redis-server did not answer on 127.0.0.1:{port} within {} s: {}",
                    STARTUP_LIMIT.as_secs(),
                    what_it_said(&mut child, dir)
                ),
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Its stderr and the end of its log, on one line.
fn what_it_said(child: &mut Child, dir: &Path) -> String {
    let mut said = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut said);
    }
    if let Ok(log) = std::fs::read_to_string(dir.join(LOG_FILE)) {
        let lines: Vec<&str> = log.lines().collect();
        said.push(' ');
        said.push_str(&lines[lines.len().saturating_sub(5)..].join(" | "));
    }
    let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
    if said.is_empty() {
        "it said nothing".to_owned()
    } else {
        said
    }
}

/// The directory of the Redis answering on 127.0.0.1:`port` (`CONFIG GET dir`), if one
/// answers: it tells our server from another that took the port first (a process id
/// would not, when `REDIS_SERVER` is a script that starts the server as its child).
fn dir_of_server(port: u16) -> Option<PathBuf> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(200)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream.write_all(b"CONFIG GET dir\r\n").ok()?;
    // `*2`, `$3`, `dir`, `$<length>`, the path; an error (`-LOADING …`) while not ready.
    let mut lines = BufReader::new(stream).lines();
    let first = lines.next()?.ok()?;
    if !first.starts_with('*') {
        return None;
    }
    lines.nth(3)?.ok().map(PathBuf::from)
}

/// A loopback port that was free a moment ago; never Redis's default 6379, so that a
/// test cannot touch a developer's own Redis.
fn free_port() -> io::Result<u16> {
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        if port != 6379 {
            return Ok(port);
        }
    }
}

/// A new directory under the system's temporary directory, removed on drop (std has
/// no such type; this one keeps the feature free of dependencies).
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn create() -> io::Result<TempDir> {
        static CREATED: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        loop {
            let path = std::env::temp_dir().join(format!(
                "redlock-test-redis-{}-{}-{nanos}",
                std::process::id(),
                CREATED.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                // Left by a process that had our pid before: take the next name.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) => {
                    return Err(io::Error::new(
                        error.kind(),
                        format!(
                            "create a directory for redis-server in {}: {error}",
                            path.display()
                        ),
                    ));
                }
            }
        }
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts a server on `port`, which something else holds, and says how it failed.
    fn start_on_taken(port: u16) -> io::Error {
        let dir = TempDir::create().unwrap();
        match spawn(&Binary::find(), port, dir.path()) {
            Err(Failed::PortTaken(error)) => error,
            Err(Failed::Other(error)) => panic!("not told apart as a taken port: {error}"),
            Ok(mut child) => {
                kill(&mut child);
                panic!("started on a taken port");
            }
        }
    }

    #[test]
    fn a_port_another_program_took_is_retried_on_another() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let error = start_on_taken(listener.local_addr().unwrap().port());
        assert!(error.to_string().contains("in use"), "{error}");
    }

    #[test]
    fn a_port_another_redis_took_is_retried_on_another() {
        // That server answers on the port: its directory tells it from ours.
        let other = RedisServer::start().unwrap();
        let error = start_on_taken(other.port());
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse, "{error}");
        assert!(
            error.to_string().contains("another redis-server"),
            "{error}"
        );
    }
}
