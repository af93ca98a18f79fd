//! The one error type of the runtime: every variant names the key it is about.

use std::fmt;
use std::time::Duration;

/// Why a lock operation failed.
///
/// Every variant that concerns a lock carries its key; [`LockError::key`] returns it.
/// Long keys are shortened in messages (the full key stays in the field).
///
/// The message (`Display`) is one line that says what happened, why (the cause that
/// Redis or the connection reported, on one line, cut after about 200 characters) and,
/// where there is one, what to do: `<what happened> [for key]: <cause>; <fix>`. So the
/// cause is *not* also [`source()`](std::error::Error::source), which returns `None`
/// (a reporter walking the chain, such as `anyhow`'s `{:#}`, would print it twice);
/// code that needs the Redis error itself gets it from [`LockError::redis_error`].
///
/// # What to do about it
///
/// Every error is in exactly one of five classes, by what has to happen next:
///
/// | Variant | Class | What to do |
/// |---|---|---|
/// | [`Timeout`](LockError::Timeout) | busy ([`is_busy`](LockError::is_busy)) | Someone else holds the lock: skip this run, or wait longer |
/// | [`Redis`](LockError::Redis) (but the replies below), [`NoQuorum`](LockError::NoQuorum), [`NotReplicated`](LockError::NotReplicated), [`Connect`](LockError::Connect) (server unreachable) | unavailable ([`is_unavailable`](LockError::is_unavailable)) | Retry later; alert if it lasts |
/// | [`Lost`](LockError::Lost) | lost ([`is_lost`](LockError::is_lost)) | The work done under the lock may overlap another owner's: rely on the fencing token, use a longer lease or the watchdog |
/// | [`InvalidKey`](LockError::InvalidKey), [`InvalidOptions`](LockError::InvalidOptions), [`Connect`](LockError::Connect) (unusable URL), [`Redis`](LockError::Redis) replying `WRONGTYPE`, `NOPERM` or an unknown command, [`NotRedis`](LockError::NotRedis), [`Auth`](LockError::Auth), [`Tls`](LockError::Tls), [`NoDefaultClient`](LockError::NoDefaultClient), [`PermitsMismatch`](LockError::PermitsMismatch), [`WouldDeadlock`](LockError::WouldDeadlock), [`NotALock`](LockError::NotALock), [`NotBlank`](LockError::NotBlank) | misconfigured ([`is_misconfigured`](LockError::is_misconfigured)) | A person fixes the configuration or the code; retrying does not help |
/// | [`ShutDown`](LockError::ShutDown) | shut down | The program is ending: stop taking work |
//
// Display and Error are written out rather than derived with thiserror: the cause is
// in the message, normalized to one line, and `source()` stays empty.
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

    /// Redis answered with an error, did not answer in time, or could not be reached
    /// (the default client's too: its message then names `REDLOCK_URL` and the fixes).
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

    /// A server answers at `url`, but not in the Redis protocol (an HTTP server, or
    /// another service on that port: the URL names the wrong port), or a Redis older
    /// than 6, which does not know the RESP3 handshake.
    NotRedis {
        /// The server (password hidden).
        url: String,
        /// What redis-rs could not parse.
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
    /// that restarted or may have lost data less than `max_lease` ago does not, nor one
    /// redlock never used, until an operator vouches for it: see
    /// `LockClient::vouch_for_blank_masters`).
    NoQuorum {
        /// The lock's key.
        key: String,
        /// Masters that answered and may vote.
        reached: usize,
        /// The majority.
        needed: usize,
        /// The masters that answered but sit out their quarantine, in the order the
        /// client was given them (password hidden), each with how long it has left at
        /// most, as its clock counted when it answered. Empty when every master that
        /// answered may vote (the others did not answer), and for a release, extension
        /// or inspection, which no quarantine holds back.
        sitting_out: Vec<(String, Duration)>,
    },

    /// The lock was acquired, but fewer replicas than required confirmed it (see
    /// `LockClientBuilder::confirm_replicas`); the acquisition was undone. Also, with
    /// `confirm_replicas`, when the primary refused to write it for want of replicas
    /// (`NOREPLICAS`: the server's `min-replicas-to-write`), with `confirmed` 0:
    /// nothing was written. (Without `confirm_replicas`, that refusal is a
    /// [`LockError::Redis`] whose message names `NOREPLICAS`.)
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

    /// `LockClient::vouch_for_blank_masters` (`redlock vouch`) refused: a RedLock
    /// master holds redlock data, so redlock has used it and locks taken on it may
    /// still run; or it holds more keys than a vouch looks through. When the masters
    /// were first looked at, nothing was written on any of them; see that method for
    /// the rare case of a client's attempt arriving in between.
    NotBlank {
        /// The master (password hidden).
        url: String,
        /// The Redis key that shows redlock used it: a lock's key, one of redlock's own
        /// (`redlock:…`), or the restart marker `redlock:boot`. Empty when the master
        /// holds too many keys to look through.
        key: String,
        /// What that key shows, in words (or how many keys the master holds).
        found: String,
    },

    /// No client was given with `set_default_client` and none can be built from
    /// `REDLOCK_URL`: it does not parse or needs a cargo feature, its server refused the
    /// credentials, TLS failed, or it names a port that does not speak Redis; or no
    /// tokio runtime runs. A mistake to fix ([`LockError::is_misconfigured`]). A Redis
    /// that cannot be reached at `REDLOCK_URL` is not this but [`LockError::Redis`]
    /// (unavailable: it may come back), whose message names `REDLOCK_URL`.
    NoDefaultClient {
        /// The key of the call that needed it.
        key: String,
        /// Why none could be built, and what to do, on one line.
        reason: String,
    },
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line: what happened, the cause, and the fix where there is one.
        match self {
            LockError::Timeout { key, waited } => write!(
                f,
                "lock `{}` not acquired: held by another owner for the whole wait of {}",
                Preview(key),
                Rounded(*waited)
            ),
            LockError::Lost { key } => write!(
                f,
                "lock `{}` was lost: its lease ran out or another owner took it; writes made \
                 since must rely on the fencing token, and a longer lease (or the watchdog: no \
                 `lease`) keeps a lock through long work",
                Preview(key)
            ),
            LockError::Redis { key, source } => match default_client_detail(source) {
                Some(detail) => {
                    write!(f, "{}{DEFAULT_CLIENT_CANNOT_CONNECT} {detail}", ForKey(key))
                }
                None => write!(
                    f,
                    "lock `{}`: Redis failed: {}",
                    Preview(key),
                    Cause(source)
                ),
            },
            LockError::Connect { url, source }
                if source.kind() == redis::ErrorKind::InvalidClientConfig =>
            {
                write!(f, "cannot use the Redis URL `{url}`: {}", Cause(source))
            }
            LockError::Connect { url, source } => write!(
                f,
                "cannot connect to Redis at {url}: {}; check that Redis runs at that address",
                Cause(source)
            ),
            LockError::NotRedis { url, source } if is_too_old(source) => write!(
                f,
                "cannot connect to Redis at {url}: the server there is older than Redis 6 (it \
                 does not know the RESP3 handshake): {}; redlock needs Redis 6 or newer (7 for \
                 a Cluster)",
                Cause(source)
            ),
            LockError::NotRedis { url, source } => write!(
                f,
                "cannot connect to Redis at {url}: the server there does not speak the Redis \
                 protocol (an HTTP server? check the port): {}",
                Cause(source)
            ),
            LockError::Auth { url, source } => write!(
                f,
                "Redis at {url} refused the credentials: {}; check the user and password in the \
                 URL (and the user's ACL rules)",
                Cause(source)
            ),
            LockError::Tls { url, source } => write!(
                f,
                "TLS with Redis at {url} failed: {}; check that the port speaks TLS and that its \
                 certificate verifies against the trusted roots (see \
                 LockClientBuilder::tls_root_certificate)",
                Cause(source)
            ),
            LockError::InvalidKey { key, reason } => {
                write!(f, "invalid lock key `{}`: {reason}", Preview(key))
            }
            LockError::InvalidOptions { key, reason } => InvalidOptionsMessage(key, reason).fmt(f),
            LockError::NotALock { key, found } => write!(
                f,
                "lock `{}`: the Redis key holds a {found} that redlock did not write; refusing \
                 to touch it (use another key)",
                Preview(key)
            ),
            LockError::NoQuorum {
                key,
                reached,
                needed,
                sitting_out,
            } if sitting_out.is_empty() => write!(
                f,
                "lock `{}`: only {reached} of the {needed} Redis masters needed for a majority \
                 answered and may vote (a master that restarted, lost data or was never used \
                 by redlock less than max_lease ago does not; a new deployment's masters vote \
                 at once when vouched for: `redlock vouch`)",
                Preview(key)
            ),
            LockError::NoQuorum {
                key,
                reached,
                needed,
                sitting_out,
            } => {
                write!(
                    f,
                    "lock `{}`: only {reached} of the {needed} Redis masters needed for a \
                     majority answered and may vote; sitting out max_lease as restarted or \
                     new:",
                    Preview(key)
                )?;
                for (index, (url, left)) in sitting_out.iter().enumerate() {
                    let comma = if index == 0 { "" } else { "," };
                    write!(f, "{comma} {url} for {} more", Remaining(*left))?;
                }
                f.write_str(
                    " (if this is a new deployment, vouch for its masters with `redlock vouch` \
                     to have them vote at once: see LockClient::vouch_for_blank_masters)",
                )
            }
            LockError::NotReplicated {
                key,
                confirmed,
                needed,
            } => write!(
                f,
                "lock `{}`: only {confirmed} of the {needed} required replicas confirmed the \
                 acquisition; it was undone (are the replicas connected to the primary? see \
                 LockClientBuilder::confirm_replicas)",
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
            LockError::NotBlank { url, key, found } => {
                write!(f, "cannot vouch for the RedLock master {url}: it holds ")?;
                if !key.is_empty() {
                    write!(f, "`{}`, ", Preview(key))?;
                }
                f.write_str(found)?;
                f.write_str(
                    "; vouching is only for masters of a new deployment, on which no lock can \
                     still run: let this one sit out max_lease instead, or clear it by hand if \
                     you know no lock taken on it still runs",
                )
            }
            LockError::NoDefaultClient { key, reason } => {
                write!(
                    f,
                    "{}no default lock client: {}",
                    ForKey(key),
                    OneLine(reason, usize::MAX)
                )
            }
        }
    }
}

