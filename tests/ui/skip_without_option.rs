use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "lottery:draw", on_busy = "skip")]
async fn draw() -> Result<u64, LockError> {
    Ok(7)
}

#[distributed_lock(key = "report:<day>", on_busy = "later")]
async fn report(day: u32) -> Result<Option<u32>, LockError> {
    Ok(Some(day))
}

fn main() {}
