//! The fenced store the workers write to: a register in its own redis-server that
//! accepts a write only if its fencing token is at least the highest one seen.
//!
//! It lives in a second server so that faults injected into the lock's server
//! (restart, pause, killed connections) never touch it: it plays the database that a
//! lock protects. Every accepted token is appended to a log, so the checker can see the
//! order in which the store took writes.

use std::sync::LazyLock;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

const HIGHEST: &str = "store:highest";
const ACCEPTED: &str = "store:accepted";

/// KEYS: highest, accepted log. ARGV: token. 1 when accepted, 0 when stale.
static WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token >= highest then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"#,
    )
});

/// A handle on the fenced store (cheap to clone).
#[derive(Clone)]
pub struct FencedStore {
    connection: MultiplexedConnection,
}

impl std::fmt::Debug for FencedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedStore").finish_non_exhaustive()
    }
}

impl FencedStore {
    pub async fn connect(url: &str) -> Self {
        // The store is no part of what is tested: it waits as long as a loaded machine
        // needs, not the redis crate's default 500 ms (a worker process failed once in a
        // warm run of the suite, three passes side by side; a store that did not answer
        // in time is one way it panics).
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let connection = redis::Client::open(url)
            .expect("store url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect to the store");
        FencedStore { connection }
    }

    /// Writes with `token`; true when the store accepted it.
    pub async fn write(&self, token: u64) -> bool {
        let mut connection = self.connection.clone();
        let accepted: i64 = WRITE
            .key(HIGHEST)
            .key(ACCEPTED)
            .arg(token)
            .invoke_async(&mut connection)
            .await
            .expect("the store answers");
        accepted == 1
    }

    /// The highest token the store accepted (0 before any write).
    pub async fn highest(&self) -> u64 {
        let mut connection = self.connection.clone();
        let highest: Option<u64> = connection.get(HIGHEST).await.expect("read the store");
        highest.unwrap_or(0)
    }

    /// Every accepted token, in the order the store took them.
    pub async fn accepted(&self) -> Vec<u64> {
        let mut connection = self.connection.clone();
        connection
            .lrange(ACCEPTED, 0, -1)
            .await
            .expect("read the store's log")
    }
}
