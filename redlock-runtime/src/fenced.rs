//! Fenced writes to Redis: a resource that takes a write only from a writer whose
//! fencing token is at least the highest it has seen.
//!
//! A lock alone cannot stop a holder that was paused (a GC pause, a stopped VM, a
//! long network stall) past its lease: when it wakes up, another holder has the lock
//! and has written, and the paused one writes over it. The fencing token is the cure
//! only if the *store* checks it: here, the resource is a Redis hash that keeps the
//! highest token that wrote it in its field `redlock:fence`, and one script compares
//! and writes, so no write can slip between the check and the write.
//!
//! The script stands here rather than in `scripts`: it touches a key of the user's,
//! none of the lock's, and uses no connection of the client's — any
//! `redis::aio::ConnectionLike` will do, which is what lets it work wherever the
//! user keeps the resource.

use std::sync::LazyLock;

use redis::ToRedisArgs;

use crate::error::LockError;
use crate::limits::check_key;

/// The field of a fenced resource's hash that holds the highest token that wrote it.
pub(crate) const FENCE_FIELD: &str = "redlock:fence";

/// KEYS[1] the resource (a hash); ARGV[1] the writer's token (decimal); ARGV[2..] the
/// fields and values to write, in pairs.
///
/// Tokens are compared as decimal strings (length, then bytes), not as Lua numbers:
/// a Lua number is a double, exact only up to 2^53, and a token may be any u64.
/// Replies `{1, previous}` (previous: the highest token before, `""` for none) when
/// written, `{0, seen}` when refused.
static WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        r"
local seen = redis.call('HGET', KEYS[1], '{FENCE_FIELD}')
local token = ARGV[1]
if seen and (#seen > #token or (#seen == #token and seen > token)) then
  return {{0, seen}}
end
redis.call('HSET', KEYS[1], '{FENCE_FIELD}', token, unpack(ARGV, 2))
return {{1, seen or ''}}
"
    ))
});

/// A resource kept in Redis (a counter, a job's state, a cached balance) that only
/// the newest holder of the lock guarding it may change.
///
/// The resource is a Redis hash: [`write`](FencedKey::write) sets some of its fields
/// if the writer's fencing token is at least the highest that wrote it before (kept
/// in the field `redlock:fence`), in one script, and says [`FencedWrite::Stale`]
/// otherwise. Read the fields with `HGET`/`HGETALL` as usual.
///
/// ```no_run
/// # async fn demo(client: redlock_runtime::LockClient, mut data: redis::aio::MultiplexedConnection)
/// # -> Result<(), redlock_runtime::LockError> {
/// use std::time::Duration;
/// use redlock_runtime::{FencedKey, FencedWrite};
///
/// let guard = client.lock("job:7").lease(Duration::from_secs(10)).acquire().await?;
/// // … the work, during which this process may be paused past its lease …
/// let job = FencedKey::new("job-state:7");
/// match job.write(&mut data, guard.fencing_token(), &[("state", "done")]).await? {
///     FencedWrite::Written { .. } => {}
///     FencedWrite::Stale { seen } => {
///         // A newer holder (token `seen`) wrote it: our result is out of date.
///     }
/// }
/// # Ok(()) }
/// ```
///
/// **Where it works.** The write goes to whatever connection it is given: one
/// server, a Sentinel-watched primary, or a Cluster connection, which sends it to the
/// resource key's slot (one key: no cross-slot question). The resource need not live
/// where the locks do. The fence is data like the fields beside it: it survives a
/// failover as far as the write was replicated (`WAIT` after the write, if that
/// matters). **With RedLock**, keep the resource on your data's Redis, not
/// on the lock masters: a fenced write is a write to one store, and a copy on each
/// master would not be agreed on by a majority. The token of a RedLock lock fences it
/// like any other: each acquisition's token is above every earlier one of the key
/// (written back to the majority).
///
/// Tokens are those of one lock: fence a resource with the tokens of the lock that
/// guards it, always the same one. Equal tokens are accepted (the holder writing
/// twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedKey {
    key: String,
}

