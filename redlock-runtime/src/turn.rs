//! The turn: the per-key FIFO line of one client's tasks, and the hand-off of a
//! lock from one task of the client to the next.
//!
//! Before a task talks to Redis about a key it takes that key's turn in its client:
//! a fair `tokio::sync::Mutex` per key, granted in arrival order. So within a client
//! only the first in line ever competes in Redis, one release wakes one waiter,
//! and a task that releases and asks again at once lines up behind those already
//! waiting: no barging, no starvation. The turn is held for as long as the lock is,
//! and handed to the next waiter once Redis has confirmed the release, or as soon as
//! the lock is known to be lost or its lease has run out, even if its guard lives on
//! (a holder stuck past its lease must not block this client's waiters for longer
//! than it blocks other clients').
//!
//! ## Hand-off
//! When a holder releases while a waiter of the same client is in line (one Redis
//! server or Cluster, no `hold_at_least` left), it does not release in Redis and then
//! let the waiter acquire: two round trips in a row. It passes its owner token with the
//! turn (a [`Baton`]); the waiter's acquire script deletes the key if that token still
//! holds it and takes the lock at once: one round trip from release to next holder.
//! No release is published meanwhile, so other clients' waiters keep waiting; to bound
//! that, after [`MAX_HANDOFFS_IN_A_ROW`] hand-offs a release goes through Redis as
//! usual and every waiter, in any client, gets its chance.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, oneshot};
use tokio::time::Instant;

/// What the turn needs of the lock its holder took: to know when it is gone, so that
/// the turn goes on even if the holder's guard lives on. (The lock's state implements
/// it; the turn stays below the state, which holds the turn.)
pub(crate) trait Holder: Send + Sync {
    /// Resolves when the lock is known lost or its lease ran out (which passes the
    /// turn, unless its release is under way).
    fn gone(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// The lease may have run out (the local, conservative estimate).
    fn lease_ran_out(&self) -> bool;
    /// Lets the next in line (or a try-lock) have the turn.
    fn pass_turn(&self);
}

/// One key's line: the fair mutex, and the state of the lock its holder took.
#[derive(Default)]
struct Entry {
    turn: Arc<tokio::sync::Mutex<()>>,
    holder: Mutex<Option<Weak<dyn Holder>>>,
    holder_changed: tokio::sync::Notify,
    /// Set while one waiter watches the holder's lease on behalf of all: a hand-off
    /// then wakes one watcher, not every waiter.
    watched: AtomicBool,
    watcher_left: tokio::sync::Notify,
    /// Tasks waiting for the turn (a hand-off needs one).
    waiting: AtomicUsize,
    /// The releasing holder's lock, for the next in line to release and retake.
    baton: Mutex<Option<Baton>>,
    handoffs_in_a_row: AtomicU32,
}

/// How many times in a row a lock may go from task to task of one client without a
/// release in Redis, which would let other clients' waiters compete.
pub(crate) const MAX_HANDOFFS_IN_A_ROW: u32 = 8;

/// How long a releasing holder waits for the next in line to pick its baton up
/// before it releases in Redis itself.
const PICK_UP_LIMIT: Duration = Duration::from_millis(100);

/// The owner token a releasing holder passes to the next in line, with the way back
/// for the outcome: did the next one's script find and delete this owner's lock?
pub(crate) struct Baton {
    pub(crate) owner: String,
    picked_up: Option<oneshot::Sender<()>>,
    outcome: Option<oneshot::Sender<bool>>,
}

impl Baton {
    /// Reports whether the lock was still this owner's when it was handed off.
    pub(crate) fn finish(mut self, released: bool) {
        if let Some(outcome) = self.outcome.take() {
            let _ = outcome.send(released);
        }
    }
}

/// The releasing side of a hand-off.
pub(crate) struct HandOff {
    turns: Arc<Turns>,
    key: String,
    entry: Turnstile,
    picked_up: oneshot::Receiver<()>,
    outcome: oneshot::Receiver<bool>,
}

/// How a hand-off ended, for the releasing holder.
pub(crate) enum HandOffOutcome {
    /// The next in line ran its script: was the lock still ours when it took it?
    Done { released: bool },
    /// Nobody took the baton in time: release in Redis as usual.
    NotTaken,
    /// The taker stopped (its acquire was cancelled) before telling whether its script
    /// ran. A release in Redis will clean up; if it finds the key gone, the taker's
    /// script most likely deleted it (the lease had not run out when it was handed off).
    Vanished,
}

impl HandOff {
    pub(crate) async fn outcome(self) -> HandOffOutcome {
        let HandOff {
            turns,
            key,
            entry,
            picked_up,
            outcome,
        } = self;
        let result = async {
            if !matches!(
                tokio::time::timeout(PICK_UP_LIMIT, picked_up).await,
                Ok(Ok(()))
            ) {
                // Take it back, unless it was picked up at the last moment.
                let reclaimed = entry.baton.lock().unwrap_or_else(|e| e.into_inner()).take();
                if reclaimed.is_some() {
                    return HandOffOutcome::NotTaken;
                }
            }
            match outcome.await {
                Ok(released) => HandOffOutcome::Done { released },
                Err(_) => HandOffOutcome::Vanished,
            }
        }
        .await;
        // The waiters may all have left meanwhile: forget the key then.
        drop(entry);
        turns.forget_if_unused(&key);
        result
    }
}

type Turnstile = Arc<Entry>;

/// Every key some task of this client holds or waits for.
#[derive(Default)]
pub(crate) struct Turns {
    turnstiles: Mutex<HashMap<String, Turnstile>>,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns").finish_non_exhaustive()
    }
}

