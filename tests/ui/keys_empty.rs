use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = [], wait = "3s")]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
