//! A model check of RedLock's restart quarantine (`LockClient::redlock` with
//! `max_lease`), with [`stateright`].
//!
//! # What is modelled
//! Three masters, two client processes (A and B), one lock key, and discrete time:
//! `max_lease` is 3 ticks and each acquisition asks for a lease of 2 or 3. Each master
//! runs a Redis process, named by an id that changes at every restart, and holds the
//! lock value (owner, expiry) and the restart marker (`scripts::BOOT_KEY`: the process
//! it names, and since when its quarantine runs; "since 0" for a deployment an operator
//! declared fresh, which votes at once). The steps:
//! - **attempt**: a client that holds nothing sends the ACQUIRE script to every master
//!   that is up. On each master, atomically: a marker that is missing or names another
//!   process is rewritten as `(this process, since now)`; the master is *quarantined*
//!   (its grant does not count) while `now − since ≤ max_lease`; then `SET NX` with the
//!   lease. The client wins with a majority of all the masters among the grants of the
//!   masters that vote (`Tally::decision`), and then believes it holds the key until
//!   its lease ends; a loser undoes its grants;
//! - **release**: the holder deletes its lock wherever it is still its own;
//! - **a master stops** (never more than one down at once, by default: a rolling
//!   restart) and **starts again**: a new process, with no data at all (no
//!   persistence: lock and marker lost), or from a stale snapshot (the marker as it
//!   was, naming the previous process, but not the lock);
//! - **time passing**: a lock expires on its master, and its holder stops believing,
//!   at the tick its lease ends.
//!
//! Initially the masters are already in use: each marker names its current process
//! and votes (since 0), and nobody holds the key. The restarts (3 in all) may hit any
//! master in any order, between or during any lock traffic.
//!
//! # What is abstracted away
//! - The network, and the time an acquisition takes: an attempt reaches every master
//!   that is up at once, each answers, and the client decides in the same instant, so
//!   the validity (`lease − elapsed − drift`) is the whole lease; clocks do not drift.
//!   Two attempts whose scripts interleave on different masters split the grants and
//!   both lose: not modelled, as it only takes wins away. A loser's undo is
//!   immediate (the real one runs in the background, which only delays the key).
//! - The quarantine is counted from the marker written by the first attempt after a
//!   restart, as the script does; a restart is noticed by nothing else.
//! - Not modelled: renewals and extensions (a lease is at most `max_lease` long, and
//!   so is every extension), fencing tokens, `WAIT`, replicas promoted behind a
//!   master's address (they look like a restart from a snapshot), waiters.
//!
//! # Properties
//! 1. **exclusion** (always; RELIABILITY.md's guarantee 1 for RedLock, under the
//!    assumption "a minority of masters down at a time", over any number of
//!    restarts): no two clients believe they hold the key at once.
//! 2. Examples (`sometimes`), so that the check is not vacuous: a lock is acquired;
//!    every master restarts while a lock runs; every master is quarantined at once
//!    (acquisitions answer `NoQuorum`); a client wins with the votes of restarted
//!    masters, once their quarantine has passed.
//!
//! # What each test shows
//! - `redlock_quarantine_keeps_exclusion_across_rolling_restarts`: the protocol as
//!   implemented keeps exclusion through rolling restarts, with or without snapshots;
//!   and still when every master restarts at once, beyond the assumption: that costs
//!   availability, never exclusion.
//! - `the_all_blank_fresh_deployment_rule_is_caught`: the rule this model was written
//!   against (issue 24). When every master answered "no marker at all", the client took
//!   it for a fresh deployment, counted every grant and marked the masters as voting.
//!   A rolling restart without persistence leaves every master blank while a lock
//!   runs: A holds, the three masters restart one after the other, B's first attempt
//!   finds them all blank and wins. The checker finds that run.
//! - `quarantine_shorter_than_max_lease_is_caught`: a master that votes again before a
//!   lock it forgot could have ended. In ticks, a lock a master forgot was granted at
//!   the latest in the tick its quarantine starts, so `now − since < max_lease` would
//!   still be safe here (the script's `≤` is a margin the model does not need); the
//!   variant ends the quarantine one tick before that.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

type Tick = u8;

const MASTERS: usize = 3;
const CLIENTS: usize = 2;
const QUORUM: usize = MASTERS / 2 + 1;

/// A deliberately wrong variant of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Broken {
    /// The protocol as implemented.
    None,
    /// The old rule: every master answering "no marker at all" is a fresh deployment;
    /// all their grants count, and their markers are set to vote at once.
    AllBlankIsFresh,
    /// A master votes again while `now − since ≥ max_lease − 1`: a tick before a lock
    /// it forgot may end.
    QuarantineShorterThanMaxLease,
}

