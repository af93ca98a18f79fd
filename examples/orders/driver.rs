//! The driver (the example's default run): starts the instances as processes of
//! their own, fires duplicate payments at them over HTTP, and checks in the database
//! that every order was charged exactly once; then concurrent transfers in crossing
//! orders, checked against the balances; then the pause scene and a graceful
//! shutdown.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use redlock_runtime::LockClient;
use serde_json::json;
use tokio::sync::mpsc;

use crate::db::{self, OPENING_ACCOUNT, OPENING_BALANCE};
use crate::http;

/// The order of the pause scene.
const PAUSED_ORDER: u64 = 99;
/// The order being paid while the instances are told to stop.
const LAST_ORDER: u64 = 100;
/// How far apart the driver sends the transfers.
const STAGGER: Duration = Duration::from_millis(2);
/// The accounts of the transfers: 1 to 4, each opened with `OPENING_ACCOUNT`.
const ACCOUNTS: u64 = 4;
/// Every ordered pair of two accounts, a pair's two directions side by side: the
/// transfers go round this list, so that `1 → 2` and `2 → 1` are sent at once.
const CROSSING: [(u64, u64); 12] = [
    (1, 2),
    (2, 1),
    (3, 4),
    (4, 3),
    (1, 3),
    (3, 1),
    (2, 4),
    (4, 2),
    (1, 4),
    (4, 1),
    (2, 3),
    (3, 2),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scene {
    /// Concurrent duplicate payments, concurrent transfers, then the pause.
    All,
    /// Concurrent duplicate payments.
    Payments,
    /// Concurrent transfers between accounts, in crossing orders.
    Transfers,
    /// The pause.
    Pause,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Instances of the service (processes).
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Number of orders (numbered from 1; 99 and 100 are the pause's and the shutdown's).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=98))]
    orders: u64,
    /// Concurrent payment requests per order, spread over the instances.
    #[arg(long, default_value_t = 8)]
    attempts: u32,
    /// Concurrent transfers between the 4 accounts, spread over the instances.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=120))]
    transfers: u64,
    /// Run the instances with the same code but without `#[distributed_lock]`.
    #[arg(long)]
    without_lock: bool,
    /// What to run (several: `--scene payments,transfers`); the shutdown always ends it.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    scene: Vec<Scene>,
    /// The database file to create (default: in a temporary directory, removed at
    /// the end); kept, for a look with `sqlite3` afterwards.
    #[arg(long)]
    db: Option<std::path::PathBuf>,
}

