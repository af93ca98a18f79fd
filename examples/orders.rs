//! Annotating business functions: `pay_order` under `#[distributed_lock(key = "order:<id>")]`.
//!
//! ```text
//! cargo run --example orders                   # each order charged exactly once
//! cargo run --example orders -- --without-lock # the same service without the attribute
//! ```
//!
//! A small in-process order service. Many payment attempts for the same orders run
//! at once (a customer double-clicking, a retrying client, two instances behind a load
//! balancer). `pay_order` reads the order, calls the payment provider, and writes the
//! charge: without the lock every attempt reads "unpaid" before any of them writes, and
//! the customer is charged several times.
//!
//! Then the fencing token: the ledger keeps, per order, the highest fencing token it
//! has seen, and rejects a write carrying an older one. Payer A takes the lock with a
//! 300 ms lease and stalls for 600 ms (a GC pause, a stopped VM) before writing; its
//! lease runs out, payer B (another service instance) takes the lock and charges; when
//! A wakes up its write carries the older token and the ledger refuses it.

use std::collections::BTreeMap;
use std::fmt;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use redlock_runtime::{LockClient, LockError, current_lock, distributed_lock};

#[derive(Debug, Parser)]
#[command(about = "Annotating business functions: each order is charged exactly once")]
struct Args {
    /// Number of orders.
    #[arg(long, default_value_t = 5)]
    orders: u64,
    /// Concurrent payment attempts per order.
    #[arg(long, default_value_t = 8)]
    attempts: u32,
    /// Pay with the same code but without `#[distributed_lock]`.
    #[arg(long)]
    without_lock: bool,
}

/// Every customer starts with this much, in cents.
const OPENING_BALANCE: i64 = 10_000;

// ---------------------------------------------------------------------------------------
// The ledger: the payments database, which checks fencing tokens
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Order {
    amount: i64,
    balance: i64,
    charges: u32,
    /// Highest fencing token a write to this order carried.
    last_token: u64,
    rejected: Vec<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Ledger {
    orders: Mutex<BTreeMap<u64, Order>>,
}

impl Ledger {
    fn open(&self, id: u64, amount: i64) {
        self.orders.lock().unwrap().insert(
            id,
            Order {
                amount,
                balance: OPENING_BALANCE,
                charges: 0,
                last_token: 0,
                rejected: Vec::new(),
            },
        );
    }

    fn snapshot(&self, id: u64) -> Order {
        self.orders.lock().unwrap()[&id].clone()
    }

    /// Charges the order's amount. With a fencing token, refuses a write older than one
    /// already applied (the writer's lock has expired and someone else has had it).
    fn charge(&self, id: u64, token: Option<u64>) -> Result<(), PayError> {
        let mut orders = self.orders.lock().unwrap();
        let order = orders.get_mut(&id).expect("known order");
        if let Some(token) = token {
            if token < order.last_token {
                order.rejected.push((token, order.last_token));
                return Err(PayError::StaleToken {
                    token,
                    seen: order.last_token,
                });
            }
            order.last_token = token;
        }
        order.balance -= order.amount;
        order.charges += 1;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payment {
    Charged,
    AlreadyPaid,
}

#[derive(Debug)]
enum PayError {
    Lock(LockError),
    StaleToken { token: u64, seen: u64 },
}

impl fmt::Display for PayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayError::Lock(error) => error.fmt(f),
            PayError::StaleToken { token, seen } => write!(
                f,
                "the ledger rejected the write: fencing token {token} is older than {seen}"
            ),
        }
    }
}

impl std::error::Error for PayError {}

impl From<LockError> for PayError {
    fn from(error: LockError) -> Self {
        PayError::Lock(error)
    }
}

/// The business function, annotated: one payer per order at a time, across processes.
#[distributed_lock(key = "order:<id>", wait = "10s", lease = "5s")]
async fn pay_order(id: u64, ledger: &Ledger) -> Result<Payment, PayError> {
    let token = current_lock().map(|lock| lock.fencing_token());
    pay(id, ledger, token).await
}