/// The model's parameters.
#[derive(Clone, Debug)]
struct Protocol {
    /// `max_lease`: the longest lease, and the quarantine.
    max_lease: Tick,
    /// The leases an acquisition may ask for.
    leases: Vec<Tick>,
    /// Time stops here.
    max_time: Tick,
    /// Restarts in all.
    max_restarts: u8,
    /// Masters down at once (1: the minority assumption, restarts one at a time).
    max_down: u8,
    /// A master may start from a stale snapshot: its old marker, without the lock.
    snapshots: bool,
    broken: Broken,
}

/// The restart marker: the process serving the data, and since when its quarantine
/// runs (`None`: since 0, a deployment declared fresh, which votes at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Marker {
    process: u8,
    since: Option<Tick>,
}

/// The lock key on one master.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lock {
    owner: u8,
    exp: Tick,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Master {
    up: bool,
    /// The running process's id (its restarts so far).
    process: u8,
    lock: Option<Lock>,
    marker: Option<Marker>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Client {
    Idle,
    /// Believes it holds the key until `exp`.
    Holding {
        exp: Tick,
        /// Each master's process when it won (to see every master restart under it).
        processes: [u8; MASTERS],
        /// It won with a majority of votes from masters that had restarted.
        by_restarted: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    clock: Tick,
    masters: [Master; MASTERS],
    clients: [Client; CLIENTS],
    restarts: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// A client tries to acquire the key with this lease.
    Attempt(u8, Tick),
    Release(u8),
    /// A master's process stops (its data goes with it, unless a snapshot is loaded).
    Stop(u8),
    /// A master starts a new process: empty, or from a stale snapshot.
    Start {
        master: u8,
        snapshot: bool,
    },
    Tick,
}

impl Protocol {
    /// Restarts one master at a time, 3 in all, with or without a snapshot.
    fn rolling_restarts(broken: Broken) -> Self {
        Protocol {
            max_lease: 3,
            leases: vec![2, 3],
            max_time: 10,
            max_restarts: 3,
            max_down: 1,
            snapshots: true,
            broken,
        }
    }

    /// Every master may be down at once: the minority assumption broken.
    fn every_master_at_once(broken: Broken) -> Self {
        Protocol {
            max_down: MASTERS as u8,
            snapshots: false,
            ..Protocol::rolling_restarts(broken)
        }
    }

    /// Whether a master whose quarantine runs since `since` votes at `now`.
    fn votes(&self, since: Option<Tick>, now: Tick) -> bool {
        let quarantine = match self.broken {
            Broken::QuarantineShorterThanMaxLease => self.max_lease - 2,
            Broken::None | Broken::AllBlankIsFresh => self.max_lease,
        };
        since.is_none_or(|since| now - since > quarantine)
    }

    /// One acquisition attempt: the ACQUIRE script on every master that is up, and the
    /// client's decision.
    fn attempt(&self, s: &mut State, client: u8, lease: Tick) {
        let now = s.clock;
        let mut answered = 0;
        let mut all_blank = true;
        let mut granted = Vec::new();
        let mut votes = 0;
        let mut by_restarted = 0;
        for (index, master) in s.masters.iter_mut().enumerate() {
            if !master.up {
                continue;
            }
            answered += 1;
            all_blank &= master.marker.is_none();
            // The marker must name this process; if not, the quarantine starts now.
            let marker = match master.marker {
                Some(marker) if marker.process == master.process => marker,
                _ => Marker {
                    process: master.process,
                    since: Some(now),
                },
            };
            master.marker = Some(marker);
            if master.lock.is_none() {
                master.lock = Some(Lock {
                    owner: client,
                    exp: now + lease,
                });
                granted.push(index);
                if self.votes(marker.since, now) {
                    votes += 1;
                    if master.process > 0 {
                        by_restarted += 1;
                    }
                }
            }
        }
        let fresh = self.broken == Broken::AllBlankIsFresh && answered == MASTERS && all_blank;
        let won = votes >= QUORUM || (fresh && granted.len() >= QUORUM);
        if !won {
            for index in granted {
                s.masters[index].lock = None;
            }
            return;
        }
        if fresh {
            for master in &mut s.masters {
                master.marker = Some(Marker {
                    process: master.process,
                    since: None,
                });
            }
        }
        s.clients[client as usize] = Client::Holding {
            exp: now + lease,
            processes: s.masters.map(|master| master.process),
            by_restarted: by_restarted >= QUORUM,
        };
    }
}

impl State {
    fn holders(&self) -> usize {
        self.clients
            .iter()
            .filter(|client| matches!(client, Client::Holding { exp, .. } if self.clock < *exp))
            .count()
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let master = Master {
            up: true,
            process: 0,
            lock: None,
            marker: Some(Marker {
                process: 0,
                since: None,
            }),
        };
        vec![State {
            clock: 0,
            masters: [master; MASTERS],
            clients: [Client::Idle; CLIENTS],
            restarts: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, client) in s.clients.iter().enumerate() {
            let c = c as u8;
            match client {
                Client::Idle => {
                    for &lease in &self.leases {
                        actions.push(Action::Attempt(c, lease));
                    }
                }
                Client::Holding { .. } => actions.push(Action::Release(c)),
            }
        }
        let down = s.masters.iter().filter(|master| !master.up).count() as u8;
        for (m, master) in s.masters.iter().enumerate() {
            let m = m as u8;
            if master.up {
                if down < self.max_down && s.restarts < self.max_restarts {
                    actions.push(Action::Stop(m));
                }
            } else {
                actions.push(Action::Start {
                    master: m,
                    snapshot: false,
                });
                if self.snapshots {
                    actions.push(Action::Start {
                        master: m,
                        snapshot: true,
                    });
                }
            }
        }
        if s.clock < self.max_time {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Attempt(c, lease) => self.attempt(&mut s, c, lease),
            Action::Release(c) => {
                for master in s.masters.iter_mut().filter(|master| master.up) {
                    if matches!(master.lock, Some(lock) if lock.owner == c) {
                        master.lock = None;
                    }
                }
                s.clients[c as usize] = Client::Idle;
            }
            Action::Stop(m) => {
                s.restarts += 1;
                let master = &mut s.masters[m as usize];
                master.up = false;
                // Whatever it held in memory is gone with the process.
                master.lock = None;
            }
            Action::Start {
                master: m,
                snapshot,
            } => {
                let master = &mut s.masters[m as usize];
                master.up = true;
                master.process += 1;
                if !snapshot {
                    master.marker = None;
                }
            }
            Action::Tick => {
                s.clock += 1;
                let clock = s.clock;
                for master in &mut s.masters {
                    if matches!(master.lock, Some(lock) if lock.exp <= clock) {
                        master.lock = None;
                    }
                }
                for client in &mut s.clients {
                    if matches!(client, Client::Holding { exp, .. } if *exp <= clock) {
                        *client = Client::Idle;
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("exclusion", |_, s: &State| s.holders() <= 1),
            Property::sometimes("acquired", |_, s: &State| s.holders() > 0),
            Property::sometimes(
                "every master restarted while a lock runs",
                |_, s: &State| {
                    s.clients.iter().any(|client| match client {
                        Client::Holding { exp, processes, .. } => {
                            s.clock < *exp
                                && s.masters
                                    .iter()
                                    .zip(processes)
                                    .all(|(master, at_win)| master.up && master.process != *at_win)
                        }
                        Client::Idle => false,
                    })
                },
            ),
            Property::sometimes("every master quarantined", |m: &Protocol, s: &State| {
                s.masters.iter().all(|master| {
                    master.up
                        && matches!(master.marker, Some(marker)
                                if marker.process == master.process
                                    && !m.votes(marker.since, s.clock))
                })
            }),
            Property::sometimes("won with the votes of restarted masters", |_, s: &State| {
                s.clients.iter().any(|client| {
                    matches!(
                        client,
                        Client::Holding {
                            by_restarted: true,
                            ..
                        }
                    )
                })
            }),
        ]
    }
}

/// Explores the whole bounded state space breadth-first; prints its size.
fn explore(model: Protocol, label: &str) -> impl Checker<Protocol> {
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "model_redlock, {label}: {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
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
        "model_redlock, {label}: {} states, {:.1?}; \"{property}\" fails after {:?}",
        checker.unique_state_count(),
        started.elapsed(),
        path.as_ref().map(|path| path.clone().into_actions())
    );
    assert!(path.is_some(), "{label}: \"{property}\" holds");
}

#[test]
fn redlock_quarantine_keeps_exclusion_across_rolling_restarts() {
    explore(
        Protocol::rolling_restarts(Broken::None),
        "rolling restarts, with snapshots",
    )
    .assert_properties();
    explore(
        Protocol::every_master_at_once(Broken::None),
        "every master down at once",
    )
    .assert_properties();
}

/// Issue 24: a rolling restart of every master without persistence, with no lock
/// traffic in between, left every master blank while A's lock ran; B's first attempt
/// took that for a fresh deployment and won.
#[test]
fn the_all_blank_fresh_deployment_rule_is_caught() {
    counterexample(
        Protocol::rolling_restarts(Broken::AllBlankIsFresh),
        "all blank taken for a fresh deployment",
        "exclusion",
    );
}

#[test]
fn quarantine_shorter_than_max_lease_is_caught() {
    counterexample(
        Protocol::rolling_restarts(Broken::QuarantineShorterThanMaxLease),
        "a quarantine shorter than max_lease",
        "exclusion",
    );
}
