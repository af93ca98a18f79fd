//! Connecting to a lock service — one server (or a RedLock master), a Redis Cluster, or
//! the primary Sentinel names — in RESP3, with release notifications on the same
//! connection (on a Cluster, on a connection of their own); each gives a [`Node`].

#[cfg(feature = "sentinel")]
use std::sync::Arc;
use std::time::Duration;

use redis::ProtocolVersion;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::ClientConfig;
use crate::confirm::{Confirming, Primary};
use crate::connection::Connection;
use crate::error::LockError;
use crate::node::Node;
use crate::notify::{self, ReleaseNotifications};
#[cfg(feature = "sentinel")]
use crate::sentinel::SentinelConnection;

/// Connects in RESP3, so that release notifications arrive on the same connection.
/// With `lazy_on_failure` (a RedLock master), a server that cannot be connected to now
/// still gives a node, which keeps trying it on every use, along with the error.
pub(crate) async fn server(
    info: redis::ConnectionInfo,
    url: String,
    config: &ClientConfig,
    lazy_on_failure: bool,
) -> Result<(Node, Option<LockError>), LockError> {
    let connect_error = |source| LockError::connect(&url, source);
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let info = info.set_redis_settings(settings);
    let redis_client = open(info, config).map_err(connect_error)?;
    let handler = notify::push_handler();
    let manager_config = manager_config(config, &handler);
    let mut failure = None;
    let connection = match ConnectionManager::new_with_config(
        redis_client.clone(),
        manager_config.clone(),
    )
    .await
    {
        Ok(connection) => connection,
        // A RedLock master that is down now, or that refuses this client (the caller
        // decides whether enough masters are left: see `LockClient::connect`).
        Err(error) if lazy_on_failure => {
            let error = connect_error(error);
            tracing::warn!(%url, error = %error.chain(), "redlock: cannot use a master now; will retry it");
            failure = Some(error);
            ConnectionManager::new_lazy_with_config(redis_client.clone(), manager_config)
                .map_err(connect_error)?
        }
        Err(error) => return Err(connect_error(error)),
    };
    let connection = Connection::Server(connection);
    let notifications = ReleaseNotifications::start(connection.clone(), &handler);
    let confirming = Confirming::new(config, Primary::Server(Box::new(redis_client)));
    let mut node = Node::new(url, connection, notifications, config, confirming);
    if lazy_on_failure {
        node = node.one_of_several_masters();
    }
    if failure.is_none() {
        node.check_eviction_policy().await;
        node.load_scripts().await;
    }
    Ok((node, failure))
}

#[cfg(feature = "cluster")]
/// Connects to a Redis Cluster through its seed nodes (RESP3, sharded pub/sub);
/// the cluster client follows MOVED/ASK redirections and failovers.
pub(crate) async fn cluster(
    seeds: Vec<redis::ConnectionInfo>,
    url: String,
    config: &ClientConfig,
) -> Result<Node, LockError> {
    let connect_error = |source| LockError::connect(&url, source);
    let handler = notify::push_handler();
    let push_target = handler.clone();
    let builder = redis::cluster::ClusterClientBuilder::new(seeds);
    let builder = with_root_certificate(builder, config);
    // As for one server (see `tcp_settings`), and more: the cluster client retries a
    // command that timed out on the same node and refreshes its slots only when a
    // connection breaks, so without the limit it would not find the promoted replica
    // while the old master is cut off (silent rather than gone).
    let builder = builder.tcp_settings(tcp_settings(Default::default(), config));
    let cluster = builder
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
    // The sharded subscriptions get node connections of their own, and the commands
    // (scripts, publishes) a set that never subscribes. A node that loses a slot (a
    // failover whose old master lives on, the end of a slot migration) sends the
    // subscribers of the slot's channels a `sunsubscribe` nobody asked for, and redis
    // 1.8.1 takes that push for the reply to the oldest command in flight on that node's
    // connection: every later reply there came one command late, a lock script's reply
    // given to another lock's request (tests/crossed_replies.rs, repro/crossed-reply).
    // On a connection that only subscribes, what comes late is a subscription's
    // confirmation, and the push itself still reaches `notify`, which subscribes anew.
    let subscriptions = cluster
        .get_async_connection()
        .await
        .map_err(connect_error)?;
    let connection = Connection::Cluster(connection);
    let notifications = ReleaseNotifications::start(Connection::Cluster(subscriptions), &handler);
    let node = Node::new(url, connection, notifications, config, None);
    node.check_eviction_policy().await;
    node.load_scripts().await;
    Ok(node)
}

