//! The shared core of a client: what every lock of one `LockClient` (and of its
//! clones) uses — the servers, the settings, the turns of its tasks, the watchdog —
//! and the owner tokens it hands out. Reached through methods, never through fields.
//!
//! It also keeps the client's end tidy: the locks its guards hold right now, which
//! [`Core::shutdown`] releases; the releases running in the background (of dropped
//! guards, of interrupted calls), which it waits for; and, for a runtime that shuts
//! down before such a release has reached Redis (a program whose `main` returned),
//! the same release sent on a connection of its own, on a thread of its own, within
//! [`EXIT_FLUSH_LIMIT`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::cleanup::{InFlight, Unless};
use crate::config::ClientConfig;
use crate::error::LockError;
use crate::grant::Confirmation;
use crate::masters::Masters;
use crate::node::Verdict;
use crate::state::LockState;
use crate::turn::Turns;
use crate::watchdog::Watchdog;

/// The longest a runtime's shutdown waits for the releases it cut short, per client
/// (less when the connect and response timeouts add up to less): a program that exits
/// while Redis hangs is delayed by no more than this.
pub(crate) const EXIT_FLUSH_LIMIT: Duration = Duration::from_secs(1);

/// A release (or clean-up) run in the background; resolves to whether Redis answered.
pub(crate) type Background = Pin<Box<dyn Future<Output = bool> + Send>>;

/// Connects anew to the client's servers, outside the runtime the client was made in.
pub(crate) type Reconnect =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Masters, LockError>> + Send>> + Send + Sync>;

/// One lock a guard of this client holds: what releasing it takes. The guard and
/// [`Core::shutdown`] share it; whichever lets it go first ([`Core::let_go`]) releases it.
pub(crate) struct HeldLock {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) acquired_at: Instant,
    /// `hold_at_least`, counted from `acquired_at`: given with the request, or set once
    /// later (`keep_at_least_from_now`: a `lock_all` sets it once every key is held, so
    /// that a key it gives back is freed at once).
    hold_at_least: std::sync::OnceLock<Duration>,
    pub(crate) state: Arc<LockState>,
    pub(crate) watchdog_id: Option<u64>,
    /// Its entry among the client's held locks.
    id: u64,
    /// Where a granted lock's confirmation stands (see `LockGuard::confirm_grant`).
    confirmation: Confirmation,
}

impl HeldLock {
    pub(crate) fn new(
        key: String,
        owner: String,
        acquired_at: Instant,
        hold_at_least: Option<Duration>,
        state: Arc<LockState>,
        watchdog_id: Option<u64>,
    ) -> Self {
        let cell = std::sync::OnceLock::new();
        if let Some(hold) = hold_at_least {
            let _ = cell.set(hold);
        }
        HeldLock {
            key,
            owner,
            acquired_at,
            hold_at_least: cell,
            state,
            watchdog_id,
            id: 0,
            confirmation: Confirmation::default(),
        }
    }

    /// A release granted it: its confirmation is due (see [`Confirmation`]). Letting it
    /// go is [`Core::let_go`]'s alone, which also takes it off the held locks.
    pub(crate) fn expect_confirmation(&self) {
        self.confirmation.expect();
    }

    /// Takes the confirmation due, if any, running `queue` while no release can be
    /// queued (see [`Confirmation::take`]).
    pub(crate) fn take_confirmation<R>(&self, queue: impl FnOnce() -> R) -> Option<R> {
        self.confirmation.take(queue)
    }

    /// A confirmation answered that the lock is gone: whether that means it was lost
    /// (see [`Confirmation::gone_means_lost`]).
    pub(crate) fn gone_means_lost(&self) -> bool {
        self.confirmation.gone_means_lost(self.state.has_ended())
    }

    /// How long a release now must keep the key for `hold_at_least` (ms; 0: free it).
    pub(crate) fn keep_ms(&self) -> u64 {
        keep_ms(
            self.hold_at_least.get().copied(),
            self.acquired_at.elapsed(),
        )
    }

    /// Keeps the key at least `hold` from now at its release, unless a `hold_at_least`
    /// was set already (it then stays as it was).
    pub(crate) fn keep_at_least_from_now(&self, hold: Duration) {
        let _ = self
            .hold_at_least
            .set(hold.saturating_add(self.acquired_at.elapsed()));
    }

    /// Until when a release must keep the key, for a release sent from another runtime.
    fn keep_until(&self) -> Option<std::time::Instant> {
        let keep = self.keep_ms();
        (keep > 0).then(|| std::time::Instant::now() + Duration::from_millis(keep))
    }
}

/// How long a release must keep the key for `hold_at_least` after `held` (ms; 0: free it).
fn keep_ms(hold_at_least: Option<Duration>, held: Duration) -> u64 {
    hold_at_least
        .and_then(|least| least.checked_sub(held))
        .filter(|rest| !rest.is_zero())
        .map(|rest| rest.as_millis().max(1) as u64)
        .unwrap_or(0)
}

