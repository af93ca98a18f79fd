use redlock_runtime::{LockError, distributed_lock};

// A lock of several keys is exclusive: reported on `mode` or `permits`, whatever the order.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], mode = "read")]
async fn balances(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(mode = "write", keys = ["account:<from>", "account:<to>"])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["partner:<a>", "partner:<b>"], permits = 5)]
async fn call_partners(a: &str, b: &str) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

fn main() {}
