//! Several keys locked as one (`LockClient::lock_all`): all or nothing, without
//! deadlock or starvation, in every mode, built on the single-key machinery.
//!
//! # Why this shape
//! - **One global order.** The keys are deduplicated and sorted (byte order), and
//!   taken one after the other, each with a plain [`LockRequest`] — its fair line
//!   (the turn in-process, the waitlist in Redis), its grants, its watchdog and its own
//!   fencing token. Every caller takes keys in that same order, so no caller waits
//!   for a key while holding a *later* one: a cycle of callers each waiting for the
//!   next is impossible (no deadlock), whatever order the callers named their keys in
//!   and whatever process they run in. Nothing is given back and retried, so there is
//!   no livelock either.
//! - **No starvation.** Each key's line is first come, first served, so a caller of
//!   two keys waiting in the second key's line is served in its turn: callers of that
//!   key alone who come after it do not overtake it.
//! - **Every mode.** Each key is one script on the server (or slot, or majority) that
//!   holds it: keys in different Cluster slots never meet in one command, so no
//!   `CROSSSLOT` can come back; RedLock and Sentinel need nothing more either.
//! - **All or nothing.** A failure on any key (a `Timeout`, an error) gives back the
//!   keys already taken — released, and waited for — before the error is returned; a
//!   dropped acquisition drops the guards it holds, and a dropped [`LockGuard`]
//!   releases at once in the background. Only one `wait` deadline exists: each key is
//!   asked with the time left of it.
//! - **One step for the free keys.** Where one script may touch every key — one
//!   server, Sentinel's primary, or Cluster keys in one slot (`{tag}`) — and no task
//!   of this client holds or awaits any of them, the first try takes, in one script
//!   ([`ACQUIRE_ALL`](crate::scripts::ACQUIRE_ALL)), the keys in order up to the first
//!   that is not free — all of them when all are free — and the rest are taken one by
//!   one, in line, as above. It is the same sequence of steps as key by key (a free
//!   key has no line: a release with waiters leaves the key reserved or granted, so
//!   nobody is overtaken); it saves a round trip and a script per key.
//! - **A fixed lease** runs from each key's own acquisition: the first keys' leases
//!   run while later ones are awaited. Once every key is held, the keys whose lease
//!   has aged by more than a tenth are extended to the full lease
//!   ([`needs_extension`]), so that every key is held at least `lease` (less 10 %)
//!   after `acquire` returns, and an uncontended acquisition pays no extra round trip.
//!   With the watchdog there is nothing to do.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::acquire::{Exclusive, Kind, LockRequest};
use crate::cleanup::SpawnOnDrop;
use crate::core::Core;
use crate::error::LockError;
use crate::guard::{Acquired, LockGuard};
use crate::limits::{check_max_lease, lease_millis, validate};
use crate::metrics::{self, Label};
use crate::state::LockState;
use crate::turn::LocalTurn;

/// The key named in the error of a `lock_all` given no keys at all.
pub(crate) const NO_KEYS: &str = "(no keys)";

/// An acquisition of several keys as one, being set up:
/// `client.lock_all(["acct:1", "acct:2"]).wait(..).acquire().await`.
///
/// See [`LockClient::lock_all`](struct.LockClient.html#method.lock_all) for the guarantees.
#[must_use = "nothing is locked until `.acquire().await`"]
#[derive(Debug)]
pub struct MultiLockRequest {
    client: Arc<Core>,
    /// Deduplicated, in byte order: the order every caller takes them in.
    keys: Vec<String>,
    wait: Duration,
    lease: Option<Duration>,
    hold_at_least: Option<Duration>,
    label: Label,
}

impl MultiLockRequest {
    pub(crate) fn new(client: Arc<Core>, keys: Vec<String>) -> Self {
        MultiLockRequest {
            client,
            keys: canonical(keys),
            wait: Duration::ZERO,
            lease: None,
            hold_at_least: None,
            label: Label::unlabelled(),
        }
    }

