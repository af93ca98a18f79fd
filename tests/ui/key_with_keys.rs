use redlock_runtime::{LockError, distributed_lock};

// Reported on the second one given, whichever it is.
#[distributed_lock(key = "account:<from>", keys = ["account:<from>", "account:<to>"])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["account:<from>"], key = "account:<to>")]
async fn transfer_back(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
