use redlock_runtime::{LockError, distributed_lock};

// The second template is wrong: the error is on it, not on the first.
#[distributed_lock(keys = ["account:<from>", "account:<too>"], wait = "3s")]
async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
    let _ = (from, to, amount);
    Ok(())
}

// Each wrong template is reported, each on its own literal.
#[distributed_lock(keys = ["account:<source>", "account:<to>", "ledger:<day>"])]
async fn transfer_again(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
