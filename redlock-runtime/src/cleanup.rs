//! Finish work in the background when a future is dropped mid-way
//! (an acquire or release whose caller gave up): arm a clean-up, disarm it once the
//! work is done; dropped armed, the clean-up is spawned on the current tokio runtime,
//! never awaited.
//!
//! A release spawned so must also survive its runtime: a program whose `main` returns
//! drops its runtime, and with it every task not finished yet. [`Unless`] runs a
//! fallback when such a task is dropped unfinished (only a runtime shutting down does
//! that: these tasks are never aborted), and [`InFlight`] counts the tasks still
//! running, for a shutdown that waits for them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Spawns the task `make` builds when dropped armed; [`SpawnOnDrop::disarm`] forgets
/// it. `make` may borrow: it only runs (and clones what the task needs) on a drop, so
/// arming costs nothing on the common path, where the work finishes.
#[must_use = "dropping it at once runs the clean-up at once"]
pub(crate) struct SpawnOnDrop<F, Task>
where
    F: FnOnce() -> Task,
    Task: Future<Output = ()> + Send + 'static,
{
    make: Option<F>,
}

impl<F, Task> SpawnOnDrop<F, Task>
where
    F: FnOnce() -> Task,
    Task: Future<Output = ()> + Send + 'static,
{
    pub(crate) fn new(make: F) -> Self {
        SpawnOnDrop { make: Some(make) }
    }

    /// The work finished: nothing to clean up.
    pub(crate) fn disarm(mut self) {
        self.make = None;
    }
}

impl<F, Task> Drop for SpawnOnDrop<F, Task>
where
    F: FnOnce() -> Task,
    Task: Future<Output = ()> + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(make) = self.make.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Outside a runtime nothing can reach Redis: leases run out by themselves.
            runtime.spawn(make());
        }
    }
}

impl<F, Task> std::fmt::Debug for SpawnOnDrop<F, Task>
where
    F: FnOnce() -> Task,
    Task: Future<Output = ()> + Send + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnOnDrop")
            .field("armed", &self.make.is_some())
            .finish()
    }
}

/// Runs `fallback` when dropped, unless [`Unless::done`] said the work it stands for
/// finished. Moved into a spawned task, it runs when the runtime drops the task
/// unfinished, on the thread that drops it.
#[must_use = "dropping it at once runs the fallback at once"]
pub(crate) struct Unless<F: FnOnce()> {
    fallback: Option<F>,
}

impl<F: FnOnce()> Unless<F> {
    pub(crate) fn new(fallback: F) -> Self {
        Unless {
            fallback: Some(fallback),
        }
    }

    /// The work finished: no fallback.
    pub(crate) fn done(mut self) {
        self.fallback = None;
    }
}

impl<F: FnOnce()> Drop for Unless<F> {
    fn drop(&mut self) {
        if let Some(fallback) = self.fallback.take() {
            fallback();
        }
    }
}

impl<F: FnOnce()> std::fmt::Debug for Unless<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unless")
            .field("armed", &self.fallback.is_some())
            .finish()
    }
}

/// How many background tasks are running, and a wake-up when none is.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    running: AtomicUsize,
    none: Notify,
}

impl InFlight {
    /// Counts one more task until the returned ticket is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    /// Resolves once no task is running.
    pub(crate) async fn none_running(&self) {
        loop {
            let none = self.none.notified();
            tokio::pin!(none);
            // Registered before the count is read: a last task ending in between wakes it.
            none.as_mut().enable();
            if self.running.load(Ordering::Acquire) == 0 {
                return;
            }
            none.await;
        }
    }
}

/// One running task of an [`InFlight`].
#[derive(Debug)]
pub(crate) struct Running(Arc<InFlight>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[tokio::test]
    async fn an_armed_task_runs_when_dropped_and_a_disarmed_one_never() {
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        SpawnOnDrop::new(move || async move { flag.store(true, Ordering::SeqCst) }).disarm();
        tokio::task::yield_now().await;
        assert!(!ran.load(Ordering::SeqCst));
        let flag = ran.clone();
        drop(SpawnOnDrop::new(move || async move {
            flag.store(true, Ordering::SeqCst)
        }));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(ran.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_fallback_runs_only_for_work_dropped_unfinished() {
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        Unless::new(move || flag.store(true, Ordering::SeqCst)).done();
        assert!(!ran.load(Ordering::SeqCst));
        // A task the runtime drops before it finishes: its runtime shuts down.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let flag = ran.clone();
        let unless = Unless::new(move || flag.store(true, Ordering::SeqCst));
        runtime.spawn(async move {
            std::future::pending::<()>().await;
            unless.done();
        });
        std::thread::spawn(move || drop(runtime)).join().unwrap();
        assert!(ran.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn none_running_waits_for_the_last_task() {
        let in_flight = Arc::new(InFlight::default());
        in_flight.none_running().await;
        let running = in_flight.start();
        let waiting = tokio::time::timeout(Duration::from_millis(50), in_flight.none_running());
        assert!(waiting.await.is_err(), "returned while a task ran");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(running);
        });
        tokio::time::timeout(Duration::from_secs(5), in_flight.none_running())
            .await
            .expect("woken when the last task ended");
    }
}
