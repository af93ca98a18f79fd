//! Acquisition: the builder, the attempt script, and the wait for a release.
//!
//! The loop (`take the turn → loop { attempt; wait for news | back off }`) is written
//! once, over a [`Kind`] of lock: what one attempt sends, how an interrupted one is
//! undone, and whether holders share the key. Two kinds: the exclusive lock (also the
//! write lock and the election), and a share (a read lock's reader, a semaphore's
//! permit), with its own script; both reuse the turn, the waitlist place, the waiting
//! for release messages, the back-off and the overall bound. A share's guard is
//! released, extended and renewed by the same scripts as a whole lock's.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::cleanup::SpawnOnDrop;
use crate::connection::slot_is_moving;
use crate::core::Core;
use crate::error::LockError;
use crate::grant::{Grant, GrantFloor, Lapse, Taken};
use crate::guard::{Acquired, LockGuard};
use crate::hand_off::Baton;
use crate::limits::{check_max_lease, lease_millis, validate};
use crate::masters::{Masters, Outcome, Try};
use crate::metrics::{self, Label};
use crate::node::{LineStatus, Verdict, Waiter};
use crate::notify::{Listener, Release};
use crate::turn::LocalTurn;

/// A kind of lock: its attempt, and the undoing of an attempt whose outcome is unknown.
pub(crate) trait Kind: Send + Sync + 'static {
    /// Holders share the key: `Some(0)` readers, `Some(n)` a semaphore's `n` permits.
    /// A share passes its client's turn on as soon as it is acquired (the next task of
    /// the client may share the key too), and shares are for one server only.
    fn shares(&self) -> Option<u32> {
        None
    }

    /// How this kind's waiters are named on the key's waitlist (the prefix of their
    /// ids), or `None` when they take no place there.
    fn waitlist_id_prefix(&self) -> Option<String> {
        Some(String::new())
    }

    /// One run of this kind's acquire script (on every master with RedLock).
    fn attempt<'a>(
        &'a self,
        masters: &'a Masters,
        request: Try<'a>,
    ) -> impl Future<Output = redis::RedisResult<Outcome>> + Send + 'a {
        masters.acquire(Try {
            shares: self.shares(),
            ..request
        })
    }

    /// Releases whatever an interrupted attempt of `owner` may have taken (the release
    /// script ends a share as it ends a whole lock), as a task of the client that
    /// outlives its runtime (`Core::finish_release`).
    fn undo(
        core: Arc<Core>,
        key: String,
        owner: String,
    ) -> impl Future<Output = ()> + Send + 'static {
        let cleanup = core.clone();
        let (k, o) = (key.clone(), owner.clone());
        cleanup.finish_release(&k, &o, None, Box::pin(async move {
            let outcome = core.masters().release(&key, &owner, 0).await;
            tracing::debug!(%key, ok = outcome.is_ok(), "redlock: cleaned up after an interrupted acquire");
            if !matches!(outcome, Ok(Verdict::Ours)) {
                // The attempt may still be on its way: sent on a connection the kernel
                // then dropped (see `connect::tcp_settings`), it can reach Redis after
                // this release went out on a new one. Once more, a response timeout
                // later, in the background (a shutdown does not wait for it): a
                // compare-and-delete by the attempt's own token, harmless if repeated.
                let later = core.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(later.config().response_timeout).await;
                    let _ = later.masters().release(&key, &owner, 0).await;
                });
            }
            outcome.is_ok()
        }))
    }
}

/// The exclusive lock: one owner at a time.
pub(crate) struct Exclusive;

impl Kind for Exclusive {}

/// A share of a key: a reader of a read-write lock (`limit` 0), or one of a semaphore's
/// `limit` permits (see `scripts::SHARED_ACQUIRE`).
pub(crate) struct Shared {
    pub(crate) limit: u32,
}

impl Kind for Shared {
    fn shares(&self) -> Option<u32> {
        Some(self.limit)
    }

    fn waitlist_id_prefix(&self) -> Option<String> {
        Some(match self.limit {
            0 => crate::scripts::READER_ID_PREFIX.to_owned(),
            // `s<permits>:`: a release grants a permit to waiters of the same count only.
            limit => format!("{}{limit}:", crate::scripts::PERMIT_ID_PREFIX),
        })
    }
}

/// Which lock of its key a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The whole key: `lock`, `write_lock`, an election.
    Exclusive,
    /// A reader's share: `read_lock`.
    Read,
    /// One of `n` permits: `semaphore`.
    Permits(u32),
}

/// First and longest pause before retrying after Redis failed to answer.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(500));

