//! The per-key FIFO queue of one client's waiters.
//!
//! Before a task talks to Redis about a key it takes that key's turn in its client:
//! a fair `tokio::sync::Mutex` per key, granted in arrival order. So within a client
//! only the head of the queue ever competes in Redis, one release wakes one waiter,
//! and a task that releases and asks again at once queues behind those already
//! waiting: no barging, no starvation. The turn is held for as long as the lock is,
//! and handed to the next waiter once Redis has confirmed the release, or as soon as
//! the lock is known to be lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

type Turnstile = Arc<tokio::sync::Mutex<()>>;

/// Every key some task of this client holds or waits for.
#[derive(Default)]
pub(crate) struct LocalQueues {
    turnstiles: Mutex<HashMap<String, Turnstile>>,
}

impl std::fmt::Debug for LocalQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalQueues").finish_non_exhaustive()
    }
}

impl LocalQueues {
    /// Waits for `key`'s turn until `deadline`; `None` when it did not come in time.
    /// With a deadline already past, takes the turn only if nobody holds or awaits it.
    pub(crate) async fn take_turn(
        self: &Arc<Self>,
        key: &str,
        deadline: Instant,
    ) -> Option<LocalTurn> {
        let turnstile = {
            let mut turnstiles = self.turnstiles.lock().unwrap_or_else(|e| e.into_inner());
            match turnstiles.get(key) {
                Some(existing) => existing.clone(),
                None => {
                    let fresh = Turnstile::default();
                    turnstiles.insert(key.to_owned(), fresh.clone());
                    fresh
                }
            }
        };
        let mut turn = LocalTurn {
            queues: self.clone(),
            key: key.to_owned(),
            guard: None,
        };
        let guard = if Instant::now() >= deadline {
            turnstile.try_lock_owned().ok()
        } else {
            tokio::time::timeout_at(deadline, turnstile.lock_owned())
                .await
                .ok()
        };
        // On failure `turn` is dropped without a guard, which still tidies the map.
        turn.guard = Some(guard?);
        Some(turn)
    }

    /// Number of keys with a holder or a waiter in this client (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.turnstiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// A task's turn at a key; the next waiter's turn comes when it is dropped.
pub(crate) struct LocalTurn {
    queues: Arc<LocalQueues>,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for LocalTurn {
    fn drop(&mut self) {
        // Hand the turn on first, then forget the key if nobody else holds a handle to it:
        // every handle is cloned under the map's lock, so the count cannot grow meanwhile.
        drop(self.guard.take());
        let mut turnstiles = self
            .queues
            .turnstiles
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if turnstiles
            .get(&self.key)
            .is_some_and(|turnstile| Arc::strong_count(turnstile) == 1)
        {
            turnstiles.remove(&self.key);
        }
    }
}