/// The same function without the attribute (`--without-lock`).
async fn pay_order_without_lock(id: u64, ledger: &Ledger) -> Result<Payment, PayError> {
    pay(id, ledger, None).await
}

/// The body both share: read, call the provider, write.
async fn pay(id: u64, ledger: &Ledger, token: Option<u64>) -> Result<Payment, PayError> {
    if ledger.snapshot(id).charges > 0 {
        return Ok(Payment::AlreadyPaid);
    }
    // The payment provider takes a moment to answer: the window in which, without the
    // lock, every other attempt also reads "unpaid".
    tokio::time::sleep(Duration::from_millis(30)).await;
    ledger.charge(id, token)?;
    Ok(Payment::Charged)
}

/// Payer A of the fencing demo: a short lease, and a stall between read and write.
/// `on_lost = "continue"` lets the body run on after the lease is gone, as a paused
/// process would; the fencing token is what makes its late write harmless.
#[distributed_lock(key = "order:<id>", wait = "0s", lease = "300ms", on_lost = "continue", client = locks)]
async fn pay_order_after_a_stall(
    id: u64,
    ledger: &Ledger,
    locks: &LockClient,
    stall: Duration,
    started: Instant,
) -> Result<Payment, PayError> {
    let token = current_lock().expect("under the lock").fencing_token();
    let paid = ledger.snapshot(id).charges > 0;
    println!(
        "  +{:>3} ms  A: locked order:{id} with a 300 ms lease, fencing token {token}; order {}; stalls {} ms",
        started.elapsed().as_millis(),
        if paid { "paid" } else { "unpaid" },
        stall.as_millis()
    );
    if paid {
        return Ok(Payment::AlreadyPaid);
    }
    tokio::time::sleep(stall).await;
    println!(
        "  +{:>3} ms  A: wakes up (its lease ran out at +300 ms) and writes the charge with token {token}",
        started.elapsed().as_millis()
    );
    ledger.charge(id, Some(token))?;
    Ok(Payment::Charged)
}

// ---------------------------------------------------------------------------------------
// The demo
// ---------------------------------------------------------------------------------------

fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

async fn concurrent_payments(args: &Args, ledger: &Arc<Ledger>) -> bool {
    let how = if args.without_lock {
        "WITHOUT #[distributed_lock]"
    } else {
        "#[distributed_lock(key = \"order:<id>\")]"
    };
    println!(
        "{} orders × {} concurrent payment attempts, pay_order {how}",
        args.orders, args.attempts
    );
    for id in 1..=args.orders {
        ledger.open(id, 2_000 + 500 * id as i64);
    }
    let mut tasks = Vec::new();
    for _ in 0..args.attempts {
        for id in 1..=args.orders {
            let ledger = ledger.clone();
            let without_lock = args.without_lock;
            tasks.push(tokio::spawn(async move {
                let result = if without_lock {
                    pay_order_without_lock(id, &ledger).await
                } else {
                    pay_order(id, &ledger).await
                };
                (id, result)
            }));
        }
    }
    let mut already_paid: BTreeMap<u64, u32> = BTreeMap::new();
    let mut failures = 0;
    for task in tasks {
        let (id, result) = task.await.expect("payment task");
        match result {
            Ok(Payment::AlreadyPaid) => *already_paid.entry(id).or_default() += 1,
            Ok(Payment::Charged) => {}
            Err(error) => {
                failures += 1;
                println!("  order {id}: payment failed: {error}");
            }
        }
    }
    let mut double_charges = 0;
    let mut overcharged = 0;
    for id in 1..=args.orders {
        let order = ledger.snapshot(id);
        let verdict = match order.charges {
            1 => "charged once ✓".to_owned(),
            n => format!("charged {n} times ✗"),
        };
        let token = if order.last_token > 0 {
            format!(" (fencing token {})", order.last_token)
        } else {
            String::new()
        };
        println!(
            "  order {id} ({}): {verdict}{token}, {} attempts found it paid; balance {} → {}",
            money(order.amount),
            already_paid.get(&id).copied().unwrap_or(0),
            money(OPENING_BALANCE),
            money(order.balance),
        );
        if order.charges > 1 {
            double_charges += order.charges - 1;
            overcharged += order.amount * i64::from(order.charges - 1);
        }
    }
    if double_charges == 0 && failures == 0 {
        println!("every order charged exactly once");
        true
    } else {
        println!(
            "{double_charges} double charges, {} charged too much: what #[distributed_lock] prevents \
             (run without --without-lock)",
            money(overcharged)
        );
        false
    }
}

