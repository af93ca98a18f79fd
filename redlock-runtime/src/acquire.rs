//! Acquisition: the builder, the attempt script, and the wait for a release.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;
use tracing::Instrument;

use crate::client::{LockClient, MAX_KEY_LEN};
use crate::error::LockError;
use crate::guard::{Acquired, LockGuard};
use crate::notify::Listener;
use crate::scripts;

/// Longest lease or wait accepted: Redis keeps expiries in milliseconds as a signed
/// 64-bit count from the epoch, and an instant that far ahead overflows the clock.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// First and longest pause before retrying after Redis failed to answer.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(500));

/// An acquisition being set up: `client.lock(key).wait(..).lease(..).acquire().await`.
#[must_use = "nothing is locked until `.acquire().await`"]
#[derive(Debug)]
pub struct LockRequest {
    client: LockClient,
    key: String,
    wait: Duration,
    lease: Option<Duration>,
    hold_at_least: Option<Duration>,
}

impl LockRequest {
    pub(crate) fn new(client: LockClient, key: String) -> Self {
        LockRequest {
            client,
            key,
            wait: Duration::ZERO,
            lease: None,
            hold_at_least: None,
        }
    }

    /// How long to wait for a holder to release (default zero: one attempt).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease: the lock expires after it unless extended. Without one the lock
    /// is held with the client's watchdog lease, renewed for as long as the guard lives.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Like ShedLock's `lockAtLeastFor`: a release before this much time has passed
    /// since acquisition keeps the key until it has, so that a late-firing copy of a
    /// scheduled job cannot run it again.
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = Some(hold);
        self
    }

    /// Acquires the lock, waiting up to `wait` for it.
    ///
    /// Fails with [`LockError::Timeout`] when another owner held it for the whole wait.
    /// Dropping the returned future mid-way leaves nothing behind: a lock the attempt
    /// may have taken is released in the background.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let span = tracing::debug_span!(
            "redlock.acquire",
            key = %self.key,
            wait = ?self.wait,
            lease = ?self.lease,
            outcome = tracing::field::Empty,
            waited = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = self.acquire_inner(started).instrument(span.clone()).await;
        span.record("waited", tracing::field::debug(started.elapsed()));
        span.record(
            "outcome",
            match &result {
                Ok(_) => "acquired",
                Err(LockError::Timeout { .. }) => "timeout",
                Err(_) => "error",
            },
        );
        result
    }

    async fn acquire_inner(self, started: Instant) -> Result<LockGuard, LockError> {
        let LockRequest {
            client,
            key,
            wait,
            lease,
            hold_at_least,
        } = self;
        validate(&key, wait, lease, hold_at_least)?;
        let watchdog = lease.is_none();
        let lease = lease.unwrap_or(client.inner.config.watchdog_lease);
        let lease_ms = lease_millis(&key, lease)?;
        let deadline = started + wait;
        let timeout = || LockError::Timeout {
            key: key.clone(),
            waited: started.elapsed(),
        };

        let turn = client
            .inner
            .queues
            .take_turn(&key, deadline)
            .await
            .ok_or_else(timeout)?;
        let mut listener: Option<Listener> = None;
        let mut backoff = RETRY_BACKOFF.0;
        loop {
            // A fresh owner token per attempt: the background clean-up of an attempt
            // whose reply was lost must not be able to delete a later attempt's lock.
            let owner = uuid::Uuid::new_v4().simple().to_string();
            let sent_at = Instant::now();
            match attempt(&client, &key, &owner, lease_ms).await {
                Ok(Attempt::Acquired(fencing_token)) => {
                    return Ok(LockGuard::new(Acquired {
                        client,
                        key,
                        owner,
                        fencing_token,
                        sent_at,
                        lease,
                        watchdog,
                        hold_at_least,
                        turn,
                    }));
                }
                Ok(Attempt::Held { ttl }) => {
                    backoff = RETRY_BACKOFF.0;
                    if Instant::now() >= deadline {
                        return Err(timeout());
                    }
                    let Some(listening) = &listener else {
                        // Listen, then try again at once: a release published between the
                        // failed attempt and the subscription would otherwise be missed.
                        let (fresh, confirmed) = client
                            .inner
                            .notifications
                            .listen(scripts::release_channel(&key));
                        listener = Some(fresh);
                        if let Ok(Err(error)) = tokio::time::timeout_at(deadline, confirmed).await {
                            tracing::debug!(%error, "redlock: subscription failed; waiting on the lease alone");
                        }
                        continue;
                    };
                    // Retry at the release notification, or when the holder's lease runs out.
                    let lease_end = Instant::now() + ttl + Duration::from_millis(1);
                    tokio::select! {
                        _ = listening.released() => {}
                        _ = tokio::time::sleep_until(lease_end.min(deadline)) => {}
                    }
                }
                Ok(Attempt::NotALock { found }) => {
                    return Err(LockError::NotALock { key, found });
                }
                Err(error) if is_transient(&error) && Instant::now() + backoff < deadline => {
                    tracing::debug!(%error, ?backoff, "redlock: Redis unavailable; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RETRY_BACKOFF.1);
                }
                Err(error) => return Err(LockError::redis(&key, error)),
            }
        }
    }
}

