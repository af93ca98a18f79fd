//! The guard of a held lock: release (with the hand-off and `hold_at_least`),
//! extend, and the release in the background when it is dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::cleanup::SpawnOnDrop;
use crate::core::{Core, HeldLock};
use crate::error::LockError;
use crate::hand_off::HandOffOutcome;
use crate::masters::QuorumError;
use crate::metrics::{self, Label};
use crate::node::Verdict;
use crate::state::LockState;
use crate::turn::LocalTurn;

/// A held lock. Release it with [`LockGuard::release`]; dropping it releases it in the
/// background (never blocking), or, outside a tokio runtime, leaves it to expire.
///
/// A release in the background outlives the program's `main`: when the runtime shuts
/// down before it is done, the runtime's shutdown sends it on a connection of its own
/// and waits for Redis's answer, at most a second per client (less when the client's
/// connect and response timeouts add up to less). The client's `shutdown` releases
/// every lock it holds and waits for those releases, within the response timeout.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    key: String,
    fencing_token: u64,
    held: Option<Holding>,
}

/// What releasing needs; taken out by `release` so that `Drop` has nothing left to do.
struct Holding {
    client: Arc<Core>,
    /// Shared with the client, whose shutdown may release it first (`Core::let_go`).
    lock: Arc<HeldLock>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

pub(crate) struct Acquired {
    pub(crate) client: Arc<Core>,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fencing_token: u64,
    pub(crate) sent_at: Instant,
    /// How long the lock is surely ours from `sent_at` (the lease, less clock drift with RedLock).
    pub(crate) valid_for: Duration,
    pub(crate) watchdog: bool,
    pub(crate) hold_at_least: Option<Duration>,
    /// The client's turn at the key, held with a whole lock (a share passed it on).
    pub(crate) turn: Option<LocalTurn>,
    /// The `lock` label of its metrics.
    pub(crate) label: Label,
}

impl LockGuard {
    /// The guard of a lock just acquired; `Err(ShutDown)` when its client was shut
    /// down meanwhile (the lock is then released in the background).
    pub(crate) fn new(acquired: Acquired) -> Result<Self, LockError> {
        let state = LockState::new(
            acquired.sent_at,
            acquired.valid_for,
            acquired.turn,
            acquired.label,
        );
        let watchdog_id = acquired.watchdog.then(|| {
            acquired.client.watchdog().watch(
                acquired.key.clone(),
                acquired.owner.clone(),
                state.clone(),
            )
        });
        let lock = HeldLock::new(
            acquired.key.clone(),
            acquired.owner,
            acquired.sent_at,
            acquired.hold_at_least,
            state,
            watchdog_id,
        );
        let client = acquired.client;
        match client.hold(lock) {
            Ok(lock) => Ok(LockGuard {
                key: acquired.key,
                fencing_token: acquired.fencing_token,
                held: Some(Holding { client, lock }),
            }),
            Err(lock) => {
                Holding { client, lock }.release_in_background(acquired.key.clone());
                Err(LockError::ShutDown { key: acquired.key })
            }
        }
    }