/// An acquisition being set up: `client.lock(key).wait(..).lease(..).acquire().await`.
#[must_use = "nothing is locked until `.acquire().await`"]
#[derive(Debug)]
pub struct LockRequest {
    client: Arc<Core>,
    key: String,
    wait: Duration,
    lease: Option<Duration>,
    hold_at_least: Option<Duration>,
    label: Label,
    mode: Mode,
    /// A lock granted by a release is confirmed as soon as it is taken, not a while
    /// later (see `grant::Taken::confirmation_due`): a `lock_all`'s keys hold their full lease
    /// from its return.
    confirm_at_once: bool,
}

impl LockRequest {
    pub(crate) fn new(client: Arc<Core>, key: String) -> Self {
        Self::with_mode(client, key, Mode::Exclusive)
    }

    pub(crate) fn with_mode(client: Arc<Core>, key: String, mode: Mode) -> Self {
        LockRequest {
            client,
            key,
            wait: Duration::ZERO,
            lease: None,
            hold_at_least: None,
            label: Label::unlabelled(),
            mode,
            confirm_at_once: false,
        }
    }

    /// The `lock` label of this lock's metrics (feature `metrics`; see the crate docs'
    /// "Metrics"). Name the *kind* of lock, never one with an id in it: every distinct
    /// label is a time series of its own in the monitoring system, so `"order"` for
    /// `order:42`, `order:43`… Without a label a lock counts under `lock="-"`; the
    /// attribute labels its locks with their key template (`order:<id>`). Without the
    /// feature this does nothing.
    ///
    /// ```no_run
    /// # async fn demo(client: redlock_runtime::LockClient, id: u64) -> Result<(), redlock_runtime::LockError> {
    /// let guard = client.lock(format!("order:{id}")).label("order").acquire().await?;
    /// # guard.release().await }
    /// ```
    pub fn label(mut self, label: &str) -> Self {
        self.label = Label::new(label);
        self
    }

    /// [`LockRequest::label`] without a copy, for the attribute's templates.
    pub(crate) fn static_label(mut self, label: &'static str) -> Self {
        self.label = Label::from_static(label);
        self
    }

    /// The label given as it is (a `lock_all` labels each of its keys' requests).
    pub(crate) fn labelled(mut self, label: Label) -> Self {
        self.label = label;
        self
    }

    /// A grant is confirmed at once (a `lock_all`'s key: see `multi`).
    pub(crate) fn confirming_grants_at_once(mut self) -> Self {
        self.confirm_at_once = true;
        self
    }

    /// How long to wait for a holder to release (default zero: one attempt, a
    /// *try-lock*). A try-lock succeeds whenever the key is free in Redis, also while
    /// other tasks of this client wait in line for it; it is refused at once, without a
    /// round trip, only when another task of this client holds the lock (its lease not
    /// run out), and never joins the waitlist.
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
    /// Returns within `wait` plus the client's response timeout, whatever Redis does
    /// (reconnects and Sentinel look-ups included). Dropping the returned future
    /// mid-way leaves nothing behind: a lock the attempt may have taken is released in
    /// the background.
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
        let bound = self
            .wait
            .saturating_add(self.client.config().response_timeout);
        let key = self.key.clone();
        let label = self.label.clone();
        // Boxed: the attempt's state is large, and `timeout` and `instrument` would each
        // copy it whole (the profile's top user-space cost on the uncontended path).
        let inner = Box::pin(self.acquire_inner(started));
        let result = match tokio::time::timeout(bound, inner)
            .instrument(span.clone())
            .await
        {
            Ok(result) => result,
            Err(_) => Err(LockError::redis(
                &key,
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "Redis did not answer within the wait and the response timeout",
                )),
            )),
        };
        let waited = started.elapsed();
        let outcome = match &result {
            Ok(_) => metrics::Outcome::Acquired,
            Err(LockError::Timeout { .. }) => metrics::Outcome::Timeout,
            Err(_) => metrics::Outcome::Error,
        };
        span.record("waited", tracing::field::debug(waited));
        span.record("outcome", outcome.as_str());
        metrics::acquire_finished(&label, outcome, waited);
        result
    }

    /// Check → take the turn → attempt until acquired, waiting for news in between.
    async fn acquire_inner(self, started: Instant) -> Result<LockGuard, LockError> {
        match self.mode {
            Mode::Exclusive => take(Plan::check(self, Exclusive, started)?).await,
            Mode::Read => take(Plan::check(self, Shared { limit: 0 }, started)?).await,
            Mode::Permits(0) => Err(LockError::invalid_options(
                &self.key,
                "a semaphore of 0 permits would never let anyone in: give at least 1",
            )),
            Mode::Permits(limit) => take(Plan::check(self, Shared { limit }, started)?).await,
        }
    }
}

