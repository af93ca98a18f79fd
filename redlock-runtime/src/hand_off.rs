//! The hand-off: passing a held lock from a task of a client to the next task of the
//! same client waiting for that key, inside the latter's acquire script.
//!
//! When a holder releases while a waiter of the same client is in line (one Redis
//! server or Cluster, no `hold_at_least` left), it does not release in Redis and then
//! let the waiter acquire: two round trips in a row. It leaves its owner token in the
//! key's [`BatonSlot`] (a [`Baton`]) and passes the turn; the waiter's acquire script
//! deletes the key if that token still holds it and takes the lock at once: one round
//! trip from release to next holder. No release is published meanwhile, so other
//! clients' waiters keep waiting; to bound that, after [`MAX_HANDOFFS_IN_A_ROW`]
//! hand-offs a release goes through Redis as usual and every waiter, in any client,
//! gets its chance.
//!
//! The releasing holder then waits for the taker's verdict, which says whether its lock
//! was still there: its release reports `Lost` otherwise. A baton not picked up within
//! [`PICK_UP_LIMIT`], dropped before any script carried it, or given back by a script
//! that failed (a broken connection, a restarted Redis: it may not have run), is a
//! release in Redis after all, whose answer says. So is a taker that sent its script and
//! then was cancelled, or is not polled within the patience the holder gives it (the
//! response timeout): the verdict is unknown, and the holder releases in Redis
//! (compare-and-delete, harmless if the taker's script took the lock). A taker's script
//! that deletes the holder's lock leaves evidence of it next to the key for a few
//! seconds (`scripts::HANDED_MARK`), so a release that finds the key gone tells a lock
//! handed off (released) from one lost (`Lost`, counted) by the evidence, not by
//! guessing; without it (it could not be left over a force-unlock's marker, or expired
//! before the release got there) the lock is reported lost: a false alarm at worst.
//!
//! This module knows nothing of turns or Redis: the slot decides whether a hand-off
//! may happen, carries the baton and reports how it ended. The turn (one layer up)
//! keeps one slot per key.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

/// How many times in a row a lock may go from task to task of one client without a
/// release in Redis, which would let other clients' waiters compete.
pub(crate) const MAX_HANDOFFS_IN_A_ROW: u32 = 8;

/// How long a releasing holder waits for the next in line to pick its baton up
/// before it releases in Redis itself.
const PICK_UP_LIMIT: Duration = Duration::from_millis(100);

/// The least lease a lock must have left to be handed off: the taker picks the baton up
/// within [`PICK_UP_LIMIT`], and its script must reach Redis before the lease ends, or
/// the release reports lost a lock its holder let go in time. A lock with less left (a
/// grant not confirmed yet, which counts on the grace: see `grant::Taken::confirmation_due`;
/// a lease about to end) is released in Redis, which passes it on to the line.
const MIN_LEASE_LEFT: Duration = Duration::from_millis(2 * PICK_UP_LIMIT.as_millis() as u64);

/// Whether a lock with `lease_left` (its holder's estimate) may be handed off.
pub(crate) fn leaves_time_to_hand_off(lease_left: Duration) -> bool {
    lease_left >= MIN_LEASE_LEFT
}

/// The owner token a releasing holder passes to the next in line, with the way back
/// for the outcome: did the next one's script find and delete this owner's lock?
/// (Whether it was picked up at all is told by the slot: empty once it was. So the
/// holder is woken once per hand-off, by the outcome.)
pub(crate) struct Baton {
    owner: String,
    outcome: Option<oneshot::Sender<Report>>,
    /// A script carrying the owner was sent: from then on a taker that goes away without
    /// a verdict leaves it unknown whether that script deleted the lock.
    sent: bool,
}

/// What the taker of a baton tells the releasing holder.
enum Report {
    /// Its script ran: was the lock still the holder's when it took it?
    Finished { released: bool },
    /// It gives the baton back: it went away before any script carried it (the lock was
    /// not touched), or its script failed and may not have run. The holder releases in
    /// Redis and takes that answer.
    GivenBack,
}

impl Baton {
    /// The owner token, for the taker's script about to be sent.
    pub(crate) fn send(&mut self) -> &str {
        self.sent = true;
        &self.owner
    }

