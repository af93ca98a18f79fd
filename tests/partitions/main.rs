//! Network partitions, for real: Redis servers and client processes in network
//! namespaces of their own (see [`net`]), cut from each other while they work, with
//! every hold recorded and checked by the reliability suite's history checker.
//!
//! Needs root and iproute2 (`ip netns`); without them every test prints one line
//! saying so and passes. Nothing leaves the namespaces a test makes: their addresses
//! are private and they have no default route.
//!
//! - [`one_server`]: a holder cut off from its server while holding (fixed lease and
//!   watchdog);
//! - [`flapping`]: one client's link down and up every 100 ms during a contended run;
//! - [`redlock_masters`]: RedLock over five masters, split into a minority and a
//!   majority, bridged, and moving;
//! - [`sentinel_split`]: a Sentinel primary cut off with one client while a replica is
//!   promoted, without and with replica confirmation;
//! - [`cluster_split`]: a Cluster master cut off with one client while its replica is
//!   promoted.

// The reliability suite's clock and checker, shared (this binary uses part of them).
#[allow(dead_code)]
#[path = "../reliability/clock.rs"]
mod clock;
#[allow(dead_code)]
#[path = "../reliability/history.rs"]
mod history;

mod child;
mod cluster_split;
mod fixture;
mod flapping;
mod net;
mod one_server;
mod redlock_masters;
mod sentinel_split;