impl Turns {
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
            turns: self.clone(),
            entry: Some(turnstile.clone()),
            key: key.to_owned(),
            guard: None,
        };
        let guard = if Instant::now() >= deadline {
            match turnstile.turn.clone().try_lock_owned() {
                Ok(guard) => Some(guard),
                Err(_) => {
                    // A holder of this client whose lease ran out must not refuse a
                    // try-lock by itself: its turn goes on, and Redis decides.
                    let holder = turnstile
                        .holder
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                        .and_then(Weak::upgrade);
                    match holder {
                        Some(holder) if holder.lease_ran_out() => {
                            holder.pass_turn();
                            turnstile.turn.clone().try_lock_owned().ok()
                        }
                        _ => None,
                    }
                }
            }
        } else {
            let _waiting = Waiting::count(&turnstile);
            tokio::time::timeout_at(deadline, wait_for_turn(&turnstile))
                .await
                .ok()
        };
        drop(turnstile);
        // On failure `turn` is dropped without a guard, which still tidies the map.
        turn.guard = Some(guard?);
        Some(turn)
    }

    /// Removes `key`'s entry if nothing but the map holds it: every handle is cloned
    /// under the map's lock, so the count cannot grow meanwhile.
    fn forget_if_unused(&self, key: &str) {
        let mut turnstiles = self.turnstiles.lock().unwrap_or_else(|e| e.into_inner());
        if turnstiles
            .get(key)
            .is_some_and(|turnstile| Arc::strong_count(turnstile) == 1)
        {
            turnstiles.remove(key);
        }
    }

    /// Number of keys with a holder or a waiter in this client (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.turnstiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// Waits in line. One waiter at a time also watches the holder's lease, whose end
/// passes the turn even if the holder's guard lives on.
async fn wait_for_turn(entry: &Entry) -> OwnedMutexGuard<()> {
    let in_line = entry.turn.clone().lock_owned();
    tokio::pin!(in_line);
    let mut duty: Option<WatchDuty<'_>> = None;
    // The holder whose lease this waiter saw end: watching it again would return at
    // once, forever, while its release is still on its way to Redis.
    let mut seen_gone: Option<Weak<dyn Holder>> = None;
    loop {
        if duty.is_none() && !entry.watched.swap(true, Ordering::AcqRel) {
            duty = Some(WatchDuty(entry));
        }
        if duty.is_none() {
            // Someone else watches; take over if they leave.
            tokio::select! {
                guard = &mut in_line => return guard,
                () = entry.watcher_left.notified() => continue,
            }
        }
        // Registered before the holder is read, so that a change in between is seen.
        let changed = entry.holder_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let holder = entry
            .holder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Weak::upgrade);
        let holder = holder.filter(|holder| {
            !seen_gone
                .as_ref()
                .is_some_and(|seen| Weak::ptr_eq(&Arc::downgrade(holder), seen))
        });
        let holder_gone = async {
            match &holder {
                // Resolves when the holder's lock is lost or its lease ran out; that
                // passes the turn (unless its release is under way), and the turn
                // then comes in line.
                Some(holder) => holder.gone().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            guard = &mut in_line => return guard,
            () = holder_gone => {
                if let Some(holder) = &holder {
                    seen_gone = Some(Arc::downgrade(holder));
                }
            }
            () = &mut changed => {}
        }
    }
}

