//! A model check of the single-server protocol (`LockClient::connect`), with
//! [`stateright`]. Two focused models follow the main one, each in a module of its own:
//! `a_writer_leaves_the_line` (the read-write lock) and `several_keys`
//! (`LockClient::lock_all`, issue 35: the order in which several keys are taken).
//!
//! # What is modelled
//! One Redis server, one lock key, two or three client processes (in some settings the
//! first client runs two tasks, so that a lock can go from task to task inside it),
//! and discrete time: a tick stands for the reservation grace, and the lease (2 ticks;
//! 1 and 3 in the mixed-lease settings), the grace (1) and the registration slack (1)
//! are small tick counts. The steps:
//! - **attempt**: the ACQUIRE script, atomically: delete the key if it still holds the
//!   owner handing it on (hand-off), `SET NX` with the lease, or take a reservation
//!   made for this waiter (and publish `T`); on success the fencing token
//!   `max(counter + 1, clock)` and the waiter's registration is removed; on failure
//!   the waiter marks the holder's lock *contended* (`scripts::CONTENDED`), registers
//!   (`ZADD NX`, in arrival order, expiring at `now + ttl + slack`) and sleeps until
//!   the remaining time to live it was told; a lock taken by a hand-off or from a
//!   reservation is contended from the start;
//! - **subscribe**: after its first failed attempt, a waiter of a client whose channel
//!   is not subscribed is deaf until its SUBSCRIBE is confirmed, and then tries again
//!   at once (`listen_everywhere`'s `live` flag); a subscription nobody listens to
//!   lingers until the next tick;
//! - **wake-up**: a release message (`R:<id>` for us or for another, `T`, empty =
//!   free; merged as `Release::merge` does, and read between attempts: a message that
//!   comes while an attempt is due is read after its reply), or the waiter's timer:
//!   the lease end it was told, or the fallback a grace after a message reserving the
//!   key for another client (a stopped process that resumes with a waiter's timer and
//!   a grant message both due may take either first, as `tokio::select!` does);
//! - **release**: RELEASE (owner check; an uncontended lock is deleted with no message,
//!   a contended one goes through FREE_FOR_NEXT: drop expired registrations,
//!   reserve the key for the waitlist's head for the grace and publish `R:<head>`, or
//!   delete it and publish the empty message); **hand-off** inside a client (the
//!   releasing holder passes its owner to the next task in line, whose ACQUIRE deletes
//!   that owner's key and takes it; at most `max_handoffs` in a row, then a release
//!   through Redis); **leave waitlist** (a waiter gives up; LEAVE_WAITLIST runs in the
//!   background and passes a reservation made for it meanwhile on);
//! - **watchdog renewal**: EXTEND with the owner check (a failed one marks the lock
//!   lost); in the settings that allow it, **extend** to a shorter lease (EXTEND with
//!   the owner check, announcing the new lease, `T:<ms>`, when it shortens a contended
//!   lock); a holder whose local lease estimate ran out **notices** (the client's turn
//!   goes to its next task; the guard lives on, and its release finds the key not its
//!   own);
//! - **grant** (issue 25; the settings with `grants`): FREE_FOR_NEXT, run by a
//!   release, a LEAVE_WAITLIST or a LAPSED_GRANT check, makes the waitlist's head the
//!   owner (a fresh token `max(counter + 1, clock)`, the lease the grace, contended)
//!   and tells only its client (its grant channel), or skips to the next head when
//!   PUBLISH reaches nobody (the client's subscription is not made yet, or Redis knows
//!   it is gone); when the granted lease is shorter than the lock released (always,
//!   for a LEAVE_WAITLIST's or a check's grant), it announces it (`T:<ms>`) on the
//!   key's channel. The grantee holds from the message alone, its lease counted from
//!   the grant (the client's conservative estimate: exact here), and **confirms**
//!   (EXTEND with the owner check, to its full lease; a failed one marks the lock
//!   lost: the grant was evicted, or its grantee paused past the grace before
//!   confirming) a quarter of the grace later — within the tick here — unless it
//!   **released** first (a short hold never confirms: its release frees the grant). An **attempt** that finds the key granted to it takes it (full
//!   lease, fresh token, and no message: a grant of a shorter lease than the lock it
//!   replaced was announced when it was made, and the lease taken now ends later). A grant message can race its waiter's attempt
//!   (issue 33): it reaches a waiter whose attempt is due (woken by its timer or a
//!   message, or retrying after a fresh subscription), or the waiter's timer is taken
//!   first; the **busy** reply of that attempt carries its **grant floor** (the
//!   attempt's own token: every grant made before the attempt is below it, every grant
//!   made after above) and the waiter drops a grant at or below it, unread (made
//!   before the attempt: lapsed, evicted or passed on, since the attempt did not find
//!   the key granted to it). A grant read **late** (less than half its grace left:
//!   none, in ticks) is not taken: the waiter attempts again, and its attempt takes the
//!   key if it is still granted to it, with a token from Redis, or finds it busy and
//!   registers again. A busy attempt that finds a grant not picked up yet while another
//!   waiter is ahead in line is told its own lease rather than the grace (ACQUIRE's
//!   `UNCONFIRMED`); the first in line keeps the grace. (A waiter told `N` forgets the
//!   lapse at its next attempt here, where the client keeps it: the model is the more
//!   pessimistic.) The client that granted **checks** a grace later
//!   (LAPSED_GRANT): an absent key goes to the next in line; a key taken meanwhile by
//!   an attempt is marked contended, so that its release goes through the waitlist.
//!   A waiter that gave up frees a grant made to it (LEAVE_WAITLIST). A crashed
//!   client's subscription stays until Redis **notices** the disconnection (so a grant
//!   can go to a dead client). **force_unlock** (at most once, by an operator) evicts
//!   the owner, a grantee too, and reserves the key for the head (FORCE_UNLOCK has no
//!   fencing counter: it reserves, as for a client without grants);
//! - **time passing**: key, reservation and registration expiry;
//! - **faults**: a process **pauses** (it takes no step, and a holder keeps believing
//!   it holds, whatever the clock says, until it resumes: the moment between checking
//!   `is_lost()` and writing), a process **crashes** (its tasks and its background
//!   LEAVE_WAITLIST stop; what it left in Redis stays until it expires), and Redis
//!   **restarts** without persistence (key, waitlist and fencing counter lost; the
//!   restart takes a tick; listeners are woken by the disconnection).
//!
//! # What is abstracted away
//! - The network, except as the order in which atomic scripts run: a script runs when
//!   it is sent, replies are never lost, and the client's lease estimate equals Redis's
//!   expiry (the real one is measured from before the send, so never later: equality
//!   is the tight case). Messages reach a listener when published (a paused client
//!   reads them when it resumes).
//! - Time as ticks, and clients that are not paused as prompt: the clock does not
//!   advance while a running client has a script to send (an attempt, a LEAVE_WAITLIST)
//!   or a subscription to confirm. The steps a client takes on its own, without Redis
//!   (take the turn, read news, wake at a timer, notice a lost lease), happen at once:
//!   they commute with every other client's steps. Slowness of any length is a pause.
//!   Timers that the client sets a millisecond after an expiry (`lease_end`, the
//!   reservation fallback) fire in the tick of that expiry, after it.
//! - Fencing tokens as `max(counter + 1, clock × 100)`: the clock in units finer than
//!   a tick (a run makes fewer than 100 acquisitions), as the server's µs clock is
//!   finer than a script's duration; a restart takes a tick, as one takes far longer
//!   than a µs.
//! - Registrations are dropped at the tick they expire (Redis drops them at the next
//!   FREE_FOR_NEXT, or when the whole waitlist key expires: only where a registration revived
//!   by `ZADD NX` comes back in line differs, which no property depends on).
//! - One acquisition per task, one owner value per acquisition (the client's fresh
//!   token per attempt only matters for replies lost mid-way, not modelled).
//! - The grant floor as the last token issued before the busy attempt (the model's
//!   busy attempt takes no token from the counter): it orders every grant as the
//!   attempt's own token does, at or below it for a grant made before the attempt.
//!   Since a message reaches its listener when published, the only grant at or below
//!   a floor is one unread at the busy reply; the runtime's check of grants read later
//!   (one slow on its way) has nothing to catch here.
//! - Not modelled: `hold_at_least` (`K:` messages), try-locks (every attempt here
//!   waits), cancellation clean-up, RedLock, Cluster, Sentinel; with grants: readers
//!   and semaphores (granted together), a waitlist mixing grant-capable waiters with
//!   older clients', a Redis restart, the client's drift allowance, a confirmation
//!   delayed past the body's release (it is queued before the release or never sent),
//!   an `extend` or renewal before the confirmation (an `extend` confirms in its
//!   place), a grant released inside its client (never handed off: too little lease
//!   left), a grant parked for a waiter
//!   that does not listen yet (`unclaimed`: the model's grant reaches only a listening
//!   waiter, and is taken by its attempt otherwise). A grant tells the grantee's client
//!   nothing else: a grant for a waiter of the client that already left is no news for
//!   its other waiters (issue 33's third point: the model never posted it).
//!
//! # Properties, and the guarantees of RELIABILITY.md they stand for
//! 1. **exclusion or fencing** (always; guarantees 1 and 2, with the assumptions
//!    "processes can pause" and "restarts lose locks"): of two guards that believe
//!    they hold the lock at once, the later acquisition has the larger token, and the
//!    earlier one's lease had run out (it is paused past it) unless Redis restarted in
//!    between; and every guard within its lease is, in Redis's view, the key's owner
//!    (so no two hold it there at once), with an expiry no earlier than its own
//!    estimate.
//!    And **fencing tokens increase** (always): of any two guards held, believed or
//!    not, the later acquisition (a grant counts when the release makes it) has the
//!    larger token; and a guard within its lease that owns the key in Redis has a
//!    token no lower than any guard that believed it held the lock has had: a fenced
//!    store never refuses the key's holder.
//! 2. **reservation within grace** (always; the fairness assumption's "a named client
//!    that does not answer within the grace loses its turn", and guarantee 7's "no
//!    place in a waiter waitlist" left behind for long): a key reserved for a waiter is
//!    never still reserved `grace` ticks later.
//! 3. **no forgotten waiter** (always; guarantee 3, "waiters acquire the key when the
//!    lease ends, not later: they sleep until the remaining time to live Redis
//!    reported, and they are also woken by releases", and guarantee 6 after a restart).
//!    Stateright checks `always` on states, and `eventually` only on acyclic paths, so
//!    the bounded response is a safety property over two counters each task keeps, and
//!    that any acquisition resets: the consecutive ticks in which it was running and
//!    waiting in Redis while nobody owned the key (absent, or reserved), and those in
//!    which it was running and asleep until a lease end it was told while the key was
//!    absent. The first never exceeds the grace (a reservation for a waiter that does
//!    not come, paused or dead, costs one grace, then the others try); the second is
//!    always zero (a free key never sits a whole tick while a running waiter sleeps:
//!    it was told, or its timer was due). With prompt clients, "within G ticks it has
//!    been offered the key" is "no tick passes" for a free key and "at most a grace"
//!    for a reservation. The second counter does not count a waiter asleep on the
//!    fallback after a reservation for another client: that fallback is measured from
//!    when the message is read, so a waiter paused meanwhile sleeps up to a grace past
//!    the reservation's end (the checker finds this when it is counted: a client
//!    paused while `R:<another>` arrives, resumed after that reservation ran out);
//!    the first counter still bounds it.
//!    With grants, a waiter that slept while a grant's check was lost or late (the
//!    client that granted crashed, or was paused when its check was due: the design's
//!    double fault, grantee and releaser both gone) falls back to its lease timer: both
//!    counters are bounded by the longest lease, plus the grace, until it tries again.
//! 4. With grants: **grant within grace** (always): a key granted and not confirmed is
//!    never still so `grace` ticks after the grant. **A grant nobody picks up passes on
//!    within grace** (always): from a grant until it is picked up (confirmed, or taken
//!    by the grantee's attempt) or passes on, at most `grace` ticks pass in which a
//!    running waiter waits, unless the client that granted it was crashed or paused
//!    when its check was due. (The force_unlock settings' "exclusion or fencing" spares
//!    the guard it evicted, which learns at its next renewal, confirmation or release;
//!    a grant evicted before its waiter read it, only until that waiter's next attempt,
//!    which shows it where the key stands.)
//! 5. Examples (`sometimes`), so that the check is not vacuous: a lock is acquired; a
//!    reservation is taken; the key is reserved for a waiter that does not come; a lock
//!    is handed off inside a client; two guards believe at once (a paused holder past
//!    its lease beside its successor, or across a restart); with grants: a grant
//!    confirmed, a grant taken by the grantee's attempt, a lapsed grant passed on by
//!    the check, a confirmation too late (the grant lapsed or was evicted), a key
//!    granted to a waiter that does not come, a grant evicted by force_unlock, a grant
//!    older than its waiter's busy attempt dropped, that waiter granted anew, a grant
//!    read late and its waiter attempting again.
//!
//! The checker explores every state within the bounds (one acquisition per task, the
//! ticks, at most one pause, one crash or one restart; with grants, one force_unlock
//! in its settings) breadth-first, in three settings of 0.29–0.64 million unique states
//! each (4–12 s each in a debug build on two cores, one test at a time; 2026-11-28). Broken variants
//! of the model (release without the owner check, a reservation without expiry, no
//! retry after a fresh subscription, a server clock behind after a restart, a lock
//! taken from a reservation left uncontended) are each caught. With grants, six more
//! settings of 0.45–1.29 million unique states (8–28 s each, the same way), and six broken
//! variants, each caught: a grant with the whole lease and no pick-up bound, a grant
//! that lapses with the grace but unchecked, a grantee counting its grace from the
//! message's arrival, a LAPSED_GRANT check that frees only an absent key, a grant of a
//! shorter lease unannounced, a grant honoured after its waiter's busy attempt.
//!
//! # What the model found
//! With clients asking for different leases, "no forgotten waiter" failed for the
//! protocol as it was: a waiter slept until the end of the lease it was told, and when
//! the key passed to a holder with a shorter lease (a reservation taken: `T` cleared
//! the fallback; a hand-off inside a client: no message at all) that overran it or
//! died, the key stayed free while the waiter slept on, up to the difference of the
//! leases. The protocol now announces the new holder's lease (`T:<ms>`, from a taken
//! reservation and from a hand-off); the model's default is that protocol.
//! `without_announcing_the_new_lease_a_waiter_sleeps_on_a_free_key` keeps the old
//! behaviour as a broken variant (its counterexamples must still be found);
//! `announcing_the_new_lease_keeps_waiters_awake` checks the fix with mixed leases.
//!
//! The same gap opened by `extend` (issue 24): a holder that cut its lease short and
//! then overran it or died left waiters asleep until the longer lease they had been
//! told. EXTEND now announces a lease it shortens on a contended lock;
//! `without_announcing_a_shortened_lease_a_waiter_sleeps_on_a_free_key` keeps the gap
//! checked, `announcing_a_shortened_lease_keeps_waiters_awake` checks the fix (and that
//! announcing only on a contended lock suffices).
//!
//! Grants (issue 25) opened it a third way: a grant tells the other waiters nothing,
//! and lapses after a grace, long before the lease they were told. A late grantee (or
//! a newcomer) whose attempt then finds the key free takes it *uncontended*, and if
//! the releasing client's check only frees an absent key, that holder's release is
//! silent: the waiters sleep on a free key until the end of the lease they were told
//! (`a_lapsed_grant_check_that_frees_only_an_absent_key_is_caught`, the script as
//! first written). The model's protocol has LAPSED_GRANT mark a lock it finds taken
//! contended, so that its release goes through the waitlist. (ACQUIRE marking a lock
//! contended when others are in line also passes the model, at a command more on the
//! uncontended path.)
//!
//! Issue 33 (found by a review and experiments against Redis; missed here): a grant
//! and its waiter's attempt race. A release grants the key to a waiter whose attempt
//! is due (woken by its timer, or retrying after a fresh subscription), or whose
//! timer fires first when its stopped process resumes; the attempt is sent with the
//! grant unread. By then the grant may have lapsed and the key gone to the next in
//! line, or force_unlock evicted it and another took the key: the attempt finds the
//! key busy, the waiter registers again under the same id, then reads the old grant
//! and honours it. Read late, its EXTEND with the owner check alone passes against a
//! later grant to that id (the holder in between released at once and granted it
//! anew), and the guard keeps the old message's token, below the holder's in between:
//! a fenced store refuses the key's holder. Read in time, the guard holds the key
//! beside the holder its own attempt found. The model reached both (a grant reaches a
//! waiter whose attempt is due), but its properties did not see them: "fencing tokens
//! increase" compared only guards held at once (the holder in between had released),
//! and "exclusion or fencing" spared every guard force_unlock evicted, even a grant
//! read after its waiter's attempt found the next holder. Both now do (a fenced store
//! never refuses the key's holder; an unread evicted grant is spared only until its
//! waiter's next attempt). `a_grant_honoured_after_a_busy_attempt_is_caught` keeps the
//! protocol as it was as a broken variant: "fencing tokens increase" fails in 14 steps
//! (A holds, B waits; A releases while B's retry is due, granting B the key; B stops;
//! the grant lapses; X takes the key; B resumes, its attempt finds X's lock; X
//! releases and grants B anew; B confirms the old grant with its old token), and
//! "exclusion or fencing" in 10 (the grant to B evicted while B's retry is due, the
//! key taken by another; B's attempt finds it busy, and B holds the old grant beside
//! that holder). The fix is the model's protocol: a busy reply carries the grant floor
//! and a grant at or below it is dropped; a grant read late sends its waiter to
//! attempt again, and a guard's token is always the one Redis holds for it
//! (`a_grant_read_after_a_busy_attempt_is_dropped`: every property holds, and the
//! examples show a grant dropped, its waiter granted anew, a late grant attempted).

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

