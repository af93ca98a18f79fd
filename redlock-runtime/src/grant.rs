//! A grant, as the client it was made to sees it: one type per step, whose methods are
//! the only transitions, so that news that comes after its step has moved on is turned
//! away here, and by no reader of its own.
//!
//! A release grants the key to the head of the line (`scripts`' `free_for_next`): it
//! makes the waiter the holder for a grace, and tells its client
//! `G <id> <token> <ms after registration> <grace ms>`. On this client the grant then
//! goes through these steps:
//! - **delivered**: [`Grant::parse_message`] reads the message; the channel keeps, for
//!   each of its waiters, the grant with the highest token ([`Grant::supersedes`]:
//!   messages may come out of order after a resubscription), and for a waiter that does
//!   not listen yet, the latest grant as [`Unclaimed`], which it claims as it starts
//!   listening, within [`UNCLAIMED_FOR`];
//! - **read**: the waiter reads it against its [`GrantFloor`]: a grant made before one
//!   of the waiter's attempts found the key busy lapsed or was taken away since, and is
//!   dropped (issue 33);
//! - **taken**: [`Grant::take`] times it by this process's clock. One read too late to
//!   be surely in force (the process was stopped or starved) is refused: the waiter
//!   attempts instead, and finds the key its own or busy;
//! - **confirmed or let go**: the held lock's [`Confirmation`]: due a while after the
//!   grant ([`Taken::confirmation_due`]), sent once — by its timer or by an `extend` —
//!   and never once the lock is let go; its answer says whether a lock found gone was
//!   lost or let go meanwhile ([`Confirmation::gone_means_lost`]).
//!
//! The waiter behind the grantee has a step of its own, the [`Lapse`]: told when the
//! grant lapses unless confirmed (`N`; kept as [`Unclaimed`] for a waiter that does not
//! listen yet, and cleared by a `C` for it), it attempts then, unless told of the
//! confirmation (`C`) first. A grant nobody confirms so reaches the next waiter a grace
//! later, whatever became of the client that released (issue 34).
//!
//! Plain types, no I/O: the unit tests below drive each step through its transitions.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// How long news that came for a waiter of this client before it listened is kept for
/// it (see [`Unclaimed`]): a grant lasts a grace unless confirmed; one read later than
/// that is taken only by an attempt of the waiter's, and one made before a busy attempt
/// of the waiter's is not admitted (see [`GrantFloor`]).
pub(crate) const UNCLAIMED_FOR: Duration = Duration::from_secs(1);

/// A grant made to a waiter of this client: what its message (`G`) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fencing_token: u64,
    /// When it was made, after the waiter's registration, by the server's clock.
    pub(crate) after: Duration,
    /// How long it lasts unconfirmed: the grace of the client whose release made it.
    pub(crate) lasts: Duration,
}

impl Grant {
    /// Delivered: a grant message after its `G `, `<id> <token> <ms after registration>
    /// <ms it lasts unconfirmed>`: the waiter's id and the grant.
    pub(crate) fn parse_message(text: &[u8]) -> Option<(&[u8], Grant)> {
        let mut words = text.split(|&byte| byte == b' ');
        let id = words.next()?;
        Some((id, Grant::parse(words)?))
    }