/// Payer A stalls past its lease; payer B (another instance, with its own client)
/// takes the lock; A's late write carries an older token and the ledger refuses it.
async fn fencing(url: &str, ledger: &Arc<Ledger>) -> Result<bool, LockError> {
    const ORDER: u64 = 99;
    println!();
    println!(
        "fencing: order {ORDER}, payer A stalls 600 ms past its 300 ms lease, payer B runs on another instance"
    );
    ledger.open(ORDER, 2_500);
    let instance_a = connect(url).await?;
    let instance_b = connect(url).await?;
    let started = Instant::now();
    let payer_a = {
        let ledger = ledger.clone();
        tokio::spawn(async move {
            pay_order_after_a_stall(
                ORDER,
                &ledger,
                &instance_a,
                Duration::from_millis(600),
                started,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let payer_b = pay_order_b(ORDER, ledger, &instance_b, started).await;
    match &payer_b {
        Ok(payment) => println!(
            "  +{:>3} ms  B: done: {payment:?}",
            started.elapsed().as_millis()
        ),
        Err(error) => println!("  B: failed: {error}"),
    }
    let payer_a = payer_a.await.expect("payer A");
    match &payer_a {
        Ok(payment) => println!("  A: {payment:?}"),
        Err(error) => println!("  +{:>3} ms  A: {error}", started.elapsed().as_millis()),
    }
    let order = ledger.snapshot(ORDER);
    let rejected = !order.rejected.is_empty();
    println!(
        "  order {ORDER}: charged {} time(s), balance {} → {}; {} stale write(s) rejected",
        order.charges,
        money(OPENING_BALANCE),
        money(order.balance),
        order.rejected.len()
    );
    let ok = order.charges == 1 && rejected && matches!(payer_a, Err(PayError::StaleToken { .. }));
    if ok {
        println!("fencing check passed: the stalled payer's write was refused, one charge");
    } else {
        println!("fencing check FAILED");
    }
    Ok(ok)
}

/// Payer B of the fencing demo: `pay_order` on the second instance's client.
#[distributed_lock(key = "order:<id>", wait = "10s", lease = "5s", client = locks)]
async fn pay_order_b(
    id: u64,
    ledger: &Ledger,
    locks: &LockClient,
    started: Instant,
) -> Result<Payment, PayError> {
    let token = current_lock().expect("under the lock").fencing_token();
    println!(
        "  +{:>3} ms  B: locked order:{id} (A's lease ran out), fencing token {token}",
        started.elapsed().as_millis()
    );
    pay(id, ledger, Some(token)).await
}

/// One server, or RedLock over a comma-separated list (as `REDLOCK_URL` may give).
async fn connect(url: &str) -> Result<LockClient, LockError> {
    LockClient::builder_for(url.split(',').filter(|u| !u.trim().is_empty()))
        .connect()
        .await
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let (_server, url) = redlock_testkit::redlock_url_or_throwaway_server();
    let client = match connect(&url).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("orders: {error}");
            return ExitCode::FAILURE;
        }
    };
    redlock_runtime::set_default_client(client);

    let ledger = Arc::new(Ledger::default());
    let exactly_once = concurrent_payments(&args, &ledger).await;
    if args.without_lock {
        // The double charges are the point of this run.
        return ExitCode::SUCCESS;
    }
    match fencing(&url, &ledger).await {
        Ok(true) if exactly_once => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("orders: {error}");
            ExitCode::FAILURE
        }
    }
}
