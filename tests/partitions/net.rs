//! A private network of namespaces for one test: hosts that can be partitioned.
//!
//! Each host is a network namespace of its own, joined by a veth pair to a *router*
//! namespace (host `n` has `10.S.n.2/24`, the router `10.S.n.1` on the other end; the
//! host's only route beyond its link is `10.S.0.0/16` through the router: no default
//! route, so nothing the test runs can reach anything but its own hosts). A router
//! rather than a bridge, because a partition must *drop* packets silently, as a broken
//! network does, and with iproute2 alone that is a policy rule in the router
//! (`ip rule add from A to B blackhole`): forwarded packets matching it vanish, and both
//! ends see only silence (a blackhole *route* on a host would fail its own sends at
//! once, which no real partition does). Cuts are between pairs of hosts, so a client
//! cut off from Redis may keep its link to the store (the database the lock
//! protects): the dangerous case.
//!
//! Names start with `rlp<pid>-<counter>` so that parallel tests never collide; a
//! network whose test process is gone (killed before its `Drop` ran) is removed by the
//! next `Net::new`. `Drop` kills every process still in the namespaces and deletes
//! them, on panic too.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The one line a test prints when it cannot run here.
const SKIPPED: &str = "partition tests skipped: they need root and iproute2 (`ip netns`); \
                       run scripts/test.sh as root";

/// Networks made by this process so far (for unique names).
static NETWORKS: AtomicU32 = AtomicU32::new(0);

/// The `ip` binary, if this process may make namespaces with it; otherwise prints the
/// skip line and returns `None`.
fn ip_binary() -> Option<PathBuf> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let ip = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join("ip"))
        .find(|candidate| candidate.is_file());
    match ip {
        Some(ip) if root => Some(ip),
        _ => {
            // Past the test harness's capture (which takes only `eprintln!`), so that
            // the line shows in a plain `cargo test`; once per run, not per test.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = writeln!(std::io::stderr(), "{SKIPPED}");
            });
            None
        }
    }
}

/// One host of the network.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    /// Its namespace.
    pub ns: String,
    pub addr: Ipv4Addr,
    /// The router's end of its link (in the router's namespace).
    link: String,
}

/// A test's network: a router namespace and one namespace per host.
#[derive(Debug)]
pub struct Net {
    ip: PathBuf,
    prefix: String,
    router: String,
    hosts: Vec<Host>,
    /// Pairs of host indices (smaller first) cut from each other.
    cuts: Mutex<BTreeSet<(usize, usize)>>,
}