/// Takes the turn, then attempts until acquired, waiting for news in between.
async fn take<K: Kind>(plan: Plan<K>) -> Result<LockGuard, LockError> {
    // `None`: a try-lock while another task of this client is still after the key.
    let turn = plan
        .core
        .turns()
        .take_turn(&plan.key, &plan.label, plan.deadline)
        .await
        .ok_or_else(|| plan.timeout())?
        .into_taken();
    let baton = turn.as_ref().and_then(LocalTurn::take_baton);
    tracing::trace!(name: "turn_taken", target: metrics::TIMING, key = %plan.key, baton = baton.is_some(), "redlock: turn taken");
    let mut attempts = Attempts::new(&plan, baton);
    loop {
        // A shutdown while this acquisition waited: no new attempt.
        plan.core.check_open(&plan.key)?;
        let Tried {
            owner,
            sent_at,
            outcome,
        } = attempts.attempt().await;
        match outcome {
            Ok(Outcome::Acquired { fencing_token, .. }) => {
                drop(attempts);
                return plan.into_guard(owner, fencing_token, sent_at, turn);
            }
            Ok(Outcome::Busy {
                ttl, split, line, ..
            }) => {
                // Grants made before this attempt ran are dead: they lapsed, or were
                // taken away, or this attempt would have found the key its own.
                attempts.grant_floor.raise(line.grant_floor);
                if let Some(place) = attempts.place.as_mut() {
                    place.saw_busy(sent_at, line);
                }
                let news = attempts.wait_for_news(sent_at, ttl, split).await?;
                // With replica confirmation, a grant is taken by an attempt of this
                // waiter's (it finds the key granted to it), which `WAIT`s as every
                // acquisition does: a grant alone was never confirmed by a replica.
                let confirming = plan.core.config().confirm_replicas.is_some();
                if let Some((grant, place)) =
                    news.filter(|_| !confirming).zip(attempts.place.as_mut())
                {
                    let owner = place.id.clone();
                    // Never held longer unconfirmed than this client's grace or the lease.
                    let bound = (plan.core.config().reservation_grace).min(plan.lease);
                    let validity = |grace| plan.core.masters().validity(grace);
                    let granted_at = place.granted_at(grant.after);
                    if let Some(taken) = grant.take(granted_at, bound, validity, Instant::now()) {
                        // The release that granted it took the place off the line.
                        place.left = true;
                        drop(attempts);
                        return plan.into_granted_guard(owner, taken, turn);
                    }
                    // The message came late (this process was stopped or starved): see
                    // `Grant::take`. The next attempt finds the key its own, or busy.
                    tracing::debug!(key = %plan.key, "redlock: a grant came too late to be taken as it is; attempting");
                }
            }
            Ok(Outcome::NoQuorum {
                reached,
                sitting_out,
            }) => {
                let needed = plan.core.masters().quorum();
                let key = plan.key.clone();
                let error = LockError::NoQuorum {
                    key,
                    reached,
                    needed,
                    sitting_out,
                };
                attempts.back_off(error).await?
            }
            Err(error) if is_transient(&error) => {
                attempts
                    .back_off(LockError::redis(&plan.key, error))
                    .await?
            }
            Ok(Outcome::NotALock { found }) => {
                return Err(LockError::NotALock {
                    key: plan.key.clone(),
                    found,
                });
            }
            Ok(Outcome::OtherShares { limit }) => {
                return Err(LockError::PermitsMismatch {
                    key: plan.key.clone(),
                    requested: plan.kind.shares().unwrap_or(0),
                    existing: limit,
                });
            }
            Ok(Outcome::NotReplicated { confirmed, needed }) => {
                return Err(LockError::NotReplicated {
                    key: plan.key.clone(),
                    confirmed,
                    needed,
                });
            }
            Err(error) => return Err(LockError::redis(&plan.key, error)),
        }
    }
}

/// A checked request: what every attempt of one acquisition needs.
struct Plan<K> {
    kind: K,
    core: Arc<Core>,
    key: String,
    lease: Duration,
    lease_ms: u64,
    watchdog: bool,
    hold_at_least: Option<Duration>,
    label: Label,
    confirm_at_once: bool,
    started: Instant,
    deadline: Instant,
}

