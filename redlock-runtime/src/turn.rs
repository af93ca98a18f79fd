//! The turn: the per-key FIFO line of one client's tasks.
//!
//! Before a task talks to Redis about a key it takes that key's turn in its client:
//! a fair `tokio::sync::Mutex` per key, granted in arrival order. So within a client
//! only the first in line ever competes in Redis (besides a try-lock, which does not
//! line up: see [`Turn::Beside`]), one release wakes one waiter,
//! and a task that releases and asks again at once lines up behind those already
//! waiting: no barging, no starvation. The turn is held for as long as the lock is,
//! and handed to the next waiter once Redis has confirmed the release, or as soon as
//! the lock is known to be lost or its lease has run out, even if its guard lives on
//! (a holder stuck past its lease must not block this client's waiters for longer
//! than it blocks other clients').
//!
//! A lock handed to the next task of the client (see `hand_off`) travels with the
//! turn: the releasing holder leaves its baton in the key's slot, and the next in
//! line picks it up when its turn comes.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::hand_off::{Baton, BatonSlot, HandOffOutcome, Pending};
use crate::metrics::{self, Label};

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
    baton: BatonSlot,
}

/// The releasing side of a hand-off: the key's slot holds its baton until the next
/// in line picks it up (or it is taken back).
pub(crate) struct HandOff {
    turns: Arc<Turns>,
    key: String,
    entry: Turnstile,
    pending: Pending,
}

impl HandOff {
    /// How it ended; a taker that picked the baton up is waited for at most `patience`
    /// after the pick-up limit (see `BatonSlot::outcome`).
    pub(crate) async fn outcome(self, patience: Duration) -> HandOffOutcome {
        let HandOff {
            turns,
            key,
            entry,
            pending,
        } = self;
        let result = entry.baton.outcome(pending, patience).await;
        // The waiters may all have left meanwhile: forget the key then.
        drop(entry);
        turns.forget_if_unused(&key);
        result
    }
}

type Turnstile = Arc<Entry>;

/// What a task gets at a key's line.
pub(crate) enum Turn {
    /// The key's turn: within this client, this task alone talks to Redis about the key
    /// (and may pick up a baton left for it).
    Taken(LocalTurn),
    /// A try-lock, let through beside a task that has the turn but holds no lock: one
    /// attempt in Redis, no baton. A lock it gets holds no turn and is handed to nobody:
    /// the task with the turn finds it busy in Redis and is woken by its release, like a
    /// waiter of any other client.
    Beside,
}

