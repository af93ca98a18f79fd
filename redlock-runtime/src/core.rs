//! The shared core of a client: what every lock of one `LockClient` (and of its
//! clones) uses — the servers, the settings, the turns of its tasks, the watchdog —
//! and the owner tokens it hands out. Reached through methods, never through fields.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::ClientConfig;
use crate::masters::Masters;
use crate::turn::Turns;
use crate::watchdog::Watchdog;

pub(crate) struct Core {
    id: u64,
    /// Random per client; with a counter it makes owner tokens and waiter ids unique
    /// across clients and processes without drawing randomness per lock.
    token_prefix: String,
    next_token: AtomicU64,
    url: String,
    masters: Arc<Masters>,
    config: ClientConfig,
    turns: Arc<Turns>,
    watchdog: Watchdog,
}

impl Core {
    pub(crate) fn new(url: String, masters: Masters, config: ClientConfig) -> Arc<Self> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let masters = Arc::new(masters);
        let watchdog = Watchdog::new(&masters, &config);
        Arc::new(Core {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            token_prefix: uuid::Uuid::new_v4().simple().to_string(),
            next_token: AtomicU64::new(0),
            url,
            masters,
            config,
            turns: Arc::new(Turns::default()),
            watchdog,
        })
    }

    /// Tells clients apart (reentrancy is per client and key).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The servers as given (passwords hidden).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn masters(&self) -> &Masters {
        &self.masters
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The per-key turns of this client's tasks.
    pub(crate) fn turns(&self) -> &Arc<Turns> {
        &self.turns
    }

    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// A token no other owner or waiter, in any client, has or will have:
    /// `<32 hex digits>:<hex counter>`. Inspection tells a lock's value from an
    /// application's string by this shape (`scripts::INSPECT`), so keep it.
    pub(crate) fn fresh_token(&self) -> String {
        let n = self.next_token.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n:x}", self.token_prefix)
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("url", &self.url)
            .field("watchdog_lease", &self.config.watchdog_lease)
            .field("renew_every", &self.config.renew_every)
            .finish_non_exhaustive()
    }
}