    /// The words of a grant message after the waiter's id,
    /// `<token> <ms after registration> <ms it lasts unconfirmed>`. `None` when one is
    /// missing or not a number.
    fn parse<'a>(mut words: impl Iterator<Item = &'a [u8]>) -> Option<Grant> {
        Some(Grant {
            fencing_token: std::str::from_utf8(words.next()?).ok()?.parse().ok()?,
            after: millis(words.next()?)?,
            lasts: millis(words.next()?)?,
        })
    }

    /// Whether this grant, for the same waiter as `kept`, replaces it: the latest
    /// grant has the highest token, whatever order the messages came in (an older one
    /// kept would be dropped as stale when read, and the waiter lose its turn).
    pub(crate) fn supersedes(&self, kept: &Grant) -> bool {
        self.fencing_token > kept.fencing_token
    }

    /// Taken by its waiter at `now`: the grant made at `granted_at` (this process's
    /// conservative estimate from `after`; `None` when it cannot be timed) holds for its
    /// grace — the one it was made with, and never more than `bound` (this client's
    /// grace, or the lease) — less what `validity` takes off (RedLock's drift). `None`
    /// when read too late: less than half the grace would be left, and it may have
    /// lapsed and the key gone to the next in line; the waiter then attempts, and takes
    /// the key if it is still granted to it (with a token of its own, from Redis).
    pub(crate) fn take(
        self,
        granted_at: Option<Instant>,
        bound: Duration,
        validity: impl FnOnce(Duration) -> Duration,
        now: Instant,
    ) -> Option<Taken> {
        let grace = bound.min(self.lasts);
        let granted_at = granted_at?;
        (granted_at + validity(grace) >= now + grace / 2).then_some(Taken {
            fencing_token: self.fencing_token,
            granted_at,
            grace,
        })
    }
}

/// A grant its waiter took: it holds the lock for `grace` from `granted_at`, until its
/// confirmation extends it to the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) fencing_token: u64,
    pub(crate) granted_at: Instant,
    pub(crate) grace: Duration,
}

impl Taken {
    /// When its confirmation is sent: at once when `at_once` (asked for, or a
    /// current-thread runtime, whose timers run only when the holder's work yields),
    /// else a quarter of the grace after the grant. A hold that ends sooner — most do,
    /// at the default 100 ms — never confirms, and its release frees the grant as it
    /// would the lease: the confirmation's script and its `C` to the next in line are
    /// saved. Three quarters of the grace stay for the confirmation to reach Redis (a
    /// process starved longer loses the lock, which its guard then reports, as a grant
    /// read late would). An `extend` made before then confirms in its place. The next in
    /// line, told the grant's lapse (`N`), learns of the confirmation (`C`) before the
    /// lapse, or of a release through Redis (`G`, another `N`); a release kept for
    /// `hold_at_least` tells it nothing, and it attempts at the lapse for nothing. (A lock
    /// granted unconfirmed is not handed off inside its client: see
    /// `hand_off::leaves_time_to_hand_off`.)
    pub(crate) fn confirmation_due(&self, at_once: bool, now: Instant) -> Instant {
        match at_once {
            true => now,
            false => self.granted_at + self.grace / 4,
        }
    }
}

/// A duration in ms, as the scripts write it in their messages.
pub(crate) fn millis(text: &[u8]) -> Option<Duration> {
    std::str::from_utf8(text)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

/// Whether the waitlist member `member` (`<id> <lease ms> <client name>`) is the waiter
/// `id`, whom a message names.
pub(crate) fn is_member(id: &[u8], member: &[u8]) -> bool {
    member.len() > id.len() && member.starts_with(id) && member[id.len()] == b' '
}

/// News for a waiter of this client that does not listen yet — its attempt put it in
/// line while the client's subscription was live already — or that left: a grant
/// (`Unclaimed<Grant>`), or the lapse of the grant ahead (`Unclaimed<Duration>`, `N`,
/// which the releasing client counted on: it checks nothing itself once a client heard
/// `N`). The channel keeps the latest of each for the waiter it names, until the waiter
/// claims it as it starts listening, or a confirmation (`C`) of the grant ahead clears
/// the lapse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unclaimed<T> {
    id: Vec<u8>,
    news: T,
    at: Instant,
}

impl<T: Copy> Unclaimed<T> {
    /// `news` for the waiter `id`, come at `at`.
    pub(crate) fn new(id: &[u8], news: T, at: Instant) -> Self {
        Unclaimed {
            id: id.to_vec(),
            news,
            at,
        }
    }

    /// The news and its age at `now`, when it is for the waiter registered as `member`.
    pub(crate) fn claim(&self, member: &str, now: Instant) -> Option<(T, Duration)> {
        is_member(&self.id, member.as_bytes()).then(|| (self.news, now - self.at))
    }

    /// Whether it is for the waiter `id`.
    pub(crate) fn names(&self, id: &[u8]) -> bool {
        self.id == id
    }
}

