//! Managed Redis: `rediss://` with a private CA, ACL users and password-only `AUTH`,
//! against real `redis-server` processes started with `--tls-port` and certificates this
//! test makes (rcgen). Bad certificates and bad credentials must give a clear, typed
//! error within a bounded time, and no password may appear in an error.
//!
//! A server chosen with `REDIS_SERVER` that was built without TLS (the Valkey of
//! `scripts/test.sh`'s second pass) skips the tests that need a TLS port, saying so in
//! one line (`redlock_testkit::skip_without_tls`); the other two run on it.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockError};
use redlock_testkit::{RedisServer, free_port};

/// A certificate authority and a server certificate it signed, for 127.0.0.1.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl Pki {
    fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "redlock test CA");
        let ca = ca_params.self_signed(&ca_key).expect("the CA certificate");
        let key = rcgen::KeyPair::generate().expect("a server key");
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .unwrap();
        let cert = params
            .signed_by(&key, &ca, &ca_key)
            .expect("the server certificate");
        let dir = tempfile::Builder::new()
            .prefix("redlock-tls-")
            .tempdir()
            .unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        Pki {
            dir,
            ca_pem: ca.pem(),
        }
    }

    fn path(&self, name: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        path.to_str().unwrap().to_owned()
    }
}

/// A server listening with TLS on its own port (and in plain text on the kit's, for the
/// test's own set-up commands); `extra` are more `redis-server` arguments.
fn tls_server(pki: &Pki, extra: &[&str]) -> (RedisServer, u16) {
    let port = free_port();
    let port_text = port.to_string();
    let (cert, key, ca) = (
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem"),
    );
    let mut args = vec![
        "--tls-port",
        &port_text,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ];
    args.extend_from_slice(extra);
    (RedisServer::start_with(&args), port)
}

