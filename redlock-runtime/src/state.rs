//! The state of one held lock, shared by its guard, the watchdog, `current_lock()` and
//! the waiters of its client: whether it is known lost, and until when its lease surely
//! lasts. It holds its client's turn at the key and passes it once the lock is gone.
//! Its end — released, or lost and why — is measured here, once (`metrics`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::{Cause, Hold, Label};
use crate::node::Verdict;
use crate::turn::{Holder, LocalTurn};

/// What the guard, the watchdog and `lost()` futures share about one held lock.
pub(crate) struct LockState {
    lost: watch::Sender<bool>,
    /// When the lease runs out at the latest: measured from before the command that set
    /// it was sent, so never later than Redis's view (see [`LeaseUpdate`]).
    expiry: Mutex<Expiry>,
    origin: Instant,
    /// This client's turn at the key; passed on as soon as the lock is known lost.
    turn: Mutex<Option<LocalTurn>>,
    /// How long it was held, and how it ended, for the metrics.
    hold: Hold,
}

impl LockState {
    pub(crate) fn new(
        sent_at: Instant,
        lease: Duration,
        turn: Option<LocalTurn>,
        label: Label,
    ) -> Arc<Self> {
        let state = LockState {
            lost: watch::Sender::new(false),
            expiry: Mutex::new(Expiry::default()),
            origin: sent_at,
            turn: Mutex::new(None),
            hold: Hold::new(label, sent_at),
        };
        state.expiry().nanos = state.nanos_after_origin(sent_at, lease);
        let state = Arc::new(state);
        // The turn is stored before waiters learn of the holder, so that a lease
        // already run out finds a turn to pass.
        if let Some(turn) = turn {
            let mut slot = state.turn.lock().unwrap_or_else(|e| e.into_inner());
            let holder: Weak<dyn Holder> = Arc::downgrade(&state) as Weak<LockState>;
            slot.insert(turn).set_holder(holder);
        }
        state
    }

