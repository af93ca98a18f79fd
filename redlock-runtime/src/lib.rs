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
//! // At exit (SIGTERM, Ctrl-C, end of `main`): release what is held, take nothing new.
//! client.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Or, with the attribute, [`distributed_lock`] (and at exit
//! [`shutdown_default_client`]).
//!
//! # How it works
//! - **Acquire** is one Lua script, one round trip: `SET key owner NX PX lease`, and on
//!   success the next fencing token; otherwise the holder's remaining time to live.
//!   The lock's value also names its holder (owner token, fencing token, since when,
//!   the client's [name](LockClientBuilder::name)), so that
//!   [`LockClient::inspect`], [`LockClient::locks`] and the `redlock` command can tell
//!   who holds what with no side keys.
//! - **Waiting** never polls. Within a client, waiters of a key line up in arrival order (their *turn*)
//!   and only the first talks to Redis; it subscribes to the key's release channel and
//!   retries when a release is published or the holder's lease runs out, whichever
//!   comes first. A try-lock (no `wait`) does not line up: it asks Redis, and succeeds
//!   whenever the key is free there, even while a task of its client waits for it;
//!   only a lock another task of its client holds (by the client's own account: its
//!   lease not run out) refuses it at once, without a round trip.
//! - **Across clients** (processes), waiters wait on the key's *waitlist* in Redis: a
//!   failed attempt takes a place on it, and a release *grants* the key to the client
//!   that has waited longest: the release script makes it the holder (its owner token,
//!   the next fencing token, for the grace: [`LockClientBuilder::reservation_grace`],
//!   100 ms by default) and tells only that client, on a channel of its own. The waiter
//!   holds the lock from the message alone and confirms it (an extension to its lease)
//!   in the background while its work runs; the other waiters sleep on. A run of
//!   readers at the head of the line is granted together; a semaphore's freed permit
//!   goes to its next waiter. Clients are served by arrival, give or take the hand-offs
//!   inside the releasing client (below). A grant nobody confirms lapses with the grace
//!   and the releasing client passes it on; a waiter whose process is gone is skipped
//!   at once, one that gives up passes its grant on. RedLock keeps no waitlist: there,
//!   fairness across clients is best effort.
//! - **Release** is compare-and-delete plus publish, in one script; a lock that no
//!   attempt found busy (none marked it *contended*) has no one to tell and is deleted
//!   without a message. When a task of the
//!   same client waits in line, the lock is handed to it instead, inside its acquire
//!   script (one round trip from release to next holder; at most 8 times in a row, then
//!   a release through Redis so that other clients' waiters get their chance). The
//!   release waits for that script's verdict — was the lock still its own? — for at
//!   most 100 ms until the next in line picks it up and the response timeout after
//!   that; a next in line that fails, is cancelled or is no longer polled cannot hold
//!   it up longer. The release then goes through Redis and reports its answer, except
//!   that a key found gone once the next in line's script was sent (and is lost to
//!   view) counts as handed off, unless its lease may have run out.
//! - **Watchdog**: without a `lease`, the lock is held with the client's watchdog lease
//!   (30 s by default) and renewed every third of it (10 s) for as long as the guard
//!   lives (settings not given follow those given: see `LockClientBuilder`); all locks of a
//!   client are renewed in one pipelined round trip per tick.
//! - **Fencing tokens**: one counter key per Redis server (per slot on a cluster);
//!   each acquisition takes `max(counter + 1, server clock in µs)`, so tokens keep
//!   increasing when the counter comes back stale or empty (restarts from a snapshot,
//!   an AOF or without persistence, a lagging replica promoted), as long as the new
//!   server's clock is not behind the old one's by more than the switch took.
//! - **Fenced writes**: a token helps only if the store checks it. A resource in
//!   Redis is written through [`FencedKey::write`] (one script: write if the token is
//!   at least the highest the resource has seen, else [`FencedWrite::Stale`]); a SQL
//!   store checks it in the write itself — see "Fencing a database" below.
//! - **Keys**: the lock is stored under the key itself; `redlock:fence` holds the
//!   counter (with RedLock, `redlock:boot` the restart marker); while clients wait,
//!   `redlock:waitlist:<key>` and `redlock:waitlist-expiry:<key>` hold the line (they
//!   expire a little after the last waiter's registration, at most tens of seconds
//!   after it gave up); releases someone may be waiting for are published on
//!   `redlock:released:<key>`, grants on the granted client's
//!   `redlock:granted:<client id>:<key>`; a force-unlock leaves
//!   `redlock:forced:<key>` (the evicted owner, expiring with the lease it evicted) so
//!   that the evicted holder can tell why its lock is gone, and a hand-off leaves
//!   `handed:<owner>` there for three response timeouts and a second, so that a
//!   release that did not hear its taker tells a lock handed off from one lost; a key held in shares has
//!   `redlock:holders:<key>` and `redlock:names:<key>` beside it (see "The lock
//!   family"). The `redlock:`
//!   prefix is reserved: lock keys may not start with it.
//! - **Redis needs** `maxmemory-policy noeviction` (checked at connect, with a warning).
//!
//! # The lock family
//! Besides the exclusive [`LockClient::lock`], one client offers:
//!
//! - [`LockClient::read_lock`] / [`LockClient::write_lock`]: any number of readers or
//!   one writer; writer-preferring (once a writer waits, new readers queue behind it,
//!   and join the readers in as soon as it gives up, or within about 3 s when it dies);
//!   a lease per reader, so a dead reader's share ends with its own lease;
//!   `write_lock(k)` is `lock(k)`.
//! - [`LockClient::semaphore`]: at most N holders, a lease per permit, nothing left in
//!   Redis once no permit is held, [`LockError::PermitsMismatch`] for another count.
//! - [`LockClient::lock_all`]: several keys as one ([`MultiLockGuard`]), exclusive,
//!   all or nothing; each key a plain lock with its own fencing token, taken in byte
//!   order so that callers naming the same keys in any order never deadlock; in every
//!   mode (keys in different Cluster slots included).
//! - [`LockClient::election`]: [`Election::campaign`] waits until elected and leads
//!   with the watchdog lease; the term is the fencing token; [`Election::leader`] names
//!   the leader.
//!
//! Each gives a [`LockGuard`] (`lock_all` a [`MultiLockGuard`] of them) and takes the
//! same `wait`, `lease` and `hold_at_least`.
//! A key held in shares (readers, permits) holds `shared:<permits>` (0: a read lock)
//! with the lease of its longest share, `redlock:holders:<key>` the holders, each
//! scored with its own lease's end, and `redlock:names:<key>` each share's fencing
//! token and client name (for [`LockClient::inspect`]); both go with the last share.
//! The scripts that release, extend and renew a lock do the same for a share. Read locks and semaphores need one server, Sentinel or
//! Cluster (RedLock refuses them with [`LockError::InvalidOptions`]).
//!
//! ```no_run
//! # async fn demo(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
//! use std::time::Duration;
//! let d = Duration::from_secs(3);
//! let reader = client.read_lock("doc:7").wait(d).acquire().await?;
//! let permit = client.semaphore("partner-api", 5).wait(d).lease(d).acquire().await?;
//! let leader = client.election("lottery-scheduler").leader().await?;
//! # drop((reader, permit, leader)); Ok(()) }
//! ```
//!
//! # Fencing a database
//! A holder can be paused past its lease (a GC pause, a stopped VM, a network stall)
//! and wake up to write while another process holds the lock and has written: the
//! lock alone cannot stop it (Kleppmann, *How to do distributed locking*, 2016). The
//! store can, if every write carries the lock's [fencing token](LockGuard::fencing_token)
//! and the store refuses a token below the highest it has recorded for that row — in
//! the same statement (or transaction), so that nothing slips between the check and
//! the write. In SQL (SQLite, Postgres and MySQL alike), with a `fence` column:
//!
//! ```sql
//! -- orders.fence: the highest token a payment of the order was written with (0 at first)
//! UPDATE orders SET status = 'paid', fence = :token WHERE id = :id AND fence <= :token;
//! -- 0 rows changed: a holder with a newer token wrote first; roll back
//! ```
//!
//! Every other write of the same unit of work (the debit, the charge's row) goes in
//! the same transaction, which commits only if that `UPDATE` changed its row. A
//! resource with no row yet takes the same check as an upsert (SQLite and Postgres:
//! `INSERT … ON CONFLICT (k) DO UPDATE SET fence = excluded.fence WHERE fence <=
//! excluded.fence`). `examples/orders` does this (SQLite, instances over HTTP, one of
//! them paused with `SIGSTOP`), `examples/lottery` the upsert; in Redis,
//! [`FencedKey`] does it for you.
//!
//! # Modes
//! One server ([`LockClient::connect`]), RedLock over independent masters
//! ([`LockClient::redlock`]: majority, validity with clock drift, fencing written back to
//! the majority), Redis Cluster ([`LockClient::cluster`][cluster-fn], feature `cluster`: sharded
//! pub/sub, per-slot fencing) and a Sentinel-watched primary ([`LockClient::sentinel`][sentinel-fn],
//! feature `sentinel`; optionally
//! [`LockClientBuilder::confirm_replicas`]). [`LockClient::from_env`] picks one from
//! `REDLOCK_URL`. The attribute works the same on each.
//!
//! # Cargo features
//! The default build is lean: one server and RedLock over plain TCP, with the
//! attribute, the watchdog, fencing and wake-ups. Opt in to:
//!
//! | feature | adds |
//! |---|---|
//! | `cluster` | Redis Cluster: [`LockClient::cluster`][cluster-fn], [`LockClientBuilder::cluster`][cluster-builder], `cluster:` specs in `REDLOCK_URL` (the redis crate's async cluster client) |
//! | `sentinel` | a primary that Redis Sentinel names, followed across failovers: [`LockClient::sentinel`][sentinel-fn], [`LockClientBuilder::sentinel`][sentinel-builder], `sentinel:NAME:` specs (the redis crate's Sentinel client) |
//! | `tls` | `rediss://` URLs (rustls with its `ring` provider, through the redis crate's TLS), trusting the system's roots or [`LockClientBuilder::tls_root_certificate`]; without it a `rediss://` URL is refused at `connect()` with a message naming the feature |
//! | `metrics` | the metrics below, through the `metrics` facade (any exporter) |
//! | `test-util` | [`test_util::RedisServer`][test-util-server]: a throwaway `redis-server` on a free loopback port and a client connected to it, for testing your own code (a dev-dependency); `test_util::RedlockMasters`: several, as RedLock masters vouched for, which lock at once |
//! | `cli` | the `redlock` command: `cargo install --path redlock-runtime --features cli` from a checkout (with `cluster`, `sentinel` and `tls`, so that it reaches every mode) |
//!
//! Without `cluster` (or `sentinel`), a `cluster:` (or `sentinel:`) spec is refused at
//! `connect()` with a [`LockError::Connect`] naming the feature to add; the items that
//! need a feature are marked with it on docs.rs.
//!
//! # Runtime
//! A client's connections and its watchdog live in the tokio runtime that created it.
//!
//! **Exit.** [`LockClient::shutdown`] (or [`shutdown_default_client`]) ends a client
//! cleanly: no new acquisition, every held lock released, the releases running in the
//! background waited for — call it when the program is told to stop, so that the next
//! instance of a rolling deploy does not wait out a lease. Without it, a guard dropped
//! as `main` returns, or a task cut short there, is still released: the release runs
//! in the background, and when the runtime shuts down first (`#[tokio::main]` drops
//! it as `main` returns, and with it every unfinished task) the runtime's shutdown
//! sends it on a connection of its own, waiting for Redis's answer at most a second
//! per client (less when the connect and response timeouts add up to less), like
//! `BufWriter` flushing on drop. A guard dropped outside any runtime, or a process
//! killed (`SIGKILL`, `std::process::exit`), leaves its lock to its lease.
//!
//! # Tracing
//! Through [`tracing`](https://docs.rs/tracing): a `redlock.acquire` span per acquisition
//! and events for releases, extensions and retries at DEBUG; a lost lock or a forced
//! unlock at WARN. The target `redlock::timing` carries TRACE events marking the steps
//! of an acquisition and of a hand-off (`turn_taken`, `script_sent`, `script_answered`,
//! `baton_left`), for timing them (`scripts/bench.sh --trace-handoff` does); off unless
//! a subscriber enables that target, they then cost a disabled call site.
//!
//! # Metrics
//! With the feature `metrics`, the locks are measured through the [`metrics`](https://docs.rs/metrics) facade:
//! whatever recorder the application installs (`metrics-exporter-prometheus`, a StatsD
//! or OpenTelemetry bridge, …) receives them. Without the feature no metrics code is
//! compiled.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `redlock_acquire_seconds` | histogram | `lock`, `outcome` = `acquired` / `timeout` / `error` | from the call to [`LockRequest::acquire`] (or the attribute's) until acquired or given up (a cancelled call records nothing) |
//! | `redlock_hold_seconds` | histogram | `lock` | from acquired until released (or handed off), or lost: a lease that ran out ends when it ran out |
//! | `redlock_lost_total` | counter | `lock`, `cause` = `lease` / `renewal` / `forced` | locks lost while held: the lease ran out (not renewed or extended in time, or Redis unreachable); a renewal, [`extend`](LockGuard::extend) or release found it gone (deleted, taken); or it was [force-unlocked](LockClient::force_unlock) |
//! | `redlock_renewals_total` | counter | `lock` | each lock a watchdog renewal kept |
//! | `redlock_renewal_failures_total` | counter | `lock` | each lock a watchdog renewal did not keep: found gone, or no answer |
//! | `redlock_handoffs_total` | counter | `lock`, `kind` = `hand_off` / `grant` | `hand_off`: locks passed to the next task of the same client without a release in Redis; `grant`: locks this client received by a grant, from another client's release or its own through Redis (see "How it works") |
//! | `redlock_waiting` | gauge | `lock` | tasks of this process waiting for a lock: in line behind another task of their client, or for a holder elsewhere (or for Redis to answer); a label's series appears once a task under it has waited (an acquisition that finds its turn free is not counted) |
//!
//! `lock` is a label with few values, never the key: every distinct label is a time
//! series of its own. [`LockRequest::label`] sets it (`client.lock(key).label("order")`);
//! `#[distributed_lock]` sets its key *template* (`order:<id>`, never `order:42`); a
//! lock given no label counts under `lock="-"`. A loss is counted once per acquisition,
//! by whichever of the watchdog, `extend` and the release finds it first; `forced` is
//! told from `renewal` by the marker a force-unlock leaves (see "Keys" above), which
//! the holder's next renewal, extension or release reads in the same script, on the
//! path where the lock is already gone: no round trip is added.
//!
//! # Design
//! For contributors: how the runtime is built, bottom up. Each module uses only the
//! modules of the layers before it (`tests/layers.rs` fails on any other path). The
//! decisions that need no Redis — what a reply means, whether a majority holds, what a
//! release message says, what a request or a setting may be — are plain functions with
//! unit tests; the I/O is around them; the protocol as a whole is model-checked
//! (`tests/model.rs`).
//!
//! **Basics** — `error` (the one [`LockError`]) and `config` (client settings, their
//! limits and the checks naming a bad one; how a URL is shown) depend on nothing;
//! nor does `metrics` (feature `metrics`: the instruments, each an empty function
//! without the feature), which the layers above call where the measured thing happens,
//! nor `cleanup`, the one way to finish interrupted work in the background (and count
//! it, and run a fallback for work a runtime shutting down drops unfinished): a node
//! counts its lapsed-grant checks with it, a client its background releases; nor
//! does `grant`, a grant's steps on the client it was made to (delivered, read, taken,
//! confirmed or let go; and the next waiter's lapse), each a type whose methods are its
//! only transitions; nor `grant_watch`, which decides when a client checks the grants
//! its releases made (one check of a key at a time, pure: the node runs it).
//!
//! **Wire** — `scripts` holds every Lua script, the names of the keys the library keeps
//! and the fencing scheme; `sentinel` follows the primary Sentinel names;
//! `connection` is one connection to a server, a Cluster or that primary, knows where a
//! key's companion keys and channel live (slots, hash tags) and retries while a slot
//! moves; `confirm` keeps connections of their own for `WAIT`-confirmed acquisitions.
//!
//! **News** — `notify` subscribes to release channels over the client's RESP3
//! connection (on a Cluster, connections that only subscribe: see `connect::cluster`)
//! and tells each waiter what a message means for it (`Release::parse`).
//!
//! **Servers** — `node` is one server: each lock operation as one script call, its reply
//! parsed into a type (`parse_attempt`); `connect` builds a node in each mode (server,
//! Cluster, Sentinel). `masters` is the majority over servers
//! (RedLock): `Tally` and `MajorityCount` decide from the answers so far, pure, and the
//! I/O around them lets slow masters finish in the background.
//!
//! **Requests** — `limits` refuses what a request may not ask for (key, durations,
//! `max_lease`) before anything is sent. `fenced` ([`FencedKey`]) writes a user's
//! resource if the writer's token is recent enough, over any connection: it needs
//! only `limits` and `error`.
//!
//! **In-process** — `hand_off` decides whether a releasing task may pass its lock to
//! the next task of the client and carries the baton (pure, no Redis); `turn` is a
//! client's per-key FIFO line of tasks, with one baton slot per key; `state` is one held lock's shared state (lost? lease
//! surely until when?), which holds the turn and passes it; `watchdog` renews every
//! lock of a client in one pipeline per tick.
//!
//! **Client** — `core` is what all clones of a client share (servers, settings, turns,
//! watchdog, owner tokens, the locks its guards hold, its background releases and
//! their sending at exit on a connection of its own), reached through methods; `guard` is [`LockGuard`]; `acquire`
//! is [`LockRequest`]; `operate` reads who holds a lock (or every lock matching a
//! pattern), force-unlocks ([`LockInfo`]) and vouches for a new RedLock deployment's
//! masters; `multi` is [`MultiLockRequest`] and [`MultiLockGuard`] (several keys as one:
//! each key a plain [`LockRequest`], taken in one global order — deduplicated, byte
//! order — with the time left of one deadline, so no wait-for cycle can form; the keys
//! taken are given back on any failure; see [`LockClient::lock_all`]); `client` is
//! [`LockClient`] and its builder.
//! The `redlock` command (`src/bin`, feature `cli`) uses the public API only.
//!
//! **Attribute** — `macro_support`: the default client, reentrancy, [`current_lock`]
//! and [`current_locks`], and `run_locked` (`run_locked_all` for `keys = [...]`), which
//! the expansion of `#[distributed_lock]` calls.
//!
//! Words: the **turn** is in-process (one task of a client at a time talks to Redis
//! about a key); the **waitlist** is in Redis (clients waiting for a key, by arrival);
//! a **grant** makes the waitlist's head the holder inside the release script and tells
//! it alone (a waiter of an older redlock gets a *reservation* instead: the key kept
//! for it, for it to take); a **hand-off** passes a lock from a task to the next task of
//! the same client inside the latter's acquire script.
//!
//! **The life of one acquisition** (`acquire::LockRequest::acquire`): `Plan::check`
//! refuses what can be refused without Redis (key, durations, `max_lease`); the task
//! takes its turn at the key (`turn`), picking up a hand-off's baton if a releasing
//! task left one; then `Attempts` loops — `attempt` runs the acquire script (every
//! master with RedLock, decided by `masters::Tally` as soon as a majority settles it;
//! a clean-up is armed until the outcome is known), and on *busy* `wait_for_news`
//! subscribes once (to the key's release channel and its client's grant channel) and
//! sleeps until a grant makes it the holder, a release message lets it try
//! (`notify::Release`), or the lease it was told (or a reservation, or an announced
//! `T:<ms>`/`K:<ms>`) ends; a grant gives the guard at once, valid for the grace from
//! the grant (timed from the waiter's registration) until its confirmation, sent before
//! the guard is returned, extends it;
//! on no answer `back_off` retries within the wait. The whole call is bounded by
//! `wait` plus the response timeout. Acquired, the guard gets a `state::LockState`
//! holding the turn; the watchdog renews it in batches; `release` hands off to the
//! next task of the client or frees the key in Redis (granting it to the waitlist's
//! head, and checking a little after the grace that the grant was taken: `node`'s
//! `watch_grant`), then passes the turn. The hand-off's outcome comes back with the baton
//! (`hand_off::Baton`): whether the taker's script found the lock still there, or that
//! the taker gave it back — it went away before sending one, or its script failed and
//! may not have run — and then the release goes through Redis and its answer says; the
//! releaser waits for it at most the response timeout after the pick-up limit. A
//! try-lock that finds the turn held by a task with no lock yet (still trying, or
//! waiting for a holder elsewhere) attempts beside it (`turn::Turn::Beside`): no baton,
//! and no turn for its guard.
//!
//! **More primitives** (read-write lock, semaphore, election) reuse the connection and
//! notifications, the turn, the watchdog, fencing, the guard's life cycle and the
//! clean-up on drop. The acquire loop is written once over an `acquire::Kind`: what one
//! attempt sends (its script, whose reply a `masters::Outcome` says) and how an
//! interrupted attempt is undone; `acquire::Exclusive` is the plain lock's. A new
//! primitive adds its scripts (in `scripts`, with a reply parsed in `node`), its
//! operation in `masters`, and a `Kind` with a request builder beside `acquire`.

