// What `#[async_trait]` on the impl leaves for `#[distributed_lock]` on a method.
use std::future::Future;
use std::pin::Pin;

use redlock_runtime::{LockError, distributed_lock};

struct Orders;

impl Orders {
    #[distributed_lock(key = "order:<id>")]
    fn pay_order<'life0, 'async_trait>(
        &'life0 self,
        id: u64,
    ) -> Pin<Box<dyn Future<Output = Result<(), LockError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let _ = (self, id);
            Ok(())
        })
    }
}

fn main() {}