    fn expiry(&self) -> std::sync::MutexGuard<'_, Expiry> {
        self.expiry.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn nanos_after_origin(&self, sent_at: Instant, lease: Duration) -> u64 {
        let end = sent_at.saturating_duration_since(self.origin) + lease;
        u64::try_from(end.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Starts a renewal or an extension of the lease, sent after this call.
    pub(crate) fn begin_update(&self, lease: Duration) -> LeaseUpdate<'_> {
        let sent_at = Instant::now();
        LeaseUpdate {
            state: self,
            ticket: self.start_update(sent_at, lease),
            finished: false,
        }
    }

    /// Starts an update sent at `sent_at` (after this call) for `lease`; returns its
    /// ticket (see [`LeaseUpdate`]). The watchdog keeps only these for its thousands of
    /// locks per tick.
    pub(crate) fn start_update(&self, sent_at: Instant, lease: Duration) -> Ticket {
        let end = self.nanos_after_origin(sent_at, lease);
        let mut expiry = self.expiry();
        expiry.updates.start(end);
        // Applied, it sets Redis's expiry to its end, which may be sooner than the
        // estimate (an `extend` that shortens the lease).
        let shortened = end < expiry.nanos;
        expiry.nanos = expiry.nanos.min(end);
        drop(expiry);
        if shortened {
            self.lost.send_modify(|_| {});
        }
        Ticket { end }
    }

    /// Ends the update `ticket`: `confirmed` when Redis said it was applied, otherwise
    /// its outcome is unknown.
    pub(crate) fn finish_update(&self, ticket: Ticket, confirmed: bool) {
        let mut expiry = self.expiry();
        let before = expiry.nanos;
        expiry.nanos = expiry.updates.finish(before, ticket.end, confirmed);
        let shortened = expiry.nanos < before;
        drop(expiry);
        if shortened {
            // `lost()` sleeps until the expiry it read: this client's waiters (in line
            // for the turn behind this holder) must not sleep past the new one.
            self.lost.send_modify(|_| {});
        }
    }

    pub(crate) fn expires_at(&self) -> Instant {
        let nanos = self.expiry().nanos;
        self.origin
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or_else(|| self.origin + Duration::from_secs(86_400 * 365 * 30))
    }

    /// The `lock` label of its metrics.
    pub(crate) fn label(&self) -> &Label {
        self.hold.label()
    }

    /// Its holder let it go: released (or handed off) in Redis, or tried to and got no
    /// answer.
    pub(crate) fn released(&self) {
        self.hold.released();
        self.mark_lost();
    }

    /// A renewal, extension or release found it no longer ours (`verdict` is not
    /// `Ours`): force-unlocked when Redis says so, else run out if its lease may have,
    /// else deleted or taken behind its holder's back.
    pub(crate) fn found_gone(&self, verdict: Verdict) {
        self.lose(match verdict {
            Verdict::Evicted => Cause::Forced,
            _ if self.lease_ran_out() => Cause::Lease,
            _ => Cause::Renewal,
        });
    }

    /// Its lease ran out while no renewal got through (Redis did not answer).
    pub(crate) fn ran_out(&self) {
        self.lose(Cause::Lease);
    }

    /// Known lost for `cause`: a lease that ran out ended when it did, anything else
    /// when it was found out.
    fn lose(&self, cause: Cause) {
        self.hold.lost(cause, || match cause {
            Cause::Lease => self.expires_at().min(Instant::now()),
            Cause::Renewal | Cause::Forced => Instant::now(),
        });
        self.mark_lost();
    }

    fn mark_lost(&self) {
        self.lost.send_replace(true);
        self.pass_turn();
    }

    /// Released, or known lost (not merely past its estimated lease).
    pub(crate) fn has_ended(&self) -> bool {
        *self.lost.borrow()
    }

    /// The lease may have run out (the local, conservative estimate).
    pub(crate) fn lease_ran_out(&self) -> bool {
        Instant::now() >= self.expires_at()
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow() || self.lease_ran_out()
    }

    /// Lets this client's next waiter (or a try-lock) have the key's turn.
    pub(crate) fn pass_turn(&self) {
        drop(self.take_turn());
    }

    /// How long the lock is surely still ours (zero once lost).
    pub(crate) fn remaining(&self) -> Duration {
        if *self.lost.borrow() {
            return Duration::ZERO;
        }
        self.expires_at().saturating_duration_since(Instant::now())
    }

    /// Takes the turn out (for a release that hands it off).
    pub(crate) fn take_turn(&self) -> Option<LocalTurn> {
        self.turn.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) async fn lost(&self) {
        let mut flag = self.lost.subscribe();
        loop {
            if *flag.borrow_and_update() {
                return;
            }
            let expires_at = self.expires_at();
            if Instant::now() >= expires_at {
                // Nobody may hold it any more: let this client's next waiter try.
                self.pass_turn();
                return;
            }
            tokio::select! {
                changed = flag.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(expires_at) => {}
            }
        }
    }
}

/// The local lease estimate and the updates of it under way.
#[derive(Debug, Default)]
struct Expiry {
    /// Nanoseconds after `origin`.
    nanos: u64,
    updates: Updates,
}

/// An update under way: where its lease ends at the earliest (nanoseconds after the
/// state's origin), counted from before it was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    end: u64,
}

/// The renewals and extensions of one lock under way, and what they tell about Redis's
/// expiry once answered. Redis applies overlapping updates in an order the client
/// cannot see (a renewal sent just before a short `extend` may run after it, or
/// before), and its expiry is the one the last applied set. A *round* is a run of
/// updates each sent while another was unanswered; every update before a round was
/// answered before the round began, so Redis applied it before any of the round's.
/// Once any update of a round is confirmed, the last one Redis applied is one of the
/// round's, so the expiry is at least the earliest end among them (counted from before
/// each was sent): that, and never less than it, is the estimate — one update alone
/// sets it exactly. An unconfirmed outcome (no answer, cancelled) may have been
/// applied or not: it can only lower the estimate to its own end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Updates {
    in_flight: u32,
    /// The earliest end among the current round's updates.
    round_floor: u64,
}