    /// How long to wait for every key, all together (default zero: one try of each).
    /// One deadline for the whole call: each key is waited for with the time left.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease for every key. Without one the keys are held with the client's
    /// watchdog lease, renewed for as long as the guard lives.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The `lock` label of every key's metrics (see [`LockRequest::label`]).
    pub fn label(mut self, label: &str) -> Self {
        self.label = Label::new(label);
        self
    }

    /// [`MultiLockRequest::label`] without a copy, for the attribute's templates.
    pub(crate) fn static_label(mut self, label: &'static str) -> Self {
        self.label = Label::from_static(label);
        self
    }

    /// A release before this much time has passed since `acquire` returned keeps every
    /// key until it has (see [`LockRequest::hold_at_least`]). Counted from when all keys
    /// are held: a key given back because another could not be taken is freed at once.
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = Some(hold);
        self
    }

    /// Acquires every key, waiting up to `wait` for all of them, or none.
    ///
    /// Fails with [`LockError::Timeout`] naming the key that was still busy when the
    /// wait ran out, or with the error that stopped the acquisition, naming its key;
    /// either way, holding none of the keys (those taken were released before this
    /// returns). No keys at all, or a key `lock` would refuse, is refused before
    /// anything is sent. Returns within `wait` plus the client's response timeout, and
    /// at most one more response timeout to extend aged leases or give taken keys back.
    /// Dropping the returned future mid-way
    /// releases, at once and in the background, whatever it had taken.
    pub async fn acquire(self) -> Result<MultiLockGuard, LockError> {
        let span = tracing::debug_span!(
            "redlock.acquire_all",
            keys = ?self.keys,
            wait = ?self.wait,
            lease = ?self.lease,
            outcome = tracing::field::Empty,
        );
        let result = self.acquire_inner().instrument(span.clone()).await;
        span.record(
            "outcome",
            if result.is_ok() { "acquired" } else { "failed" },
        );
        result
    }

    async fn acquire_inner(self) -> Result<MultiLockGuard, LockError> {
        let started = Instant::now();
        if self.keys.is_empty() {
            return Err(LockError::invalid_options(
                NO_KEYS,
                "lock_all was given no keys: name at least one",
            ));
        }
        // All or nothing on bad input too: every key is checked before any is taken.
        // (The other checks of a request — `max_lease`, RedLock's validity — do not
        // depend on the key: the first key's request makes them before sending.)
        for key in &self.keys {
            validate(key, self.wait, self.lease, self.hold_at_least)?;
        }
        if let Some(hold) = self.hold_at_least {
            check_max_lease(self.client.masters(), &self.keys[0], "hold_at_least", hold)?;
        }
        if let Some(lease) = self.lease {
            check_max_lease(self.client.masters(), &self.keys[0], "lease", lease)?;
        }
        let response_timeout = self.client.config().response_timeout;
        let deadline = started + self.wait;
        // The bound of the whole call, as a single key's.
        let bound = deadline + response_timeout;
        let mut guards: Vec<LockGuard> = Vec::with_capacity(self.keys.len());
        if let Some(taken) = self.take_at_once(started).await {
            guards = taken?;
        }
        let mut taken_at = vec![Instant::now(); guards.len()];
        for key in self.keys.iter().skip(guards.len()) {
            let now = Instant::now();
            let remaining = self
                .lease
                .map(|lease| leases_left(&taken_at, lease, now))
                .unwrap_or_default();
            let left =
                wait_until(deadline, now, &remaining, self.lease).saturating_duration_since(now);
            let mut request = LockRequest::new(self.client.clone(), key.clone())
                .wait(left)
                .labelled(self.label.clone())
                .confirming_grants_at_once();
            if let Some(lease) = self.lease {
                request = request.lease(lease);
            }
            let error = match tokio::time::timeout_at(bound, request.acquire()).await {
                Ok(Ok(guard)) => {
                    guards.push(guard);
                    taken_at.push(Instant::now());
                    continue;
                }
                Ok(Err(LockError::Timeout { key, .. })) => LockError::Timeout {
                    key,
                    waited: started.elapsed(),
                },
                Ok(Err(error)) => error,
                Err(_) => LockError::redis(
                    key,
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "Redis did not answer within the wait and the response timeout",
                    )),
                ),
            };
            tracing::debug!(%key, error = %error.chain(), taken = guards.len(), "redlock: lock_all gives back the keys it took");
            give_back(guards, response_timeout).await;
            return Err(error);
        }
        if let Some(lease) = self.lease {
            // Aged from when each key was taken: a granted key's own estimate is the
            // grace until its confirmation (already sent, to the full lease) answers,
            // and extending it again would cost a script for nothing. A confirmation
            // that fails marks its guard lost, as for a single key.
            let aged = needs_extension(&leases_left(&taken_at, lease, Instant::now()), lease);
            let extended =
                futures_util::future::join_all(aged.iter().map(|&i| guards[i].extend(lease))).await;
            if let Some(error) = extended.into_iter().find_map(Result::err) {
                give_back(guards, response_timeout).await;
                return Err(error);
            }
        }
        // Only now: a key given back before every key was held is freed at once.
        if let Some(hold) = self.hold_at_least {
            for guard in &guards {
                guard.keep_at_least_from_now(hold);
            }
        }
        Ok(MultiLockGuard { guards })
    }
}