/// [`keep_ms`] for a release that must keep the key until `until`.
fn keep_ms_until(until: Option<std::time::Instant>) -> u64 {
    until.map_or(0, |until| {
        let rest = until.saturating_duration_since(std::time::Instant::now());
        keep_ms(Some(rest), Duration::ZERO)
    })
}

/// The locks a client's guards hold.
#[derive(Default)]
struct Held {
    next_id: u64,
    locks: HashMap<u64, Arc<HeldLock>>,
}

/// Releases sent as a runtime shuts down: a thread with a runtime and connections of
/// its own, alive until `deadline`.
struct ExitFlush {
    jobs: tokio::sync::mpsc::UnboundedSender<ExitRelease>,
    deadline: std::time::Instant,
}

struct ExitRelease {
    key: String,
    owner: String,
    keep_until: Option<std::time::Instant>,
    sent: std::sync::mpsc::Sender<()>,
}

pub(crate) struct Core {
    id: u64,
    /// Random per client; with a counter it makes owner tokens and waiter ids unique
    /// across clients and processes without drawing randomness per lock.
    token_prefix: String,
    next_token: AtomicU64,
    url: String,
    masters: Arc<Masters>,
    config: ClientConfig,
    turns: Arc<Turns>,
    watchdog: Watchdog,
    held: Mutex<Held>,
    /// Set once, under `held`'s lock, by `shutdown`; read without it by `check_open`.
    shut_down: AtomicBool,
    /// Releases and clean-ups running in the background.
    in_flight: Arc<InFlight>,
    reconnect: Reconnect,
    exit_flush: Mutex<Option<ExitFlush>>,
}

impl Core {
    pub(crate) fn new(
        url: String,
        masters: Masters,
        config: ClientConfig,
        reconnect: Reconnect,
    ) -> Arc<Self> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let masters = Arc::new(masters);
        let watchdog = Watchdog::new(&masters, &config);
        Arc::new(Core {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            token_prefix: uuid::Uuid::new_v4().simple().to_string(),
            next_token: AtomicU64::new(0),
            url,
            masters,
            config,
            turns: Arc::new(Turns::default()),
            watchdog,
            held: Mutex::new(Held::default()),
            shut_down: AtomicBool::new(false),
            in_flight: Arc::new(InFlight::default()),
            reconnect,
            exit_flush: Mutex::new(None),
        })
    }

    /// Tells clients apart (reentrancy is per client and key).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The servers as given (passwords hidden).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn masters(&self) -> &Masters {
        &self.masters
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The per-key turns of this client's tasks.
    pub(crate) fn turns(&self) -> &Arc<Turns> {
        &self.turns
    }

    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// A token no other owner or waiter, in any client, has or will have:
    /// `<32 hex digits>:<hex counter>`. Inspection tells a lock's value from an
    /// application's string by this shape (`scripts::INSPECT`), so keep it.
    pub(crate) fn fresh_token(&self) -> String {
        self.fresh_token_after("")
    }

    /// `prefix` followed by a fresh token, in one allocation and without `format!`:
    /// one or two are made on every acquisition.
    pub(crate) fn fresh_token_after(&self, prefix: &str) -> String {
        let n = self.next_token.fetch_add(1, Ordering::Relaxed);
        token(prefix, &self.token_prefix, n)
    }
}

