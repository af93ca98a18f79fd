//! Operating locks: who holds one, since when, with which fencing token, how many
//! wait — and freeing one whoever holds it. What an on-call engineer needs at 3 a.m.,
//! from code and (through the `redlock` command) from a terminal.
//!
//! Everything is read from the lock itself (see `scripts` on the lock's value), its
//! waitlist and, for a key held in shares, its holders and their names: nothing that
//! outlives a lock. With RedLock a lock
//! is what a majority of masters agree on.

use std::time::Duration;

use futures_util::StreamExt;

use crate::core::Core;
use crate::error::LockError;
use crate::limits::check_key;
use crate::node::{Blankness, Holder, OLDER_HOLDER, Seen, Shares, UseSign};

/// A held lock, as `LockClient::inspect` and `LockClient::locks` see it: held whole
/// (a plain or write lock: [`LockKind::Exclusive`]), or in shares (a read lock's
/// readers, a semaphore's permits: see [`LockInfo::shares`]).
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
    kind: LockKind,
    shares: Vec<Share>,
}

/// How a key is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKind {
    /// By one holder: a plain lock, a write lock or an election's leader.
    Exclusive,
    /// By readers (`LockClient::read_lock`), each with its own share.
    Read,
    /// By holders of a semaphore's permits (`LockClient::semaphore`), each a share.
    Semaphore {
        /// The semaphore's count of permits.
        permits: u32,
    },
}

/// One share of a key held in shares: a reader, or a semaphore permit's holder.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Share {
    client_id: String,
    name: String,
    fencing_token: u64,
    ttl: Duration,
    kept: bool,
}

impl Share {
    /// The id of the `LockClient` holding it: the same for every share one client
    /// (one process, usually) holds, different for every other.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The name of the client holding it (`LockClientBuilder::name`, as
    /// [`LockInfo::holder`] shows for a lock held whole); for a share an older redlock
    /// took, which recorded none, a placeholder saying so.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token its holder was given (its guard's `fencing_token`); 0 for a
    /// share an older redlock took, which recorded none.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// How long its own lease has left (a watchdog renews it before it runs out).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Released already, but kept until its `hold_at_least` has passed.
    pub fn is_kept(&self) -> bool {
        self.kept
    }
}

impl LockInfo {
    fn new(key: String, seen: Seen) -> Self {
        let (kind, shares) = match seen.shares {
            None => (LockKind::Exclusive, Vec::new()),
            Some(Shares { limit, holders }) => {
                let kind = match limit {
                    0 => LockKind::Read,
                    permits => LockKind::Semaphore { permits },
                };
                let shares = holders
                    .into_iter()
                    .map(|Holder { owner, ttl, named }| {
                        let kept = owner.starts_with("kept:");
                        let owner = owner.strip_prefix("kept:").unwrap_or(&owner);
                        // The owner token is `<client id>:<counter>` (`Core::fresh_token`).
                        let client_id = owner.split_once(':').map_or(owner, |(id, _)| id);
                        let (fencing_token, name) =
                            named.unwrap_or_else(|| (0, OLDER_HOLDER.to_owned()));
                        Share {
                            client_id: client_id.to_owned(),
                            name,
                            fencing_token,
                            ttl,
                            kept,
                        }
                    })
                    .collect();
                (kind, shares)
            }
        };
        let holder = match kind {
            LockKind::Exclusive => seen.holder,
            _ => shares_summary(kind, shares.len()),
        };
        LockInfo {
            key,
            kept: seen.owner.starts_with("kept:"),
            holder,
            fencing_token: seen.fencing_token,
            held_for: seen.held_for,
            ttl: seen.ttl,
            waiting: seen.waiting,
            kind,
            shares,
        }
    }

    /// The lock's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The name of the client holding it (`LockClientBuilder::name`; by default
    /// `<hostname>:<pid>`). For a key held in shares, how many: `2 readers`,
    /// `3 of 5 permits` (see [`LockInfo::shares`]).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The fencing token its holder was given; 0 for a key held in shares (each
    /// share's token is its holder's alone).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// How long it has been held (by the server's clock; with RedLock the longest a
    /// majority reports); zero for a key held in shares (not recorded).
    pub fn held_for(&self) -> Duration {
        self.held_for
    }