impl std::error::Error for LockError {
    /// `None`: the cause is in the message (see [`LockError::redis_error`]).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        None
    }
}

/// How the default client's unreachable Redis is told (see `default_client_unreachable`):
/// the start of the message, and the description of the Redis error that carries the rest.
const DEFAULT_CLIENT_CANNOT_CONNECT: &str = "the default client cannot connect";

/// The rest of the message of a default client that cannot connect, if `source` is one.
fn default_client_detail(source: &redis::RedisError) -> Option<&str> {
    let detail = source.detail()?;
    let text = source.to_string();
    (source.kind() == redis::ErrorKind::Io && text.starts_with(DEFAULT_CLIENT_CANNOT_CONNECT))
        .then_some(detail)
}

/// The longest cause from redis-rs a message shows, in characters.
const CAUSE_SHOWN: usize = 200;

/// A Redis error as a message's cause: on one line, without redis-rs's ` - Kind` tag,
/// cut after [`CAUSE_SHOWN`] characters — except our own configuration errors, whose
/// tail lists the accepted forms.
pub(crate) struct Cause<'a>(pub(crate) &'a redis::RedisError);

impl fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.0.kind();
        let text = self.0.to_string();
        // redis-rs writes its own errors as `description - Kind: detail` (or without
        // the detail): the kind's name is for programs, not people.
        let tag = format!(" - {kind:?}");
        let text = match text.strip_suffix(&tag) {
            Some(description) => description.to_owned(),
            None => text.replacen(&format!("{tag}: "), ": ", 1),
        };
        let limit = if kind == redis::ErrorKind::InvalidClientConfig {
            usize::MAX
        } else {
            CAUSE_SHOWN
        };
        OneLine(&text, limit).fmt(f)
    }
}

