//! One Redis server: its connection, its release notifications, and each lock
//! operation as one script call on it.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ProtocolVersion, RedisResult, Value};

use crate::client::ClientConfig;
use crate::connection::{Connection, slot_of};
use crate::error::LockError;
use crate::notify::{self, Listener, ReleaseNotifications};
use crate::scripts;
use crate::sentinel::SentinelConnection;

/// What one acquire script run found.
pub(crate) enum Attempt {
    /// `released_previous`: the hand-off's previous owner still held it, and was deleted.
    Acquired {
        token: u64,
        released_previous: bool,
    },
    Held {
        ttl: Duration,
    },
    NotALock {
        found: String,
    },
}

/// A connection to one Redis server, shared by every lock of a client.
pub(crate) struct Node {
    pub(crate) url: String,
    connection: Connection,
    notifications: Arc<ReleaseNotifications>,
    queueing: Queueing,
}

/// Timings of the queue of waiting clients (see `scripts::ACQUIRE`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queueing {
    /// How long a release reserves the key for the named waiter.
    pub(crate) reservation_ms: u64,
    /// How long a registration outlives the holder's lease; a waiter refreshes it by
    /// retrying when that lease ends at the latest.
    pub(crate) registration_slack_ms: u64,
}

impl Queueing {
    fn from_config(config: &ClientConfig) -> Self {
        Queueing {
            reservation_ms: config.reservation_grace.as_millis().max(1) as u64,
            registration_slack_ms: 2_000,
        }
    }
}

/// A waiting client's place in a key's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiter<'a> {
    pub(crate) id: &'a str,
    pub(crate) registered: bool,
}

impl Node {
    /// Connects in RESP3, so that release notifications arrive on the same connection.
    pub(crate) async fn connect(
        info: redis::ConnectionInfo,
        url: String,
        config: &ClientConfig,
        lazy_on_failure: bool,
    ) -> Result<Node, LockError> {
        let connect_error = |source| LockError::Connect {
            url: url.clone(),
            source,
        };
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let redis_client = redis::Client::open(info).map_err(connect_error)?;
        let handler = notify::push_handler();
        let manager_config = manager_config(config, &handler);
        let connection =
            match ConnectionManager::new_with_config(redis_client.clone(), manager_config.clone())
                .await
            {
                Ok(connection) => connection,
                // A RedLock master that is down now: keep trying it on every use.
                Err(error) if lazy_on_failure => {
                    tracing::warn!(%url, %error, "redlock: a master is unreachable; will retry it");
                    ConnectionManager::new_lazy_with_config(redis_client, manager_config)
                        .map_err(connect_error)?
                }
                Err(error) => return Err(connect_error(error)),
            };
        let connection = Connection::Server(connection);
        let notifications = ReleaseNotifications::start(connection.clone(), &handler);
        Ok(Node {
            url,
            connection,
            notifications,
            queueing: Queueing::from_config(config),
        })
    }

