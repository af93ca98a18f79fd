// Native `async fn` in traits: trait impls, default methods, `Send` futures required by the trait.
use std::future::Future;

use redlock_runtime::{LockError, distributed_lock};

trait Payments {
    async fn pay(&self, id: u64) -> Result<u64, LockError>;

    #[distributed_lock(key = "refund:<id>")]
    async fn refund(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

trait SendPayments {
    fn pay(&self, id: u64) -> impl Future<Output = Result<u64, LockError>> + Send;
}

struct Shop {
    name: String,
}

impl Payments for Shop {
    #[distributed_lock(key = "<self.name>:pay:<id>", wait = "1s")]
    async fn pay(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

impl SendPayments for Shop {
    #[distributed_lock(key = "<self.name>:pay:<id>", wait = "1s")]
    async fn pay(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {
    let shop = Shop { name: "a".into() };
    let _ = Payments::pay(&shop, 1);
    let _ = shop.refund(1);
    let _ = SendPayments::pay(&shop, 1);
}
