//! The connection to one lock service: a single server (or a RedLock master), or a
//! Redis Cluster; and where each lock's companion keys and channel live on it.

use std::borrow::Cow;
#[cfg(feature = "cluster")]
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, ToRedisArgs, Value};
use tokio::time::Instant;

use crate::scripts;
#[cfg(feature = "sentinel")]
use crate::sentinel::SentinelConnection;

/// One multiplexed connection; both kinds reconnect (and resubscribe) by themselves.
#[derive(Clone)]
pub(crate) enum Connection {
    Server(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let reply = self.send(cmd).await;
            // `NOSCRIPT`: the script did not run. It is sent again at once with its source
            // (`EVAL`), to the node that owns its key. redis-rs would load it with `SCRIPT
            // LOAD` and send the `EVALSHA` again, but on a Cluster that load goes to the
            // masters of the client's slot map, which a failover has just made stale: the
            // promoted replica, which has no script, answered `NOSCRIPT` a second time,
            // and a release failed (tests/crossed_replies.rs, on Valkey). Elsewhere another
            // task's command could run between the load and the resend.
            if is_no_script(&reply)
                && let Some(eval) = as_eval(cmd)
            {
                tracing::debug!(
                    "redlock: a script was missing on the server; sent with its source"
                );
                return in_step(self.send(&eval).await?);
            }
            in_step(reply?)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let replies = match self {
            Connection::Server(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        };
        Box::pin(async move {
            let replies = replies.await?;
            for reply in &replies {
                if let Value::Push { kind, data } = reply {
                    return Err(out_of_step(kind, data));
                }
            }
            Ok(replies)
        })
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Server(connection) => connection.get_db(),
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => connection.get_db(),
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(connection) => connection.get_db(),
        }
    }
}