impl IntoFuture for LockRequest {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

enum Attempt {
    Acquired(u64),
    Held { ttl: Duration },
    NotALock { found: String },
}

/// One run of the acquire script. If this future is dropped while Redis may have run
/// the script, the lock it may hold is released in the background.
async fn attempt(
    client: &LockClient,
    key: &str,
    owner: &str,
    lease_ms: u64,
) -> redis::RedisResult<Attempt> {
    let mut in_flight = InFlight {
        client,
        key,
        owner,
        armed: true,
    };
    let mut connection = client.inner.connection.clone();
    let reply: redis::RedisResult<(i64, Value)> = scripts::ACQUIRE
        .key(key)
        .key(scripts::FENCE_KEY)
        .arg(owner)
        .arg(lease_ms)
        .invoke_async(&mut connection)
        .await;
    let (status, value) = match reply {
        Ok(reply) => reply,
        // The script may have run before the reply was lost: make sure it holds nothing.
        Err(error) => return Err(error),
    };
    in_flight.armed = false;
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Int(number) => number.to_string(),
        other => format!("{other:?}"),
    };
    let number = |value: &Value| match value {
        Value::Int(number) => u64::try_from(*number).ok(),
        other => text(other).parse().ok(),
    };
    let bad_reply = || {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply from the acquire script",
            format!("{status} {value:?}"),
        ))
    };
    match status {
        1 => {
            let token = number(&value).ok_or_else(bad_reply)?;
            Ok(Attempt::Acquired(token))
        }
        0 => {
            let ttl = number(&value).ok_or_else(bad_reply)?;
            Ok(Attempt::Held {
                ttl: Duration::from_millis(ttl),
            })
        }
        _ => Ok(Attempt::NotALock {
            found: text(&value),
        }),
    }
}

/// Armed while an acquire script may have run without its reply having been read.
struct InFlight<'a> {
    client: &'a LockClient,
    key: &'a str,
    owner: &'a str,
    armed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut connection = self.client.inner.connection.clone();
        let key = self.key.to_owned();
        let owner = self.owner.to_owned();
        runtime.spawn(async move {
            // Compare-and-delete: harmless if the attempt took nothing.
            let outcome: redis::RedisResult<i64> = scripts::RELEASE
                .key(&key)
                .arg(&owner)
                .arg(0)
                .arg(scripts::release_channel(&key))
                .invoke_async(&mut connection)
                .await;
            tracing::debug!(%key, ?outcome, "redlock: cleaned up after an interrupted acquire");
        });
    }
}

fn is_transient(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
}

/// Checks a request before anything is sent.
fn validate(
    key: &str,
    wait: Duration,
    lease: Option<Duration>,
    hold_at_least: Option<Duration>,
) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "the key is empty".into(),
        });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason: format!(
                "the key is {} bytes long; the limit is {MAX_KEY_LEN}",
                key.len()
            ),
        });
    }
    if wait > MAX_DURATION {
        return Err(LockError::invalid_options(
            key,
            format!("wait of {wait:?} is longer than the limit of 100 years"),
        ));
    }
    if let Some(lease) = lease {
        lease_millis(key, lease)?;
        if let Some(hold) = hold_at_least
            && hold > lease
        {
            return Err(LockError::invalid_options(
                key,
                format!("hold_at_least ({hold:?}) is longer than the lease ({lease:?})"),
            ));
        }
    }
    if let Some(hold) = hold_at_least
        && hold > MAX_DURATION
    {
        return Err(LockError::invalid_options(
            key,
            format!("hold_at_least of {hold:?} is longer than the limit of 100 years"),
        ));
    }
    Ok(())
}

/// A lease in whole milliseconds, as Redis counts it; below one millisecond is refused.
pub(crate) fn lease_millis(key: &str, lease: Duration) -> Result<u64, LockError> {
    if lease < Duration::from_millis(1) {
        return Err(LockError::invalid_options(
            key,
            format!("lease of {lease:?} is shorter than Redis's 1 ms resolution"),
        ));
    }
    if lease > MAX_DURATION {
        return Err(LockError::invalid_options(
            key,
            format!("lease of {lease:?} is longer than the limit of 100 years"),
        ));
    }
    Ok(lease.as_millis() as u64)
}
