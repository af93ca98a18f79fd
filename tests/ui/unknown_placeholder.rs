use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<order_id>")]
async fn pay_order(id: u64, amount: u64) -> Result<(), LockError> {
    let _ = (id, amount);
    Ok(())
}

#[distributed_lock(key = "order:<ammount>")]
async fn refund(id: u64, amount: u64) -> Result<(), LockError> {
    let _ = (id, amount);
    Ok(())
}

#[distributed_lock(key = "order:<self.id>")]
async fn free_function() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
