//! Distributed locks on Redis for async Rust.
//!
//! ```no_run
//! # async fn demo() -> Result<(), redlock_runtime::LockError> {
//! use std::time::Duration;
//! use redlock_runtime::LockClient;
//!
//! let client = LockClient::connect("redis://127.0.0.1:6379/").await?;
//! let guard = client
//!     .lock("order:42")
//!     .wait(Duration::from_secs(3))
//!     .lease(Duration::from_secs(10))
//!     .acquire()
//!     .await?;
//! let token = guard.fencing_token(); // pass it along with every write the lock protects
//! # let _ = token;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Or, with the attribute, [`distributed_lock`].
//!
//! # How it works
//! - **Acquire** is one Lua script, one round trip: `SET key owner NX PX lease`, and on
//!   success the next fencing token; otherwise the holder's remaining time to live.
//! - **Waiting** never polls. Within a client, waiters of a key line up in arrival order (their *turn*)
//!   and only the first talks to Redis; it subscribes to the key's release channel and
//!   retries when a release is published or the holder's lease runs out, whichever
//!   comes first.
//! - **Across clients** (processes), waiters wait on the key's *waitlist* in Redis: a
//!   failed attempt takes a place on it, and a release reserves the key for
//!   the client that has waited longest (for a short grace) and names it in its
//!   message, so only that client tries. Clients are served by arrival, give or take
//!   the hand-offs inside the releasing client (below); a named client that does not
//!   answer within the grace loses its turn, so a waiter that died costs one grace
//!   period. RedLock keeps no waitlist: there, fairness across clients is best effort.
//! - **Release** is compare-and-delete plus publish, in one script. When a task of the
//!   same client waits in line, the lock is handed to it instead, inside its acquire
//!   script (one round trip from release to next holder; at most 8 times in a row, then
//!   a release through Redis so that other clients' waiters get their chance).
//! - **Watchdog**: without a `lease`, the lock is held with the client's watchdog lease
//!   (30 s) and renewed every 10 s for as long as the guard lives; all locks of a
//!   client are renewed in one pipelined round trip per tick.
//! - **Fencing tokens**: one counter key per Redis server (per slot on a cluster);
//!   each acquisition takes `max(counter + 1, server clock in µs)`, so tokens keep
//!   increasing when the counter comes back stale or empty (restarts from a snapshot,
//!   an AOF or without persistence, a lagging replica promoted), as long as the new
//!   server's clock is not behind the old one's by more than the switch took.
//! - **Keys**: the lock is stored under the key itself; `redlock:fence` holds the
//!   counter; releases are published on `redlock:released:<key>`. The `redlock:`
//!   prefix is reserved: lock keys may not start with it.
//! - **Redis needs** `maxmemory-policy noeviction` (checked at connect, with a warning).
//!
//! # Modes
//! One server ([`LockClient::connect`]), RedLock over independent masters
//! ([`LockClient::redlock`]: majority, validity with clock drift, fencing written back to
//! the majority), Redis Cluster ([`LockClient::cluster`]: sharded pub/sub, per-slot
//! fencing) and a Sentinel-watched primary ([`LockClient::sentinel`], optionally
//! [`LockClientBuilder::confirm_replicas`]). [`LockClient::from_env`] picks one from
//! `REDLOCK_URL`. The attribute works the same on each.
//!
//! # Runtime
//! A client's connections and its watchdog live in the tokio runtime that created it.
//!
//! # Design
//! For contributors: how the runtime is built, bottom up. Each module uses only those
//! above it in this list (`tests/layers.rs` fails on an upward path); the decisions are
//! plain functions or state machines with unit tests, and the I/O is around them.
//!
//! | layer | modules | concern |
//! |---|---|---|
//! | basics | `error`, `config` | [`LockError`]; client settings, their limits and checks |
//! | wire | `scripts`, `sentinel`, `connection` | the Lua scripts and the fencing scheme; one connection to a server, a Cluster or Sentinel's primary; key, slot and channel names |
//! | news | `notify` | release messages demultiplexed to the waiters of one client (`Release::parse`) |
//! | servers | `node`, `masters` | one server's operations as single script calls (reply parsing: `parse_attempt`); RedLock's majority (`Tally`, `MajorityCount`: pure counting) with the I/O around it |
//! | requests | `limits` | what a request may ask for, refused before anything is sent |
//! | in-process | `turn`, `state`, `watchdog`, `cleanup` | the *turn* (a client's per-key FIFO line of tasks) and the *hand-off* inside it; a held lock's shared state (lost? lease surely until when?); batched renewal; the one spawn-on-drop helper |
//! | client | `core`, `guard`, `acquire`, `client` | a client's shared core (servers, settings, turns, watchdog, owner tokens); [`LockGuard`]; [`LockRequest`]; [`LockClient`] and its builder |
//! | attribute | `macro_support` | the default client, reentrancy, [`current_lock`], what `#[distributed_lock]` calls |
//!
//! Words: the **turn** is in-process (one task of a client at a time talks to Redis
//! about a key); the **waitlist** is in Redis (clients waiting for a key, by arrival;
//! a release *reserves* the key for its head); a **hand-off** passes a lock from a task
//! to the next task of the same client inside the latter's acquire script.
//!
//! **The life of one acquisition** (`acquire::LockRequest::acquire`): `Plan::check`
//! refuses what can be refused without Redis (key, durations, `max_lease`); the task
//! takes its turn at the key (`turn`), picking up a hand-off's baton if a releasing
//! task left one; then `Attempts` loops — `attempt` runs the acquire script (every
//! master with RedLock, decided by `masters::Tally` as soon as a majority settles it;
//! a clean-up is armed until the outcome is known), and on *busy* `wait_for_news`
//! subscribes once and sleeps until a release message lets it try (`notify::Release`)
//! or the lease it was told (or a reservation, or an announced `T:<ms>`/`K:<ms>`) ends;
//! on no answer `back_off` retries within the wait. The whole call is bounded by
//! `wait` plus the response timeout. Acquired, the guard gets a `state::LockState`
//! holding the turn; the watchdog renews it in batches; `release` hands off to the
//! next task of the client or frees the key in Redis (reserving it for the waitlist's
//! head), then passes the turn.
//!
//! **More primitives** (read-write lock, semaphore, election) reuse all of this: the
//! connection and notifications, the turn and waiting loop, the watchdog, fencing,
//! the guard's life cycle and the clean-up on drop. Each adds its own scripts (in
//! `scripts`, with a reply type parsed in `node`) and its own request type beside
//! `acquire`, whose `Attempts` only needs "try" and "what did the reply say".

