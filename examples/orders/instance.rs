//! One instance of the order service: an HTTP server (axum) whose
//! `POST /orders/{id}/pay` runs `pay_order` under `#[distributed_lock]`, and whose
//! `POST /transfers` runs `transfer` under `#[distributed_lock(keys = [...])]`,
//! writing to the shared database. The driver starts several, each a process of its own:
//! `orders instance --db orders.db --redis redis://…`.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use redlock_runtime::{LockClient, LockError, current_lock, current_locks, distributed_lock};
use serde_json::json;

use crate::db::{self, Charge, Moved};

/// How long the payment provider takes to answer, unless the request's
/// `x-provider-delay-ms` header says otherwise (the driver's pause scene does).
const PROVIDER_DELAY: Duration = Duration::from_millis(30);

/// How long the bank core takes to post a transfer, between the read of the two
/// balances and their write.
const BANK_CORE_DELAY: Duration = Duration::from_millis(15);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The loopback port to listen on (0: any free one; the instance prints it).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The Redis of the locks (one URL, or RedLock masters separated by commas).
    #[arg(long)]
    redis: String,
    /// The shared SQLite database file.
    #[arg(long)]
    db: PathBuf,
    /// The instance's name, in its answers and its lock client's name.
    #[arg(long, default_value = "a")]
    name: String,
    /// Pay and transfer with the same code but without `#[distributed_lock]`.
    #[arg(long)]
    without_lock: bool,
}

#[derive(Debug)]
struct Instance {
    name: String,
    db: PathBuf,
    without_lock: bool,
}

pub async fn run(args: Args) -> ExitCode {
    let client =
        match LockClient::builder_for(args.redis.split(',').filter(|u| !u.trim().is_empty()))
            .name(format!("orders-{}", args.name))
            .connect()
            .await
        {
            Ok(client) => client,
            Err(error) => {
                eprintln!("instance {}: {error}", args.name);
                return ExitCode::FAILURE;
            }
        };
    redlock_runtime::set_default_client(client.clone());
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "instance {}: listen on 127.0.0.1:{}: {error}",
                args.name, args.port
            );
            return ExitCode::FAILURE;
        }
    };
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    let instance = Arc::new(Instance {
        name: args.name.clone(),
        db: args.db,
        without_lock: args.without_lock,
    });
    let app = Router::new()
        .route("/orders/{id}/pay", post(pay_handler))
        .route("/transfers", post(transfer_handler))
        .with_state(instance);
    // The driver waits for this line, and reads the port from it.
    println!("listening on http://{addr}");
    // Graceful shutdown: on Ctrl-C or SIGTERM the listener closes (no new requests)
    // and the requests under way finish — each releases its lock as it returns.
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await;
    // Nothing is served any more, and every request has returned (releasing its
    // lock). What the client may still hold — a release a dropped request spawned —
    // is released before the process exits, and nothing new is taken.
    if let Err(error) = client.shutdown().await {
        eprintln!("instance {}: releasing at shutdown: {error}", args.name);
    }
    match served {
        Ok(()) => {
            println!("stopped taking requests, finished the ones under way, released its locks");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("instance {}: {error}", args.name);
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C or SIGTERM, whichever comes first.
async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => println!("Ctrl-C: shutting down"),
        _ = terminate.recv() => println!("SIGTERM: shutting down"),
    }
}

// ---------------------------------------------------------------------------------------
// The business functions: a payment, a transfer
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payment {
    Charged { token: u64 },
    AlreadyPaid,
}

#[derive(Debug)]
enum PayError {
    Lock(LockError),
    /// The database refused the write: a payment with a newer token came first.
    Stale {
        token: u64,
        seen: u64,
    },
    NoSuchOrder,
    Database(String),
}

impl fmt::Display for PayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayError::Lock(error) => write!(f, "{}", error.chain()),
            PayError::Stale { token, seen } => write!(
                f,
                "the database refused the write: fencing token {token} is older than {seen}"
            ),
            PayError::NoSuchOrder => write!(f, "no such order"),
            PayError::Database(error) => write!(f, "database: {error}"),
        }
    }
}

impl std::error::Error for PayError {}

impl From<LockError> for PayError {
    fn from(error: LockError) -> Self {
        PayError::Lock(error)
    }
}

/// One payer per order at a time, across the instances.
///
/// `on_lost = "continue"`: a process paused past its lease (the driver's SIGSTOP)
/// may wake up anywhere, between the runtime's last look at the lease and the write
/// as well; the database's fence is what refuses its write, and letting the body run
/// on shows that it does. (With the default `"abort"`, the body would also stop at
/// its next `.await` once the runtime notices the loss: a second line of defence,
/// not a replacement for the fence.)
#[distributed_lock(key = "order:<id>", wait = "3s", lease = "10s", on_lost = "continue")]
async fn pay_order(id: u64, instance: &Instance, provider: Duration) -> Result<Payment, PayError> {
    let token = current_lock().expect("under the lock").fencing_token();
    pay(id, instance, token, provider).await
}