impl<K: Kind> Plan<K> {
    /// Everything that can be refused before a byte is sent.
    fn check(request: LockRequest, kind: K, started: Instant) -> Result<Self, LockError> {
        let LockRequest {
            client: core,
            key,
            wait,
            lease,
            hold_at_least,
            label,
            mode: _,
            confirm_at_once,
        } = request;
        core.check_open(&key)?;
        validate(&key, wait, lease, hold_at_least)?;
        let masters = core.masters();
        if kind.shares().is_some() && !masters.is_single() {
            return Err(LockError::invalid_options(
                &key,
                "read locks and semaphores are not available with RedLock (several independent \
                 masters): use one server, Sentinel or Cluster, or an exclusive lock",
            ));
        }
        for (what, value) in [("lease", lease), ("hold_at_least", hold_at_least)] {
            if let Some(value) = value {
                check_max_lease(masters, &key, what, value)?;
            }
        }
        let watchdog = lease.is_none();
        let lease = lease.unwrap_or(core.config().watchdog_lease);
        let lease_ms = lease_millis(&key, lease)?;
        if masters.validity(lease).is_zero() {
            return Err(LockError::invalid_options(
                &key,
                format!(
                    "lease of {lease:?} leaves no validity after RedLock's clock-drift allowance \
                     (1 % of the lease + 2 ms); use a longer lease"
                ),
            ));
        }
        Ok(Plan {
            kind,
            core,
            key,
            lease,
            lease_ms,
            watchdog,
            hold_at_least,
            label,
            confirm_at_once,
            started,
            deadline: started + wait,
        })
    }

    fn timeout(&self) -> LockError {
        LockError::Timeout {
            key: self.key.clone(),
            waited: self.started.elapsed(),
        }
    }

    /// The guard of a lock a release granted (see `notify::Release::Granted`): held for
    /// the grace from the grant until its confirmation, sent a while later (see
    /// [`Taken::confirmation_due`]), extends it to the lease.
    fn into_granted_guard(
        self,
        owner: String,
        taken: Taken,
        turn: Option<LocalTurn>,
    ) -> Result<LockGuard, LockError> {
        let (lease, lease_ms) = (self.lease, self.lease_ms);
        let label = self.label.clone();
        let due = taken.confirmation_due(self.confirm_at_once || on_one_thread(), Instant::now());
        let guard = self.into_guard_valid_for(
            owner,
            taken.fencing_token,
            taken.granted_at,
            taken.grace,
            turn,
        )?;
        guard.confirm_grant(lease, lease_ms, due);
        metrics::granted(&label);
        tracing::trace!(name: "granted", target: metrics::TIMING, key = %guard.key(), "redlock: granted by a release");
        Ok(guard)
    }

    fn into_guard(
        self,
        owner: String,
        fencing_token: u64,
        sent_at: Instant,
        turn: Option<LocalTurn>,
    ) -> Result<LockGuard, LockError> {
        let lease = self.lease;
        self.into_guard_valid_for(owner, fencing_token, sent_at, lease, turn)
    }

    fn into_guard_valid_for(
        self,
        owner: String,
        fencing_token: u64,
        sent_at: Instant,
        lease: Duration,
        turn: Option<LocalTurn>,
    ) -> Result<LockGuard, LockError> {
        let valid_for = self.core.masters().validity(lease);
        // A share passes the turn on at once: the client's next task may share the key.
        let turn = match self.kind.shares() {
            None => turn,
            Some(_) => None,
        };
        LockGuard::new(Acquired {
            client: self.core,
            key: self.key,
            owner,
            fencing_token,
            sent_at,
            valid_for,
            watchdog: self.watchdog,
            hold_at_least: self.hold_at_least,
            turn,
            label: self.label,
        })
    }
}

/// A current-thread runtime confirms a grant at once, as the guard is made (the
/// confirmation is queued before `acquire` returns, and goes out at the holder's first
/// `.await`): there, a timer due during the holder's work runs only when that work
/// yields, and work that computes or blocks past the grace after a single `.await`
/// would lose the lock to the lapse. (A multi-thread runtime runs the timer on another
/// worker; one whose every worker is blocked that long starves it too, as it starves
/// the watchdog's renewals.)
fn on_one_thread() -> bool {
    tokio::runtime::Handle::try_current().map_or(true, |runtime| {
        runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
    })
}

/// What one attempt sent and found.
struct Tried {
    owner: String,
    sent_at: Instant,
    outcome: redis::RedisResult<Outcome>,
}

/// What an acquisition carries from one attempt to the next.
struct Attempts<'a, K> {
    plan: &'a Plan<K>,
    /// A holder of this client that released into our hands (see `turn`).
    baton: Option<Baton>,
    /// This acquisition's place on the key's waitlist: taken by its first failed
    /// attempt, given back on success or when it gives up. An attempt that will not
    /// wait takes none: it would leave a claim behind it.
    place: Option<WaitlistPlace<'a>>,
    listeners: Vec<Listener>,
    /// Which grant messages may be read: those made after every busy attempt.
    grant_floor: GrantFloor,
    /// When a grant made to the waiter ahead lapses unless confirmed: this waiter
    /// covers the lapse.
    lapse: Lapse,
    backoff: Duration,
    /// Counts this task in `redlock_waiting` from its first wait for a holder (or for
    /// Redis) until the acquisition ends.
    waiting: Option<metrics::Waiting>,
}

