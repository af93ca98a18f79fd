//! Connections of their own for acquisitions confirmed by `WAIT` (which blocks the
//! connection it is sent on, and counts only that connection's writes): a small pool
//! per primary, never following a failover.

use std::sync::Mutex;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};

use crate::config::ClientConfig;
#[cfg(feature = "sentinel")]
use crate::sentinel::SentinelConnection;

/// Where the connections for confirmed acquisitions go.
pub(crate) enum Primary {
    Server(Box<redis::Client>),
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConnection),
}

/// Idle connections for confirmed acquisitions, each tagged with the primary's
/// generation (a Sentinel failover makes older ones useless).
pub(crate) struct Confirming {
    primary: Primary,
    config: AsyncConnectionConfig,
    idle: Mutex<Vec<(u64, MultiplexedConnection)>>,
}

impl Confirming {
    pub(crate) fn new(config: &ClientConfig, primary: Primary) -> Option<Self> {
        let (_, wait) = config.confirm_replicas?;
        Some(Confirming {
            primary,
            // The WAIT may block for its whole timeout, on top of the script.
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.response_timeout + wait)),
            idle: Mutex::new(Vec::new()),
        })
    }

    pub(crate) async fn checkout(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let (generation, client) = match &self.primary {
            Primary::Server(client) => (0, (**client).clone()),
            #[cfg(feature = "sentinel")]
            Primary::Sentinel(sentinel) => sentinel.current_client(),
        };
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.retain(|(tagged, _)| *tagged == generation);
            idle.pop()
        };
        if let Some(found) = reused {
            return Ok(found);
        }
        let connection = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok((generation, connection))
    }

    /// Keeps a connection that answered for the next confirmed acquisition.
    pub(crate) fn checkin(&self, generation: u64, connection: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < 16 {
            idle.push((generation, connection));
        }
    }
}