impl Core {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Err(ShutDown)` once the client was shut down: it takes no new lock.
    pub(crate) fn check_open(&self, key: &str) -> Result<(), LockError> {
        if self.shut_down.load(Ordering::Acquire) {
            return Err(LockError::ShutDown {
                key: key.to_owned(),
            });
        }
        Ok(())
    }

    /// Counts a lock just acquired among the client's held locks; `Err` with it when
    /// the client was shut down meanwhile (the caller then releases it).
    pub(crate) fn hold(&self, mut lock: HeldLock) -> Result<Arc<HeldLock>, Arc<HeldLock>> {
        let mut held = self.held();
        if self.shut_down.load(Ordering::Acquire) {
            return Err(Arc::new(lock));
        }
        held.next_id += 1;
        lock.id = held.next_id;
        let lock = Arc::new(lock);
        held.locks.insert(lock.id, lock.clone());
        Ok(lock)
    }

    /// Takes `lock` off the client's held locks before its guard releases it; false
    /// when [`Core::shutdown`] took it first (and released it).
    pub(crate) fn let_go(&self, lock: &HeldLock) -> bool {
        let ours = self.held().locks.remove(&lock.id).is_some();
        if ours {
            lock.confirmation.let_go();
        }
        ours
    }

    /// Runs `work` — the release of `key` by `owner`, or the clean-up of an
    /// interrupted acquisition, resolving to whether Redis answered — as a background
    /// task of this client: counted until it ends (for [`Core::shutdown`]), and, if its
    /// runtime drops it unfinished, followed by the same release sent on a connection
    /// of its own ([`EXIT_FLUSH_LIMIT`]).
    ///
    /// Without an answer, the release is sent once more from a task of its own: a
    /// runtime shutting down may have dropped the connection's task before this one
    /// (Redis then "fails" with a broken pipe), and it drops a task spawned now at
    /// once, which sends the release at exit; a runtime still running retries it.
    ///
    /// `work` comes boxed: its type stays out of the types of the futures that arm a
    /// clean-up (a release, an acquire), which are deep enough already.
    pub(crate) fn finish_release(
        self: &Arc<Self>,
        key: &str,
        owner: &str,
        keep_until: Option<std::time::Instant>,
        work: Background,
    ) -> impl Future<Output = ()> + Send + 'static + use<> {
        let running = self.in_flight.start();
        let core = self.clone();
        let (key, owner) = (key.to_owned(), owner.to_owned());
        let unfinished = Unless::new({
            let (core, key, owner) = (core.clone(), key.clone(), owner.clone());
            move || core.release_on_exit(key, owner, keep_until)
        });
        async move {
            if work.await {
                unfinished.done();
                return;
            }
            tokio::spawn(async move {
                let keep = keep_ms_until(keep_until);
                let outcome = core.masters().release(&key, &owner, keep).await;
                tracing::debug!(%key, ok = outcome.is_ok(), "redlock: sent an unanswered release again");
                unfinished.done();
                drop(running);
            });
        }
    }

    /// [`Core::finish_release`] for a held lock.
    pub(crate) fn finish_releasing(
        self: &Arc<Self>,
        lock: &HeldLock,
        work: Background,
    ) -> impl Future<Output = ()> + Send + 'static + use<> {
        self.finish_release(&lock.key, &lock.owner, lock.keep_until(), work)
    }

    /// Shuts the client down: it takes no new lock ([`LockError::ShutDown`]), releases
    /// every lock its guards hold, and waits for the releases running in the
    /// background, each bounded by the response timeout. The first release that
    /// failed is the error; the others are still made.
    pub(crate) async fn shutdown(&self) -> Result<(), LockError> {
        let locks: Vec<Arc<HeldLock>> = {
            let mut held = self.held();
            self.shut_down.store(true, Ordering::Release);
            held.locks.drain().map(|(_, lock)| lock).collect()
        };
        for lock in &locks {
            lock.confirmation.let_go();
            if let Some(id) = lock.watchdog_id {
                self.watchdog.forget(id);
            }
        }
        let released = futures_util::future::join_all(
            locks
                .iter()
                .map(|lock| self.masters.release(&lock.key, &lock.owner, lock.keep_ms())),
        )
        .await;
        let mut first_error = None;
        for (lock, outcome) in locks.iter().zip(released) {
            match outcome {
                Ok(Verdict::Ours) => lock.state.released(),
                // Lost already: nothing was ours to release.
                Ok(verdict) => lock.state.found_gone(verdict),
                Err(error) => {
                    lock.state.released();
                    first_error.get_or_insert(error.into_lock_error(&lock.key, &self.masters));
                }
            }
        }
        // Releases sent again or still running in the background (a guard dropped just
        // before), then the lapsed-grant checks releases started: in that order, since a
        // background release that grants starts a check. A grant they made must not be
        // left to lapse unchecked when the process exits; a check runs a grace after its
        // release.
        let limit = self.config.response_timeout + self.config.reservation_grace;
        let everything = async {
            self.in_flight.none_running().await;
            futures_util::future::join_all(
                self.masters
                    .nodes()
                    .iter()
                    .map(|node| node.grant_checks_finished()),
            )
            .await;
        };
        let background = tokio::time::timeout(limit, everything).await;
        tracing::debug!(
            released = locks.len(),
            background_finished = background.is_ok(),
            "redlock.shutdown"
        );
        if background.is_err() {
            tracing::warn!(
                ?limit,
                "redlock: shutdown: background releases or grant checks unfinished after the \
                 response timeout and the grace; their locks may stay until their leases run \
                 out, and a grant nobody confirms until the lease its waiters were told"
            );
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The runtime dropped a background release of `key` unfinished (it is shutting
    /// down): sends it on a connection of its own, from a thread of its own, and waits
    /// for Redis's answer until the flush's deadline (see [`EXIT_FLUSH_LIMIT`]). Blocks
    /// the thread that drops the task, which is the runtime's shutdown, never a task.
    fn release_on_exit(&self, key: String, owner: String, keep_until: Option<std::time::Instant>) {
        let now = std::time::Instant::now();
        let (jobs, deadline) = {
            let mut flush = self.exit_flush.lock().unwrap_or_else(|e| e.into_inner());
            match &*flush {
                Some(flush) if flush.deadline > now => (flush.jobs.clone(), flush.deadline),
                _ => {
                    let Some(started) = self.start_exit_flush(now) else {
                        return;
                    };
                    let started = flush.insert(started);
                    (started.jobs.clone(), started.deadline)
                }
            }
        };
        let (sent, answered) = std::sync::mpsc::channel();
        let release = ExitRelease {
            key,
            owner,
            keep_until,
            sent,
        };
        if jobs.send(release).is_ok() {
            let _ = answered.recv_timeout(deadline.saturating_duration_since(now));
        }
    }

    fn start_exit_flush(&self, now: std::time::Instant) -> Option<ExitFlush> {
        let limit =
            (self.config.connect_timeout + self.config.response_timeout).min(EXIT_FLUSH_LIMIT);
        let deadline = now + limit;
        let (jobs, queue) = tokio::sync::mpsc::unbounded_channel();
        // Only made here, polled on the thread: the runtime it connects in is that one's.
        let connecting = (self.reconnect)();
        let thread = std::thread::Builder::new()
            .name("redlock-exit-flush".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::warn!(%error, "redlock: no runtime for the releases cut short at exit");
                        return;
                    }
                };
                let until = tokio::time::Instant::from_std(deadline);
                runtime.block_on(async move {
                    let _ = tokio::time::timeout_at(until, flush_on_exit(connecting, queue)).await;
                });
            });
        match thread {
            Ok(_) => Some(ExitFlush { jobs, deadline }),
            Err(error) => {
                tracing::warn!(%error, "redlock: no thread for the releases cut short at exit");
                None
            }
        }
    }
}

/// Connects, then sends each release it is given, all at once.
async fn flush_on_exit(
    connecting: Pin<Box<dyn Future<Output = Result<Masters, LockError>> + Send>>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<ExitRelease>,
) {
    let masters = match connecting.await {
        Ok(masters) => Arc::new(masters),
        Err(error) => {
            tracing::warn!(error = %error.chain(), "redlock: cannot reach Redis to send the releases cut short at exit; their locks stay until their leases run out");
            return;
        }
    };
    while let Some(release) = queue.recv().await {
        let masters = masters.clone();
        tokio::spawn(async move {
            let keep = keep_ms_until(release.keep_until);
            let outcome = masters.release(&release.key, &release.owner, keep).await;
            tracing::debug!(key = %release.key, ok = outcome.is_ok(), "redlock: sent a release cut short at exit");
            let _ = release.sent.send(());
        });
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("url", &self.url)
            .field("watchdog_lease", &self.config.watchdog_lease)
            .field("renew_every", &self.config.renew_every)
            .finish_non_exhaustive()
    }
}

/// `<prefix><client's token prefix>:<n in hex>`, written by hand: `format!` cost more
/// than the rest of building the token.
fn token(prefix: &str, client: &str, n: u64) -> String {
    let digits = (u64::BITS - n.leading_zeros()).div_ceil(4).max(1);
    let mut token = String::with_capacity(prefix.len() + client.len() + 1 + digits as usize);
    token.push_str(prefix);
    token.push_str(client);
    token.push(':');
    for digit in (0..digits).rev() {
        let nibble = ((n >> (4 * digit)) & 0xf) as u32;
        token.push(char::from_digit(nibble, 16).unwrap_or('0'));
    }
    token
}

#[cfg(test)]
mod tests {
    use super::keep_ms;
    use std::time::Duration;

    #[test]
    fn an_early_release_keeps_the_key_for_the_rest_of_the_minimum_hold() {
        let ms = Duration::from_millis;
        assert_eq!(keep_ms(None, ms(10)), 0);
        assert_eq!(keep_ms(Some(ms(1000)), ms(150)), 850);
        assert_eq!(keep_ms(Some(ms(1000)), ms(1000)), 0);
        assert_eq!(keep_ms(Some(ms(1000)), ms(2000)), 0);
        // Less than a millisecond left still keeps it (Redis counts in ms).
        assert_eq!(keep_ms(Some(ms(1000)), Duration::from_micros(999_700)), 1);
    }

    #[test]
    fn a_token_is_the_prefixes_and_the_counter_in_hex() {
        for n in [
            0,
            1,
            9,
            10,
            15,
            16,
            255,
            256,
            0xabc,
            u64::MAX >> 4,
            u64::MAX,
        ] {
            assert_eq!(super::token("r:", "c0ffee", n), format!("r:c0ffee:{n:x}"));
            assert_eq!(super::token("", "c0ffee", n), format!("c0ffee:{n:x}"));
        }
    }
}
