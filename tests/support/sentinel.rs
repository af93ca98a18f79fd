//! A throwaway replicated primary watched by Redis Sentinels: one primary, one replica,
//! three sentinels, all on free loopback ports, killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{RedisServer, free_port, ping, redis_server_binary};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "mymaster";

/// A primary, its replica and the sentinels that watch them.
#[derive(Debug)]
pub struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
}

/// One `redis-server --sentinel` process.
#[derive(Debug)]
pub struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(primary_port: u16) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("redlock-sentinel-")
            .tempdir()
            .expect("create a temporary directory for a sentinel");
        for _ in 0..20 {
            let port = free_port();
            let config = dir.path().join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\n\
                     sentinel failover-timeout {SERVICE} 3000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir = dir.path().display()
                ),
            )
            .expect("write sentinel.conf");
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
                if ping(port) {
                    return Sentinel {
                        child,
                        port,
                        _dir: dir,
                    };
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

    /// Runs `redis-cli` against this sentinel.
    pub fn cli(&self, args: &[&str]) -> String {
        crate::redis_cli(self.port, args)
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
        let primary = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(primary.port())).collect();
        let setup = SentinelSetup {
            primary,
            replica,
            sentinels,
        };
        setup.wait_until(
            Duration::from_secs(30),
            "the replica to sync and the sentinels to meet",
            |setup| {
                setup
                    .replica
                    .cli(&["INFO", "replication"])
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
                    && setup.replica.cli(&["ROLE"]).starts_with("master")
            },
        );
    }

    fn wait_until(&self, limit: Duration, what: &str, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
