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

fn main() {}
