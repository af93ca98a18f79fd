//! The runtime side of `#[distributed_lock]`: the default client, reentrancy and
//! `current_lock()`, and the one function the expansion calls.
//!
//! # Reentrancy
//! Each annotated call that takes a lock runs its body inside a tokio task-local scope
//! that records the lock (and, through a parent link, the locks of the calls around
//! it). A nested annotated call on the same key with the same client finds it there and
//! runs without touching Redis; the lock is released when the outermost call returns.
//! Re-entering is not holding: the nested call's own `on_lost` governs the lock it
//! enters, which may already be lost (an enclosing `on_lost = "continue"` call that
//! outlived its lease), see `reenter`.
//! The scope covers the holder's call tree: futures the body awaits or joins (`join!`,
//! `select!`) run under it; tasks it spawns do not, and wait for the lock like anyone.
//! A call with `keys = [...]` records each of its keys: a nested call on any of them
//! enters as it would for a call with one `key`.

use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::client::LockClient;
use crate::config::{ClientConfig, DEFAULT_URL, redact};
use crate::error::{Cause, LockError, Rounded};
use crate::multi::{NO_KEYS, canonical};
use crate::state::LockState;

tokio::task_local! {
    static HELD: Arc<EnclosingLock>;
}

/// The locks of one annotated call: one for `key`, each key of `keys` in canonical
/// order (all in `mode`).
struct EnclosingLock {
    client_id: u64,
    mode: LockMode,
    locks: Vec<CurrentLock>,
    outer: Option<Arc<EnclosingLock>>,
}

/// The lock on `key` of client `client_id` that an annotated call around this code
/// holds (the innermost such call), and its mode.
fn enclosing_hold(
    mut enclosing: Option<&EnclosingLock>,
    client_id: u64,
    key: &str,
) -> Option<(LockMode, CurrentLock)> {
    while let Some(held) = enclosing {
        if held.client_id == client_id
            && let Some(lock) = held.locks.iter().find(|lock| lock.key == key)
        {
            return Some((held.mode, lock.clone()));
        }
        enclosing = held.outer.as_deref();
    }
    None
}

/// A lock held by the annotated function this code runs in.
#[derive(Clone)]
pub struct CurrentLock {
    key: String,
    fencing_token: u64,
    state: Option<Arc<LockState>>,
}

impl std::fmt::Debug for CurrentLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentLock")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl PartialEq for CurrentLock {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.fencing_token == other.fencing_token
    }
}

impl Eq for CurrentLock {}

impl CurrentLock {
    /// The lock's key, as the attribute built it from its template (`order:42`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of the acquisition; pass it with storage writes.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// True once the lock is known gone (found missing by the watchdog or `extend`),
    /// or its lease may have run out: writes made now must rely on the fencing token.
    pub fn is_lost(&self) -> bool {
        self.state.as_ref().is_none_or(|state| state.is_lost())
    }
}

/// The lock of the innermost `#[distributed_lock]` call around this code, if any.
/// Inside a call with `keys = [...]`, the first of its keys in their canonical (byte)
/// order: [`current_locks`] gives each of them.
pub fn current_lock() -> Option<CurrentLock> {
    HELD.try_with(|held| held.locks.first().cloned())
        .ok()
        .flatten()
}

/// Every lock of the innermost `#[distributed_lock]` call around this code: one for a
/// call with `key`, each key of a call with `keys = [...]` in canonical (byte) order,
/// each with its own fencing token; empty outside any annotated call.
pub fn current_locks() -> Vec<CurrentLock> {
    HELD.try_with(|held| held.locks.clone()).unwrap_or_default()
}

static DEFAULT_CLIENT: RwLock<Option<LockClient>> = RwLock::new(None);

/// Sets the client that `#[distributed_lock]` uses when it names no `client`.
///
/// Without it, the first annotated call connects to `REDLOCK_URL` (default
/// `redis://127.0.0.1:6379/`) and keeps that client. The client's connection lives in
/// the tokio runtime that created it.
pub fn set_default_client(client: LockClient) {
    *DEFAULT_CLIENT.write().unwrap_or_else(|e| e.into_inner()) = Some(client);
}