    /// Connects to a Redis Cluster through its seed nodes (RESP3, sharded pub/sub);
    /// the cluster client follows MOVED/ASK redirections and failovers.
    pub(crate) async fn connect_cluster(
        seeds: Vec<redis::ConnectionInfo>,
        url: String,
        config: &ClientConfig,
    ) -> Result<Node, LockError> {
        let connect_error = |source| LockError::Connect {
            url: url.clone(),
            source,
        };
        let handler = notify::push_handler();
        let push_target = handler.clone();
        let cluster = redis::cluster::ClusterClientBuilder::new(seeds)
            .use_protocol(ProtocolVersion::RESP3)
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.response_timeout)
            .retries(2)
            .push_sender(move |push| {
                notify::on_push(&push_target, push);
                Ok::<(), ()>(())
            })
            .build()
            .map_err(connect_error)?;
        let connection = cluster
            .get_async_connection()
            .await
            .map_err(connect_error)?;
        let connection = Connection::Cluster(connection);
        let notifications = ReleaseNotifications::start(connection.clone(), &handler);
        Ok(Node {
            url,
            connection,
            notifications,
            queueing: Queueing::from_config(config),
        })
    }

    /// Connects to the primary the sentinels name for `service`, following failovers.
    pub(crate) async fn connect_sentinel(
        sentinels: Vec<redis::ConnectionInfo>,
        service: &str,
        url: String,
        config: &ClientConfig,
    ) -> Result<Node, LockError> {
        let handler = notify::push_handler();
        let redis_settings = sentinels
            .first()
            .map(|info| info.redis_settings().clone())
            .unwrap_or_default();
        // The credentials and database of the sentinel URLs are used for the primary too.
        let sentinel = SentinelConnection::connect(
            sentinels,
            service,
            redis_settings,
            manager_config(config, &handler),
        )
        .await
        .map_err(|source| LockError::Connect {
            url: url.clone(),
            source,
        })?;
        let connection = Connection::Sentinel(sentinel.clone());
        let notifications = ReleaseNotifications::start(connection.clone(), &handler);
        let moved = Arc::downgrade(&notifications);
        sentinel.on_switch(Box::new(move || {
            if let Some(notifications) = moved.upgrade() {
                notifications.connection_moved();
            }
        }));
        Ok(Node {
            url,
            connection,
            notifications,
            queueing: Queueing::from_config(config),
        })
    }

    /// Blocks until `replicas` replicas have every write of this connection so far
    /// (Redis `WAIT`), at most `timeout`; returns how many confirmed.
    pub(crate) async fn confirm_replicas(
        &self,
        replicas: usize,
        timeout: Duration,
    ) -> RedisResult<usize> {
        let mut connection = self.connection.clone();
        redis::cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis() as u64)
            .query_async(&mut connection)
            .await
    }

    /// Registers interest in `key`'s releases on this server.
    pub(crate) fn listen(
        &self,
        key: &str,
        waiter_id: Option<String>,
        since: tokio::time::Instant,
    ) -> (
        Listener,
        impl Future<Output = RedisResult<()>> + use<>,
        bool,
    ) {
        self.notifications
            .listen(self.connection.release_channel(key), waiter_id, since)
    }

    /// One run of the acquire script. If this future is dropped while Redis may have
    /// run the script, the lock it may hold is released in the background.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        owner: &str,
        lease_ms: u64,
        previous_owner: Option<&str>,
        waiter: Option<Waiter<'_>>,
    ) -> RedisResult<Attempt> {
        let mut in_flight = InFlight {
            connection: &self.connection,
            key,
            owner,
            queueing: self.queueing,
            armed: true,
        };
        let mut connection = self.connection.clone();
        let [queue, expiries] = self.connection.queue_keys(key);
        // On an error the script may still have run before the reply was lost: the
        // armed `in_flight` then releases whatever it took.
        let reply: Vec<Value> = scripts::ACQUIRE
            .key(key)
            .key(self.connection.fence_key(key).as_ref())
            .key(queue)
            .key(expiries)
            .arg(owner)
            .arg(lease_ms)
            .arg(previous_owner.unwrap_or(""))
            .arg(waiter.map_or("", |waiter| waiter.id))
            .arg(if waiter.is_some_and(|waiter| waiter.registered) {
                "1"
            } else {
                "0"
            })
            .arg(self.queueing.registration_slack_ms)
            .arg(self.connection.release_channel(key))
            .arg(self.connection.publish_command())
            .invoke_async(&mut connection)
            .await?;
        in_flight.armed = false;
        parse_attempt(reply)
    }

    /// Compare-and-delete (or keep for `keep_ms`): 1 deleted, 2 kept, 0 not ours.
    pub(crate) async fn release(&self, key: &str, owner: &str, keep_ms: u64) -> RedisResult<i64> {
        release_on(self.connection.clone(), self.queueing, key, owner, keep_ms).await
    }

    /// Takes a waiter that gave up out of `key`'s queue (passing on a reservation
    /// made for it meanwhile).
    pub(crate) async fn leave_queue(&self, key: &str, waiter_id: &str) -> RedisResult<()> {
        let mut connection = self.connection.clone();
        let [queue, expiries] = self.connection.queue_keys(key);
        scripts::LEAVE_QUEUE
            .key(key)
            .key(queue)
            .key(expiries)
            .arg(waiter_id)
            .arg("")
            .arg(self.connection.release_channel(key))
            .arg(self.connection.publish_command())
            .arg(self.queueing.reservation_ms)
            .invoke_async::<i64>(&mut connection)
            .await
            .map(drop)
    }

    /// Compare-and-expire: 1 extended, 0 not ours.
    pub(crate) async fn extend(&self, key: &str, owner: &str, lease_ms: u64) -> RedisResult<i64> {
        let mut connection = self.connection.clone();
        scripts::EXTEND
            .key(key)
            .arg(owner)
            .arg(lease_ms)
            .invoke_async(&mut connection)
            .await
    }

    /// Raises the fencing counter of `key` on this server to at least `token`.
    pub(crate) async fn raise_fence(&self, key: &str, token: u64) -> RedisResult<()> {
        let mut connection = self.connection.clone();
        scripts::RAISE_FENCE
            .key(self.connection.fence_key(key).as_ref())
            .arg(token)
            .invoke_async(&mut connection)
            .await
    }

    /// Renews many locks in one pipelined round trip (on a cluster, one per slot in
    /// use, sent concurrently: a pipeline may not cross slots): 1 renewed, 0 gone.
    pub(crate) async fn renew(
        &self,
        locks: &[(&str, &str)],
        lease_ms: u64,
    ) -> RedisResult<Vec<i64>> {
        if !self.connection.is_cluster() {
            return renew_pipeline(self.connection.clone(), locks, lease_ms).await;
        }
        let mut by_slot: std::collections::HashMap<u16, Vec<usize>> =
            std::collections::HashMap::new();
        for (index, (key, _)) in locks.iter().enumerate() {
            by_slot
                .entry(slot_of(key.as_bytes()))
                .or_default()
                .push(index);
        }
        let groups: Vec<Vec<usize>> = by_slot.into_values().collect();
        let replies = futures_util::future::join_all(groups.iter().map(|group| {
            let batch: Vec<(&str, &str)> = group.iter().map(|&index| locks[index]).collect();
            let connection = self.connection.clone();
            async move { renew_pipeline(connection, &batch, lease_ms).await }
        }))
        .await;
        let mut renewed = vec![0; locks.len()];
        for (group, reply) in groups.iter().zip(replies) {
            for (&index, one) in group.iter().zip(reply?) {
                renewed[index] = one;
            }
        }
        Ok(renewed)
    }
}

