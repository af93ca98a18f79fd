//! Errors say why, on one line: each failure a user meets first shows, in its
//! `Display`, what happened, the cause (what Redis or the connection reported) and,
//! where there is one, the fix; and it is classified by what the user must do
//! (`is_busy`, `is_unavailable`, `is_lost`, `is_misconfigured`, or shut down).
//!
//! Real redis-server processes from the test kit, and for the "wrong port" cases a
//! plain TCP listener that answers like an HTTP server; never port 6379.
//!
//! The default client (`#[distributed_lock]` without `client =`) reads `REDLOCK_URL`
//! once per process, and setting an environment variable needs `unsafe` (forbidden
//! here): each default-client case runs this binary again as a child process with
//! `REDLOCK_URL` set, and the child makes the call and checks the error. The case of
//! `REDLOCK_URL` not set would connect to 6379; it is checked without connecting, in
//! `macro_support`'s unit tests.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_runtime::{LockClient, LockError, distributed_lock};
use redlock_testkit::{RedisServer, free_port};

/// Set in the child process, which makes the default client's call.
const CHILD: &str = "REDLOCK_TEST_ERRORS_SAY_WHY_CHILD";
/// The class the child's error must be in.
const EXPECT_CLASS: &str = "REDLOCK_TEST_EXPECT_CLASS";
/// What the child's message must contain, `|`-separated.
const EXPECT_TEXT: &str = "REDLOCK_TEST_EXPECT_TEXT";

/// The one class `error` is in; fails unless exactly one holds.
fn class(error: &LockError) -> &'static str {
    let classes = [
        ("busy", error.is_busy()),
        ("unavailable", error.is_unavailable()),
        ("lost", error.is_lost()),
        ("misconfigured", error.is_misconfigured()),
        ("shut down", matches!(error, LockError::ShutDown { .. })),
    ];
    let held: Vec<_> = classes
        .iter()
        .filter(|(_, is)| *is)
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(held.len(), 1, "{error:?} is in {held:?}");
    held[0]
}

/// `error` is in `expected_class`, its message is one line that names `key` (when
/// there is one) and contains every one of `needles`, and the message is all a
/// reporter prints (no `source()` to repeat it).
fn assert_says(error: &LockError, expected_class: &str, key: &str, needles: &[&str]) {
    let message = error.to_string();
    println!("{expected_class}: {message}");
    assert_eq!(class(error), expected_class, "{message}");
    assert_eq!(error.key(), key, "{error:?}");
    assert!(!message.contains('\n'), "not one line: {message:?}");
    if !key.is_empty() {
        assert!(message.contains(&format!("`{key}`")), "no key: {message}");
    }
    for needle in needles {
        assert!(message.contains(needle), "{needle:?} missing: {message}");
    }
    assert!(std::error::Error::source(error).is_none(), "{error:?}");
    assert_eq!(error.chain().to_string(), message);
}

/// A loopback server on a free port that answers every connection like an HTTP
/// server (a `400 Bad Request`), as a web service on the port `REDLOCK_URL` names
/// would. It lives as long as the test process.
fn http_server() -> u16 {
    answering_server(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\n\
          Content-Length: 11\r\nConnection: close\r\n\r\nBad Request",
    )
}

/// A loopback server on a free port that answers `reply` to whatever a connection
/// sends first. It lives as long as the test process.
fn answering_server(reply: &'static [u8]) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            // Like a server, it answers every command (a RESP array: `*N` at a line's
            // start) until the client hangs up; an HTTP client's request gets one answer.
            let mut buffer = [0; 4096];
            while let Ok(n @ 1..) = stream.read(&mut buffer) {
                let commands = buffer[..n]
                    .split(|&byte| byte == b'\n')
                    .filter(|line| line.starts_with(b"*"))
                    .count()
                    .max(1);
                for _ in 0..commands {
                    let _ = stream.write_all(reply);
                }
            }
        }
    });
    port
}

