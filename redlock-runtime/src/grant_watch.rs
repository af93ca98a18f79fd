//! The releasing client's watch over the grants its releases made: one lapsed-grant
//! check of a key at a time, and at most one per check interval.
//!
//! A release that grants a key and hears that nobody behind the grantee listens (or
//! grants a share: see `scripts::free_for_next`) checks, a grace later, whether the
//! grant lapsed (`Node::watch_grant`). A semaphore whose permits pass between clients
//! grants on nearly every release, and a check per grant was one more script per
//! acquisition on the server. Grants on one key now share the check under way: it
//! runs when the first is due, and once more, when the latest made since is due or an
//! interval after the check, whichever comes first. So each grant's check is scheduled
//! no later than an interval after it is due, and a key whose grants come faster than
//! that is checked once an interval, not once a grant. (The checks of one key run one
//! after another: a check slowed by retries delays those due meanwhile. A grant made
//! from another runtime joins a check running on the runtime that started it.)

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The keys whose grants this client watches.
#[derive(Debug, Default)]
pub(crate) struct GrantWatches {
    keys: Mutex<HashMap<String, Watch>>,
    started: AtomicU64,
}

/// One key's check: which one it is, when it runs next, and when the latest grant on
/// it is due.
#[derive(Debug, Clone, Copy)]
struct Watch {
    id: u64,
    next: Instant,
    latest: Instant,
}

