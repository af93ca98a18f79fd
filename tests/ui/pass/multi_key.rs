// `keys = [...]`: several keys locked as one, with every argument a lock of one key takes
// (`mode` and `permits` aside: a lock of several keys is exclusive).
use std::sync::Arc;

use redlock_runtime::{LockClient, LockError, current_lock, current_locks, distributed_lock};

pub struct Receipt {
    pub tokens: Vec<u64>,
}

// The example.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "3s", lease = "10s")]
async fn transfer(from: u64, to: u64, amount: u64) -> Result<Receipt, LockError> {
    let _ = (from, to, amount);
    // Each key's lock, in canonical order (sorted, no key twice); the first is `current_lock()`.
    let locks = current_locks();
    assert_eq!(locks.first(), current_lock().as_ref());
    Ok(Receipt {
        tokens: locks.iter().map(|lock| lock.fencing_token()).collect(),
    })
}

struct Service {
    locks: Arc<LockClient>,
    region: &'static str,
}

impl Service {
    // A scheduled job: skipped when another holds any of the keys; a client,
    // `hold_at_least` and `on_lost = "continue"`.
    #[distributed_lock(keys = ["ledger:{<day>}", "report:<day>", "audit:<self.region>"],
                       client = self.locks, wait = "0s", lease = "1m", hold_at_least = "1s",
                       on_busy = "skip", on_lost = "continue")]
    async fn nightly(&self, day: u32) -> Result<Option<u32>, LockError> {
        Ok(Some(day))
    }

    // A `&LockClient` parameter, `on_lost = "abort"`, a trailing comma, a field path and a
    // key without placeholders.
    #[distributed_lock(keys = ["stock:<item.sku>", "stock:totals",], client = locks, on_lost = "abort")]
    async fn restock(&self, locks: &LockClient, item: Item) -> Result<u64, LockError> {
        let _ = self.region;
        Ok(item.sku)
    }

    // One template: a lock of one key, written with `keys`.
    #[distributed_lock(keys = ["single:<id>"], client = &self.locks)]
    async fn single(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

pub struct Item {
    pub sku: u64,
}

fn main() {
    let _ = transfer(1, 2, 10);
    let _ = |service: &'static Service, locks: &'static LockClient| {
        let _ = service.nightly(1);
        let _ = service.restock(locks, Item { sku: 1 });
        let _ = service.single(1);
    };
}
