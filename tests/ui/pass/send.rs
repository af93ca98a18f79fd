// The returned future is `Send` whenever the body's is: it can be spawned.
use std::sync::Arc;

use redlock_runtime::{LockClient, LockError, distributed_lock};

fn assert_send<T: Send>(_: T) {}

#[distributed_lock(key = "order:<id>", wait = "3s", lease = "10s")]
async fn pay_order(id: u64, amount: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    Ok(id + amount)
}

struct Service {
    locks: Arc<LockClient>,
    id: u64,
}

impl Service {
    #[distributed_lock(key = "service:<self.id>", client = self.locks)]
    async fn run(&self, name: &str) -> Result<usize, LockError> {
        tokio::task::yield_now().await;
        Ok(name.len())
    }
}

fn main() {
    assert_send(pay_order(1, 2));
    fn _service(service: &Service) {
        assert_send(service.run("a"));
    }
    fn _spawn() {
        drop(tokio::spawn(pay_order(1, 2)));
    }
}