#[tokio::test]
async fn an_explicit_client_that_cannot_connect_says_refused_and_is_unavailable() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let error = LockClient::connect(&url)
        .await
        .expect_err("nothing listens");
    assert!(matches!(error, LockError::Connect { .. }), "{error:?}");
    assert!(error.redis_error().is_some());
    assert_says(
        &error,
        "unavailable",
        "",
        &[&url, "refused", "check that Redis runs at that address"],
    );
}

#[tokio::test]
async fn a_redis_older_than_6_is_misconfigured_and_says_which_version_is_needed() {
    // What Redis 5 answers to the RESP3 handshake.
    let url = format!(
        "redis://127.0.0.1:{}/",
        answering_server(b"-ERR unknown command `HELLO`, with args beginning with: `3`, \r\n")
    );
    let error = LockClient::connect(&url).await.expect_err("too old");
    assert!(matches!(error, LockError::NotRedis { .. }), "{error:?}");
    assert_says(
        &error,
        "misconfigured",
        "",
        &[
            &format!("cannot connect to Redis at {url}: the server there is older than Redis 6"),
            "redlock needs Redis 6 or newer",
            "doesn't support HELLO",
        ],
    );
}

#[tokio::test]
async fn a_port_that_speaks_http_is_misconfigured_not_unavailable() {
    let url = format!("redis://127.0.0.1:{}/", http_server());
    let error = LockClient::connect(&url).await.expect_err("not Redis");
    assert!(matches!(error, LockError::NotRedis { .. }), "{error:?}");
    assert_says(
        &error,
        "misconfigured",
        "",
        &[
            &format!(
                "cannot connect to Redis at {url}: the server there does not speak the Redis protocol (an HTTP server? check the port): "
            ),
            // The cause, cut short: what redis-rs could not parse.
            "Unexpected",
        ],
    );
}

#[tokio::test]
async fn timeouts_lost_locks_and_a_failing_redis_say_why_on_one_line() {
    let mut server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.expect("connect");
    let guard = client
        .lock("order:1")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("lock");

    // Busy: the wait, to the millisecond.
    let error = client
        .lock("order:1")
        .wait(Duration::from_millis(150))
        .acquire()
        .await
        .expect_err("held");
    assert_says(&error, "busy", "order:1", &["held by another owner"]);
    let shown = error.to_string();
    let waited = shown.rsplit("wait of ").next().expect("the wait");
    let number = waited
        .strip_suffix("ms")
        .or_else(|| waited.strip_suffix('s'))
        .expect("a unit");
    let decimals = number.split('.').nth(1).map_or(0, str::len);
    assert!(decimals <= 3, "not to the millisecond: {shown}");

    // Lost: the key deleted under the holder.
    assert_eq!(server.cli(&["DEL", "order:1"]), "1");
    let error = guard.release().await.expect_err("gone");
    assert_says(
        &error,
        "lost",
        "order:1",
        &["fencing token", "longer lease"],
    );

    // Redis gone under a connected client: the cause that redis-rs reported.
    server.kill();
    let error = client
        .lock("order:2")
        .wait(Duration::from_millis(500))
        .acquire()
        .await
        .expect_err("Redis is gone");
    assert!(matches!(error, LockError::Redis { .. }), "{error:?}");
    let cause = error.redis_error().expect("the Redis error").to_string();
    assert_says(
        &error,
        "unavailable",
        "order:2",
        &["Redis failed: ", cause.split_whitespace().next().unwrap()],
    );
}

#[tokio::test]
async fn too_few_masters_or_replicas_are_unavailable_and_say_where_to_look() {
    let mut masters: Vec<_> = (0..3)
        .map(|_| RedisServer::start_redlock_master())
        .collect();
    let spec = masters.iter().map(RedisServer::url).collect::<Vec<_>>();
    let redlock = LockClient::builder_from_spec(&spec.join(","))
        .connect()
        .await
        .expect("connect");
    masters[0].kill();
    masters[1].kill();
    let error = redlock
        .lock("order:3")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .expect_err("one master of three");
    assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    assert_says(
        &error,
        "unavailable",
        "order:3",
        &["only 1 of the 2", "max_lease"],
    );

    let confirming = LockClient::builder(&masters[2].url())
        .confirm_replicas(1, Duration::from_millis(100))
        .connect()
        .await
        .expect("connect");
    let error = confirming
        .lock("order:4")
        .acquire()
        .await
        .expect_err("no replica");
    assert!(
        matches!(error, LockError::NotReplicated { .. }),
        "{error:?}"
    );
    assert_says(
        &error,
        "unavailable",
        "order:4",
        &["only 0 of the 1 required replicas", "confirm_replicas"],
    );
}

