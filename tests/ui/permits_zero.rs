use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "partner:<tenant>", permits = 0)]
async fn call_partner(tenant: &str) -> Result<(), LockError> {
    let _ = tenant;
    Ok(())
}

fn main() {}