    /// Confirms a lock granted by another client's release (see `scripts`'
    /// `free_for_next`), which holds it for the grace only: extends it to `lease` in the
    /// background at `due` (a quarter of the grace after the grant, see
    /// `grant::Taken::confirmation_due`), so that the holder's work starts at once, and a
    /// hold shorter than that never confirms: its release frees the grant as it would
    /// the lease, and Redis runs one script less per hand-off. Until the confirmation is
    /// answered the lock is surely ours for the grace counted from the grant; if it
    /// finds the lock gone (the grant lapsed first: this process was stopped past the
    /// grace), the lock is lost. A confirmation is queued on the connection before the
    /// guard's release, or never sent; an `extend` made before it is due confirms in its
    /// place, to its own lease (see `grant::Confirmation`).
    pub(crate) fn confirm_grant(&self, lease: Duration, lease_ms: u64, due: Instant) {
        let Some(held) = &self.held else {
            return;
        };
        let (client, lock, key) = (held.client.clone(), held.lock.clone(), self.key.clone());
        lock.expect_confirmation();
        let mut confirmation = Box::pin(async move {
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            let valid_for = client.masters().validity(lease);
            let sent_at = Instant::now();
            let mut extension =
                std::pin::pin!(client.masters().confirm_grant(&key, &lock.owner, lease_ms));
            // One poll queues the extension; the ticket is taken before it is sent.
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(lock.take_confirmation(|| {
                    let ticket = lock.state.start_update(sent_at, valid_for);
                    (ticket, extension.as_mut().poll(cx))
                }))
            })
            .await;
            // Let go first (the release frees the grant, confirmed or not), or confirmed
            // by an `extend` made first.
            let Some((ticket, polled)) = first else {
                return;
            };
            let extended = match polled {
                std::task::Poll::Ready(extended) => extended,
                std::task::Poll::Pending => extension.await,
            };
            let ours = matches!(extended, Ok(Verdict::Ours));
            lock.state.finish_update(ticket, ours);
            match extended {
                Ok(Verdict::Ours) => {}
                Ok(verdict) if lock.gone_means_lost() => {
                    tracing::warn!(%key, "redlock.lost: the grant lapsed before it was confirmed");
                    lock.state.found_gone(verdict);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%key, error = %error.into_lock_error(&key, client.masters()), "redlock: a grant's confirmation got no answer; it holds for the grace");
                }
            }
        });
        // One poll here: a confirmation due already is queued before this returns
        // (ahead of any release of the guard); a later one sleeps in a task.
        let waker = std::task::Waker::noop();
        let polled = std::future::Future::poll(
            confirmation.as_mut(),
            &mut std::task::Context::from_waker(waker),
        );
        if polled.is_pending() {
            tokio::spawn(confirmation);
        }
    }

    /// A release before `hold` from now keeps the key until then (`hold_at_least` set
    /// after the acquisition: see `multi`).
    pub(crate) fn keep_at_least_from_now(&self, hold: Duration) {
        if let Some(held) = &self.held {
            held.lock.keep_at_least_from_now(hold);
        }
    }

    /// The shared state of the lock (for `current_lock()`).
    pub(crate) fn state(&self) -> Option<Arc<LockState>> {
        self.held.as_ref().map(|held| held.lock.state.clone())
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of this acquisition: larger than that of every earlier
    /// acquisition of the same key. Pass it with each write the lock protects, and have
    /// the storage reject a write carrying a smaller token than one it has seen. For a
    /// resource in Redis, [`FencedKey::write`](crate::FencedKey::write) does the
    /// refusing; for SQL, see the crate docs' "Fencing a database".
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// True once the lock is known gone (found missing or taken by the watchdog or
    /// `extend`), or its lease may have run out.
    pub fn is_lost(&self) -> bool {
        self.held
            .as_ref()
            .is_none_or(|held| held.lock.state.is_lost())
    }

    /// How long the lock is surely still ours, by this client's conservative estimate
    /// (measured from before the last renewal or extension was sent, less clock drift
    /// with RedLock): never later than Redis's own expiry on the server that took the
    /// renewal (a replica promoted since may not have it: renewals are not confirmed
    /// by `confirm_replicas`). A lock granted by another client's release counts on
    /// the grant's grace until its confirmation is answered (on a multi-thread runtime
    /// a quarter of the grace after the grant: see [`LockGuard::extend`], which
    /// confirms in its place when made earlier).
    /// Zero once lost.
    pub fn lease_remaining(&self) -> Duration {
        self.held
            .as_ref()
            .map_or(Duration::ZERO, |held| held.lock.state.remaining())
    }

    /// Resolves when the lock is known gone or its lease runs out without renewal.
    pub async fn lost(&self) {
        if let Some(held) = &self.held {
            held.lock.state.lost().await;
        }
    }

    /// Sets the lease to `lease` from now. In watchdog mode the watchdog keeps renewing
    /// afterwards with the client's watchdog lease. A lease made shorter than what is
    /// left is announced to the waiters, of other clients and of this one: should the
    /// holder then die, they take the key when the shorter lease ends.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        let held = self.held.as_ref().ok_or_else(|| self.lost_error())?;
        // Shut down: its lock was released (or is being) by the shutdown.
        held.client.check_open(&self.key)?;
        let state = &held.lock.state;
        let lease_ms = crate::limits::lease_millis(&self.key, lease)?;
        let masters = &held.client.masters();
        crate::limits::check_max_lease(masters, &self.key, "extend", lease)?;
        let update = state.begin_update(masters.validity(lease));
        // A grant not confirmed yet: this extension is its confirmation (to this lease,
        // telling the next in line `C`), and none follows that would undo it.
        let confirming = held.lock.take_confirmation(|| ()).is_some();
        let extension = async {
            match confirming {
                true => {
                    masters
                        .confirm_grant(&self.key, &held.lock.owner, lease_ms)
                        .await
                }
                false => masters.extend(&self.key, &held.lock.owner, lease_ms).await,
            }
        };
        let extended = match extension.await {
            Ok(extended) => extended,
            Err(error) => {
                update.unknown();
                return Err(error.into_lock_error(&self.key, masters));
            }
        };
        if extended.is_ours() {
            update.confirmed();
            tracing::debug!(key = %self.key, ?lease, "redlock.extend");
            Ok(())
        } else {
            update.unknown();
            state.found_gone(extended);
            tracing::warn!(key = %self.key, evicted = extended == Verdict::Evicted, "redlock.lost: extend found the lock gone");
            Err(self.lost_error())
        }
    }

    /// Releases the lock. `Err(LockError::Lost)` when it had expired or been taken, or
    /// when Redis gave no answer after its lease had run out: another owner's lock is
    /// never touched. Another error when Redis gave no answer (or its connection closed
    /// as it answered) within the lease: the release may have gone through; if not, the
    /// lease ends the lock. With `hold_at_least`, a release before
    /// that time leaves the key in place until it has passed. `Err(LockError::ShutDown)`
    /// when the client's `shutdown` released it first.
    pub async fn release(mut self) -> Result<(), LockError> {
        match self.held.take() {
            Some(held) if held.client.let_go(&held.lock) => held.release(&self.key).await,
            Some(_) => Err(LockError::ShutDown {
                key: self.key.clone(),
            }),
            None => Err(self.lost_error()),
        }
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.key.clone(),
        }
    }
}

