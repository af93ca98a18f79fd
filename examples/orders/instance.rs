//! One instance of the order service: an HTTP server (axum) whose
//! `POST /orders/{id}/pay` runs `pay_order` under `#[distributed_lock]`, writing to
//! the shared database. The driver starts several, each a process of its own:
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
use redlock_runtime::{LockClient, LockError, current_lock, distributed_lock};
use serde_json::json;

use crate::db::{self, Charge};

/// How long the payment provider takes to answer, unless the request's
/// `x-provider-delay-ms` header says otherwise (the driver's pause scene does).
const PROVIDER_DELAY: Duration = Duration::from_millis(30);

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
    /// Pay with the same code but without `#[distributed_lock]`.
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
// The business function
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
    match blocking(move || db::status(&path, id)).await? {
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
    match blocking(move || db::charge(&path, id, token, &name)).await? {
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
) -> Result<T, PayError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result.map_err(|error| PayError::Database(error.to_string())),
        Err(error) => Err(PayError::Database(error.to_string())),
    }
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