#[tokio::test]
async fn masters_sitting_out_are_named_with_their_time_and_a_used_one_refuses_a_vouch() {
    // Masters redlock never used sit out max_lease: the error names each, and for how
    // long, and says how a new deployment ends it.
    let masters: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let redlock = LockClient::builder_for(&urls)
        .connect()
        .await
        .expect("connect");
    let error = redlock
        .lock("order:5")
        .acquire()
        .await
        .expect_err("blank masters sit out");
    assert!(matches!(error, LockError::NoQuorum { .. }), "{error:?}");
    let mut needles = vec![
        "only 0 of the 2".to_owned(),
        "sitting out max_lease as restarted or new:".to_owned(),
        "`redlock vouch`".to_owned(),
    ];
    // The default max_lease, 60 s, rounded up; named in the order given.
    needles.push(format!(
        "{} for 60s more, {} for 60s more, {} for 60s more (",
        urls[0], urls[1], urls[2]
    ));
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    assert_says(&error, "unavailable", "order:5", &needles);

    // A vouch for masters one of which holds a lock: misconfigured, naming the master
    // and the lock's key.
    let fresh: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    let owner = format!("{}:7", "ab12".repeat(8));
    fresh[0].cli(&[
        "SET",
        "order:6",
        &format!("{owner} 1795404822378057 1795404822378 billing-7"),
        "PX",
        "60000",
    ]);
    let client = LockClient::builder_for(fresh.iter().map(RedisServer::url))
        .connect()
        .await
        .expect("connect");
    let error = client.vouch_for_blank_masters().await.expect_err("in use");
    assert!(matches!(error, LockError::NotBlank { .. }), "{error:?}");
    assert_says(
        &error,
        "misconfigured",
        "order:6",
        &[
            &format!(
                "cannot vouch for the RedLock master {}: it holds `order:6`, a lock;",
                fresh[0].url()
            ),
            "sit out max_lease",
        ],
    );
}

// ---- The default client, in child processes -------------------------------------

#[distributed_lock(key = "order:<id>", wait = "1s", lease = "10s")]
async fn pay_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

/// In a child process: the annotated call fails as the parent expects.
#[test]
fn in_the_child_the_default_client_says_why() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let expected_class = std::env::var(EXPECT_CLASS).expect("the class");
    let needles = std::env::var(EXPECT_TEXT).expect("the texts");
    let needles: Vec<&str> = needles.split('|').collect();
    let error = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(pay_order(1))
        .expect_err("no default client can connect");
    assert_says(&error, &expected_class, "order:1", &needles);
    match expected_class.as_str() {
        "unavailable" => assert!(matches!(error, LockError::Redis { .. }), "{error:?}"),
        _ => assert!(
            matches!(error, LockError::NoDefaultClient { .. }),
            "{error:?}"
        ),
    }
}

/// Runs the default client's call in a child process with `REDLOCK_URL` set to
/// `url`; the child checks that its error is in `class` and contains `needles`.
fn default_client_call(url: &str, class: &str, needles: &[&str]) {
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "in_the_child_the_default_client_says_why",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("REDLOCK_URL", url)
        .env(EXPECT_CLASS, class)
        .env(EXPECT_TEXT, needles.join("|"))
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child (REDLOCK_URL={url}) failed:\n{stdout}\n{stderr}"
    );
    println!("{stdout}");
}

#[test]
fn the_default_client_names_redlock_url_the_cause_and_the_fix_when_redis_is_down() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    default_client_call(
        &url,
        "unavailable",
        &[
            &format!("lock `order:1`: the default client cannot connect to REDLOCK_URL={url}: "),
            "refused",
            "start Redis there, correct REDLOCK_URL, or call redlock_runtime::set_default_client at startup",
        ],
    );
}

