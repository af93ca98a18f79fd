//! The runtime side of `#[distributed_lock]`: the default client, reentrancy and
//! `current_lock()`, and the one function the expansion calls.
//!
//! # Reentrancy
//! Each annotated call that takes a lock runs its body inside a tokio task-local scope
//! that records the lock (and, through a parent link, the locks of the calls around
//! it). A nested annotated call on the same key with the same client finds it there and
//! runs without touching Redis; the lock is released when the outermost call returns.
//! The scope covers the holder's call tree: futures the body awaits or joins (`join!`,
//! `select!`) run under it; tasks it spawns do not, and wait for the lock like anyone.

use std::borrow::Borrow;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::client::LockClient;
use crate::error::LockError;
use crate::state::LockState;

tokio::task_local! {
    static HELD: Arc<EnclosingLock>;
}

struct EnclosingLock {
    client_id: u64,
    key: String,
    fencing_token: u64,
    state: Option<Arc<LockState>>,
    outer: Option<Arc<EnclosingLock>>,
}

/// The innermost lock held by the annotated function this code runs in.
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
pub fn current_lock() -> Option<CurrentLock> {
    HELD.try_with(|held| CurrentLock {
        key: held.key.clone(),
        fencing_token: held.fencing_token,
        state: held.state.clone(),
    })
    .ok()
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

/// The client `#[distributed_lock]` uses when it names none: the one given to
/// [`set_default_client`], or else one connected once to `REDLOCK_URL`.
pub async fn default_client() -> Result<LockClient, LockError> {
    default_client_for("").await
}

async fn default_client_for(key: &str) -> Result<LockClient, LockError> {
    if let Some(client) = DEFAULT_CLIENT
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
    {
        return Ok(client);
    }
    // One connection attempt at a time; the others then find its client.
    static CONNECTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _connecting = CONNECTING.lock().await;
    if let Some(client) = DEFAULT_CLIENT
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
    {
        return Ok(client);
    }
    let client = LockClient::from_env()
        .await
        .map_err(|error| LockError::NoDefaultClient {
            key: key.to_owned(),
            reason: format!("set_default_client was not called and REDLOCK_URL failed: {error}"),
        })?;
    set_default_client(client.clone());
    Ok(client)
}

/// Settings of one annotated function, from the attribute's literals.
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    pub wait: Duration,
    pub lease: Option<Duration>,
    pub hold_at_least: Option<Duration>,
    pub abort_on_lost: bool,
}

/// `client = <expr>`: a `LockClient`, a reference to one, an `Arc` of one.
pub fn client_from<C: Borrow<LockClient> + ?Sized>(client: &C) -> LockClient {
    client.borrow().clone()
}

/// Fixes an async block's output type, so that `?` and `return` in the body convert
/// into the function's own return type.
pub fn typed_body<R, F: Future<Output = R>>(body: F) -> F {
    body
}

/// Runs `body` under the lock `key`: acquires (or re-enters), runs, releases.
pub async fn run_locked<T, E, F>(
    client: Option<LockClient>,
    key: String,
    spec: LockSpec,
    body: F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let client = match client {
        Some(client) => client,
        None => default_client_for(&key).await?,
    };
    let outer = HELD.try_with(Arc::clone).ok();
    let mut enclosing = outer.as_deref();
    while let Some(held) = enclosing {
        if held.client_id == client.id() && held.key == key {
            return body.await;
        }
        enclosing = held.outer.as_deref();
    }

    let mut request = client.lock(key.clone()).wait(spec.wait);
    if let Some(lease) = spec.lease {
        request = request.lease(lease);
    }
    if let Some(hold) = spec.hold_at_least {
        request = request.hold_at_least(hold);
    }
    let guard = request.acquire().await?;
    let held = Arc::new(EnclosingLock {
        client_id: client.id(),
        key,
        fencing_token: guard.fencing_token(),
        state: guard.state(),
        outer,
    });
    let body = HELD.scope(held, body);
    let result = if spec.abort_on_lost {
        tokio::select! {
            biased;
            result = body => result,
            () = guard.lost() => {
                tracing::warn!(key = %guard.key(), "redlock: lock lost; the body was stopped at its await point");
                let key = guard.key().to_owned();
                drop(guard);
                return Err(LockError::Lost { key }.into());
            }
        }
    } else {
        body.await
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
        Err(error) => tracing::warn!(%error, "redlock: the release after the body failed"),
    }
    result
}
