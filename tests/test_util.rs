//! The `test-util` feature itself: `redlock_runtime::test_util::RedisServer`, the
//! throwaway redis-server users test their own code against. It starts and answers on
//! 127.0.0.1 without persistence, its client takes and releases locks, dropping it (also
//! in a panicking test) kills the process and removes its directory, and a missing
//! binary is a `NotFound` error that says how to install one.
//!
//! Where the binary is comes from the environment (`REDIS_SERVER`, `PATH`); setting a
//! variable needs `unsafe` in edition 2024, which the workspace forbids. So the tests
//! that change it run this test binary again as a child process with its environment
//! set, as tests/default_client_unavailable.rs does, and read what the child printed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use redlock_runtime::test_util::{RedisServer, RedlockMasters};
use redlock_testkit::redis_cli;

/// Set in the child process, which starts a server and prints what it got.
const CHILD: &str = "REDLOCK_TEST_UTIL_CHILD";

/// The server's process id and its directory, as it reports them.
fn pid_and_dir(port: u16) -> (u32, String) {
    let info = redis_cli(port, &["INFO", "server"]);
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .unwrap_or_else(|| panic!("no process_id in {info}"))
        .trim()
        .parse()
        .unwrap();
    let dir = config(port, "dir");
    (pid, dir)
}

/// A setting of the server (`CONFIG GET name`).
fn config(port: u16, name: &str) -> String {
    let reply = redis_cli(port, &["CONFIG", "GET", name]);
    let mut lines = reply.lines();
    assert_eq!(lines.next(), Some(name), "{reply}");
    lines.next().unwrap_or("").to_owned()
}

/// True while a process with this id exists (`kill -0`; ours are reaped on drop, so a
/// killed one is gone, not a zombie).
fn alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run kill")
        .success()
}

#[tokio::test]
async fn a_started_server_answers_on_loopback_without_persistence() {
    let redis = RedisServer::start().unwrap();
    assert_ne!(redis.port(), 6379);
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}/", redis.port()));
    assert_eq!(redis_cli(redis.port(), &["PING"]), "PONG");
    assert_eq!(config(redis.port(), "bind"), "127.0.0.1");
    assert_eq!(config(redis.port(), "save"), "");
    assert_eq!(config(redis.port(), "appendonly"), "no");
    let (_, dir) = pid_and_dir(redis.port());
    assert!(Path::new(&dir).is_dir(), "{dir}");
    assert!(format!("{redis:?}").contains(&redis.port().to_string()));

    // Two servers at once: each on its own port and in its own directory.
    let second = RedisServer::start().unwrap();
    assert_ne!(second.port(), redis.port());
    assert_ne!(pid_and_dir(second.port()).1, dir);
}

#[tokio::test]
async fn its_client_takes_and_releases_a_lock() {
    let redis = RedisServer::start().unwrap();
    let locks = redis.client().await.unwrap();
    let guard = locks
        .lock("order:1")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // In this server's Redis, and busy for another client of it.
    assert_eq!(redis_cli(redis.port(), &["EXISTS", "order:1"]), "1");
    let other = redis.client().await.unwrap();
    assert!(other.lock("order:1").acquire().await.unwrap_err().is_busy());
    guard.release().await.unwrap();
    assert_eq!(redis_cli(redis.port(), &["EXISTS", "order:1"]), "0");
    other
        .lock("order:1")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn redlock_masters_start_vouched_for_and_lock_at_once() {
    let started = std::time::Instant::now();
    let masters = RedlockMasters::start(3).await.unwrap();
    assert_eq!(masters.servers().len(), 3);
    assert_eq!(masters.spec(), masters.urls().join(","));
    for server in masters.servers() {
        assert_ne!(server.port(), 6379);
        let run_id = redis_cli(server.port(), &["INFO", "server"])
            .lines()
            .find_map(|line| line.trim().strip_prefix("run_id:").map(str::to_owned))
            .unwrap();
        assert_eq!(
            redis_cli(server.port(), &["GET", "redlock:boot"]),
            format!("{run_id}:0:vouched")
        );
    }
    // Two clients, as two instances of a service: the masters vote at once (their
    // default max_lease is 60 s), and they exclude each other.
    let locks = masters.client().await.unwrap();
    let guard = locks
        .lock("report:daily")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .expect("vouched-for masters vote at once");
    let other = redlock_runtime::LockClient::builder_from_spec(&masters.spec())
        .connect()
        .await
        .unwrap();
    let busy = other.lock("report:daily").acquire().await.unwrap_err();
    assert!(busy.is_busy(), "{busy}");
    guard.release().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));

    // One master is one server: nothing to vouch for, and it locks.
    let one = RedlockMasters::start(1).await.unwrap();
    let guard = one
        .client()
        .await
        .unwrap()
        .lock("k")
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let none = RedlockMasters::start(0).await.unwrap_err();
    assert_eq!(none.kind(), std::io::ErrorKind::InvalidInput, "{none}");

    // Stopping them: a dropped server is killed.
    let servers = masters.into_servers();
    let port = servers[0].port();
    drop(servers);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn dropping_it_kills_the_server_and_removes_its_directory() {
    let redis = RedisServer::start().unwrap();
    let port = redis.port();
    let (pid, dir) = pid_and_dir(port);
    assert!(alive(pid));
    drop(redis);
    assert!(!alive(pid), "redis-server {pid} still runs after the drop");
    assert!(!Path::new(&dir).exists(), "{dir} is left behind");
    assert_ne!(redis_cli(port, &["PING"]), "PONG");
}

