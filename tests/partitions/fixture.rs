//! What every scenario needs: a network, a history directory, a fenced store that is
//! never cut off, and ways to wait for the history and to look into Redis.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::child::{ClientSpec, Role};
use crate::history::{self, History};
use crate::net::{Net, NetProcess};

/// The host of the fenced store (the "database" the locks protect): never cut off.
pub const STORE: &str = "store";

/// A network with a store, and the test's history directory.
#[derive(Debug)]
pub struct Fixture {
    // Fields drop in order: processes first, then the network (which kills whatever
    // is left in it), then the directory.
    pub servers: Vec<NetProcess>,
    pub net: Net,
    pub dir: tempfile::TempDir,
}

impl Fixture {
    /// A network of `hosts` plus the store; `None` when partition tests cannot run here.
    pub fn new(hosts: &[&str]) -> Option<Fixture> {
        let mut all = vec![STORE];
        all.extend_from_slice(hosts);
        let net = Net::new(&all)?;
        let dir = tempfile::Builder::new()
            .prefix("redlock-partitions-")
            .tempdir()
            .expect("a history directory");
        let mut fixture = Fixture {
            servers: Vec::new(),
            net,
            dir,
        };
        fixture.start_redis(STORE, &[]);
        Some(fixture)
    }

    /// Starts a redis-server on `host` (port 7000), with a directory of its own.
    pub fn start_redis(&mut self, host: &str, extra: &[&str]) {
        let dir = self.dir.path().join(format!("redis-{host}"));
        std::fs::create_dir_all(&dir).expect("a server directory");
        let server = self.net.redis_server(host, &dir, extra);
        self.servers.push(server);
    }

    pub fn store_url(&self) -> String {
        self.net.url(STORE)
    }

    pub fn history(&self) -> History {
        self.assert_no_client_panicked();
        history::load(self.dir.path())
    }

    /// Fails on a panic in any client process (see `child::client_process`), but one:
    /// the redis crate's debug assertion that `SCRIPT LOAD` answered with the script's
    /// own SHA, which fired once in a background release of the Cluster scenario (a
    /// reply given to another request inside the cluster client during the failover;
    /// not explained yet, see RELIABILITY.md). That one is reported, once.
    fn assert_no_client_panicked(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else {
            return;
        };
        for path in entries.flatten().map(|entry| entry.path()) {
            let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
                continue;
            };
            if !name.starts_with("panic-") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let upstream = text.contains("/redis-1.") && text.contains("src/script.rs");
            assert!(upstream, "a client process panicked: {text}");
            eprintln!("a client process hit the redis crate's debug assertion: {text}");
            let _ = std::fs::rename(&path, path.with_file_name(format!("seen-{name}")));
        }
    }

    /// Waits (up to `limit`) until the history satisfies `ready`; panics naming `what`.
    pub fn wait_for_history(&self, what: &str, limit: Duration, ready: impl Fn(&History) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(&self.history()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Tells the holder process `pid` to go on to `step` (see `child::Role::Holder`).
    pub fn tell(&self, pid: u32, step: &str) {
        std::fs::write(self.dir.path().join(format!("{step}-{pid}")), b"")
            .expect("write a step file");
    }

    /// A new client process on `host` takes the key once (within `wait` per attempt,
    /// attempting for the spec's `run_for`), writes and releases: after healing, the
    /// key can be taken again from there. Panics unless it did within `limit`.
    pub fn take_from(&self, spec: &ClientSpec, host: &str, wait: Duration, limit: Duration) {
        let mut probe = spec.clone();
        probe.role = Role::Taker;
        probe.wait = wait;
        probe
            .spawn(&self.net, host)
            .join(&format!("probe on {host}"), limit);
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The keys on `host`'s server.
    pub fn keys(&self, host: &str) -> BTreeSet<String> {
        self.net
            .cli(host, 7000, &["--scan"])
            .lines()
            .map(str::to_owned)
            .filter(|key| !key.is_empty())
            .collect()
    }

    /// Waits (up to `limit`) until `host`'s server holds no key but `allowed` (an entry
    /// ending in `*`: any key starting with the rest); panics listing what is left.
    pub fn assert_only_keys(&self, host: &str, allowed: &[&str], limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let left: Vec<String> = self
                .keys(host)
                .into_iter()
                .filter(|key| {
                    !allowed
                        .iter()
                        .any(|allowed| match allowed.strip_suffix('*') {
                            Some(prefix) => key.starts_with(prefix),
                            None => key == allowed,
                        })
                })
                .collect();
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "left behind on {host} {limit:?} after the run: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