impl Updates {
    fn start(&mut self, end: u64) {
        self.round_floor = if self.in_flight == 0 {
            end
        } else {
            self.round_floor.min(end)
        };
        self.in_flight += 1;
    }

    /// The estimate after the update ending at `end` was answered (`confirmed`), given
    /// the estimate `before` it.
    fn finish(&mut self, before: u64, end: u64, confirmed: bool) -> u64 {
        self.in_flight = self.in_flight.saturating_sub(1);
        if confirmed {
            self.round_floor
        } else {
            before.min(end)
        }
    }
}

/// One renewal or extension under way (see [`Updates`] for what its answer tells).
/// Dropped unfinished (its future cancelled), it counts as unknown.
pub(crate) struct LeaseUpdate<'a> {
    state: &'a LockState,
    ticket: Ticket,
    finished: bool,
}

impl LeaseUpdate<'_> {
    /// Redis confirmed the new lease.
    pub(crate) fn confirmed(mut self) {
        self.finish(true);
    }

    /// Redis's answer is unknown (or the lock is gone): the lease may or may not have
    /// been set.
    pub(crate) fn unknown(mut self) {
        self.finish(false);
    }

    fn finish(&mut self, confirmed: bool) {
        if !std::mem::replace(&mut self.finished, true) {
            self.state.finish_update(self.ticket, confirmed);
        }
    }
}

impl Drop for LeaseUpdate<'_> {
    fn drop(&mut self) {
        self.finish(false);
    }
}