impl Turn {
    /// The turn, if taken; `None` for a try let through beside it (Redis decides: the
    /// key may be free there).
    pub(crate) fn into_taken(self) -> Option<LocalTurn> {
        match self {
            Turn::Taken(turn) => Some(turn),
            Turn::Beside => None,
        }
    }
}

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
    /// With a deadline already past (a try), takes the turn only if nobody holds or
    /// awaits it; a try may still go to Redis [`Turn::Beside`] the turn, unless a task of
    /// this client holds the lock (its lease not run out): Redis would refuse it too.
    /// A task waiting in line counts in `redlock_waiting` under `label`.
    pub(crate) async fn take_turn(
        self: &Arc<Self>,
        key: &str,
        label: &Label,
        deadline: Instant,
    ) -> Option<Turn> {
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
                Ok(guard) => guard,
                Err(_) => {
                    let holder = turnstile
                        .holder
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                        .and_then(Weak::upgrade);
                    match holder {
                        // Held by a task of this client: Redis would say busy.
                        Some(holder) if !holder.lease_ran_out() => return None,
                        // A holder of this client whose lease ran out must not refuse a
                        // try-lock by itself: its turn goes on, and Redis decides.
                        Some(holder) => {
                            holder.pass_turn();
                            match turnstile.turn.clone().try_lock_owned() {
                                Ok(guard) => guard,
                                // Gone to a waiter in line.
                                Err(_) => return Some(Turn::Beside),
                            }
                        }
                        // The turn's task holds no lock: it is trying, or waiting for a
                        // holder elsewhere (or for Redis to answer), and the key may be
                        // free in Redis meanwhile. A try-lock asks Redis beside it rather
                        // than be refused by a waiter that would get no sooner.
                        None => return Some(Turn::Beside),
                    }
                }
            }
        } else if let Ok(guard) = turnstile.turn.clone().try_lock_owned() {
            // Free, and nobody in line (the fair mutex gives a released turn to the
            // first waiter, never to a try): no timer, no count of waiters.
            guard
        } else {
            let _waiting = Waiting::count(&turnstile, label);
            tokio::time::timeout_at(deadline, wait_for_turn(&turnstile))
                .await
                .ok()?
        };
        drop(turnstile);
        // On failure (any return above) `turn` is dropped without a guard, which still
        // tidies the map.
        turn.guard = Some(guard);
        Some(Turn::Taken(turn))
    }

    /// `key`'s turn if no task of this client holds or awaits it, at once; else `None`
    /// (never a try let through beside a turn: see `multi`'s one step, which then
    /// takes its keys one by one, in line).
    pub(crate) fn take_free(self: &Arc<Self>, key: &str) -> Option<LocalTurn> {
        let turnstile = {
            let mut turnstiles = self.turnstiles.lock().unwrap_or_else(|e| e.into_inner());
            turnstiles.entry(key.to_owned()).or_default().clone()
        };
        let mut turn = LocalTurn {
            turns: self.clone(),
            entry: Some(turnstile.clone()),
            key: key.to_owned(),
            guard: None,
        };
        // On failure `turn` is dropped without a guard, which tidies the map.
        turn.guard = Some(turnstile.turn.clone().try_lock_owned().ok()?);
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
        if duty.is_none() && !entry.watched.swap(true, Ordering::SeqCst) {
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

/// Counts a task among the waiters of a key (and in the metrics) for as long as it waits.
struct Waiting<'a> {
    entry: &'a Entry,
    _gauge: metrics::Waiting,
}

impl<'a> Waiting<'a> {
    fn count(entry: &'a Entry, label: &Label) -> Self {
        entry.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting {
            entry,
            _gauge: metrics::Waiting::start(label),
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.entry.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The watching waiter's duty; leaving it (turn taken, or the wait dropped) passes it
/// on when there is a holder to watch; otherwise the next `set_holder` calls a waiter
/// to it. (`watched` is written before `holder` is read here, and `holder` before
/// `watched` is read there, both sequentially consistent: one of the two sees the other.)
struct WatchDuty<'a>(&'a Entry);

impl Drop for WatchDuty<'_> {
    fn drop(&mut self) {
        self.0.watched.store(false, Ordering::SeqCst);
        let holder = self
            .0
            .holder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if holder {
            self.0.watcher_left.notify_one();
        }
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
        self.entry.as_ref()?.baton.pick_up()
    }

    /// Passes the turn, with `owner`'s lock, to the next in line; gives the turn back
    /// when there is nobody, or when the lock went from task to task too often in a row
    /// (then it must be released in Redis, for other clients' sake).
    pub(crate) fn hand_off(self, owner: &str) -> Result<HandOff, LocalTurn> {
        let Some(entry) = self.entry.clone() else {
            return Err(self);
        };
        let waiting = entry.waiting.load(Ordering::Acquire) > 0;
        let Some(pending) = entry.baton.offer(owner, waiting) else {
            return Err(self);
        };
        let turns = self.turns.clone();
        let key = self.key.clone();
        drop(self);
        Ok(HandOff {
            turns,
            key,
            entry,
            pending,
        })
    }

    /// Records the lock this turn's holder took, for the waiters to watch: wakes the
    /// watching waiter, or calls one to the duty if none watches and some wait. (A
    /// waiter counted after `waiting` is read here reads the holder after this wrote
    /// it — both under the holder's lock, `waiting` sequentially consistent — and
    /// takes the duty itself if nobody has it; with nobody waiting, no wake-up permit
    /// is left behind for a later waiter to wake on needlessly.)
    pub(crate) fn set_holder(&self, state: Weak<dyn Holder>) {
        if let Some(entry) = &self.entry {
            *entry.holder.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
            entry.holder_changed.notify_waiters();
            if entry.waiting.load(Ordering::SeqCst) > 0 && !entry.watched.load(Ordering::SeqCst) {
                entry.watcher_left.notify_one();
            }
        }
    }

    /// Forgets the holder as the turn goes on. The watcher is not woken for that: the
    /// next in line has no lease yet (its acquisition is bounded by its wait), and the
    /// lock it takes is announced by `set_holder`. Until then the watcher may still
    /// watch the lease that ended, which is harmless; waking it would be one more
    /// task to run on every hand-off.
    fn clear_holder(&self) {
        if let Some(entry) = &self.entry {
            *entry.holder.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

impl Drop for LocalTurn {
    fn drop(&mut self) {
        // Pass the turn first, then forget the key if nobody else holds a handle to it:
        // every handle is cloned under the map's lock, so the count cannot grow meanwhile.
        if self.guard.is_some() {
            self.clear_holder();
        }
        drop(self.guard.take());
        drop(self.entry.take());
        self.turns.forget_if_unused(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder whose lease lasts.
    struct Live;

    impl Holder for Live {
        fn gone(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            Box::pin(std::future::pending())
        }
        fn lease_ran_out(&self) -> bool {
            false
        }
        fn pass_turn(&self) {}
    }

    #[tokio::test]
    async fn turns_come_in_arrival_order_and_a_try_never_waits() {
        let turns = Arc::new(Turns::default());
        let soon = || Instant::now() + Duration::from_secs(5);
        let label = Label::unlabelled();
        let first = turns
            .take_turn("k", &label, soon())
            .await
            .and_then(Turn::into_taken)
            .expect("a free key");
        // A try (deadline passed) does not wait for a held turn: while its task holds no
        // lock, the try goes to Redis beside it; once it holds one, the try is refused.
        assert!(matches!(
            turns.take_turn("k", &label, Instant::now()).await,
            Some(Turn::Beside)
        ));
        let live = Arc::new(Live);
        first.set_holder(Arc::downgrade(&live) as Weak<dyn Holder>);
        assert!(turns.take_turn("k", &label, Instant::now()).await.is_none());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (turns, order) = (turns.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let turn = turns
                    .take_turn("k", &Label::unlabelled(), soon())
                    .await
                    .and_then(Turn::into_taken)
                    .expect("its turn");
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

    /// A holder whose lease has already run out: watching it passes its turn at once.
    struct Expired(Mutex<Option<LocalTurn>>);

    impl Holder for Expired {
        fn gone(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            Box::pin(async {
                self.pass_turn();
            })
        }
        fn lease_ran_out(&self) -> bool {
            true
        }
        fn pass_turn(&self) {
            drop(self.0.lock().unwrap().take());
        }
    }

    #[tokio::test]
    async fn a_waiter_is_called_to_the_watch_when_a_holder_comes_after_the_watcher_left() {
        let turns = Arc::new(Turns::default());
        let label = Label::unlabelled();
        let first = turns
            .take_turn("k", &label, Instant::now() + Duration::from_secs(5))
            .await
            .and_then(Turn::into_taken)
            .expect("a free key");
        // The first waiter takes the watch, then gives up while there is no holder yet.
        let quitter = tokio::spawn({
            let turns = turns.clone();
            async move {
                let deadline = Instant::now() + Duration::from_millis(50);
                turns.take_turn("k", &Label::unlabelled(), deadline).await
            }
        });
        tokio::task::yield_now().await;
        // The second waits behind it, not watching.
        let patient = tokio::spawn({
            let turns = turns.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                turns.take_turn("k", &Label::unlabelled(), deadline).await
            }
        });
        assert!(quitter.await.unwrap().is_none());
        // Now the turn's holder takes a lock whose lease has already run out: someone
        // must watch it, or the patient waiter would wait out its 5 s.
        let holder = Arc::new(Expired(Mutex::new(None)));
        first.set_holder(Arc::downgrade(&holder) as Weak<dyn Holder>);
        *holder.0.lock().unwrap() = Some(first);
        let turn = tokio::time::timeout(Duration::from_secs(1), patient)
            .await
            .expect("nobody was called to watch the new holder")
            .unwrap();
        assert!(turn.and_then(Turn::into_taken).is_some());
    }
}
