//! The reliability suite: what really happened, recorded and checked.
//!
//! Worker processes and tasks take one key over and over and record every hold
//! ([`history`]); a checker judges the record: mutual exclusion, fencing-token order,
//! stale writes refused by a fenced store ([`store`]), every acquisition released or
//! expired, no wait overrun. [`contention`] runs thousands of holds; [`faults`] repeats
//! the check while holders and Redis are killed, stopped, restarted or cut off;
//! [`redlock_faults`] does the same over five RedLock masters while they are killed
//! and restarted empty; [`bad_input`] feeds every kind of bad key, duration, URL and
//! foreign value.
//!
//! RELIABILITY.md at the repository root states what these tests establish.

mod bad_input;
mod clock;
mod contention;
mod faults;
mod history;
mod redlock_faults;
mod store;
mod workers;