/// Connects, bounded: a connection that hangs fails the test instead of the suite.
async fn connect(url: &str, ca: Option<&str>) -> Result<LockClient, LockError> {
    let mut builder = LockClient::builder(url).connect_timeout(Duration::from_secs(2));
    if let Some(ca) = ca {
        builder = builder.tls_root_certificate(ca.as_bytes().to_vec());
    }
    tokio::time::timeout(Duration::from_secs(15), builder.connect())
        .await
        .expect("connect gave an answer in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_over_tls_with_a_private_ca() {
    if redlock_testkit::skip_without_tls() {
        return;
    }
    let pki = Pki::new();
    let (_server, port) = tls_server(&pki, &[]);
    let url = format!("rediss://127.0.0.1:{port}/");
    let first = connect(&url, Some(&pki.ca_pem)).await.expect("TLS connect");
    let second = connect(&url, Some(&pki.ca_pem)).await.expect("TLS connect");

    let held = first
        .lock("tls:order:1")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let token = held.fencing_token();
    // A waiter on the other client is woken by the release message (pub/sub over TLS),
    // long before the 10 s lease could have run out.
    let waiter = tokio::spawn(async move {
        let guard = second
            .lock("tls:order:1")
            .wait(Duration::from_secs(8))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let next = guard.fencing_token();
        guard.release().await.unwrap();
        next
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let next = waiter.await.unwrap();
    assert!(next > token);
    assert!(released_at.elapsed() < Duration::from_secs(5));
    let info = first.inspect("tls:order:1").await.unwrap();
    assert!(info.is_none(), "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_verify_is_a_tls_error() {
    if redlock_testkit::skip_without_tls() {
        return;
    }
    let pki = Pki::new();
    let other = Pki::new();
    let (_server, port) = tls_server(&pki, &[]);
    let url = format!("rediss://127.0.0.1:{port}/");
    for ca in [None, Some(other.ca_pem.as_str())] {
        let started = Instant::now();
        let error = connect(&url, ca)
            .await
            .expect_err("an untrusted certificate");
        assert!(matches!(error, LockError::Tls { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("tls_root_certificate"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_port_fails_in_bounded_time() {
    let server = RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}/", server.port());
    let started = Instant::now();
    let error = connect(&url, None).await.expect_err("not a TLS port");
    assert!(
        matches!(error, LockError::Tls { .. } | LockError::Connect { .. }),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_over_tls_locks_and_a_wrong_password_is_an_auth_error() {
    if redlock_testkit::skip_without_tls() {
        return;
    }
    let pki = Pki::new();
    let (server, port) = tls_server(&pki, &[]);
    server.cli(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">s3cret-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    let good = format!("rediss://locker:s3cret-pw@127.0.0.1:{port}/");
    let client = connect(&good, Some(&pki.ca_pem)).await.expect("ACL user");
    let guard = client
        .lock("acl:1")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert!(!format!("{client:?}").contains("s3cret-pw"));

    let bad = format!("rediss://locker:wrong-pw@127.0.0.1:{port}/");
    let error = connect(&bad, Some(&pki.ca_pem))
        .await
        .expect_err("bad password");
    assert!(matches!(error, LockError::Auth { .. }), "{error:?}");
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains("wrong-pw"), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_only_server_needs_the_password() {
    let server = RedisServer::start();
    // Set after start: the kit checks a new server with a plain PING.
    server.cli(&["CONFIG", "SET", "requirepass", "pa55word"]);
    let good = format!("redis://:pa55word@127.0.0.1:{}/", server.port());
    let client = connect(&good, None).await.expect("password");
    client
        .lock("auth:1")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for url in [
        format!("redis://:nope@127.0.0.1:{}/", server.port()),
        format!("redis://127.0.0.1:{}/", server.port()),
    ] {
        let error = connect(&url, None).await.expect_err("no or wrong password");
        assert!(matches!(error, LockError::Auth { .. }), "{url}: {error:?}");
        assert!(!format!("{error:?}").contains("nope"), "{error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_mixes_tls_and_plain_masters() {
    if redlock_testkit::skip_without_tls() {
        return;
    }
    let pki = Pki::new();
    let (tls, port) = tls_server(&pki, &[]);
    tls.vouch_for_its_data();
    let plain = [
        RedisServer::start_redlock_master(),
        RedisServer::start_redlock_master(),
    ];
    let urls = vec![
        format!("rediss://127.0.0.1:{port}/"),
        plain[0].url(),
        plain[1].url(),
    ];
    let client = tokio::time::timeout(
        Duration::from_secs(15),
        LockClient::builder_for(&urls)
            .tls_root_certificate(pki.ca_pem.as_bytes().to_vec())
            .connect(),
    )
    .await
    .unwrap()
    .expect("RedLock over TLS and plain masters");
    let guard = client
        .lock("mixed:1")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let info = client.inspect("mixed:1").await.unwrap().expect("held");
    assert_eq!(info.fencing_token(), guard.fencing_token());
    guard.release().await.unwrap();
}

/// A Redis Cluster whose nodes speak only TLS (clients, cluster bus and replication),
/// started by hand: the kit's servers are checked over plain TCP.
struct TlsCluster {
    nodes: Vec<std::process::Child>,
    ports: Vec<u16>,
    _dirs: Vec<tempfile::TempDir>,
}

impl TlsCluster {
    fn start(pki: &Pki, masters: usize) -> Self {
        let binary = redlock_testkit::redis_server_binary().expect("redis-server");
        let (mut nodes, mut ports, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..masters {
            let dir = tempfile::Builder::new()
                .prefix("redlock-tls-cluster-")
                .tempdir()
                .unwrap();
            let port = free_port();
            let child = std::process::Command::new(&binary)
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--tls-cert-file", &pki.path("server.pem")])
                .args(["--tls-key-file", &pki.path("server.key")])
                .args(["--tls-ca-cert-file", &pki.path("ca.pem")])
                .args(["--tls-auth-clients", "no", "--tls-cluster", "yes"])
                .args(["--tls-replication", "yes", "--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args([
                    "--cluster-node-timeout",
                    "2000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .args(["--bind", "127.0.0.1", "--dir", dir.path().to_str().unwrap()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn a TLS cluster node");
            nodes.push(child);
            ports.push(port);
            dirs.push(dir);
        }
        let cluster = TlsCluster {
            nodes,
            ports,
            _dirs: dirs,
        };
        let ca = pki.path("ca.pem");
        let cli = |args: &[&str]| {
            std::process::Command::new("redis-cli")
                .args(["--tls", "--cacert", &ca])
                .args(args)
                .output()
                .expect("run redis-cli")
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        for port in &cluster.ports {
            while !String::from_utf8_lossy(&cli(&["-p", &port.to_string(), "PING"]).stdout)
                .contains("PONG")
            {
                assert!(Instant::now() < deadline, "a TLS node did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let mut create = vec!["--cluster", "create"];
        create.extend(addresses.iter().map(String::as_str));
        create.push("--cluster-yes");
        let created = cli(&create);
        assert!(created.status.success(), "{created:?}");
        let first = cluster.ports[0].to_string();
        while !String::from_utf8_lossy(&cli(&["-p", &first, "CLUSTER", "INFO"]).stdout)
            .contains("cluster_state:ok")
        {
            assert!(Instant::now() < deadline, "the TLS cluster did not form");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("rediss://127.0.0.1:{port}/"))
            .collect()
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_locks_on_every_shard() {
    if redlock_testkit::skip_without_tls() {
        return;
    }
    let pki = Pki::new();
    let cluster = TlsCluster::start(&pki, 3);
    let client = tokio::time::timeout(
        Duration::from_secs(15),
        LockClient::builder_for(cluster.urls())
            .cluster()
            .tls_root_certificate(pki.ca_pem.as_bytes().to_vec())
            .connect(),
    )
    .await
    .unwrap()
    .expect("Cluster over TLS");
    // Ten keys, spread over the shards by their slots.
    let keys: Vec<String> = (b'a'..=b'j')
        .map(|c| format!("tls:{}", c as char))
        .collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            client
                .lock(key.as_str())
                .lease(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let listed: Vec<String> = client
        .locks("tls:*")
        .await
        .unwrap()
        .iter()
        .map(|info| info.key().to_owned())
        .collect();
    assert_eq!(listed, keys);
    // A waiter on another client is woken over TLS (sharded pub/sub) by the release.
    let other = LockClient::builder_for(cluster.urls())
        .cluster()
        .tls_root_certificate(pki.ca_pem.as_bytes().to_vec())
        .connect()
        .await
        .unwrap();
    let first = guards.remove(0);
    let waiter = tokio::spawn(async move {
        other
            .lock("tls:a")
            .wait(Duration::from_secs(8))
            .lease(Duration::from_secs(10))
            .acquire()
            .await
            .map(|guard| guard.fencing_token())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let token = first.fencing_token();
    first.release().await.unwrap();
    assert!(waiter.await.unwrap().unwrap() > token);
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// A TLS-only primary watched by one TLS-only sentinel, started by hand.
struct TlsSentinel {
    children: Vec<std::process::Child>,
    sentinel_port: u16,
    _dir: tempfile::TempDir,
}

impl TlsSentinel {
    fn start(pki: &Pki) -> Self {
        let binary = redlock_testkit::redis_server_binary().expect("redis-server");
        let dir = tempfile::Builder::new()
            .prefix("redlock-tls-sentinel-")
            .tempdir()
            .unwrap();
        let tls = [
            format!("tls-cert-file {}", pki.path("server.pem")),
            format!("tls-key-file {}", pki.path("server.key")),
            format!("tls-ca-cert-file {}", pki.path("ca.pem")),
            "tls-auth-clients no".into(),
            "tls-replication yes".into(),
            "bind 127.0.0.1".into(),
            "port 0".into(),
            String::new(),
        ]
        .join("\n");
        let (primary_port, sentinel_port) = (free_port(), free_port());
        let spawn = |name: &str, config: String, sentinel: bool| {
            let path = dir.path().join(name);
            std::fs::write(&path, config).unwrap();
            let mut command = std::process::Command::new(&binary);
            command.arg(&path);
            if sentinel {
                command.arg("--sentinel");
            }
            command
                .current_dir(dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn a TLS server")
        };
        let primary = spawn(
            "primary.conf",
            format!("{tls}tls-port {primary_port}\nsave \"\"\nappendonly no\n"),
            false,
        );
        let sentinel = spawn(
            "sentinel.conf",
            format!(
                "{tls}tls-port {sentinel_port}\nsentinel monitor mymaster 127.0.0.1 {primary_port} 1\n"
            ),
            true,
        );
        let setup = TlsSentinel {
            children: vec![primary, sentinel],
            sentinel_port,
            _dir: dir,
        };
        let ca = pki.path("ca.pem");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let answer = std::process::Command::new("redis-cli")
                .args(["--tls", "--cacert", &ca, "-p", &sentinel_port.to_string()])
                .args(["SENTINEL", "get-master-addr-by-name", "mymaster"])
                .output()
                .expect("run redis-cli");
            if String::from_utf8_lossy(&answer.stdout).contains(&primary_port.to_string()) {
                break;
            }
            assert!(Instant::now() < deadline, "the TLS sentinel did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        setup
    }
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_finds_and_locks_the_primary() {
    if redlock_testkit::skip_without_tls() {
        return;
    }
    let pki = Pki::new();
    let setup = TlsSentinel::start(&pki);
    let url = format!("rediss://127.0.0.1:{}/", setup.sentinel_port);
    let client = tokio::time::timeout(
        Duration::from_secs(15),
        LockClient::builder_for([url.as_str()])
            .sentinel("mymaster")
            .tls_root_certificate(pki.ca_pem.as_bytes().to_vec())
            .connect(),
    )
    .await
    .unwrap()
    .expect("Sentinel over TLS");
    let guard = client
        .lock("tls:sentinel")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let info = client.inspect("tls:sentinel").await.unwrap().expect("held");
    assert_eq!(info.fencing_token(), guard.fencing_token());
    guard.release().await.unwrap();
}
