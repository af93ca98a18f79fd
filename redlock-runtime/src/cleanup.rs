//! The one way to finish work in the background when a future is dropped mid-way
//! (an acquire or release whose caller gave up): arm a clean-up, disarm it once the
//! work is done; dropped armed, the clean-up is spawned on the current tokio runtime,
//! never awaited.

use std::future::Future;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

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
}
