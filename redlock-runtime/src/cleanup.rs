//! The one way to finish work in the background when a future is dropped mid-way
//! (an acquire or release whose caller gave up): arm a task, disarm it once the work
//! is done; dropped armed, it is spawned on the current tokio runtime, never awaited.

use std::future::Future;
use std::pin::Pin;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Spawns its task when dropped armed; [`SpawnOnDrop::disarm`] forgets it.
#[must_use = "dropping it at once runs the clean-up at once"]
pub(crate) struct SpawnOnDrop {
    task: Option<Task>,
}

impl SpawnOnDrop {
    pub(crate) fn new(task: impl Future<Output = ()> + Send + 'static) -> Self {
        SpawnOnDrop {
            task: Some(Box::pin(task)),
        }
    }

    /// The work finished: nothing to clean up.
    pub(crate) fn disarm(mut self) {
        self.task = None;
    }
}

impl Drop for SpawnOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.task.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Outside a runtime nothing can reach Redis: leases run out by themselves.
            runtime.spawn(task);
        }
    }
}

impl std::fmt::Debug for SpawnOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnOnDrop")
            .field("armed", &self.task.is_some())
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
        SpawnOnDrop::new(async move { flag.store(true, Ordering::SeqCst) }).disarm();
        tokio::task::yield_now().await;
        assert!(!ran.load(Ordering::SeqCst));
        let flag = ran.clone();
        drop(SpawnOnDrop::new(async move {
            flag.store(true, Ordering::SeqCst)
        }));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(ran.load(Ordering::SeqCst));
    }
}
