//! Operating locks: who holds one, since when, with which fencing token, how many
//! wait — and freeing one whoever holds it. What an on-call engineer needs at 3 a.m.,
//! from code and (through the `redlock` command) from a terminal.
//!
//! Everything is read from the lock itself (see `scripts` on the lock's value) and
//! from its waitlist: no side keys, nothing that outlives a lock. With RedLock a lock
//! is what a majority of masters agree on.

use std::time::Duration;

use futures_util::StreamExt;

use crate::core::Core;
use crate::error::LockError;
use crate::limits::check_key;
use crate::node::Seen;

/// A held lock, as `LockClient::inspect` and `LockClient::locks` see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    key: String,
    holder: String,
    fencing_token: u64,
    held_for: Duration,
    ttl: Duration,
    waiting: usize,
    kept: bool,
}

impl LockInfo {
    fn new(key: String, seen: Seen) -> Self {
        LockInfo {
            key,
            kept: seen.owner.starts_with("kept:"),
            holder: seen.holder,
            fencing_token: seen.fencing_token,
            held_for: seen.held_for,
            ttl: seen.ttl,
            waiting: seen.waiting,
        }
    }

    /// The lock's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The name of the client holding it (`LockClientBuilder::name`; by default
    /// `<hostname>:<pid>`).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The fencing token its holder was given.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// How long it has been held (by the server's clock; with RedLock the longest a
    /// majority reports).
    pub fn held_for(&self) -> Duration {
        self.held_for
    }

    /// How long its lease has left (a watchdog renews it before it runs out).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Clients in line for it on the Redis waitlist (RedLock keeps none: 0 there).
    /// Tasks waiting inside the holder's own client are not counted.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Released already, but kept until its `hold_at_least` has passed.
    pub fn is_kept(&self) -> bool {
        self.kept
    }
}

/// How many keys `locks` inspects at once.
const INSPECTED_AT_ONCE: usize = 32;

/// The lock on `key`, or `None` when it is free.
pub(crate) async fn inspect(core: &Core, key: &str) -> Result<Option<LockInfo>, LockError> {
    check_key(key)?;
    let masters = core.masters();
    bounded(core, key, masters.inspect(key))
        .await?
        .map_err(|error| error.into_lock_error(key, masters))
        .map(|seen| seen.map(|seen| LockInfo::new(key.to_owned(), seen)))
}

/// Every lock whose key matches `pattern` (Redis glob syntax), by key.
pub(crate) async fn locks(core: &Core, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
    if pattern.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "the pattern is empty; use `*` for every lock".into(),
        });
    }
    let masters = core.masters();
    let keys = masters
        .candidates(pattern)
        .await
        .map_err(|error| error.into_lock_error(pattern, masters))?;
    // Each key is a separate script call (on a cluster they live on different shards);
    // a few at a time keeps a large database from flooding the connection.
    let inspected: Vec<Result<Option<LockInfo>, LockError>> =
        futures_util::stream::iter(keys.iter().map(|key| inspect(core, key)))
            .buffered(INSPECTED_AT_ONCE)
            .collect()
            .await;
    let mut found = Vec::new();
    for info in inspected {
        match info {
            Ok(Some(info)) => found.push(info),
            Ok(None) => {}
            // A key matching the pattern that no lock may have (reserved prefix, too long).
            Err(LockError::InvalidKey { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(found)
}

/// Frees `key` whoever holds it; what it evicted, `None` when it was free.
pub(crate) async fn evict(core: &Core, key: &str) -> Result<Option<LockInfo>, LockError> {
    check_key(key)?;
    let masters = core.masters();
    let evicted = bounded(core, key, masters.force_unlock(key))
        .await?
        .map_err(|error| error.into_lock_error(key, masters))?
        .map(|seen| LockInfo::new(key.to_owned(), seen));
    if let Some(info) = &evicted {
        tracing::warn!(
            key,
            holder = info.holder(),
            fencing_token = info.fencing_token(),
            caller = core.config().name.as_str(),
            "redlock: lock force-unlocked"
        );
    }
    Ok(evicted)
}

/// Bounds one operation by the response timeout (twice, for RedLock's fan-out and a
/// moving slot's retries), naming the key when it runs out.
async fn bounded<T>(
    core: &Core,
    key: &str,
    operation: impl Future<Output = T>,
) -> Result<T, LockError> {
    let limit = core.config().response_timeout * 2;
    tokio::time::timeout(limit, operation).await.map_err(|_| {
        LockError::redis(
            key,
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "Redis did not answer within the response timeout",
            )),
        )
    })
}
