//! The test kit: throwaway `redis-server` processes on free loopback ports.
//!
//! Shared by the integration tests, the examples and the benchmarks. Every server is
//! started with no persistence in its own temporary directory, bound to 127.0.0.1 only,
//! and killed when its handle is dropped, including when a test panics.

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

    /// Starts the server again, empty, on the same port (a restart without persistence).
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
    /// `CLIENT LIST` line (e.g. `|line| line.contains(" sub=1 ")`).
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
                return Ok(child);
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

/// Sends signal `name` (`"STOP"`, `"CONT"`, `"KILL"`…) to process `pid` with `kill(1)`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Runs `redis-cli` against 127.0.0.1:`port` and returns its trimmed output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
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

/// Where `redis-server` is, or an error that says how to install it.
pub fn redis_server_binary() -> Result<PathBuf, String> {
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
    {
        let candidate = dir.join("redis-server");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err("redis-server is not installed: run `sudo apt-get install -y redis-server`".into())
}

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
