use redlock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct OrderId(u64);

#[distributed_lock(key = "order:<id>")]
async fn pay_order(id: OrderId) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