impl<'a, K: Kind> Attempts<'a, K> {
    fn new(plan: &'a Plan<K>, baton: Option<Baton>) -> Self {
        let place = plan
            .kind
            .waitlist_id_prefix()
            .filter(|_| plan.core.masters().keeps_waitlist() && Instant::now() < plan.deadline)
            .map(|prefix| WaitlistPlace::new(&plan.core, &plan.key, &prefix, plan.lease_ms));
        Attempts {
            plan,
            baton,
            place,
            listeners: Vec::new(),
            grant_floor: GrantFloor::default(),
            lapse: Lapse::default(),
            backoff: RETRY_BACKOFF.0,
            waiting: None,
        }
    }

    /// One run of the acquire script (on every master with RedLock).
    async fn attempt(&mut self) -> Tried {
        let plan = self.plan;
        // A fresh owner token per attempt: the background clean-up of an attempt whose
        // reply was lost must not be able to delete a later attempt's lock.
        let owner = plan.core.fresh_token();
        let sent_at = Instant::now();
        // Marks the baton sent: from here on a failure leaves it unknown whether the
        // script deleted the releasing holder's lock.
        let previous_owner = self.baton.as_mut().map(Baton::send);
        // From this attempt on the place may be taken, even if its reply is lost (then
        // giving up must give it back).
        let was_registered = self
            .place
            .as_mut()
            .map(|place| std::mem::replace(&mut place.registered, true));
        if let (Some(place), Some(false)) = (self.place.as_mut(), was_registered) {
            place.first_sent = Some(sent_at);
        }
        let waiter = self
            .place
            .as_ref()
            .zip(was_registered)
            .map(|(place, registered)| Waiter {
                id: &place.member,
                registered,
            });
        // Armed until the outcome is known: dropped mid-way (during the script, a
        // replica confirmation or RedLock's fencing write-back), or failed with the
        // reply lost, whatever this attempt took is released in the background.
        let undo = SpawnOnDrop::new(|| K::undo(plan.core.clone(), plan.key.clone(), owner.clone()));
        let request = Try {
            key: &plan.key,
            owner: &owner,
            lease: plan.lease,
            lease_ms: plan.lease_ms,
            previous_owner,
            waiter,
            shares: None,
        };
        tracing::trace!(name: "script_sent", target: metrics::TIMING, key = %plan.key, "redlock: attempt sent");
        let outcome = plan.kind.attempt(plan.core.masters(), request).await;
        tracing::trace!(name: "script_answered", target: metrics::TIMING, key = %plan.key, "redlock: attempt answered");
        if outcome.is_ok() {
            undo.disarm();
        } else {
            drop(undo);
        }
        if let (Some(place), Ok(Outcome::Acquired { .. })) = (self.place.as_mut(), &outcome) {
            // The script gave the place back with the success.
            place.left = true;
        }
        if let Some(baton) = self.baton.take() {
            match &outcome {
                // Deleted by this attempt's script: the release is done, whether the
                // key then came to this attempt or went to a waiting writer first.
                Ok(outcome) => baton.finish(matches!(
                    outcome,
                    Outcome::Acquired {
                        handed_off: true,
                        ..
                    } | Outcome::Busy {
                        handed_off: true,
                        ..
                    }
                )),
                // The script may not have run: the releaser releases in Redis itself.
                Err(_) => baton.give_back(),
            }
        }
        Tried {
            owner,
            sent_at,
            outcome,
        }
    }