impl MultiLockRequest {
    /// The one step (see the module's notes): in one script, the keys in order up to
    /// the first that is not free (every key when all are), when one script may touch
    /// them all; the caller goes on from the first key not taken. `None` when nothing
    /// was taken (or it is being given back in the background, Redis's answer lost).
    /// `Some(Err)` only when the client was shut down meanwhile.
    async fn take_at_once(&self, started: Instant) -> Option<Result<Vec<LockGuard>, LockError>> {
        let core = &self.client;
        if self.keys.len() < 2 || core.check_open(&self.keys[0]).is_err() {
            return None;
        }
        let node = core.masters().one_step_node(&self.keys)?;
        // Every turn free at once, or the keys go through their lines. The turns of keys
        // the step does not take are given back as it returns.
        let turns: Vec<LocalTurn> = self
            .keys
            .iter()
            .map(|key| core.turns().take_free(key))
            .collect::<Option<_>>()?;
        let lease = self.lease.unwrap_or(core.config().watchdog_lease);
        let lease_ms = lease_millis(&self.keys[0], lease).ok()?;
        let owners: Vec<String> = self.keys.iter().map(|_| core.fresh_token()).collect();
        let sent_at = Instant::now();
        // Armed until the answer is known: dropped mid-way, or with the answer lost,
        // whatever the script took is released in the background.
        let undo = SpawnOnDrop::new(|| {
            let undos: Vec<_> = self
                .keys
                .iter()
                .zip(&owners)
                .map(|(key, owner)| Exclusive::undo(core.clone(), key.clone(), owner.clone()))
                .collect();
            async move {
                futures_util::future::join_all(undos).await;
            }
        });
        let answer = tokio::time::timeout(
            core.config().response_timeout,
            node.acquire_all(&self.keys, &owners, lease_ms, core.masters().name()),
        )
        .await;
        let tokens = match answer {
            Ok(Ok(tokens)) => {
                undo.disarm();
                tokens
            }
            Ok(Err(error)) => {
                tracing::debug!(keys = ?self.keys, %error, "redlock: lock_all's one step failed; taking the keys one by one");
                return None;
            }
            Err(_) => return None,
        };
        if tokens.is_empty() {
            return None;
        }
        let valid_for = core.masters().validity(lease);
        let mut guards = Vec::with_capacity(self.keys.len());
        let held = self.keys.iter().zip(owners).zip(tokens).zip(turns);
        for (((key, owner), fencing_token), turn) in held {
            let guard = LockGuard::new(Acquired {
                client: core.clone(),
                key: key.clone(),
                owner,
                fencing_token,
                sent_at,
                valid_for,
                watchdog: self.lease.is_none(),
                hold_at_least: None,
                turn: Some(turn),
                label: self.label.clone(),
            });
            match guard {
                Ok(guard) => guards.push(guard),
                // Shut down meanwhile: this one is released in the background, and so
                // are the others, dropped.
                Err(error) => return Some(Err(error)),
            }
        }
        for _ in &guards {
            metrics::acquire_finished(&self.label, metrics::Outcome::Acquired, started.elapsed());
        }
        tracing::debug!(keys = ?self.keys, taken = guards.len(), "redlock: lock_all took keys in one step");
        Some(Ok(guards))
    }
}