    /// Reports whether the lock was still this owner's when it was handed off.
    pub(crate) fn finish(mut self, released: bool) {
        if let Some(outcome) = self.outcome.take() {
            let _ = outcome.send(Report::Finished { released });
        }
    }

    /// The taker's script failed (no reply): it may not have run at all — a broken
    /// connection, a Redis that restarted and forgot the lock — so the holder's own
    /// release in Redis is the better word. Should the script have run after all, that
    /// release finds the lock gone and the evidence the script left: handed off. The
    /// key's absence alone proves nothing: it may have been lost before.
    pub(crate) fn give_back(mut self) {
        if let Some(outcome) = self.outcome.take() {
            let _ = outcome.send(Report::GivenBack);
        }
    }
}

impl Drop for Baton {
    /// Dropped unfinished (its taker was cancelled, panicked or gave up): before any
    /// script carried it, the holder's lock is as the holder left it, and the holder's
    /// release in Redis says truthfully whether it was still there (taking the key's
    /// absence for a hand-off would report a lock deleted behind its holder's back as
    /// released). After, the sender is just dropped: the outcome is unknown.
    fn drop(&mut self) {
        if let Some(outcome) = self.outcome.take()
            && !self.sent
        {
            let _ = outcome.send(Report::GivenBack);
        }
    }
}

/// One key's place for a baton, and the count of hand-offs in a row there.
#[derive(Default)]
pub(crate) struct BatonSlot {
    baton: Mutex<Option<Baton>>,
    in_a_row: AtomicU32,
}

/// The releasing side of a hand-off: what it waits on.
pub(crate) struct Pending {
    outcome: oneshot::Receiver<Report>,
}

/// How a hand-off ended, for the releasing holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOffOutcome {
    /// The next in line ran its script: was the lock still ours when it took it?
    Done { released: bool },
    /// Nobody took the baton in time, or its taker gave it back (it went away before
    /// sending a script with it, or its script failed): release in Redis as usual, whose
    /// answer says whether it was still ours.
    NotTaken,
    /// The taker sent its script, then stopped (its acquire was cancelled) or was not
    /// polled within the patience given, before telling whether its script ran. A
    /// release in Redis cleans up; if it finds the key gone, the evidence the taker's
    /// script leaves when it deletes the lock tells whether it did.
    Vanished,
}

impl BatonSlot {
    /// Leaves `owner`'s lock for the next in line, if there is one (`waiting`) and the
    /// lock has not gone from task to task too often in a row; `None` means: release
    /// in Redis.
    pub(crate) fn offer(&self, owner: &str, waiting: bool) -> Option<Pending> {
        if !waiting {
            self.in_a_row.store(0, Ordering::Release);
            return None;
        }
        if self.in_a_row.fetch_add(1, Ordering::AcqRel) >= MAX_HANDOFFS_IN_A_ROW {
            self.in_a_row.store(0, Ordering::Release);
            return None;
        }
        let (outcome, outcome_rx) = oneshot::channel();
        *self.baton.lock().unwrap_or_else(|e| e.into_inner()) = Some(Baton {
            owner: owner.to_owned(),
            outcome: Some(outcome),
            sent: false,
        });
        Some(Pending {
            outcome: outcome_rx,
        })
    }

