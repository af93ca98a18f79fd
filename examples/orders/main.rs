//! An order service as users build it: several instances of an HTTP service
//! (processes, axum) share a SQLite database; `POST /orders/{id}/pay` runs
//! `pay_order` under `#[distributed_lock(key = "order:<id>")]`, and `POST /transfers`
//! runs `transfer` under `#[distributed_lock(keys = ["account:<from>", "account:<to>"])]`.
//!
//! ```text
//! cargo run --example orders                    # each order charged exactly once, no money made or lost
//! cargo run --example orders -- --without-lock  # the same service without the attribute
//! cargo run --example orders -- instance --redis redis://127.0.0.1:6379/ --db orders.db --port 8080
//! ```
//!
//! The default run is the driver: it creates the database in a temporary directory,
//! starts three instances (this same program, `orders instance …`) on free loopback
//! ports, and sends every order several payment requests at once, spread over the
//! instances (a double click, a retrying client, two instances behind a balancer).
//! `pay_order` reads the order, calls the payment provider, and writes the charge:
//! without the lock every attempt reads "pending" before any of them writes, and the
//! customer is charged several times. The driver counts the charges in the database.
//!
//! Then the transfers: 60 at once between four accounts, every pair in both
//! directions at the same time (`1 → 2` and `2 → 1`), over the instances. `transfer`
//! locks both accounts as one (in sorted order, so crossing transfers cannot
//! deadlock), reads both balances, calls the bank core, and writes both new balances
//! in one transaction, each row fenced by its own account's token (`db::MOVE`).
//! The driver checks that every transfer was done (none timed out, none refused),
//! that each balance is what its transfers make it and that the sum is unchanged;
//! without the lock, two transfers read one balance before either writes, the later
//! write erases the earlier, and money is created or lost.
//!
//! Then the pause, with real processes: instance a takes an order's lock and calls a
//! slow payment provider; the driver stops it with SIGSTOP until its lease has run
//! out; instance b takes the lock and charges; a is SIGCONTed and writes the charge
//! with its older fencing token — and the database refuses it, in the statement that
//! writes (`db::PAY`: `UPDATE … WHERE id = ? AND fence <= ?`). a answers 409 with
//! both tokens. Last, SIGTERM: each instance stops taking requests, finishes the ones
//! under way and exits.
//!
//! Files: `db.rs` the database and its fenced write; `instance.rs` the service;
//! `driver.rs` the default run; `http.rs` the driver's HTTP client.

mod db;
mod driver;
mod http;
mod instance;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    about = "An order service over HTTP, several processes, one SQLite database: each order charged exactly once, transfers that neither create nor lose money",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Role>,
    #[command(flatten)]
    driver: driver::Args,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// One instance of the service (the driver starts these).
    Instance(instance::Args),
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
    let cli = Cli::parse();
    match cli.command {
        Some(Role::Instance(args)) => instance::run(args).await,
        None => driver::run(cli.driver).await,
    }
}