#[test]
fn a_malformed_redlock_url_is_no_default_client_not_unavailable() {
    for (url, why) in [
        ("http://127.0.0.1:1/", "not a Redis URL"),
        ("redis//127.0.0.1:1/", "not a Redis URL"),
        ("sentinel:redis://127.0.0.1:1/", "names no Sentinel service"),
    ] {
        default_client_call(
            url,
            "misconfigured",
            &[
                &format!("REDLOCK_URL={url} cannot be used"),
                why,
                "expected `redis://",
                "correct REDLOCK_URL, or call redlock_runtime::set_default_client",
            ],
        );
    }
}

#[test]
fn refused_credentials_on_the_default_client_are_misconfigured() {
    let server = RedisServer::start();
    assert_eq!(
        server.cli(&["CONFIG", "SET", "requirepass", "right-pw"]),
        "OK"
    );
    let url = format!("redis://:wrong-pw@127.0.0.1:{}/", server.port());
    default_client_call(
        &url,
        "misconfigured",
        &[
            "refused the credentials",
            "WRONGPASS",
            "check the user and password",
            "set_default_client",
            // The server is named once, by the refusal, not again by the spec.
            "and REDLOCK_URL cannot be used: Redis at redis://***@127.0.0.1:",
        ],
    );
}

#[tokio::test]
async fn an_error_reply_a_retry_gets_again_is_misconfigured_not_unavailable() {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let mut data = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // The application keeps a string where the fenced resource (a hash) should be.
    assert_eq!(server.cli(&["SET", "job-state:7", "done"]), "OK");
    let guard = client.lock("job:7").acquire().await.unwrap();
    let error = redlock_runtime::FencedKey::new("job-state:7")
        .write(&mut data, guard.fencing_token(), &[("state", "done")])
        .await
        .unwrap_err();
    assert_says(&error, "misconfigured", "job-state:7", &["WRONGTYPE"]);
    guard.release().await.unwrap();
}

#[test]
fn a_tls_failure_on_the_default_client_is_misconfigured() {
    // TLS to a port that answers in plain text.
    let url = format!("rediss://127.0.0.1:{}/", http_server());
    default_client_call(
        &url,
        "misconfigured",
        &[
            &format!("REDLOCK_URL cannot be used: TLS with Redis at {url} failed"),
            "corrupt message",
            "tls_root_certificate",
        ],
    );
}

#[test]
fn a_default_client_at_an_http_port_is_misconfigured() {
    let url = format!("redis://127.0.0.1:{}/", http_server());
    default_client_call(
        &url,
        "misconfigured",
        &[
            &format!("REDLOCK_URL cannot be used: cannot connect to Redis at {url}: "),
            "does not speak the Redis protocol (an HTTP server? check the port)",
            "correct REDLOCK_URL",
        ],
    );
}

// ---- What `#[tracing::instrument(err)]` logs --------------------------------------

#[distributed_lock(key = "job:<id>", client = locks, wait = "500ms", lease = "10s")]
#[tracing::instrument(err, skip(locks))]
async fn instrumented_job(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

/// Collects what the `fmt` subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn an_instrumented_function_logs_the_cause_of_a_lock_error() {
    let mut server = RedisServer::start();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _default = common::on_this_thread(subscriber);
    let error = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let client = LockClient::connect(&server.url()).await.expect("connect");
            server.kill();
            instrumented_job(&client, 7)
                .await
                .expect_err("Redis is gone")
        });
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = logged
        .lines()
        .find(|line| line.contains("ERROR") && line.contains("instrumented_job"))
        .unwrap_or_else(|| panic!("no error line: {logged}"));
    println!("{line}");
    let cause = error.redis_error().expect("the Redis error").to_string();
    assert!(line.contains(&error.to_string()), "{line}");
    assert!(
        line.contains(cause.split_whitespace().next().unwrap()),
        "the cause {cause:?} is not in the logged line: {line}"
    );
}
