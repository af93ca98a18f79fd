use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "pair:<a>:<b>")]
async fn swap((a, b): (u32, u32)) -> Result<(u32, u32), LockError> {
    Ok((b, a))
}

fn main() {}