/// Shuts the default client down (see [`LockClient::shutdown`]): annotated calls that
/// name no client take no lock from then on ([`LockError::ShutDown`]), the locks it
/// holds are released and the releases running in the background are waited for.
/// Does nothing when no default client was set or connected yet. Call it as a program
/// that uses `#[distributed_lock]` ends:
///
/// ```no_run
/// # async fn serve() {}
/// # async fn run() -> Result<(), redlock_runtime::LockError> {
/// tokio::select! {
///     _ = serve() => {}
///     _ = tokio::signal::ctrl_c() => {}
/// }
/// redlock_runtime::shutdown_default_client().await?;
/// # Ok(()) }
/// ```
pub async fn shutdown_default_client() -> Result<(), LockError> {
    let client = DEFAULT_CLIENT
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    match client {
        Some(client) => client.shutdown().await,
        None => Ok(()),
    }
}

/// The client `#[distributed_lock]` uses when it names none: the one given to
/// [`set_default_client`], or else one connected once to `REDLOCK_URL`. Calls made
/// while it connects share that one attempt.
pub async fn default_client() -> Result<LockClient, LockError> {
    default_client_for("", None).await
}

/// How a connection attempt of the default client failed, for every call that shared
/// it (each makes its own error, naming its own key).
#[derive(Clone)]
enum NoClient {
    /// Redis cannot be reached (`is_unavailable`): where and why, as
    /// [`unreachable_detail`] writes it.
    Unreachable(String),
    /// A mistake in the configuration (`is_misconfigured`): a `REDLOCK_URL` that cannot
    /// be used, refused credentials, TLS, a port that does not speak Redis. Why, and
    /// what to do.
    Refused(String),
}

impl NoClient {
    /// How `error`, from connecting the default client to `redlock_url` (`None`: not
    /// set), is told to every call that shared the attempt.
    fn from_error(redlock_url: Option<&str>, error: &LockError) -> Self {
        if error.is_unavailable() {
            let cause = match error.redis_error() {
                Some(source) => Cause(source).to_string(),
                None => error.to_string(),
            };
            NoClient::Unreachable(unreachable_detail(redlock_url, &cause))
        } else {
            NoClient::Refused(refused_reason(redlock_url, error))
        }
    }

    fn error(&self, key: &str) -> LockError {
        match self {
            NoClient::Unreachable(detail) => {
                LockError::default_client_unreachable(key, detail.clone())
            }
            NoClient::Refused(reason) => LockError::NoDefaultClient {
                key: key.to_owned(),
                reason: reason.clone(),
            },
        }
    }
}

/// What the default client connects to, as messages name it: `REDLOCK_URL=<url>`
/// (passwords hidden), or the default URL and that `REDLOCK_URL` is not set.
fn where_from(redlock_url: Option<&str>) -> String {
    match redlock_url {
        Some(url) => format!("REDLOCK_URL={}", redact(url.trim())),
        None => format!("{DEFAULT_URL} (REDLOCK_URL is not set; this is its default)"),
    }
}

/// The rest of `the default client cannot connect …` (see
/// `LockError::default_client_unreachable`): where, why (`cause`), and the fixes.
fn unreachable_detail(redlock_url: Option<&str>, cause: &str) -> String {
    let set = if redlock_url.is_some() {
        "correct REDLOCK_URL"
    } else {
        "set REDLOCK_URL"
    };
    format!(
        "to {}: {cause}; start Redis there, {set}, or call \
         redlock_runtime::set_default_client at startup",
        where_from(redlock_url)
    )
}

/// The reason of `NoDefaultClient` when connecting to `redlock_url` failed with a
/// configuration mistake (`error`, whose message says which and how to fix it).
fn refused_reason(redlock_url: Option<&str>, error: &LockError) -> String {
    let why = match error {
        // The spec itself: its message would name the URL a second time.
        LockError::Connect { source, .. }
            if source.kind() == redis::ErrorKind::InvalidClientConfig =>
        {
            Cause(source).to_string()
        }
        // The others (credentials, TLS, not Redis) name the server themselves.
        error => {
            let from = match redlock_url {
                Some(_) => "REDLOCK_URL",
                None => "the default URL (REDLOCK_URL is not set)",
            };
            return format!(
                "set_default_client was not called, and {from} cannot be used: {error}; \
                 correct REDLOCK_URL, or call redlock_runtime::set_default_client at startup"
            );
        }
    };
    format!(
        "set_default_client was not called, and {} cannot be used: {why}; correct \
         REDLOCK_URL, or call redlock_runtime::set_default_client at startup",
        where_from(redlock_url)
    )
}