#[cfg(feature = "sentinel")]
/// Connects to the primary the sentinels name for `service`, following failovers.
pub(crate) async fn sentinel(
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
        tcp_settings(Default::default(), config),
        config.tls_root_certificate.as_deref(),
    )
    .await
    .map_err(|source| LockError::connect(&url, source))?;
    let connection = Connection::Sentinel(sentinel.clone());
    let notifications = ReleaseNotifications::start(connection.clone(), &handler);
    let confirming = Confirming::new(config, Primary::Sentinel(sentinel.clone()));
    let moved = Arc::downgrade(&notifications);
    sentinel.on_switch(Box::new(move || {
        if let Some(notifications) = moved.upgrade() {
            notifications.connection_moved();
        }
    }));
    let node = Node::new(url, connection, notifications, config, confirming);
    node.check_eviction_policy().await;
    node.load_scripts().await;
    Ok(node)
}

/// A client for one server: over TLS with the configured private CA, if any, and with
/// [`tcp_settings`] on its sockets.
fn open(info: redis::ConnectionInfo, config: &ClientConfig) -> redis::RedisResult<redis::Client> {
    // Settings of the application's own (`LockClient::from_redis`) are kept.
    let settings = tcp_settings(info.tcp_settings().clone(), config);
    let info = info.set_tcp_settings(settings);
    #[cfg(feature = "tls")]
    if let (Some(pem), redis::ConnectionAddr::TcpTls { .. }) =
        (&config.tls_root_certificate, info.addr())
    {
        return redis::Client::build_with_tls(info, certificates(pem));
    }
    let _ = config;
    redis::Client::open(info)
}

/// The sockets of every connection to a data node (one server, a RedLock master, a
/// Cluster node, the primary Sentinel names): on Linux, data sent that stays
/// unacknowledged for twice the response timeout (at least a second) makes the kernel
/// drop the connection (`TCP_USER_TIMEOUT`).
///
/// A response timeout fails the command but leaves the connection as it is, and the
/// redis crate reconnects only when a connection breaks. After a network partition,
/// the commands that timed out during it (watchdog renewals, attempts) are still
/// queued in the socket, retransmitted on TCP's backoff (doubling, up to two minutes
/// apart): every command on that connection would time out for up to as long again
/// after the network healed (a 3 s partition cost about 3 s more; nothing bounds it
/// short of the kernel's 15-minute give-up). With this limit the kernel drops such a
/// connection soon after the partition begins, and the next command reconnects.
/// A limit the application set itself (on a `redis::Client` given to
/// `LockClient::from_redis`) is kept, as are its other settings in `base`.
fn tcp_settings(
    base: redis::io::tcp::TcpSettings,
    config: &ClientConfig,
) -> redis::io::tcp::TcpSettings {
    let settings = base;
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    if settings.user_timeout().is_some() {
        return settings;
    }
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let settings = settings.set_user_timeout(
        config
            .response_timeout
            .saturating_mul(2)
            .max(Duration::from_secs(1)),
    );
    #[cfg(not(any(target_os = "android", target_os = "fuchsia", target_os = "linux")))]
    let _ = config;
    settings
}

#[cfg(feature = "tls")]
fn certificates(pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    }
}

#[cfg(feature = "cluster")]
fn with_root_certificate(
    builder: redis::cluster::ClusterClientBuilder,
    config: &ClientConfig,
) -> redis::cluster::ClusterClientBuilder {
    #[cfg(feature = "tls")]
    if let Some(pem) = &config.tls_root_certificate {
        return builder.certs(certificates(pem));
    }
    let _ = config;
    builder
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