    /// The key is busy: waits for a release message that lets this waiter try, or for
    /// the holder's lease (or a reservation for another client) to run out.
    async fn wait_for_news(
        &mut self,
        sent_at: Instant,
        ttl: Duration,
        split: bool,
    ) -> Result<Option<Grant>, LockError> {
        let plan = self.plan;
        self.backoff = RETRY_BACKOFF.0;
        if Instant::now() >= plan.deadline {
            return Err(plan.timeout());
        }
        self.count_as_waiting();
        if self.listeners.is_empty() {
            let place = self.place.as_ref();
            let (fresh, live) =
                listen_everywhere(&plan.core, &plan.key, place, sent_at, plan.deadline).await;
            self.listeners = fresh;
            if !live {
                // A fresh subscription: try again at once, since a release published
                // (or a grant made) between the attempt and the subscription was missed.
                return Ok(None);
            }
        }
        let lease_end = sent_at + ttl + Duration::from_millis(1);
        let mut fallback: Option<Instant> = None;
        self.lapse.attempted(sent_at);
        loop {
            let wake_at = fallback
                .map_or(lease_end, |at| at.min(lease_end))
                .min(self.lapse.due().unwrap_or(lease_end))
                .min(plan.deadline);
            let released = futures_util::future::select_all(
                self.listeners
                    .iter()
                    .map(|listener| Box::pin(listener.released(self.grant_floor))),
            );
            let grace = plan.core.config().reservation_grace;
            tokio::select! {
                (news, _, _) = released => match wake_on(news, Instant::now(), grace) {
                    Wake::Granted(grant) => return Ok(Some(grant)),
                    Wake::Now => break,
                    Wake::By(at) => fallback = Some(at),
                    Wake::AtLeaseEnd => fallback = None,
                    Wake::IfUnconfirmedBy(at) => self.lapse.told(at),
                    Wake::Confirmed => self.lapse.confirmed(),
                },
                _ = tokio::time::sleep_until(wake_at) => break,
            }
        }
        if split {
            // Two clients split the masters between them: retry after a random pause so
            // that one of them gets ahead.
            let jitter = Duration::from_micros((uuid::Uuid::new_v4().as_u128() % 20_000) as u64);
            tokio::time::sleep_until((Instant::now() + jitter).min(plan.deadline)).await;
        }
        Ok(None)
    }

    /// Redis (or a majority of the masters) did not answer: pauses before the next
    /// attempt, or gives up with `error` when the wait would run out first.
    async fn back_off(&mut self, error: LockError) -> Result<(), LockError> {
        if Instant::now() + self.backoff >= self.plan.deadline {
            return Err(error);
        }
        self.count_as_waiting();
        tracing::debug!(error = %error.chain(), backoff = ?self.backoff, "redlock: Redis unavailable; retrying");
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(RETRY_BACKOFF.1);
        Ok(())
    }
}

impl<K> Attempts<'_, K> {
    fn count_as_waiting(&mut self) {
        if self.waiting.is_none() {
            self.waiting = Some(metrics::Waiting::start(&self.plan.label));
        }
    }
}

/// When a waiter should try again after a release message.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// A release made this waiter the holder.
    Granted(Grant),
    Now,
    /// Not later than this (the lease or reservation it names may end sooner than the
    /// lease the waiter was told).
    By(Instant),
    /// At the end of the lease the waiter was told.
    AtLeaseEnd,
    /// The grant to the waiter ahead lapses by then unless confirmed: try then (the
    /// grantee may be stopped, and the client that released gone), unless
    /// [`Wake::Confirmed`] comes first. Kept apart from the other wake-ups, which a
    /// confirmation must not cancel.
    IfUnconfirmedBy(Instant),
    /// The grant ahead was confirmed: no lapse to try at.
    Confirmed,
}

/// What a release message means for a waiter's sleep.
fn wake_on(news: Release, now: Instant, grace: Duration) -> Wake {
    let margin = Duration::from_millis(1);
    match news {
        Release::Granted(grant) => Wake::Granted(grant),
        Release::Free | Release::ForUs => Wake::Now,
        // Reserved for the client that waited longest: wait, but not past the
        // reservation, in case that client died.
        Release::ForAnother => Wake::By(now + grace + Duration::from_millis(5)),
        Release::Taken(None) => Wake::AtLeaseEnd,
        // Taken by a holder whose lease may end sooner than the one this waiter was
        // told (the gap the model check found).
        Release::Taken(Some(lease)) => Wake::By(now + lease + margin),
        // Kept for `hold_at_least`: free when that ends.
        Release::Kept(rest) => Wake::By(now + rest + margin),
        Release::Next(lasts) => Wake::IfUnconfirmedBy(now + lasts + margin),
        Release::Confirmed => Wake::Confirmed,
    }
}