impl GrantWatches {
    /// A grant on `key` to check at `due`: the id of a new check when none of `key` is
    /// under way, and the caller starts it; `None` when the check under way covers it.
    pub(crate) fn watch(&self, key: &str, due: Instant) -> Option<u64> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        match keys.get_mut(key) {
            Some(watch) => {
                watch.latest = watch.latest.max(due);
                None
            }
            None => {
                let id = self.started.fetch_add(1, Ordering::Relaxed);
                let watch = Watch {
                    id,
                    next: due,
                    latest: due,
                };
                keys.insert(key.to_owned(), watch);
                Some(id)
            }
        }
    }

    /// When the check of `key` runs next (now, if it is not watched: only the task of
    /// a watch asks, while its watch stands).
    pub(crate) fn next(&self, key: &str) -> Instant {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert!(keys.contains_key(key), "a check of {key} runs unwatched");
        keys.get(key).map_or_else(Instant::now, |watch| watch.next)
    }

    /// The check of `key` was sent at `checked_at` and answered at `answered_at` (and
    /// granted the key anew if `granted_anew`, a grant made by then at the latest):
    /// when it runs again, or `None` when the watch ends, no grant being due after the
    /// check was sent. `interval`: the time from a grant to its check.
    pub(crate) fn checked(
        &self,
        key: &str,
        checked_at: Instant,
        answered_at: Instant,
        interval: Duration,
        granted_anew: bool,
    ) -> Option<Instant> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let watch = keys.get_mut(key)?;
        if granted_anew {
            watch.latest = watch.latest.max(answered_at + interval);
        }
        if watch.latest > checked_at {
            watch.next = watch.latest.min(checked_at + interval);
            return Some(watch.next);
        }
        keys.remove(key);
        None
    }

    /// The check `id` of `key` stops before its watch ended (its script failed, or its
    /// task was dropped with its runtime): the next grant on `key` starts a check of its
    /// own. A check that ended already, and was followed by another, is no more.
    pub(crate) fn end(&self, key: &str, id: u64) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.get(key).is_some_and(|watch| watch.id == id) {
            keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(110);

    #[test]
    fn grants_on_one_key_share_a_check_and_none_is_checked_later_than_an_interval_after_due() {
        let watches = GrantWatches::default();
        let t = Instant::now();
        let ms = Duration::from_millis;
        assert!(
            watches.watch("k", t + ms(110)).is_some(),
            "the first grant starts a check"
        );
        assert!(
            watches.watch("k", t + ms(150)).is_none(),
            "a later one joins it"
        );
        assert!(
            watches.watch("other", t + ms(10)).is_some(),
            "another key has its own"
        );
        assert_eq!(watches.next("k"), t + ms(110));
        // Checked at 110: once more when the grant due at 150 is.
        assert_eq!(
            watches.checked("k", t + ms(110), t + ms(111), INTERVAL, false),
            Some(t + ms(150))
        );
        // Grants every millisecond from 111 to 400 (due 221 to 510): one check at 260,
        // an interval after the one at 150, then at 370, 480, 510.
        for grant in 111..=400 {
            assert!(watches.watch("k", t + ms(grant) + INTERVAL).is_none());
        }
        let mut runs = Vec::new();
        let mut at = t + ms(150);
        while let Some(next) = watches.checked("k", at, at, INTERVAL, false) {
            runs.push((next - t).as_millis());
            at = next;
        }
        assert_eq!(runs, [260, 370, 480, 510]);
        assert!(
            watches.watch("k", t + ms(600)).is_some(),
            "ended: the next grant starts one"
        );
    }

    #[test]
    fn a_check_that_granted_anew_runs_again_an_interval_later() {
        let watches = GrantWatches::default();
        let t = Instant::now();
        let ms = Duration::from_millis;
        let first = watches.watch("k", t + ms(110)).unwrap();
        // Sent at 110, answered at 150 (a resend): the grant it made is due a grace
        // after the answer, 260, and checked then (after one more at 220, an interval
        // after the first).
        assert_eq!(
            watches.checked("k", t + ms(110), t + ms(150), INTERVAL, true),
            Some(t + ms(220))
        );
        assert_eq!(
            watches.checked("k", t + ms(220), t + ms(221), INTERVAL, false),
            Some(t + ms(260))
        );
        assert_eq!(
            watches.checked("k", t + ms(260), t + ms(261), INTERVAL, false),
            None
        );
        let second = watches.watch("k", t + ms(400)).unwrap();
        watches.end("k", first);
        assert!(
            watches.watch("k", t + ms(450)).is_none(),
            "the first check's end leaves the second"
        );
        watches.end("k", second);
        assert!(
            watches.watch("k", t + ms(500)).is_some(),
            "ended on a failure: the next grant starts one"
        );
    }

    /// Grants at random times (a pseudo-random sequence: the test is the same on every
    /// run), the task's loop played out with checks that take no time: every grant has
    /// a check no sooner than it is due and no later than an interval after.
    #[test]
    fn every_grant_is_checked_within_an_interval_of_its_due_time() {
        let ms = Duration::from_millis;
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut random = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for _ in 0..200 {
            let watches = GrantWatches::default();
            let t = Instant::now();
            // Grant times (ms), sorted: bursts and gaps, up to a second.
            let mut grants: Vec<u64> = (0..1 + random(30)).map(|_| random(1_000)).collect();
            grants.sort_unstable();
            let mut checks = Vec::new();
            let mut pending = grants.iter().peekable();
            let mut running: Option<Instant> = None;
            loop {
                // The next event: a grant, or the running check's next run.
                let grant_at = pending.peek().map(|at| t + ms(**at));
                match (grant_at, running) {
                    (Some(at), Some(next)) if at <= next => {
                        pending.next();
                        assert!(watches.watch("k", at + INTERVAL).is_none());
                    }
                    (Some(at), None) => {
                        pending.next();
                        assert!(watches.watch("k", at + INTERVAL).is_some());
                        running = Some(watches.next("k"));
                    }
                    (_, Some(next)) => {
                        checks.push(next);
                        running = watches.checked("k", next, next, INTERVAL, false);
                    }
                    (None, None) => break,
                }
            }
            for grant in &grants {
                let due = t + ms(*grant) + INTERVAL;
                assert!(
                    checks.iter().any(|at| *at >= due && *at <= due + INTERVAL),
                    "a grant at {grant} ms (due {} ms) was not checked in time: checks at {:?}",
                    grant + INTERVAL.as_millis() as u64,
                    checks
                        .iter()
                        .map(|at| (*at - t).as_millis())
                        .collect::<Vec<_>>()
                );
            }
            assert!(checks.len() <= grants.len() + 1);
        }
    }
}