/// `text` on one line: runs of whitespace (newlines included) become one space, and
/// after `limit` characters an ellipsis ends it.
struct OneLine<'a>(&'a str, usize);

impl fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let OneLine(text, limit) = *self;
        let mut shown = 0;
        for (n, word) in text.split_whitespace().enumerate() {
            let space = usize::from(n > 0);
            let length = word.chars().count();
            if shown + space + length > limit {
                let room = limit.saturating_sub(shown + space);
                if space == 1 && room > 0 {
                    f.write_str(" ")?;
                }
                let cut: String = word.chars().take(room).collect();
                return write!(f, "{cut}…");
            }
            if space == 1 {
                f.write_str(" ")?;
            }
            f.write_str(word)?;
            shown += space + length;
        }
        Ok(())
    }
}

/// A duration in a message: rounded to the millisecond (`3s`, `3.002s`, `150ms`), not
/// the nanoseconds a measured wait carries.
pub(crate) struct Rounded(pub(crate) Duration);

impl fmt::Display for Rounded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_nanos().saturating_add(500_000) / 1_000_000;
        match u64::try_from(millis) {
            Ok(0) => f.write_str("0s"),
            Ok(millis) => write!(f, "{:?}", Duration::from_millis(millis)),
            Err(_) => write!(f, "{:?}", self.0),
        }
    }
}