/// Listens to `key`'s releases on every master; waits (until `deadline`) for the
/// subscriptions to be confirmed. A failed subscription leaves the lease timer.
/// The flag: every subscription was live already before `since`.
async fn listen_everywhere(
    client: &Core,
    key: &str,
    place: Option<&WaitlistPlace<'_>>,
    since: Instant,
    deadline: Instant,
) -> (Vec<Listener>, bool) {
    let mut all_live = true;
    let member = place.map(|place| place.member.clone());
    let (mut listeners, mut confirmations): (Vec<_>, Vec<_>) = client
        .masters()
        .nodes()
        .iter()
        .map(|node| {
            let (listener, confirmed, live) = node.listen(key, member.clone(), since);
            all_live &= live;
            let confirmed: Pin<Box<dyn Future<Output = redis::RedisResult<()>> + Send>> =
                Box::pin(confirmed);
            (listener, confirmed)
        })
        .unzip();
    // A majority of confirmed subscriptions hears every release (RedLock publishes on
    // every master): a master that hangs must not hold the waiter up.
    let mut needed = client.masters().quorum();
    // A waiter that may be granted the key (one server: see `scripts`' `free_for_next`)
    // listens on its client's grant channel too, and needs both subscriptions.
    if let (Some(place), [node]) = (place, client.masters().nodes()) {
        let (listener, confirmed, live) =
            node.listen_for_grants(key, place.client_id(), place.member.clone(), since);
        all_live &= live;
        listeners.push(listener);
        confirmations.push(Box::pin(confirmed));
        needed = confirmations.len();
    }
    let mut pending: futures_util::stream::FuturesUnordered<_> =
        confirmations.into_iter().collect();
    let confirmed = async {
        let mut confirmed = 0;
        while confirmed < needed {
            match futures_util::StreamExt::next(&mut pending).await {
                Some(Ok(())) => confirmed += 1,
                Some(Err(error)) => {
                    tracing::debug!(%error, "redlock: subscription failed; waiting on the lease alone");
                }
                None => break,
            }
        }
    };
    let _ = tokio::time::timeout_at(deadline, confirmed).await;
    (listeners, all_live)
}

/// A waiting acquisition's place on its key's waitlist. Leaving
/// without the lock (timeout, error, the future dropped) gives the place up in the
/// background, so that no release names a waiter that is gone.
struct WaitlistPlace<'a> {
    client: &'a Arc<Core>,
    key: &'a str,
    /// The waiter's id: an owner token (or a reader's `r:` and one), the owner of the
    /// lock if a release grants it.
    id: String,
    /// How it stands on the waitlist: `<id> <lease ms> <client name>`, all that a
    /// release needs to grant it the key (see `scripts`' `free_for_next`).
    member: String,
    /// When its first attempt was sent: no later than its registration.
    first_sent: Option<Instant>,
    /// The server clock (ms) when a busy attempt put it in line, as its reply said.
    registered_ms: Option<u64>,
    /// A busy attempt's send time and the server clock (ms) when it ran: the pair that
    /// bounds this process's clock against the server's most tightly (see
    /// [`grant_time`]).
    clock_pair: Option<(Instant, u64)>,
    /// An attempt carrying the id was sent: the waitlist may hold it.
    registered: bool,
    left: bool,
}

impl<'a> WaitlistPlace<'a> {
    fn new(client: &'a Arc<Core>, key: &'a str, prefix: &str, lease_ms: u64) -> Self {
        let id = client.fresh_token_after(prefix);
        let member = format!("{id} {lease_ms} {}", client.config().name);
        WaitlistPlace {
            client,
            key,
            id,
            member,
            first_sent: None,
            registered_ms: None,
            clock_pair: None,
            registered: false,
            left: false,
        }
    }

    /// The id of its client: the hex digits before the counter of its id (after the
    /// reader's prefix).
    fn client_id(&self) -> &str {
        self.id.rsplit(':').nth(1).unwrap_or_default()
    }

    /// A busy attempt sent at `sent_at` said `line`.
    fn saw_busy(&mut self, sent_at: Instant, line: LineStatus) {
        let Some(ms) = line.server_ms else {
            return;
        };
        if line.registered {
            self.registered_ms = Some(ms);
        }
        // The later a pair's send time against the server's clock, the tighter it bounds.
        let tighter = self.clock_pair.is_none_or(|(best_sent, best_ms)| {
            signed_nanos(sent_at, best_sent) > (i128::from(ms) - i128::from(best_ms)) * 1_000_000
        });
        if tighter {
            self.clock_pair = Some((sent_at, ms));
        }
    }

    /// When a grant that came `after` this waiter's registration (by the server's
    /// clock) was made, at the earliest, by this process's clock. Never later than now;
    /// `None` when no attempt of it was sent (then the grant cannot be timed, and is
    /// taken only by an attempt).
    fn granted_at(&self, after: Duration) -> Option<Instant> {
        let at = match (self.registered_ms, self.clock_pair) {
            (Some(registered_ms), Some((sent, server_ms))) => {
                grant_time(sent, server_ms, registered_ms, after)?
            }
            // The first attempt was sent before it registered.
            _ => {
                let allowance = after / 1_000 + Duration::from_millis(1);
                self.first_sent? + after.saturating_sub(allowance)
            }
        };
        Some(at.min(Instant::now()))
    }
}

