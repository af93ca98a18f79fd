//! The one error type of the runtime: every variant names the key it is about.

use std::fmt;
use std::time::Duration;

/// Why a lock operation failed.
///
/// Every variant that concerns a lock carries its key; [`LockError::key`] returns it.
/// Long keys are shortened in messages (the full key stays in the field). A message
/// does not repeat its cause: the Redis error is [`source()`](std::error::Error::source),
/// which error reporters print after it (`anyhow`'s `{:#}`, `tracing`'s error fields),
/// and [`LockError::chain`] writes both on one line.
//
// Display and Error are written out rather than derived with thiserror: a derived
// `source()` would return the redis-rs error even where redis-rs repeats its inner
// I/O error's text, and every reporter would print that text twice.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was held by another owner for the whole `wait`.
    Timeout {
        /// The lock's key.
        key: String,
        /// How long the acquisition waited.
        waited: Duration,
    },

    /// The lock is no longer ours: its lease ran out, or another owner took it, or it was deleted.
    Lost {
        /// The lock's key.
        key: String,
    },

    /// Redis answered with an error, did not answer in time, or could not be reached.
    Redis {
        /// The lock's key.
        key: String,
        /// What redis-rs reported.
        source: redis::RedisError,
    },

    /// The client could not connect to the Redis it was given, or the URL (or
    /// `REDLOCK_URL` spec) cannot be used: then `source`'s kind is
    /// `InvalidClientConfig` and it says why and what the accepted forms are.
    Connect {
        /// The server, or the spec, as given (password hidden).
        url: String,
        /// What went wrong.
        source: redis::RedisError,
    },

    /// Redis refused the credentials of the URL (ACL user and password, or password):
    /// `WRONGPASS`, `NOAUTH` and the like.
    Auth {
        /// The server (password hidden).
        url: String,
        /// Redis's refusal.
        source: redis::RedisError,
    },

    /// The TLS connection to a `rediss://` server failed: most often a certificate that
    /// does not verify against the trusted roots (`tls_root_certificate`, or the
    /// system's), or a server that does not speak TLS on that port.
    Tls {
        /// The server (password hidden).
        url: String,
        /// What the TLS layer reported.
        source: redis::RedisError,
    },

    /// The key cannot be used as a lock name.
    InvalidKey {
        /// The key as given.
        key: String,
        /// Why not (empty, too long, in the reserved `redlock:` namespace).
        reason: String,
    },

    /// The options of an acquisition, or the client's settings (then `key` is empty and
    /// `reason` names the setting), contradict each other or are out of range.
    InvalidOptions {
        /// The lock's key, or empty for a client setting.
        key: String,
        /// Which option, and what it may be.
        reason: String,
    },

    /// The key exists in Redis but does not hold a lock written by redlock
    /// (another type of value, or a value without expiry).
    NotALock {
        /// The lock's key.
        key: String,
        /// What the key holds (a Redis type, or `string`).
        found: String,
    },

    /// Fewer than a majority of the RedLock masters answered and may vote (a master
    /// that restarted or may have lost data less than `max_lease` ago does not).
    NoQuorum {
        /// The lock's key.
        key: String,
        /// Masters that answered and may vote.
        reached: usize,
        /// The majority.
        needed: usize,
    },

    /// The lock was acquired, but fewer replicas than required confirmed it (see
    /// `LockClientBuilder::confirm_replicas`); the acquisition was undone. Also when
    /// the primary refused to write it for want of replicas (`NOREPLICAS`: the
    /// server's `min-replicas-to-write`), with `confirmed` 0: nothing was written.
    NotReplicated {
        /// The lock's key.
        key: String,
        /// Replicas that confirmed in time.
        confirmed: usize,
        /// Replicas required.
        needed: usize,
    },

    /// The key is held in shares of another kind than asked for: a semaphore of
    /// `existing` permits asked for with `requested` permits (every client of a
    /// semaphore must give the same count), or a read lock (`0`) asked for as a
    /// semaphore, or the other way round.
    PermitsMismatch {
        /// The semaphore's (or read-write lock's) key.
        key: String,
        /// The permits asked for (0: a read lock).
        requested: u32,
        /// The permits it is held with (0: a read lock).
        existing: u32,
    },

    /// A write (exclusive) lock was asked for inside a call that holds only a read
    /// lock on the same key, in the same task: waiting for it would wait for itself.
    WouldDeadlock {
        /// The lock's key.
        key: String,
    },

    /// The client was shut down (`LockClient::shutdown`, or `shutdown_default_client`
    /// for the default client): it takes no new lock, and the locks it held were
    /// released, this one included if it was held.
    ShutDown {
        /// The lock's key.
        key: String,
    },

    /// No client was given with `set_default_client` and none could be built from `REDLOCK_URL`.
    NoDefaultClient {
        /// The key of the call that needed it.
        key: String,
        /// Why none could be built.
        reason: String,
    },
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No message repeats its cause: the Redis error is `source()`.
        match self {
            LockError::Timeout { key, waited } => write!(
                f,
                "lock `{}` not acquired: held by another owner for the whole wait of {waited:?}",
                Preview(key)
            ),
            LockError::Lost { key } => write!(
                f,
                "lock `{}` was lost: its lease ran out or another owner took it",
                Preview(key)
            ),
            LockError::Redis { key, .. } => write!(f, "lock `{}`: Redis failed", Preview(key)),
            LockError::Connect { url, source }
                if source.kind() == redis::ErrorKind::InvalidClientConfig =>
            {
                write!(f, "cannot use the Redis URL `{url}`")
            }
            LockError::Connect { url, .. } => write!(f, "cannot connect to Redis at {url}"),
            LockError::Auth { url, .. } => write!(
                f,
                "Redis at {url} refused the credentials (the user and password in the URL)"
            ),
            LockError::Tls { url, .. } => write!(
                f,
                "TLS with Redis at {url} failed (does its certificate verify against the \
                 trusted roots? see LockClientBuilder::tls_root_certificate)"
            ),
            LockError::InvalidKey { key, reason } => {
                write!(f, "invalid lock key `{}`: {reason}", Preview(key))
            }
            LockError::InvalidOptions { key, reason } => InvalidOptionsMessage(key, reason).fmt(f),
            LockError::NotALock { key, found } => write!(
                f,
                "lock `{}`: the Redis key holds a {found} that redlock did not write; refusing \
                 to touch it",
                Preview(key)
            ),
            LockError::NoQuorum {
                key,
                reached,
                needed,
            } => write!(
                f,
                "lock `{}`: only {reached} of the {needed} Redis masters needed for a majority \
                 answered and may vote (a master that restarted, lost data or was never used \
                 by redlock less than max_lease ago does not: a first deployment waits \
                 max_lease once)",
                Preview(key)
            ),
            LockError::NotReplicated {
                key,
                confirmed,
                needed,
            } => write!(
                f,
                "lock `{}`: only {confirmed} of the {needed} required replicas confirmed the \
                 acquisition; it was undone",
                Preview(key)
            ),
            LockError::PermitsMismatch {
                key,
                requested,
                existing,
            } => write!(
                f,
                "lock `{}`: {}",
                Preview(key),
                SharesMessage(*requested, *existing)
            ),
            LockError::WouldDeadlock { key } => write!(
                f,
                "lock `{}`: a write lock was requested while this task holds a read lock on the \
                 same key, which would wait for itself; take the write lock in the outer call (a \
                 read inside a write re-enters)",
                Preview(key)
            ),
            LockError::ShutDown { key } => write!(
                f,
                "lock `{}`: the lock client was shut down; it takes no new lock and released \
                 the ones it held",
                Preview(key)
            ),
            LockError::NoDefaultClient { key, reason } => {
                write!(
                    f,
                    "lock `{}`: no default lock client: {reason}",
                    Preview(key)
                )
            }
        }
    }
}

