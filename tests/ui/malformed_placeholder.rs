use redlock_runtime::{LockError, distributed_lock};

// A lone `>` must be doubled; a placeholder is a name or a field path, without spaces.
#[distributed_lock(key = "a>b:<order id>:<order..id>")]
async fn pay_order(order: u64) -> Result<(), LockError> {
    let _ = order;
    Ok(())
}

fn main() {}
