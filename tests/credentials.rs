//! Credentials in every mode: ACL users (`redis://user:password@host`) and password-only
//! `AUTH` (`redis://:password@host`) for RedLock, Redis Cluster and Sentinel, against
//! real `redis-server` processes the tests start; a wrong password is a clear error; and
//! no password ever shows: not in an error's message, `Debug` or chain, not in a
//! client's or builder's `Debug`, not in anything logged through `tracing` (or through
//! `log`, which the redis crate uses and `tracing-subscriber` forwards) at TRACE level.
//!
//! Every test captures its own `tracing` output: a current-thread runtime runs the
//! client's background tasks on the test's thread, where the capture is the default
//! subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_runtime::{LockClient, LockClientBuilder, LockError};
use redlock_testkit::sentinel::SERVICE;
use redlock_testkit::{RedisCluster, RedisServer, SentinelSetup, free_port};

/// The default user's password (`requirepass`).
const PASSWORD: &str = "s3cr3t-Pa55w0rd";
/// The ACL user `locker`'s password.
const USER_PASSWORD: &str = "l0cker-Pa55w0rd-7c1e";
/// A wrong password.
const WRONG: &str = "wr0ng-Pa55w0rd-9f3a";
/// What no output may contain. Also their first halves, in case of a cut.
const SECRETS: [&str; 6] = [
    PASSWORD,
    USER_PASSWORD,
    WRONG,
    "s3cr3t-Pa",
    "l0cker-Pa",
    "wr0ng-Pa",
];

/// Everything `tracing` (and `log`) wrote on this thread since [`Logs::capture`].
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures every event and span (with their fields) at TRACE level on this
    /// thread, until the guard is dropped.
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::NEW)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        // (With the `log` bridge: the redis crate's `log` records reach the capture too.)
        (logs, common::on_this_thread(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Fails if anything logged so far holds a password; `expected` is something the
    /// capture must hold (proof that it captured at all), or empty.
    fn assert_hidden(&self, expected: &str) {
        let text = self.text();
        assert!(
            text.contains(expected),
            "the capture lacks {expected:?}: {text}"
        );
        assert_hidden("the tracing output", &text);
    }
}

fn assert_hidden(what: &str, text: &str) {
    if let Some(secret) = shown_secret(text) {
        panic!("{what} shows the password {secret:?}: {text}");
    }
}

/// The password `text` shows, if any.
fn shown_secret(text: &str) -> Option<&'static str> {
    SECRETS.into_iter().find(|secret| text.contains(secret))
}

/// The error's message, `Debug` (both forms), chain, and every cause's message and
/// `Debug` hold no password.
fn assert_error_hidden(error: &LockError) {
    if let Some(leak) = error_leaks(error).first() {
        panic!("{leak}");
    }
}

/// Where `error` shows a password: its message, `Debug` (both forms), chain, or a
/// cause's message or `Debug`.
fn error_leaks(error: &LockError) -> Vec<String> {
    let mut shown = vec![
        ("message", error.to_string()),
        ("Debug", format!("{error:?}")),
        ("pretty Debug", format!("{error:#?}")),
        ("chain", error.chain().to_string()),
    ];
    let mut cause = std::error::Error::source(error);
    while let Some(source) = cause {
        shown.push(("cause's message", source.to_string()));
        shown.push(("cause's Debug", format!("{source:?}")));
        cause = source.source();
    }
    shown
        .into_iter()
        .filter_map(|(what, text)| {
            let secret = shown_secret(&text)?;
            Some(format!(
                "the error's {what} shows the password {secret:?}: {text}"
            ))
        })
        .collect()
}

/// Runs `redis-cli` against `server` as the default user with `password`.
fn authed(server: &RedisServer, password: &str, args: &[&str]) -> String {
    let mut all = vec!["-a", password, "--no-auth-warning"];
    all.extend_from_slice(args);
    server.cli(&all)
}

/// The ACL user `locker`, with every key, channel and command (its password follows).
const ACL_SETUSER: &str = "ACL SETUSER locker on ~* &* +@all";

/// Creates the ACL user `locker`, password [`USER_PASSWORD`], on `server`.
fn add_acl_user(server: &RedisServer) {
    let command = format!("{ACL_SETUSER} >{USER_PASSWORD}");
    let args: Vec<&str> = command.split(' ').collect();
    assert_eq!(server.cli(&args), "OK", "ACL SETUSER");
}

