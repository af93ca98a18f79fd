//! One Redis server: its connection, its release notifications, and each lock
//! operation as one script call on it.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ProtocolVersion, RedisResult, Value};

use crate::client::ClientConfig;
use crate::error::LockError;
use crate::notify::{self, Listener, ReleaseNotifications};
use crate::scripts;

/// What one acquire script run found.
pub(crate) enum Attempt {
    Acquired(u64),
    Held { ttl: Duration },
    NotALock { found: String },
}

/// A connection to one Redis server, shared by every lock of a client.
pub(crate) struct Node {
    pub(crate) url: String,
    connection: ConnectionManager,
    notifications: Arc<ReleaseNotifications>,
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
        let push_target = handler.clone();
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.connect_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500))
            .set_automatic_resubscription()
            .set_pipeline_buffer_size(1024)
            .set_push_sender(move |push| {
                notify::on_push(&push_target, push);
                Ok::<(), ()>(())
            });
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
        let notifications = ReleaseNotifications::start(connection.clone(), &handler);
        Ok(Node {
            url,
            connection,
            notifications,
        })
    }

    /// Registers interest in `key`'s releases on this server.
    pub(crate) fn listen(
        &self,
        key: &str,
    ) -> (Listener, impl Future<Output = RedisResult<()>> + use<>) {
        self.notifications.listen(scripts::release_channel(key))
    }

    /// One run of the acquire script. If this future is dropped while Redis may have
    /// run the script, the lock it may hold is released in the background.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        owner: &str,
        lease_ms: u64,
    ) -> RedisResult<Attempt> {
        let mut in_flight = InFlight {
            connection: &self.connection,
            key,
            owner,
            armed: true,
        };
        let mut connection = self.connection.clone();
        // On an error the script may still have run before the reply was lost: the
        // armed `in_flight` then releases whatever it took.
        let (status, value): (i64, Value) = scripts::ACQUIRE
            .key(key)
            .key(scripts::FENCE_KEY)
            .arg(owner)
            .arg(lease_ms)
            .invoke_async(&mut connection)
            .await?;
        in_flight.armed = false;
        parse_attempt(status, value)
    }

    /// Compare-and-delete (or keep for `keep_ms`): 1 deleted, 2 kept, 0 not ours.
    pub(crate) async fn release(&self, key: &str, owner: &str, keep_ms: u64) -> RedisResult<i64> {
        release_on(self.connection.clone(), key, owner, keep_ms).await
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

    /// Raises this server's fencing counter to at least `token`.
    pub(crate) async fn raise_fence(&self, token: u64) -> RedisResult<()> {
        let mut connection = self.connection.clone();
        scripts::RAISE_FENCE
            .key(scripts::FENCE_KEY)
            .arg(token)
            .invoke_async(&mut connection)
            .await
    }

    /// Renews many locks in one pipelined round trip: 1 renewed, 0 gone, per lock.
    pub(crate) async fn renew(
        &self,
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
        let mut connection = self.connection.clone();
        let outcome = pipeline.query_async(&mut connection).await;
        match outcome {
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
}

async fn release_on(
    mut connection: ConnectionManager,
    key: &str,
    owner: &str,
    keep_ms: u64,
) -> RedisResult<i64> {
    scripts::RELEASE
        .key(key)
        .arg(owner)
        .arg(keep_ms)
        .arg(scripts::release_channel(key))
        .invoke_async(&mut connection)
        .await
}

fn parse_attempt(status: i64, value: Value) -> RedisResult<Attempt> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Int(number) => number.to_string(),
        other => format!("{other:?}"),
    };
    let number = |value: &Value| match value {
        Value::Int(number) => u64::try_from(*number).ok(),
        other => text(other).parse().ok(),
    };
    let bad_reply = || {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply from the acquire script",
            format!("{status} {value:?}"),
        ))
    };
    match status {
        1 => number(&value).map(Attempt::Acquired).ok_or_else(bad_reply),
        0 => number(&value)
            .map(|ttl| Attempt::Held {
                ttl: Duration::from_millis(ttl),
            })
            .ok_or_else(bad_reply),
        _ => Ok(Attempt::NotALock {
            found: text(&value),
        }),
    }
}

/// Armed while an acquire script may have run without its reply having been read.
struct InFlight<'a> {
    connection: &'a ConnectionManager,
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
        let key = self.key.to_owned();
        let owner = self.owner.to_owned();
        runtime.spawn(async move {
            // Compare-and-delete: harmless if the attempt took nothing.
            let outcome = release_on(connection, &key, &owner, 0).await;
            tracing::debug!(%key, ?outcome, "redlock: cleaned up after an interrupted acquire");
        });
    }
}
