//! The floor of issue 34's server-cost targets: the least a fenced lock that *grants*
//! (a release hands the key to the first in line, who is told with one message, and
//! nobody polls) can ask of Redis per contended acquisition.
//!
//! - Attempt: one script, `SET NX PX`; when busy, `RPUSH` the owner onto the line. The
//!   fencing token, an `INCR` of a counter, is taken only when the key is free.
//! - Release: one script, `GET` (compare), `LPOP` the line; with a waiter, the next
//!   token (`INCR`), `SET` the key to the waiter and `PUBLISH` the token on its
//!   channel; without one, `DEL`.
//!
//! So a contended acquisition is two scripts, seven inner commands and one message. Its
//! tokens are a counter's, which a restart from stale data sends backwards (redlock's
//! are the server clock's where the counter falls behind it: two commands, `TIME` and
//! `SET … GET`, where this has one).
//! Nothing else that a lock users can rely on is here: no lapse of a grant nobody takes
//! (a waiter that dies in line holds the key for the lease), no removal of a waiter
//! that gave up, no stale-grant check, no client name, no waiting writer, no RedLock
//! or Cluster. It is run by the distributed scenario's child as `grant-minimum`
//! (`scripts/server-cost.py 16 grant-minimum`): what it costs Redis is below what any
//! grant with those guarantees can cost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::{Mutex, mpsc};

/// Takes the key if free (the token as the reply), else joins the line (0).
const ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
redis.call('RPUSH', KEYS[3], ARGV[1])
return 0
"#;

/// Frees the key for the first in line (told on its channel, with its token), or
/// deletes it; only the owner's.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local next = redis.call('LPOP', KEYS[3])
if not next then
  redis.call('DEL', KEYS[1])
  return 1
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], next, 'PX', ARGV[2])
redis.call('PUBLISH', 'bench:grant-minimum:' .. next, token)
return 1
"#;

const FENCE: &str = "bench:grant-minimum:counter";

/// One process's grant minimum: a RESP3 connection subscribed to its own channel.
pub struct GrantMinimum {
    connection: MultiplexedConnection,
    grants: Mutex<mpsc::UnboundedReceiver<redis::PushInfo>>,
    owner: String,
    scripts: (redis::Script, redis::Script),
}

/// A held grant-minimum lock.
pub struct GrantGuard {
    lock: Arc<GrantMinimum>,
    key: String,
    lease_ms: u64,
}

impl GrantMinimum {
    pub async fn connect(url: &str) -> Self {
        static PROCESSES: AtomicU64 = AtomicU64::new(0);
        let url = format!("{url}?protocol=resp3");
        let client = redis::Client::open(url).expect("the grant minimum's URL");
        let (sender, grants) = mpsc::unbounded_channel();
        let config = redis::AsyncConnectionConfig::new().set_push_sender(sender);
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect the grant minimum");
        let owner = format!(
            "{:x}-{}-{:x}",
            std::process::id(),
            PROCESSES.fetch_add(1, Ordering::Relaxed),
            uuid::Uuid::new_v4().as_u128() as u64
        );
        connection
            .subscribe(format!("bench:grant-minimum:{owner}"))
            .await
            .expect("subscribe the grant minimum");
        GrantMinimum {
            connection,
            grants: Mutex::new(grants),
            owner,
            scripts: (redis::Script::new(ACQUIRE), redis::Script::new(RELEASE)),
        }
    }

    /// Takes `key` for `lease`: at once, or when a release grants it. One waiter per
    /// process at a time (the distributed scenario's child).
    pub async fn acquire(
        self: &Arc<Self>,
        key: &str,
        lease: Duration,
    ) -> Result<GrantGuard, String> {
        let mut grants = self.grants.lock().await;
        let token: u64 = self
            .scripts
            .0
            .key(key)
            .key(FENCE)
            .key(format!("bench:grant-minimum:line:{key}"))
            .arg(&self.owner)
            .arg(lease.as_millis() as u64)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|error| error.to_string())?;
        if token > 0 {
            return Ok(self.guard(key, lease));
        }
        loop {
            let push = tokio::time::timeout(lease, grants.recv())
                .await
                .map_err(|_| format!("no grant within the lease ({lease:?})"))?
                .ok_or("the connection closed")?;
            if push.kind != redis::PushKind::Message {
                continue;
            }
            // The token (the message's payload) is not used by the benchmark.
            return Ok(self.guard(key, lease));
        }
    }

    fn guard(self: &Arc<Self>, key: &str, lease: Duration) -> GrantGuard {
        GrantGuard {
            lock: self.clone(),
            key: key.to_owned(),
            lease_ms: lease.as_millis() as u64,
        }
    }
}

impl GrantGuard {
    pub async fn release(self) {
        let released: i64 = self
            .lock
            .scripts
            .1
            .key(&self.key)
            .key(FENCE)
            .key(format!("bench:grant-minimum:line:{}", self.key))
            .arg(&self.lock.owner)
            .arg(self.lease_ms)
            .invoke_async(&mut self.lock.connection.clone())
            .await
            .expect("the grant minimum's release");
        assert_eq!(
            released, 1,
            "the grant minimum's lock was not ours at its release"
        );
    }
}
