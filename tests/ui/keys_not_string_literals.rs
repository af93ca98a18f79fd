use redlock_runtime::{LockError, distributed_lock};

// One template without the brackets.
#[distributed_lock(keys = "account:<from>")]
async fn withdraw(from: u64) -> Result<(), LockError> {
    let _ = from;
    Ok(())
}

// Parameters instead of templates: each element is reported.
#[distributed_lock(keys = [from, "account:<to>", 7])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

const ACCOUNTS: [&str; 2] = ["account:1", "account:2"];

// A constant: the templates must be written in the attribute.
#[distributed_lock(keys = ACCOUNTS)]
async fn settle() -> Result<(), LockError> {
    let _ = ACCOUNTS;
    Ok(())
}

fn main() {}
