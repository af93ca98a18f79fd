//! Scenario 4: Redis Cluster, the master of the key's slot cut off with one client.
//!
//! Three masters and three replicas, each on a host of its own (node timeout 1 s);
//! client X beside the master serving the key, client Y beside everything else. The
//! partition cuts that master and X from the rest: the majority fails the master and
//! promotes its replica, Y locks there, while X keeps talking to the old master until
//! it stops taking writes (a master cut off from the majority refuses them once the
//! node timeout has passed). What happens is recorded, as for Sentinel without replica
//! confirmation (which Cluster mode does not offer); what is asserted is what redlock
//! promises: every wait bounded, tokens never repeated, the key free again after
//! healing, nothing left but the per-slot fencing counters.

use std::time::{Duration, Instant};

use crate::child::{ClientSpec, Role};
use crate::clock;
use crate::fixture::Fixture;
use crate::history::{self, AttemptResult, Bounds};
use crate::sentinel_split::tally;

const NODES: [&str; 6] = ["n1", "n2", "n3", "n4", "n5", "n6"];
const KEY: &str = "cluster-split";
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The fields of `host`'s own line in `CLUSTER NODES`.
fn own_line(fixture: &Fixture, host: &str) -> Vec<String> {
    fixture
        .net
        .cli(host, 7000, &["CLUSTER", "NODES"])
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .find(|fields| fields.get(2).is_some_and(|flags| flags.contains("myself")))
        .unwrap_or_default()
}

fn serves(fields: &[String], slot: u64) -> bool {
    fields.get(2).is_some_and(|flags| flags.contains("master"))
        && redlock_testkit::cluster::lists_slot(fields, slot)
}

#[test]
fn a_cluster_master_cut_off_with_a_client_fails_over_and_the_other_side_follows() {
    let mut hosts: Vec<&str> = NODES.to_vec();
    hosts.extend_from_slice(&["x", "y"]);
    let Some(mut fixture) = Fixture::new(&hosts) else {
        return;
    };
    for node in NODES {
        fixture.start_redis(
            node,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--repl-diskless-sync-delay",
                "0",
            ],
        );
    }
    let addresses: Vec<String> = NODES
        .iter()
        .map(|node| format!("{}:7000", fixture.net.host(node).addr))
        .collect();
    let output = fixture
        .net
        .command("n1", "redis-cli")
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        output.status.success(),
        "redis-cli --cluster create failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    wait_until(Duration::from_secs(30), "the cluster to be ok", || {
        NODES.iter().all(|node| {
            let info = fixture.net.cli(node, 7000, &["CLUSTER", "INFO"]);
            let replication = fixture.net.cli(node, 7000, &["INFO", "replication"]);
            info.contains("cluster_state:ok")
                && (replication.contains("role:master")
                    || replication.contains("master_link_status:up"))
        })
    });
    let slot: u64 = fixture
        .net
        .cli("n1", 7000, &["CLUSTER", "KEYSLOT", KEY])
        .parse()
        .expect("CLUSTER KEYSLOT answers a number");
    let master = NODES
        .into_iter()
        .find(|node| serves(&own_line(&fixture, node), slot))
        .expect("a master serves the key's slot");
    let master_id = own_line(&fixture, master)[0].clone();
    let replica = NODES
        .into_iter()
        .find(|node| own_line(&fixture, node).get(3) == Some(&master_id))
        .expect("the master has a replica");

    let urls: Vec<String> = NODES.iter().map(|node| fixture.net.url(node)).collect();
    let mut spec = ClientSpec::new(
        Role::Contender,
        &format!("cluster:{}", urls.join(",")),
        &fixture.store_url(),
        fixture.dir(),
        KEY,
    );
    spec.lease = Some(Duration::from_secs(1));
    spec.wait = Duration::from_secs(1);
    spec.response_timeout = RESPONSE_TIMEOUT;
    spec.hold = Duration::from_millis(20);
    spec.run_for = Duration::from_secs(12);
    let x = spec.spawn(&fixture.net, "x");
    let y = spec.spawn(&fixture.net, "y");
    let (x_pid, y_pid) = (x.child.id(), y.child.id());
    fixture.wait_for_history("both clients to hold", Duration::from_secs(20), |h| {
        [x_pid, y_pid]
            .iter()
            .all(|pid| h.holds.iter().any(|hold| hold.id.proc == *pid))
    });

    let others: Vec<&str> = NODES
        .iter()
        .copied()
        .filter(|node| *node != master)
        .chain(["y"])
        .collect();
    fixture.net.split(&[master, "x"], &others);
    let cut_at = clock::now();
    wait_until(
        Duration::from_secs(30),
        "the replica to be promoted",
        || {
            own_line(&fixture, replica)
                .get(2)
                .is_some_and(|flags| flags.contains("master"))
                && fixture
                    .net
                    .cli(replica, 7000, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
        },
    );
    let promoted_at = clock::now();
    std::thread::sleep(Duration::from_secs(2));
    fixture.net.heal();
    let healed_at = clock::now();
    x.join("client X", Duration::from_secs(40));
    y.join("client Y", Duration::from_secs(40));
    for host in ["x", "y"] {
        fixture.take_from(&spec, host, Duration::from_secs(3), Duration::from_secs(30));
    }

    let history = fixture.history();
    let bounds = Bounds {
        // Slots refreshed after a timeout, then the command sent again.
        wait_overshoot: RESPONSE_TIMEOUT * 3 + Duration::from_secs(1),
        ..Bounds::default()
    };
    let (summary, violations) = history::check(&history, &bounds);
    let held = |pid: u32, from: u64| {
        history
            .holds
            .iter()
            .filter(|h| h.id.proc == pid && h.t_req >= from && h.t_acq <= healed_at)
            .collect::<Vec<_>>()
    };
    let (x_during, y_during) = (held(x_pid, cut_at), held(y_pid, promoted_at));
    let last_x = x_during.iter().map(|h| clock::span(cut_at, h.t_acq)).max();
    let results = |pid: u32| -> Vec<AttemptResult> {
        history
            .attempts
            .iter()
            .filter(|a| a.id.proc == pid && a.t_req >= cut_at && a.t_ret <= healed_at)
            .map(|a| a.result.clone())
            .collect()
    };
    let y_first_after = history
        .holds
        .iter()
        .filter(|h| h.id.proc == y_pid && h.t_acq >= cut_at)
        .map(|h| clock::span(promoted_at, h.t_acq))
        .min();
    eprintln!(
        "cluster master cut off: {summary:?}; {} violation(s) (first: {:?}); {:?} from the \
         cut to the promotion of {replica} (the master was {master}); during the partition \
         X held {} times on the old master (the last acquired {last_x:?} after the cut), its \
         attempts {:?}; Y held {} times on the new one, its attempts {:?}, its first hold \
         after the cut {y_first_after:?} after the promotion",
        violations.len(),
        violations.first(),
        clock::span(cut_at, promoted_at),
        x_during.len(),
        tally(&results(x_pid)),
        y_during.len(),
        tally(&results(y_pid)),
    );
    for violation in &violations {
        assert!(
            !violation.contains("past its wait") && !violation.contains("given to both"),
            "{violation}"
        );
    }
    assert!(!y_during.is_empty(), "Y never acquired on the new master");
    fixture.assert_only_keys(replica, &["redlock:fence*"], Duration::from_secs(10));
}
