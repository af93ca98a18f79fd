use redlock_runtime::{LockError, distributed_lock};

// Every mistake is reported at once, each on its value.
#[distributed_lock(key = "a:<t>", permits = "5")]
async fn quoted(t: u32) -> Result<(), LockError> {
    let _ = t;
    Ok(())
}

#[distributed_lock(key = "b:<t>", permits = -3)]
async fn negative(t: u32) -> Result<(), LockError> {
    let _ = t;
    Ok(())
}

#[distributed_lock(key = "c:<t>", permits = 2.5)]
async fn fraction(t: u32) -> Result<(), LockError> {
    let _ = t;
    Ok(())
}

#[distributed_lock(key = "d:<t>", permits = 5_000_000)]
async fn too_many(t: u32) -> Result<(), LockError> {
    let _ = t;
    Ok(())
}

const PERMITS: u32 = 5;

#[distributed_lock(key = "e:<t>", permits = PERMITS)]
async fn constant(t: u32) -> Result<(), LockError> {
    let _ = t;
    Ok(())
}

fn main() {}