impl Connection {
    /// Sends one command as it is.
    fn send<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Server(connection) => connection.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(connection) => connection.req_packed_command(cmd),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        return matches!(self, Connection::Cluster(_));
        #[cfg(not(feature = "cluster"))]
        false
    }

    /// SUBSCRIBE, or SSUBSCRIBE (sharded, to the key's own shard) on a cluster.
    pub(crate) async fn subscribe(&mut self, channel: impl ToRedisArgs) -> RedisResult<()> {
        match self {
            Connection::Server(connection) => connection.subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => connection.ssubscribe(channel).await,
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(connection) => connection.current().1.subscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: impl ToRedisArgs) -> RedisResult<()> {
        match self {
            Connection::Server(connection) => connection.unsubscribe(channel).await,
            #[cfg(feature = "cluster")]
            Connection::Cluster(connection) => connection.sunsubscribe(channel).await,
            #[cfg(feature = "sentinel")]
            Connection::Sentinel(connection) => connection.current().1.unsubscribe(channel).await,
        }
    }

    /// On a cluster, the hash tag that puts a lock's companion keys and channel in the
    /// lock key's slot (a script may only touch one slot); nothing elsewhere.
    fn slot_tag_for(&self, key: &str) -> Option<&'static str> {
        match self {
            #[cfg(feature = "cluster")]
            Connection::Cluster(_) => Some(slot_tag(slot_of(key.as_bytes()))),
            _ => {
                let _ = key;
                None
            }
        }
    }

    /// Whether one script may touch every one of `keys` here: always on one server, on
    /// a cluster only when they all hash to one slot (`{tag}` keys).
    pub(crate) fn in_one_slot(&self, keys: &[String]) -> bool {
        match keys.split_first() {
            Some((first, rest)) if self.is_cluster() => {
                let slot = slot_of(first.as_bytes());
                rest.iter().all(|key| slot_of(key.as_bytes()) == slot)
            }
            _ => true,
        }
    }

    /// The fencing counter a lock on `key` uses.
    ///
    /// On one server: one counter for every lock. On a cluster the counter must share
    /// the lock key's slot, so there is one counter per slot — at most 16384 keys,
    /// however many lock names are used — named with a hash tag chosen to land in that
    /// slot.
    pub(crate) fn fence_key(&self, key: &str) -> Cow<'static, str> {
        match self.slot_tag_for(key) {
            None => Cow::Borrowed(scripts::FENCE_KEY),
            Some(tag) => Cow::Owned(format!("{}:{{{tag}}}", scripts::FENCE_KEY)),
        }
    }

    /// The channel a release of `key` is published on (in the key's slot on a cluster).
    pub(crate) fn release_channel(&self, key: &str) -> String {
        self.companion(scripts::RELEASE_CHANNEL_PREFIX, key)
    }

    /// The channel on which releases grant `key` to a waiter of the client whose id
    /// (the hex digits its owner tokens start with) is `client` (see
    /// `scripts::GRANT_CHANNEL_PREFIX`; in the key's slot on a cluster).
    pub(crate) fn grant_channel(&self, key: &str, client: &str) -> String {
        let prefix = format!("{}{client}:", scripts::GRANT_CHANNEL_PREFIX);
        self.companion(&prefix, key)
    }

    /// The first of [`Self::waitlist_keys`] alone.
    pub(crate) fn waitlist_key(&self, key: &str) -> String {
        self.companion(scripts::WAITLIST_PREFIX, key)
    }

    /// The keys of `key`'s waitlist: arrival order, and expiry of each
    /// registration (in the key's slot on a cluster). They exist only while waiters do.
    pub(crate) fn waitlist_keys(&self, key: &str) -> [String; 2] {
        [
            self.companion(scripts::WAITLIST_PREFIX, key),
            self.companion(scripts::WAITLIST_EXPIRY_PREFIX, key),
        ]
    }

    /// The holders of `key` when it is held in shares (read lock, semaphore): a sorted
    /// set of owner tokens by the end of each one's lease (in the key's slot on a
    /// cluster). It exists only while a share does.
    pub(crate) fn holders_key(&self, key: &str) -> String {
        self.companion(scripts::HOLDERS_PREFIX, key)
    }

    /// The share names of `key` when it is held in shares (see `scripts::NAMES_PREFIX`),
    /// in its slot. It exists only while a share does.
    pub(crate) fn names_key(&self, key: &str) -> String {
        self.companion(scripts::NAMES_PREFIX, key)
    }

    /// The eviction marker of `key` (see `scripts::FORCE_UNLOCK`), in its slot.
    pub(crate) fn forced_key(&self, key: &str) -> String {
        self.companion(scripts::FORCED_PREFIX, key)
    }

    /// A companion key of `key`: `prefix` + `key`, behind `{<slot tag>}` on a cluster
    /// (the same shape `scripts::companion_of` derives in Lua).
    fn companion(&self, prefix: &str, key: &str) -> String {
        companion_key(self.slot_tag_for(key), prefix, key)
    }

    /// The string keys matching `pattern` (SCAN with `TYPE string`, never KEYS: the
    /// server keeps serving between batches), on every primary of a cluster. A key may
    /// appear twice (SCAN's guarantee) or not at all if created meanwhile.
    pub(crate) async fn scan_strings(&self, pattern: &str) -> RedisResult<Vec<String>> {
        match self {
            #[cfg(feature = "cluster")]
            Connection::Cluster(cluster) => {
                let mut found = Vec::new();
                for (host, port) in primaries(cluster.clone()).await? {
                    let cluster = cluster.clone();
                    found.extend(
                        scan_on(pattern, move |cmd| {
                            let mut cluster = cluster.clone();
                            let routing =
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                    host: host.clone(),
                                    port,
                                });
                            async move { cluster.route_command(cmd, routing).await }
                        })
                        .await?,
                    );
                }
                Ok(found)
            }
            _ => {
                let connection = self.clone();
                scan_on(pattern, move |cmd| {
                    let mut connection = connection.clone();
                    async move { cmd.query_async::<Value>(&mut connection).await }
                })
                .await
            }
        }
    }

    /// The command the release script publishes with.
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }
}

