use redlock_runtime::{LockError, distributed_lock};

// Reported on the second one given, whichever it is.
#[distributed_lock(key = "partner:<tenant>", mode = "read", permits = 5)]
async fn call_partner(tenant: &str) -> Result<(), LockError> {
    let _ = tenant;
    Ok(())
}

#[distributed_lock(key = "partner:<tenant>", permits = 5, mode = "write")]
async fn call_partner_again(tenant: &str) -> Result<(), LockError> {
    let _ = tenant;
    Ok(())
}

// Once, on the first `permits`; the second is a duplicate.
#[distributed_lock(key = "partner:<tenant>", mode = "read", permits = 5, permits = 6)]
async fn call_partner_twice(tenant: &str) -> Result<(), LockError> {
    let _ = tenant;
    Ok(())
}

fn main() {}
