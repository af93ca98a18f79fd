//! Issue 36: can a reply on a cluster connection be handed to another request?
//!
//! Once, during a cluster failover, `Script::load_async` got the SHA1 of another of our
//! scripts. These tests send, on one `ClusterConnection` set up as redlock sets it up
//! (RESP3, a push sender, sharded subscriptions), requests whose right reply is known in
//! advance and differs from request to request, while the cluster fails over again and
//! again, and count every reply that is not the one of its request.
//!
//! The mechanism found (redis 1.8.1, Redis 7.0): when a node gives up a slot (the old
//! master after a failover, the source at the end of a slot migration) Redis unsubscribes
//! its clients from the slot's shard channels and tells each with a `sunsubscribe` push
//! that no command asked for (`clusterDelSlot` → `removeChannelsInSlot`, cluster.c). The
//! multiplexed connection takes every `sunsubscribe` push for the reply to the oldest
//! request in flight (`PushKind::has_reply`, types.rs:373, used by `PipelineSink::
//! send_result`, aio/multiplexed_connection.rs:253-276 and 333): that request gets the
//! push, the next one gets its reply, and so on — every later reply on that node
//! connection is one request late until a reply comes with nothing in flight (it is
//! dropped) or the connection is closed. It needs no help from redlock's code: these
//! tests use the redis crate alone. The second test shows it on one cluster-enabled
//! server, without failover, every time (so does repro/crossed-reply, standalone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use redlock_testkit::{RedisCluster, RedisServer};
use tokio::sync::mpsc;

/// How long the failover scenario keeps failing masters over (then it stops, and the
/// test ends within a few seconds).
const FAILING_OVER_FOR: Duration = Duration::from_secs(60);
/// Concurrent tasks sending requests on the one cluster connection.
const WORKERS: usize = 6;
/// Sharded channels the connection subscribes to (spread over the three shards).
const CHANNELS: usize = 24;
/// Distinct scripts each worker loads in turn (each has its own SHA1).
const SCRIPTS_PER_WORKER: usize = 16;

/// What the requests got back.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    right: AtomicU64,
    /// Errors (MOVED, CLUSTERDOWN, timeouts… while failing over): not crossed replies,
    /// but counted so that the test says how much of the load went through.
    errors: AtomicU64,
    crossed: AtomicU64,
    /// The first few crossed replies: what was asked, what came back.
    samples: Mutex<Vec<String>>,
    error_kinds: Mutex<HashMap<String, u64>>,
}

impl Tally {
    fn check(&self, request: &str, expected: &[u8], reply: redis::RedisResult<Value>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match reply {
            Ok(Value::BulkString(bytes)) if bytes == expected => {
                self.right.fetch_add(1, Ordering::Relaxed);
            }
            Ok(other) => {
                self.crossed.fetch_add(1, Ordering::Relaxed);
                let mut samples = self.samples.lock().unwrap();
                if samples.len() < 12 {
                    samples.push(format!(
                        "{request}: expected {:?}, got {other:?}",
                        String::from_utf8_lossy(expected)
                    ));
                }
            }
            Err(error) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                let kind = format!("{:?}", error.kind());
                *self.error_kinds.lock().unwrap().entry(kind).or_default() += 1;
            }
        }
    }
}

/// A cluster client as redlock's `connect::cluster` builds it: RESP3, pushes to a
/// channel, the same retries and timeouts.
async fn connect(cluster: &RedisCluster) -> (ClusterConnection, mpsc::UnboundedReceiver<PushInfo>) {
    let (pushes, received) = mpsc::unbounded_channel();
    let client = ClusterClientBuilder::new(cluster.urls())
        .use_protocol(ProtocolVersion::RESP3)
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(2))
        .retries(2)
        .push_sender(pushes)
        .build()
        .expect("a cluster client");
    let connection = client
        .get_async_connection()
        .await
        .expect("connect to the cluster");
    (connection, received)
}

fn channel(index: usize) -> String {
    format!("crossed:{{{index}}}")
}