mod acquire;
mod cleanup;
mod client;
mod config;
mod connection;
mod core;
mod error;
mod guard;
mod limits;
mod macro_support;
mod masters;
mod node;
mod notify;
mod scripts;
mod sentinel;
mod state;
mod turn;
mod watchdog;

pub use acquire::LockRequest;
pub use client::{LockClient, LockClientBuilder};
pub use config::{DEFAULT_MAX_LEASE, DEFAULT_URL, MAX_KEY_LEN};
pub use error::LockError;
pub use guard::LockGuard;
pub use macro_support::{CurrentLock, current_lock, default_client, set_default_client};
pub use redlock_macros::distributed_lock;

/// What the code generated by `#[distributed_lock]` calls. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_support::{LockSpec, client_from, run_locked, typed_body};
    pub use crate::{LockClient, LockError};
    pub use ::core::future::Future;
    pub use ::core::option::Option::{self, None, Some};
    pub use ::core::result::Result::{self, Err, Ok};
    pub use ::core::time::Duration;
    pub use ::std::format;
    pub use ::std::string::String;
}

impl LockClient {
    /// Number of locks this client currently renews in watchdog mode.
    pub fn watched_locks(&self) -> usize {
        self.inner.watchdog().len()
    }

    /// Number of keys this client's tasks hold or wait for.
    pub fn active_keys(&self) -> usize {
        self.inner.turns().len()
    }
}