impl Holding {
    /// Stop renewing → hand the lock off to the next task of this client, or free it in
    /// Redis → then (only then) pass the turn and report.
    async fn release(self, key: &str) -> Result<(), LockError> {
        let lock = &self.lock;
        if let Some(id) = lock.watchdog_id {
            self.client.watchdog().forget(id);
        }
        let keep = lock.keep_ms();
        // If this future is dropped before Redis has answered, release in the background
        // (compare-and-delete: harmless if it was done).
        let unfinished = SpawnOnDrop::new(|| {
            let (client, key, owner) = (self.client.clone(), key.to_owned(), lock.owner.clone());
            self.client.finish_releasing(
                lock,
                Box::pin(async move {
                    let outcome = client.masters().release(&key, &owner, keep).await;
                    tracing::debug!(%key, ok = outcome.is_ok(), "redlock: finished an interrupted release");
                    outcome.is_ok()
                }),
            )
        });
        let (outcome, turn) = self.hand_off_or_free(key, keep).await;
        unfinished.disarm();
        // Only now may this client's next waiter try: Redis has processed the release.
        drop(turn);
        match outcome {
            Ok(Verdict::Ours) => {
                lock.state.released();
                tracing::debug!(key, held_for = ?lock.acquired_at.elapsed(), keep_ms = keep, "redlock.release");
                Ok(())
            }
            Ok(verdict) => {
                lock.state.found_gone(verdict);
                if verdict == Verdict::Evicted {
                    tracing::warn!(
                        key,
                        "redlock.lost: released after the lock was force-unlocked"
                    );
                } else {
                    tracing::warn!(
                        key,
                        "redlock.lost: released after the lock had expired or been taken"
                    );
                }
                Err(LockError::Lost {
                    key: key.to_owned(),
                })
            }
            // Redis did not answer (or the answer was lost with its connection), after
            // the lease had run out: lost, whatever the release did.
            Err(_) if lock.state.lease_ran_out() => {
                lock.state.found_gone(Verdict::Gone);
                tracing::warn!(
                    key,
                    "redlock.lost: the release got no answer after the lease had run out"
                );
                Err(LockError::Lost {
                    key: key.to_owned(),
                })
            }
            Err(error) => {
                // Redis did not answer: the lease ends it, unless the release got through.
                lock.state.released();
                Err(error.into_lock_error(key, self.client.masters()))
            }
        }
    }