/// Subscribes to `channel`, trying again while the cluster fails over.
async fn subscribe(mut connection: ClusterConnection, channel: String, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(Duration::from_secs(5), connection.ssubscribe(&channel)).await {
            Ok(Ok(())) => return,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Reads the pushes; subscribes again to a channel Redis unsubscribed the connection
/// from (as redlock's `notify::on_push` → `subscription_dropped` does).
async fn follow_pushes(
    connection: ClusterConnection,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    stop: Arc<AtomicBool>,
    unsubscribed: Arc<AtomicU64>,
) {
    while let Some(push) = pushes.recv().await {
        if push.kind == PushKind::SUnsubscribe {
            unsubscribed.fetch_add(1, Ordering::Relaxed);
            if let Some(Value::BulkString(name)) = push.data.first() {
                let name = String::from_utf8_lossy(name).into_owned();
                tokio::spawn(subscribe(connection.clone(), name, stop.clone()));
            }
        }
    }
}

/// One request whose reply must be `expected` (a bulk string).
async fn ask(
    connection: &mut ClusterConnection,
    tally: &Tally,
    description: String,
    command: redis::Cmd,
    expected: Vec<u8>,
) {
    let reply = match tokio::time::timeout(
        Duration::from_secs(10),
        command.query_async::<Value>(connection),
    )
    .await
    {
        Ok(reply) => reply,
        Err(_) => Err(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        ))),
    };
    tally.check(&description, &expected, reply);
}

/// Sends, until `stop`, rounds of concurrent requests with known, distinct replies:
/// SCRIPT LOADs of distinct scripts (to every node, as `Script::load_async` does), ECHO
/// and `EVAL "return ARGV[1]"` with and without a key.
async fn work(
    worker: usize,
    connection: ClusterConnection,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let scripts: Vec<(String, String)> = (0..SCRIPTS_PER_WORKER)
        .map(|index| {
            let source = format!("return 'crossed-replies {worker} {index}'");
            let sha = redis::Script::new(&source).get_hash().to_owned();
            (source, sha)
        })
        .collect();
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let mut requests = Vec::new();
        for load in 0..4 {
            let (source, sha) = scripts[(round * 4 + load) % SCRIPTS_PER_WORKER].clone();
            let mut command = redis::cmd("SCRIPT");
            command.arg("LOAD").arg(&source);
            requests.push((format!("SCRIPT LOAD {source:?}"), command, sha.into_bytes()));
        }
        let unique = format!("w{worker}-r{round}");
        let mut command = redis::cmd("ECHO");
        command.arg(format!("echo {unique}"));
        requests.push((
            format!("ECHO {unique}"),
            command,
            format!("echo {unique}").into_bytes(),
        ));
        let key = format!("crossed:{{{}}}", round % 50);
        let mut command = redis::cmd("EVAL");
        command
            .arg("return ARGV[1]")
            .arg(1)
            .arg(&key)
            .arg(format!("keyed {unique}"));
        requests.push((
            format!("EVAL keyed {unique} ({key})"),
            command,
            format!("keyed {unique}").into_bytes(),
        ));
        let mut command = redis::cmd("EVAL");
        command
            .arg("return ARGV[1]")
            .arg(0)
            .arg(format!("keyless {unique}"));
        requests.push((
            format!("EVAL keyless {unique}"),
            command,
            format!("keyless {unique}").into_bytes(),
        ));
        let futures = requests
            .into_iter()
            .map(|(description, command, expected)| {
                let mut connection = connection.clone();
                let tally = tally.clone();
                async move { ask(&mut connection, &tally, description, command, expected).await }
            });
        futures_join_all(futures).await;
        round += 1;
    }
}

/// `join_all` without a dependency on `futures`: spawn each and wait for all.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    for handle in handles {
        handle.await.expect("a request task panicked");
    }
}

/// The shards as (master, replica) indexes into `cluster.nodes`.
fn shards(cluster: &RedisCluster) -> Vec<(usize, usize)> {
    let port_index: HashMap<String, usize> = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| (node.port().to_string(), index))
        .collect();
    cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, node)| node.info_field("replication", "role").as_deref() == Some("slave"))
        .map(|(replica, node)| {
            let master_port = node
                .info_field("replication", "master_port")
                .expect("a replica names its master");
            (port_index[&master_port], replica)
        })
        .collect()
}