    /// How long its lease has left (a watchdog renews it before it runs out); for a
    /// key held in shares, the longest share's.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether it is held whole or in shares, and of how many permits.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The shares of a key held in shares (readers, permit holders), the shortest
    /// lease first; empty for a lock held whole.
    pub fn shares(&self) -> &[Share] {
        &self.shares
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

/// `2 readers`, `3 of 5 permits`: what a key held in shares shows as its holder.
fn shares_summary(kind: LockKind, count: usize) -> String {
    match kind {
        LockKind::Semaphore { permits } => format!("{count} of {permits} permits"),
        _ if count == 1 => "1 reader".to_owned(),
        _ => format!("{count} readers"),
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
            shares = info.shares().len(),
            caller = core.config().name.as_str(),
            "redlock: lock force-unlocked"
        );
    }
    Ok(evicted)
}

/// Vouches for every master of a RedLock client that holds no redlock data, or for
/// none (see `LockClient::vouch_for_blank_masters`): how many it marked.
pub(crate) async fn vouch_for_blank_masters(core: &Core) -> Result<usize, LockError> {
    let masters = core.masters();
    let Some(max_lease) = masters.max_lease() else {
        return Err(LockError::invalid_settings(
            "vouching (vouch_for_blank_masters, `redlock vouch`) is for RedLock masters, and \
             this client has one server (or a Cluster, or the primary Sentinel names), which \
             never sits out a quarantine: nothing to vouch for; list every master of the \
             deployment",
        ));
    };
    let quarantine_ms = max_lease.as_millis() as u64;
    // First every master is looked at, and nothing is written unless all are blank: a
    // trace of redlock on any of them says the deployment is in use, and then the blank
    // ones may be masters that lost their locks.
    for blankness in on_every_master(core, false, quarantine_ms).await? {
        let (_, Blankness::Blank | Blankness::AlreadyVouched) = blankness else {
            return Err(not_blank(blankness));
        };
    }
    // Then each is vouched for in one script that looks again: a client's attempt that
    // came in between is seen there, and that master is refused.
    let mut vouched = 0;
    let mut refused = None;
    for blankness in on_every_master(core, true, quarantine_ms).await? {
        match blankness {
            (_, Blankness::Blank) => vouched += 1,
            (_, Blankness::AlreadyVouched) => {}
            other => {
                refused.get_or_insert(other);
            }
        }
    }
    if let Some(refused) = refused {
        return Err(not_blank(refused));
    }
    tracing::info!(
        vouched,
        masters = core.url(),
        caller = core.config().name.as_str(),
        "redlock: vouched for the masters of a new deployment: they vote at once"
    );
    Ok(vouched)
}

/// Runs the vouch script on every master at once (`mark`: vouch, else look), each
/// bounded by the response timeout; what each found, by URL, in the order given. The
/// first master that failed or did not answer is the error.
async fn on_every_master(
    core: &Core,
    mark: bool,
    quarantine_ms: u64,
) -> Result<Vec<(String, Blankness)>, LockError> {
    let limit = core.config().response_timeout;
    let nodes = core.masters().nodes();
    let replies = futures_util::future::join_all(
        nodes
            .iter()
            .map(|node| tokio::time::timeout(limit, node.vouch(mark, quarantine_ms))),
    )
    .await;
    nodes
        .iter()
        .zip(replies)
        .map(|(node, reply)| match reply {
            Ok(Ok(blankness)) => Ok((node.url.clone(), blankness)),
            Ok(Err(source)) => Err(LockError::connect(&node.url, source)),
            Err(_) => Err(LockError::connect(
                &node.url,
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer within the response timeout; a vouch needs every master",
                )),
            )),
        })
        .collect()
}

/// The refusal of a master that is not blank.
fn not_blank((url, blankness): (String, Blankness)) -> LockError {
    let (key, found) = match blankness {
        Blankness::Used { key, sign } => {
            let found = match sign {
                UseSign::Lock => "a lock",
                UseSign::Internal => "a key of redlock's",
                UseSign::Restarted => {
                    "a restart marker naming another Redis process (it restarted with redlock's data)"
                }
                UseSign::Stale => {
                    "a restart marker from before (it restarted with redlock's data, or an older redlock wrote it)"
                }
                UseSign::Voted => {
                    "a restart marker older than max_lease (it may have voted for locks since)"
                }
                UseSign::Counter => "a fencing counter (locks were taken on it)",
            };
            (key, found.to_owned())
        }
        Blankness::TooManyKeys { keys } => (
            String::new(),
            format!(
                "{keys} keys, more than the {} a vouch looks through",
                crate::scripts::VOUCH_KEYS_LOOKED_AT
            ),
        ),
        Blankness::Blank | Blankness::AlreadyVouched => (String::new(), "nothing".to_owned()),
    };
    LockError::NotBlank { url, key, found }
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