#![cfg_attr(docsrs, feature(doc_cfg))]
// The items of a feature exist only with it: without it, their links in the docs above
// point to the table of features, so that `cargo doc` builds without warnings either way.
// (A blank line first: a link's definition cannot continue a paragraph.)
#![doc = ""]
#![cfg_attr(feature = "cluster", doc = "[cluster-fn]: LockClient::cluster")]
#![cfg_attr(
    feature = "cluster",
    doc = "[cluster-builder]: LockClientBuilder::cluster"
)]
#![cfg_attr(not(feature = "cluster"), doc = "[cluster-fn]: #cargo-features")]
#![cfg_attr(not(feature = "cluster"), doc = "[cluster-builder]: #cargo-features")]
#![cfg_attr(feature = "sentinel", doc = "[sentinel-fn]: LockClient::sentinel")]
#![cfg_attr(
    feature = "sentinel",
    doc = "[sentinel-builder]: LockClientBuilder::sentinel"
)]
#![cfg_attr(not(feature = "sentinel"), doc = "[sentinel-fn]: #cargo-features")]
#![cfg_attr(not(feature = "sentinel"), doc = "[sentinel-builder]: #cargo-features")]
#![cfg_attr(
    feature = "test-util",
    doc = "[test-util-server]: test_util::RedisServer"
)]
#![cfg_attr(
    not(feature = "test-util"),
    doc = "[test-util-server]: #cargo-features"
)]

