//! The lock client: one multiplexed Redis connection shared by every lock it takes.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion};

use crate::acquire::LockRequest;
use crate::error::LockError;
use crate::notify::{self, ReleaseNotifications};
use crate::queue::LocalQueues;
use crate::watchdog::Watchdog;

/// The URL [`LockClient::from_env`] uses when `REDLOCK_URL` is not set.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";

/// Longest key accepted, in bytes. Redis would take far longer ones, but a lock name
/// that long is a bug (a whole payload formatted into the key), and it would be copied
/// into every command and message.
pub const MAX_KEY_LEN: usize = 1024;

/// Settings of a [`LockClient`]; see [`LockClientBuilder`].
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    pub(crate) watchdog_lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            watchdog_lease: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            response_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(3),
        }
    }
}

/// A client of distributed locks on one Redis server.
///
/// Cheap to clone (an `Arc`); every clone shares one connection, one watchdog and one
/// queue of waiters per key. The connection reconnects by itself after a drop.
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) id: u64,
    pub(crate) url: String,
    pub(crate) connection: ConnectionManager,
    pub(crate) config: ClientConfig,
    pub(crate) notifications: Arc<ReleaseNotifications>,
    pub(crate) queues: Arc<LocalQueues>,
    pub(crate) watchdog: Watchdog,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("url", &self.inner.url)
            .field("watchdog_lease", &self.inner.config.watchdog_lease)
            .field("renew_every", &self.inner.config.renew_every)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects to the Redis server at `url` (`redis://[:password@]host[:port][/db]`)
    /// with the default settings.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder(url).connect().await
    }

    /// Connects to `REDLOCK_URL`, or to [`DEFAULT_URL`] when it is not set.
    pub async fn from_env() -> Result<Self, LockError> {
        let url = std::env::var("REDLOCK_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
        Self::connect(&url).await
    }

    /// Reuses the address and credentials of a `redis::Client` the application already has.
    /// The lock client opens its own connection (in RESP3, for push notifications).
    pub async fn from_redis(client: redis::Client) -> Result<Self, LockError> {
        LockClientBuilder {
            target: Target::Info(Box::new(client.get_connection_info().clone())),
            config: ClientConfig::default(),
        }
        .connect()
        .await
    }

    /// A builder for a client with non-default settings.
    pub fn builder(url: &str) -> LockClientBuilder {
        LockClientBuilder {
            target: Target::Url(url.to_owned()),
            config: ClientConfig::default(),
        }
    }

    /// Starts building an acquisition of the lock named `key`.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), key.into())
    }

    /// The lease used when an acquisition names none (watchdog mode).
    pub fn watchdog_lease(&self) -> Duration {
        self.inner.config.watchdog_lease
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }
}

enum Target {
    Url(String),
    Info(Box<redis::ConnectionInfo>),
}

/// Settings of a [`LockClient`] before it connects.
pub struct LockClientBuilder {
    target: Target,
    config: ClientConfig,
}

impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LockClientBuilder {
    /// Lease of locks taken without one, renewed by the watchdog (default 30 s).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.config.watchdog_lease = lease;
        self
    }

    /// How often the watchdog renews (default 10 s, a third of the default lease).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.config.renew_every = every;
        self
    }

    /// How long any one command may wait for Redis's answer (default 3 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.config.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Connects. Fails within about twice the connect timeout when Redis cannot be reached.
    pub async fn connect(self) -> Result<LockClient, LockError> {
        let config = self.config;
        let (info, url) = match self.target {
            Target::Url(url) => {
                let shown = redact(&url);
                let info =
                    url.as_str()
                        .into_connection_info()
                        .map_err(|source| LockError::Connect {
                            url: shown.clone(),
                            source,
                        })?;
                (info, shown)
            }
            Target::Info(info) => {
                let shown = info.addr().to_string();
                (*info, shown)
            }
        };
        let check = |what: &str, value: Duration| {
            if value.is_zero() {
                Err(LockError::Connect {
                    url: url.clone(),
                    source: redis::RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "invalid client setting",
                        format!("{what} must be above zero"),
                    )),
                })
            } else {
                Ok(())
            }
        };
        check("watchdog_lease", config.watchdog_lease)?;
        check("renew_every", config.renew_every)?;
        check("response_timeout", config.response_timeout)?;
        check("connect_timeout", config.connect_timeout)?;

        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let connect_error = |source| LockError::Connect {
            url: url.clone(),
            source,
        };
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
        let connection = ConnectionManager::new_with_config(redis_client, manager_config)
            .await
            .map_err(connect_error)?;
        let notifications = ReleaseNotifications::start(connection.clone(), &handler);
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let inner = Arc::new(ClientInner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            url,
            connection,
            config,
            notifications,
            queues: Arc::new(LocalQueues::default()),
            watchdog: Watchdog::default(),
        });
        Ok(LockClient { inner })
    }
}

/// Hides the password of a URL shown in errors and logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://:s3cret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1/"), "redis://127.0.0.1/");
    }
}