/// The same function without the attribute (`--without-lock`): token 0, which the
/// fence never refuses.
async fn pay_order_without_lock(
    id: u64,
    instance: &Instance,
    provider: Duration,
) -> Result<Payment, PayError> {
    pay(id, instance, 0, provider).await
}

/// Read the order, call the payment provider, write the charge (fenced by `token`).
/// Without the lock, every concurrent attempt reads "pending" before any writes.
async fn pay(
    id: u64,
    instance: &Instance,
    token: u64,
    provider: Duration,
) -> Result<Payment, PayError> {
    let path = instance.db.clone();
    match blocking(move || db::status(&path, id))
        .await
        .map_err(PayError::Database)?
    {
        None => return Err(PayError::NoSuchOrder),
        Some(status) if status == "paid" => return Ok(Payment::AlreadyPaid),
        Some(_) => {}
    }
    let slow = provider != PROVIDER_DELAY;
    if slow {
        let lock = if instance.without_lock {
            "no lock".to_owned()
        } else {
            format!("locked, fencing token {token}")
        };
        println!(
            "order {id}: {lock}; calling the payment provider ({} ms)",
            provider.as_millis()
        );
    }
    tokio::time::sleep(provider).await;
    let (path, name) = (instance.db.clone(), instance.name.clone());
    match blocking(move || db::charge(&path, id, token, &name))
        .await
        .map_err(PayError::Database)?
    {
        Charge::Charged => {
            if slow && !instance.without_lock {
                println!("order {id}: charged with fencing token {token}");
            } else if slow {
                println!("order {id}: charged (no lock)");
            }
            Ok(Payment::Charged { token })
        }
        Charge::Stale { seen } => {
            println!("order {id}: the database refused the charge: token {token} < {seen}");
            Err(PayError::Stale { token, seen })
        }
    }
}

/// Runs a database call off the async threads.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(error) => Err(error.to_string()),
    }
}

#[derive(Debug)]
enum TransferError {
    Lock(LockError),
    /// The database refused the write: a transfer with a newer token wrote `account`.
    Stale {
        account: u64,
        token: u64,
        seen: u64,
    },
    NoSuchAccount,
    InsufficientFunds {
        balance: i64,
    },
    Database(String),
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransferError::Lock(error) => write!(f, "{}", error.chain()),
            TransferError::Stale {
                account,
                token,
                seen,
            } => write!(
                f,
                "the database refused the write: account {account}'s fencing token {token} \
                 is older than {seen}"
            ),
            TransferError::NoSuchAccount => write!(f, "no such account"),
            TransferError::InsufficientFunds { balance } => {
                write!(f, "insufficient funds: the balance is {balance} cents")
            }
            TransferError::Database(error) => write!(f, "database: {error}"),
        }
    }
}

impl std::error::Error for TransferError {}

impl From<LockError> for TransferError {
    fn from(error: LockError) -> Self {
        TransferError::Lock(error)
    }
}

/// The fencing tokens a transfer wrote its two accounts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tokens {
    from: u64,
    to: u64,
}

/// One transfer per account at a time, across the instances: both accounts are
/// locked as one, in the same (sorted) order whatever the direction, so that `1 → 2`
/// and `2 → 1` at once neither overlap nor deadlock. Each account's lock has its own
/// fencing token, and the write carries both.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "5s", lease = "10s")]
async fn transfer(
    from: u64,
    to: u64,
    amount: i64,
    instance: &Instance,
) -> Result<Tokens, TransferError> {
    let locks = current_locks();
    let token = |account: u64| {
        let key = format!("account:{account}");
        locks
            .iter()
            .find(|lock| lock.key() == key)
            .map(|lock| lock.fencing_token())
            .expect("a lock for each account")
    };
    let tokens = Tokens {
        from: token(from),
        to: token(to),
    };
    move_money(from, to, amount, instance, tokens).await
}

/// The same function without the attribute (`--without-lock`): tokens 0, which the
/// fence never refuses.
async fn transfer_without_lock(
    from: u64,
    to: u64,
    amount: i64,
    instance: &Instance,
) -> Result<Tokens, TransferError> {
    move_money(from, to, amount, instance, Tokens { from: 0, to: 0 }).await
}

/// Read both balances, have the bank core post the transfer, write both new balances
/// (fenced by `tokens`). Without the lock, two transfers touching one account both
/// read its balance before either writes, and the later write erases the earlier:
/// money is created or lost.
async fn move_money(
    from: u64,
    to: u64,
    amount: i64,
    instance: &Instance,
    tokens: Tokens,
) -> Result<Tokens, TransferError> {
    let path = instance.db.clone();
    let read = blocking(move || db::read_pair(&path, from, to))
        .await
        .map_err(TransferError::Database)?
        .ok_or(TransferError::NoSuchAccount)?;
    if read.0 < amount {
        return Err(TransferError::InsufficientFunds { balance: read.0 });
    }
    tokio::time::sleep(BANK_CORE_DELAY).await;
    let path = instance.db.clone();
    let transfer = db::Transfer {
        from,
        to,
        amount,
        read,
        from_token: tokens.from,
        to_token: tokens.to,
    };
    match blocking(move || db::transfer(&path, transfer))
        .await
        .map_err(TransferError::Database)?
    {
        Moved::Done => Ok(tokens),
        Moved::Stale {
            account,
            token,
            seen,
        } => {
            println!(
                "transfer {from} → {to}: the database refused the write: account {account}'s \
                 token {token} < {seen}"
            );
            Err(TransferError::Stale {
                account,
                token,
                seen,
            })
        }
    }
}

