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
        self.fresh_token_after("")
    }

    /// `prefix` followed by a fresh token, in one allocation and without `format!`:
    /// one or two are made on every acquisition.
    pub(crate) fn fresh_token_after(&self, prefix: &str) -> String {
        let n = self.next_token.fetch_add(1, Ordering::Relaxed);
        token(prefix, &self.token_prefix, n)
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

/// `<prefix><client's token prefix>:<n in hex>`, written by hand: `format!` cost more
/// than the rest of building the token.
fn token(prefix: &str, client: &str, n: u64) -> String {
    let digits = (u64::BITS - n.leading_zeros()).div_ceil(4).max(1);
    let mut token = String::with_capacity(prefix.len() + client.len() + 1 + digits as usize);
    token.push_str(prefix);
    token.push_str(client);
    token.push(':');
    for digit in (0..digits).rev() {
        let nibble = ((n >> (4 * digit)) & 0xf) as u32;
        token.push(char::from_digit(nibble, 16).unwrap_or('0'));
    }
    token
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_token_is_the_prefixes_and_the_counter_in_hex() {
        for n in [
            0,
            1,
            9,
            10,
            15,
            16,
            255,
            256,
            0xabc,
            u64::MAX >> 4,
            u64::MAX,
        ] {
            assert_eq!(super::token("r:", "c0ffee", n), format!("r:c0ffee:{n:x}"));
            assert_eq!(super::token("", "c0ffee", n), format!("c0ffee:{n:x}"));
        }
    }
}