mod acquire;
mod cleanup;
mod client;
mod config;
mod confirm;
mod connect;
mod connection;
mod core;
mod election;
mod error;
mod fenced;
mod grant;
mod grant_watch;
mod guard;
mod hand_off;
mod limits;
mod macro_support;
mod masters;
mod metrics;
mod multi;
mod node;
mod notify;
mod operate;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
mod state;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod test_util;
mod turn;
mod watchdog;

pub use acquire::LockRequest;
pub use client::{LockClient, LockClientBuilder};
pub use config::{DEFAULT_MAX_LEASE, DEFAULT_URL, MAX_KEY_LEN, MAX_NAME_LEN};
pub use election::Election;
pub use error::LockError;
pub use fenced::{FencedKey, FencedWrite};
pub use guard::LockGuard;
pub use macro_support::{
    AsLockClient, CurrentLock, FromLockError, LockedResult, SkippableResult, current_lock,
    current_locks, default_client, set_default_client, shutdown_default_client,
};
pub use multi::{MultiLockGuard, MultiLockRequest};
pub use operate::{LockInfo, LockKind, Share};
pub use redlock_macros::distributed_lock;

/// What the code generated by `#[distributed_lock]` calls. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_support::{Conversions, LockMode, LockSpec, run_locked, run_locked_all};
    pub use crate::{LockClient, LockError};
    pub use ::core::clone::Clone;
    pub use ::core::future::Future;
    pub use ::core::option::Option::{self, None, Some};
    pub use ::core::result::Result::{self, Err, Ok};
    pub use ::core::time::Duration;
    pub use ::std::format;
    pub use ::std::string::String;
}
