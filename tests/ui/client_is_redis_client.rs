use redlock_runtime::{LockError, distributed_lock};

struct Service {
    redis: redis::Client,
}

impl Service {
    #[distributed_lock(key = "order:<id>", client = self.redis)]
    async fn pay_order(&self, id: u64) -> Result<(), LockError> {
        let _ = id;
        Ok(())
    }
}

fn main() {}
