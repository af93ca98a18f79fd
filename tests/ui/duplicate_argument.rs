use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<id>", wait = "3s", wait = "5s", wait = "nope")]
async fn pay_order(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