/// Redis is down, not misconfigured: said so (`is_unavailable`), naming the key.
fn unreachable(key: &str, cause: &str) -> LockError {
    let redlock_url = std::env::var("REDLOCK_URL").ok();
    LockError::default_client_unreachable(key, unreachable_detail(redlock_url.as_deref(), cause))
}

/// One connection attempt of the default client: `None` until it ends.
type Attempt = tokio::sync::watch::Receiver<Option<Result<LockClient, NoClient>>>;

/// The attempt under way, if any. Calls that find none connected join it rather than
/// queue for their own: N first calls against a Redis that never answers would
/// otherwise return one connect timeout after another, the last after N of them.
static ATTEMPT: Mutex<Option<Attempt>> = Mutex::new(None);

fn default_if_set() -> Option<LockClient> {
    DEFAULT_CLIENT
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The default client for a call on `key` whose `wait` is given: it waits for the
/// connection at most that long plus the response timeout, the bound of any call
/// (`None`, [`default_client`]: until the attempt ends, which its connect timeouts
/// bound). The attempt runs in a task of its own: a call that stops waiting (or is
/// dropped) leaves it running, and a later call finds its client.
async fn default_client_for(key: &str, wait: Option<Duration>) -> Result<LockClient, LockError> {
    if let Some(client) = default_if_set() {
        return Ok(client);
    }
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(LockError::NoDefaultClient {
            key: key.to_owned(),
            reason: "the default client connects in a tokio runtime, and none is running"
                .to_owned(),
        });
    }
    let mut attempt = join_or_start_attempt();
    // Ends with the attempt's outcome, or with its task dropped unfinished.
    let ended = attempt.wait_for(Option::is_some);
    match wait {
        Some(wait) => {
            let bound = wait.saturating_add(ClientConfig::default().response_timeout);
            if tokio::time::timeout(bound, ended).await.is_err() {
                return Err(unreachable(
                    key,
                    &format!(
                        "still connecting after {} (the call's wait plus the response \
                         timeout)",
                        Rounded(bound)
                    ),
                ));
            }
        }
        None => drop(ended.await),
    }
    let outcome = attempt.borrow().clone();
    match outcome {
        Some(Ok(client)) => Ok(client),
        Some(Err(failure)) => Err(failure.error(key)),
        None => Err(unreachable(
            key,
            "the connection attempt ended without an outcome (its runtime shut down)",
        )),
    }
}

/// The attempt under way, or a new one (after a failure the next call tries again:
/// Redis may be back).
fn join_or_start_attempt() -> Attempt {
    let mut slot = ATTEMPT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(client) = default_if_set() {
        // Connected while this call looked: nothing to wait for.
        return tokio::sync::watch::channel(Some(Ok(client))).1;
    }
    if let Some(attempt) = slot.as_ref() {
        // Under way: not ended, and its task still there to end it.
        if attempt.borrow().is_none() && attempt.has_changed().is_ok() {
            return attempt.clone();
        }
    }
    let (sender, attempt) = tokio::sync::watch::channel(None);
    *slot = Some(attempt.clone());
    let ours = attempt.clone();
    tokio::spawn(async move {
        let redlock_url = std::env::var("REDLOCK_URL").ok();
        let outcome = LockClient::from_env()
            .await
            .map_err(|error| NoClient::from_error(redlock_url.as_deref(), &error));
        if let Ok(client) = &outcome {
            // Before the waiters hear of it: a call that comes after finds it set.
            set_default_client(client.clone());
        }
        let mut slot = ATTEMPT.lock().unwrap_or_else(|e| e.into_inner());
        if slot
            .as_ref()
            .is_some_and(|attempt| attempt.same_channel(&ours))
        {
            *slot = None;
        }
        drop(slot);
        sender.send_replace(Some(outcome));
    });
    attempt
}

/// Settings of one annotated function, from the attribute's literals.
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    pub wait: Duration,
    pub lease: Option<Duration>,
    pub hold_at_least: Option<Duration>,
    pub abort_on_lost: bool,
    /// The key's template as written (`order:<id>`): the `lock` label of the metrics,
    /// one per annotated function whatever the ids (`LockRequest::label`).
    pub label: &'static str,
    /// Which lock of the key: `mode = "read"` / `"write"`, or `permits = N`.
    pub mode: LockMode,
}

