//! The two locks under test behind one interface: redlock and its most used peer, rslock.

use std::time::Duration;

use crate::fenced_minimum::{FencedGuard, FencedMinimum};

/// Lease of every lock the scenarios take: far longer than any hold, so that a lease
/// running out never hands a lock on.
pub const LEASE: Duration = Duration::from_secs(10);

/// How long a contended acquisition may wait before the benchmark gives up.
pub const WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Debug)]
pub enum Lock {
    Redlock(redlock_runtime::LockClient),
    Rslock(rslock::LockManager),
    /// The yardstick, taken uncontended only (see `fenced_minimum`).
    Fenced(FencedMinimum),
}

#[derive(Debug)]
pub enum Guard {
    Redlock(redlock_runtime::LockGuard),
    Rslock(rslock::LockGuard),
    Fenced(FencedGuard),
}

impl Lock {
    pub async fn redlock(url: &str) -> Self {
        Lock::Redlock(
            redlock_runtime::LockClient::connect(url)
                .await
                .expect("connect redlock"),
        )
    }

    /// rslock with its defaults (3 tries per `lock`, up to 200 ms apart; `acquire`
    /// calls `lock` until it succeeds), as its README uses it.
    pub fn rslock(url: &str) -> Self {
        Lock::Rslock(rslock::LockManager::new(vec![url.to_owned()]))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Lock::Redlock(_) => "redlock",
            Lock::Rslock(_) => "rslock",
            Lock::Fenced(_) => "fenced-minimum",
        }
    }

    /// Waits until `key` is acquired with [`LEASE`].
    pub async fn acquire(&self, key: &str) -> Guard {
        match self {
            Lock::Redlock(client) => Guard::Redlock(
                client
                    .lock(key)
                    .wait(WAIT)
                    .lease(LEASE)
                    .acquire()
                    .await
                    .unwrap_or_else(|error| panic!("redlock acquire {key}: {error}")),
            ),
            Lock::Rslock(manager) => Guard::Rslock(
                manager
                    .acquire(key.as_bytes(), LEASE)
                    .await
                    .unwrap_or_else(|error| panic!("rslock acquire {key}: {error}")),
            ),
            Lock::Fenced(lock) => Guard::Fenced(lock.acquire(key, LEASE).await),
        }
    }
}

impl Guard {
    pub async fn release(self) {
        match self {
            Guard::Redlock(guard) => guard.release().await.expect("redlock release"),
            // rslock's release is best effort and reports nothing.
            Guard::Rslock(guard) => guard.release().await,
            Guard::Fenced(guard) => guard.release().await,
        }
    }
}
