use redlock_runtime::distributed_lock;

#[derive(Debug)]
enum PayError {
    Declined,
}

#[distributed_lock(key = "order:<id>")]
async fn pay_order(id: u64) -> Result<(), PayError> {
    if id == 0 {
        return Err(PayError::Declined);
    }
    Ok(())
}

// `io::Result` passes the macro's check; `io::Error` has no `From<LockError>`.
#[distributed_lock(key = "file:<id>")]
async fn write_file(id: u64) -> std::io::Result<()> {
    let _ = id;
    Ok(())
}

fn main() {}