/// What a nested annotated call on a key its task already holds does.
#[derive(Debug, PartialEq, Eq)]
enum Reentry {
    /// Runs under the lock held around it, without touching Redis.
    Enter,
    /// Fails at once: waiting would wait for the task itself.
    Refuse,
}

/// A write inside a write, a read inside a read or a write (a downgrade), a permit
/// inside a permit: the enclosing hold covers it. A write (or a permit) inside only a
/// read would wait for the read, which waits for it: refused.
fn reentry(held: LockMode, wanted: LockMode) -> Reentry {
    match (held, wanted) {
        (LockMode::Exclusive, LockMode::Exclusive | LockMode::Read)
        | (LockMode::Read, LockMode::Read) => Reentry::Enter,
        (LockMode::Permits(held), LockMode::Permits(wanted)) if held == wanted => Reentry::Enter,
        // A write inside a read or a permit would not exclude the other holders, and
        // waiting for it would wait for the task itself; a permit inside a write or a
        // read, or of another count, is another lock on the same key.
        _ => Reentry::Refuse,
    }
}

/// The kind of lock an annotated function takes on its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// The exclusive lock (`mode = "write"`, or no `mode`): `LockClient::lock`, the same
    /// lock as `LockClient::write_lock`.
    Exclusive,
    /// A shared read lock (`mode = "read"`): `LockClient::read_lock`.
    Read,
    /// One of N permits (`permits = N`): `LockClient::semaphore`.
    Permits(u32),
}

/// What `client = …` of `#[distributed_lock]` takes: a [`LockClient`], a reference to
/// one (however many `&`), or an `Arc` or `Box` of one.
#[diagnostic::on_unimplemented(
    message = "`client = …` needs a `LockClient`, not `{Self}`",
    label = "not a `LockClient`",
    note = "`client =` takes a `LockClient`, a reference to one, or an `Arc` of one",
    note = "a `redis::Client` becomes one with `LockClient::from_redis(client).await?`; a URL with `LockClient::connect(url).await?`"
)]
pub trait AsLockClient {
    /// The client.
    fn as_lock_client(&self) -> &LockClient;
}

#[diagnostic::do_not_recommend]
impl AsLockClient for LockClient {
    fn as_lock_client(&self) -> &LockClient {
        self
    }
}

#[diagnostic::do_not_recommend]
impl AsLockClient for Arc<LockClient> {
    fn as_lock_client(&self) -> &LockClient {
        self
    }
}

#[diagnostic::do_not_recommend]
impl AsLockClient for Box<LockClient> {
    fn as_lock_client(&self) -> &LockClient {
        self
    }
}

#[diagnostic::do_not_recommend]
impl<C: AsLockClient + ?Sized> AsLockClient for &C {
    fn as_lock_client(&self) -> &LockClient {
        (**self).as_lock_client()
    }
}

/// What a `#[distributed_lock]` function returns: a `Result` (under any name: an alias
/// such as `AppResult<T>` or `anyhow::Result<T>` is the same type), so that a failure to
/// lock can be returned.
#[diagnostic::on_unimplemented(
    message = "a `#[distributed_lock]` function must return a `Result<T, E>` whose error type implements `From<LockError>`, not `{Self}`",
    label = "not a `Result`",
    note = "a failure to lock is returned as the error: return e.g. `Result<T, redlock_runtime::LockError>`, or `Result<T, E>` with `impl From<LockError> for E`"
)]
pub trait LockedResult: Sized {
    /// The success type.
    type Value;
    /// The error type.
    type Error;
    /// As a plain `Result`.
    fn into_result(self) -> Result<Self::Value, Self::Error>;
    /// From a plain `Result`.
    fn from_result(result: Result<Self::Value, Self::Error>) -> Self;
}

#[diagnostic::do_not_recommend]
impl<T, E> LockedResult for Result<T, E> {
    type Value = T;
    type Error = E;
    fn into_result(self) -> Self {
        self
    }
    fn from_result(result: Self) -> Self {
        result
    }
}

