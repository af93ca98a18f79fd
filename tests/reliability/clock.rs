//! One clock for every process of a test: CLOCK_MONOTONIC, in nanoseconds.
//!
//! `std::time::Instant` reads the same clock but cannot be sent to another process;
//! these raw readings can, so the checker compares instants taken by different workers.

use std::time::Duration;

use rustix::time::{ClockId, clock_gettime};

/// Nanoseconds on CLOCK_MONOTONIC, shared by all processes of this machine.
pub fn now() -> u64 {
    let time = clock_gettime(ClockId::Monotonic);
    let secs = u64::try_from(time.tv_sec).expect("CLOCK_MONOTONIC is never negative");
    let nanos = u64::try_from(time.tv_nsec).expect("tv_nsec is below a billion");
    secs * 1_000_000_000 + nanos
}

/// A duration in the nanoseconds `now` counts.
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A span between two readings, for messages.
pub fn span(from: u64, to: u64) -> Duration {
    Duration::from_nanos(to.saturating_sub(from))
}