/// The earliest moment, by this process's clock, of a grant made `after` a waiter's
/// registration at `registered_ms` by the server's clock, given an attempt sent at
/// `sent` that ran at `server_ms`: it ran no earlier than it was sent, so the grant
/// came at least `registered_ms + after − server_ms` of the server's time after `sent`.
/// The clocks' rates may differ by 0.1 % (NTP slews a clock by 0.05 % at most), and the
/// server's ms are rounded down: a millisecond each for the two readings. (The first
/// attempt's send time alone is a looser bound when its reply was slow: the first
/// command on a new Cluster connection, say, after which a grant looked late.)
/// `None` when that moment is out of this clock's range (then the grant is not timed,
/// and taken only by an attempt).
fn grant_time(
    sent: Instant,
    server_ms: u64,
    registered_ms: u64,
    after: Duration,
) -> Option<Instant> {
    let after_ms = i128::try_from(after.as_millis()).unwrap_or(i128::MAX / 4);
    let between_ms = i128::from(registered_ms) + after_ms - i128::from(server_ms);
    let allowance_ms = between_ms.abs() / 1_000 + 2;
    let offset_ms = between_ms - allowance_ms;
    let offset = Duration::from_millis(u64::try_from(offset_ms.unsigned_abs()).unwrap_or(u64::MAX));
    if offset_ms >= 0 {
        sent.checked_add(offset)
    } else {
        sent.checked_sub(offset)
    }
}

/// `a − b` in nanoseconds, signed.
fn signed_nanos(a: Instant, b: Instant) -> i128 {
    if a >= b {
        i128::try_from((a - b).as_nanos()).unwrap_or(i128::MAX)
    } else {
        -i128::try_from((b - a).as_nanos()).unwrap_or(i128::MAX)
    }
}

impl Drop for WaitlistPlace<'_> {
    fn drop(&mut self) {
        if !self.registered || self.left {
            return;
        }
        drop(SpawnOnDrop::new(|| {
            let (client, key) = (self.client.clone(), self.key.to_owned());
            let member = std::mem::take(&mut self.member);
            async move { client.masters().leave_waitlist(&key, &member).await }
        }));
    }
}

impl IntoFuture for LockRequest {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

fn is_transient(error: &redis::RedisError) -> bool {
    slot_is_moving(error)
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_timed_from_the_attempt_that_best_pins_the_server_clock() {
        let ms = Duration::from_millis;
        let sent = Instant::now() + Duration::from_secs(10);
        // Registered at 1_000 (server ms) by an attempt sent at `sent` that ran at
        // 1_000; granted 200 ms later: 200 ms after `sent`, less 2 ms for rounding.
        assert_eq!(
            grant_time(sent, 1_000, 1_000, ms(200)),
            Some(sent + ms(198))
        );
        // A later attempt, sent 94 ms after a slow first one and run at 1_095: the
        // grant 108 ms after the registration came 13 ms after that attempt's send.
        assert_eq!(grant_time(sent, 1_095, 1_000, ms(108)), Some(sent + ms(11)));
        // A grant older than the attempt: before its send time.
        assert_eq!(
            grant_time(sent, 2_000, 1_000, ms(500)),
            Some(sent - ms(502))
        );
        // Long intervals allow for the clocks' rates: 0.1 %.
        assert_eq!(
            grant_time(sent, 1_000, 1_000, ms(60_000)),
            Some(sent + ms(59_938))
        );
    }

    #[test]
    fn a_release_message_tells_a_waiter_when_to_try() {
        let now = Instant::now();
        let grace = Duration::from_millis(100);
        let ms = Duration::from_millis;
        assert_eq!(wake_on(Release::Free, now, grace), Wake::Now);
        assert_eq!(wake_on(Release::ForUs, now, grace), Wake::Now);
        assert_eq!(
            wake_on(Release::ForAnother, now, grace),
            Wake::By(now + ms(105))
        );
        assert_eq!(
            wake_on(Release::Taken(Some(ms(300))), now, grace),
            Wake::By(now + ms(301))
        );
        assert_eq!(wake_on(Release::Taken(None), now, grace), Wake::AtLeaseEnd);
        assert_eq!(
            wake_on(Release::Kept(ms(900)), now, grace),
            Wake::By(now + ms(901))
        );
        // The grant ahead lapses 100 ms from now unless confirmed.
        assert_eq!(
            wake_on(Release::Next(ms(100)), now, grace),
            Wake::IfUnconfirmedBy(now + ms(101))
        );
        assert_eq!(wake_on(Release::Confirmed, now, grace), Wake::Confirmed);
    }
}