/// Gives the default user of `server` the password [`PASSWORD`] (`requirepass`), and
/// makes it use it as a replica (`masterauth`). Set after start: the kit checks a new
/// server with a plain PING. From then on use [`authed`], not `server.cli`.
fn require_password(server: &RedisServer) {
    assert_eq!(
        server.cli(&["CONFIG", "SET", "requirepass", PASSWORD]),
        "OK"
    );
    assert_eq!(
        authed(server, PASSWORD, &["CONFIG", "SET", "masterauth", PASSWORD]),
        "OK"
    );
    // Without the password, the server refuses.
    assert!(server.cli(&["PING"]).contains("NOAUTH"));
}

/// `redis://[user]:password@127.0.0.1:PORT/`
fn url_with(user: &str, password: &str, port: u16) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{port}/")
}

/// Connects, bounded: a connection that hangs fails the test instead of the suite.
/// Checks the builder's `Debug` first, and the client's after.
async fn connect(builder: LockClientBuilder) -> Result<LockClient, LockError> {
    assert_hidden("the builder's Debug", &format!("{builder:?}"));
    let connected = tokio::time::timeout(
        Duration::from_secs(20),
        builder
            .connect_timeout(Duration::from_millis(500))
            .connect(),
    )
    .await
    .expect("connect gave an answer in time");
    match &connected {
        Ok(client) => assert_hidden("the client's Debug", &format!("{client:?}")),
        Err(error) => assert_error_hidden(error),
    }
    connected
}

/// Takes `key` for 10 s, without waiting.
async fn take(client: &LockClient, key: &str) -> Result<redlock_runtime::LockGuard, LockError> {
    let taken = tokio::time::timeout(
        Duration::from_secs(20),
        client.lock(key).lease(Duration::from_secs(10)).acquire(),
    )
    .await
    .expect("acquire gave an answer in time");
    if let Err(error) = &taken {
        assert_error_hidden(error);
    }
    taken
}

/// `EXISTS key` on `master` once it says `expected`, or after 2 s: a RedLock operation
/// is decided by a majority, and the last master's part may still be on its way.
async fn soon(master: &RedisServer, key: &str, expected: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let found = authed(master, PASSWORD, &["EXISTS", key]);
        if found == expected || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three RedLock masters, each with the ACL user `locker` and the default user's
/// password (`requirepass`).
fn masters_with_credentials() -> [RedisServer; 3] {
    let masters = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    for master in &masters {
        master.vouch_for_its_data();
        add_acl_user(master);
        require_password(master);
    }
    masters
}

#[tokio::test]
async fn redlock_takes_acl_users_and_password_only_auth() {
    let (logs, _capture) = Logs::capture();
    let masters = masters_with_credentials();
    let ports = masters.each_ref().map(RedisServer::port);

    let as_user = ports.map(|port| url_with("locker", USER_PASSWORD, port));
    let password_only = ports.map(|port| url_with("", PASSWORD, port));
    for (urls, name) in [(&as_user, "as_user"), (&password_only, "password_only")] {
        let client = connect(LockClient::builder_for(urls))
            .await
            .unwrap_or_else(|error| panic!("{name}: {}", error.chain()));
        let key = format!("cred:redlock:{name}");
        let guard = take(&client, &key).await.expect(name);
        // Every master voted: the lock is on each of them (the last one's answer may
        // still be on its way: the acquire is decided once a majority has answered).
        for master in &masters {
            assert_eq!(soon(master, &key, "1").await, "1", "{name}");
        }
        guard.release().await.unwrap();
        // Released everywhere, the last master in the background too.
        for master in &masters {
            assert_eq!(soon(master, &key, "0").await, "0", "{name}");
        }
    }

    // The same through a REDLOCK_URL-style spec, as a deployment writes it.
    let spec = password_only.join(",");
    let client = connect(LockClient::builder_from_spec(&spec))
        .await
        .expect("spec");
    take(&client, "cred:redlock:spec")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    logs.assert_hidden("cred:redlock");
}

#[tokio::test]
async fn redlock_locks_with_a_wrong_password_on_one_master_of_three() {
    let (logs, _capture) = Logs::capture();
    let masters = masters_with_credentials();
    let ports = masters.each_ref().map(RedisServer::port);
    let as_user = ports.map(|port| url_with("locker", USER_PASSWORD, port));
    // A lock with every master first: a RedLock master that has never been seen by a
    // client may vote only when every master answers (a fresh deployment), or after
    // max_lease (it might have lost locks); this makes them known ones.
    let client = connect(LockClient::builder_for(&as_user)).await.unwrap();
    take(&client, "cred:redlock:first")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A wrong password (or user) on one master of three: the other two are a majority.
    for wrong in [
        url_with("locker", WRONG, ports[1]),
        url_with("", WRONG, ports[1]),
        url_with("nobody", USER_PASSWORD, ports[1]),
    ] {
        let urls = [as_user[0].clone(), wrong, as_user[2].clone()];
        let client = connect(LockClient::builder_for(&urls))
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "connect refused though two masters of three accept the credentials: \
                     {error:?} ({})",
                    error.chain()
                )
            });
        let guard = take(&client, "cred:redlock:minority")
            .await
            .expect("a majority of masters takes the lock");
        assert_eq!(
            authed(&masters[0], PASSWORD, &["EXISTS", "cred:redlock:minority"]),
            "1"
        );
        assert_eq!(
            authed(&masters[1], PASSWORD, &["EXISTS", "cred:redlock:minority"]),
            "0",
            "the master with the wrong password took no part"
        );
        guard.release().await.unwrap();
    }
    logs.assert_hidden("cred:redlock:minority");
}