impl std::error::Error for LockError {
    /// The Redis error, if any. redis-rs writes an I/O or parse error's text as its own
    /// and also returns it as its `source()`; then that inner error is the cause, so
    /// that a reporter walking the chain (anyhow's `{:#}`) prints each cause once.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let redis = match self {
            LockError::Redis { source, .. }
            | LockError::Connect { source, .. }
            | LockError::Auth { source, .. }
            | LockError::Tls { source, .. } => source,
            _ => return None,
        };
        match std::error::Error::source(redis) {
            Some(inner) if inner.to_string() == redis.to_string() => Some(inner),
            _ => Some(redis),
        }
    }
}

/// What `PermitsMismatch` says: both kinds, in words.
struct SharesMessage(u32, u32);

impl fmt::Display for SharesMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = |permits: u32| match permits {
            0 => "a read-write lock".to_owned(),
            1 => "a semaphore of 1 permit".to_owned(),
            n => format!("a semaphore of {n} permits"),
        };
        write!(
            f,
            "asked for as {} but held as {}; every client must ask for the same kind and count",
            kind(self.0),
            kind(self.1)
        )
    }
}

impl LockError {
    /// The lock key this error is about (empty for connection errors, which precede any key).
    pub fn key(&self) -> &str {
        match self {
            LockError::Timeout { key, .. }
            | LockError::Lost { key }
            | LockError::Redis { key, .. }
            | LockError::InvalidKey { key, .. }
            | LockError::InvalidOptions { key, .. }
            | LockError::NotALock { key, .. }
            | LockError::NoQuorum { key, .. }
            | LockError::NotReplicated { key, .. }
            | LockError::PermitsMismatch { key, .. }
            | LockError::WouldDeadlock { key }
            | LockError::ShutDown { key }
            | LockError::NoDefaultClient { key, .. } => key,
            LockError::Connect { .. } | LockError::Auth { .. } | LockError::Tls { .. } => "",
        }
    }