/// SCAN to the end on one server, `send` carrying each command.
async fn scan_on<F, Fut>(pattern: &str, mut send: F) -> RedisResult<Vec<String>>
where
    F: FnMut(Cmd) -> Fut,
    Fut: Future<Output = RedisResult<Value>>,
{
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg("string");
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(send(cmd).await?)?;
        // A key that is not UTF-8 cannot be a lock's (the API takes `&str` keys).
        found.extend(
            keys.into_iter()
                .filter_map(|key| String::from_utf8(key).ok()),
        );
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

#[cfg(feature = "cluster")]
/// The addresses of a cluster's primaries (`CLUSTER SLOTS`: each range's first node).
async fn primaries(mut cluster: ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let ranges: Vec<Value> = redis::from_redis_value(
        cluster
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?,
    )?;
    let mut found: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let fields: Vec<Value> = redis::from_redis_value(range)?;
        if let Some(primary) = fields.get(2) {
            let parts: Vec<Value> = redis::from_redis_value_ref(primary)?;
            if let (Some(host), Some(port)) = (parts.first(), parts.get(1)) {
                let node: (String, u16) = (
                    redis::from_redis_value_ref(host)?,
                    redis::from_redis_value_ref(port)?,
                );
                if !found.contains(&node) {
                    found.push(node);
                }
            }
        }
    }
    Ok(found)
}

/// Whether a reply is `NOSCRIPT`, as an error or as a server error value.
fn is_no_script(reply: &RedisResult<Value>) -> bool {
    let no_script = redis::ServerErrorKind::NoScript;
    match reply {
        Err(error) => error.kind() == redis::ErrorKind::Server(no_script),
        Ok(Value::ServerError(error)) => error.kind() == Some(no_script),
        Ok(_) => false,
    }
}

/// `EVALSHA <sha> …` of one of redlock's scripts as `EVAL <source> …`, the same keys and
/// arguments; `None` for any other command.
fn as_eval(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    if !args.next()??.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let source = scripts::source_of(args.next()??)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(source);
    for arg in args {
        eval.arg(arg?);
    }
    Some(eval)
}

/// A command's reply, unless it is a push frame. Subscriptions do not go through
/// [`ConnectionLike`] (see [`Connection::subscribe`]), so no command sent through it
/// is answered by a push: one that is, was handed a frame meant for no request (redis
/// 1.8.1 takes a `sunsubscribe` the server sends by itself for the reply to the oldest
/// command in flight), and every later reply on that connection comes one command late.
/// Its caller gets an error, as for a reply that never came: a lock attempt's outcome
/// is then unknown and cleaned up, never believed.
fn in_step(reply: Value) -> RedisResult<Value> {
    match reply {
        Value::Push { kind, data } => Err(out_of_step(&kind, &data)),
        reply => Ok(reply),
    }
}

/// The error of a reply that belongs to no request (see [`in_step`]).
fn out_of_step(kind: &redis::PushKind, data: &[Value]) -> redis::RedisError {
    tracing::warn!(
        ?kind,
        ?data,
        "redlock: a push frame came back as a command's reply: the connection's replies are out of step"
    );
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "replies out of step: a push frame came back as a command's reply",
        format!("{kind:?} {data:?}"),
    ))
}

/// Whether an error means the key's slot is moving between shards (resharding) or
/// the cluster is re-electing: the same command succeeds a little later.
pub(crate) fn slot_is_moving(error: &redis::RedisError) -> bool {
    error.is_cluster_error()
}

/// Whether an error means the connection was found closed (by the server, or by the
/// kernel after a partition: see `connect::tcp_settings`). The connection
/// manager reconnects on such an error, and a command sent again goes over the new
/// connection. It does not prove the command never left: redis-rs reports a
/// connection that closed while the reply was awaited the same way. So only operations
/// that are harmless to repeat send again on it (see `retrying_moves_and_reconnects`).
pub(crate) fn found_closed(error: &redis::RedisError) -> bool {
    // The redis crate keeps its io::Error private; `source()` reaches it (behind the
    // `Arc` the crate keeps it in).
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<Shared>())
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .is_some_and(|error| {
            matches!(
                error.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::NotConnected
            )
        })
}

