//! A throwaway replicated primary watched by Redis Sentinels: one primary, one replica,
//! three sentinels, all on free loopback ports, killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{RedisServer, free_port, redis_server_binary};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "mymaster";

/// A primary, its replica and the sentinels that watch them.
#[derive(Debug)]
pub struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
    /// The password of every process, with [`SentinelSetup::start_with_password`].
    password: Option<String>,
}

/// One `redis-server --sentinel` process (of the [`redis_server_binary`]: `valkey-server
/// --sentinel` in the Valkey pass).
#[derive(Debug)]
pub struct Sentinel {
    child: Child,
    port: u16,
    password: Option<String>,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// `password`: the sentinel's own `requirepass`, the one it gives the other
    /// sentinels (`sentinel-pass`) and the one it gives the data nodes (`auth-pass`).
    fn start(primary_port: u16, password: Option<&str>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("redlock-sentinel-")
            .tempdir()
            .expect("create a temporary directory for a sentinel");
        for _ in 0..20 {
            let port = free_port();
            let config = dir.path().join("sentinel.conf");
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 3000\n\
                 sentinel parallel-syncs {SERVICE} 1\n",
                dir = dir.path().display()
            );
            if let Some(password) = password {
                text.push_str(&format!(
                    "requirepass {password}\nsentinel sentinel-pass {password}\n\
                     sentinel auth-pass {SERVICE} {password}\n"
                ));
            }
            std::fs::write(&config, text).expect("write sentinel.conf");
            let mut child = Command::new(redis_server_binary().expect("redis-server"))
                .arg(&config)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn a sentinel");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                // The one answering must be ours: another test's server may have taken
                // the port first (ours then exits, and the next port is tried).
                match crate::pid_on_port(port, password) {
                    Some(pid) if pid == child.id() => {
                        return Sentinel {
                            child,
                            port,
                            password: password.map(str::to_owned),
                            _dir: dir,
                        };
                    }
                    Some(_) => break,
                    None => {}
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start a sentinel");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `redis-cli` against this sentinel (with its password, if it has one).
    pub fn cli(&self, args: &[&str]) -> String {
        crate::redis_cli(self.port, &with_password(self.password.as_deref(), args))
    }

    /// The port of the primary this sentinel currently names.
    pub fn primary_port(&self) -> Option<u16> {
        self.cli(&["SENTINEL", "get-master-addr-by-name", SERVICE])
            .lines()
            .nth(1)
            .and_then(|port| port.trim().parse().ok())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SentinelSetup {
    /// Starts everything and waits until the sentinels know the replica and each other.
    pub fn start() -> Self {
        Self::start_inner(None)
    }

    /// Like [`SentinelSetup::start`], with `password` everywhere: the primary's and the
    /// replica's `requirepass` and `masterauth`, and the sentinels' own `requirepass`,
    /// `sentinel-pass` and `auth-pass`. The servers' own [`RedisServer::cli`] does not
    /// know it: use [`SentinelSetup::server_cli`] (the sentinels' `cli` knows it).
    pub fn start_with_password(password: &str) -> Self {
        Self::start_inner(Some(password))
    }

    fn start_inner(password: Option<&str>) -> Self {
        let primary = RedisServer::start();
        let primary_port = primary.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", primary_port.as_str()];
        if let Some(password) = password {
            // Set after start (the kit checks a new server with a plain PING), and on the
            // primary before the replica connects: a replica's AUTH to a primary without
            // a password fails. (And the replica syncs at once, not after Redis 7's 5 s.)
            primary.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
            primary.cli(&["CONFIG", "SET", "requirepass", password]);
            // For when it is a replica, after a failover.
            redis_cli_with(
                &primary,
                Some(password),
                &["CONFIG", "SET", "masterauth", password],
            );
            replica_args.extend(["--masterauth", password]);
        }
        let replica = RedisServer::start_with(&replica_args);
        if let Some(password) = password {
            replica.cli(&["CONFIG", "SET", "requirepass", password]);
        }
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|_| Sentinel::start(primary.port(), password))
            .collect();
        let setup = SentinelSetup {
            primary,
            replica,
            sentinels,
            password: password.map(str::to_owned),
        };
        setup.wait_until(
            Duration::from_secs(30),
            "the replica to sync and the sentinels to meet",
            |setup| {
                setup
                    .server_cli(&setup.replica, &["INFO", "replication"])
                    .contains("master_link_status:up")
                    && setup.sentinels.iter().all(|sentinel| {
                        let info = sentinel.cli(&["INFO", "sentinel"]);
                        info.contains("slaves=1") && info.contains("sentinels=3")
                    })
            },
        );
        setup
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// Kills the primary and waits until the sentinels have promoted the replica.
    pub fn fail_over(&mut self) {
        self.primary.kill();
        let replica = self.replica.port();
        self.wait_until(
            Duration::from_secs(30),
            "the sentinels to promote the replica",
            |setup| {
                setup
                    .sentinels
                    .iter()
                    .all(|sentinel| sentinel.primary_port() == Some(replica))
                    && setup
                        .server_cli(&setup.replica, &["ROLE"])
                        .starts_with("master")
            },
        );
    }

    /// Runs `redis-cli` against `server` (the primary or the replica), with the setup's
    /// password if it has one.
    pub fn server_cli(&self, server: &RedisServer, args: &[&str]) -> String {
        redis_cli_with(server, self.password.as_deref(), args)
    }

    fn wait_until(&self, limit: Duration, what: &str, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `redis-cli` against `server`, authenticated with `password` if there is one.
fn redis_cli_with(server: &RedisServer, password: Option<&str>, args: &[&str]) -> String {
    server.cli(&with_password(password, args))
}

/// `args`, preceded by `redis-cli`'s options to authenticate with `password`, if any.
fn with_password<'a>(password: Option<&'a str>, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = Vec::with_capacity(args.len() + 3);
    if let Some(password) = password {
        all.extend(["-a", password, "--no-auth-warning"]);
    }
    all.extend_from_slice(args);
    all
}