/// A manual `CLUSTER FAILOVER` of `master` to `replica` (both alive: the old master
/// becomes a replica of the new one); returns once every node agrees and the old master
/// replicates again, with whether it took a `TAKEOVER`: the masters refuse to vote
/// again about the same master within twice the node timeout (cluster.c:3396), so a
/// quick succession of failovers is sometimes not elected.
fn fail_over(cluster: &RedisCluster, master: usize, replica: usize) -> bool {
    let replica_address = format!("127.0.0.1:{}", cluster.nodes[replica].port());
    let master_port = cluster.nodes[replica].port().to_string();
    for (attempt, how, limit) in [(0, None, 4), (1, Some("TAKEOVER"), 10)] {
        let mut command = vec!["CLUSTER", "FAILOVER"];
        command.extend(how);
        assert_eq!(cluster.nodes[replica].cli(&command), "OK", "{command:?}");
        let deadline = Instant::now() + Duration::from_secs(limit);
        while Instant::now() < deadline {
            let switched = cluster.nodes[replica]
                .info_field("replication", "role")
                .as_deref()
                == Some("master")
                && cluster.nodes[master]
                    .info_field("replication", "master_port")
                    .as_ref()
                    == Some(&master_port)
                && cluster.nodes[master]
                    .info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("up")
                && cluster.nodes.iter().all(|node| {
                    node.cli(&["CLUSTER", "NODES"])
                        .lines()
                        .any(|line| line.contains(&replica_address) && line.contains("master"))
                        && node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                });
            if switched {
                return attempt > 0;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let disagreeing: Vec<usize> = (0..cluster.nodes.len())
            .filter(|&index| {
                !cluster.nodes[index]
                    .cli(&["CLUSTER", "NODES"])
                    .lines()
                    .any(|line| line.contains(&replica_address) && line.contains("master"))
            })
            .collect();
        eprintln!(
            "failover of node {master} to node {replica}: attempt {attempt} timed out \
             (node {replica} role {:?}; node {master} replicates port {:?}, link {:?}; \
             nodes not seeing node {replica} as master: {disagreeing:?})",
            cluster.nodes[replica].info_field("replication", "role"),
            cluster.nodes[master].info_field("replication", "master_port"),
            cluster.nodes[master].info_field("replication", "master_link_status"),
        );
    }
    panic!("node {replica} never took over from node {master}");
}

/// The scenario of issue 36, many times: manual failovers of every shard in turn while
/// six tasks send SCRIPT LOADs, ECHOs and EVALs on one RESP3 cluster connection that
/// holds sharded subscriptions. Every reply must be its own request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reply_is_handed_to_another_request_across_cluster_failovers() {
    let cluster = Arc::new(RedisCluster::start_with_replicas(3, 1));
    let mut shards = shards(&cluster);
    assert_eq!(shards.len(), 3, "three masters with a replica each");
    let (connection, pushes) = connect(&cluster).await;
    let stop = Arc::new(AtomicBool::new(false));
    let unsubscribed = Arc::new(AtomicU64::new(0));
    for index in 0..CHANNELS {
        subscribe(connection.clone(), channel(index), stop.clone()).await;
    }
    tokio::spawn(follow_pushes(
        connection.clone(),
        pushes,
        stop.clone(),
        unsubscribed.clone(),
    ));
    let tally = Arc::new(Tally::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            tokio::spawn(work(
                worker,
                connection.clone(),
                tally.clone(),
                stop.clone(),
            ))
        })
        .collect();

    let started = Instant::now();
    let mut failovers = 0usize;
    let mut takeovers = 0usize;
    let mut first_crossed_after = None;
    while started.elapsed() < FAILING_OVER_FOR {
        let shard = failovers % shards.len();
        let (master, replica) = shards[shard];
        let for_the_step = cluster.clone();
        if tokio::task::spawn_blocking(move || fail_over(&for_the_step, master, replica))
            .await
            .expect("the failover step failed")
        {
            takeovers += 1;
        }
        shards[shard] = (replica, master);
        failovers += 1;
        if first_crossed_after.is_none() && tally.crossed.load(Ordering::Relaxed) > 0 {
            first_crossed_after = Some(failovers);
        }
        // Requests run between failovers too.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A last stretch of requests after the last failover.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("a worker panicked");
    }

    let crossed = tally.crossed.load(Ordering::Relaxed);
    println!(
        "{failovers} failovers ({takeovers} by TAKEOVER) in {:.1} s; {} requests: {} right, {} crossed, {} errors {:?}; \
         {} sunsubscribe pushes from the servers; first crossed reply by failover {:?}",
        started.elapsed().as_secs_f64(),
        tally.requests.load(Ordering::Relaxed),
        tally.right.load(Ordering::Relaxed),
        crossed,
        tally.errors.load(Ordering::Relaxed),
        tally.error_kinds.lock().unwrap(),
        unsubscribed.load(Ordering::Relaxed),
        first_crossed_after,
    );
    assert!(
        tally.requests.load(Ordering::Relaxed) > 1000,
        "too few requests to tell"
    );
    assert_eq!(
        crossed,
        0,
        "replies handed to other requests, e.g.:\n{}",
        tally.samples.lock().unwrap().join("\n")
    );
}

