//! The locks' metrics (feature `metrics`), through the `metrics` facade: whatever
//! recorder the application installed (Prometheus, StatsD, an OpenTelemetry bridge)
//! receives them. Without the feature every function here is an empty one the compiler
//! removes, and a [`Label`] is an empty struct: no metrics code is compiled.
//!
//! The names and labels are the crate docs' table (`lib.rs`, "Metrics"); each metric
//! carries `lock` = the request's label (`LockRequest::label`, the attribute's key
//! template), `-` when none was given, so that the number of series stays bounded
//! whatever keys are locked.

use std::time::Duration;

use tokio::time::Instant;

/// The `tracing` target of the timing events (TRACE) marking the steps of an
/// acquisition and of a hand-off: `turn_taken`, `script_sent`, `script_answered`,
/// `baton_left`. Off unless a subscriber enables `redlock::timing=trace`;
/// `scripts/bench.sh --trace-handoff` splits a hand-off's time by them.
pub(crate) const TIMING: &str = "redlock::timing";

/// Why a holder lost its lock (`cause` of `redlock_lost_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Its lease ran out before it was renewed, extended or released.
    Lease,
    /// A renewal, extension or release found it gone (deleted, or taken by another).
    Renewal,
    /// `force_unlock` (or `redlock unlock --force`) evicted it.
    Forced,
}

impl Cause {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Cause::Lease => "lease",
            Cause::Renewal => "renewal",
            Cause::Forced => "forced",
        }
    }
}

/// How an acquire call ended (`outcome` of `redlock_acquire_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired,
    Timeout,
    Error,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) use on::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use off::*;

#[cfg(feature = "metrics")]
mod on {
    use std::sync::Arc;
    use std::sync::Once;
    use std::sync::atomic::{AtomicBool, Ordering};

    use ::metrics::{
        SharedString, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
        histogram,
    };

    use super::{Cause, Duration, Instant, Outcome};

    const ACQUIRE: &str = "redlock_acquire_seconds";
    const HOLD: &str = "redlock_hold_seconds";
    const LOST: &str = "redlock_lost_total";
    const RENEWALS: &str = "redlock_renewals_total";
    const RENEWAL_FAILURES: &str = "redlock_renewal_failures_total";
    const HANDOFFS: &str = "redlock_handoffs_total";
    const WAITING: &str = "redlock_waiting";

    /// The `lock` label of one request's metrics.
    #[derive(Clone, Debug)]
    pub(crate) struct Label(SharedString);

    impl Label {
        pub(crate) fn new(text: &str) -> Self {
            Label(SharedString::from_shared(Arc::<str>::from(text)))
        }

        pub(crate) fn from_static(text: &'static str) -> Self {
            Label(SharedString::const_str(text))
        }

        /// `-`: the label of every lock that was given none.
        pub(crate) fn unlabelled() -> Self {
            Label::from_static("-")
        }

        fn value(&self) -> SharedString {
            describe_once();
            self.0.clone()
        }
    }

    /// The descriptions (Prometheus's `# HELP`), given to the recorder with the first
    /// measurement.
    fn describe_once() {
        static DESCRIBED: Once = Once::new();
        DESCRIBED.call_once(|| {
            describe_histogram!(
                ACQUIRE,
                Unit::Seconds,
                "Lock acquisitions: from the call to acquired or given up (outcome: acquired, timeout, error)"
            );
            describe_histogram!(
                HOLD,
                Unit::Seconds,
                "How long locks were held: from acquired to released or lost"
            );
            describe_counter!(
                LOST,
                "Locks lost while held (cause: lease ran out, renewal found it gone, forced: force-unlocked)"
            );
            describe_counter!(RENEWALS, "Watchdog renewals that kept a lock");
            describe_counter!(
                RENEWAL_FAILURES,
                "Watchdog renewals that did not keep a lock (found gone, or Redis did not answer)"
            );
            describe_counter!(
                HANDOFFS,
                "Locks received without an attempt of their own (kind: hand_off from a task of the same client, grant by a release)"
            );
            describe_gauge!(
                WAITING,
                "Tasks of this process waiting for a lock (in line in their client, or for a holder elsewhere)"
            );
        });
    }

    /// An acquire call ended, `took` after it began.
    pub(crate) fn acquire_finished(label: &Label, outcome: Outcome, took: Duration) {
        histogram!(ACQUIRE, "lock" => label.value(), "outcome" => outcome.as_str())
            .record(took.as_secs_f64());
    }