    /// The message and every cause after it on one line (`a: b: c`), each told once:
    /// what a log line or a command-line tool prints.
    ///
    /// ```
    /// # fn show(error: &redlock_runtime::LockError) {
    /// eprintln!("{}", error.chain());
    /// # }
    /// ```
    pub fn chain(&self) -> impl fmt::Display + '_ {
        Chain(self)
    }

    /// True for [`LockError::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, LockError::Timeout { .. })
    }

    /// True for [`LockError::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost { .. })
    }

    /// Someone else held the lock for the whole wait ([`LockError::Timeout`]): the
    /// normal case for a scheduled job that another instance runs, not a failure.
    ///
    /// ```
    /// # fn handle(error: redlock_runtime::LockError) {
    /// if error.is_busy() {
    ///     tracing::debug!(%error, "another instance runs it; skipping");
    /// } else if error.is_unavailable() {
    ///     tracing::warn!(%error, "Redis is unavailable; retrying later");
    /// }
    /// # }
    /// ```
    pub fn is_busy(&self) -> bool {
        self.is_timeout()
    }

    /// Redis could not be used: unreachable, no answer in time, an error reply, too
    /// few RedLock masters or replicas answering, or a default client that could not
    /// connect. Worth retrying later; not a mistake in the call. Mistakes in the
    /// configuration are not: a URL that does not parse or needs a cargo feature,
    /// refused credentials ([`LockError::Auth`]), a certificate that does not verify
    /// ([`LockError::Tls`]).
    pub fn is_unavailable(&self) -> bool {
        match self {
            LockError::Connect { source, .. } => {
                source.kind() != redis::ErrorKind::InvalidClientConfig
            }
            LockError::Redis { .. }
            | LockError::NoQuorum { .. }
            | LockError::NotReplicated { .. } => true,
            _ => false,
        }
    }

    /// A failure to connect to `url`, told apart: refused credentials, a failed TLS
    /// handshake, or anything else (unreachable, bad URL).
    pub(crate) fn connect(url: &str, source: redis::RedisError) -> Self {
        let url = url.to_owned();
        let text = source.to_string();
        let has = |needle: &str| text.contains(needle);
        if source.kind() == redis::ErrorKind::AuthenticationFailed
            || has("WRONGPASS")
            || has("NOAUTH")
            || has("NOPERM")
        {
            LockError::Auth { url, source }
        } else if has("certificate")
            || has("CertificateRequired")
            || has("InvalidContentType")
            || has("HandshakeFailure")
            || has("tls handshake")
            || has("received corrupt message")
        {
            LockError::Tls { url, source }
        } else {
            LockError::Connect { url, source }
        }
    }

    /// A connect error that a later attempt may not meet (not `Auth`, not `Tls`, not a
    /// configuration mistake).
    pub(crate) fn is_outage(&self) -> bool {
        matches!(self, LockError::Connect { .. }) && self.is_unavailable()
    }

    pub(crate) fn redis(key: &str, source: redis::RedisError) -> Self {
        LockError::Redis {
            key: key.to_owned(),
            source,
        }
    }

    /// A client setting out of range, found at `connect()`.
    pub(crate) fn invalid_settings(reason: impl Into<String>) -> Self {
        LockError::InvalidOptions {
            key: String::new(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid_options(key: &str, reason: impl Into<String>) -> Self {
        LockError::InvalidOptions {
            key: key.to_owned(),
            reason: reason.into(),
        }
    }
}

/// For functions returning `std::io::Result`: a timeout is `TimedOut`, the rest `Other`.
impl From<LockError> for std::io::Error {
    fn from(error: LockError) -> Self {
        let kind = match error {
            LockError::Timeout { .. } => std::io::ErrorKind::TimedOut,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, error)
    }
}

/// An error and its causes, each written once: a cause whose text its parent already
/// holds (redis-rs repeats its I/O error's) is skipped.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut written = self.0.to_string();
        f.write_str(&written)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !written.contains(&text) {
                write!(f, ": {text}")?;
                written.push_str(&text);
            }
            cause = error.source();
        }
        Ok(())
    }
}

