//! `REDLOCK_BENCH_GRANT_TRACE=1`: the waiter's side of a hand-off between processes.
//! The distributed scenario's child, with it set, timestamps two of the runtime's timing
//! events (target `redlock::timing`): a release message arriving (`news_received`, in
//! the push handler) and a grant taken (`granted`, as the guard is made), and reports,
//! for each acquisition a release granted, the time from its last message to the grant
//! taken, and from there to the acquire call's return (`grant <ns> <ns>` lines, which
//! `scripts/server-cost.py` sums up). The gap between two processes' holds is the
//! release call's way to Redis, the granting script, the message's way back, and this.
//!
//! Off by default: the subscriber costs a lock and a push per event.

use std::sync::{Arc, Mutex};

use crate::distributed::monotonic_ns;
use crate::handoff_trace::TimingEvents;

/// The timing events seen, with their [`monotonic_ns`].
#[derive(Clone, Default)]
pub struct Stamps(Arc<Mutex<Vec<(u64, &'static str)>>>);

impl Stamps {
    /// The recorder, installed as the process's subscriber, when the variable is set.
    pub fn install() -> Option<Stamps> {
        std::env::var_os("REDLOCK_BENCH_GRANT_TRACE")?;
        let stamps = Stamps::default();
        let kept = stamps.0.clone();
        let recorder = TimingEvents(move |event: &tracing::Event<'_>| {
            let at = monotonic_ns();
            let name = event.metadata().name();
            if matches!(name, "news_received" | "granted") {
                kept.lock().unwrap().push((at, name));
            }
        });
        tracing::subscriber::set_global_default(recorder)
            .expect("the grant trace's subscriber is the first");
        Some(stamps)
    }

    /// `grant <message → granted> <granted → returned>` (ns) for each acquisition
    /// (`asked`, `returned`) that a release granted.
    pub fn lines(&self, acquisitions: &[(u64, u64)]) -> Vec<String> {
        let stamps = self.0.lock().unwrap();
        acquisitions
            .iter()
            .filter_map(|&(asked, returned)| {
                let mut within = stamps
                    .iter()
                    .filter(|(at, _)| (asked..=returned).contains(at));
                let granted = within.clone().rfind(|(_, name)| *name == "granted")?.0;
                let message = within
                    .rfind(|(at, name)| *name == "news_received" && *at <= granted)?
                    .0;
                Some(format!(
                    "grant {} {}",
                    granted - message,
                    returned - granted
                ))
            })
            .collect()
    }
}
