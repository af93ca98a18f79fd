use redlock_runtime::{LockError, distributed_lock};

// Copied and not corrected: both would be `account:<from>`, one key.
#[distributed_lock(keys = ["account:<from>", "account:<from>"], wait = "3s")]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