struct InvalidOptionsMessage<'a>(&'a str, &'a str);

impl fmt::Display for InvalidOptionsMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidOptionsMessage("", reason) => write!(f, "invalid lock client setting: {reason}"),
            InvalidOptionsMessage(key, reason) => {
                write!(f, "invalid options for lock `{}`: {reason}", Preview(key))
            }
        }
    }
}

/// Shows a key in a message: escaped (newlines and NULs stay visible) and cut after
/// 80 characters so that a 1 MiB key does not flood a log line.
struct Preview<'a>(&'a str);

impl fmt::Display for Preview<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 80;
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(SHOWN) {
            write!(f, "{}", c.escape_debug())?;
        }
        let rest = chars.count();
        if rest > 0 {
            write!(f, "… ({rest} more characters)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_key_and_shorten_long_ones() {
        let short = LockError::Lost {
            key: "order:42".into(),
        };
        assert!(short.to_string().contains("`order:42`"));
        let long = LockError::InvalidKey {
            key: "k".repeat(1 << 20),
            reason: "too long".into(),
        };
        let message = long.to_string();
        assert!(message.len() < 300, "{message}");
        assert!(message.contains("more characters"));
        let odd = LockError::Lost {
            key: "a\nb\0c".into(),
        };
        assert!(odd.to_string().contains("a\\nb\\0c"));
    }

    #[test]
    fn a_message_does_not_repeat_its_cause_and_the_chain_tells_each_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        let error = LockError::Connect {
            url: "redis://127.0.0.1:1/".into(),
            source: redis::RedisError::from(refused),
        };
        let message = error.to_string();
        assert!(!message.contains("refused here"), "{message}");
        let source = std::error::Error::source(&error)
            .expect("the Redis error")
            .to_string();
        assert!(source.contains("refused here"), "{source}");
        let chain = error.chain().to_string();
        assert_eq!(chain.matches("refused here").count(), 1, "{chain}");
        assert!(chain.starts_with(&message), "{chain}");
        // Walking `source()` as any reporter does (anyhow's `{:#}`) tells it once too.
        let mut walked = message.clone();
        let mut cause = std::error::Error::source(&error);
        while let Some(next) = cause {
            walked.push_str(&format!(": {next}"));
            cause = next.source();
        }
        assert_eq!(walked.matches("refused here").count(), 1, "{walked}");
    }
}
