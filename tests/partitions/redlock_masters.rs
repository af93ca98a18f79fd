//! Scenario 2: RedLock over five independent masters, partitioned.
//!
//! - a client partitioned with a minority of masters gets `NoQuorum` (within its
//!   `wait` and a response timeout) while a client on the majority side acquires;
//! - a "bridge": two clients each see three masters, sharing one: at most one holds;
//! - a partition that moves every 700 ms during a contended run of three clients.
//!
//! In each, the history of every hold is checked (no overlap unless the earlier lease
//! ran out and its guard said lost; tokens increasing), and after healing the key can
//! be taken from either side and the masters keep nothing but the fencing counter and
//! the restart marker.

use std::time::{Duration, Instant};

use crate::child::{ClientSpec, Role};
use crate::clock;
use crate::fixture::Fixture;
use crate::history::{self, AttemptResult, Bounds, History, Summary};

const MASTERS: [&str; 5] = ["m1", "m2", "m3", "m4", "m5"];
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// Five masters (vouched for: they hold no lock from before) and `clients` hosts.
fn five_masters(clients: &[&str]) -> Option<(Fixture, ClientSpec)> {
    let mut hosts: Vec<&str> = MASTERS.to_vec();
    hosts.extend_from_slice(clients);
    let mut fixture = Fixture::new(&hosts)?;
    for master in MASTERS {
        fixture.start_redis(master, &[]);
        // As `RedisServer::vouch_for_its_data` does: a deployment past its first
        // `max_lease`, so that the masters vote at once.
        let info = fixture.net.cli(master, 7000, &["INFO", "server"]);
        let run_id = info
            .lines()
            .find_map(|line| line.trim().strip_prefix("run_id:"))
            .expect("INFO server names the run_id")
            .to_owned();
        let marker = format!("{run_id}:0:vouched");
        assert_eq!(
            fixture
                .net
                .cli(master, 7000, &["SET", "redlock:boot", &marker]),
            "OK"
        );
    }
    let urls: Vec<String> = MASTERS.iter().map(|m| fixture.net.url(m)).collect();
    let mut spec = ClientSpec::new(
        Role::Contender,
        &urls.join(","),
        &fixture.store_url(),
        fixture.dir(),
        "redlock-split",
    );
    spec.lease = Some(Duration::from_secs(1));
    spec.wait = Duration::from_secs(1);
    spec.response_timeout = RESPONSE_TIMEOUT;
    spec.max_lease = Duration::from_secs(2);
    spec.hold = Duration::from_millis(20);
    Some((fixture, spec))
}

fn bounds() -> Bounds {
    Bounds {
        // The last round over the masters may wait a response timeout.
        wait_overshoot: RESPONSE_TIMEOUT + Duration::from_secs(1),
        ..Bounds::default()
    }
}

/// After healing: the key can be taken from every client host, and the masters keep
/// only the counter and the marker.
fn after_healing(fixture: &Fixture, spec: &ClientSpec, clients: &[&str]) -> (History, Summary) {
    for host in clients {
        fixture.take_from(spec, host, Duration::from_secs(3), Duration::from_secs(20));
    }
    let history = fixture.history();
    let summary = history::assert_valid(&history, &bounds());
    for master in MASTERS {
        fixture.assert_only_keys(
            master,
            &["redlock:fence", "redlock:boot"],
            Duration::from_secs(10),
        );
    }
    (history, summary)
}

/// The attempts of process `pid` made within `[from, to]` (asked for and answered),
/// by result, and the longest of them.
fn results_of(history: &History, pid: u32, from: u64, to: u64) -> (Vec<AttemptResult>, Duration) {
    let within: Vec<_> = history
        .attempts
        .iter()
        .filter(|attempt| attempt.id.proc == pid && attempt.t_req >= from && attempt.t_ret <= to)
        .collect();
    let longest = within
        .iter()
        .map(|attempt| clock::span(attempt.t_req, attempt.t_ret))
        .max()
        .unwrap_or_default();
    (
        within
            .iter()
            .map(|attempt| attempt.result.clone())
            .collect(),
        longest,
    )
}

fn holds_of(history: &History, pid: u32, from: u64, to: u64) -> usize {
    history
        .holds
        .iter()
        .filter(|hold| hold.id.proc == pid && hold.t_acq >= from && hold.t_acq <= to)
        .count()
}