impl Unclaimed<Grant> {
    /// The grant, when it is for `member` and came less than [`UNCLAIMED_FOR`] before
    /// `now`.
    pub(crate) fn claim_grant(&self, member: &str, now: Instant) -> Option<Grant> {
        self.claim(member, now)
            .filter(|(_, age)| *age < UNCLAIMED_FOR)
            .map(|(grant, _)| grant)
    }
}

impl Unclaimed<Duration> {
    /// How long after `now` the grant ahead of `member` lapses (counted from the
    /// message's arrival, not from now), when it is for `member`.
    pub(crate) fn claim_lapse(&self, member: &str, now: Instant) -> Option<Duration> {
        self.claim(member, now)
            .map(|(lasts, age)| lasts.saturating_sub(age))
    }
}

/// The grant floor of a waiter: the highest token a busy reply of its attempts gave
/// (see `node::LineStatus`). Tokens rise with every grant and attempt on a server, so
/// the floor splits the grants made before the attempt that set it — dead: they lapsed
/// or were taken away, or that attempt would have found the key its own — from those
/// made after. Honoured, a dead grant would hold a lock under a token below its
/// successor's, or beside the key's holder (issue 33).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrantFloor(u64);

impl GrantFloor {
    /// A busy attempt answered `floor`.
    pub(crate) fn raise(&mut self, floor: u64) {
        self.0 = self.0.max(floor);
    }

    /// Whether `grant` was made after every busy attempt of the waiter: it may be read.
    pub(crate) fn admits(&self, grant: &Grant) -> bool {
        grant.fencing_token > self.0
    }
}

/// A held lock's confirmation, when a release granted it (see
/// [`Taken::confirmation_due`]). Its lock is held while the confirmation is queued on
/// the connection, so that it goes ahead of the lock's release, or is never sent.
#[derive(Debug)]
pub(crate) struct Confirmation(Mutex<Step>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing to confirm: not a grant, or sent already.
    None,
    /// A grant whose confirmation is due.
    Due,
    /// Its guard, or the client's shutdown, is releasing the lock: nothing more is sent.
    LetGo,
}

impl Default for Confirmation {
    fn default() -> Self {
        Confirmation(Mutex::new(Step::None))
    }
}

impl Confirmation {
    fn step(&self) -> MutexGuard<'_, Step> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock was granted: its confirmation is due (unless it is let go already).
    pub(crate) fn expect(&self) {
        let mut step = self.step();
        if *step == Step::None {
            *step = Step::Due;
        }
    }

    /// Takes the confirmation due, if any, and runs `queue` (which queues it on the
    /// lock's connection) while no release can be queued: the release is queued only
    /// after [`Confirmation::let_go`]. `None`: nothing was due (sent already, by its
    /// timer or an `extend`, or let go).
    pub(crate) fn take<R>(&self, queue: impl FnOnce() -> R) -> Option<R> {
        let mut step = self.step();
        (*step == Step::Due).then(|| {
            *step = Step::None;
            queue()
        })
    }

    /// Its guard, or the client's shutdown, is about to release the lock.
    pub(crate) fn let_go(&self) {
        *self.step() = Step::LetGo;
    }

    /// Whether its guard, or the client's shutdown, is releasing it.
    pub(crate) fn is_let_go(&self) -> bool {
        *self.step() == Step::LetGo
    }

    /// A confirmation answered that the lock is not ours: lost, unless the lock ended
    /// meanwhile (`ended`: lost already, or its lease ran out) or was let go (a
    /// confirmation sent again after the release, on a reconnection or with a script
    /// loaded anew, finds it gone, rightly).
    pub(crate) fn gone_means_lost(&self, ended: bool) -> bool {
        !ended && !self.is_let_go()
    }
}

/// When the grant made to the waiter ahead lapses unless its grantee confirms it: the
/// waiter told so (`N`) attempts then, unless told of the confirmation (`C`) first.
/// Kept across the waiter's attempts, since an attempt made meanwhile may be told a
/// longer wait than the lapse (a grant not confirmed yet, with a dead waiter's
/// registration ahead in line: see `scripts::UNCONFIRMED`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lapse(Option<Instant>);