/// Runs `operation` again while the key's slot moves, for at most `limit`; never again
/// on a closed connection (see [`retrying_moves_and_reconnects`]).
pub(crate) async fn while_slot_moves<T, F, Fut>(limit: Duration, operation: F) -> RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    retrying(limit, false, operation)
        .await
        .map(|(reply, _)| reply)
}

/// Runs `operation` again while the key's slot moves, for at most `limit`, and once
/// more, within `limit`, if its connection was [found closed](found_closed): so that
/// the first command after a network partition or a server restart (a release, an
/// extension) is not failed merely because it was the one to find the old connection
/// dead.
///
/// Only for operations whose second run can do no harm if the first one ran: a
/// compare-and-delete or compare-and-extend by the caller's own owner token, a read, a
/// waitlist script that acts on a member or grant named by id. Not for a force-unlock,
/// whose second run would evict the holder the first one let in: see
/// [`while_slot_moves`]. A caller for whom a second run's reply means something else
/// than the first's (a release that finds the lock gone: the first may have released
/// it) uses [`retrying_moves_and_resending`], which says whether it sent again.
pub(crate) async fn retrying_moves_and_reconnects<T, F, Fut>(
    limit: Duration,
    operation: F,
) -> RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    retrying_moves_and_resending(limit, operation)
        .await
        .map(|(reply, _)| reply)
}

/// [`retrying_moves_and_reconnects`], with the error of the first send when the reply
/// is the second's: then the first may have run too, its reply lost.
pub(crate) async fn retrying_moves_and_resending<T, F, Fut>(
    limit: Duration,
    operation: F,
) -> RedisResult<(T, Option<redis::RedisError>)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    retrying(limit, true, operation).await
}

/// The one retry loop of the three above: while the slot moves, within `limit`; with
/// `resend_on_closed`, once more on a connection found closed, with that first error.
async fn retrying<T, F, Fut>(
    limit: Duration,
    resend_on_closed: bool,
    mut operation: F,
) -> RedisResult<(T, Option<redis::RedisError>)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(10);
    let mut first_send_failed = None;
    loop {
        match operation().await {
            Err(error) if slot_is_moving(&error) && Instant::now() + pause < deadline => {
                tracing::debug!(%error, "redlock: the key's slot is moving; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(error)
                if resend_on_closed
                    && found_closed(&error)
                    && first_send_failed.is_none()
                    && Instant::now() < deadline =>
            {
                tracing::debug!(%error, "redlock: the connection was closed; sending again on a new one");
                first_send_failed = Some(error);
            }
            other => return other.map(|reply| (reply, first_send_failed)),
        }
    }
}

const SLOTS: u16 = 16384;

/// The cluster slot of a key: CRC16 of its hash tag (the part between the first `{`
/// and the next `}`, when not empty) or of the whole key.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&byte| byte == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&byte| byte == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS
}

#[cfg(feature = "cluster")]
/// A short hash tag for each slot: the first base-36 string found that lands there.
static SLOT_TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags = vec![String::new(); SLOTS as usize];
    let mut missing = SLOTS as usize;
    let mut candidate: u64 = 0;
    while missing > 0 {
        let tag = base36(candidate);
        let slot = slot_of(tag.as_bytes()) as usize;
        if tags[slot].is_empty() {
            tags[slot] = tag;
            missing -= 1;
        }
        candidate += 1;
    }
    tags
});

#[cfg(feature = "cluster")]
fn slot_tag(slot: u16) -> &'static str {
    &SLOT_TAGS[slot as usize]
}

#[cfg(feature = "cluster")]
fn base36(mut number: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut text = Vec::new();
    loop {
        text.push(DIGITS[(number % 36) as usize]);
        number /= 36;
        if number == 0 {
            break;
        }
    }
    text.reverse();
    String::from_utf8(text).unwrap_or_default()
}