/// Counts a task among the waiters of a key for as long as it waits.
struct Waiting<'a>(&'a Entry);

impl<'a> Waiting<'a> {
    fn count(entry: &'a Entry) -> Self {
        entry.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(entry)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The watching waiter's duty; leaving it (turn taken, or the wait dropped) passes it on.
struct WatchDuty<'a>(&'a Entry);

impl Drop for WatchDuty<'_> {
    fn drop(&mut self) {
        self.0.watched.store(false, Ordering::Release);
        self.0.watcher_left.notify_one();
    }
}

/// A task's turn at a key; the next waiter's turn comes when it is dropped.
pub(crate) struct LocalTurn {
    turns: Arc<Turns>,
    entry: Option<Turnstile>,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl LocalTurn {
    /// The baton a releasing holder left with this turn, if any.
    pub(crate) fn take_baton(&self) -> Option<Baton> {
        let entry = self.entry.as_ref()?;
        let mut baton = entry
            .baton
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        if let Some(picked_up) = baton.picked_up.take() {
            let _ = picked_up.send(());
        }
        Some(baton)
    }

    /// Passes the turn, with `owner`'s lock, to the next in line; gives the turn back
    /// when there is nobody, or when the lock went from task to task too often in a row
    /// (then it must be released in Redis, for other clients' sake).
    pub(crate) fn hand_off(self, owner: &str) -> Result<HandOff, LocalTurn> {
        let Some(entry) = self.entry.clone() else {
            return Err(self);
        };
        if entry.waiting.load(Ordering::Acquire) == 0 {
            entry.handoffs_in_a_row.store(0, Ordering::Release);
            return Err(self);
        }
        if entry.handoffs_in_a_row.fetch_add(1, Ordering::AcqRel) >= MAX_HANDOFFS_IN_A_ROW {
            entry.handoffs_in_a_row.store(0, Ordering::Release);
            return Err(self);
        }
        let (picked_up, picked_up_rx) = oneshot::channel();
        let (outcome, outcome_rx) = oneshot::channel();
        *entry.baton.lock().unwrap_or_else(|e| e.into_inner()) = Some(Baton {
            owner: owner.to_owned(),
            picked_up: Some(picked_up),
            outcome: Some(outcome),
        });
        let turns = self.turns.clone();
        let key = self.key.clone();
        drop(self);
        Ok(HandOff {
            turns,
            key,
            entry,
            picked_up: picked_up_rx,
            outcome: outcome_rx,
        })
    }

    /// Records the lock this turn's holder took, for the waiters to watch.
    pub(crate) fn set_holder(&self, state: Option<Weak<dyn Holder>>) {
        if let Some(entry) = &self.entry {
            *entry.holder.lock().unwrap_or_else(|e| e.into_inner()) = state;
            entry.holder_changed.notify_waiters();
        }
    }
}

impl Drop for LocalTurn {
    fn drop(&mut self) {
        // Pass the turn first, then forget the key if nobody else holds a handle to it:
        // every handle is cloned under the map's lock, so the count cannot grow meanwhile.
        if self.guard.is_some() {
            self.set_holder(None);
        }
        drop(self.guard.take());
        drop(self.entry.take());
        self.turns.forget_if_unused(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_come_in_arrival_order_and_a_try_never_waits() {
        let turns = Arc::new(Turns::default());
        let soon = || Instant::now() + Duration::from_secs(5);
        let first = turns.take_turn("k", soon()).await.expect("a free key");
        // A try (deadline passed) does not wait for a held turn.
        assert!(turns.take_turn("k", Instant::now()).await.is_none());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (turns, order) = (turns.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let turn = turns.take_turn("k", soon()).await.expect("its turn");
                order.lock().unwrap().push(n);
                drop(turn);
            }));
            // Let each line up before the next arrives.
            tokio::task::yield_now().await;
        }
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        // Every turn given back: the key is forgotten.
        assert_eq!(turns.len(), 0);
    }
}
