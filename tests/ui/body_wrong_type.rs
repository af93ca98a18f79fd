// A body whose value does not match the return type: rustc's own E0308 on the
// expression, as in a function without the attribute.
use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<id>")]
async fn wrong_ok_value(id: u64) -> Result<u64, LockError> {
    let _ = id;
    Ok("x")
}

#[distributed_lock(key = "order:<id>")]
async fn bare_return(id: u64) -> Result<u64, LockError> {
    if id == 0 {
        return id;
    }
    Ok(id)
}

fn main() {}