type Tick = u8;

/// Token units per tick: the clock term of `max(counter + 1, clock)`.
const UNITS_PER_TICK: u32 = 100;

/// A deliberately wrong variant of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Broken {
    /// The protocol as implemented.
    None,
    /// RELEASE frees the key without checking that it is still the caller's.
    ReleaseWithoutOwnerCheck,
    /// FREE_FOR_NEXT reserves the key with no `PX`: a reservation for a dead waiter stays.
    ReservationWithoutExpiry,
    /// A waiter whose subscription was not live waits without the retry that covers a
    /// release published before its SUBSCRIBE was confirmed.
    NoRetryAfterSubscribe,
    /// Redis comes back from a restart with its clock two ticks behind.
    ClockBehindAfterRestart,
    /// A lock taken from a reservation starts uncontended (only a busy attempt marks
    /// it), so its release may go unpublished while a waiter sleeps.
    ReservationTakenUncontended,
    /// A grant gives the waiter its full lease at once, and nobody checks that it was
    /// picked up: no grace, no LAPSED_GRANT.
    GrantWithoutPickUpBound,
    /// A grant lapses with the grace, but nobody checks (no LAPSED_GRANT, and the next
    /// waiter is not told when it lapses).
    GrantWithoutCheck,
    /// Issue 34, the protocol before it: the next in line is not told when a grant
    /// lapses (`N`): only the releasing client's check passes a lapsed grant on.
    NextWaiterNotTold,
    /// The grantee counts its grace from when it reads the grant message, not from the
    /// conservative estimate of when the release granted it.
    GrantLeaseFromArrival,
    /// LAPSED_GRANT does nothing when it finds the key held (taken meanwhile by an
    /// attempt, uncontended): it frees only an absent key.
    LapsedGrantCheckOnlyWhenAbsent,
    /// Issue 33, the protocol before its fix: a busy reply carries no grant floor, so a
    /// grant unread across the attempt is honoured after it, and a grant read late is
    /// confirmed by EXTEND with the owner check alone, the guard keeping the message's
    /// token.
    GrantHonouredAfterBusy,
}

/// The model's parameters.
#[derive(Clone, Debug)]
struct Protocol {
    /// Each client's tasks, by the lease each asks for (a fixed lease, or its
    /// watchdog's).
    clients: Vec<Vec<Tick>>,
    /// Acquisitions each task makes.
    rounds: u8,
    /// The protocol's fix for mixed leases (off only in
    /// `without_announcing_the_new_lease_a_waiter_sleeps_on_a_free_key`): the message of
    /// a reservation taken, `T:<ms>`, and one published by a hand-off, tell the new
    /// holder's lease; a waiter sleeps no longer than that.
    announce_lease: bool,
    /// With `Some(lease)`, a holder may `extend` its lease to this shorter one (a
    /// fixed lease cut short, as `LockGuard::extend` can).
    extend_to: Option<Tick>,
    /// The protocol's fix for a lease shortened by `extend` (off only in
    /// `without_announcing_a_shortened_lease_a_waiter_sleeps_on_a_free_key`): EXTEND
    /// publishes `T:<ms>` with the new lease when it shortens a contended lock.
    announce_extend: bool,
    grace: Tick,
    /// How long a registration outlives the holder's lease.
    slack: Tick,
    /// Time stops here.
    max_time: Tick,
    max_handoffs: u8,
    max_pauses: u8,
    max_crashes: u8,
    max_restarts: u8,
    /// Issue 25: a release grants the key to the waitlist's head (`Key::Owned` with
    /// `granted`, the message on that client's grant channel alone) instead of
    /// reserving it. Off in the settings of the protocol before grants (which older
    /// clients and readers still get).
    grants: bool,
    /// With grants: the next in line is told when a grant lapses (`N`, issue 34).
    /// Off in the settings that show what another mechanism covers when no next waiter
    /// runs to cover it.
    tell_next: bool,
    /// `force_unlock` calls (by an operator, from no client of the model).
    max_force_unlocks: u8,
    broken: Broken,
}

/// One acquisition: its owner value in the key, and its waiter id in the waitlist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Id {
    proc: u8,
    task: u8,
    round: u8,
}

/// The lock key in Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Absent,
    Owned {
        by: Id,
        exp: Tick,
        /// An attempt found it busy, or it changed hands (a hand-off, a reservation
        /// taken, a grant): its release is published (`scripts::CONTENDED`).
        contended: bool,
        /// Granted at this tick by a release, and not yet confirmed by the grantee: its
        /// lease is the grace.
        granted: Option<Tick>,
    },
    Reserved {
        by: Id,
        since: Tick,
        exp: Option<Tick>,
    },
}

/// A registration in the waitlist of waiting clients (kept in arrival order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Registration {
    id: Id,
    exp: Tick,
}

/// A release message on the key's channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Message {
    Free,
    Reserved(Id),
    /// `T`; with `announce_lease`, `T:<the new holder's lease>`.
    Taken(Tick),
}

/// What a message says to one waiter (`notify::Release`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum News {
    Free,
    ForUs,
    ForAnother,
    Taken(Tick),
    /// `N <id> <grace>` on this client's grant channel (issue 34): the grant made to the
    /// waiter ahead lapses at this tick unless confirmed; try then (the client counts
    /// the grace from the message's arrival, which may come before its waiter listens). (The
    /// confirmation's `C`, which spares that attempt when the grant was confirmed, is
    /// not modelled: the attempt it spares finds the key held and changes nothing.)
    Next(Tick),
    /// `G <id> <token> <ms since registration>` on this client's grant channel: the
    /// guard it makes, with the lease counted from the grant (the client's
    /// conservative estimate of when it happened, exact in the model).
    Granted(Guard),
}

impl News {
    /// `Release::merge`: a message that asks the waiter to try outlives later ones,
    /// and a grant outlives every other (a later grant to the same waiter replaces it:
    /// the mailbox keeps one per waiter).
    fn merge(earlier: Option<News>, later: News) -> News {
        match (earlier, later) {
            (_, News::Granted(_)) => later,
            (Some(grant @ News::Granted(_)), _) => grant,
            (Some(urgent @ (News::Free | News::ForUs)), _) => urgent,
            _ => later,
        }
    }
}

/// How an acquisition got the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum How {
    Free,
    Reservation,
    HandOff,
    /// From a grant message.
    Grant,
    /// By an attempt that found the key granted to it (its message not read yet).
    GrantTaken,
}