impl Net {
    /// A network with one host per name, all connected; `None` (after printing the
    /// skip line) when this machine does not let the test make one.
    pub fn new(names: &[&str]) -> Option<Net> {
        let ip = ip_binary()?;
        remove_orphans(&ip);
        let pid = std::process::id();
        let counter = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("rlp{pid}-{counter}");
        // The second octet only makes the addresses of parallel tests differ in logs
        // (each network is isolated anyway).
        let octet = u8::try_from((pid + counter) % 250).expect("below 250") + 1;
        let mut net = Net {
            ip,
            router: format!("{prefix}-r"),
            prefix,
            hosts: Vec::new(),
            cuts: Mutex::new(BTreeSet::new()),
        };
        // From here on, `Drop` removes whatever was made, should a step fail.
        net.ip(&["netns", "add", &net.router.clone()]);
        let router = net.router.clone();
        net.ip(&["-n", &router, "link", "set", "lo", "up"]);
        net.in_ns(
            &router,
            &["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
        );
        for (index, name) in names.iter().enumerate() {
            let n = u8::try_from(index + 1).expect("fewer than 255 hosts");
            let host = Host {
                name: (*name).to_owned(),
                ns: format!("{}-{n}", net.prefix),
                addr: Ipv4Addr::new(10, octet, n, 2),
                link: format!("h{n}"),
            };
            let gateway = Ipv4Addr::new(10, octet, n, 1);
            net.ip(&["netns", "add", &host.ns]);
            net.hosts.push(host.clone());
            net.ip(&[
                "-n", &router, "link", "add", &host.link, "type", "veth", "peer", "name", "eth0",
                "netns", &host.ns,
            ]);
            net.ip(&[
                "-n",
                &router,
                "addr",
                "add",
                &format!("{gateway}/24"),
                "dev",
                &host.link,
            ]);
            net.ip(&["-n", &router, "link", "set", &host.link, "up"]);
            net.ip(&["-n", &host.ns, "link", "set", "lo", "up"]);
            net.ip(&[
                "-n",
                &host.ns,
                "addr",
                "add",
                &format!("{}/24", host.addr),
                "dev",
                "eth0",
            ]);
            net.ip(&["-n", &host.ns, "link", "set", "eth0", "up"]);
            net.ip(&[
                "-n",
                &host.ns,
                "route",
                "add",
                &format!("10.{octet}.0.0/16"),
                "via",
                &gateway.to_string(),
            ]);
        }
        Some(net)
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .unwrap_or_else(|| panic!("no host named {name}"))
    }

    fn index(&self, name: &str) -> usize {
        self.hosts
            .iter()
            .position(|host| host.name == name)
            .unwrap_or_else(|| panic!("no host named {name}"))
    }

    /// Runs `ip args`, panicking with its error output if it fails.
    fn ip(&self, args: &[&str]) {
        run(Command::new(&self.ip).args(args));
    }

    /// Runs `program args` inside namespace `ns`, waiting for it; panics if it fails.
    fn in_ns(&self, ns: &str, program_and_args: &[&str]) -> String {
        run(Command::new(&self.ip)
            .args(["netns", "exec", ns])
            .args(program_and_args))
    }

    /// A command that runs `program` inside host `name`'s namespace.
    pub fn command(&self, name: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(&self.ip);
        command
            .args(["netns", "exec", &self.host(name).ns])
            .arg(program);
        command
    }

    /// Runs `redis-cli -h <addr> -p <port> args` inside host `name` (the server's own
    /// host is never cut off from itself); its output, trimmed.
    pub fn cli(&self, name: &str, port: u16, args: &[&str]) -> String {
        let host = self.host(name);
        let output = Command::new(&self.ip)
            .args(["netns", "exec", &host.ns, "timeout", "5", "redis-cli"])
            .args(["-h", &host.addr.to_string(), "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Cuts hosts `a` and `b` from each other, both ways: packets between them are
    /// dropped by the router, silently.
    pub fn cut(&self, a: &str, b: &str) {
        let pair = ordered(self.index(a), self.index(b));
        if self.cuts.lock().unwrap().insert(pair) {
            self.rules("add", pair);
        }
    }

    /// Cuts every host of `left` from every host of `right`.
    pub fn split(&self, left: &[&str], right: &[&str]) {
        for a in left {
            for b in right {
                self.cut(a, b);
            }
        }
    }

    /// Undoes [`Net::cut`].
    pub fn mend(&self, a: &str, b: &str) {
        let pair = ordered(self.index(a), self.index(b));
        if self.cuts.lock().unwrap().remove(&pair) {
            self.rules("del", pair);
        }
    }

    /// Heals every partition: all cuts mended.
    pub fn heal(&self) {
        let cuts: Vec<_> = std::mem::take(&mut *self.cuts.lock().unwrap())
            .into_iter()
            .collect();
        for pair in cuts {
            self.rules("del", pair);
        }
    }

    fn rules(&self, verb: &str, (a, b): (usize, usize)) {
        let (a, b) = (
            self.hosts[a].addr.to_string(),
            self.hosts[b].addr.to_string(),
        );
        for (from, to) in [(&a, &b), (&b, &a)] {
            self.ip(&[
                "-n",
                &self.router,
                "rule",
                verb,
                "from",
                from,
                "to",
                to,
                "blackhole",
                "priority",
                "100",
            ]);
        }
    }

    /// Starts `redis-server` on host `name`, bound to its address (port 7000, inside
    /// its own namespace), with `extra` arguments; waits until it answers.
    pub fn redis_server(&self, name: &str, dir: &Path, extra: &[&str]) -> NetProcess {
        let addr = self.host(name).addr.to_string();
        let dir = dir.to_str().expect("a UTF-8 path");
        let mut args = vec!["--bind", &addr, "--port", "7000", "--dir", dir];
        args.extend_from_slice(&["--save", "", "--appendonly", "no"]);
        args.extend_from_slice(&["--protected-mode", "no", "--loglevel", "warning"]);
        args.extend_from_slice(extra);
        let binary = redlock_testkit::redis_server_binary().expect("redis-server");
        self.spawn_answering(name, binary, &args)
    }

    /// Starts `program args` on host `name` (a redis-server or a sentinel listening
    /// on its address, port 7000); waits until it answers `PING`.
    pub fn spawn_answering(
        &self,
        name: &str,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
    ) -> NetProcess {
        let child = self
            .command(name, program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a server");
        let mut process = NetProcess { child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.cli(name, 7000, &["PING"]) != "PONG" {
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!("the server on {name} exited: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the server on {name} did not answer"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        process
    }

    /// `redis://<addr>:7000/` of host `name`.
    pub fn url(&self, name: &str) -> String {
        format!("redis://{}:7000/", self.host(name).addr)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let mut namespaces: Vec<String> = self.hosts.iter().map(|host| host.ns.clone()).collect();
        namespaces.push(self.router.clone());
        remove_namespaces(&self.ip, &namespaces);
    }
}

/// A process started in a namespace; killed on drop (`Net`'s drop kills whatever is
/// left in its namespaces as well).
#[derive(Debug)]
pub struct NetProcess {
    pub child: Child,
}

impl NetProcess {
    /// Waits for it to exit, killing it after `limit`; panics unless it succeeded.
    pub fn join(mut self, what: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll a child") {
                assert!(status.success(), "{what} failed: {status}");
                return;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("{what} hung for {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NetProcess {
    fn drop(&mut self) {
        // `ip netns exec` execs the program, so this is the program itself.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ordered(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

/// Runs a command to completion; panics with its stderr if it fails. Its stdout.
fn run(command: &mut Command) -> String {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Kills every process in the namespaces, then deletes them (errors ignored: this
/// also runs after a failed setup, and on namespaces half made).
fn remove_namespaces(ip: &Path, namespaces: &[String]) {
    for ns in namespaces {
        if let Ok(output) = Command::new(ip).args(["netns", "pids", ns]).output() {
            for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
    }
    for ns in namespaces {
        let _ = Command::new(ip)
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Removes the networks of test processes that are gone (`rlp<pid>-…` with no such pid).
fn remove_orphans(ip: &Path) {
    let Ok(output) = Command::new(ip).args(["netns", "list"]).output() else {
        return;
    };
    let orphans: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| {
            name.strip_prefix("rlp")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .map(str::to_owned)
        .collect();
    if !orphans.is_empty() {
        remove_namespaces(ip, &orphans);
    }
}