/// The error type of a `#[distributed_lock]` function: it must carry a [`LockError`]
/// (`From<LockError>`), returned when the lock cannot be taken.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry a `LockError`, which a `#[distributed_lock]` function returns when it cannot lock",
    label = "the error type of this `Result` needs `From<LockError>`",
    note = "add `impl From<redlock_runtime::LockError> for {Self}`, or with thiserror a variant `#[error(transparent)] Lock(#[from] redlock_runtime::LockError)`"
)]
pub trait FromLockError {
    /// The error for a lock that could not be taken.
    fn from_lock_error(error: LockError) -> Self;
}

#[diagnostic::do_not_recommend]
impl<E: From<LockError>> FromLockError for E {
    fn from_lock_error(error: LockError) -> Self {
        E::from(error)
    }
}

/// What `on_busy = "skip"` needs: a function returning `Result<Option<T>, E>`, which
/// returns `Ok(None)` without running its body when another holds the lock.
#[diagnostic::on_unimplemented(
    message = "`on_busy = \"skip\"` needs a function returning `Result<Option<T>, E>`, not `{Self}`",
    label = "make this `Result<Option<T>, E>`: a skipped call returns `Ok(None)`",
    note = "or drop `on_busy = \"skip\"` to get `Err(LockError::Timeout)` when the lock is busy"
)]
pub trait SkippableResult {
    /// `Ok(None)`.
    fn skipped() -> Self;
}

#[diagnostic::do_not_recommend]
impl<T, E> SkippableResult for Result<Option<T>, E> {
    fn skipped() -> Self {
        Ok(None)
    }
}

/// How the expansion converts the function's return type `R`: plain functions the
/// expansion names through the traits above, so that a wrong type is reported on the
/// user's code, with the traits' messages, not inside this function.
#[allow(missing_debug_implementations)]
pub struct Conversions<R, T, E> {
    pub into_result: fn(R) -> Result<T, E>,
    pub from_lock_error: fn(LockError) -> E,
    /// `on_busy = "skip"`: the value to return when the lock is busy.
    pub skipped: Option<fn() -> R>,
}

/// Runs `body` under the lock `key`: acquires (or re-enters), runs, releases.
pub async fn run_locked<R, T, E, F>(
    client: Option<LockClient>,
    key: String,
    spec: LockSpec,
    body: F,
    conversions: Conversions<R, T, E>,
) -> Result<T, E>
where
    F: Future<Output = R>,
{
    let Conversions {
        into_result,
        from_lock_error,
        skipped,
    } = conversions;
    let client = match client {
        Some(client) => client,
        None => default_client_for(&key, Some(spec.wait))
            .await
            .map_err(from_lock_error)?,
    };
    let outer = HELD.try_with(Arc::clone).ok();
    if let Some((mode, lock)) = enclosing_hold(outer.as_deref(), client.id(), &key) {
        return match reentry(mode, spec.mode) {
            Reentry::Enter => {
                let entered = EnclosingLock {
                    client_id: client.id(),
                    mode,
                    locks: vec![lock],
                    outer,
                };
                reenter(entered, spec.abort_on_lost, body, into_result)
                    .await
                    .map_err(from_lock_error)?
            }
            Reentry::Refuse => Err(from_lock_error(LockError::WouldDeadlock { key })),
        };
    }

    let request = match spec.mode {
        LockMode::Exclusive => client.lock(key.clone()),
        LockMode::Read => client.read_lock(key.clone()),
        LockMode::Permits(permits) => client.semaphore(key.clone(), permits),
    };
    let mut request = request.wait(spec.wait).static_label(spec.label);
    if let Some(lease) = spec.lease {
        request = request.lease(lease);
    }
    if let Some(hold) = spec.hold_at_least {
        request = request.hold_at_least(hold);
    }
    let guard = match (request.acquire().await, skipped) {
        (Ok(guard), _) => guard,
        (Err(error), Some(skipped)) if error.is_busy() => {
            // A scheduled job another instance runs: the normal case, not a failure.
            tracing::debug!(error = %error.chain(), "redlock: busy; the call is skipped (on_busy = \"skip\")");
            return into_result(skipped());
        }
        (Err(error), _) => return Err(from_lock_error(error)),
    };
    let held = Arc::new(EnclosingLock {
        client_id: client.id(),
        mode: spec.mode,
        locks: vec![CurrentLock {
            key,
            fencing_token: guard.fencing_token(),
            state: guard.state(),
        }],
        outer,
    });
    let body = HELD.scope(held, body);
    let result = if spec.abort_on_lost {
        tokio::select! {
            biased;
            result = body => into_result(result),
            () = guard.lost() => {
                tracing::warn!(key = %guard.key(), "redlock: lock lost; the body was stopped at its await point");
                let key = guard.key().to_owned();
                drop(guard);
                return Err(from_lock_error(LockError::Lost { key }));
            }
        }
    } else {
        into_result(body.await)
    };
    // The body ran to its end: its result stands, whatever the release finds. A
    // caller must be able to tell that the work was done (a charge made, a draw held):
    // returning `Lost` now would invite a retry that does it twice.
    let (key, fencing_token) = (guard.key().to_owned(), guard.fencing_token());
    match guard.release().await {
        Ok(()) => {}
        Err(LockError::Lost { .. }) => tracing::warn!(
            %key,
            fencing_token,
            "redlock.lost: the lock was gone when the body completed (lease ran out, or the key was \
             deleted or taken); the body's result is returned, writes it made relied on the fencing token"
        ),
        // Redis unreachable: a lock we could not release runs out with its lease.
        Err(error) => {
            tracing::warn!(error = %error.chain(), "redlock: the release after the body failed")
        }
    }
    result
}

