//! Scenario 5: a flapping link during a contended run across processes.
//!
//! Three client processes (two tasks each) take one key over and over; the link
//! between one of them and Redis goes down and up every 100 ms for four seconds, then
//! stays up (its link to the store stays up: the store is the database the lock
//! protects, and this scenario is about the lock). Every
//! `acquire` must return within its `wait` plus the response timeout (and a margin
//! for a loaded machine); after healing, no waiter may sleep on a free key (the key
//! passes from one holder to the next without a pause of a lease) and the key can be
//! taken at once; once the clients are gone, nothing but the fencing counter is left
//! in Redis (no waitlist entry, no reservation).

use std::time::{Duration, Instant};

use crate::child::{ClientSpec, Role};
use crate::clock;
use crate::fixture::Fixture;
use crate::history::{self, AttemptResult, Bounds, Hold};

const KEY: &str = "flapping";

#[test]
fn a_flapping_link_keeps_every_wait_bounded_and_leaves_nothing_behind() {
    let Some(mut fixture) = Fixture::new(&["redis", "c1", "c2", "flapper"]) else {
        return;
    };
    fixture.start_redis("redis", &[]);
    let lease = Duration::from_secs(1);
    let response_timeout = Duration::from_millis(500);
    let flap_for = Duration::from_secs(4);
    let mut spec = ClientSpec::new(
        Role::Contender,
        &fixture.net.url("redis"),
        &fixture.store_url(),
        fixture.dir(),
        KEY,
    );
    spec.tasks = 2;
    spec.lease = Some(lease);
    spec.wait = Duration::from_secs(2);
    spec.response_timeout = response_timeout;
    spec.hold = Duration::from_millis(10);
    spec.run_for = Duration::from_secs(8);
    let clients: Vec<_> = ["c1", "c2", "flapper"]
        .iter()
        .map(|host| spec.spawn(&fixture.net, host))
        .collect();
    let flapper_pid = clients[2].child.id();
    fixture.wait_for_history("the first holds", Duration::from_secs(20), |history| {
        history.holds.len() >= 3
    });

    let flap_start = clock::now();
    let started = Instant::now();
    let mut flaps = 0;
    while started.elapsed() < flap_for {
        fixture.net.cut("flapper", "redis");
        std::thread::sleep(Duration::from_millis(100));
        fixture.net.mend("flapper", "redis");
        std::thread::sleep(Duration::from_millis(100));
        flaps += 1;
    }
    fixture.net.heal();
    let healed_at = clock::now();
    for (index, client) in clients.into_iter().enumerate() {
        client.join(&format!("contender {index}"), Duration::from_secs(40));
    }
    // The key is free and can be taken at once.
    fixture.take_from(
        &spec,
        "flapper",
        Duration::from_secs(5),
        Duration::from_secs(20),
    );

    let history = fixture.history();
    let bounds = Bounds {
        // Redis's answer to the last attempt may take the response timeout.
        wait_overshoot: response_timeout + Duration::from_secs(1),
        ..Bounds::default()
    };
    let summary = history::assert_valid(&history, &bounds);
    let errors: Vec<String> = history
        .attempts
        .iter()
        .filter_map(|attempt| match &attempt.result {
            AttemptResult::Error(kind) => Some(kind.clone()),
            _ => None,
        })
        .collect();
    let during = history
        .holds
        .iter()
        .filter(|hold| hold.t_acq >= flap_start && hold.t_acq <= healed_at)
        .count();

    // After healing (and the lease of any hold the flapping cost), the key goes from
    // one holder to the next without a pause: a waiter left asleep on a free key
    // would leave a gap of a lease or more.
    let settled = healed_at + clock::nanos(lease + Duration::from_millis(500));
    let mut after: Vec<&Hold> = history
        .holds
        .iter()
        .filter(|hold| hold.t_req >= settled)
        .collect();
    after.sort_by_key(|hold| hold.t_acq);
    let worst_gap = after
        .windows(2)
        .filter_map(|pair| {
            let end = pair[0].release?.t_end;
            Some(clock::span(end, pair[1].t_acq))
        })
        .max()
        .unwrap_or_default();
    let flapper_holds = history
        .holds
        .iter()
        .filter(|hold| hold.id.proc == flapper_pid)
        .count();
    eprintln!(
        "flapping link: {summary:?}; the flapping client held {flapper_holds} times; {flaps} flaps over {:?}, {during} holds during them, \
         {} after settling, longest pause between holders after healing {worst_gap:?}; \
         errors {errors:?}",
        clock::span(flap_start, healed_at),
        after.len(),
    );
    assert!(
        after.len() >= 5,
        "only {} holds after healing: the clients did not resume",
        after.len()
    );
    assert!(
        worst_gap < lease,
        "a free key waited {worst_gap:?} for its next holder after healing"
    );
    // No waitlist entry, no reservation, no lock: only the counter, once the
    // registrations of waiters that gave up while cut off have expired.
    fixture.assert_only_keys("redis", &["redlock:fence"], Duration::from_secs(15));
}