#[tokio::test]
async fn redlock_with_every_password_wrong_is_an_auth_error_at_connect() {
    let (logs, _capture) = Logs::capture();
    let masters = masters_with_credentials();
    let ports = masters.each_ref().map(RedisServer::port);
    for (case, urls) in [
        (
            "wrong password",
            ports.map(|port| url_with("", WRONG, port)),
        ),
        (
            "wrong user password",
            ports.map(|port| url_with("locker", WRONG, port)),
        ),
        (
            "no password",
            ports.map(|port| format!("redis://127.0.0.1:{port}/")),
        ),
    ] {
        let started = Instant::now();
        let error = match connect(LockClient::builder_for(&urls)).await {
            Err(error) => error,
            Ok(client) => {
                let outcome = take(&client, "cred:redlock:none").await;
                panic!(
                    "{case}: connect succeeded though no master accepted the credentials; \
                     acquire then gave {outcome:?}"
                );
            }
        };
        assert!(
            matches!(error, LockError::Auth { .. }),
            "{case}: {error:?} ({})",
            error.chain()
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{case}");
    }
    logs.assert_hidden("");
}

/// Keys of the form `cred:cluster:N`, one on each master of `cluster`.
fn one_key_per_shard(cluster: &RedisCluster) -> Vec<(String, usize)> {
    let mut chosen: Vec<(String, usize)> = Vec::new();
    for n in 0.. {
        let key = format!("cred:cluster:{n}");
        let master = cluster.master_of(&key).expect("a master serves the key");
        if chosen.iter().all(|(_, taken)| *taken != master) {
            chosen.push((key, master));
        }
        if chosen.len() == cluster.nodes.len() {
            return chosen;
        }
    }
    unreachable!()
}

#[tokio::test]
async fn a_cluster_with_passwords_locks_on_every_shard() {
    let (logs, _capture) = Logs::capture();
    let cluster = RedisCluster::start(3);
    // The kit's helpers run redis-cli without a password: ask them first.
    let keys = one_key_per_shard(&cluster);
    for node in &cluster.nodes {
        add_acl_user(node);
        require_password(node);
    }
    let ports: Vec<u16> = cluster.nodes.iter().map(RedisServer::port).collect();
    let seeds = |user: &str, password: &str| -> Vec<String> {
        ports
            .iter()
            .map(|&port| url_with(user, password, port))
            .collect()
    };

    for (user, password) in [("", PASSWORD), ("locker", USER_PASSWORD)] {
        let spec = format!("cluster:{}", seeds(user, password).join(","));
        let client = connect(LockClient::builder_from_spec(&spec))
            .await
            .unwrap_or_else(|error| panic!("user {user:?}: {}", error.chain()));
        let mut guards = Vec::new();
        for (key, master) in &keys {
            guards.push(take(&client, key).await.expect(key));
            let node = &cluster.nodes[*master];
            assert_eq!(authed(node, PASSWORD, &["EXISTS", key]), "1", "{key}");
        }
        let listed = client.locks("cred:cluster:*").await.unwrap();
        assert_eq!(listed.len(), keys.len(), "{listed:?}");
        for guard in guards {
            guard.release().await.unwrap();
        }
    }

    // A wrong password, or none, on every seed.
    for (case, urls) in [
        ("wrong password", seeds("", WRONG)),
        ("wrong user password", seeds("locker", WRONG)),
        (
            "no password",
            ports
                .iter()
                .map(|port| format!("redis://127.0.0.1:{port}/"))
                .collect(),
        ),
    ] {
        let started = Instant::now();
        let error = match connect(LockClient::builder_for(&urls).cluster()).await {
            Err(error) => error,
            Ok(client) => {
                let outcome = take(&client, "cred:cluster:none").await;
                panic!("{case}: connect succeeded; acquire then gave {outcome:?}");
            }
        };
        assert!(
            matches!(error, LockError::Auth { .. }),
            "{case}: {error:?} ({})",
            error.chain()
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{case}");
    }
    logs.assert_hidden("cred:cluster");
}

#[tokio::test]
async fn sentinel_with_passwords_locks_and_follows_the_primary() {
    let (logs, _capture) = Logs::capture();
    let mut setup = SentinelSetup::start_with_password(PASSWORD);
    let sentinels: Vec<String> = setup
        .sentinels
        .iter()
        .map(|sentinel| url_with("", PASSWORD, sentinel.port()))
        .collect();
    let spec = format!("sentinel:{SERVICE}:{}", sentinels.join(","));
    let client = connect(
        LockClient::builder_from_spec(&spec)
            // WAIT on the primary, and the replica's confirmation, with the password too.
            // (Three times 500 ms: a loaded machine acknowledges later than 500 ms at times.)
            .confirm_replicas(1, Duration::from_millis(1500))
            .response_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_or_else(|error| panic!("{}", error.chain()));

    // An ACL user, known to the sentinels and to both data nodes (ACLs do not
    // replicate): the URLs' user and password serve for both.
    let acl = format!("{ACL_SETUSER} >{USER_PASSWORD}");
    let acl: Vec<&str> = acl.split(' ').collect();
    for server in [&setup.primary, &setup.replica] {
        assert_eq!(setup.server_cli(server, &acl), "OK");
    }
    for sentinel in &setup.sentinels {
        assert_eq!(sentinel.cli(&acl), "OK");
    }
    let as_user: Vec<String> = setup
        .sentinels
        .iter()
        .map(|sentinel| url_with("locker", USER_PASSWORD, sentinel.port()))
        .collect();
    let user_client = connect(LockClient::builder_for(&as_user).sentinel(SERVICE))
        .await
        .unwrap_or_else(|error| panic!("ACL user: {}", error.chain()));
    take(&user_client, "cred:sentinel:user")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let guard = take(&client, "cred:sentinel").await.unwrap();
    assert_eq!(
        setup.server_cli(&setup.replica, &["EXISTS", "cred:sentinel"]),
        "1",
        "the replica confirmed the lock"
    );

    setup.fail_over();
    // The client follows the new primary (its first command may reach the dead one,
    // then it asks the sentinels, with the password, again).
    let mut extended = guard.extend(Duration::from_secs(10)).await;
    for _ in 0..20 {
        if extended.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        extended = guard.extend(Duration::from_secs(10)).await;
    }
    extended.expect("the client never reached the new primary");
    guard.release().await.unwrap();
    // A client that arrives now finds the promoted replica through the sentinels. (No
    // replica is left to confirm anything.)
    let late = connect(LockClient::builder_from_spec(&spec))
        .await
        .unwrap_or_else(|error| panic!("{}", error.chain()));
    let next = take(&late, "cred:sentinel:after").await.unwrap();
    assert_eq!(
        setup.server_cli(&setup.replica, &["EXISTS", "cred:sentinel:after"]),
        "1",
        "the lock is on the promoted replica"
    );
    next.release().await.unwrap();

    // A wrong password, or none, for the sentinels (and so for the data nodes).
    for (case, password) in [("wrong password", Some(WRONG)), ("no password", None)] {
        let urls: Vec<String> = setup
            .sentinels
            .iter()
            .map(|sentinel| match password {
                Some(password) => url_with("", password, sentinel.port()),
                None => sentinel.url(),
            })
            .collect();
        let started = Instant::now();
        let error = match connect(LockClient::builder_for(&urls).sentinel(SERVICE)).await {
            Err(error) => error,
            Ok(client) => {
                let outcome = take(&client, "cred:sentinel:none").await;
                panic!("{case}: connect succeeded; acquire then gave {outcome:?}");
            }
        };
        assert!(
            matches!(error, LockError::Auth { .. }),
            "{case}: {error:?} ({})",
            error.chain()
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{case}");
    }
    logs.assert_hidden("cred:sentinel");
}

#[tokio::test]
async fn a_password_never_shows_when_the_server_cannot_be_reached() {
    let (logs, _capture) = Logs::capture();
    // Loopback ports nothing listens on.
    let closed: Vec<String> = (0..3)
        .map(|_| url_with("locker", PASSWORD, free_port()))
        .collect();
    let single = closed[0].clone();
    let masters = closed.join(",");
    let redlock = format!("redlock:{masters}");
    let cluster = format!("cluster:{masters}");
    let sentinel = format!("sentinel:{SERVICE}:{masters}");
    for spec in [&single, &masters, &redlock, &cluster, &sentinel] {
        let started = Instant::now();
        let error = match connect(LockClient::builder_from_spec(spec)).await {
            Err(error) => error,
            // RedLock connects without its masters, and retries them on every use.
            Ok(client) => take(&client, "cred:unreachable")
                .await
                .expect_err("no master can be reached"),
        };
        assert!(error.is_unavailable(), "{spec}: {error:?}");
        assert!(started.elapsed() < Duration::from_secs(15), "{spec}");
    }
    // Percent-encoded or not, a password with special characters stays hidden too.
    let odd = format!(
        "redis://locker:{}%40x%2Fy@127.0.0.1:{}/",
        PASSWORD,
        free_port()
    );
    let error = connect(LockClient::builder(&odd))
        .await
        .expect_err("nothing listens");
    assert!(error.is_unavailable(), "{error:?}");
    logs.assert_hidden("cred:unreachable");
}

#[tokio::test]
async fn a_password_never_shows_for_one_server_with_a_wrong_password() {
    let (logs, _capture) = Logs::capture();
    let server = RedisServer::start();
    add_acl_user(&server);
    require_password(&server);
    for url in [
        url_with("", WRONG, server.port()),
        url_with("locker", WRONG, server.port()),
        url_with("locker", PASSWORD, server.port()),
    ] {
        let error = connect(LockClient::builder(&url))
            .await
            .expect_err("wrong credentials");
        assert!(matches!(error, LockError::Auth { .. }), "{error:?}");
    }
    // And with the right ones, nothing logged while locking shows them either.
    let client = connect(LockClient::builder(&url_with(
        "locker",
        USER_PASSWORD,
        server.port(),
    )))
    .await
    .unwrap();
    take(&client, "cred:single")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    logs.assert_hidden("cred:single");
}

#[tokio::test]
async fn a_password_never_shows_when_the_spec_is_wrong() {
    let (logs, _capture) = Logs::capture();
    let port = free_port();
    let specs = [
        // A port out of range, a scheme that is not Redis's, a typo in the scheme.
        format!("redis://locker:{PASSWORD}@127.0.0.1:99999/"),
        format!("http://locker:{PASSWORD}@127.0.0.1:{port}/"),
        format!("redis:/locker:{PASSWORD}@127.0.0.1:{port}/"),
        format!("redis//:{PASSWORD}@127.0.0.1:{port}/"),
        format!("locker:{PASSWORD}@127.0.0.1:{port}"),
        format!(":{PASSWORD}@127.0.0.1:{port}"),
        // The Sentinel service name left out, a cluster with a bad seed.
        format!("sentinel:redis://:{PASSWORD}@127.0.0.1:{port}/"),
        format!("cluster:redis://:{PASSWORD}@127.0.0.1:99999/"),
        format!("redis://:{PASSWORD}@127.0.0.1:{port}/,http://:{PASSWORD}@127.0.0.1:{port}/"),
    ];
    // Every spec is tried, and every leak reported together.
    let mut leaks = Vec::new();
    for spec in &specs {
        let builder = LockClient::builder_from_spec(spec);
        assert_hidden("the builder's Debug", &format!("{builder:?}"));
        let error = tokio::time::timeout(Duration::from_secs(20), builder.connect())
            .await
            .expect("connect gave an answer in time")
            .expect_err("a wrong spec");
        assert!(
            matches!(error, LockError::Connect { .. }),
            "{spec}: {error:?}"
        );
        if let Some(leak) = error_leaks(&error).first() {
            leaks.push(format!("`{spec}`: {leak}"));
        }
    }
    assert!(leaks.is_empty(), "{}", leaks.join("\n"));
    logs.assert_hidden("");
}