/// Runs `body` under several keys as one (`keys = [...]` of the attribute): acquires
/// them with [`LockClient::lock_all`] (or re-enters those a call around it holds), runs,
/// releases. Like [`run_locked`] otherwise: the default client when none is named,
/// `on_busy = "skip"` when a key stayed busy, `abort_on_lost` when any key is lost,
/// the lease, `hold_at_least` and the label (the static label of every key) of `spec`.
/// `spec.mode` must be [`LockMode::Exclusive`], the only mode the attribute allows with
/// `keys`.
///
/// Keys an enclosing call of the same task holds are entered, not taken again; the
/// others are taken with `lock_all`. The global order then covers only the keys taken
/// here: a task that holds a key and waits for one below it, against a task doing the
/// reverse, can wait until `wait` runs out (a `Timeout`, never a hang).
pub async fn run_locked_all<R, T, E, F>(
    client: Option<LockClient>,
    keys: Vec<String>,
    spec: LockSpec,
    body: F,
    conversions: Conversions<R, T, E>,
) -> Result<T, E>
where
    F: Future<Output = R>,
{
    let Conversions {
        into_result,
        from_lock_error,
        skipped,
    } = conversions;
    let keys = canonical(keys);
    let Some(first) = keys.first().cloned() else {
        return Err(from_lock_error(LockError::invalid_options(
            NO_KEYS,
            "`keys = [...]` gave no keys: name at least one",
        )));
    };
    if spec.mode != LockMode::Exclusive {
        return Err(from_lock_error(LockError::invalid_options(
            &first,
            "several keys are locked exclusively only: `keys = [...]` takes no `mode` or \
             `permits`",
        )));
    }
    let client = match client {
        Some(client) => client,
        None => default_client_for(&first, Some(spec.wait))
            .await
            .map_err(from_lock_error)?,
    };
    let outer = HELD.try_with(Arc::clone).ok();
    let mut entered = Vec::new();
    let mut to_take = Vec::new();
    for key in &keys {
        match enclosing_hold(outer.as_deref(), client.id(), key) {
            Some((mode, lock)) => match reentry(mode, LockMode::Exclusive) {
                Reentry::Enter => entered.push(lock),
                Reentry::Refuse => {
                    let key = key.clone();
                    return Err(from_lock_error(LockError::WouldDeadlock { key }));
                }
            },
            None => to_take.push(key.clone()),
        }
    }
    if to_take.is_empty() {
        let entered = EnclosingLock {
            client_id: client.id(),
            mode: LockMode::Exclusive,
            locks: entered,
            outer,
        };
        return reenter(entered, spec.abort_on_lost, body, into_result)
            .await
            .map_err(from_lock_error)?;
    }

    let mut request = client
        .lock_all(to_take)
        .wait(spec.wait)
        .static_label(spec.label);
    if let Some(lease) = spec.lease {
        request = request.lease(lease);
    }
    if let Some(hold) = spec.hold_at_least {
        request = request.hold_at_least(hold);
    }
    let guard = match (request.acquire().await, skipped) {
        (Ok(guard), _) => guard,
        (Err(error), Some(skipped)) if error.is_busy() => {
            tracing::debug!(error = %error.chain(), "redlock: busy; the call is skipped (on_busy = \"skip\")");
            return into_result(skipped());
        }
        (Err(error), _) => return Err(from_lock_error(error)),
    };
    let taken: Vec<CurrentLock> = guard
        .held()
        .map(|(key, fencing_token, state)| CurrentLock {
            key: key.to_owned(),
            fencing_token,
            state,
        })
        .collect();
    let mut locks: Vec<CurrentLock> = entered.into_iter().chain(taken).collect();
    locks.sort_by(|a, b| a.key.cmp(&b.key));
    let held = Arc::new(EnclosingLock {
        client_id: client.id(),
        mode: LockMode::Exclusive,
        locks: locks.clone(),
        outer,
    });
    let body = HELD.scope(held, body);
    let result = if spec.abort_on_lost {
        tokio::select! {
            biased;
            result = body => into_result(result),
            key = first_lost(&locks) => {
                tracing::warn!(%key, "redlock: lock lost; the body was stopped at its await point");
                // The other keys are still held: given back before the error returns
                // (the release is bounded by the response timeout; it reports the lost
                // key, which is known already).
                let _ = guard.release().await;
                return Err(from_lock_error(LockError::Lost { key }));
            }
        }
    } else {
        into_result(body.await)
    };
    // The body ran to its end: its result stands (see `run_locked`).
    let keys = guard.keys().join(", ");
    match guard.release().await {
        Ok(()) => {}
        Err(LockError::Lost { key }) => tracing::warn!(
            %key,
            %keys,
            "redlock.lost: a lock was gone when the body completed (lease ran out, or the key was \
             deleted or taken); the body's result is returned, writes it made relied on the fencing tokens"
        ),
        Err(error) => {
            tracing::warn!(error = %error.chain(), "redlock: the release after the body failed")
        }
    }
    result
}