/// A held lock, as its guard sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Guard {
    id: Id,
    token: u32,
    /// Order of the acquisition among all of them.
    seq: u8,
    /// Redis restarts before the acquisition.
    epoch: u8,
    /// The local lease estimate.
    exp: Tick,
    how: How,
    /// False for a grant until its confirmation (EXTEND to the full lease) is answered.
    confirmed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Between acquisitions (or done, after the last round).
    Idle,
    /// Waiting for this client's turn at the key.
    InLine,
    /// Has the turn; its ACQUIRE script is due. `baton`: the owner handing the lock on.
    /// `registered`: an earlier attempt may have put it in the waitlist (it listens then).
    Attempt {
        baton: Option<Id>,
        registered: bool,
    },
    /// Failed, registered, and subscribing (deaf until confirmed).
    Subscribing {
        wake: Tick,
    },
    /// Failed, registered, listening; retries at `min(wake, fallback)` or on news.
    Waiting {
        wake: Tick,
        fallback: Option<Tick>,
    },
    Holding(Guard),
    /// Knows its lock is lost (lease ran out or renewal failed); the guard still lives
    /// and will release, finding the key not its own. It has given the turn up.
    Stale {
        id: Id,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Task {
    /// This task's acquisitions begun so far (the current one's number while busy).
    round: u8,
    phase: Phase,
    /// The channel's news for this task's listener.
    news: Option<News>,
    /// Consecutive ticks this task, running, waited in Redis while no owner held the
    /// key.
    stalled: u8,
    /// Consecutive ticks this task, running, slept until the end of a lease it was
    /// told while the key was absent.
    stalled_free: u8,
    /// It waited while a grant's check was lost or late (its checker crashed, or was
    /// paused when the check was due) and has not tried since: it may sleep until the
    /// end of the lease it was told.
    unchecked: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Status {
    Running,
    Paused,
    Crashed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    status: Status,
    tasks: Vec<Task>,
    /// The task holding this client's turn at the key.
    turn: Option<u8>,
    /// Tasks waiting for the turn, first in line first.
    line: Vec<u8>,
    /// The key's channel is subscribed (it lingers after its last listener left).
    subscribed: bool,
    handoffs: u8,
    /// LEAVE_WAITLIST scripts under way in the background.
    leaving: Vec<Id>,
    /// When this client, having granted the key, checks that the grant was picked up
    /// (LAPSED_GRANT, a grace after the grant).
    check: Option<Tick>,
    /// When the grant ahead of this client's waiter lapses unless picked up: the waiter
    /// heard `N`, the releasing client checks nothing, and this waiter's attempt then
    /// is what passes a lapsed grant on (bookkeeping for the fault exemption, as `check`).
    covers: Option<Tick>,
}

/// A grant not yet picked up (confirmed, or taken by the grantee's attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Watch {
    /// The client that granted it, and checks it.
    checker: u8,
    /// The client of the first waiter in line whose client listens: it hears `N` and
    /// covers the lapse alone (the property exempts only its faults); `None` when there
    /// is none, and the client that granted checks.
    next: Option<u8>,
    /// Ticks since the grant in which a running task waited in Redis.
    ticks: Tick,
    /// The checker was not running at a tick since the grant (paused or crashed).
    faulted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    clock: Tick,
    key: Key,
    waitlist: Vec<Registration>,
    /// The fencing counter.
    fence: u32,
    /// Redis restarts so far.
    epoch: u8,
    /// How far behind the server's clock is (broken variant only).
    skew: u8,
    acquisitions: u8,
    procs: Vec<Proc>,
    pauses: u8,
    crashes: u8,
    /// The grant not yet picked up, if any.
    watch: Option<Watch>,
    forced: u8,
    /// The owner `force_unlock` evicted (it learns at its next renewal, confirmation or
    /// release).
    evicted: Option<Id>,
    /// A grant that lapsed was passed on by its checker (an example, for `sometimes`).
    passed_on: bool,
    /// A grantee's confirmation came too late: the grant had lapsed, or was evicted
    /// (an example).
    confirmed_late: bool,
    /// The highest token a guard that believed it held the lock has had: the highest a
    /// fenced store may have seen.
    written: u32,
    /// The waiter whose busy attempt last dropped a grant at or below its floor, unread
    /// (an example).
    dropped: Option<Id>,
    /// A grant read late (less than half its grace left) sent its waiter to attempt
    /// again (an example).
    read_late: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// A task asks for the lock (and takes its client's turn if free).
    Start(u8, u8),
    /// A task that has the turn sends its ACQUIRE script.
    Attempt(u8, u8),
    /// A fresh subscription is confirmed.
    Subscribed(u8, u8),
    /// A waiter's wait runs out: it gives its place up (LEAVE_WAITLIST in the background).
    GiveUp(u8, u8),
    Renew(u8, u8),
    /// `extend` to the shorter lease `extend_to`: EXTEND with the owner check.
    Extend(u8, u8),
    /// Release, or hand the lock to the next task of the client.
    Release(u8, u8),
    /// A guard that knows its lock is lost is released (or dropped).
    ReleaseStale(u8, u8),
    LeaveWaitlist(u8),
    /// A grantee's confirmation: EXTEND with the owner check, to its full lease.
    Confirm(u8, u8),
    /// LAPSED_GRANT: the client that granted the key frees it for the next in line if
    /// the grant lapsed.
    Check(u8),
    /// Redis notices that a crashed client's connection is gone: its subscriptions go.
    Disconnect(u8),
    /// `force_unlock` of the key's owner (`scripts::FORCE_UNLOCK`).
    ForceUnlock,
    Pause(u8),
    Resume(u8),
    /// A stopped process resumes with a waiter's timer and a grant message both due:
    /// `tokio::select!` may take the timer first, and the waiter sends its attempt with
    /// the grant unread.
    ResumeTimerFirst(u8),
    Crash(u8),
    RestartRedis,
    Tick,
}

impl Task {
    fn id(&self, proc: u8, task: u8) -> Id {
        Id {
            proc,
            task,
            round: self.round,
        }
    }

    /// Has a live listener on the key's channel.
    fn listens(&self) -> bool {
        matches!(
            self.phase,
            Phase::Waiting { .. }
                | Phase::Attempt {
                    registered: true,
                    ..
                }
        )
    }

    /// Waits for the key in Redis. (A task in line for its client's turn waits for a
    /// task of its own client, which holds the lock, or waits in Redis itself, or gives
    /// the turn up at once.)
    fn waits(&self) -> bool {
        matches!(
            self.phase,
            Phase::Attempt { .. } | Phase::Subscribing { .. } | Phase::Waiting { .. }
        )
    }

    /// Sleeps until the lease end it was told, with no reservation fallback set.
    fn sleeps_on_lease(&self) -> bool {
        matches!(self.phase, Phase::Waiting { fallback: None, .. })
    }

    /// Ends the current acquisition.
    fn finish(&mut self) {
        self.round += 1;
        self.phase = Phase::Idle;
        self.news = None;
    }

    /// Waits with its timer due and a grant message unread (after a pause: a running
    /// waiter reads its news and wakes at once).
    fn torn(&self, clock: Tick) -> bool {
        matches!(self.phase, Phase::Waiting { wake, fallback }
            if clock >= fallback.map_or(wake, |at| at.min(wake)))
            && matches!(self.news, Some(News::Granted(_)))
    }
}

impl State {
    fn task(&mut self, p: u8, t: u8) -> &mut Task {
        &mut self.procs[p as usize].tasks[t as usize]
    }

    /// A grant's check is lost or late: the waiters now fall back to their lease timers.
    fn lose_check(&mut self) {
        for task in self.procs.iter_mut().flat_map(|proc| &mut proc.tasks) {
            task.unchecked |= task.waits();
        }
    }

    /// Every guard that believes it holds the lock: its process is alive and either
    /// paused (it cannot look at the clock) or within its lease.
    fn believers(&self) -> Vec<Guard> {
        let mut guards = Vec::new();
        for proc in &self.procs {
            for task in &proc.tasks {
                if let Phase::Holding(guard) = task.phase {
                    let believes = match proc.status {
                        Status::Crashed => false,
                        Status::Paused => true,
                        Status::Running => self.clock < guard.exp,
                    };
                    if believes {
                        guards.push(guard);
                    }
                }
            }
        }
        guards
    }

    /// PUBLISH on the key's channel: every live listener gets it.
    fn publish(&mut self, message: Message) {
        for (p, proc) in self.procs.iter_mut().enumerate() {
            if proc.status == Status::Crashed {
                continue;
            }
            for (t, task) in proc.tasks.iter_mut().enumerate() {
                if !task.listens() {
                    continue;
                }
                let news = match message {
                    Message::Free => News::Free,
                    Message::Taken(lease) => News::Taken(lease),
                    Message::Reserved(id) if id == task.id(p as u8, t as u8) => News::ForUs,
                    Message::Reserved(_) => News::ForAnother,
                };
                task.news = Some(News::merge(task.news, news));
            }
        }
    }
}

impl Protocol {
    /// Two clients, the first with two tasks (a hand-off), one pause and one crash.
    fn two_clients(broken: Broken) -> Self {
        Protocol {
            clients: vec![vec![2, 2], vec![2]],
            rounds: 1,
            announce_lease: true,
            extend_to: None,
            announce_extend: true,
            grace: 1,
            slack: 1,
            max_time: 8,
            max_handoffs: 1,
            max_pauses: 1,
            max_crashes: 1,
            max_restarts: 0,
            grants: false,
            tell_next: true,
            max_force_unlocks: 0,
            broken,
        }
    }

    /// Three clients of one task each (the waitlist across clients), one pause and one
    /// crash.
    fn three_clients(broken: Broken) -> Self {
        Protocol {
            clients: vec![vec![2], vec![2], vec![2]],
            max_time: 5,
            ..Protocol::two_clients(broken)
        }
    }

    /// Two clients, one pause and one Redis restart; no hand-off (the releasing task
    /// goes through Redis although a task of its client waits: the hand-off limit).
    fn redis_restart(broken: Broken) -> Self {
        Protocol {
            max_time: 6,
            max_handoffs: 0,
            max_crashes: 0,
            max_restarts: 1,
            ..Protocol::two_clients(broken)
        }
    }

    /// FREE_FOR_NEXT, run by a script of client `by` (`None`: `force_unlock`): drop
    /// registrations that expired; with grants (and a client to check them), grant the
    /// key to the waitlist's head, or to the next if PUBLISH on the head's grant channel
    /// reaches nobody; else reserve the key for the head; or delete it. Publish which.
    ///
    /// `before`: the remaining lease of the lock released (none for a waiter leaving,
    /// or a lapsed grant's check).
    fn free_for_next(&self, s: &mut State, by: Option<u8>, before: Option<Tick>) {
        let clock = s.clock;
        s.waitlist.retain(|registration| registration.exp > clock);
        if let Some(checker) = by.filter(|_| self.grants) {
            while !s.waitlist.is_empty() {
                let head = s.waitlist.remove(0).id;
                if self.grant(s, head, checker, before) {
                    return;
                }
            }
        }
        // No grant to pick up: the reservation's grace, or the free key's message, now
        // bounds the wait.
        s.watch = None;
        if s.waitlist.is_empty() {
            s.key = Key::Absent;
            s.publish(Message::Free);
        } else {
            let head = s.waitlist.remove(0).id;
            let exp =
                (self.broken != Broken::ReservationWithoutExpiry).then_some(clock + self.grace);
            s.key = Key::Reserved {
                by: head,
                since: clock,
                exp,
            };
            s.publish(Message::Reserved(head));
        }
    }

    /// The grant of the key to `head` by client `checker`'s script: false when PUBLISH
    /// on `head`'s grant channel reaches nobody (Redis knows its client is gone, or its
    /// subscription is not made yet), and nothing is granted.
    fn grant(&self, s: &mut State, head: Id, checker: u8, before: Option<Tick>) -> bool {
        let clock = s.clock;
        let proc = &s.procs[head.proc as usize];
        if !proc.subscribed {
            return false;
        }
        let lease = self.clients[head.proc as usize][head.task as usize];
        let exp = match self.broken {
            Broken::GrantWithoutPickUpBound => clock + lease,
            _ => clock + self.grace,
        };
        let token = (s.fence + 1).max(u32::from(clock) * UNITS_PER_TICK);
        s.fence = token;
        s.key = Key::Owned {
            by: head,
            exp,
            contended: true,
            granted: Some(clock),
        };
        let guard = Guard {
            id: head,
            token,
            seq: s.acquisitions,
            epoch: s.epoch,
            exp,
            how: How::Grant,
            confirmed: false,
        };
        s.acquisitions += 1;
        // Only the grantee's client hears it, and only a waiter with that id takes it:
        // one that gave up meanwhile has its LEAVE_WAITLIST under way.
        if proc.status != Status::Crashed {
            let task = &mut s.procs[head.proc as usize].tasks[head.task as usize];
            if task.id(head.proc, head.task) == head && task.listens() {
                task.news = Some(News::merge(task.news, News::Granted(guard)));
            }
        }
        // The others were told when the lock before ends at the latest; the grantee's
        // may end sooner.
        if self.announce_lease && before.is_none_or(|before| lease < before) {
            s.publish(Message::Taken(lease));
        }
        // `N`: the next in line whose client listens is told when the grant lapses; a
        // client heard it when its subscription is live (the publish's count), which
        // it may still be after a crash Redis has not noticed. Its waiter gets it even
        // before it listens (the client keeps an `N` for a waiter that does not listen
        // yet).
        let told = self.tell_next(s, clock + self.grace);
        // The client that granted checks only when no client heard `N`.
        if told.is_none()
            && !matches!(
                self.broken,
                Broken::GrantWithoutPickUpBound | Broken::GrantWithoutCheck
            )
        {
            s.procs[checker as usize].check = Some(clock + self.grace);
        }
        // Whom the design relies on: the first waiter whose client listens, told or not
        // (so that a protocol that leaves it untold, and relies on the releaser, is
        // caught when the releaser stops), else the releaser.
        let listening = s
            .waitlist
            .iter()
            .map(|registration| registration.id)
            .find(|id| s.procs[id.proc as usize].subscribed);
        s.watch = Some(Watch {
            checker,
            next: told.or(listening).map(|next| next.proc),
            ticks: 0,
            faulted: false,
        });
        true
    }

    /// `tell_next` (FREE_FOR_NEXT, and LEAVE_WAITLIST after it): the first waiter in line
    /// whose client listens hears that the grant ahead lapses at `lapses` unless picked
    /// up; that waiter, if any.
    fn tell_next(&self, s: &mut State, lapses: Tick) -> Option<Id> {
        if !self.tell_next
            || matches!(
                self.broken,
                Broken::GrantWithoutPickUpBound
                    | Broken::GrantWithoutCheck
                    | Broken::NextWaiterNotTold
            )
        {
            return None;
        }
        let next = s
            .waitlist
            .iter()
            .map(|registration| registration.id)
            .find(|id| s.procs[id.proc as usize].subscribed)?;
        if s.procs[next.proc as usize].status == Status::Crashed {
            // Heard by a client that is gone: nobody covers the lapse.
            s.lose_check();
        }
        s.procs[next.proc as usize].covers = Some(lapses);
        let task = &mut s.procs[next.proc as usize].tasks[next.task as usize];
        if task.id(next.proc, next.task) == next && task.waits() {
            task.news = Some(News::merge(task.news, News::Next(lapses)));
        }
        Some(next)
    }

    /// RELEASE with `keep` 0 by client `p`: compare-and-hand-on.
    /// An uncontended lock is deleted with no message (see `Key::Owned::contended`).
    fn release(&self, s: &mut State, p: u8, id: Id) {
        match s.key {
            Key::Owned {
                by,
                contended: false,
                ..
            } if by == id => s.key = Key::Absent,
            Key::Owned { by, exp, .. } if by == id => {
                self.free_for_next(s, Some(p), Some(exp - s.clock))
            }
            _ if self.broken == Broken::ReleaseWithoutOwnerCheck => {
                self.free_for_next(s, Some(p), None)
            }
            _ => {}
        }
    }

    /// The ACQUIRE script, and what the task does with its reply.
    fn attempt(&self, s: &mut State, p: u8, t: u8, baton: Option<Id>, registered: bool) {
        let id = s.task(p, t).id(p, t);
        s.task(p, t).unchecked = false;
        // A grant force_unlock evicted before its waiter read it: this attempt tells the
        // waiter where the key stands (it may take it anew, under the same id).
        if s.evicted == Some(id) {
            s.evicted = None;
        }
        let mut handed = false;
        if let Some(previous) = baton
            && matches!(s.key, Key::Owned { by, .. } if by == previous)
        {
            s.key = Key::Absent;
            handed = true;
        }
        let mut how = None;
        if s.key == Key::Absent {
            how = Some(if handed { How::HandOff } else { How::Free });
        } else if matches!(s.key, Key::Reserved { by, .. } if by == id) {
            how = Some(How::Reservation);
        } else if matches!(s.key, Key::Owned { by, .. } if by == id) {
            // Granted to this waiter, whose message it has not read: taken, with the
            // full lease.
            how = Some(How::GrantTaken);
        }
        if let Some(how) = how {
            if registered || how == How::Reservation {
                s.waitlist.retain(|registration| registration.id != id);
            }
            // A grant taken by its waiter's attempt says nothing: the others heard at the
            // grant what they need (a shorter lease is announced then), and this lease,
            // counted from now, ends no sooner.
            if how == How::Reservation || (how == How::HandOff && self.announce_lease) {
                s.publish(Message::Taken(self.clients[p as usize][t as usize]));
            }
            let now = u32::from(s.clock.saturating_sub(s.skew)) * UNITS_PER_TICK;
            let token = (s.fence + 1).max(now);
            s.fence = token;
            let lease = self.clients[p as usize][t as usize];
            let exp = s.clock + lease;
            let contended = match how {
                How::Free => false,
                How::HandOff | How::Grant | How::GrantTaken => true,
                How::Reservation => self.broken != Broken::ReservationTakenUncontended,
            };
            s.key = Key::Owned {
                by: id,
                exp,
                contended,
                granted: None,
            };
            let guard = Guard {
                id,
                token,
                seq: s.acquisitions,
                epoch: s.epoch,
                exp,
                how,
                confirmed: true,
            };
            s.acquisitions += 1;
            served(s, true);
            let task = s.task(p, t);
            task.phase = Phase::Holding(guard);
            task.news = None;
            return;
        }
        let ttl = match s.key {
            Key::Owned { exp, .. } | Key::Reserved { exp: Some(exp), .. } => exp - s.clock,
            // A string without expiry: `{-1, 'string'}`, `NotALock`; the acquisition
            // ends with an error and gives its place up.
            Key::Absent => unreachable!("an absent key is taken"),
            Key::Reserved { exp: None, .. } => {
                s.task(p, t).finish();
                let proc = &mut s.procs[p as usize];
                proc.turn = None;
                proc.leaving.push(id);
                return;
            }
        };
        // Found busy: the holder's release will be published.
        if let Key::Owned { contended, .. } = &mut s.key {
            *contended = true;
        }
        // With grants, the reply carries the grant floor (the attempt's own token; here
        // the last token issued before it, which orders grants alike): a grant at or
        // below it was made before the attempt, and is dead (lapsed, evicted or passed
        // on: the attempt did not find the key granted to this waiter), so one unread
        // is dropped; a grant made after it is above it.
        if self.grants {
            let fixed = self.broken != Broken::GrantHonouredAfterBusy;
            let floor = s.fence;
            let task = s.task(p, t);
            if fixed && matches!(task.news, Some(News::Granted(grant)) if grant.token <= floor) {
                task.news = None;
                s.dropped = Some(id);
            }
        }
        // ACQUIRE's `UNCONFIRMED`: a waiter that finds a grant not picked up yet, with
        // another waiter ahead in line, is told its own lease rather than the grace; the
        // first in line keeps the grace. (Nothing relies on that one: the lapse is the
        // waiter told `N`'s, or else the releasing client's, as before. Unlike the script's
        // test — a line there before a new registration, or else its rank — the line here
        // holds no lapsed registration: they are dropped every tick.)
        if !s.waitlist.iter().any(|registration| registration.id == id) {
            s.waitlist.push(Registration { id, exp: 0 });
        }
        let first = s.waitlist[0].id == id;
        let unconfirmed = self.grants
            && matches!(
                s.key,
                Key::Owned {
                    granted: Some(_),
                    ..
                }
            );
        let ttl = if unconfirmed && !first {
            ttl.max(self.clients[p as usize][t as usize])
        } else {
            ttl
        };
        let exp = s.clock + ttl + self.slack;
        if let Some(registration) = s
            .waitlist
            .iter_mut()
            .find(|registration| registration.id == id)
        {
            registration.exp = exp;
        }
        let wake = s.clock + ttl;
        let subscribed = s.procs[p as usize].subscribed;
        let task = s.task(p, t);
        task.phase = if subscribed {
            Phase::Waiting {
                wake,
                fallback: None,
            }
        } else {
            task.news = None;
            Phase::Subscribing { wake }
        };
    }

    /// The clock advances one tick (or Redis restarts, which takes one).
    fn tick(&self, s: &mut State) {
        let owned = matches!(s.key, Key::Owned { .. });
        let absent = s.key == Key::Absent;
        for proc in &mut s.procs {
            let running = proc.status == Status::Running;
            for task in &mut proc.tasks {
                task.stalled = if running && task.waits() && !owned {
                    task.stalled + 1
                } else {
                    0
                };
                task.stalled_free = if running && task.sleeps_on_lease() && absent {
                    task.stalled_free + 1
                } else {
                    0
                };
            }
        }
        if let Some(watch) = &mut s.watch {
            let waiting = s
                .procs
                .iter()
                .any(|proc| proc.status == Status::Running && proc.tasks.iter().any(Task::waits));
            if waiting {
                watch.ticks += 1;
            }
            // Whoever covers the lapse is not running in this tick: the waiter that heard
            // `N`, or else the client that granted, its check due (or lost with it).
            let checker = &s.procs[watch.checker as usize];
            let down = match watch.next {
                Some(next) => s.procs[next as usize].status != Status::Running,
                None => {
                    checker.status != Status::Running
                        && checker.check.is_none_or(|due| due <= s.clock)
                }
            };
            if down {
                watch.faulted = true;
            }
        }
        if s.procs.iter().any(|proc| {
            proc.status == Status::Paused
                && (proc.check.is_some_and(|due| due <= s.clock)
                    || (s.watch.is_some() && proc.covers.is_some_and(|due| due <= s.clock)))
        }) {
            s.lose_check();
        }
        s.clock += 1;
        let clock = s.clock;
        match s.key {
            Key::Owned { exp, .. } | Key::Reserved { exp: Some(exp), .. } if exp <= clock => {
                s.key = Key::Absent
            }
            _ => {}
        }
        s.waitlist.retain(|registration| registration.exp > clock);
        // A subscription nobody listens to lingers until the next tick; a crashed
        // client's, with grants, until Redis notices (`Action::Disconnect`).
        for proc in &mut s.procs {
            if self.grants && proc.status == Status::Crashed {
                continue;
            }
            if !proc
                .tasks
                .iter()
                .any(|task| task.listens() || matches!(task.phase, Phase::Subscribing { .. }))
            {
                proc.subscribed = false;
            }
        }
    }

    /// The steps a running client takes at once and on its own, without Redis: the
    /// turn goes to the first in line, a waiter reads its news or wakes at its timer
    /// (and is then due to attempt), a holder notices that its lease ran out. Taken
    /// eagerly: they commute with every other process's steps.
    fn settle(&self, s: &mut State) {
        let clock = s.clock;
        let mut picked = false;
        let mut read_late = false;
        for proc in &mut s.procs {
            if proc.status != Status::Running {
                continue;
            }
            for task in &mut proc.tasks {
                match task.phase {
                    Phase::Waiting { wake, fallback } => {
                        task.phase = match task.news.take() {
                            Some(News::Free | News::ForUs) => Phase::Attempt {
                                baton: None,
                                registered: true,
                            },
                            // Reserved for another client's waiter: wait, but not past
                            // the reservation, in case that waiter died.
                            Some(News::ForAnother) => Phase::Waiting {
                                wake,
                                fallback: Some(clock + self.grace),
                            },
                            // Taken: wait for the lease end it was told (or try now); with
                            // the fix, no longer than the new holder's lease.
                            Some(News::Taken(lease)) => Phase::Waiting {
                                wake,
                                fallback: self.announce_lease.then_some(clock + lease),
                            },
                            // The grant ahead lapses then unless confirmed: try then,
                            // or sooner if something else said so.
                            Some(News::Next(lapses)) => Phase::Waiting {
                                wake,
                                fallback: Some(fallback.map_or(lapses, |at| at.min(lapses))),
                            },
                            // Granted (after its last busy attempt: an older grant was
                            // dropped with the reply): it holds the lock from the message
                            // alone, until the grace from the grant ends, and its
                            // confirmation (due at once) tells whether it still holds
                            // it: a grant read in time may be evicted, or the grantee
                            // paused before it confirmed. A grant read late (less than
                            // half the grace left, here none) may have lapsed and gone
                            // on: the waiter attempts again, and its attempt takes the
                            // key if it is still granted to it (a fresh token from
                            // Redis), or finds it busy and registers again.
                            Some(News::Granted(mut guard)) => {
                                if self.broken == Broken::GrantLeaseFromArrival {
                                    guard.exp = clock + self.grace;
                                }
                                if clock < guard.exp {
                                    picked = true;
                                    Phase::Holding(guard)
                                } else if self.broken == Broken::GrantHonouredAfterBusy {
                                    // Confirmed by EXTEND with the owner check: a later
                                    // grant to the same waiter passes it, and the guard
                                    // keeps this message's token.
                                    Phase::Holding(guard)
                                } else {
                                    read_late = true;
                                    Phase::Attempt {
                                        baton: None,
                                        registered: true,
                                    }
                                }
                            }
                            None => task.phase,
                        };
                        if let Phase::Waiting { wake, fallback } = task.phase
                            && clock >= fallback.map_or(wake, |at| at.min(wake))
                        {
                            task.phase = Phase::Attempt {
                                baton: None,
                                registered: true,
                            };
                        }
                    }
                    // (A grant's confirmation, due, tells.)
                    Phase::Holding(guard) if clock >= guard.exp && guard.confirmed => {
                        // `lost()`: the turn goes on, the guard lives.
                        task.phase = Phase::Stale { id: guard.id };
                        proc.turn = None;
                    }
                    _ => {}
                }
            }
            if proc.turn.is_none() && !proc.line.is_empty() {
                let next = proc.line.remove(0);
                proc.turn = Some(next);
                proc.tasks[next as usize].phase = Phase::Attempt {
                    baton: None,
                    registered: false,
                };
            }
        }
        if picked {
            served(s, false);
        }
        s.read_late |= read_late;
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let procs = self
            .clients
            .iter()
            .map(|tasks| Proc {
                status: Status::Running,
                tasks: vec![
                    Task {
                        round: 0,
                        phase: Phase::Idle,
                        news: None,
                        stalled: 0,
                        stalled_free: 0,
                        unchecked: false,
                    };
                    tasks.len()
                ],
                turn: None,
                line: Vec::new(),
                subscribed: false,
                handoffs: 0,
                leaving: Vec::new(),
                check: None,
                covers: None,
            })
            .collect();
        vec![State {
            clock: 0,
            key: Key::Absent,
            waitlist: Vec::new(),
            fence: 0,
            epoch: 0,
            skew: 0,
            acquisitions: 0,
            procs,
            pauses: 0,
            crashes: 0,
            watch: None,
            forced: 0,
            evicted: None,
            passed_on: false,
            confirmed_late: false,
            written: 0,
            dropped: None,
            read_late: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // A script due in a running process: the clock waits for it.
        let mut due = false;
        for (p, proc) in s.procs.iter().enumerate() {
            let p = p as u8;
            match proc.status {
                Status::Crashed => {
                    if self.grants && proc.subscribed {
                        actions.push(Action::Disconnect(p));
                    }
                    continue;
                }
                Status::Paused => {
                    actions.push(Action::Resume(p));
                    if proc.tasks.iter().any(|task| task.torn(s.clock)) {
                        actions.push(Action::ResumeTimerFirst(p));
                    }
                    continue;
                }
                Status::Running => {}
            }
            for (t, task) in proc.tasks.iter().enumerate() {
                let t = t as u8;
                match task.phase {
                    Phase::Idle if task.round < self.rounds => actions.push(Action::Start(p, t)),
                    Phase::Idle | Phase::InLine => {}
                    Phase::Attempt { .. } => {
                        actions.push(Action::Attempt(p, t));
                        due = true;
                    }
                    Phase::Subscribing { .. } => {
                        actions.push(Action::Subscribed(p, t));
                        due = true;
                    }
                    Phase::Waiting { .. } => actions.push(Action::GiveUp(p, t)),
                    Phase::Holding(guard) if !guard.confirmed => {
                        // Sent a quarter of the grace after the grant, in the
                        // background (within the tick here), unless the holder released
                        // first: a short hold never confirms, and its release frees the
                        // grant itself.
                        actions.push(Action::Confirm(p, t));
                        actions.push(Action::Release(p, t));
                        due = true;
                    }
                    Phase::Holding(guard) => {
                        actions.push(Action::Renew(p, t));
                        actions.push(Action::Release(p, t));
                        if self.extend_to.is_some_and(|to| guard.exp > s.clock + to) {
                            actions.push(Action::Extend(p, t));
                        }
                    }
                    Phase::Stale { .. } => actions.push(Action::ReleaseStale(p, t)),
                }
            }
            if !proc.leaving.is_empty() {
                actions.push(Action::LeaveWaitlist(p));
                due = true;
            }
            if proc.check.is_some_and(|at| at <= s.clock) {
                actions.push(Action::Check(p));
                due = true;
            }
            if s.pauses < self.max_pauses {
                actions.push(Action::Pause(p));
            }
            if s.crashes < self.max_crashes {
                actions.push(Action::Crash(p));
            }
        }
        if s.forced < self.max_force_unlocks && matches!(s.key, Key::Owned { .. }) {
            actions.push(Action::ForceUnlock);
        }
        if !due && s.clock < self.max_time {
            actions.push(Action::Tick);
            if s.epoch < self.max_restarts {
                actions.push(Action::RestartRedis);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Start(p, t) => {
                s.task(p, t).phase = Phase::InLine;
                s.procs[p as usize].line.push(t);
            }
            Action::Attempt(p, t) => {
                let Phase::Attempt { baton, registered } = s.task(p, t).phase else {
                    unreachable!()
                };
                self.attempt(&mut s, p, t, baton, registered);
            }
            Action::Subscribed(p, t) => {
                s.procs[p as usize].subscribed = true;
                let task = s.task(p, t);
                let Phase::Subscribing { wake } = task.phase else {
                    unreachable!()
                };
                task.phase = if self.broken == Broken::NoRetryAfterSubscribe {
                    Phase::Waiting {
                        wake,
                        fallback: None,
                    }
                } else {
                    // A release published before the subscription was live was missed.
                    Phase::Attempt {
                        baton: None,
                        registered: true,
                    }
                };
            }
            Action::GiveUp(p, t) => {
                let id = s.task(p, t).id(p, t);
                s.task(p, t).finish();
                let proc = &mut s.procs[p as usize];
                proc.turn = None;
                proc.leaving.push(id);
            }
            Action::Renew(p, t) => {
                let Phase::Holding(mut guard) = s.task(p, t).phase else {
                    unreachable!()
                };
                let exp = s.clock + self.clients[p as usize][t as usize];
                match &mut s.key {
                    Key::Owned {
                        by, exp: key_exp, ..
                    } if *by == guard.id => {
                        *key_exp = exp;
                        guard.exp = exp;
                        s.task(p, t).phase = Phase::Holding(guard);
                    }
                    _ => {
                        s.task(p, t).phase = Phase::Stale { id: guard.id };
                        s.procs[p as usize].turn = None;
                    }
                }
            }
            Action::Extend(p, t) => {
                let Phase::Holding(mut guard) = s.task(p, t).phase else {
                    unreachable!()
                };
                let lease = self.extend_to.expect("extends only with a shorter lease");
                let exp = s.clock + lease;
                match &mut s.key {
                    Key::Owned {
                        by,
                        exp: key_exp,
                        contended,
                        ..
                    } if *by == guard.id => {
                        // Waiters were told the old expiry: a shorter one is news.
                        let announce = self.announce_extend && *contended && exp < *key_exp;
                        *key_exp = exp;
                        guard.exp = exp;
                        s.task(p, t).phase = Phase::Holding(guard);
                        if announce {
                            s.publish(Message::Taken(lease));
                        }
                    }
                    _ => {
                        s.task(p, t).phase = Phase::Stale { id: guard.id };
                        s.procs[p as usize].turn = None;
                    }
                }
            }
            Action::Release(p, t) => {
                let Phase::Holding(guard) = s.task(p, t).phase else {
                    unreachable!()
                };
                s.task(p, t).finish();
                let proc = &mut s.procs[p as usize];
                if !proc.line.is_empty() && proc.handoffs < self.max_handoffs {
                    proc.handoffs += 1;
                    let next = proc.line.remove(0);
                    proc.turn = Some(next);
                    s.task(p, next).phase = Phase::Attempt {
                        baton: Some(guard.id),
                        registered: false,
                    };
                } else {
                    proc.handoffs = 0;
                    proc.turn = None;
                    self.release(&mut s, p, guard.id);
                }
            }
            Action::ReleaseStale(p, t) => {
                let Phase::Stale { id } = s.task(p, t).phase else {
                    unreachable!()
                };
                s.task(p, t).finish();
                self.release(&mut s, p, id);
            }
            Action::LeaveWaitlist(p) => {
                let id = s.procs[p as usize].leaving.remove(0);
                s.waitlist.retain(|registration| registration.id != id);
                // Reserved, or granted, to the waiter that gave up: the next in line.
                if matches!(s.key, Key::Reserved { by, .. } | Key::Owned { by, .. } if by == id) {
                    self.free_for_next(&mut s, Some(p), None);
                } else if s.key == Key::Absent && !s.waitlist.is_empty() {
                    // Free while others wait (a grant lapsed before this waiter's attempt):
                    // the next in line, as the lapsed-grant check would.
                    self.free_for_next(&mut s, Some(p), None);
                } else if let Key::Owned {
                    granted: Some(_),
                    exp,
                    ..
                } = s.key
                    && s.watch.is_some()
                    && s.procs[p as usize].covers.is_some()
                {
                    // A grant ahead not picked up, whose lapse this waiter was told of:
                    // the next in line is told instead, or, when no client hears it, this
                    // client checks (LEAVE_WAITLIST's reply 5).
                    s.procs[p as usize].covers = None;
                    let told = self.tell_next(&mut s, exp);
                    if told.is_none() {
                        s.procs[p as usize].check = Some(s.clock + self.grace);
                    }
                    if let Some(watch) = &mut s.watch {
                        watch.next = told.map(|next| next.proc);
                        if told.is_none() {
                            watch.checker = p;
                        }
                    }
                }
            }
            Action::Confirm(p, t) => {
                let Phase::Holding(mut guard) = s.task(p, t).phase else {
                    unreachable!()
                };
                let exp = s.clock + self.clients[p as usize][t as usize];
                match &mut s.key {
                    Key::Owned {
                        by,
                        exp: key_exp,
                        granted,
                        ..
                    } if *by == guard.id => {
                        *key_exp = exp;
                        *granted = None;
                        guard.exp = exp;
                        guard.confirmed = true;
                        s.task(p, t).phase = Phase::Holding(guard);
                        s.watch = None;
                    }
                    // Lapsed and passed on, or evicted: lost.
                    _ => {
                        s.confirmed_late = true;
                        s.task(p, t).phase = Phase::Stale { id: guard.id };
                        s.procs[p as usize].turn = None;
                    }
                }
            }
            Action::Check(p) => {
                s.procs[p as usize].check = None;
                match &mut s.key {
                    // (With nobody in line, nothing to do.)
                    Key::Absent if !s.waitlist.is_empty() => {
                        self.free_for_next(&mut s, Some(p), None);
                        s.passed_on |= s.watch.is_some();
                    }
                    // Taken since the grant lapsed by an attempt that found it free (the
                    // late grantee's, a newcomer's): the waiters in line were told nothing
                    // and sleep on; its release must go through the waitlist.
                    Key::Owned { contended, .. }
                        if self.broken != Broken::LapsedGrantCheckOnlyWhenAbsent =>
                    {
                        *contended = true
                    }
                    _ => {}
                }
            }
            Action::Disconnect(p) => s.procs[p as usize].subscribed = false,
            Action::ForceUnlock => {
                let Key::Owned { by, .. } = s.key else {
                    unreachable!()
                };
                s.forced += 1;
                s.evicted = Some(by);
                // FORCE_UNLOCK's free_for_next has no fencing counter: it reserves.
                self.free_for_next(&mut s, None, None);
            }
            Action::Pause(p) => {
                s.pauses += 1;
                s.procs[p as usize].status = Status::Paused;
            }
            Action::Resume(p) => s.procs[p as usize].status = Status::Running,
            Action::ResumeTimerFirst(p) => {
                let clock = s.clock;
                let proc = &mut s.procs[p as usize];
                proc.status = Status::Running;
                for task in proc.tasks.iter_mut().filter(|task| task.torn(clock)) {
                    task.phase = Phase::Attempt {
                        baton: None,
                        registered: true,
                    };
                }
            }
            Action::Crash(p) => {
                s.crashes += 1;
                if s.procs[p as usize].check.is_some()
                    || (s.watch.is_some() && s.procs[p as usize].covers.is_some())
                {
                    s.lose_check();
                }
                let rounds = self.rounds;
                let proc = &mut s.procs[p as usize];
                proc.status = Status::Crashed;
                for task in &mut proc.tasks {
                    *task = Task {
                        round: rounds,
                        phase: Phase::Idle,
                        news: None,
                        stalled: 0,
                        stalled_free: 0,
                        unchecked: false,
                    };
                }
                proc.turn = None;
                proc.line.clear();
                // With grants, Redis may not know yet (`Action::Disconnect`): a grant
                // can still reach its subscription, and nobody.
                proc.subscribed &= self.grants;
                proc.handoffs = 0;
                proc.leaving.clear();
                proc.check = None;
                proc.covers = None;
            }
            Action::RestartRedis => {
                self.tick(&mut s);
                s.key = Key::Absent;
                s.waitlist.clear();
                s.fence = 0;
                s.epoch += 1;
                if self.broken == Broken::ClockBehindAfterRestart {
                    s.skew = 2;
                }
                // The connection dropped: every listener is woken to check again.
                s.publish(Message::Free);
            }
            Action::Tick => self.tick(&mut s),
        }
        self.settle(&mut s);
        s.written = s
            .believers()
            .iter()
            .map(|g| g.token)
            .fold(s.written, u32::max);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("exclusion or fencing", |_, s: &State| {
                let guards = s.believers();
                // Of two guards believing at once, the later acquisition has the larger
                // token, and the earlier lease ran out (unless Redis restarted between).
                // (A guard `force_unlock` evicted is no longer the key's owner, and learns
                // it at its next renewal, confirmation or release; an evicted grant not
                // read yet is spared only until its waiter's next attempt.)
                let evicted = |g: &Guard| s.evicted == Some(g.id);
                let fenced = guards.iter().all(|a| {
                    guards.iter().filter(|b| b.seq > a.seq).all(|b| {
                        b.token > a.token && (a.epoch != b.epoch || s.clock >= a.exp || evicted(a))
                    })
                });
                // A guard within its lease owns the key in Redis, at least as long.
                let redis_agrees = guards
                    .iter()
                    .filter(|g| g.epoch == s.epoch && s.clock < g.exp && !evicted(g))
                    .all(|g| matches!(s.key, Key::Owned { by, exp, .. } if by == g.id && exp >= g.exp));
                fenced && redis_agrees
            }),
            // Of any two guards held (believed or not), the later acquisition has the
            // larger token: a grant's token, made by the release, and an attempt's alike.
            // And a guard within its lease that owns the key in Redis has a token no lower
            // than any a guard believing it held the lock has had: a fenced store never
            // refuses the key's holder.
            Property::always("fencing tokens increase", |_, s: &State| {
                let ordered =
                    holders(s).all(|a| holders(s).all(|b| b.seq <= a.seq || b.token > a.token));
                let owns = |g: &Guard| {
                    g.epoch == s.epoch
                        && s.clock < g.exp
                        && s.evicted != Some(g.id)
                        && matches!(s.key, Key::Owned { by, .. } if by == g.id)
                };
                let newest = s
                    .believers()
                    .iter()
                    .filter(|g| owns(g))
                    .all(|g| g.token >= s.written);
                ordered && newest
            }),
            Property::always(
                "reservation within grace",
                |m: &Protocol, s: &State| match s.key {
                    Key::Reserved { since, .. } => s.clock < since + m.grace,
                    _ => true,
                },
            ),
            Property::always("no forgotten waiter", |m: &Protocol, s: &State| {
                // A grant nobody picked up, whose checker is paused or dead too: the
                // waiters retry at the end of the lease they were told.
                let lease = m.clients.iter().flatten().copied().max().unwrap_or(0);
                s.procs.iter().flat_map(|proc| &proc.tasks).all(|task| {
                    if task.unchecked {
                        task.stalled_free <= lease && task.stalled <= m.grace + lease
                    } else {
                        task.stalled_free == 0 && task.stalled <= m.grace
                    }
                })
            }),
            Property::sometimes("acquired", |_, s: &State| !s.believers().is_empty()),
        ];
        // With grants, only `force_unlock` reserves.
        let reserves = !self.grants || self.max_force_unlocks > 0;
        if reserves {
            properties.push(Property::sometimes("reservation taken", |_, s: &State| {
                holders(s).any(|g| g.how == How::Reservation)
            }));
        }
        if !self.grants && self.max_pauses + self.max_crashes > 0 {
            properties.push(Property::sometimes(
                "reserved for a waiter that does not come",
                |_, s: &State| {
                    matches!(s.key, Key::Reserved { by, .. }
                        if s.procs[by.proc as usize].status != Status::Running)
                },
            ));
        }
        if self.grants {
            properties.push(Property::always(
                "grant within grace",
                |m: &Protocol, s: &State| match s.key {
                    Key::Owned {
                        granted: Some(since),
                        ..
                    } => s.clock < since + m.grace,
                    _ => true,
                },
            ));
            properties.push(Property::always(
                "a grant nobody picks up passes on within grace",
                |m: &Protocol, s: &State| {
                    s.watch
                        .is_none_or(|watch| watch.faulted || watch.ticks <= m.grace)
                },
            ));
            properties.push(Property::sometimes("granted", |_, s: &State| {
                holders(s).any(|g| g.how == How::Grant && g.confirmed)
            }));
            properties.push(Property::sometimes(
                "a grant taken by the grantee's attempt",
                |_, s: &State| holders(s).any(|g| g.how == How::GrantTaken),
            ));
            properties.push(Property::sometimes(
                "a lapsed grant passed on",
                |_, s: &State| s.passed_on,
            ));
        }
        if self.grants && self.max_pauses + self.max_force_unlocks > 0 {
            properties.push(Property::sometimes(
                "a grant's confirmation too late",
                |_, s: &State| s.confirmed_late,
            ));
            properties.push(Property::sometimes(
                "a grant older than a busy attempt dropped",
                |_, s: &State| s.dropped.is_some(),
            ));
            properties.push(Property::sometimes(
                "granted anew after a grant was dropped",
                |_, s: &State| holders(s).any(|g| g.how == How::Grant && s.dropped == Some(g.id)),
            ));
        }
        if self.grants && self.max_pauses > 0 {
            properties.push(Property::sometimes(
                "a grant read late: attempt again",
                |_, s: &State| s.read_late,
            ));
        }
        if self.grants && self.max_pauses + self.max_crashes > 0 {
            properties.push(Property::sometimes(
                "granted to a waiter that does not come",
                |_, s: &State| {
                    matches!(s.key, Key::Owned { by, granted: Some(_), .. }
                        if s.procs[by.proc as usize].status != Status::Running)
                },
            ));
        }
        if self.max_force_unlocks > 0 {
            properties.push(Property::sometimes(
                "a grant evicted by force_unlock",
                |_, s: &State| {
                    s.evicted.is_some_and(|id| {
                        s.procs[id.proc as usize].tasks.iter().any(|task| {
                            matches!(task.news, Some(News::Granted(g)) if g.id == id)
                                || matches!(task.phase, Phase::Holding(g) if g.id == id && !g.confirmed)
                        })
                    })
                },
            ));
        }
        if self.max_handoffs > 0 && self.clients.iter().any(|tasks| tasks.len() > 1) {
            properties.push(Property::sometimes(
                "handed off in a client",
                |_, s: &State| holders(s).any(|g| g.how == How::HandOff),
            ));
        }
        if self.max_pauses + self.max_restarts > 0 {
            properties.push(Property::sometimes(
                "two guards believe at once",
                |_, s: &State| s.believers().len() >= 2,
            ));
        }
        properties
    }
}

/// The key served someone (an acquisition, or a grant read by its grantee): no waiter
/// has been kept from a free key. An acquisition in Redis also leaves no grant to pick
/// up (a grant read is picked up when its confirmation is answered).
fn served(s: &mut State, in_redis: bool) {
    for task in s.procs.iter_mut().flat_map(|proc| &mut proc.tasks) {
        task.stalled = 0;
        task.stalled_free = 0;
    }
    if in_redis {
        s.watch = None;
        for proc in &mut s.procs {
            proc.covers = None;
        }
    }
}

fn holders(s: &State) -> impl Iterator<Item = Guard> + '_ {
    s.procs
        .iter()
        .flat_map(|proc| proc.tasks.iter())
        .filter_map(|task| match task.phase {
            Phase::Holding(guard) => Some(guard),
            _ => None,
        })
}

/// Explores the whole bounded state space breadth-first; prints its size.
fn explore(model: Protocol, label: &str) -> impl Checker<Protocol> {
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "model, {label}: {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

#[test]
fn two_clients_keep_the_guarantees() {
    explore(Protocol::two_clients(Broken::None), "two clients").assert_properties();
}

#[test]
fn three_clients_keep_the_guarantees() {
    explore(Protocol::three_clients(Broken::None), "three clients").assert_properties();
}

#[test]
fn the_guarantees_hold_across_a_redis_restart() {
    explore(Protocol::redis_restart(Broken::None), "Redis restart").assert_properties();
}

/// Issue 25: a release grants the key to the next waiter. Three clients of one task each
/// (a grant across clients; a grant lapsed and passed on to the third), one pause and
/// one crash (the grantee, or the releaser, gone or stopped at any step).
fn grants(broken: Broken) -> Protocol {
    Protocol {
        grants: true,
        max_time: 4,
        ..Protocol::three_clients(broken)
    }
}

#[test]
fn grants_keep_the_guarantees_when_the_grantee_or_the_releaser_dies_or_stops() {
    explore(grants(Broken::None), "grants, three clients").assert_properties();
}

/// Grants beside a hand-off inside a client: two clients, the first with two tasks.
#[test]
fn grants_keep_the_guarantees_beside_a_hand_off_inside_a_client() {
    let model = Protocol {
        grants: true,
        max_time: 7,
        ..Protocol::two_clients(Broken::None)
    };
    explore(model, "grants, two clients").assert_properties();
}

/// `force_unlock` racing a grant (and its confirmation, and the releaser's check):
/// FORCE_UNLOCK evicts the owner, a grantee too, and reserves the key for the next in
/// line, as for clients without grants (it has no fencing counter to grant with).
#[test]
fn grants_keep_the_guarantees_when_force_unlock_races_a_grant() {
    let model = Protocol {
        grants: true,
        max_force_unlocks: 1,
        max_pauses: 0,
        ..Protocol::three_clients(Broken::None)
    };
    explore(model, "grants, force_unlock").assert_properties();
}

/// Grants between clients asking for different leases (4 ticks, 2, 4: a lease of 1,
/// the grace, would end with the releaser's check, which passes the key on).
fn mixed_grants(mixed: Protocol) -> Protocol {
    Protocol {
        grants: true,
        clients: vec![vec![4], vec![2], vec![4]],
        max_time: 6,
        ..mixed
    }
}

/// A grant to a holder of a shorter lease than the lock released announces it
/// (`T:<lease>`), as a reservation taken does, and so does an attempt that takes its own
/// grant: the waiters in line were told when the lock released would end.
#[test]
fn a_grant_of_a_shorter_lease_keeps_waiters_awake() {
    let [reservation, _] = mixed_leases(true);
    let model = Protocol {
        grants: true,
        ..mixed_grants(reservation)
    };
    explore(model, "grants, mixed leases").assert_properties();
}

/// Without those announcements, a waiter sleeps on a free key after a holder of the
/// shorter lease overran it or died.
#[test]
fn without_announcing_a_granted_shorter_lease_a_waiter_sleeps_on_a_free_key() {
    let [reservation, _] = mixed_leases(false);
    // Checked without `N`, which wakes the next waiter at the grant's lapse whatever it
    // was told, and so covers this route in this small setting.
    counterexample(
        Protocol {
            tell_next: false,
            ..mixed_grants(reservation)
        },
        "grants, mixed leases unannounced",
        "no forgotten waiter",
    );
}

/// (a) A grant with the grantee's whole lease and nothing to bound its pick-up (no
/// grace, no check): a grantee that died, or stopped, holds the key for that lease while
/// the next waiter waits.
#[test]
fn a_grant_without_a_pick_up_bound_is_caught() {
    counterexample(
        grants(Broken::GrantWithoutPickUpBound),
        "a grant without a pick-up bound",
        "a grant nobody picks up passes on within grace",
    );
}

/// Issue 34: the protocol before it, where only the releasing client checks for a
/// lapsed grant. The releaser stops or crashes right after the release that granted (a
/// scheduled job's last act), and the grantee is gone or stopped without Redis knowing
/// (its grant delivered, never confirmed): the next waiter, running, sleeps until the
/// lease it was told (the checker finds: grantee crashed, releaser paused, 14 steps).
/// With `N` it takes the key when the grant lapses.
#[test]
fn a_releaser_that_crashes_right_after_granting_is_covered_by_the_next_waiter() {
    counterexample(
        grants(Broken::NextWaiterNotTold),
        "the next waiter not told when a grant lapses",
        "a grant nobody picks up passes on within grace",
    );
}

/// A grant that lapses with the grace but that nobody checks: the waiters in line, told
/// nothing, sleep until the lease of the lock released ends.
#[test]
fn a_grant_that_lapses_unchecked_is_caught() {
    counterexample(
        grants(Broken::GrantWithoutCheck),
        "a grant that lapses unchecked",
        "a grant nobody picks up passes on within grace",
    );
}

/// (b) A grantee that counts its grace from the message's arrival: delayed (its process
/// paused as the grant came), it believes it holds after the grant lapsed and went on.
#[test]
fn a_grant_lease_counted_from_the_message_is_caught() {
    counterexample(
        grants(Broken::GrantLeaseFromArrival),
        "a grant's lease counted from the message",
        "exclusion or fencing",
    );
}

/// (c) LAPSED_GRANT that frees only an absent key: a late grantee (or a newcomer) that
/// took the key after the grant lapsed, before the check, holds it uncontended, and its
/// release says nothing to the waiters in line, who were told nothing by the grant
/// either and sleep until the end of the lease before it.
#[test]
fn a_lapsed_grant_check_that_frees_only_an_absent_key_is_caught() {
    counterexample(
        // Checked without `N`: a next waiter that runs attempts at the lapse, finds the
        // key held and marks it, which covers this route in this small setting.
        Protocol {
            max_crashes: 0,
            tell_next: false,
            ..grants(Broken::LapsedGrantCheckOnlyWhenAbsent)
        },
        "a lapsed grant's check that frees only an absent key",
        "no forgotten waiter",
    );
}

/// Issue 33: a grant message and an attempt's reply race. Three clients of one task
/// each, no crash: the natural route (one pause; a grant lapses and goes on while its
/// grantee is stopped, the grantee's timer fires, its attempt finds the next holder,
/// who releases and grants it anew) and the force_unlock route (an unread grant
/// evicted, the key taken by the next in line before the grantee's attempt; a pause
/// too, a tick shorter).
fn stale_grants(broken: Broken) -> [Protocol; 2] {
    [
        Protocol {
            max_crashes: 0,
            max_time: 5,
            ..grants(broken)
        },
        Protocol {
            max_crashes: 0,
            max_force_unlocks: 1,
            max_time: 3,
            ..grants(broken)
        },
    ]
}

/// The fix: a busy reply carries the grant floor (the attempt's own token), and the
/// waiter drops a grant at or below it; a grant read late sends the waiter to attempt
/// again, whose token comes from Redis. Every property holds, and the examples show
/// both routes taken: a grant dropped, its waiter granted anew, a late grant attempted.
#[test]
fn a_grant_read_after_a_busy_attempt_is_dropped() {
    let [natural, forced] = stale_grants(Broken::None);
    explore(natural, "stale grants, a lapse").assert_properties();
    explore(forced, "stale grants, force_unlock").assert_properties();
}

/// The protocol before the fix, which both routes break. A lapsed grant read after its
/// waiter's busy attempt is confirmed against a later grant to the same waiter, and the
/// guard keeps the old message's token, below the token of the holder in between: a
/// fenced store refuses the key's holder. An evicted grant read after the attempt that
/// saw the next holder is held beside it.
#[test]
fn a_grant_honoured_after_a_busy_attempt_is_caught() {
    let [natural, forced] = stale_grants(Broken::GrantHonouredAfterBusy);
    counterexample(
        natural,
        "a grant honoured after a busy attempt, a lapse",
        "fencing tokens increase",
    );
    counterexample(
        forced,
        "a grant honoured after a busy attempt, force_unlock",
        "exclusion or fencing",
    );
}

/// Runs a variant until the named property fails; prints the counterexample.
fn counterexample(model: Protocol, label: &str, property: &'static str) {
    let started = Instant::now();
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    let path = checker.discovery(property);
    println!(
        "model, {label}: {} states, {:.1?}; \"{property}\" fails after {:?}",
        checker.unique_state_count(),
        started.elapsed(),
        path.as_ref().map(|path| path.clone().into_actions())
    );
    assert!(path.is_some(), "{label}: \"{property}\" holds");
}

#[test]
fn release_without_owner_check_is_caught() {
    counterexample(
        Protocol::two_clients(Broken::ReleaseWithoutOwnerCheck),
        "release without the owner check",
        "exclusion or fencing",
    );
}

#[test]
fn reservation_without_expiry_is_caught() {
    counterexample(
        Protocol::three_clients(Broken::ReservationWithoutExpiry),
        "a reservation without expiry",
        "reservation within grace",
    );
}

#[test]
fn a_reservation_taken_uncontended_is_caught() {
    counterexample(
        Protocol::three_clients(Broken::ReservationTakenUncontended),
        "a reservation taken without marking the lock contended",
        "no forgotten waiter",
    );
}

#[test]
fn no_retry_after_a_fresh_subscription_is_caught() {
    counterexample(
        Protocol::three_clients(Broken::NoRetryAfterSubscribe),
        "no retry after a fresh subscription",
        "no forgotten waiter",
    );
}

#[test]
fn server_clock_behind_after_a_restart_is_caught() {
    counterexample(
        Protocol::redis_restart(Broken::ClockBehindAfterRestart),
        "server clock behind after a restart",
        "exclusion or fencing",
    );
}

/// Clients asking for different leases (a fixed `lease` beside the watchdog's, or two
/// call sites): 3 ticks for some tasks, 1 for another; no pause (a crash still).
fn mixed_leases(announce_lease: bool) -> [Protocol; 2] {
    [
        Protocol {
            clients: vec![vec![3], vec![1], vec![3]],
            announce_lease,
            max_pauses: 0,
            ..Protocol::three_clients(Broken::None)
        },
        Protocol {
            clients: vec![vec![3, 1], vec![3]],
            announce_lease,
            max_pauses: 0,
            max_time: 7,
            ..Protocol::two_clients(Broken::None)
        },
    ]
}

/// A gap this model found in the protocol as it was (now fixed: the broken variant
/// keeps it checked). A waiter sleeps until the end of the lease it was told at its
/// last attempt (or a grace after `R:<another>`). When the key passed to a holder with
/// a *shorter* lease, nothing shortened that sleep: a reservation taken published `T`,
/// which cleared the fallback, and a hand-off inside a client published nothing. If
/// that holder then overran its lease (or its process died), the key was free while
/// the waiter slept on, up to the difference of the two leases (a watchdog lease of
/// 30 s beside a 1 s lease: 29 s), against guarantee 3.
#[test]
fn without_announcing_the_new_lease_a_waiter_sleeps_on_a_free_key() {
    let [reservation, hand_off] = mixed_leases(false);
    counterexample(
        reservation,
        "mixed leases, reservation taken",
        "no forgotten waiter",
    );
    counterexample(hand_off, "mixed leases, hand-off", "no forgotten waiter");
}

/// The fix the model suggested, now the protocol (`scripts::ACQUIRE`): `T:<ms>` with
/// the new holder's lease, also published by a hand-off's ACQUIRE; a waiter then
/// retries when that lease ends at the latest (as it does for `K:<ms>`).
#[test]
fn announcing_the_new_lease_keeps_waiters_awake() {
    let [reservation, hand_off] = mixed_leases(true);
    explore(reservation, "mixed leases announced, reservation").assert_properties();
    explore(hand_off, "mixed leases announced, hand-off").assert_properties();
}

/// A focused model of one part of the read-write lock that the model above, of the
/// exclusive lock alone, does not cover: a writer that leaves the line. Readers hold the
/// key in shares for longer than the horizon (the model's `share_lease`); a writer
/// waits, registered on the waitlist, so a reader arriving queues behind it (writer
/// preference); the writer then gives up (its wait ran out, or its acquisition was
/// dropped: LEAVE_WAITLIST runs) or is killed (its registration stays until it lapses).
///
/// The steps, each a script run atomically or a client's own step: the writer's
/// **attempt** (busy: registered until `now + min(ttl, refresh) + slack`, told to come
/// back at `now + min(ttl, refresh)`: `scripts::WRITER_REFRESH_MS`); **give up** and
/// **leave** (LEAVE_WAITLIST: the registration goes, and the readers in line are told
/// the key is free); **kill**; the reader's **arrival** and **attempt** (in while no
/// writer registration is live, else asleep until the shares end or the writer's
/// registration lapses, whichever is first, or until a message); **time passing**
/// (registrations lapse). Clients are prompt, as above: time does not pass while one
/// has a step due. Not modelled: several writers or readers in line, shares ending,
/// and the cut a reader makes to a registration made for a write lock's lease (a
/// writer queued behind a write lock, see `SHARED_ACQUIRE`): `tests/writer_leaves_line.rs`
/// checks that one against Redis.
///
/// Properties: **not held back by a writer that left** (always): once the writer left
/// the line, no tick passes with the reader still out; once it was killed, at most
/// `refresh + slack` ticks do. **Writer preference** (always): the reader never gets in
/// while a live writer is registered. Examples (sometimes): the reader held back by a
/// live writer; in after the writer left; in after it was killed. Each fix is needed:
/// without the message on leaving, with a writer told the shares' whole lease, or with
/// a reader that sleeps until the shares end, the first property fails.
mod a_writer_leaves_the_line {
    use std::time::Instant;

    use stateright::{Checker, HasDiscoveries, Model, Property};

    use super::Tick;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Broken {
        None,
        /// LEAVE_WAITLIST takes the registration off without telling the readers.
        NoWakeOnLeave,
        /// A writer waiting on readers is told their whole lease, and registered for it.
        WriterToldTheSharesLease,
        /// A reader held back by a writer sleeps until the shares end.
        ReaderSleepsUntilTheSharesEnd,
    }

    #[derive(Clone, Debug)]
    struct ReadWrite {
        refresh: Tick,
        slack: Tick,
        /// When the readers' shares end: past `max_time`, so the key stays held in shares.
        share_lease: Tick,
        max_time: Tick,
        broken: Broken,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Writer {
        /// Asleep until `wake` (then due to attempt); `registered` once it attempted.
        Waiting { wake: Tick, registered: bool },
        /// Gave up: its LEAVE_WAITLIST is on its way.
        Leaving,
        /// Left the line.
        Left,
        /// Killed: what it left in Redis stays until it lapses.
        Dead,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Reader {
        NotYet,
        Waiting {
            wake: Tick,
        },
        /// Woken (timer or message): due to attempt.
        Due,
        Holding,
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct State {
        clock: Tick,
        /// The writer's registration on the waitlist: when it lapses.
        registration: Option<Tick>,
        writer: Writer,
        reader: Reader,
        /// Consecutive ticks the reader spent out since the writer left the line or died.
        held_back: Tick,
        /// The reader got in while a live writer was registered.
        jumped: bool,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Action {
        WriterAttempts,
        GiveUp,
        Leave,
        Kill,
        ReaderArrives,
        ReaderAttempts,
        Tick,
    }

    impl ReadWrite {
        fn new(broken: Broken) -> Self {
            ReadWrite {
                refresh: 1,
                slack: 2,
                share_lease: 20,
                max_time: 8,
                broken,
            }
        }

        fn writer_due(&self, s: &State) -> bool {
            matches!(s.writer, Writer::Waiting { wake, .. } if wake <= s.clock)
                || s.writer == Writer::Leaving
        }

        /// A reader woken by its timer is due to attempt.
        fn settle(&self, s: &mut State) {
            if matches!(s.reader, Reader::Waiting { wake } if wake <= s.clock) {
                s.reader = Reader::Due;
            }
        }
    }

    impl Model for ReadWrite {
        type State = State;
        type Action = Action;

        fn init_states(&self) -> Vec<State> {
            vec![State {
                clock: 0,
                registration: None,
                writer: Writer::Waiting {
                    wake: 0,
                    registered: false,
                },
                reader: Reader::NotYet,
                held_back: 0,
                jumped: false,
            }]
        }

        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            if self.writer_due(s) {
                actions.push(if s.writer == Writer::Leaving {
                    Action::Leave
                } else {
                    Action::WriterAttempts
                });
            }
            if matches!(
                s.writer,
                Writer::Waiting {
                    registered: true,
                    ..
                }
            ) {
                actions.push(Action::GiveUp);
            }
            if matches!(s.writer, Writer::Waiting { .. } | Writer::Leaving) {
                actions.push(Action::Kill);
            }
            match s.reader {
                Reader::NotYet => actions.push(Action::ReaderArrives),
                Reader::Due => actions.push(Action::ReaderAttempts),
                _ => {}
            }
            let due = self.writer_due(s) || s.reader == Reader::Due;
            if !due && s.clock < self.max_time {
                actions.push(Action::Tick);
            }
        }

        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut s = last.clone();
            match action {
                Action::WriterAttempts => {
                    // Readers hold the key: busy.
                    let ttl = self.share_lease - s.clock;
                    let told = match self.broken {
                        Broken::WriterToldTheSharesLease => ttl,
                        _ => ttl.min(self.refresh),
                    };
                    s.registration = Some(s.clock + told + self.slack);
                    s.writer = Writer::Waiting {
                        wake: s.clock + told,
                        registered: true,
                    };
                }
                Action::GiveUp => s.writer = Writer::Leaving,
                Action::Leave => {
                    s.registration = None;
                    s.writer = Writer::Left;
                    if self.broken != Broken::NoWakeOnLeave
                        && matches!(s.reader, Reader::Waiting { .. })
                    {
                        s.reader = Reader::Due;
                    }
                }
                Action::Kill => s.writer = Writer::Dead,
                Action::ReaderArrives | Action::ReaderAttempts => match s.registration {
                    Some(lapse) => {
                        let wake = match self.broken {
                            Broken::ReaderSleepsUntilTheSharesEnd => self.share_lease,
                            _ => self.share_lease.min(lapse),
                        };
                        s.reader = Reader::Waiting { wake };
                    }
                    None => {
                        s.jumped |= matches!(
                            s.writer,
                            Writer::Waiting {
                                registered: true,
                                ..
                            }
                        );
                        s.reader = Reader::Holding;
                    }
                },
                Action::Tick => {
                    let out = matches!(s.reader, Reader::Waiting { .. } | Reader::Due);
                    let departed = matches!(s.writer, Writer::Left | Writer::Dead);
                    s.held_back = if out && departed { s.held_back + 1 } else { 0 };
                    s.clock += 1;
                    if s.registration.is_some_and(|lapse| lapse <= s.clock) {
                        s.registration = None;
                    }
                }
            }
            self.settle(&mut s);
            Some(s)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            vec![
                Property::always(
                    "not held back by a writer that left",
                    |m: &ReadWrite, s: &State| match s.writer {
                        Writer::Left => s.held_back == 0,
                        Writer::Dead => s.held_back <= m.refresh + m.slack,
                        _ => true,
                    },
                ),
                Property::always("writer preference", |_, s: &State| !s.jumped),
                Property::sometimes("held back by a live writer", |_, s: &State| {
                    matches!(s.reader, Reader::Waiting { .. })
                        && matches!(s.writer, Writer::Waiting { .. })
                }),
                Property::sometimes("in after the writer left", |_, s: &State| {
                    s.reader == Reader::Holding && s.writer == Writer::Left
                }),
                Property::sometimes("in after the writer was killed", |_, s: &State| {
                    s.reader == Reader::Holding && s.writer == Writer::Dead
                }),
            ]
        }
    }

    #[test]
    fn readers_get_in_when_the_writer_ahead_of_them_leaves_the_line() {
        let started = Instant::now();
        let checker = ReadWrite::new(Broken::None).checker().spawn_bfs().join();
        println!(
            "model, a writer leaves the line: {} states, {:.1?}",
            checker.unique_state_count(),
            started.elapsed()
        );
        checker.assert_properties();
    }

    #[test]
    fn a_writer_that_leaves_without_a_word_or_for_long_is_caught() {
        for broken in [
            Broken::NoWakeOnLeave,
            Broken::WriterToldTheSharesLease,
            Broken::ReaderSleepsUntilTheSharesEnd,
        ] {
            let property = "not held back by a writer that left";
            let checker = ReadWrite::new(broken)
                .checker()
                .finish_when(HasDiscoveries::AnyOf([property].into()))
                .spawn_bfs()
                .join();
            let path = checker.discovery(property);
            println!(
                "model, {broken:?}: \"{property}\" fails after {:?}",
                path.as_ref().map(|path| path.clone().into_actions())
            );
            assert!(path.is_some(), "{broken:?}: \"{property}\" holds");
        }
    }
}

/// A holder that cuts its lease short with `extend` and then dies (its process
/// crashes: nothing is released): two clients, a 3-tick lease cut to 1; and a client
/// with two tasks, so that the cut lease also reaches a task in line for the turn.
fn shortened_leases(announce_extend: bool) -> [Protocol; 2] {
    [
        Protocol {
            clients: vec![vec![3], vec![3]],
            extend_to: Some(1),
            announce_extend,
            max_pauses: 0,
            max_time: 6,
            ..Protocol::two_clients(Broken::None)
        },
        Protocol {
            clients: vec![vec![3, 3], vec![3]],
            extend_to: Some(1),
            announce_extend,
            max_pauses: 0,
            max_time: 6,
            ..Protocol::two_clients(Broken::None)
        },
    ]
}

/// Issue 24: a holder that shortened its lease with `extend` and died left the waiters
/// of other clients asleep until the end of the longer lease they had been told, on a
/// key that had expired (a 30 s lease cut to 300 ms: a waiter slept until its 12 s
/// deadline). The broken variant keeps that gap checked: its counterexample (attempt,
/// busy; extend; crash; tick) must be found.
#[test]
fn without_announcing_a_shortened_lease_a_waiter_sleeps_on_a_free_key() {
    let [two, in_line] = shortened_leases(false);
    counterexample(two, "extend unannounced", "no forgotten waiter");
    counterexample(
        in_line,
        "extend unannounced, a task in line",
        "no forgotten waiter",
    );
}

/// The fix (`scripts::EXTEND`): a lease that `extend` makes shorter than a contended
/// lock's remaining time to live is announced (`T:<ms>`); a waiter then retries when
/// it ends at the latest. (A task in line for its client's turn reads the holder's
/// lease anew when it changes: `LockState`, modelled by the eager `settle`.)
#[test]
fn announcing_a_shortened_lease_keeps_waiters_awake() {
    let [two, in_line] = shortened_leases(true);
    explore(two, "extend announced").assert_properties();
    explore(in_line, "extend announced, a task in line").assert_properties();
}

/// Issue 35: `LockClient::lock_all`, several keys locked as one. A focused model of the
/// order in which a caller takes its keys, over the single-key protocol's line and grant
/// as the model above states them (`Protocol::free_for_next`): each key has a holder and
/// a FIFO line (the waitlist); a release hands the key to the line's head (the grant),
/// who confirms it; a release with nobody in line deletes the key. A caller's keys are
/// deduplicated and sorted into the canonical order and taken one at a time, each with
/// the single-key protocol, holding the keys already taken; on a timeout it leaves the
/// line and releases every key it took.
///
/// The steps, each a script run atomically or a caller's own step: **attempt** on the
/// caller's next key (free: taken; busy: the caller joins the key's line, as ACQUIRE's
/// `ZADD NX` does in the same script); **confirm** a grant (the grantee reads the grant
/// message and its EXTEND with the owner check succeeds: it holds the key and goes on to
/// the next); **release** one key it holds (RELEASE, then FREE_FOR_NEXT: the key is
/// granted to the line's head, or deleted; a caller's releases run in any order);
/// **give up** (its `wait` ran out while in a line: LEAVE_WAITLIST, which passes a grant
/// made to it meanwhile on, then the releases of the keys it took). A caller that gave
/// up or released everything ends its call; a caller with more rounds starts again.
///
/// Abstracted away (the model above covers them for one key): time, leases and the
/// watchdog (no process pauses or crashes, so a holder keeps its keys as long as it
/// wants and every grant is confirmed within the grace, or passed on by its grantee's
/// LEAVE_WAITLIST; a lapsed grant and its check are not reached), subscriptions (every
/// waiter listens), hand-offs inside a client, fencing tokens. A timeout is a choice the
/// checker may make at any step of a caller's wait, at most once per call.
///
/// Properties: **exclusion** (always): no two callers believe they hold one key, and a
/// key a caller believes it holds is its own in Redis. **No deadlock** (always): in every
/// state where some call is not over, a step other than a timeout is enabled: the
/// callers get on without any of them giving up (a cycle of callers each holding a key
/// the next waits for would leave only timeouts). **All done** (eventually): every run
/// ends with every call over. Stateright checks `eventually` at the end of each path, and
/// misses paths that loop; this model has no loop (every step moves a caller on, and
/// rounds are bounded), so every path ends, and a path that ends with a call not over is
/// a deadlock without timeouts. **Overtaken at most once** (always; the setting with a
/// caller of one key that comes back, three rounds): from its first busy attempt for a
/// key until it gets it or gives up, a caller sees the others take that key at most once
/// (the caller ahead of it in line, if one was; the holder it found joins the line behind
/// it when it comes back), so however many times the caller of one key comes back, a
/// caller of two keys that holds the first and waits for the second is not overtaken
/// again, and gets it. Examples (sometimes): every call of two keys gets both keys; a
/// caller waits in a line while holding a key; a caller gives up holding a key; a caller
/// overtaken once; a caller takes every key in one step.
///
/// The one step (`ACQUIRE_ALL`, on one server or one Cluster slot) is a caller's other
/// first move: its keys in order up to the first that is not free, at once (all of them
/// when all are free); it goes on from there key by key. A free key has no line here as in Redis (a release with waiters grants),
/// so the properties hold with it.
///
/// Broken variants, each caught: keys taken in the caller's own order (the crossing
/// callers each hold one key and wait for the other: "no deadlock" fails, and without
/// timeouts "all done" too), and a release that deletes the key and wakes its whole line
/// to attempt again (no grant, no FIFO: "overtaken at most once" fails as the caller of
/// one key comes back ahead of the waiter).
mod several_keys {
    use std::time::Instant;

    use stateright::{Checker, HasDiscoveries, Model, Property};

    const EXCLUSION: &str = "exclusion";
    const NO_DEADLOCK: &str = "no deadlock";
    const ALL_DONE: &str = "all done";
    const OVERTAKEN_AT_MOST_ONCE: &str = "overtaken at most once";

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Broken {
        None,
        /// A caller takes its keys in the order it gave them, not the canonical one.
        CallersOrder,
        /// A release deletes the key and wakes every waiter in its line to attempt again
        /// (no grant: whoever attempts first takes the key).
        NoLine,
    }

    #[derive(Clone, Debug)]
    struct LockAll {
        /// Each caller's keys (0 and 1), in the order it asks for them, and its calls.
        callers: Vec<(Vec<u8>, u8)>,
        /// Callers may time out.
        give_ups: bool,
        broken: Broken,
    }

    /// One key in Redis.
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct Key {
        holder: Option<u8>,
        /// Granted to the holder by a release, not yet confirmed.
        granted: bool,
        /// The waitlist, first in line first.
        line: Vec<u8>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Phase {
        /// Its attempt on the `next`th key of its order is due.
        Attempt { next: u8 },
        /// In the line of the `next`th key, waiting for a grant.
        Waiting { next: u8 },
        /// Holds every key: the body runs; its releases may begin.
        Holding,
        /// Releasing the keys it holds (after the body, or after a timeout).
        Releasing,
        /// Every call is over.
        Done,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct Caller {
        /// Calls over so far.
        round: u8,
        phase: Phase,
        /// The keys it believes it holds (a bit per key).
        held: u8,
        /// Calls that got every key.
        got: u8,
        /// Since its first busy attempt for the key it is after: how many times another
        /// caller took that key.
        passed: Option<u8>,
        gave_up: bool,
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct State {
        keys: [Key; 2],
        callers: Vec<Caller>,
        /// A caller gave up while holding a key (an example).
        gave_up_holding: bool,
        /// A caller took every key in one step (an example).
        one_step: bool,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Action {
        Attempt(u8),
        /// `ACQUIRE_ALL`, before the caller's first attempt: its keys in order up to
        /// the first that is not free (all of them when all are free), at once; it
        /// goes on from there key by key. Nothing happens when the first is not free.
        AttemptAll(u8),
        Confirm(u8),
        Release(u8, u8),
        GiveUp(u8),
    }

    impl LockAll {
        /// Two callers of two keys in crossing orders, two calls each (a caller that
        /// gave up calls again).
        fn crossing(broken: Broken, give_ups: bool) -> Self {
            LockAll {
                callers: vec![(vec![0, 1], 2), (vec![1, 0], 2)],
                give_ups,
                broken,
            }
        }

        /// The crossing callers, and a caller of the second key alone that calls three
        /// times.
        fn with_a_caller_of_one_key(broken: Broken) -> Self {
            LockAll {
                callers: vec![(vec![0, 1], 1), (vec![1, 0], 1), (vec![1], 3)],
                give_ups: true,
                broken,
            }
        }

        /// The order caller `c` takes its keys in: deduplicated and sorted, as `lock_all`
        /// does, or as given in the broken variant.
        fn order(&self, c: u8) -> Vec<u8> {
            let mut keys = self.callers[c as usize].0.clone();
            if self.broken != Broken::CallersOrder {
                keys.sort_unstable();
                keys.dedup();
            }
            keys
        }

        /// The key caller `c` is after, if it is taking its keys.
        fn after(&self, s: &State, c: u8) -> Option<u8> {
            match s.callers[c as usize].phase {
                Phase::Attempt { next } | Phase::Waiting { next } => {
                    Some(self.order(c)[next as usize])
                }
                _ => None,
            }
        }

        /// Caller `c` acquires key `k` (by its attempt, or a grant made to it): every
        /// other caller refused `k` before, and still after it, is passed once more.
        fn acquired(&self, s: &mut State, c: u8, k: u8) {
            for other in 0..s.callers.len() as u8 {
                if other != c && self.after(s, other) == Some(k) {
                    let passed = &mut s.callers[other as usize].passed;
                    *passed = passed.map(|n| n + 1);
                }
            }
        }

        /// RELEASE of key `k` by its holder, then FREE_FOR_NEXT: grant the key to the
        /// line's head, or delete it. (`Broken::NoLine`: delete it and wake the line.)
        fn free_for_next(&self, s: &mut State, k: u8) {
            let key = &mut s.keys[k as usize];
            key.holder = None;
            key.granted = false;
            if self.broken == Broken::NoLine {
                for c in std::mem::take(&mut key.line) {
                    if let Phase::Waiting { next } = s.callers[c as usize].phase {
                        s.callers[c as usize].phase = Phase::Attempt { next };
                    }
                }
            } else if !key.line.is_empty() {
                let head = key.line.remove(0);
                key.holder = Some(head);
                key.granted = true;
                self.acquired(s, head, k);
            }
        }

        /// Caller `c` got the `next`th key of its order: on to the following one, or
        /// the body.
        fn took(&self, s: &mut State, c: u8, next: u8, k: u8) {
            let keys = self.order(c).len() as u8;
            let caller = &mut s.callers[c as usize];
            caller.held |= 1 << k;
            caller.passed = None;
            caller.phase = if next + 1 < keys {
                Phase::Attempt { next: next + 1 }
            } else {
                caller.got += 1;
                Phase::Holding
            };
        }

        /// Caller `c` holds nothing more: its call is over.
        fn end_call(&self, s: &mut State, c: u8) {
            let rounds = self.callers[c as usize].1;
            let caller = &mut s.callers[c as usize];
            caller.round += 1;
            caller.passed = None;
            caller.phase = if caller.round < rounds {
                Phase::Attempt { next: 0 }
            } else {
                Phase::Done
            };
        }

        fn all_done(s: &State) -> bool {
            s.callers.iter().all(|caller| caller.phase == Phase::Done)
        }
    }

    impl Model for LockAll {
        type State = State;
        type Action = Action;

        fn init_states(&self) -> Vec<State> {
            let key = Key {
                holder: None,
                granted: false,
                line: Vec::new(),
            };
            let caller = Caller {
                round: 0,
                phase: Phase::Attempt { next: 0 },
                held: 0,
                got: 0,
                passed: None,
                gave_up: false,
            };
            vec![State {
                keys: [key.clone(), key],
                callers: vec![caller; self.callers.len()],
                gave_up_holding: false,
                one_step: false,
            }]
        }

        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            for (c, caller) in s.callers.iter().enumerate() {
                let c = c as u8;
                match caller.phase {
                    Phase::Attempt { next } => {
                        actions.push(Action::Attempt(c));
                        if next == 0 && self.order(c).len() > 1 {
                            actions.push(Action::AttemptAll(c));
                        }
                    }
                    Phase::Waiting { next } => {
                        let key = &s.keys[self.order(c)[next as usize] as usize];
                        if key.holder == Some(c) {
                            actions.push(Action::Confirm(c));
                        }
                        if self.give_ups {
                            actions.push(Action::GiveUp(c));
                        }
                    }
                    Phase::Holding | Phase::Releasing => {
                        for k in 0..2 {
                            if caller.held & (1 << k) != 0 {
                                actions.push(Action::Release(c, k));
                            }
                        }
                    }
                    Phase::Done => {}
                }
            }
        }

        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut s = last.clone();
            match action {
                Action::Attempt(c) => {
                    let Phase::Attempt { next } = s.callers[c as usize].phase else {
                        unreachable!()
                    };
                    let k = self.order(c)[next as usize];
                    let key = &mut s.keys[k as usize];
                    if key.holder.is_none() {
                        key.holder = Some(c);
                        self.acquired(&mut s, c, k);
                        self.took(&mut s, c, next, k);
                    } else {
                        key.line.push(c);
                        let caller = &mut s.callers[c as usize];
                        caller.passed.get_or_insert(0);
                        caller.phase = Phase::Waiting { next };
                    }
                }
                Action::AttemptAll(c) => {
                    let order = self.order(c);
                    let free = order
                        .iter()
                        .take_while(|&&k| s.keys[k as usize].holder.is_none())
                        .count();
                    if free == 0 {
                        return None;
                    }
                    for (next, &k) in order.iter().enumerate().take(free) {
                        s.keys[k as usize].holder = Some(c);
                        self.acquired(&mut s, c, k);
                        self.took(&mut s, c, next as u8, k);
                    }
                    s.one_step |= free == order.len();
                }
                Action::Confirm(c) => {
                    let Phase::Waiting { next } = s.callers[c as usize].phase else {
                        unreachable!()
                    };
                    let k = self.order(c)[next as usize];
                    s.keys[k as usize].granted = false;
                    self.took(&mut s, c, next, k);
                }
                Action::Release(c, k) => {
                    let caller = &mut s.callers[c as usize];
                    caller.held &= !(1 << k);
                    caller.phase = Phase::Releasing;
                    let held = caller.held;
                    if s.keys[k as usize].holder == Some(c) {
                        self.free_for_next(&mut s, k);
                    }
                    if held == 0 {
                        self.end_call(&mut s, c);
                    }
                }
                Action::GiveUp(c) => {
                    let Phase::Waiting { next } = s.callers[c as usize].phase else {
                        unreachable!()
                    };
                    // LEAVE_WAITLIST: out of the line, and a grant made meanwhile passed on.
                    let k = self.order(c)[next as usize];
                    s.keys[k as usize].line.retain(|&waiter| waiter != c);
                    if s.keys[k as usize].holder == Some(c) {
                        self.free_for_next(&mut s, k);
                    }
                    let caller = &mut s.callers[c as usize];
                    caller.gave_up = true;
                    caller.passed = None;
                    s.gave_up_holding |= caller.held != 0;
                    if caller.held == 0 {
                        self.end_call(&mut s, c);
                    } else {
                        caller.phase = Phase::Releasing;
                    }
                }
            }
            Some(s)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            vec![
                Property::always(EXCLUSION, |_, s: &State| {
                    let mut seen = 0;
                    for (c, caller) in s.callers.iter().enumerate() {
                        if seen & caller.held != 0 {
                            return false;
                        }
                        seen |= caller.held;
                        for (k, key) in s.keys.iter().enumerate() {
                            if caller.held & (1 << k) != 0 && key.holder != Some(c as u8) {
                                return false;
                            }
                        }
                    }
                    true
                }),
                Property::always(NO_DEADLOCK, |m: &LockAll, s: &State| {
                    let mut actions = Vec::new();
                    m.actions(s, &mut actions);
                    LockAll::all_done(s)
                        || actions
                            .iter()
                            .any(|action| !matches!(action, Action::GiveUp(_)))
                }),
                Property::eventually(ALL_DONE, |_, s: &State| LockAll::all_done(s)),
                Property::always(OVERTAKEN_AT_MOST_ONCE, |_, s: &State| {
                    s.callers
                        .iter()
                        .all(|caller| caller.passed.unwrap_or(0) <= 1)
                }),
                Property::sometimes("every call of two keys gets both", |m, s: &State| {
                    (0..m.callers.len())
                        .all(|c| m.callers[c].0.len() < 2 || s.callers[c].got == m.callers[c].1)
                }),
                Property::sometimes("waits in a line holding a key", |_, s: &State| {
                    s.callers.iter().any(|caller| {
                        matches!(caller.phase, Phase::Waiting { .. }) && caller.held != 0
                    })
                }),
                Property::sometimes("takes every key in one step", |_, s: &State| s.one_step),
                Property::sometimes("gives up holding a key", |m: &LockAll, s: &State| {
                    s.gave_up_holding || !m.give_ups
                }),
                Property::sometimes("overtaken once", |m: &LockAll, s: &State| {
                    s.callers.iter().any(|caller| caller.passed == Some(1)) || m.callers.len() < 3
                }),
            ]
        }
    }

    /// Explores every state; prints the count, and asserts every property.
    fn holds(model: LockAll, label: &str) {
        let started = Instant::now();
        let checker = model.checker().spawn_bfs().join();
        println!(
            "model, {label}: {} states ({} unique), depth {}, {:.1?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        checker.assert_properties();
    }

    /// Runs a broken variant until `property` fails; prints the counterexample, a
    /// shortest one: the checker keeps the last discovery it makes in a block of states,
    /// so the depth is raised a step at a time until one is found.
    fn fails(model: LockAll, label: &str, property: &'static str) {
        let started = Instant::now();
        for depth in 1..=64 {
            let checker = model
                .clone()
                .checker()
                .target_max_depth(depth)
                .finish_when(HasDiscoveries::AnyOf([property].into()))
                .spawn_bfs()
                .join();
            if let Some(path) = checker.discovery(property) {
                let actions = path.into_actions();
                println!(
                    "model, {label}: {} states, {:.1?}; \"{property}\" fails after {} steps: \
                     {actions:?}",
                    checker.unique_state_count(),
                    started.elapsed(),
                    actions.len()
                );
                return;
            }
        }
        panic!("{label}: \"{property}\" holds");
    }

    #[test]
    fn crossing_callers_of_two_keys_never_deadlock_in_canonical_order() {
        holds(
            LockAll::crossing(Broken::None, true),
            "lock_all, crossing callers",
        );
    }

    #[test]
    fn callers_taking_keys_in_their_own_order_deadlock() {
        fails(
            LockAll::crossing(Broken::CallersOrder, true),
            "lock_all in the callers' order",
            NO_DEADLOCK,
        );
        // Without timeouts, the deadlock is where a run ends.
        fails(
            LockAll::crossing(Broken::CallersOrder, false),
            "lock_all in the callers' order, no timeouts",
            ALL_DONE,
        );
    }

    #[test]
    fn a_caller_of_two_keys_is_not_overtaken_forever() {
        holds(
            LockAll::with_a_caller_of_one_key(Broken::None),
            "lock_all, a caller of one key comes back",
        );
        fails(
            LockAll::with_a_caller_of_one_key(Broken::NoLine),
            "lock_all, a release that wakes the whole line",
            OVERTAKEN_AT_MOST_ONCE,
        );
    }
}
