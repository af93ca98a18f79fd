use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<id>", lease = "0s")]
async fn pay_order(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