    /// With a waiter of this client in line, passes the lock on in its acquire script
    /// (see `turn`); otherwise, or if it does not pick it up, releases in Redis (a lock
    /// kept for `hold_at_least`, or whose lease may have run out or may run out before a
    /// taker could use it, always goes through Redis, whose answer says truthfully
    /// whether it was still ours). Whether it was
    /// still ours, and the turn if it was not handed off with the lock.
    async fn hand_off_or_free(
        &self,
        key: &str,
        keep: u64,
    ) -> (Result<Verdict, QuorumError>, Option<LocalTurn>) {
        let masters = self.client.masters();
        let state = &self.lock.state;
        let free = || masters.release(key, &self.lock.owner, keep);
        // A lost lock has nothing left (`remaining` is zero), so it goes through Redis too.
        if keep > 0
            || !masters.can_hand_off()
            || !crate::hand_off::leaves_time_to_hand_off(state.remaining())
        {
            return (free().await, state.take_turn());
        }
        let hand_off = match state
            .take_turn()
            .map(|turn| turn.hand_off(&self.lock.owner))
        {
            Some(Ok(hand_off)) => {
                tracing::trace!(name: "baton_left", target: metrics::TIMING, key, "redlock: lock left for the next in line");
                hand_off
            }
            Some(Err(kept)) => return (free().await, Some(kept)),
            None => return (free().await, None),
        };
        // A taker's script answers within the response timeout; one that is not polled
        // any more never tells, and must not hold this release up beyond it.
        let patience = self.client.config().response_timeout;
        let outcome = match hand_off.outcome(patience).await {
            HandOffOutcome::Done { released: true } => Ok(Verdict::HandedOff),
            // The taker's script found it gone: the release script (which leaves other
            // owners alone) says whether it was force-unlocked. The lost case only.
            HandOffOutcome::Done { released: false } => free().await,
            // Nobody took it, the taker gave it back (it went away before sending its
            // script, or its script failed and may not have run), or its script was
            // sent and its verdict is unknown (cancelled, or not polled in time): the
            // release in Redis says. Found gone, it tells a lock handed off from one
            // lost by the evidence the taker's script leaves when it deletes this
            // owner's lock (`scripts::HANDED_MARK`); without it the lock was lost (or
            // the evidence could not be left: a false alarm, never a hidden loss).
            HandOffOutcome::Vanished | HandOffOutcome::NotTaken => free().await,
        };
        let outcome = outcome.map(|verdict| match verdict {
            Verdict::HandedOff => {
                metrics::handed_off(state.label());
                Verdict::Ours
            }
            verdict => verdict,
        });
        (outcome, None)
    }
}

impl Holding {
    /// Releases in the background, as a task of the client (see `Core::finish_release`):
    /// stops renewing now, so that with no runtime to release on the lease runs out by
    /// itself.
    fn release_in_background(self, mut key: String) {
        if let Some(id) = self.lock.watchdog_id {
            self.client.watchdog().forget(id);
        }
        drop(SpawnOnDrop::new(|| {
            let key = std::mem::take(&mut key);
            let (client, lock) = (self.client.clone(), self.lock.clone());
            client.finish_releasing(
                &lock,
                Box::pin(async move {
                    match self.release(&key).await {
                        Ok(()) => true,
                        Err(error) => {
                            tracing::debug!(error = %error.chain(), "redlock: background release of a dropped guard");
                            // Redis answered, if only that the lock was gone.
                            !error.is_unavailable()
                        }
                    }
                }),
            )
        }));
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        // Unless the client's shutdown took it first.
        if held.client.let_go(&held.lock) {
            held.release_in_background(std::mem::take(&mut self.key));
        }
    }
}