/// The mechanism in isolation, on one cluster-enabled server and a plain
/// `MultiplexedConnection` (RESP3, push sender): the connection subscribes to a shard
/// channel, has a `WAIT` in flight (blocked for 1 s: no replica), and the server drops
/// the channel's slot (`CLUSTER DELSLOTS`, as a failover or migration does) meanwhile.
/// The `sunsubscribe` push Redis then sends must not answer the `WAIT`, and the ECHOs
/// sent next must get their own replies (with redis 1.8.1 WAIT gets the push, the first
/// ECHO gets WAIT's 0, the second the first's reply…).
#[tokio::test]
async fn a_sunsubscribe_the_server_sends_by_itself_is_no_reply() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    assert_eq!(
        server.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        "OK"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .cli(&["CLUSTER", "INFO"])
        .contains("cluster_state:ok")
    {
        assert!(Instant::now() < deadline, "the cluster never became ok");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (pushes, mut received) = mpsc::unbounded_channel();
    let client = redis::Client::open(format!("{}?protocol=resp3", server.url())).unwrap();
    let config = redis::AsyncConnectionConfig::new()
        .set_push_sender(pushes)
        .set_response_timeout(Some(Duration::from_secs(5)));
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let channel = "wake:{lock}";
    redis::cmd("SSUBSCRIBE")
        .arg(channel)
        .exec_async(&mut connection)
        .await
        .unwrap();
    let slot = server.cli(&["CLUSTER", "KEYSLOT", channel]);

    let mut blocked = connection.clone();
    let wait = tokio::spawn(async move {
        redis::cmd("WAIT")
            .arg(1)
            .arg(1000)
            .query_async::<Value>(&mut blocked)
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.cli(&["CLUSTER", "DELSLOTS", &slot]), "OK");
    let wait_reply = wait.await.unwrap();
    // Sent together, in flight when WAIT's own reply comes.
    let echoes: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|word| {
            let mut connection = connection.clone();
            tokio::spawn(async move {
                redis::cmd("ECHO")
                    .arg(word)
                    .query_async::<Value>(&mut connection)
                    .await
            })
        })
        .collect();
    let mut echo_replies = Vec::new();
    for echo in echoes {
        echo_replies.push(echo.await.unwrap().ok());
    }
    let mut kinds = Vec::new();
    while let Ok(push) = received.try_recv() {
        kinds.push(push.kind);
    }
    assert!(
        kinds.contains(&PushKind::SUnsubscribe),
        "Redis sent no sunsubscribe: {kinds:?}"
    );
    assert_eq!(
        wait_reply.as_ref().ok(),
        Some(&Value::Int(0)),
        "WAIT's reply (the sunsubscribe push was taken for it?)"
    );
    assert_eq!(
        echo_replies,
        ["a", "b", "c"].map(|word| Some(Value::BulkString(word.into()))),
        "the ECHOs' replies (each one request late?)"
    );
}
