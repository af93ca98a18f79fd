// `on_busy = "skip"`: a scheduled job returns `Ok(None)` when another instance holds the lock.
use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "lottery:draw", wait = "0s", on_busy = "skip")]
async fn draw() -> Result<Option<u64>, LockError> {
    Ok(Some(7))
}

type JobResult<T> = Result<T, LockError>;

#[distributed_lock(key = "report:<day>", on_busy = "skip", lease = "1m")]
async fn report(day: u32) -> JobResult<Option<()>> {
    let _ = day;
    Ok(Some(()))
}

#[distributed_lock(key = "plain:<id>", on_busy = "error")]
async fn plain(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = draw();
    let _ = report(1);
    let _ = plain(1);
}