/// One instance: its process, its address, and the lines it prints (also echoed to
/// our stdout, prefixed with its name).
struct Instance {
    name: String,
    child: Child,
    addr: SocketAddr,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Instance {
    async fn start(name: &str, redis: &str, db: &Path, without_lock: bool) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|error| error.to_string())?;
        let mut command = Command::new(exe);
        command
            .args(["instance", "--name", name, "--redis", redis, "--db"])
            .arg(db)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if without_lock {
            command.arg("--without-lock");
        }
        let mut child = command
            .spawn()
            .map_err(|error| format!("start instance {name}: {error}"))?;
        let (sender, mut lines) = mpsc::unbounded_channel();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let prefix = name.to_owned();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                println!("    [{prefix}] {line}");
                let _ = sender.send(line);
            }
        });
        let listening = wait_for_line(&mut lines, "listening on http://", Duration::from_secs(30))
            .await
            .ok_or_else(|| format!("instance {name} did not start listening"))?;
        let addr = listening
            .trim_start_matches("listening on http://")
            .parse()
            .map_err(|error| format!("instance {name}'s address {listening:?}: {error}"))?;
        Ok(Instance {
            name: name.to_owned(),
            child,
            addr,
            lines,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit (killing it after `limit`); true if it exited 0.
    async fn stopped(mut self, limit: Duration) -> bool {
        let started = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    println!("  instance {} exited: {status}", self.name);
                    return status.success();
                }
                Ok(None) if started.elapsed() < limit => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => {
                    println!(
                        "  instance {} still running after {limit:?}: killed",
                        self.name
                    );
                    return false;
                }
            }
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A failed run must not leave a stopped or running instance behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `POST /orders/{id}/pay` to the instance at `addr`; a request that got no answer
/// is status 0 with the error as its body.
async fn pay(addr: SocketAddr, id: u64, headers: &[(&str, String)]) -> (u16, serde_json::Value) {
    http::post(addr, &format!("/orders/{id}/pay"), headers, None)
        .await
        .unwrap_or_else(|error| (0, serde_json::Value::String(error)))
}

impl Args {
    fn runs(&self, scene: Scene) -> bool {
        self.scene.contains(&scene) || self.scene.contains(&Scene::All)
    }
}

/// The first line containing `needle`, or `None` after `limit`.
async fn wait_for_line(
    lines: &mut mpsc::UnboundedReceiver<String>,
    needle: &str,
    limit: Duration,
) -> Option<String> {
    tokio::time::timeout(limit, async {
        while let Some(line) = lines.recv().await {
            if line.contains(needle) {
                return Some(line);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

pub async fn run(args: Args) -> ExitCode {
    let (_server, url) = redlock_testkit::redlock_url_or_throwaway_server();
    let dir = tempfile::Builder::new()
        .prefix("redlock-orders-")
        .tempdir()
        .expect("a temporary directory");
    let db = args
        .db
        .clone()
        .unwrap_or_else(|| dir.path().join("orders.db"));
    let mut orders: Vec<(u64, i64)> = (1..=args.orders)
        .map(|id| (id, 2_000 + 500 * id as i64))
        .collect();
    orders.extend([(PAUSED_ORDER, 2_500), (LAST_ORDER, 1_500)]);
    if let Err(error) = db::create(&db, &orders, ACCOUNTS) {
        eprintln!("orders: create {}: {error}", db.display());
        return ExitCode::FAILURE;
    }
    println!(
        "database: {} (SQLite, shared by the instances)",
        db.display()
    );

    let mut instances = Vec::new();
    for n in 0..args.instances.max(1) {
        let name = ((b'a' + n as u8) as char).to_string();
        match Instance::start(&name, &url, &db, args.without_lock).await {
            Ok(instance) => {
                println!(
                    "  instance {name}: http://{} (pid {})",
                    instance.addr,
                    instance.pid()
                );
                instances.push(instance);
            }
            Err(error) => {
                eprintln!("orders: {error}");
                return ExitCode::FAILURE;
            }
        }
    }

    let locks = match LockClient::builder_for(url.split(',').filter(|u| !u.trim().is_empty()))
        .connect()
        .await
    {
        Ok(locks) => locks,
        Err(error) => {
            eprintln!("orders: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    if args.runs(Scene::Payments) {
        ok &= payments(&args, &instances, &db).await;
    }
    if args.runs(Scene::Transfers) {
        ok &= transfers(&args, &instances, &db).await;
    }
    if args.without_lock {
        // The double charges and the money created or lost are the point of this run.
        ok = true;
    } else if args.runs(Scene::Pause) {
        ok &= pause(&mut instances, &db, &locks).await;
    }
    ok &= shutdown(instances, &locks, args.without_lock).await;
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// SIGTERM to every instance while the last one is in the middle of a payment: each
/// stops taking requests, finishes the ones under way (the payment is charged, its
/// lock released) and exits 0.
async fn shutdown(mut instances: Vec<Instance>, locks: &LockClient, without_lock: bool) -> bool {
    let id = LAST_ORDER;
    println!();
    println!(
        "shutdown: order {id} is being paid on the last instance (the provider takes 1 s) when SIGTERM reaches each instance"
    );
    let last = instances.last_mut().expect("an instance");
    let addr = last.addr;
    let answer =
        tokio::spawn(
            async move { pay(addr, id, &[("x-provider-delay-ms", "1000".to_owned())]).await },
        );
    let mut ok = wait_for_line(
        &mut last.lines,
        "calling the payment provider",
        Duration::from_secs(15),
    )
    .await
    .is_some();
    for instance in &instances {
        redlock_testkit::signal(instance.pid(), "TERM");
    }
    for instance in instances {
        ok &= instance.stopped(Duration::from_secs(20)).await;
    }
    let (status, body) = answer.await.expect("the last request's task");
    println!("  the payment under way: {status} {body}");
    ok &= status == 200 && body["result"] == "charged";
    if !without_lock {
        let held = locks.inspect(&format!("order:{id}")).await;
        println!(
            "  order:{id} after the exit: {}",
            match &held {
                Ok(None) => "released".to_owned(),
                other => format!("{other:?}"),
            }
        );
        ok &= matches!(held, Ok(None));
    }
    ok
}

/// Every order paid `attempts` times at once, over every instance; then the count
/// of charges, from the database.
async fn payments(args: &Args, instances: &[Instance], db: &Path) -> bool {
    let how = if args.without_lock {
        "WITHOUT #[distributed_lock]"
    } else {
        "under #[distributed_lock(key = \"order:<id>\")]"
    };
    println!();
    println!(
        "{} orders × {} concurrent POST /orders/{{id}}/pay over {} instances, pay_order {how}",
        args.orders,
        args.attempts,
        instances.len()
    );
    let mut requests = Vec::new();
    for attempt in 0..args.attempts as usize {
        for id in 1..=args.orders {
            let addr = instances[(id as usize + attempt) % instances.len()].addr;
            requests.push(tokio::spawn(async move { (id, pay(addr, id, &[]).await) }));
        }
    }
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.expect("a request's task"));
    }
    let mut by_result: BTreeMap<String, u32> = BTreeMap::new();
    let mut failures = 0;
    for (id, (status, body)) in &answers {
        let result = body["result"].as_str().unwrap_or("?").to_owned();
        *by_result.entry(format!("{status} {result}")).or_default() += 1;
        if *status != 200 {
            failures += 1;
            println!("  order {id}: HTTP {status} {body}");
        }
    }
    let summary: Vec<String> = by_result
        .iter()
        .map(|(what, n)| format!("{n} × {what}"))
        .collect();
    println!("  answers: {}", summary.join(", "));

    let tallies = match db::tally(db) {
        Ok(tallies) => tallies,
        Err(error) => {
            println!("  read the database: {error}");
            return false;
        }
    };
    let mut double_charges = 0;
    let mut overcharged = 0;
    for tally in tallies.iter().filter(|t| t.id <= args.orders) {
        let n = tally.charges.len();
        let verdict = match n {
            1 => format!(
                "charged once ✓ (by {}, fencing token {})",
                tally.charges[0].1, tally.charges[0].0
            ),
            n => format!("charged {n} times ✗"),
        };
        println!(
            "  order {} ({}): {verdict}; balance {} → {}",
            tally.id,
            money(tally.amount),
            money(OPENING_BALANCE),
            money(tally.balance)
        );
        if n != 1 || tally.balance != OPENING_BALANCE - tally.amount {
            double_charges += n.saturating_sub(1);
            overcharged += tally.amount * n.saturating_sub(1) as i64;
            if n == 0 {
                failures += 1;
            }
        }
    }
    if double_charges == 0 && failures == 0 {
        println!("every order charged exactly once (counted in the database)");
        true
    } else {
        println!(
            "{double_charges} double charges, {} charged too much (counted in the database): \
             what #[distributed_lock] prevents (run without --without-lock)",
            money(overcharged)
        );
        false
    }
}

/// `transfers` transfers at once between the accounts, every pair in both directions
/// at the same time, over every instance; then the balances, from the database: each
/// what the transfers make it, their sum what it was.
async fn transfers(args: &Args, instances: &[Instance], db: &Path) -> bool {
    let how = if args.without_lock {
        "WITHOUT #[distributed_lock]"
    } else {
        "under #[distributed_lock(keys = [\"account:<from>\", \"account:<to>\"])]"
    };
    println!();
    println!(
        "{} concurrent POST /transfers over {} instances between {ACCOUNTS} accounts of {} \
         each, in crossing orders (1 → 2 and 2 → 1 at once, every pair), transfer {how}",
        args.transfers,
        instances.len(),
        money(OPENING_ACCOUNT)
    );
    let started = Instant::now();
    let mut requests = Vec::new();
    for i in 0..args.transfers as usize {
        let (from, to) = CROSSING[i % CROSSING.len()];
        // From 10.00 to 29.99, seldom twice the same (lost updates rarely cancel out);
        // no account can be overdrawn: it pays at most 30 of them.
        let amount = 1_000 + (379 * i % 2_000) as i64;
        // Round after round, a pair's direction goes to another instance.
        let addr = instances[(i + i / CROSSING.len()) % instances.len()].addr;
        let body = json!({"from": from, "to": to, "amount": amount});
        // Sent a few milliseconds apart, as requests arrive: a pair's two directions
        // still meet, and the transfers overlap, but they do not all read at once.
        let sent = started + STAGGER * i as u32;
        requests.push(tokio::spawn(async move {
            tokio::time::sleep_until(sent.into()).await;
            let answer = http::post(addr, "/transfers", &[], Some(&body))
                .await
                .unwrap_or_else(|error| (0, serde_json::Value::String(error)));
            ((from, to, amount), answer)
        }));
    }
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.expect("a transfer's task"));
    }
    let took = started.elapsed();

    // What each account should hold after the transfers that were answered "done".
    let mut expected: BTreeMap<u64, i64> = (1..=ACCOUNTS).map(|id| (id, OPENING_ACCOUNT)).collect();
    let mut by_result: BTreeMap<String, u32> = BTreeMap::new();
    let (mut done, mut timed_out, mut refused, mut failed) = (0, 0, 0, 0);
    for ((from, to, amount), (status, body)) in &answers {
        let result = body["result"].as_str().unwrap_or("?").to_owned();
        *by_result.entry(format!("{status} {result}")).or_default() += 1;
        match status {
            200 => {
                done += 1;
                *expected.entry(*from).or_default() -= amount;
                *expected.entry(*to).or_default() += amount;
                continue;
            }
            503 if result == "timed out" => timed_out += 1,
            409 => refused += 1,
            _ => failed += 1,
        }
        println!(
            "  transfer {from} → {to} ({}): HTTP {status} {body}",
            money(*amount)
        );
    }
    let summary: Vec<String> = by_result
        .iter()
        .map(|(what, n)| format!("{n} × {what}"))
        .collect();
    println!("  answers: {}", summary.join(", "));

    let accounts = match db::accounts(db) {
        Ok(accounts) => accounts,
        Err(error) => {
            println!("  read the database: {error}");
            return false;
        }
    };
    let mut off = 0;
    for &(id, balance, fence) in &accounts {
        let should = expected.get(&id).copied().unwrap_or(OPENING_ACCOUNT);
        let verdict = if balance == should {
            "✓".to_owned()
        } else {
            off += 1;
            format!("✗ its transfers make it {}", money(should))
        };
        let fence = if args.without_lock {
            String::new()
        } else {
            format!(" (fence {fence})")
        };
        println!(
            "  account {id}: {} → {} {verdict}{fence}",
            money(OPENING_ACCOUNT),
            money(balance)
        );
    }
    let before = OPENING_ACCOUNT * ACCOUNTS as i64;
    let after: i64 = accounts.iter().map(|&(_, balance, _)| balance).sum();
    let negative = accounts
        .iter()
        .filter(|&&(_, balance, _)| balance < 0)
        .count();
    println!(
        "  transfers: {done} done, {timed_out} timed out, {refused} refused by the database, \
         {failed} failed; all answered within {:.1} s{}",
        took.as_secs_f64(),
        if args.without_lock {
            ""
        } else {
            " (each waits at most 5 s for its locks)"
        }
    );
    let sum = if after == before {
        "unchanged ✓".to_owned()
    } else if after > before {
        format!("{} created ✗", money(after - before))
    } else {
        format!("{} lost ✗", money(before - after))
    };
    println!(
        "  sum of the balances: {} before, {} after: {sum}; {}",
        money(before),
        money(after),
        if negative == 0 {
            "none negative".to_owned()
        } else {
            format!("{negative} negative ✗")
        }
    );
    let mut wrong = Vec::new();
    if done != answers.len() {
        wrong.push(format!(
            "{} of {} transfers not done",
            answers.len() - done,
            answers.len()
        ));
    }
    if off > 0 {
        wrong.push(format!(
            "{off} of {ACCOUNTS} balances not what their transfers make them"
        ));
    }
    if after != before {
        wrong.push(format!("the sum of the balances: {sum}"));
    }
    if negative > 0 {
        wrong.push(format!("{negative} balances negative"));
    }
    if wrong.is_empty() {
        println!(
            "every transfer done, every balance what its transfers make it, the sum unchanged \
             (counted in the database)"
        );
        true
    } else {
        println!(
            "{} (counted in the database){}",
            wrong.join(", "),
            if args.without_lock {
                ": lost updates, what #[distributed_lock(keys = [...])] prevents (run without \
                 --without-lock)"
            } else {
                ""
            }
        );
        false
    }
}

/// Instance a takes the order's lock and calls a slow payment provider; the driver
/// SIGSTOPs it past its lease; instance b charges the order; a is SIGCONTed and its
/// write is refused by the database — and a's HTTP answer says so.
async fn pause(instances: &mut [Instance], db: &Path, locks: &LockClient) -> bool {
    if instances.len() < 2 {
        println!("pause: needs two instances");
        return false;
    }
    let id = PAUSED_ORDER;
    let key = format!("order:{id}");
    println!();
    println!(
        "pause: order {id}; instance a takes its lock (lease 10 s) and calls a slow payment \
         provider; SIGSTOP a past its lease; b pays; SIGCONT a"
    );
    let started = Instant::now();
    let at = || format!("+{:>4.1} s", started.elapsed().as_secs_f64());
    let (first, rest) = instances.split_at_mut(1);
    let (a, b) = (&mut first[0], &rest[0]);
    let (a_addr, a_pid) = (a.addr, a.pid());
    println!(
        "  {}  POST /orders/{id}/pay → a (the provider takes 5 s: time to stop a before it writes)",
        at()
    );
    let a_answer = tokio::spawn(async move {
        pay(a_addr, id, &[("x-provider-delay-ms", "5000".to_owned())]).await
    });
    if wait_for_line(
        &mut a.lines,
        &format!("order {id}: locked"),
        Duration::from_secs(15),
    )
    .await
    .is_none()
    {
        println!("  a did not take the lock");
        return false;
    }
    redlock_testkit::signal(a_pid, "STOP");
    let a_token = match locks.inspect(&key).await {
        Ok(Some(info)) => info.fencing_token(),
        other => {
            println!("  {key} is not held as expected: {other:?}");
            redlock_testkit::signal(a_pid, "CONT");
            return false;
        }
    };
    println!(
        "  {}  SIGSTOP a (pid {a_pid}): it holds {key}, fencing token {a_token}",
        at()
    );
    // Wait for a's lease to run out (a cannot renew or release: it is stopped).
    let deadline = Instant::now() + Duration::from_secs(30);
    while matches!(locks.inspect(&key).await, Ok(Some(_))) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("  {}  a's lease has run out; a is still stopped", at());
    let (status, body) = pay(b.addr, id, &[]).await;
    println!("  {}  POST /orders/{id}/pay → b: {status} {body}", at());
    redlock_testkit::signal(a_pid, "CONT");
    println!("  {}  SIGCONT a", at());
    let (a_status, a_body) = a_answer.await.expect("a's request task");
    println!("  {}  a answers: {a_status} {a_body}", at());

    let tally = match db::tally(db) {
        Ok(tallies) => tallies
            .into_iter()
            .find(|t| t.id == id)
            .expect("the paused order"),
        Err(error) => {
            println!("  read the database: {error}");
            return false;
        }
    };
    let b_token = body["token"].as_u64();
    println!(
        "  order {id} in the database: {}, charged {} time(s) {:?}, fence {}, balance {} → {}",
        tally.status,
        tally.charges.len(),
        tally.charges,
        tally.fence,
        money(OPENING_BALANCE),
        money(tally.balance)
    );
    let refused = a_status == 409
        && a_body["token"].as_u64() == Some(a_token)
        && a_body["seen"].as_u64() == b_token;
    let ok = status == 200
        && b_token.is_some_and(|b| b > a_token)
        && refused
        && tally.charges.len() == 1
        && tally.fence as u64 == b_token.unwrap_or(0)
        && tally.balance == OPENING_BALANCE - tally.amount;
    if ok {
        println!(
            "pause check passed: the database refused a's write (token {a_token} < {}), one charge",
            b_token.unwrap_or(0)
        );
    } else {
        println!("pause check FAILED");
    }
    ok
}
