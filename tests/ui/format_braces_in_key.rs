// `{name}` is `format!`'s placeholder, not the key's: it would lock the literal key
// `order:{id}` for every order. Naming a parameter (or `self`), it is refused with both
// fixes; naming none, it stays a literal Cluster hash tag (`{tenant}` below compiles).
use redlock_runtime::{LockClient, LockError, distributed_lock};

#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "{tenant}:order:{order.id}:{id:?}")]
async fn ship(order: &Order, id: u64) -> Result<(), LockError> {
    let _ = (order, id);
    Ok(())
}

struct Order {
    id: u64,
}

struct Account {
    id: u64,
    locks: LockClient,
}

impl Account {
    #[distributed_lock(key = "account:{self.id}", client = self.locks)]
    async fn close(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
