// Doc comments, visibility and other attributes are kept; composes with `#[tracing::instrument]`
// in either order (attributes expand from the top down: the lower one ends up outermost).
#![deny(missing_docs)]
//! Crate docs.

use redlock_runtime::{LockError, distributed_lock};

/// Documented, public, with other attributes around it.
#[distributed_lock(key = "doc:<id>")]
#[allow(clippy::needless_return)]
#[inline]
pub async fn documented(id: u64) -> Result<u64, LockError> {
    return Ok(id);
}

pub(crate) mod inner {
    use super::*;

    /// `pub(crate)` visibility.
    #[distributed_lock(key = "inner:<id>")]
    pub(crate) async fn restricted(id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

/// Instrumented inside the lock: written above, the span starts once the lock is held.
#[tracing::instrument]
#[distributed_lock(key = "traced:<id>", wait = "1s")]
pub async fn instrument_first(id: u64) -> Result<u64, LockError> {
    tracing::info!("inside");
    Ok(id)
}

/// Instrumented around the lock: written below, the span covers the acquisition, and
/// `err` logs a failure to lock.
#[distributed_lock(key = "traced:<id>", wait = "1s")]
#[tracing::instrument(err(Debug))]
pub async fn lock_first(id: u64) -> Result<u64, LockError> {
    tracing::info!("inside");
    Ok(id)
}

/// `#[must_use]` and `#[cfg]` on parameters are kept.
#[must_use = "the payment may fail"]
#[distributed_lock(key = "cfg:<id>")]
pub async fn with_cfg(id: u64, #[cfg(any())] _never: u8) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = documented(1);
    let _ = inner::restricted(1);
    let _ = instrument_first(1);
    let _ = lock_first(1);
    let _ = with_cfg(1);
}