/// `prefix` + `key`, behind `{tag}` when there is a slot tag: a companion key shares
/// the lock's slot.
fn companion_key(tag: Option<&str>, prefix: &str, key: &str) -> String {
    match tag {
        None => [prefix, key].concat(),
        Some(tag) => format!("{{{tag}}}{prefix}{key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_answering_a_command_is_an_error_and_any_other_reply_passes() {
        let push = Value::Push {
            kind: redis::PushKind::SUnsubscribe,
            data: vec![
                Value::BulkString(b"redlock:released:{x}k".to_vec()),
                Value::Int(0),
            ],
        };
        let error = in_step(push).expect_err("a push taken for a reply");
        assert!(error.to_string().contains("out of step"), "{error}");
        assert_eq!(in_step(Value::Int(7)).unwrap(), Value::Int(7));
        let array = Value::Array(vec![Value::Int(0), Value::Int(12)]);
        assert_eq!(in_step(array.clone()).unwrap(), array);
    }

    #[tokio::test]
    async fn a_command_sent_again_says_so_and_only_within_its_limit() {
        let closed =
            || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        // The first send finds the connection closed, the second answers: the caller
        // learns its reply is the second's.
        let mut sends = 0;
        let (reply, first) = retrying_moves_and_resending(Duration::from_secs(1), || {
            sends += 1;
            let outcome = if sends == 1 { Err(closed()) } else { Ok(7) };
            async move { outcome }
        })
        .await
        .unwrap();
        assert_eq!((reply, sends), (7, 2));
        assert!(first.is_some_and(|error| found_closed(&error)));
        // Sent again once at most.
        let mut sends = 0;
        let outcome: RedisResult<(i32, _)> =
            retrying_moves_and_resending(Duration::from_secs(1), || {
                sends += 1;
                async { Err(closed()) }
            })
            .await;
        assert!(outcome.is_err());
        assert_eq!(sends, 2);
        // Not again once the limit has passed.
        let mut sends = 0;
        let outcome: RedisResult<(i32, _)> = retrying_moves_and_resending(Duration::ZERO, || {
            sends += 1;
            async { Err(closed()) }
        })
        .await;
        assert!(outcome.is_err());
        assert_eq!(sends, 1);
        // `while_slot_moves` (a force-unlock) never sends again on a closed connection.
        let mut sends = 0;
        let outcome: RedisResult<i32> = while_slot_moves(Duration::from_secs(1), || {
            sends += 1;
            async { Err(closed()) }
        })
        .await;
        assert!(outcome.is_err());
        assert_eq!(sends, 1);
    }

    #[test]
    fn a_connection_found_closed_is_told_from_other_failures() {
        let io = |kind| redis::RedisError::from(std::io::Error::from(kind));
        assert!(found_closed(&io(std::io::ErrorKind::BrokenPipe)));
        assert!(found_closed(&io(std::io::ErrorKind::NotConnected)));
        // Neither is a connection found closed: the kernel or the server ended it mid-call.
        assert!(!found_closed(&io(std::io::ErrorKind::ConnectionReset)));
        assert!(!found_closed(&io(std::io::ErrorKind::TimedOut)));
    }

    #[test]
    fn a_companion_key_shares_the_locks_hash_tag() {
        // The marker shares the lock's hash tag, hence its cluster slot.
        assert_eq!(
            companion_key(Some("x1"), scripts::FORCED_PREFIX, "a:redlock:waitlist:b"),
            "{x1}redlock:forced:a:redlock:waitlist:b"
        );
        assert_eq!(
            companion_key(None, scripts::FORCED_PREFIX, "order:1"),
            "redlock:forced:order:1"
        );
    }

    #[test]
    fn slots_follow_the_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn every_slot_has_a_tag_that_lands_in_it() {
        for slot in 0..SLOTS {
            assert_eq!(slot_of(slot_tag(slot).as_bytes()), slot);
        }
    }
}