#[test]
fn a_panicking_test_still_kills_its_server() {
    let (sender, started) = std::sync::mpsc::channel();
    let test = std::thread::spawn(move || {
        let redis = RedisServer::start().unwrap();
        sender.send(pid_and_dir(redis.port())).unwrap();
        panic!("the test fails while its server runs");
    });
    assert!(test.join().is_err(), "the thread did not panic");
    let (pid, dir) = started.recv().unwrap();
    assert!(!alive(pid), "redis-server {pid} outlived the panic");
    assert!(!Path::new(&dir).exists(), "{dir} is left behind");
}

/// In the child: starts a server and prints the outcome for the parent to check.
fn start_and_print() {
    match RedisServer::start() {
        Ok(redis) => println!("STARTED {}", redis.port()),
        Err(error) => println!("KIND {:?}\nMESSAGE {error}", error.kind()),
    }
}

/// Runs the test `name` again in a child process with `env` set (a `None` value
/// removes the variable) and returns what it printed.
fn run_child(name: &str, env: &[(&str, Option<&str>)]) -> String {
    run_child_in(name, env, Path::new("."))
}

/// [`run_child`] in the directory `cwd`.
fn run_child_in(name: &str, env: &[(&str, Option<&str>)], cwd: &Path) -> String {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .current_dir(cwd)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for (var, value) in env {
        match value {
            Some(value) => command.env(var, value),
            None => command.env_remove(var),
        };
    }
    let output = command.output().expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child ({env:?}) failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// The message line the child printed, after checking that its error was `NotFound`.
fn not_found_message(stdout: &str) -> String {
    assert!(stdout.contains("KIND NotFound"), "{stdout}");
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("MESSAGE "))
        .unwrap_or_else(|| panic!("no message in {stdout}"))
        .to_owned()
}

#[test]
fn a_missing_binary_is_not_found_and_says_how_to_install_it() {
    if std::env::var_os(CHILD).is_some() {
        return start_and_print();
    }
    let name = "a_missing_binary_is_not_found_and_says_how_to_install_it";

    // REDIS_SERVER names a file that is not there.
    let stdout = run_child(name, &[("REDIS_SERVER", Some("/nonexistent"))]);
    let message = not_found_message(&stdout);
    assert!(message.contains("/nonexistent"), "{message}");
    assert!(message.contains("REDIS_SERVER"), "{message}");
    assert!(
        message.contains("apt-get install redis-server"),
        "{message}"
    );
    assert!(message.contains("brew install redis"), "{message}");

    // Nothing on PATH, no REDIS_SERVER.
    let stdout = run_child(
        name,
        &[("REDIS_SERVER", None), ("PATH", Some("/nonexistent"))],
    );
    let message = not_found_message(&stdout);
    assert!(message.contains("not found on PATH"), "{message}");
    assert!(
        message.contains("apt-get install redis-server"),
        "{message}"
    );
    println!("{message}");
}

#[test]
fn redis_server_names_the_binary_to_run() {
    if std::env::var_os(CHILD).is_some() {
        return start_and_print();
    }
    let binary = redlock_testkit::redis_server_binary().unwrap();
    // Found through the variable alone: PATH leads nowhere.
    let stdout = run_child(
        "redis_server_names_the_binary_to_run",
        &[
            ("REDIS_SERVER", Some(binary.to_str().unwrap())),
            ("PATH", Some("/nonexistent")),
        ],
    );
    assert!(stdout.contains("STARTED"), "{stdout}");

    // A relative path is the test's, not the server's directory's: `bin/redis-server`
    // run from `/usr`.
    let folder = binary.parent().unwrap();
    let relative = Path::new(folder.file_name().unwrap()).join("redis-server");
    let stdout = run_child_in(
        "redis_server_names_the_binary_to_run",
        &[
            ("REDIS_SERVER", Some(relative.to_str().unwrap())),
            ("PATH", Some("/nonexistent")),
        ],
        folder.parent().unwrap(),
    );
    assert!(stdout.contains("STARTED"), "{stdout}");
}
