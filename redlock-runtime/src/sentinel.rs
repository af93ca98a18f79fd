//! A connection to the primary that Redis Sentinel names, following it after a failover.
//!
//! Commands go to the current primary over one multiplexed connection. When one fails
//! as if the primary were gone (the connection refused, dropped or timed out) or
//! demoted (`READONLY`), the sentinels are asked again; if they name another primary,
//! the connection moves there, release subscriptions are renewed on it and every
//! waiter is woken to re-check, and the command is sent once more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, Pipeline, ProtocolVersion, RedisError, RedisFuture, RedisResult, Value};

type OnSwitch = Box<dyn Fn() + Send + Sync>;

/// A sentinel client trusting `pem` for the sentinels and for the data nodes, with the
/// sentinel URLs' credentials and database for both.
#[cfg(feature = "tls")]
fn with_certificates(
    sentinels: &[redis::ConnectionInfo],
    service: &str,
    settings: &redis::RedisConnectionInfo,
    tcp: TcpSettings,
    pem: &[u8],
) -> RedisResult<SentinelClient> {
    let certificates = || redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    };
    let mut builder = redis::sentinel::SentinelClientBuilder::new(
        sentinels.iter().map(|info| info.addr().clone()),
        service,
        SentinelServerType::Master,
    )?
    .set_client_to_sentinel_certificates(certificates())
    .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
    .set_client_to_redis_certificates(certificates())
    .set_client_to_redis_protocol(ProtocolVersion::RESP3)
    .set_client_to_redis_tcp_settings(tcp)
    .set_client_to_redis_db(settings.db());
    if let Some(username) = settings.username() {
        builder = builder
            .set_client_to_sentinel_username(username)
            .set_client_to_redis_username(username);
    }
    if let Some(password) = settings.password() {
        builder = builder
            .set_client_to_sentinel_password(password)
            .set_client_to_redis_password(password);
    }
    builder.build()
}

/// Cheap to clone; every clone follows the same primary.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    /// The primary's address and the connection to it, with a generation that grows
    /// with every switch (so that concurrent failures switch only once).
    current: RwLock<Primary>,
    generation: AtomicU64,
    on_switch: OnceLock<OnSwitch>,
}

#[derive(Clone)]
struct Primary {
    address: String,
    client: redis::Client,
    connection: ConnectionManager,
}

impl SentinelConnection {
    /// `tcp`: the sockets' settings of the connections to the primary;
    /// `root_certificate`: a private CA (PEM) for `rediss://` sentinels and the data
    /// nodes they name (which are reached over TLS when the sentinels are).
    pub(crate) async fn connect(
        sentinels: Vec<redis::ConnectionInfo>,
        service: &str,
        redis_settings: redis::RedisConnectionInfo,
        config: ConnectionManagerConfig,
        tcp: TcpSettings,
        root_certificate: Option<&[u8]>,
    ) -> RedisResult<Self> {
        let tls = sentinels
            .iter()
            .any(|info| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }));
        let mut client = match root_certificate {
            #[cfg(feature = "tls")]
            Some(pem) if tls => with_certificates(&sentinels, service, &redis_settings, tcp, pem)?,
            _ => {
                let mut node_info = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(redis_settings.set_protocol(ProtocolVersion::RESP3))
                    .set_tcp_settings(tcp);
                if tls {
                    node_info = node_info.set_tls_mode(redis::TlsMode::Secure);
                }
                let _ = root_certificate;
                // An owned name fits both signatures of `build` (with and without TLS).
                let service = String::from(service);
                SentinelClient::build(
                    sentinels,
                    service,
                    Some(node_info),
                    SentinelServerType::Master,
                )?
            }
        };
        let primary = client.async_get_client().await?;
        let address = primary.get_connection_info().addr().to_string();
        let connection =
            ConnectionManager::new_with_config(primary.clone(), config.clone()).await?;
        Ok(SentinelConnection {
            shared: Arc::new(Shared {
                sentinels: tokio::sync::Mutex::new(client),
                config,
                current: RwLock::new(Primary {
                    address,
                    client: primary,
                    connection,
                }),
                generation: AtomicU64::new(0),
                on_switch: OnceLock::new(),
            }),
        })
    }

    /// What to do after a switch (renew subscriptions, wake waiters); set once.
    pub(crate) fn on_switch(&self, action: OnSwitch) {
        let _ = self.shared.on_switch.set(action);
    }

    /// The current primary, and the generation it belongs to.
    fn primary(&self) -> (u64, Primary) {
        let primary = self
            .shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner());
        (
            self.shared.generation.load(Ordering::Acquire),
            primary.clone(),
        )
    }

    /// The connection to the current primary, and the generation it belongs to.
    pub(crate) fn current(&self) -> (u64, ConnectionManager) {
        let (generation, primary) = self.primary();
        (generation, primary.connection)
    }

    /// A client for the current primary (for connections of their own), and the
    /// generation it belongs to.
    pub(crate) fn current_client(&self) -> (u64, redis::Client) {
        let (generation, primary) = self.primary();
        (generation, primary.client)
    }

    /// Asks the sentinels for the primary; moves there if it changed since `seen`.
    /// True when the connection now points elsewhere than it did at `seen`.
    async fn follow(&self, seen: u64) -> bool {
        let mut sentinels = self.shared.sentinels.lock().await;
        if self.shared.generation.load(Ordering::Acquire) != seen {
            return true;
        }
        let primary = match sentinels.async_get_client().await {
            Ok(primary) => primary,
            Err(error) => {
                tracing::warn!(%error, "redlock: no sentinel named a primary");
                return false;
            }
        };
        let address = primary.get_connection_info().addr().to_string();
        let unchanged = self
            .shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .address
            == address;
        if unchanged {
            return false;
        }
        let connection = match ConnectionManager::new_with_config(
            primary.clone(),
            self.shared.config.clone(),
        )
        .await
        {
            Ok(connection) => connection,
            Err(error) => {
                tracing::warn!(%address, %error, "redlock: the new primary cannot be reached yet");
                return false;
            }
        };
        tracing::warn!(%address, "redlock: following the primary Sentinel named after a failover");
        *self
            .shared
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Primary {
            address,
            client: primary,
            connection,
        };
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        drop(sentinels);
        if let Some(action) = self.shared.on_switch.get() {
            action();
        }
        true
    }
}

/// A failure that may mean the primary changed.
fn primary_may_have_moved(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (seen, mut connection) = self.current();
            match connection.req_packed_command(cmd).await {
                Err(error) if primary_may_have_moved(&error) => {
                    if !self.follow(seen).await {
                        return Err(error);
                    }
                    let (_, mut connection) = self.current();
                    connection.req_packed_command(cmd).await
                }
                other => other,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (seen, mut connection) = self.current();
            match connection
                .req_packed_commands(pipeline, offset, count)
                .await
            {
                Err(error) if primary_may_have_moved(&error) => {
                    if !self.follow(seen).await {
                        return Err(error);
                    }
                    let (_, mut connection) = self.current();
                    connection
                        .req_packed_commands(pipeline, offset, count)
                        .await
                }
                other => other,
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.current().1.get_db()
    }
}