    /// The watchdog renewed a lock.
    pub(crate) fn renewed(label: &Label) {
        counter!(RENEWALS, "lock" => label.value()).increment(1);
    }

    /// The watchdog failed to renew a lock (gone, or no answer).
    pub(crate) fn renewal_failed(label: &Label) {
        counter!(RENEWAL_FAILURES, "lock" => label.value()).increment(1);
    }

    /// A lock went to the next task of its client (see `hand_off`).
    pub(crate) fn handed_off(label: &Label) {
        counter!(HANDOFFS, "lock" => label.value(), "kind" => "hand_off").increment(1);
    }

    /// A lock came to this client by a grant: another client's release (or its own,
    /// through Redis) made it the holder (see `scripts`' `free_for_next`).
    pub(crate) fn granted(label: &Label) {
        counter!(HANDOFFS, "lock" => label.value(), "kind" => "grant").increment(1);
    }

    /// One task counted in `redlock_waiting` for as long as this lives.
    #[derive(Debug)]
    pub(crate) struct Waiting(Label);

    impl Waiting {
        pub(crate) fn start(label: &Label) -> Self {
            gauge!(WAITING, "lock" => label.value()).increment(1.0);
            Waiting(label.clone())
        }
    }

    impl Drop for Waiting {
        fn drop(&mut self) {
            gauge!(WAITING, "lock" => self.0.value()).decrement(1.0);
        }
    }

    /// One held lock's end, measured once: released, or lost.
    #[derive(Debug)]
    pub(crate) struct Hold {
        label: Label,
        since: Instant,
        ended: AtomicBool,
    }

    impl Hold {
        pub(crate) fn new(label: Label, since: Instant) -> Self {
            Hold {
                label,
                since,
                ended: AtomicBool::new(false),
            }
        }

        pub(crate) fn label(&self) -> &Label {
            &self.label
        }

        fn end(&self, at: Instant) -> bool {
            if self.ended.swap(true, Ordering::AcqRel) {
                return false;
            }
            histogram!(HOLD, "lock" => self.label.value())
                .record(at.saturating_duration_since(self.since).as_secs_f64());
            true
        }

        /// The holder let it go (Redis confirmed, or could not be asked).
        pub(crate) fn released(&self) {
            self.end(Instant::now());
        }

        /// The lock was found lost for `cause`; `at` says when it ended.
        pub(crate) fn lost(&self, cause: Cause, at: impl FnOnce() -> Instant) {
            if self.end(at()) {
                counter!(LOST, "lock" => self.label.value(), "cause" => cause.as_str())
                    .increment(1);
            }
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod off {
    use super::{Cause, Duration, Instant, Outcome};

    /// The `lock` label: nothing to keep without the feature.
    #[derive(Clone, Debug)]
    pub(crate) struct Label;

    impl Label {
        #[inline]
        pub(crate) fn new(_text: &str) -> Self {
            Label
        }

        #[inline]
        pub(crate) fn from_static(_text: &'static str) -> Self {
            Label
        }

        #[inline]
        pub(crate) fn unlabelled() -> Self {
            Label
        }
    }

    #[inline]
    pub(crate) fn acquire_finished(_label: &Label, _outcome: Outcome, _took: Duration) {}

    #[inline]
    pub(crate) fn renewed(_label: &Label) {}

    #[inline]
    pub(crate) fn renewal_failed(_label: &Label) {}

    #[inline]
    pub(crate) fn handed_off(_label: &Label) {}

    #[inline]
    pub(crate) fn granted(_label: &Label) {}

    #[derive(Debug)]
    pub(crate) struct Waiting;

    impl Waiting {
        #[inline]
        pub(crate) fn start(_label: &Label) -> Self {
            Waiting
        }
    }

    #[derive(Debug)]
    pub(crate) struct Hold(Label);

    impl Hold {
        #[inline]
        pub(crate) fn new(label: Label, _since: Instant) -> Self {
            Hold(label)
        }

        #[inline]
        pub(crate) fn label(&self) -> &Label {
            &self.0
        }

        #[inline]
        pub(crate) fn released(&self) {}

        #[inline]
        pub(crate) fn lost(&self, _cause: Cause, _at: impl FnOnce() -> Instant) {}
    }
}