/// The key of the first of `locks` to be lost (one with no state counts as lost).
async fn first_lost(locks: &[CurrentLock]) -> String {
    let each = locks.iter().map(|lock| {
        Box::pin(async move {
            if let Some(state) = &lock.state {
                state.lost().await;
            }
            lock.key.clone()
        })
    });
    futures_util::future::select_all(each).await.0
}

/// Runs a nested call's `body` under the locks held around it (`entered`: one, or the
/// keys of a `keys = [...]` call, with the mode they are held in), which the nested
/// call's own `on_lost` governs as if it had taken them; `current_lock()` and
/// `current_locks()` in the body name the nested call's own keys. The enclosing call may be `on_lost = "continue"` and have
/// outlived its lease: re-entering is not holding.
/// With `on_lost = "abort"` a lock already lost (known gone, or its lease may have run
/// out: the enclosing call's own knowledge, no round trip) fails the call with
/// [`LockError::Lost`] before the body runs, and one lost while it runs stops it at its
/// next `.await`, as for a lock of its own. With `"continue"` the body runs, and
/// `current_lock().is_lost()` tells it, as it tells the enclosing body.
async fn reenter<R, T, E, F>(
    entered: EnclosingLock,
    abort_on_lost: bool,
    body: F,
    into_result: fn(R) -> Result<T, E>,
) -> Result<Result<T, E>, LockError>
where
    F: Future<Output = R>,
{
    let locks = entered.locks.clone();
    let body = HELD.scope(Arc::new(entered), body);
    if !abort_on_lost || locks.is_empty() {
        return Ok(into_result(body.await));
    }
    if let Some(lost) = locks.iter().find(|lock| lock.is_lost()) {
        let key = lost.key.clone();
        tracing::warn!(%key, "redlock: the enclosing call's lock was lost; the nested call does not run (on_lost = \"abort\")");
        return Err(LockError::Lost { key });
    }
    tokio::select! {
        biased;
        result = body => Ok(into_result(result)),
        key = first_lost(&locks) => {
            tracing::warn!(%key, "redlock: lock lost; the nested call's body was stopped at its await point");
            Err(LockError::Lost { key })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LockMode, NoClient, Reentry, reentry};
    use crate::error::LockError;

    /// The default client's failures, told without connecting (never to 6379).
    #[test]
    fn the_default_client_says_where_it_connects_why_it_cannot_and_what_to_do() {
        let refused = |redlock_url: Option<&str>| {
            let error = LockError::connect(
                redlock_url.unwrap_or(crate::DEFAULT_URL),
                redis::RedisError::from(std::io::Error::from_raw_os_error(111)),
            );
            NoClient::from_error(redlock_url, &error).error("order:1")
        };
        let unset = refused(None);
        assert!(
            unset.is_unavailable() && !unset.is_misconfigured(),
            "{unset:?}"
        );
        assert_eq!(
            unset.to_string(),
            "lock `order:1`: the default client cannot connect to redis://127.0.0.1:6379/ \
             (REDLOCK_URL is not set; this is its default): Connection refused (os error 111); \
             start Redis there, set REDLOCK_URL, or call redlock_runtime::set_default_client at \
             startup"
        );
        let set = refused(Some("redis://:s3cret@127.0.0.1:7777/"));
        assert!(set.is_unavailable(), "{set:?}");
        assert_eq!(
            set.to_string(),
            "lock `order:1`: the default client cannot connect to \
             REDLOCK_URL=redis://***@127.0.0.1:7777/: Connection refused (os error 111); start \
             Redis there, correct REDLOCK_URL, or call redlock_runtime::set_default_client at \
             startup"
        );

        // Refused credentials with REDLOCK_URL unset: a mistake, not an outage.
        let wrong = LockError::connect(
            crate::DEFAULT_URL,
            redis::RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "WRONGPASS",
                "invalid username-password pair".to_owned(),
            )),
        );
        let error = NoClient::from_error(None, &wrong).error("order:1");
        assert!(
            matches!(error, LockError::NoDefaultClient { .. }),
            "{error:?}"
        );
        assert!(error.is_misconfigured() && !error.is_unavailable());
        let message = error.to_string();
        assert!(!message.contains('\n'), "{message}");
        for needle in [
            "order:1",
            "REDLOCK_URL is not set",
            "refused the credentials",
            "invalid username-password pair",
            "set_default_client",
        ] {
            assert!(message.contains(needle), "{needle:?} missing: {message}");
        }
    }

    /// A nested call finds a key of an enclosing `keys = [...]` call, of its client
    /// only, through any number of calls in between.
    #[test]
    fn a_key_of_an_enclosing_multi_lock_is_found() {
        use super::{CurrentLock, EnclosingLock, enclosing_hold};
        use std::sync::Arc;
        let lock = |key: &str, fencing_token| CurrentLock {
            key: key.to_owned(),
            fencing_token,
            state: None,
        };
        let multi = Arc::new(EnclosingLock {
            client_id: 1,
            mode: LockMode::Exclusive,
            locks: vec![lock("a", 10), lock("b", 20)],
            outer: None,
        });
        let inner = EnclosingLock {
            client_id: 1,
            mode: LockMode::Read,
            locks: vec![lock("c", 30)],
            outer: Some(multi),
        };
        let found = |client, key| enclosing_hold(Some(&inner), client, key);
        assert_eq!(found(1, "b"), Some((LockMode::Exclusive, lock("b", 20))));
        assert_eq!(found(1, "c"), Some((LockMode::Read, lock("c", 30))));
        assert_eq!(found(2, "b"), None);
        assert_eq!(found(1, "d"), None);
    }

    #[test]
    fn a_nested_call_reenters_unless_it_would_wait_for_itself() {
        use LockMode::{Exclusive, Permits, Read};
        assert_eq!(reentry(Exclusive, Exclusive), Reentry::Enter);
        assert_eq!(reentry(Exclusive, Read), Reentry::Enter);
        assert_eq!(reentry(Read, Read), Reentry::Enter);
        assert_eq!(reentry(Permits(3), Permits(3)), Reentry::Enter);
        assert_eq!(reentry(Read, Exclusive), Reentry::Refuse);
        assert_eq!(reentry(Read, Permits(2)), Reentry::Refuse);
        assert_eq!(reentry(Permits(3), Exclusive), Reentry::Refuse);
        assert_eq!(reentry(Permits(3), Read), Reentry::Refuse);
        assert_eq!(reentry(Permits(3), Permits(2)), Reentry::Refuse);
        assert_eq!(reentry(Exclusive, Permits(2)), Reentry::Refuse);
    }
}