impl Holder for LockState {
    fn gone(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.lost())
    }

    fn lease_ran_out(&self) -> bool {
        LockState::lease_ran_out(self)
    }

    fn pass_turn(&self) {
        LockState::pass_turn(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::Turns;

    async fn state(lease: Duration) -> Arc<LockState> {
        let turns = Arc::new(Turns::default());
        let turn = turns
            .take_turn(
                "k",
                &Label::unlabelled(),
                Instant::now() + Duration::from_secs(1),
            )
            .await
            .and_then(crate::turn::Turn::into_taken)
            .expect("a free turn");
        LockState::new(Instant::now(), lease, Some(turn), Label::unlabelled())
    }

    /// The estimate after a sequence of updates, each `(start, end, confirmed)` in the
    /// order events happen: `Start(end)` sends one, `Finish(i, confirmed)` answers the
    /// `i`-th sent.
    fn estimate_after(initial: u64, events: &[Event]) -> u64 {
        let mut updates = Updates::default();
        let mut estimate = initial;
        let mut ends = Vec::new();
        for event in events {
            match *event {
                Event::Start(end) => {
                    updates.start(end);
                    estimate = estimate.min(end);
                    ends.push(end);
                }
                Event::Finish(i, confirmed) => {
                    estimate = updates.finish(estimate, ends[i], confirmed);
                }
            }
        }
        estimate
    }

    #[derive(Clone, Copy)]
    enum Event {
        Start(u64),
        Finish(usize, bool),
    }
    use Event::{Finish, Start};

    #[test]
    fn overlapping_confirmed_updates_leave_the_earliest_of_their_ends() {
        // A grant's estimate is its grace (100); its confirmation (to 10_000) and the
        // user's `extend` right after (to 10_050) overlap, and both are confirmed:
        // Redis applied one of them last, so it holds at least 10_000 (issue 33: the
        // estimate stayed at the grace and the guard believed itself lost).
        for order in [[0, 1], [1, 0]] {
            let events = [
                Start(10_000),
                Start(10_050),
                Finish(order[0], true),
                Finish(order[1], true),
            ];
            assert_eq!(estimate_after(100, &events), 10_000);
        }
        // A renewal (to 30_000) and a short extend (to 500) overlap: either may have run
        // last, so the shorter bounds the estimate, whichever answers first, and at
        // every step.
        for order in [[0, 1], [1, 0]] {
            let mut events = vec![Start(30_000), Start(500)];
            assert_eq!(
                estimate_after(20_000, &events),
                500,
                "while both are on their way"
            );
            events.push(Finish(order[0], true));
            assert_eq!(
                estimate_after(20_000, &events),
                500,
                "after the first answer"
            );
            events.push(Finish(order[1], true));
            assert_eq!(estimate_after(20_000, &events), 500);
        }
    }

    #[test]
    fn one_update_alone_sets_the_estimate_and_an_unknown_one_only_lowers_it() {
        assert_eq!(
            estimate_after(10_000, &[Start(1_000), Finish(0, true)]),
            1_000
        );
        assert_eq!(
            estimate_after(1_000, &[Start(20_000), Finish(0, true)]),
            20_000
        );
        // No answer: it may or may not have been applied.
        assert_eq!(
            estimate_after(1_000, &[Start(20_000), Finish(0, false)]),
            1_000
        );
        assert_eq!(estimate_after(5_000, &[Start(800), Finish(0, false)]), 800);
        // An unknown one in the same round as a confirmed one: it may have run last.
        let events = [
            Start(20_000),
            Start(15_000),
            Finish(1, false),
            Finish(0, true),
        ];
        assert_eq!(estimate_after(1_000, &events), 15_000);
        // A new round starts once every update was answered: the earlier round's
        // shorter end no longer bounds it.
        let events = [
            Start(500),
            Start(30_000),
            Finish(0, true),
            Finish(1, true),
            Start(40_000),
            Finish(2, true),
        ];
        assert_eq!(estimate_after(100, &events), 40_000);
        // An update that joins a round after one of its updates was confirmed bounds
        // it too: it may run last.
        let events = [
            Start(10_000),
            Start(10_050),
            Finish(0, true),
            Start(300),
            Finish(1, true),
        ];
        assert_eq!(estimate_after(100, &events), 300);
    }

    #[tokio::test]
    async fn only_an_update_nothing_overlapped_sets_the_lease_estimate_alone() {
        let state = state(Duration::from_secs(10)).await;
        let long = state.remaining();
        // Alone and confirmed: the estimate follows it, shorter or longer.
        state.begin_update(Duration::from_secs(1)).confirmed();
        assert!(state.remaining() <= Duration::from_secs(1));
        state.begin_update(Duration::from_secs(20)).confirmed();
        assert!(state.remaining() > long);
        // A renewal and a short extend overlap: Redis may apply either last, so
        // neither may lengthen the estimate past the shorter one.
        let renewal = state.start_update(Instant::now(), Duration::from_secs(30));
        let extend = state.begin_update(Duration::from_millis(500));
        extend.confirmed();
        state.finish_update(renewal, true);
        assert!(state.remaining() <= Duration::from_millis(500));
        // Two overlapping updates to 10 s, both confirmed: the estimate is about 10 s,
        // not what it was before them.
        let first = state.start_update(Instant::now(), Duration::from_secs(10));
        let second = state.begin_update(Duration::from_secs(10));
        second.confirmed();
        state.finish_update(first, true);
        assert!(state.remaining() > Duration::from_secs(9));
        // An unknown outcome can only lower it; a cancelled update counts as unknown.
        state.begin_update(Duration::from_millis(500)).confirmed();
        drop(state.begin_update(Duration::from_secs(60)));
        assert!(state.remaining() <= Duration::from_millis(500));
        state.begin_update(Duration::from_secs(60)).unknown();
        assert!(state.remaining() <= Duration::from_millis(500));
        // Lost is lost.
        state.mark_lost();
        assert_eq!(state.remaining(), Duration::ZERO);
        assert!(state.is_lost());
    }
}
