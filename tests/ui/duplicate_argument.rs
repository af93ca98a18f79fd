use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<id>", wait = "3s", wait = "5s", wait = "nope")]
async fn pay_order(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "doc:<id>", mode = "read", mode = "write")]
async fn load_doc(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "partner:<tenant>", permits = 5, permits = 6)]
async fn call_partner(tenant: &str) -> Result<(), LockError> {
    let _ = tenant;
    Ok(())
}

fn main() {}
