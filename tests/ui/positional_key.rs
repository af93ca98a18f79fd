use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock("order:<id>", wait = "3s")]
async fn pay_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