/// One server's connection settings: the client's timeouts, RESP3 pushes routed to
/// the release notifications, subscriptions renewed after a reconnect.
fn manager_config(config: &ClientConfig, handler: &notify::PushHandler) -> ConnectionManagerConfig {
    let push_target = handler.clone();
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.response_timeout))
        .set_connection_timeout(Some(config.connect_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(500))
        .set_automatic_resubscription()
        .set_pipeline_buffer_size(1024)
        .set_push_sender(move |push| {
            notify::on_push(&push_target, push);
            Ok::<(), ()>(())
        })
}

async fn renew_pipeline(
    mut connection: Connection,
    locks: &[(&str, &str)],
    lease_ms: u64,
) -> RedisResult<Vec<i64>> {
    let mut pipeline = redis::pipe();
    for (key, owner) in locks {
        pipeline
            .cmd("EVALSHA")
            .arg(scripts::EXTEND.get_hash())
            .arg(1)
            .arg(*key)
            .arg(*owner)
            .arg(lease_ms);
    }
    match pipeline.query_async(&mut connection).await {
        Err(error)
            if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
        {
            // Redis restarted (or flushed its scripts): load it, then renew once more.
            scripts::EXTEND
                .prepare_invoke()
                .load_async(&mut connection)
                .await?;
            pipeline.query_async(&mut connection).await
        }
        other => other,
    }
}

async fn release_on(
    mut connection: Connection,
    queueing: Queueing,
    key: &str,
    owner: &str,
    keep_ms: u64,
) -> RedisResult<i64> {
    let channel = connection.release_channel(key);
    let publish = connection.publish_command();
    let [queue, expiries] = connection.queue_keys(key);
    scripts::RELEASE
        .key(key)
        .key(queue)
        .key(expiries)
        .arg(owner)
        .arg(keep_ms)
        .arg(channel)
        .arg(publish)
        .arg(queueing.reservation_ms)
        .invoke_async(&mut connection)
        .await
}

fn parse_attempt(reply: Vec<Value>) -> RedisResult<Attempt> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Int(number) => number.to_string(),
        other => format!("{other:?}"),
    };
    let number = |value: Option<&Value>| match value {
        Some(Value::Int(number)) => u64::try_from(*number).ok(),
        Some(other) => text(other).parse().ok(),
        None => None,
    };
    let bad_reply = || {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply from the acquire script",
            format!("{reply:?}"),
        ))
    };
    let value = reply.get(1);
    match reply.first() {
        Some(Value::Int(1)) => {
            let token = number(value).ok_or_else(bad_reply)?;
            Ok(Attempt::Acquired {
                token,
                released_previous: number(reply.get(2)) == Some(1),
            })
        }
        Some(Value::Int(0)) => number(value)
            .map(|ttl| Attempt::Held {
                ttl: Duration::from_millis(ttl),
            })
            .ok_or_else(bad_reply),
        Some(Value::Int(_)) => Ok(Attempt::NotALock {
            found: value.map(text).unwrap_or_default(),
        }),
        _ => Err(bad_reply()),
    }
}

/// Armed while an acquire script may have run without its reply having been read.
struct InFlight<'a> {
    connection: &'a Connection,
    queueing: Queueing,
    key: &'a str,
    owner: &'a str,
    armed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let connection = self.connection.clone();
        let queueing = self.queueing;
        let key = self.key.to_owned();
        let owner = self.owner.to_owned();
        runtime.spawn(async move {
            // Compare-and-delete: harmless if the attempt took nothing.
            let outcome = release_on(connection, queueing, &key, &owner, 0).await;
            tracing::debug!(%key, ?outcome, "redlock: cleaned up after an interrupted acquire");
        });
    }
}
