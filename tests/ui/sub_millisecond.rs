use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "a:<id>", lease = "1ns")]
async fn tiny_lease(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "b:<id>", wait = "500us", lease = "10s", hold_at_least = "1ms 500us")]
async fn fractions(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
