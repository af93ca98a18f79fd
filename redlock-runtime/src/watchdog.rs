//! Lease renewal of the locks held without a fixed lease ("watchdog mode").
//!
//! One task per client, started with its first such lock, renews every lock the
//! client holds in one pipelined round trip per tick: not a task and a timer per lock.
//! A lock the renewal finds gone, or that could not be renewed before its lease ran
//! out, is marked lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::time::Instant;

use crate::client::{ClientInner, LockClient};
use crate::state::LockState;

struct Watched {
    key: String,
    owner: String,
    state: Arc<LockState>,
}

/// The locks a client's watchdog renews.
#[derive(Default)]
pub(crate) struct Watchdog {
    locks: Mutex<HashMap<u64, Arc<Watched>>>,
    next_id: AtomicU64,
    started: AtomicBool,
}

impl Watchdog {
    /// Starts renewing a lock; returns the id to [`Watchdog::forget`] it with.
    pub(crate) fn watch(
        &self,
        client: &LockClient,
        key: String,
        owner: String,
        state: Arc<LockState>,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::new(Watched { key, owner, state }));
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(renew_forever(Arc::downgrade(&client.inner)));
        }
        id
    }

    /// Stops renewing a lock; false if it was not renewed (any more).
    pub(crate) fn forget(&self, id: u64) -> bool {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .is_some()
    }

    /// How many locks are being renewed.
    pub(crate) fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn snapshot(&self) -> Vec<(u64, Arc<Watched>)> {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, watched)| (*id, watched.clone()))
            .collect()
    }
}

/// Ticks until the client is gone.
async fn renew_forever(client: Weak<ClientInner>) {
    let Some(every) = client.upgrade().map(|c| c.config.renew_every) else {
        return;
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(client) = client.upgrade() else {
            return;
        };
        renew_all(&client).await;
    }
}

/// One renewal round: one pipeline carrying an EXTEND per held lock.
pub(crate) async fn renew_all(client: &ClientInner) {
    let locks = client.watchdog.snapshot();
    if locks.is_empty() {
        return;
    }
    let lease = client.config.watchdog_lease;
    let lease_ms = lease.as_millis() as u64;
    let pairs: Vec<(&str, &str)> = locks
        .iter()
        .map(|(_, watched)| (watched.key.as_str(), watched.owner.as_str()))
        .collect();
    let valid_for = client.masters.validity(lease);
    // Started before the pipeline is sent (see `LeaseUpdate`).
    let sent_at = Instant::now();
    let tickets: Vec<u64> = locks
        .iter()
        .map(|(_, watched)| watched.state.start_update())
        .collect();
    let renewed = client.masters.renew(&pairs, lease_ms).await;
    for (((id, watched), renewed), ticket) in locks.iter().zip(renewed).zip(tickets) {
        let state = &watched.state;
        state.finish_update(ticket, sent_at, valid_for, renewed == Some(true));
        match renewed {
            Some(true) => {}
            Some(false) => {
                // A lock released meanwhile (its guard forgot it) is not lost: a release
                // that keeps the key for `hold_at_least` changes its value.
                if client.watchdog.forget(*id) {
                    tracing::warn!(key = %watched.key, "redlock.lost: the watchdog found the lock gone");
                    state.mark_lost();
                }
            }
            None => {
                if state.is_lost() && client.watchdog.forget(*id) {
                    tracing::warn!(key = %watched.key, "redlock.lost: lease ran out while Redis was unreachable");
                    state.mark_lost();
                }
            }
        }
    }
    tracing::trace!(locks = locks.len(), "redlock.renew");
}