/// What a [`FencedKey::write`] did. Two answers, and only two: not
/// `#[non_exhaustive]`, so that a `match` on it needs no catch-all that would swallow
/// a stale write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedWrite {
    /// The fields were written, and the resource's fence raised to the writer's token.
    Written {
        /// The highest token that wrote the resource before; `None` when it had none
        /// (a new resource, or one never written fenced).
        previous: Option<u64>,
    },
    /// Refused, nothing written: a writer with a newer token has written the resource.
    Stale {
        /// The highest token that wrote it.
        seen: u64,
    },
}

impl FencedKey {
    /// The resource kept under `key` (a Redis hash). The key follows the rules of a
    /// lock's name: not empty, not in the reserved `redlock:` namespace; a bad one is
    /// refused by [`write`](FencedKey::write) and [`seen`](FencedKey::seen) with
    /// [`LockError::InvalidKey`].
    pub fn new(key: impl Into<String>) -> Self {
        FencedKey { key: key.into() }
    }

    /// The resource's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Sets `fields` (name, value pairs) of the resource if `token` is at least the
    /// highest token that wrote it, and raises its fence to `token`; otherwise writes
    /// nothing and returns [`FencedWrite::Stale`]. No fields raises the fence alone (a
    /// new holder claiming the resource before its work).
    ///
    /// Errors: [`LockError::InvalidKey`] for a bad key, [`LockError::InvalidOptions`]
    /// for a field named `redlock:fence`, [`LockError::Redis`] when Redis fails or
    /// the key holds something other than a hash (`WRONGTYPE`).
    pub async fn write<C, V>(
        &self,
        connection: &mut C,
        token: u64,
        fields: &[(&str, V)],
    ) -> Result<FencedWrite, LockError>
    where
        C: redis::aio::ConnectionLike,
        V: ToRedisArgs,
    {
        check_key(&self.key)?;
        if fields.iter().any(|(name, _)| *name == FENCE_FIELD) {
            return Err(LockError::InvalidOptions {
                key: self.key.clone(),
                reason: format!("the field `{FENCE_FIELD}` holds the resource's fence"),
            });
        }
        let mut script = WRITE.key(&self.key);
        script.arg(token.to_string());
        for (name, value) in fields {
            script.arg(*name).arg(value);
        }
        let reply: (i64, String) = script
            .invoke_async(connection)
            .await
            .map_err(|source| self.redis_error(source))?;
        parse_write_reply(reply).map_err(|source| self.redis_error(source))
    }

    /// The highest token that wrote the resource, `None` if none did.
    pub async fn seen<C>(&self, connection: &mut C) -> Result<Option<u64>, LockError>
    where
        C: redis::aio::ConnectionLike,
    {
        check_key(&self.key)?;
        redis::cmd("HGET")
            .arg(&self.key)
            .arg(FENCE_FIELD)
            .query_async(connection)
            .await
            .map_err(|source| self.redis_error(source))
    }

    fn redis_error(&self, source: redis::RedisError) -> LockError {
        LockError::Redis {
            key: self.key.clone(),
            source,
        }
    }
}

/// The write script's reply: `(1, previous or "")` written, `(0, seen)` refused.
fn parse_write_reply((written, token): (i64, String)) -> redis::RedisResult<FencedWrite> {
    let number = |text: &str| {
        text.parse::<u64>().map_err(|_| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "the resource's fence is not a token",
                text.to_owned(),
            ))
        })
    };
    Ok(match written {
        1 if token.is_empty() => FencedWrite::Written { previous: None },
        1 => FencedWrite::Written {
            previous: Some(number(&token)?),
        },
        _ => FencedWrite::Stale {
            seen: number(&token)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_says_written_or_stale() {
        assert_eq!(
            parse_write_reply((1, String::new())).unwrap(),
            FencedWrite::Written { previous: None }
        );
        assert_eq!(
            parse_write_reply((1, "18446744073709551615".into())).unwrap(),
            FencedWrite::Written {
                previous: Some(u64::MAX)
            }
        );
        assert_eq!(
            parse_write_reply((0, "7".into())).unwrap(),
            FencedWrite::Stale { seen: 7 }
        );
        assert!(parse_write_reply((0, "seven".into())).is_err());
    }
}
