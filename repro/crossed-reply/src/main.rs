//! redis-rs 1.8.1: a `sunsubscribe` push that Redis sends by itself (the slot of a shard
//! channel left the node: failover, end of a slot migration, CLUSTER DELSLOTS) is taken
//! for the reply to the oldest request in flight on a RESP3 `MultiplexedConnection`;
//! from then on every reply goes to the request sent before its own.
//!
//! Starts its own cluster-enabled `redis-server` on a free 127.0.0.1 port (one node
//! that holds every slot), and kills it at the end.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::{PushKind, Value};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> (Server, u16, std::path::PathBuf) {
    let port = loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port != 6379 && port < 55000 {
            break port; // cluster mode also binds port + 10000
        }
    };
    let dir = std::env::temp_dir().join(format!("crossed-reply-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(std::env::var("REDIS_SERVER").unwrap_or("redis-server".into()))
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--cluster-enabled", "yes"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("start redis-server");
    (Server(child), port, dir)
}

#[tokio::main]
async fn main() -> redis::RedisResult<()> {
    let (server, port, dir) = start_server();
    let url = format!("redis://127.0.0.1:{port}/");

    // The admin connection (plain, RESP2) gives the node every slot.
    let admin_client = redis::Client::open(url.as_str())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut admin = loop {
        match admin_client.get_multiplexed_async_connection().await {
            Ok(connection) => break connection,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => return Err(error),
        }
    };
    redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .exec_async(&mut admin)
        .await?;
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut admin)
            .await?;
        if info.contains("cluster_state:ok") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The connection under test: RESP3, with a push sender, subscribed to a shard channel.
    let (pushes, mut received) = tokio::sync::mpsc::unbounded_channel();
    let client = redis::Client::open(format!("{url}?protocol=resp3"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_push_sender(pushes)
        .set_response_timeout(Some(Duration::from_secs(5)));
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let channel = "wake:{lock}";
    redis::cmd("SSUBSCRIBE")
        .arg(channel)
        .exec_async(&mut connection)
        .await?;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(channel)
        .query_async(&mut admin)
        .await?;

    // A request in flight: WAIT blocks for 1 s (there is no replica) and then answers 0.
    let mut blocked = connection.clone();
    let wait = tokio::spawn(async move {
        let sent = Instant::now();
        let reply = redis::cmd("WAIT")
            .arg(1)
            .arg(1000)
            .query_async::<Value>(&mut blocked)
            .await;
        (reply, sent.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Meanwhile the node gives the channel's slot up, as an old master does after a
    // failover: Redis unsubscribes the connection and sends it `sunsubscribe`.
    redis::cmd("CLUSTER")
        .arg("DELSLOTS")
        .arg(slot)
        .exec_async(&mut admin)
        .await?;

    let (wait_reply, waited) = wait.await.unwrap();
    println!(
        "WAIT 1 1000      -> {wait_reply:?} after {waited:?}   (expected Ok(Int(0)) after ~1 s)"
    );
    // Three requests sent together, in flight when WAIT's own reply comes.
    let mut echoes = Vec::new();
    for word in ["a", "b", "c"] {
        let mut connection = connection.clone();
        echoes.push(tokio::spawn(async move {
            redis::cmd("ECHO")
                .arg(word)
                .query_async::<Value>(&mut connection)
                .await
        }));
    }
    let mut echo_replies = Vec::new();
    for (word, echo) in ["a", "b", "c"].into_iter().zip(echoes) {
        let reply = echo.await.unwrap();
        println!("ECHO {word}           -> {reply:?}   (expected Ok(BulkString(\"{word}\")))");
        echo_replies.push(reply);
    }
    let mut kinds = Vec::new();
    while let Ok(push) = received.try_recv() {
        kinds.push(push.kind);
    }
    println!("pushes received  -> {kinds:?}");

    let crossed = !matches!(wait_reply, Ok(Value::Int(0)))
        || echo_replies
            .iter()
            .zip(["a", "b", "c"])
            .any(|(reply, word)| reply.as_ref().ok() != Some(&Value::BulkString(word.into())));
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
    if crossed && kinds.contains(&PushKind::SUnsubscribe) {
        println!(
            "REPRODUCED: the unsolicited sunsubscribe push answered WAIT; each ECHO got the reply of the request before it"
        );
        std::process::exit(1);
    }
    println!("not reproduced: every request got its own reply");
    Ok(())
}