/// An error reply that the same request will get again, whenever it is retried: the
/// key holds another type (`WRONGTYPE`, e.g. a `FencedKey` over a string), the ACL user
/// may not run the command (`NOPERM`), or the server does not know it (`ERR unknown
/// command`: a Redis older than the commands redlock uses). A person must act.
fn is_refused_for_good(source: &redis::RedisError) -> bool {
    match source.code() {
        Some("WRONGTYPE" | "NOPERM") => true,
        Some("ERR") => source
            .detail()
            .is_some_and(|detail| detail.starts_with("unknown command")),
        _ => false,
    }
}

/// The RESP3 handshake refused as unknown (`ERR unknown command `HELLO``, which
/// redis-rs turns into `RESP3NotSupported`): a Redis older than 6.
fn is_too_old(source: &redis::RedisError) -> bool {
    source.kind() == redis::ErrorKind::RESP3NotSupported
        || (is_refused_for_good(source)
            && source
                .detail()
                .is_some_and(|detail| detail.to_ascii_uppercase().contains("HELLO")))
}

/// How long a master still sits out, in a message: whole seconds (rounded up) from a
/// second on, milliseconds below.
struct Remaining(Duration);

impl fmt::Display for Remaining {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            write!(f, "{ms}ms")
        } else {
            write!(f, "{}s", ms.div_ceil(1000))
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
    /// The lock key this error is about (empty for connection errors, which precede any
    /// key); for [`LockError::NotBlank`], the Redis key that refused the vouch.
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
            | LockError::NotBlank { key, .. }
            | LockError::NoDefaultClient { key, .. } => key,
            LockError::Connect { .. }
            | LockError::NotRedis { .. }
            | LockError::Auth { .. }
            | LockError::Tls { .. } => "",
        }
    }

    /// The message on one line, with every cause after it told once: what a log line
    /// or a command-line tool prints. The message already carries the cause (see the
    /// type's docs), so this is the message itself; kept for code written when the
    /// cause came after it.
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
    /// } else if error.is_misconfigured() {
    ///     tracing::error!(%error, "fix the configuration or the code");
    /// }
    /// # }
    /// ```
    pub fn is_busy(&self) -> bool {
        self.is_timeout()
    }

    /// Redis could not be used: unreachable, no answer in time, an error reply, too
    /// few RedLock masters or replicas answering, or a default client that could not
    /// connect. Worth retrying later; not a mistake in the call. Mistakes in the
    /// configuration are not (see [`LockError::is_misconfigured`]): a URL that does not
    /// parse or needs a cargo feature, a port where another kind of server (HTTP, say)
    /// answers ([`LockError::NotRedis`]), refused credentials ([`LockError::Auth`]), a
    /// failed TLS handshake ([`LockError::Tls`]), [`LockError::NoDefaultClient`], and
    /// the error replies a retry gets again (`WRONGTYPE`, `NOPERM`, an unknown command).
    pub fn is_unavailable(&self) -> bool {
        match self {
            LockError::Connect { source, .. } => {
                source.kind() != redis::ErrorKind::InvalidClientConfig
            }
            LockError::Redis { source, .. } => !is_refused_for_good(source),
            LockError::NoQuorum { .. } | LockError::NotReplicated { .. } => true,
            _ => false,
        }
    }

    /// A mistake a person must fix in the configuration or the code; retrying does not
    /// help: a key or options that cannot be used, a URL that cannot be used
    /// ([`LockError::Connect`] whose Redis error is `InvalidClientConfig`), a port that
    /// does not speak Redis, refused credentials, a failed TLS handshake, no default
    /// client, a semaphore asked for with another count, a write lock inside a read
    /// lock, a key that holds something else, a vouch for a master redlock has used.
    ///
    /// ```
    /// # fn handle(error: redlock_runtime::LockError) {
    /// if error.is_misconfigured() {
    ///     tracing::error!(%error, "redlock: fix the configuration");
    /// }
    /// # }
    /// ```
    pub fn is_misconfigured(&self) -> bool {
        match self {
            LockError::Connect { source, .. } => {
                source.kind() == redis::ErrorKind::InvalidClientConfig
            }
            LockError::Redis { source, .. } => is_refused_for_good(source),
            LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. }
            | LockError::NotRedis { .. }
            | LockError::Auth { .. }
            | LockError::Tls { .. }
            | LockError::NoDefaultClient { .. }
            | LockError::PermitsMismatch { .. }
            | LockError::WouldDeadlock { .. }
            | LockError::NotALock { .. }
            | LockError::NotBlank { .. } => true,
            _ => false,
        }
    }

    /// The error redis-rs reported, for the variants that carry one ([`LockError::Redis`],
    /// [`LockError::Connect`], [`LockError::NotRedis`], [`LockError::Auth`],
    /// [`LockError::Tls`]): its kind, its server error code. Its text is already in the
    /// message. One exception: when the default client cannot connect, every call that
    /// shared its one attempt gets an `Io` error whose detail is the message's tail
    /// (where, why, what to do), not the connection's own error.
    pub fn redis_error(&self) -> Option<&redis::RedisError> {
        match self {
            LockError::Redis { source, .. }
            | LockError::Connect { source, .. }
            | LockError::NotRedis { source, .. }
            | LockError::Auth { source, .. }
            | LockError::Tls { source, .. } => Some(source),
            _ => None,
        }
    }

    /// A failure to connect to `url`, told apart: refused credentials, a failed TLS
    /// handshake, a server that does not speak Redis, or anything else (unreachable,
    /// bad URL).
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
        } else if source.kind() == redis::ErrorKind::Parse || is_too_old(&source) {
            // The handshake's reply did not parse: something else answers on that port;
            // or a Redis answers that predates the RESP3 handshake.
            LockError::NotRedis { url, source }
        } else {
            LockError::Connect { url, source }
        }
    }

    /// The default client cannot connect to Redis: `detail` says where (`to …`), why
    /// and what to do. Unavailable, as for any unreachable Redis; the message is
    /// `lock `key`: the default client cannot connect <detail>`.
    pub(crate) fn default_client_unreachable(key: &str, detail: String) -> Self {
        LockError::Redis {
            key: key.to_owned(),
            source: redis::RedisError::from((
                redis::ErrorKind::Io,
                DEFAULT_CLIENT_CANNOT_CONNECT,
                detail,
            )),
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

/// `lock `key`: ` before a message about the default client, or nothing when no call
/// asked for it (`default_client()`, which has no key).
struct ForKey<'a>(&'a str);

impl fmt::Display for ForKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            "" => Ok(()),
            key => write!(f, "lock `{}`: ", Preview(key)),
        }
    }
}

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
    fn the_message_carries_its_cause_once_and_source_is_empty() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        let error = LockError::Connect {
            url: "redis://127.0.0.1:1/".into(),
            source: redis::RedisError::from(refused),
        };
        let message = error.to_string();
        assert_eq!(
            message,
            "cannot connect to Redis at redis://127.0.0.1:1/: refused here; check that Redis \
             runs at that address"
        );
        assert!(std::error::Error::source(&error).is_none());
        assert!(
            error
                .redis_error()
                .unwrap()
                .to_string()
                .contains("refused here")
        );
        // The chain, and anything walking `source()` (anyhow's `{:#}`), tell it once.
        assert_eq!(error.chain().to_string(), message);
    }

    #[test]
    fn a_cause_is_shown_on_one_line_and_cut() {
        let parse = |text: &str| LockError::Redis {
            key: "k".into(),
            source: redis::RedisError::from((redis::ErrorKind::Io, "broken", text.to_owned())),
        };
        let message = parse("line one\n  line two\r\n\n\tthree").to_string();
        assert_eq!(
            message,
            "lock `k`: Redis failed: broken: line one line two three"
        );
        let message = parse(&"word ".repeat(500)).to_string();
        assert!(!message.contains('\n'));
        assert!(message.ends_with('…'), "{message}");
        assert!(message.chars().count() < 260, "{message}");
    }

    #[test]
    fn waits_are_shown_to_the_millisecond() {
        let timeout = |waited| {
            LockError::Timeout {
                key: "k".into(),
                waited,
            }
            .to_string()
        };
        assert!(timeout(Duration::from_nanos(3_002_170_097)).ends_with("wait of 3.002s"));
        assert!(timeout(Duration::from_nanos(151_618_249)).ends_with("wait of 152ms"));
        assert!(timeout(Duration::from_secs(3)).ends_with("wait of 3s"));
        assert!(timeout(Duration::ZERO).ends_with("wait of 0s"));
    }

    #[test]
    fn no_quorum_names_each_master_sitting_out_and_for_how_long() {
        let error = LockError::NoQuorum {
            key: "k".into(),
            reached: 0,
            needed: 2,
            sitting_out: vec![
                (
                    "redis://127.0.0.1:7001/".into(),
                    Duration::from_millis(42_001),
                ),
                ("redis://127.0.0.1:7002/".into(), Duration::from_millis(999)),
            ],
        };
        assert_eq!(
            error.to_string(),
            "lock `k`: only 0 of the 2 Redis masters needed for a majority answered and may \
             vote; sitting out max_lease as restarted or new: redis://127.0.0.1:7001/ for 43s \
             more, redis://127.0.0.1:7002/ for 999ms more (if this is a new deployment, vouch \
             for its masters with `redlock vouch` to have them vote at once: see \
             LockClient::vouch_for_blank_masters)"
        );
        let error = LockError::NotBlank {
            url: "redis://127.0.0.1:7001/".into(),
            key: String::new(),
            found: "200000 keys".into(),
        };
        assert!(
            error
                .to_string()
                .starts_with("cannot vouch for the RedLock master redis://127.0.0.1:7001/: it holds 200000 keys; "),
            "{error}"
        );
    }

    /// One value of each variant.
    fn every_variant() -> Vec<LockError> {
        let redis = |kind, text: &str| redis::RedisError::from((kind, "failed", text.to_owned()));
        let key = || "k".to_owned();
        let url = || "redis://127.0.0.1:1/".to_owned();
        vec![
            LockError::Timeout {
                key: key(),
                waited: Duration::from_secs(1),
            },
            LockError::Lost { key: key() },
            LockError::Redis {
                key: key(),
                source: redis(redis::ErrorKind::Io, "refused"),
            },
            LockError::Connect {
                url: url(),
                source: redis(redis::ErrorKind::Io, "refused"),
            },
            LockError::Connect {
                url: url(),
                source: redis(redis::ErrorKind::InvalidClientConfig, "not a URL"),
            },
            LockError::NotRedis {
                url: url(),
                source: redis(redis::ErrorKind::Parse, "HTTP"),
            },
            LockError::Auth {
                url: url(),
                source: redis(redis::ErrorKind::AuthenticationFailed, "WRONGPASS"),
            },
            LockError::Tls {
                url: url(),
                source: redis(redis::ErrorKind::Io, "certificate"),
            },
            LockError::InvalidKey {
                key: key(),
                reason: "empty".into(),
            },
            LockError::InvalidOptions {
                key: key(),
                reason: "wait".into(),
            },
            LockError::NotALock {
                key: key(),
                found: "hash".into(),
            },
            LockError::NoQuorum {
                key: key(),
                reached: 1,
                needed: 2,
                sitting_out: Vec::new(),
            },
            LockError::NoQuorum {
                key: key(),
                reached: 0,
                needed: 2,
                sitting_out: vec![(url(), Duration::from_millis(42_300))],
            },
            LockError::NotReplicated {
                key: key(),
                confirmed: 0,
                needed: 1,
            },
            LockError::PermitsMismatch {
                key: key(),
                requested: 3,
                existing: 5,
            },
            LockError::WouldDeadlock { key: key() },
            LockError::ShutDown { key: key() },
            LockError::NotBlank {
                url: url(),
                key: "redlock:boot".into(),
                found: "a restart marker".into(),
            },
            LockError::NoDefaultClient {
                key: key(),
                reason: "no runtime".into(),
            },
            LockError::default_client_unreachable("k", "to there: refused; start it".into()),
        ]
    }

    #[test]
    fn a_default_client_error_without_a_key_names_none() {
        let error = LockError::NoDefaultClient {
            key: String::new(),
            reason: "REDLOCK_URL=x cannot be used".into(),
        };
        assert_eq!(
            error.to_string(),
            "no default lock client: REDLOCK_URL=x cannot be used"
        );
        let error = LockError::NoDefaultClient {
            key: "order:1".into(),
            reason: "why".into(),
        };
        assert_eq!(
            error.to_string(),
            "lock `order:1`: no default lock client: why"
        );
    }

    #[test]
    fn every_error_is_in_exactly_one_class() {
        for error in every_variant() {
            let classes = [
                error.is_busy(),
                error.is_unavailable(),
                error.is_lost(),
                error.is_misconfigured(),
                matches!(error, LockError::ShutDown { .. }),
            ];
            assert_eq!(
                classes.iter().filter(|&&class| class).count(),
                1,
                "{error:?}: busy, unavailable, lost, misconfigured, shut down = {classes:?}"
            );
            let message = error.to_string();
            assert!(!message.contains('\n'), "{message}");
            assert!(std::error::Error::source(&error).is_none(), "{error:?}");
        }
    }

    #[test]
    fn configuration_mistakes_are_not_unavailable() {
        let errors = every_variant();
        let misconfigured: Vec<_> = errors
            .iter()
            .filter(|error| error.is_misconfigured())
            .map(|error| {
                format!("{error:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            misconfigured,
            [
                "Connect",
                "NotRedis",
                "Auth",
                "Tls",
                "InvalidKey",
                "InvalidOptions",
                "NotALock",
                "PermitsMismatch",
                "WouldDeadlock",
                "NotBlank",
                "NoDefaultClient"
            ]
        );
    }
}