impl Lapse {
    /// Told (`N`) that the grant ahead lapses at `at` unless confirmed.
    pub(crate) fn told(&mut self, at: Instant) {
        self.0 = Some(at);
    }

    /// Told (`C`) that the grant ahead was confirmed: nothing to attempt for.
    pub(crate) fn confirmed(&mut self) {
        self.0 = None;
    }

    /// An attempt was sent at `sent_at`: a lapse already passed was acted on by it.
    pub(crate) fn attempted(&mut self, sent_at: Instant) {
        self.0 = self.0.filter(|at| *at > sent_at);
    }

    /// When the waiter attempts, unless news comes first.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> impl Iterator<Item = &[u8]> {
        text.as_bytes().split(|&byte| byte == b' ')
    }

    fn grant(fencing_token: u64) -> Grant {
        Grant {
            fencing_token,
            after: Duration::from_millis(3),
            lasts: Duration::from_millis(100),
        }
    }

    #[test]
    fn a_grant_message_is_read_whole_or_not_at_all() {
        assert_eq!(
            Grant::parse(words("1795404822378060 12 100")),
            Some(Grant {
                fencing_token: 1795404822378060,
                after: Duration::from_millis(12),
                lasts: Duration::from_millis(100),
            })
        );
        // Words after the third are for later versions: ignored.
        assert_eq!(
            Grant::parse(words("7 12 100 later")).map(|grant| grant.fencing_token),
            Some(7)
        );
        assert_eq!(Grant::parse(words("1795404822378060 12")), None);
        assert_eq!(Grant::parse(words("17x 12 100")), None);
        assert_eq!(Grant::parse(words("")), None);
    }

    #[test]
    fn a_grant_message_names_its_waiter_by_its_id() {
        let (id, grant) = Grant::parse_message(b"a:1 17 5 100").unwrap();
        assert_eq!((id, grant.fencing_token), (&b"a:1"[..], 17));
        assert_eq!(Grant::parse_message(b"a:1 17"), None);
        assert!(is_member(b"a:1", b"a:1 5000 web"));
        // A prefix of another id, or an id alone, is not the member.
        assert!(!is_member(b"a:", b"a:1 5000 web"));
        assert!(!is_member(b"a:1", b"a:1"));
    }

    #[test]
    fn news_for_a_waiter_not_listening_yet_is_kept_for_it_alone() {
        let at = Instant::now();
        let unclaimed = Unclaimed::new(b"a:1", grant(9), at);
        assert_eq!(unclaimed.claim_grant("a:1 5000 web", at), Some(grant(9)));
        assert_eq!(unclaimed.claim_grant("a:2 5000 web", at), None);
        // Past `UNCLAIMED_FOR` a grant is no longer taken as it is.
        assert_eq!(
            unclaimed.claim_grant("a:1 5000 web", at + UNCLAIMED_FOR),
            None
        );
        // A lapse is counted from the message's arrival.
        let lapse = Unclaimed::new(b"b:2", Duration::from_millis(100), at);
        let later = at + Duration::from_millis(30);
        assert_eq!(
            lapse.claim_lapse("b:2 5000 web", later),
            Some(Duration::from_millis(70))
        );
        assert_eq!(
            lapse.claim_lapse("b:2 5000 web", at + Duration::from_secs(1)),
            Some(Duration::ZERO)
        );
        assert!(lapse.names(b"b:2"));
        assert!(!lapse.names(b"b:"));
    }

    #[test]
    fn the_grant_with_the_highest_token_is_the_one_kept() {
        assert!(grant(8).supersedes(&grant(7)));
        assert!(!grant(7).supersedes(&grant(8)));
        assert!(!grant(7).supersedes(&grant(7)));
    }

    #[test]
    fn a_grant_made_before_a_busy_attempt_is_not_admitted() {
        let mut floor = GrantFloor::default();
        assert!(floor.admits(&grant(1)));
        floor.raise(10);
        assert!(!floor.admits(&grant(10)));
        assert!(floor.admits(&grant(11)));
        // A lower floor from a later reply never lowers it.
        floor.raise(5);
        assert!(!floor.admits(&grant(9)));
    }

    #[test]
    fn a_grant_is_taken_only_while_half_its_grace_is_left() {
        // Ahead of the process's clock, so that the instants below are all in range.
        let now = Instant::now() + Duration::from_secs(1);
        let same = |grace: Duration| grace;
        let bound = Duration::from_secs(1);
        let fresh = grant(3).take(Some(now - Duration::from_millis(10)), bound, same, now);
        assert_eq!(
            fresh,
            Some(Taken {
                fencing_token: 3,
                granted_at: now - Duration::from_millis(10),
                grace: Duration::from_millis(100),
            })
        );
        // 50 ms of its 100 left: still taken; 49: refused.
        let at = now - Duration::from_millis(50);
        assert!(grant(3).take(Some(at), bound, same, now).is_some());
        let at = now - Duration::from_millis(51);
        assert!(grant(3).take(Some(at), bound, same, now).is_none());
        // Not timed: refused.
        assert!(grant(3).take(None, bound, same, now).is_none());
        // This client's shorter grace bounds it, and RedLock's drift is taken off.
        let taken = grant(3).take(Some(now), Duration::from_millis(40), same, now);
        assert_eq!(taken.map(|t| t.grace), Some(Duration::from_millis(40)));
        let drift = |grace: Duration| grace.saturating_sub(Duration::from_millis(60));
        assert!(grant(3).take(Some(now), bound, drift, now).is_none());
    }

    #[test]
    fn a_taken_grant_confirms_a_quarter_of_its_grace_after_it_was_made() {
        let now = Instant::now();
        let taken = |grace| Taken {
            fencing_token: 1,
            granted_at: now,
            grace,
        };
        let later = now + Duration::from_millis(7);
        let short = taken(Duration::from_millis(100));
        assert_eq!(
            short.confirmation_due(false, later) - now,
            Duration::from_millis(25)
        );
        assert_eq!(short.confirmation_due(true, later), later);
        let long = taken(Duration::from_secs(60));
        assert_eq!(
            long.confirmation_due(false, later) - now,
            Duration::from_secs(15)
        );
    }

    #[test]
    fn a_confirmation_is_sent_once_and_never_after_its_lock_is_let_go() {
        let confirmation = Confirmation::default();
        // Not a grant: nothing to send.
        assert_eq!(confirmation.take(|| ()), None);
        confirmation.expect();
        assert_eq!(confirmation.take(|| "sent"), Some("sent"));
        assert_eq!(confirmation.take(|| "again"), None);
        assert!(confirmation.gone_means_lost(false));
        assert!(!confirmation.gone_means_lost(true));

        let let_go = Confirmation::default();
        let_go.expect();
        let_go.let_go();
        assert_eq!(let_go.take(|| "sent"), None);
        // Expecting it again does not undo the letting go.
        let_go.expect();
        assert_eq!(let_go.take(|| "sent"), None);
        assert!(let_go.is_let_go());
        assert!(!let_go.gone_means_lost(false));
    }

    #[test]
    fn a_lapse_is_attempted_for_once_unless_confirmed_first() {
        let now = Instant::now();
        let mut lapse = Lapse::default();
        assert_eq!(lapse.due(), None);
        lapse.told(now + Duration::from_millis(100));
        // An attempt sent before the lapse leaves it due.
        lapse.attempted(now + Duration::from_millis(20));
        assert_eq!(lapse.due(), Some(now + Duration::from_millis(100)));
        // One sent at it acted on it.
        lapse.attempted(now + Duration::from_millis(100));
        assert_eq!(lapse.due(), None);
        // A later grant's lapse replaces an earlier one.
        lapse.told(now + Duration::from_millis(200));
        lapse.told(now + Duration::from_millis(300));
        assert_eq!(lapse.due(), Some(now + Duration::from_millis(300)));
        lapse.confirmed();
        assert_eq!(lapse.due(), None);
    }
}