/// `POST /transfers` with `{"from": 1, "to": 2, "amount": 1250}` (cents): 200 done
/// (with both tokens), 400 for a transfer to the same account or a malformed one
/// (answered before any lock is taken), 404 for no such account, 422 for insufficient
/// funds, 409 when the database refused a stale write, 503 when an account stayed
/// locked for the whole wait.
async fn transfer_handler(
    State(instance): State<Arc<Instance>>,
    Json(request): Json<serde_json::Value>,
) -> (StatusCode, Json<serde_json::Value>) {
    let name = &instance.name;
    let (Some(from), Some(to), Some(amount)) = (
        request["from"].as_u64(),
        request["to"].as_u64(),
        request["amount"].as_i64(),
    ) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({
                "result": "expected {\"from\": account, \"to\": account, \"amount\": cents}",
                "instance": name,
            })),
        );
    };
    let bad = if from == to {
        Some("from and to are the same account")
    } else if amount <= 0 {
        Some("the amount must be positive")
    } else {
        None
    };
    if let Some(bad) = bad {
        return (
            StatusCode::BAD_REQUEST,
            Json(
                json!({"from": from, "to": to, "amount": amount, "result": bad, "instance": name}),
            ),
        );
    }
    let result = if instance.without_lock {
        transfer_without_lock(from, to, amount, &instance).await
    } else {
        transfer(from, to, amount, &instance).await
    };
    let (status, mut body) = match result {
        Ok(tokens) => (
            StatusCode::OK,
            json!({"result": "done", "from_token": tokens.from, "to_token": tokens.to}),
        ),
        Err(TransferError::Stale {
            account,
            token,
            seen,
        }) => (
            StatusCode::CONFLICT,
            json!({
                "result": "refused by the database: stale fencing token",
                "account": account,
                "token": token,
                "seen": seen,
            }),
        ),
        Err(TransferError::NoSuchAccount) => {
            (StatusCode::NOT_FOUND, json!({"result": "no such account"}))
        }
        Err(error @ TransferError::InsufficientFunds { .. }) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"result": "insufficient funds", "error": error.to_string()}),
        ),
        Err(TransferError::Lock(error)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({
                "result": if error.is_timeout() { "timed out" } else { "busy" },
                "error": error.chain().to_string(),
            }),
        ),
        Err(error @ TransferError::Database(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"result": "error", "error": error.to_string()}),
        ),
    };
    for (field, value) in [
        ("from", json!(from)),
        ("to", json!(to)),
        ("amount", json!(amount)),
        ("instance", json!(name)),
    ] {
        body[field] = value;
    }
    (status, Json(body))
}

/// `POST /orders/{id}/pay`: 200 charged or already paid, 409 when the database
/// refused a stale write (with both tokens), 503 when the order stayed locked for
/// the whole wait, 404 for no such order.
async fn pay_handler(
    State(instance): State<Arc<Instance>>,
    Path(id): Path<u64>,
    headers: HeaderMap,
) -> (StatusCode, Json<serde_json::Value>) {
    let provider = headers
        .get("x-provider-delay-ms")
        .and_then(|value| value.to_str().ok()?.parse().ok())
        .map_or(PROVIDER_DELAY, Duration::from_millis);
    let result = if instance.without_lock {
        pay_order_without_lock(id, &instance, provider).await
    } else {
        pay_order(id, &instance, provider).await
    };
    let name = &instance.name;
    match result {
        Ok(Payment::Charged { token }) => (
            StatusCode::OK,
            Json(json!({"order": id, "result": "charged", "token": token, "instance": name})),
        ),
        Ok(Payment::AlreadyPaid) => (
            StatusCode::OK,
            Json(json!({"order": id, "result": "already paid", "instance": name})),
        ),
        Err(PayError::Stale { token, seen }) => (
            StatusCode::CONFLICT,
            Json(json!({
                "order": id,
                "result": "refused by the database: stale fencing token",
                "token": token,
                "seen": seen,
                "instance": name,
            })),
        ),
        Err(PayError::NoSuchOrder) => (
            StatusCode::NOT_FOUND,
            Json(json!({"order": id, "result": "no such order", "instance": name})),
        ),
        Err(error @ PayError::Lock(_)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({"order": id, "result": "busy", "error": error.to_string(), "instance": name}),
            ),
        ),
        Err(error @ PayError::Database(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(
                json!({"order": id, "result": "error", "error": error.to_string(), "instance": name}),
            ),
        ),
    }
}
