use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<>")]
async fn pay_order(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
