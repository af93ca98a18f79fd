// A typo in a key's field path is reported on the key, naming the field and the type,
// with no suggestion: rustc's "a field with a similar name exists" would replace the
// whole key string with the bare field name.
use std::sync::Arc;

use redlock_runtime::{LockClient, LockError, distributed_lock};

pub struct Inventory {
    pub warehouse: String,
    pub locks: LockClient,
}

impl Inventory {
    #[distributed_lock(key = "stock:<self.warehous>:<sku>", client = self.locks, wait = "1s")]
    async fn reserve(&self, sku: u64) -> Result<(), LockError> {
        let _ = sku;
        Ok(())
    }

    #[distributed_lock(key = "stock:<self.warehouse.name>", client = self.locks)]
    async fn restock(self: Arc<Self>) -> Result<(), LockError> {
        Ok(())
    }
}

pub struct Customer {
    pub id: u32,
}

pub struct Order {
    pub id: u64,
    pub customer: Customer,
    pub pair: (u8, u16),
}

#[distributed_lock(key = "order:{<order.custmer.id>}:<order.id>")]
async fn pay(order: &Order) -> Result<(), LockError> {
    let _ = order;
    Ok(())
}

#[distributed_lock(key = "order:<order.pair.2>")]
async fn ship(order: Arc<Order>) -> Result<(), LockError> {
    let _ = order;
    Ok(())
}

fn main() {}
