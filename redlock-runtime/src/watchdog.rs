//! Lease renewal of the locks held without a fixed lease ("watchdog mode").
//!
//! One task per client, started with its first such lock, renews every lock the
//! client holds in one pipelined round trip per tick: not a task and a timer per lock.
//! On a cluster it is one pipeline per slot, each answered on its own: a slot that
//! migrates or a node that does not answer leaves only its own locks unrenewed for
//! that tick (see `Node::renew`).
//! A lock the renewal finds gone, or that could not be renewed before its lease ran
//! out, is marked lost. Each lock's renewal counts in the metrics, kept or failed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use std::time::Duration;

use tokio::time::Instant;

use crate::config::ClientConfig;
use crate::masters::Masters;
use crate::metrics;
use crate::node::Verdict;
use crate::state::{LockState, Ticket};

struct Watched {
    key: String,
    owner: String,
    state: Arc<LockState>,
}

/// The locks a client's watchdog renews, and what renewing them takes.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    locks: Mutex<HashMap<u64, Arc<Watched>>>,
    next_id: AtomicU64,
    started: AtomicBool,
    /// The task holds it weakly: it ends when the client is gone.
    masters: Weak<Masters>,
    lease: Duration,
    every: Duration,
}

impl Watchdog {
    pub(crate) fn new(masters: &Arc<Masters>, config: &ClientConfig) -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                locks: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                started: AtomicBool::new(false),
                masters: Arc::downgrade(masters),
                lease: config.watchdog_lease,
                every: config.renew_every,
            }),
        }
    }

    /// Starts renewing a lock; returns the id to [`Watchdog::forget`] it with.
    pub(crate) fn watch(&self, key: String, owner: String, state: Arc<LockState>) -> u64 {
        let shared = &self.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        shared
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::new(Watched { key, owner, state }));
        if !shared.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(renew_forever(Arc::downgrade(shared)));
        }
        id
    }

    /// Stops renewing a lock; false if it was not renewed (any more).
    pub(crate) fn forget(&self, id: u64) -> bool {
        self.shared.forget(id)
    }

    /// How many locks are being renewed.
    pub(crate) fn len(&self) -> usize {
        self.shared
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

impl Shared {
    fn forget(&self, id: u64) -> bool {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .is_some()
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
async fn renew_forever(shared: Weak<Shared>) {
    let Some(every) = shared.upgrade().map(|shared| shared.every) else {
        return;
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Some(masters) = shared.masters.upgrade() else {
            return;
        };
        renew_all(&shared, &masters).await;
    }
}

/// One renewal round: one pipeline carrying an EXTEND per held lock.
async fn renew_all(shared: &Shared, masters: &Masters) {
    let locks = shared.snapshot();
    if locks.is_empty() {
        return;
    }
    let lease = shared.lease;
    let lease_ms = lease.as_millis() as u64;
    let pairs: Vec<(&str, &str)> = locks
        .iter()
        .map(|(_, watched)| (watched.key.as_str(), watched.owner.as_str()))
        .collect();
    let valid_for = masters.validity(lease);
    // Started before the pipeline is sent (see `LeaseUpdate`).
    let sent_at = Instant::now();
    let tickets: Vec<Ticket> = locks
        .iter()
        .map(|(_, watched)| watched.state.start_update(sent_at, valid_for))
        .collect();
    let renewed = masters.renew(&pairs, lease_ms).await;
    for (((id, watched), renewed), ticket) in locks.iter().zip(renewed).zip(tickets) {
        let state = &watched.state;
        state.finish_update(ticket, renewed == Some(Verdict::Ours));
        match renewed {
            Some(Verdict::Ours) => metrics::renewed(state.label()),
            Some(verdict) => {
                // A lock released meanwhile (its guard forgot it) is not lost: a release
                // that keeps the key for `hold_at_least` changes its value.
                if shared.forget(*id) {
                    metrics::renewal_failed(state.label());
                    if verdict == Verdict::Evicted {
                        tracing::warn!(key = %watched.key, "redlock.lost: the watchdog found the lock force-unlocked");
                    } else {
                        tracing::warn!(key = %watched.key, "redlock.lost: the watchdog found the lock gone");
                    }
                    state.found_gone(verdict);
                }
            }
            None => {
                metrics::renewal_failed(state.label());
                if state.is_lost() && shared.forget(*id) {
                    tracing::warn!(key = %watched.key, "redlock.lost: lease ran out while Redis was unreachable");
                    state.ran_out();
                }
            }
        }
    }
    tracing::trace!(locks = locks.len(), "redlock.renew");
}
