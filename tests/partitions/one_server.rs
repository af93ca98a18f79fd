//! Scenario 1: one server, its holder cut off from it while holding.
//!
//! Holder A takes the key, writes the store, and is cut off from Redis (not from the
//! store: the dangerous case, a holder that can still reach the database). Client B,
//! on the other side, waits for the key. A's guard must say lost within the lease; B
//! must get the key only after the lease; A's late write through the fenced-write
//! helper must be refused; after healing, A's release must be `Lost` and leave B's
//! hold alone.

use std::time::Duration;

use crate::child::{ClientSpec, Role};
use crate::clock;
use crate::fixture::Fixture;
use crate::history::{self, Bounds, History, Hold, Outcome};

const KEY: &str = "cut-off";

fn holds_of(history: &History, pid: u32) -> Vec<&Hold> {
    history.holds.iter().filter(|h| h.id.proc == pid).collect()
}

fn holder_cut_off_while_holding(lease: Option<Duration>) {
    let Some(mut fixture) = Fixture::new(&["redis", "a", "b"]) else {
        return;
    };
    fixture.start_redis("redis", &[]);
    let mut spec = ClientSpec::new(
        Role::Holder,
        &fixture.net.url("redis"),
        &fixture.store_url(),
        fixture.dir(),
        KEY,
    );
    spec.lease = lease;
    spec.watchdog_lease = Duration::from_millis(1500);
    cut_off_while_holding(&fixture, &spec, ("a", "b"), "redis", "one server");
}

/// Holder A (on host `a`) takes the key through `spec`, is cut off from host
/// `server` (the Redis server holding the key) while holding; B (on host `b`) waits
/// for it. Then A writes late, the network heals, A releases, B releases, and a probe
/// takes the key once more.
pub fn cut_off_while_holding(
    fixture: &Fixture,
    spec: &ClientSpec,
    (a_host, b_host): (&str, &str),
    server: &str,
    what: &str,
) {
    let lease = spec.lease;
    let a = spec.spawn(&fixture.net, a_host);
    let a_pid = a.child.id();
    fixture.wait_for_history("A to hold and write", Duration::from_secs(20), |history| {
        holds_of(history, a_pid)
            .first()
            .is_some_and(|hold| !hold.writes.is_empty())
    });

    fixture.net.cut(a_host, server);
    let cut_at = clock::now();
    let b = spec.spawn(&fixture.net, b_host);
    let b_pid = b.child.id();
    fixture.wait_for_history("B to hold and write", Duration::from_secs(20), |history| {
        holds_of(history, b_pid)
            .first()
            .is_some_and(|hold| !hold.writes.is_empty())
    });
    // A, still cut off from Redis but not from the store, writes late.
    fixture.tell(a_pid, "late-write");
    fixture.wait_for_history("A's late write", Duration::from_secs(10), |history| {
        holds_of(history, a_pid)
            .first()
            .is_some_and(|hold| hold.writes.len() == 2)
    });
    // Healed, A releases while B still holds: its release must be `Lost`, and harmless.
    fixture.net.heal();
    fixture.tell(a_pid, "release");
    fixture.tell(b_pid, "late-write");
    fixture.tell(b_pid, "release");
    fixture.tell(b_pid, "retake");
    b.join("holder B", Duration::from_secs(20));
    // Then A's own client takes the key once more.
    fixture.tell(a_pid, "retake");
    a.join("holder A", Duration::from_secs(20));
    // After healing, the key can be taken again.
    fixture.take_from(spec, a_host, spec.wait, Duration::from_secs(20));

    let history = fixture.history();
    let bounds = Bounds::default();
    let summary = history::assert_valid(&history, &bounds);
    let a_hold = holds_of(&history, a_pid)[0].clone();
    let b_hold = holds_of(&history, b_pid)[0].clone();
    let lease_ns = a_hold.lease.expect("the history records the lease");
    let lost_at = a_hold.lost_at.expect("A's guard said its lock was lost");
    eprintln!(
        "{what}, {}: {summary:?}; A's guard said lost {:?} after its acquisition \
         ({:?} after the cut), B acquired {:?} after A, {:?} after A's guard said lost",
        if lease.is_some() {
            "fixed lease"
        } else {
            "watchdog"
        },
        clock::span(a_hold.t_acq, lost_at),
        clock::span(cut_at, lost_at),
        clock::span(a_hold.t_acq, b_hold.t_acq),
        Duration::from_nanos(b_hold.t_acq.saturating_sub(lost_at)),
    );
    // Lost within the lease (counted from before A asked).
    assert!(
        lost_at <= a_hold.t_req + lease_ns + clock::nanos(bounds.lost_slack),
        "A's guard said lost only {:?} after it asked, past its lease of {:?}",
        clock::span(a_hold.t_req, lost_at),
        Duration::from_nanos(lease_ns)
    );
    // B only after the lease (the checker's overlap rule says so too).
    assert!(
        b_hold.t_acq + clock::nanos(bounds.expiry_slack) >= a_hold.t_req + lease_ns,
        "B acquired {:?} before A's lease could have run out",
        clock::span(b_hold.t_acq, a_hold.t_req + lease_ns)
    );
    assert!(b_hold.token > a_hold.token, "B's token is not above A's");
    assert!(a_hold.writes[0].accepted, "A's first write was refused");
    assert!(b_hold.writes[0].accepted, "B's first write was refused");
    assert!(
        !a_hold.writes[1].accepted,
        "A's late write, after B wrote, was accepted"
    );
    let a_release = a_hold.release.expect("A released");
    assert_eq!(
        a_release.outcome,
        Outcome::Lost,
        "A's release after healing"
    );
    assert!(a_release.lost_before, "A's guard did not know it was lost");
    assert_eq!(
        b_hold.release.expect("B released").outcome,
        Outcome::Released,
        "A's release disturbed B's hold"
    );
    assert!(b_hold.writes[1].accepted, "B's second write was refused");
    // A's client works again after the heal: it takes the free key at once (old code,
    // watchdog mode: its commands timed out on the connection the partition had left
    // stuck).
    let a_again = holds_of(&history, a_pid)
        .get(1)
        .map(|hold| (*hold).clone())
        .expect("A's client took the key again after the heal");
    assert!(
        clock::span(a_again.t_req, a_again.t_acq) < Duration::from_secs(1),
        "A's client took {:?} to take the free key after the heal",
        clock::span(a_again.t_req, a_again.t_acq)
    );
    // Nothing but the fencing counter is left.
    fixture.assert_only_keys(server, &["redlock:fence"], Duration::from_secs(10));
}

#[test]
fn a_holder_cut_off_with_a_fixed_lease_loses_it_and_is_fenced_off() {
    holder_cut_off_while_holding(Some(Duration::from_millis(1500)));
}

#[test]
fn a_holder_cut_off_in_watchdog_mode_loses_it_and_is_fenced_off() {
    holder_cut_off_while_holding(None);
}