/// Releases `guards` together, waiting at most `patience` for Redis (the releases
/// not done by then go on in the background, as a dropped guard's do).
async fn give_back(guards: Vec<LockGuard>, patience: Duration) {
    let released = futures_util::future::join_all(guards.into_iter().map(LockGuard::release));
    let _ = tokio::time::timeout(patience, released).await;
}

/// The order every caller takes keys in: each key once, in byte order.
pub(crate) fn canonical(mut keys: Vec<String>) -> Vec<String> {
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Each held key's fixed `lease` left at `now`, counted from when it was taken
/// (`taken_at`; a granted key's from its confirmation, sent as its acquire returned).
fn leases_left(taken_at: &[Instant], lease: Duration, now: Instant) -> Vec<Duration> {
    taken_at
        .iter()
        .map(|at| (*at + lease).saturating_duration_since(now))
        .collect()
}

/// Until when to wait for the next key: the call's deadline, or with a fixed lease,
/// sooner if a key already held would otherwise run out first (`remaining`: each held
/// key's lease left) — a tenth of the lease before, leaving time to extend it. The call then ends with a `Timeout` on the busy
/// key, holding none, rather than finding a key it held gone (and perhaps taken by
/// another) once the last is acquired. The watchdog renews held keys: no limit.
pub(crate) fn wait_until(
    deadline: Instant,
    now: Instant,
    remaining: &[Duration],
    lease: Option<Duration>,
) -> Instant {
    match (lease, remaining.iter().min()) {
        (Some(lease), Some(least)) => deadline.min(now + least.saturating_sub(lease / 10)),
        _ => deadline,
    }
}

/// Which of the keys, with these leases left, to extend to `lease` once all are held:
/// those whose lease has run down by more than a tenth of it while later keys were
/// awaited. A key just taken (the uncontended case) is not, so no round trip is added.
pub(crate) fn needs_extension(remaining: &[Duration], lease: Duration) -> Vec<usize> {
    let floor = lease.saturating_sub(lease / 10);
    remaining
        .iter()
        .enumerate()
        .filter(|(_, left)| **left < floor)
        .map(|(i, _)| i)
        .collect()
}

/// Several keys held as one (see [`LockClient::lock_all`](struct.LockClient.html#method.lock_all)).
/// Release it with [`MultiLockGuard::release`]; dropping it releases every key in the
/// background, as a dropped [`LockGuard`] does.
#[must_use = "the keys are released as soon as the guard is dropped"]
pub struct MultiLockGuard {
    /// One per key, in the canonical order.
    guards: Vec<LockGuard>,
}

impl std::fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tokens: Vec<(&str, u64)> = self
            .guards
            .iter()
            .map(|guard| (guard.key(), guard.fencing_token()))
            .collect();
        f.debug_struct("MultiLockGuard")
            .field("fencing_tokens", &tokens)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl MultiLockGuard {
    /// The keys held, each once, in byte order.
    pub fn keys(&self) -> Vec<&str> {
        self.guards.iter().map(LockGuard::key).collect()
    }

    /// The fencing token of `key`'s acquisition (from that key's own counter: compare
    /// it only with tokens of the same key), or `None` for a key this guard does not hold.
    pub fn fencing_token(&self, key: &str) -> Option<u64> {
        self.guards
            .binary_search_by(|guard| guard.key().cmp(key))
            .ok()
            .map(|at| self.guards[at].fencing_token())
    }

    /// True once any of the keys is known gone, or its lease may have run out.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves when any of the keys is lost.
    pub async fn lost(&self) {
        // Never empty (`acquire` refuses no keys); `select_all` would panic on none.
        if self.guards.is_empty() {
            return std::future::pending().await;
        }
        let each = self.guards.iter().map(|guard| Box::pin(guard.lost()));
        futures_util::future::select_all(each).await;
    }

    /// How long every key is surely still held: the smallest of their
    /// [`LockGuard::lease_remaining`].
    pub fn lease_remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::lease_remaining)
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Releases every key, all at once. Tries them all, and returns the first error
    /// (in key order) as [`LockGuard::release`] reports it.
    pub async fn release(self) -> Result<(), LockError> {
        let released =
            futures_util::future::join_all(self.guards.into_iter().map(LockGuard::release)).await;
        released.into_iter().collect()
    }

    /// Each key's key, fencing token and shared state, in order (for the attribute).
    pub(crate) fn held(&self) -> impl Iterator<Item = (&str, u64, Option<Arc<LockState>>)> {
        self.guards
            .iter()
            .map(|guard| (guard.key(), guard.fencing_token(), guard.state()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{canonical, needs_extension, wait_until};

    #[test]
    fn keys_are_taken_once_each_in_byte_order() {
        let keys = |list: &[&str]| list.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            canonical(keys(&["b", "a", "a", "c", "b"])),
            keys(&["a", "b", "c"])
        );
        // Byte order, whoever names them how: upper case before lower, `{tag}` after.
        assert_eq!(
            canonical(keys(&["acct:2", "{t}x", "Acct:1", "acct:10"])),
            keys(&["Acct:1", "acct:10", "acct:2", "{t}x"])
        );
        assert_eq!(canonical(keys(&["a", "b"])), canonical(keys(&["b", "a"])));
        assert!(canonical(Vec::new()).is_empty());
    }

    #[test]
    fn a_fixed_lease_ends_the_wait_for_later_keys_before_a_held_key_runs_out() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(5);
        let lease = Duration::from_secs(1);
        let ms = Duration::from_millis;
        // Nothing held yet, or the watchdog renewing: the call's own deadline.
        assert_eq!(wait_until(deadline, now, &[], Some(lease)), deadline);
        assert_eq!(wait_until(deadline, now, &[ms(200)], None), deadline);
        // A key held with 1 s left: stop waiting 0.9 s from now, the least of them.
        assert_eq!(
            wait_until(deadline, now, &[ms(1_000), ms(700)], Some(lease)),
            now + ms(600)
        );
        // A deadline sooner than that stands.
        let soon = now + ms(100);
        assert_eq!(wait_until(soon, now, &[ms(1_000)], Some(lease)), soon);
        // Already less than a tenth left: no wait at all (one try).
        assert_eq!(wait_until(deadline, now, &[ms(50)], Some(lease)), now);
    }

    #[test]
    fn only_leases_aged_by_more_than_a_tenth_are_extended() {
        let lease = Duration::from_secs(10);
        let ms = Duration::from_millis;
        // Just taken (RedLock's drift allowance included): nothing to send.
        assert!(needs_extension(&[ms(10_000), ms(9_898), ms(9_000)], lease).is_empty());
        // The first key waited 3 s for the second: only it.
        assert_eq!(needs_extension(&[ms(7_000), ms(10_000)], lease), [0]);
        // A key whose lease ran down to 100 ms.
        assert_eq!(
            needs_extension(&[ms(8_999), ms(100), ms(9_500)], lease),
            [0, 1]
        );
        assert_eq!(needs_extension(&[Duration::ZERO], lease), [0]);
    }
}
