//! The test kit: throwaway `redis-server` processes on free loopback ports.
//!
//! Shared by the integration tests, the examples and the benchmarks. Every server is
//! started in its own temporary directory, bound to 127.0.0.1 only, and killed when its
//! handle is dropped, including when a test panics. It has no persistence unless it was
//! started with [`RedisServer::start_persistent`].
//!
//! The server is `redis-server`, or the binary `REDIS_SERVER` names; the kit's own
//! commands go through `redis-cli`, or the one `REDIS_CLI` names. `scripts/test.sh`
//! sets both to Valkey's for its Valkey pass ([`redis_server_binary`],
//! [`redis_cli_binary`]); a test that needs what a server may lack asks first
//! ([`skip_without_tls`]).

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a freshly spawned server gets to accept connections.
const STARTUP_LIMIT: Duration = Duration::from_secs(10);

/// A `redis-server` child process on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free loopback port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--cluster-enabled", "yes"]`).
    pub fn start_with(extra_args: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("redlock-redis-")
            .tempdir()
            .expect("create a temporary directory for redis-server");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn_on_free_port();
        server
    }

    /// Starts a server that persists to its own directory, as a stock installation
    /// does: `persistence` are the `redis-server` arguments that turn it on, e.g.
    /// `["--save", "3600 1 300 100 60 10000"]` (RDB snapshots, Redis's default) or
    /// `["--appendonly", "yes", "--appendfsync", "everysec"]`. They come after the kit's
    /// no-persistence defaults, so they override them.
    ///
    /// [`RedisServer::crash_and_restart`] then brings it back with what it had persisted.
    pub fn start_persistent(persistence: &[&str]) -> Self {
        Self::start_with(persistence)
    }

    /// Starts a replica of `primary` (`--replicaof`), with `extra_args` as well.
    /// Use [`RedisServer::wait_until_caught_up_with`] before relying on what it holds.
    ///
    /// Sets `repl-diskless-sync-delay 0` on `primary` (and the replica, should it be
    /// promoted): Redis 7 otherwise waits 5 s before a full sync, for more replicas.
    pub fn start_replica_of(primary: &RedisServer, extra_args: &[&str]) -> Self {
        primary.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        let port = primary.port().to_string();
        let mut args = vec![
            "--replicaof",
            "127.0.0.1",
            port.as_str(),
            "--repl-diskless-sync-delay",
            "0",
        ];
        args.extend_from_slice(extra_args);
        Self::start_with(&args)
    }

    /// Waits until this replica's link to `primary` is up and it has applied
    /// everything `primary` had written when the call began (replication offsets).
    pub fn wait_until_caught_up_with(&self, primary: &RedisServer, limit: Duration) {
        let deadline = Instant::now() + limit;
        let target: u64 = primary
            .info_field("replication", "master_repl_offset")
            .and_then(|offset| offset.parse().ok())
            .unwrap_or(0);
        loop {
            let link_up = self
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("up");
            let applied: u64 = self
                .info_field("replication", "slave_repl_offset")
                .and_then(|offset| offset.parse().ok())
                .unwrap_or(0);
            if link_up && applied >= target {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica on port {} did not catch up with {} (link up: {link_up}, \
                 offset {applied} of {target})",
                self.port,
                primary.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One field of `INFO section` (e.g. `("replication", "role")`), if present.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        self.cli(&["INFO", section]).lines().find_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            (name == field).then(|| value.to_owned())
        })
    }

    /// Starts a server to be a RedLock master of a deployment known to hold no lock:
    /// see [`RedisServer::vouch_for_its_data`].
    pub fn start_redlock_master() -> Self {
        let server = Self::start();
        server.vouch_for_its_data();
        server
    }

    /// Writes the RedLock restart marker (`redlock:boot`) naming this server's running
    /// process with no quarantine, as a deployment that has served redlock for longer
    /// than `max_lease` has it. Without it a master redlock never used sits out
    /// `max_lease` first (a first deployment cannot be told from one that forgot every
    /// lock); tests whose subject is something else start past that.
    pub fn vouch_for_its_data(&self) {
        let run_id = self
            .info_field("server", "run_id")
            .expect("INFO server names the run_id");
        let marker = format!("{run_id}:0:vouched");
        assert_eq!(self.cli(&["SET", "redlock:boot", &marker]).trim(), "OK");
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's process id (for SIGSTOP/SIGCONT fault tests).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it; its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server with SIGKILL — no shutdown, so no final snapshot or AOF flush —
    /// and starts it again on the same port, directory and arguments: it comes back with
    /// what it had persisted by then (its last RDB snapshot, its AOF), as after `kill -9`.
    /// Returns once it has loaded that and answers PING.
    pub fn crash_and_restart(&mut self) {
        self.restart();
    }

    /// A copy of what the server's directory holds now (RDB snapshot, AOF files).
    ///
    /// `kill -9` loses nothing that Redis has written, even with `appendfsync everysec`:
    /// the kernel still holds it. What an OS crash or power cut loses is what was not
    /// yet fsynced; a test simulates that by copying the directory at the moment it
    /// pretends was the last fsync and handing the copy to
    /// [`RedisServer::crash_and_restart_from`]. Take it between replies (Redis writes
    /// the AOF before it replies), not in the middle of a write.
    pub fn copy_of_disk(&self) -> tempfile::TempDir {
        let copy = tempfile::Builder::new()
            .prefix("redlock-redis-disk-")
            .tempdir()
            .expect("create a temporary directory for the copy");
        copy_dir(self.dir.path(), copy.path()).expect("copy the server's directory");
        copy
    }

    /// Like [`RedisServer::crash_and_restart`], but the server's directory is first put
    /// back to `disk` (from [`RedisServer::copy_of_disk`]): a crash that lost every
    /// write since that copy.
    pub fn crash_and_restart_from(&mut self, disk: &Path) {
        self.kill();
        for entry in std::fs::read_dir(self.dir.path()).expect("list the server's directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
            .expect("clear the server's directory");
        }
        copy_dir(disk, self.dir.path()).expect("put the copy back");
        self.restart();
    }

    /// Starts the server again on the same port, directory and arguments. Without
    /// persistence (the default) it comes back empty; see
    /// [`RedisServer::crash_and_restart`].
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + STARTUP_LIMIT;
        loop {
            match self.try_spawn(self.port) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(err) if Instant::now() < deadline => {
                    let _ = err;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(err) => panic!("redis-server did not restart on port {}: {err}", self.port),
            }
        }
    }

    /// Sends SIGSTOP: the server keeps its sockets but answers nothing.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Sends SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        if let Some(pid) = self.pid() {
            signal(pid, name);
        }
    }

    /// Closes, server-side (`CLIENT KILL`), every client connection that matches
    /// `filter` (e.g. `["TYPE", "normal"]`), except `redis-cli`'s own; returns how many.
    pub fn kill_clients(&self, filter: &[&str]) -> usize {
        let mut args = vec!["CLIENT", "KILL"];
        args.extend_from_slice(filter);
        self.cli(&args).parse().unwrap_or(0)
    }

    /// The ids of the client connections for which `matches` holds of their
    /// `CLIENT LIST` line (e.g. `|line| line.contains(" sub=2 ")`).
    pub fn client_ids(&self, matches: impl Fn(&str) -> bool) -> Vec<u64> {
        self.cli(&["CLIENT", "LIST"])
            .lines()
            .filter(|line| matches(line) && !line.contains("cmd=client|list"))
            .filter_map(|line| line.strip_prefix("id=")?.split(' ').next()?.parse().ok())
            .collect()
    }

    /// Runs a command with `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    fn spawn_on_free_port(&mut self) {
        // Another process may take the port between our probe and the server's bind;
        // a few attempts make that race harmless.
        let mut last_error = String::new();
        for _ in 0..20 {
            let port = free_port();
            match self.try_spawn(port) {
                Ok(child) => {
                    self.port = port;
                    self.child = Some(child);
                    return;
                }
                Err(err) => last_error = err,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    fn try_spawn(&self, port: u16) -> Result<Child, String> {
        let binary = redis_server_binary()?;
        let mut child = Command::new(binary)
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("spawn redis-server: {err}"))?;
        let deadline = Instant::now() + STARTUP_LIMIT;
        loop {
            if ping(port) {
                // Another test's server may have taken the port between `free_port` and
                // our bind (ours then exits): the one that answers must be ours, or
                // two tests would share a server.
                match pid_on_port(port, None) {
                    Some(pid) if pid == child.id() => return Ok(child),
                    Some(pid) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(format!("port {port} was taken by process {pid}"));
                    }
                    None => {}
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr);
                }
                return Err(format!("redis-server exited ({status}): {stderr}"));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("redis-server did not answer on port {port}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's working directory (its config and logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Copies the files and folders in `from` into `to` (which exists).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Sends signal `name` (`"STOP"`, `"CONT"`, `"KILL"`…) to process `pid` with `kill(1)`.
/// A `STOP` returns once every thread of the process has stopped: the kernel stops a
/// process's threads only when one of them has taken the signal, and on a loaded machine
/// the others ran on for a millisecond or two meanwhile — long enough to read and confirm
/// a grant that the test meant the stopped process never to see (seen in the suite).
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
    if name == "STOP" {
        let limit = Instant::now() + Duration::from_secs(10);
        while !every_thread_stopped(pid) {
            assert!(
                Instant::now() < limit,
                "process {pid} did not stop within 10 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Whether every thread of `pid` is stopped (state `T` or `t` in its `stat`); false if
/// one could not be read.
fn every_thread_stopped(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.flatten().all(|thread| {
        std::fs::read_to_string(thread.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses and may
            // itself hold spaces or parentheses.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state == "T" || state == "t")
        })
    })
}

/// Runs `redis-cli` (or the [`redis_cli_binary`] chosen with `REDIS_CLI`) against
/// 127.0.0.1:`port` and returns its trimmed output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = Command::new(redis_cli_binary())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A loopback port that was free a moment ago; never 6379.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        // Cluster mode also binds port + 10000.
        if port != 6379 && port < 55000 {
            return port;
        }
    }
}

/// True when a server answers PING on 127.0.0.1:`port`.
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    use std::io::Write;
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

/// The process id of the server that answers on 127.0.0.1:`port` (`INFO server`),
/// after `AUTH password` if one is given; `None` if nothing answers that.
pub fn pid_on_port(port: u16, password: Option<&str>) -> Option<u32> {
    use std::io::Write;
    let mut stream = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    if let Some(password) = password {
        stream
            .write_all(format!("AUTH {password}\r\n").as_bytes())
            .ok()?;
        reader.read_line(&mut line).ok()?;
        if !line.starts_with("+OK") {
            return None;
        }
        line.clear();
    }
    stream.write_all(b"INFO server\r\n").ok()?;
    reader.read_line(&mut line).ok()?;
    let length: usize = line.strip_prefix('$')?.trim().parse().ok()?;
    let mut info = vec![0; length];
    reader.read_exact(&mut info).ok()?;
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))?
        .trim()
        .parse()
        .ok()
}

/// The variable that names the server binary to run instead of `redis-server` (a path,
/// or a bare name looked up on `PATH`): `scripts/test.sh` sets it to `valkey-server` for
/// its Valkey pass. `redlock-runtime`'s `test_util` reads the same variable.
pub const SERVER_VAR: &str = "REDIS_SERVER";

/// The variable that names the command-line client to run instead of `redis-cli`; set
/// with [`SERVER_VAR`] so that `--cluster create` comes from the server's own release.
pub const CLI_VAR: &str = "REDIS_CLI";

/// Where the server binary is: the one `REDIS_SERVER` names, else `redis-server` on
/// `PATH` (or in /usr/bin, /usr/sbin); or an error that says how to install it.
pub fn redis_server_binary() -> Result<PathBuf, String> {
    if let Some(chosen) = chosen_binary(SERVER_VAR) {
        return find_binary(&chosen).ok_or_else(|| {
            format!(
                "{SERVER_VAR}={} is not an executable file (nor a name on PATH)",
                chosen.display()
            )
        });
    }
    find_binary(Path::new("redis-server")).ok_or_else(|| {
        "redis-server is not installed: run `sudo apt-get install -y redis-server`".into()
    })
}

/// The command-line client: the one `REDIS_CLI` names, else `redis-cli`.
pub fn redis_cli_binary() -> PathBuf {
    chosen_binary(CLI_VAR).unwrap_or_else(|| PathBuf::from("redis-cli"))
}

/// Whether the server binary was chosen with `REDIS_SERVER` (rather than the default
/// `redis-server`).
pub fn server_chosen() -> bool {
    chosen_binary(SERVER_VAR).is_some()
}

/// The value of variable `var`, if set and not empty; a relative path (one with a `/`)
/// is made absolute from the current directory, since servers run in their own.
fn chosen_binary(var: &str) -> Option<PathBuf> {
    let value = PathBuf::from(std::env::var_os(var).filter(|value| !value.is_empty())?);
    Some(match value.components().count() {
        1 => value,
        _ => std::path::absolute(&value).unwrap_or(value),
    })
}

/// `binary` itself when it is a path to a file, else the first file of that name in a
/// directory of `PATH`, /usr/bin or /usr/sbin.
fn find_binary(binary: &Path) -> Option<PathBuf> {
    if binary.components().count() > 1 {
        return binary.is_file().then(|| binary.to_owned());
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
}

/// Why the server binary cannot serve TLS, or `None` when it can (or when its answer
/// does not tell). Asked once per process: the binary is started with a `--tls-port`
/// and no certificate, which a TLS build refuses for want of a certificate and a build
/// without TLS for want of TLS ("Failed finding TLS support." from Redis 7.2 and
/// Valkey; "Bad directive" from older releases).
pub fn server_lacks_tls() -> Option<String> {
    static ANSWER: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ANSWER
        .get_or_init(|| {
            let binary = redis_server_binary().ok()?;
            let dir = tempfile::Builder::new()
                .prefix("redlock-tls-probe-")
                .tempdir()
                .ok()?;
            let mut child = Command::new(&binary)
                .args(["--port", "0", "--tls-port", &free_port().to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .args(["--loglevel", "warning"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .ok()?;
            let deadline = Instant::now() + STARTUP_LIMIT;
            while child.try_wait().ok()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut said = String::new();
            if let Some(mut out) = child.stdout.take() {
                let _ = out.read_to_string(&mut said);
            }
            if let Some(mut err) = child.stderr.take() {
                let _ = err.read_to_string(&mut said);
            }
            let lacks = said.contains("TLS support")
                || said.contains("connection type tls")
                || (said.contains("Bad directive") && said.contains("tls"));
            let version = Command::new(&binary)
                .arg("--version")
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
                .unwrap_or_default();
            // "Valkey server v=8.1.8 sha=…": the name and the version.
            let version: Vec<&str> = version.split_whitespace().take(3).collect();
            lacks.then(|| {
                format!(
                    "{} ({}) was built without TLS",
                    binary.display(),
                    version.join(" ")
                )
            })
        })
        .clone()
}

/// For a TLS test: `true` when the server chosen with `REDIS_SERVER` was built without
/// TLS (the Valkey build `scripts/test.sh` runs), after saying so in one line per test
/// binary, past the harness's capture; the test then returns. The default
/// `redis-server` must have TLS: without it this panics, so that the suite's main pass
/// never skips TLS quietly.
pub fn skip_without_tls() -> bool {
    let Some(why) = server_lacks_tls() else {
        return false;
    };
    assert!(
        server_chosen(),
        "{why}: the TLS tests need a redis-server built with TLS (Debian's is)"
    );
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "TLS tests skipped: {why}");
    });
    true
}

pub mod build;
pub mod cluster;
pub use cluster::RedisCluster;
pub mod sentinel;
pub use sentinel::SentinelSetup;

/// For the examples: the `REDLOCK_URL` the user set, or else a throwaway server (kept
/// alive by the returned handle). Says which on stdout.
pub fn redlock_url_or_throwaway_server() -> (Option<RedisServer>, String) {
    match std::env::var("REDLOCK_URL") {
        Ok(url) if !url.trim().is_empty() => {
            let masters = url.split(',').filter(|u| !u.trim().is_empty()).count();
            if masters > 1 {
                println!("Redis: REDLOCK_URL, RedLock over {masters} masters ({url})");
            } else {
                println!("Redis: REDLOCK_URL ({url})");
            }
            (None, url)
        }
        _ => {
            let server = RedisServer::start();
            let url = server.url();
            println!("Redis: started a throwaway redis-server on {url} (REDLOCK_URL is unset)");
            (Some(server), url)
        }
    }
}

/// The README's Rust blocks, compiled as doc tests of this package (whose
/// dev-dependencies are what a user's crate would have: `redlock-runtime` with its
/// features, tokio, thiserror, tracing), so that the README cannot drift from the API.
/// Blocks marked `no_run` are compiled only; they need a Redis on the default port.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tests once shared a server: the port `free_port` gave one was taken by the
    /// other's server before its own bound it, and a plain PING was answered by the
    /// other's. The kit now asks who answers.
    #[test]
    fn a_port_taken_by_another_server_is_not_mistaken_for_ours() {
        let first = RedisServer::start();
        let second = RedisServer {
            child: None,
            port: 0,
            dir: tempfile::tempdir().expect("a temporary directory"),
            extra_args: Vec::new(),
        };
        let error = second
            .try_spawn(first.port())
            .expect_err("the port is taken");
        let taker = first.pid().expect("the first server runs");
        assert!(
            error.contains(&format!("taken by process {taker}")),
            "{error}"
        );
        assert_eq!(pid_on_port(first.port(), None), Some(taker));
    }
}
