use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "doc:<id>", mode = "shared")]
async fn load_doc(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// Not a string: the mode is named by a string literal.
#[distributed_lock(key = "doc:<id>", mode = read)]
async fn load_doc_again(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// A mode written as an argument of its own.
#[distributed_lock(key = "doc:<id>", write)]
async fn save_doc(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