    /// The baton a releasing holder left here, if any.
    pub(crate) fn pick_up(&self) -> Option<Baton> {
        self.baton.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Waits for the verdict of the next in line's script; if there is none after
    /// [`PICK_UP_LIMIT`] and the baton is still in the slot (nobody picked it up),
    /// takes it back. Once picked up, waits at most `patience` more: the taker tells only
    /// when it is polled with its script's reply, and a taker kept alive but never polled
    /// again would otherwise hold the release up for ever.
    pub(crate) async fn outcome(&self, pending: Pending, patience: Duration) -> HandOffOutcome {
        let Pending { mut outcome } = pending;
        let settled = match tokio::time::timeout(PICK_UP_LIMIT, &mut outcome).await {
            Ok(settled) => settled,
            Err(_) => {
                let reclaimed = self.baton.lock().unwrap_or_else(|e| e.into_inner()).take();
                if reclaimed.is_some() {
                    return HandOffOutcome::NotTaken;
                }
                // Picked up, its script under way (or its taker not polled any more).
                match tokio::time::timeout(patience, outcome).await {
                    Ok(settled) => settled,
                    Err(_) => return HandOffOutcome::Vanished,
                }
            }
        };
        match settled {
            Ok(Report::Finished { released }) => HandOffOutcome::Done { released },
            Ok(Report::GivenBack) => HandOffOutcome::NotTaken,
            Err(_) => HandOffOutcome::Vanished,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_with_less_than_two_pick_up_limits_left_is_not_handed_off() {
        // A grant not confirmed yet, counting on the default grace of 100 ms.
        assert!(!leaves_time_to_hand_off(Duration::from_millis(100)));
        assert!(!leaves_time_to_hand_off(Duration::from_millis(199)));
        assert!(leaves_time_to_hand_off(Duration::from_millis(200)));
        assert!(leaves_time_to_hand_off(Duration::from_secs(30)));
    }

    #[test]
    fn no_hand_off_without_a_waiter_nor_beyond_the_limit_in_a_row() {
        let slot = BatonSlot::default();
        assert!(slot.offer("a", false).is_none());
        for _ in 0..MAX_HANDOFFS_IN_A_ROW {
            assert!(slot.offer("a", true).is_some());
            slot.pick_up().expect("the baton just left");
        }
        // The ninth in a row goes through Redis; the count then starts again.
        assert!(slot.offer("a", true).is_none());
        assert!(slot.offer("a", true).is_some());
        // Nobody waiting also starts it again.
        assert!(slot.offer("a", false).is_none());
        assert_eq!(slot.in_a_row.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_hand_off_ends_done_not_taken_or_vanished() {
        let slot = BatonSlot::default();
        let patience = Duration::from_millis(200);

        let pending = slot.offer("a", true).unwrap();
        let mut baton = slot.pick_up().unwrap();
        assert_eq!(baton.send(), "a");
        baton.finish(true);
        assert_eq!(
            slot.outcome(pending, patience).await,
            HandOffOutcome::Done { released: true }
        );

        // Not picked up within the limit: taken back, so a late taker finds nothing.
        let pending = slot.offer("b", true).unwrap();
        assert_eq!(
            slot.outcome(pending, patience).await,
            HandOffOutcome::NotTaken
        );
        assert!(slot.pick_up().is_none());

        // Picked up, then the taker went away before any script carried it: the lock
        // is untouched, as if nobody had taken it.
        let pending = slot.offer("c", true).unwrap();
        drop(slot.pick_up().unwrap());
        assert_eq!(
            slot.outcome(pending, patience).await,
            HandOffOutcome::NotTaken
        );

        // Picked up and sent, and the script failed: given back, Redis decides.
        let pending = slot.offer("e", true).unwrap();
        let mut baton = slot.pick_up().unwrap();
        baton.send();
        baton.give_back();
        assert_eq!(
            slot.outcome(pending, patience).await,
            HandOffOutcome::NotTaken
        );

        // Picked up and sent, then the taker went away without a verdict.
        let pending = slot.offer("d", true).unwrap();
        let mut baton = slot.pick_up().unwrap();
        baton.send();
        drop(baton);
        assert_eq!(
            slot.outcome(pending, patience).await,
            HandOffOutcome::Vanished
        );
    }

    #[tokio::test]
    async fn a_taker_that_is_never_polled_again_costs_the_pick_up_limit_and_the_patience() {
        let slot = BatonSlot::default();
        let pending = slot.offer("a", true).unwrap();
        // Picked up and sent, and kept alive without a verdict.
        let mut baton = slot.pick_up().unwrap();
        baton.send();
        let started = tokio::time::Instant::now();
        let patience = Duration::from_millis(200);
        let outcome =
            tokio::time::timeout(Duration::from_secs(10), slot.outcome(pending, patience))
                .await
                .expect("the holder waited for ever on a taker that never tells");
        assert_eq!(outcome, HandOffOutcome::Vanished);
        assert!(started.elapsed() >= PICK_UP_LIMIT + patience);
        drop(baton);
    }
}
