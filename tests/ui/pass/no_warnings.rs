//! The expansion gives no warning and no lint in the user's code: every lint group a strict
//! crate denies is denied here, and tests/macro_lints.rs runs `cargo clippy -- -D warnings`
//! over this same file. One-line bodies (`{ save(id).await }`) are the case that once
//! drew rustc's `unused_braces` on the user's braces, with a fix that broke the function.
#![deny(warnings, unused, rust_2018_idioms, missing_docs)]
#![forbid(unsafe_code)]

use std::sync::Arc;

use redlock_runtime::{LockClient, LockError, distributed_lock};

/// What the bodies await.
async fn save(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

/// The shape: a free function, default client, one-line body.
#[distributed_lock(key = "order:<id>")]
async fn pay(id: u64) -> Result<u64, LockError> { save(id).await }

/// A scheduled job that skips when busy.
#[distributed_lock(key = "report:<day>", wait = "1s", on_busy = "skip")]
async fn report(day: u32) -> Result<Option<u32>, LockError> { Ok(Some(day)) }

/// Several keys locked as one (issue 35), one-line body.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "3s", lease = "10s")]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> { save(from + to).await }

/// A cluster hash tag, a fixed lease, `hold_at_least`, `on_lost = "continue"`.
#[distributed_lock(key = "{order:<id>}:audit", lease = "10s", hold_at_least = "1s", on_lost = "continue")]
async fn audit(id: u64) -> Result<(), LockError> { save(id).await.map(drop) }

/// A service holding its client.
#[derive(Debug)]
struct Service {
    locks: LockClient,
    shared: Arc<LockClient>,
}

impl Service {
    /// `client = &self.locks`, one-line body.
    #[distributed_lock(key = "account:<id>", client = &self.locks, wait = "3s")]
    async fn deposit(&self, id: u64) -> Result<u64, LockError> { save(id).await }

    /// `client = self.locks` without the `&`, and `on_busy = "skip"`.
    #[distributed_lock(key = "account:<id>", client = self.locks, on_busy = "skip")]
    async fn try_deposit(&self, id: u64) -> Result<Option<u64>, LockError> { save(id).await.map(Some) }

    /// `mode = "read"`.
    #[distributed_lock(key = "doc:<id>", client = &self.locks, mode = "read")]
    async fn load(&self, id: u64) -> Result<u64, LockError> { save(id).await }

    /// `mode = "write"`, through an `Arc`.
    #[distributed_lock(key = "doc:<id>", client = self.shared, mode = "write", wait = "5s")]
    async fn store(&self, id: u64) -> Result<u64, LockError> { save(id).await }

    /// `permits`, with `on_busy = "skip"`.
    #[distributed_lock(key = "partner:<tenant>", client = &self.locks, permits = 5, on_busy = "skip")]
    async fn call_partner(&self, tenant: &str) -> Result<Option<usize>, LockError> { Ok(Some(tenant.len())) }

    /// `permits` with a one-line body that awaits.
    #[distributed_lock(key = "slot:<id>", client = self.shared, permits = 2, wait = "1s")]
    async fn slot(&self, id: u64) -> Result<u64, LockError> { save(id).await }

    /// `keys` with a client, `on_busy = "skip"`, `hold_at_least`, `on_lost = "continue"`.
    #[distributed_lock(keys = ["account:<from>", "account:<to>"], client = &self.locks, on_busy = "skip",
                       lease = "10s", hold_at_least = "1s", on_lost = "continue")]
    async fn try_transfer(&self, from: u64, to: u64) -> Result<Option<u64>, LockError> { save(from + to).await.map(Some) }

    /// `keys` through an `Arc`, a unit body.
    #[distributed_lock(keys = ["ledger:<day>", "report:<day>"], client = self.shared)]
    async fn close_day(&self, day: u32) -> Result<(), LockError> { Ok(()) }

    /// A unit body on one line.
    #[distributed_lock(key = "nightly", client = self.locks)]
    async fn nightly(&self) -> Result<(), LockError> { Ok(()) }
}

fn main() {
    // Built, never polled: the compiler sees every function used.
    let _never_polled = async {
        let locks = LockClient::connect("redis://127.0.0.1:1/").await?;
        let service = Service {
            shared: Arc::new(locks.clone()),
            locks,
        };
        pay(1).await?;
        transfer(1, 2).await?;
        report(1).await?;
        audit(1).await?;
        service.deposit(1).await?;
        service.try_deposit(1).await?;
        service.load(1).await?;
        service.store(1).await?;
        service.call_partner("acme").await?;
        service.slot(1).await?;
        service.nightly().await?;
        service.try_transfer(1, 2).await?;
        service.close_day(1).await?;
        Ok::<(), LockError>(())
    };
}