#[test]
fn a_client_with_a_minority_of_masters_gets_no_quorum_while_the_majority_side_acquires() {
    let Some((fixture, mut spec)) = five_masters(&["a", "b"]) else {
        return;
    };
    spec.run_for = Duration::from_secs(5);
    let a = spec.spawn(&fixture.net, "a");
    let b = spec.spawn(&fixture.net, "b");
    let (a_pid, b_pid) = (a.child.id(), b.child.id());
    fixture.wait_for_history("both sides to hold once", Duration::from_secs(20), |h| {
        holds_of(h, a_pid, 0, u64::MAX) > 0 && holds_of(h, b_pid, 0, u64::MAX) > 0
    });
    // A with m1 and m2; B with m3, m4 and m5.
    fixture.net.split(&["a"], &["m3", "m4", "m5"]);
    fixture.net.split(&["b"], &["m1", "m2"]);
    let cut_at = clock::now();
    std::thread::sleep(Duration::from_secs(3));
    fixture.net.heal();
    let healed_at = clock::now();
    a.join("client A", Duration::from_secs(30));
    b.join("client B", Duration::from_secs(30));
    let (history, summary) = after_healing(&fixture, &spec, &["a", "b"]);

    // A's attempts begun once A's lease could no longer be running: all refused.
    let settled = cut_at + clock::nanos(Duration::from_secs(1));
    let (a_results, longest) = results_of(&history, a_pid, settled, healed_at);
    let a_holds = holds_of(&history, a_pid, settled, healed_at);
    let b_holds = holds_of(&history, b_pid, settled, healed_at);
    eprintln!(
        "redlock minority/majority: {summary:?}; during the partition A (2 masters) made \
         {} attempts: {a_results:?} (the longest took {longest:?}, its wait {:?}), held \
         {a_holds} times; B (3 masters) held {b_holds} times",
        a_results.len(),
        spec.wait
    );
    assert_eq!(a_holds, 0, "the minority side acquired");
    assert!(
        !a_results.is_empty()
            && a_results
                .iter()
                .all(|r| *r == AttemptResult::Error("NoQuorum".into())),
        "the minority side's attempts: {a_results:?}"
    );
    assert!(b_holds > 0, "the majority side never acquired");
}

#[test]
fn two_clients_bridged_by_one_master_never_hold_together() {
    let Some((fixture, mut spec)) = five_masters(&["a", "b"]) else {
        return;
    };
    spec.run_for = Duration::from_secs(5);
    spec.tasks = 2;
    // A sees m1, m2, m3; B sees m3, m4, m5: each a majority, sharing m3.
    fixture.net.split(&["a"], &["m4", "m5"]);
    fixture.net.split(&["b"], &["m1", "m2"]);
    let cut_at = clock::now();
    let a = spec.spawn(&fixture.net, "a");
    let b = spec.spawn(&fixture.net, "b");
    let (a_pid, b_pid) = (a.child.id(), b.child.id());
    a.join("client A", Duration::from_secs(30));
    b.join("client B", Duration::from_secs(30));
    let healed_at = clock::now();
    fixture.net.heal();
    let (history, summary) = after_healing(&fixture, &spec, &["a", "b"]);
    let a_holds = holds_of(&history, a_pid, cut_at, healed_at);
    let b_holds = holds_of(&history, b_pid, cut_at, healed_at);
    eprintln!(
        "redlock bridge: {summary:?}; A (m1-m3) held {a_holds} times, B (m3-m5) {b_holds} times"
    );
    assert!(
        a_holds + b_holds > 0,
        "neither side of the bridge ever acquired"
    );
}

#[test]
fn a_partition_moving_during_a_contended_run_leaves_a_clean_history() {
    let clients = ["a", "b", "c"];
    let Some((fixture, mut spec)) = five_masters(&clients) else {
        return;
    };
    spec.run_for = Duration::from_secs(7);
    spec.tasks = 2;
    let processes: Vec<_> = clients
        .iter()
        .map(|host| spec.spawn(&fixture.net, host))
        .collect();
    fixture.wait_for_history("the first holds", Duration::from_secs(20), |h| {
        h.holds.len() >= 3
    });
    // Each configuration in turn, 700 ms each: a minority cut off, a bridge, a client
    // alone with two masters, the masters split 2/3 across all clients.
    let configurations: [&[(&[&str], &[&str])]; 4] = [
        &[(&["a"], &["m3", "m4", "m5"])],
        &[(&["a"], &["m4", "m5"]), (&["b"], &["m1", "m2"])],
        &[(&["c"], &["m1", "m2", "m3"]), (&["b"], &["m5"])],
        &[(&["a", "b"], &["m1", "m2"]), (&["c"], &["m3", "m4", "m5"])],
    ];
    let started = Instant::now();
    let mut moves = 0;
    while started.elapsed() < Duration::from_secs(4) {
        let configuration = configurations[moves % configurations.len()];
        fixture.net.heal();
        for (left, right) in configuration {
            fixture.net.split(left, right);
        }
        moves += 1;
        std::thread::sleep(Duration::from_millis(700));
    }
    fixture.net.heal();
    for (index, process) in processes.into_iter().enumerate() {
        process.join(&format!("client {index}"), Duration::from_secs(30));
    }
    let (history, summary) = after_healing(&fixture, &spec, &clients);
    let no_quorum = history
        .attempts
        .iter()
        .filter(|a| a.result == AttemptResult::Error("NoQuorum".into()))
        .count();
    eprintln!(
        "redlock moving partition: {summary:?}; {moves} moves, {no_quorum} attempts refused \
         with NoQuorum"
    );
}
