// `client = ...`: a static (`&*LOCKS`), an `Arc<LockClient>`, a `&LockClient` parameter, a
// `&Arc<LockClient>` field, a `&&LockClient`, a `Box<LockClient>`.
use std::sync::{Arc, LazyLock, OnceLock};

use redlock_runtime::{LockClient, LockError, distributed_lock};

static LOCKS: LazyLock<LockClient> = LazyLock::new(|| unimplemented!("connected at startup"));
static CELL: OnceLock<LockClient> = OnceLock::new();

#[distributed_lock(key = "order:<id>", client = &*LOCKS)]
async fn from_static(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", client = CELL.get().expect("connected at startup"))]
async fn from_once_lock(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", client = locks)]
async fn from_arc(locks: Arc<LockClient>, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", client = locks)]
async fn from_ref(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

struct Service {
    arc: Arc<LockClient>,
    boxed: Box<LockClient>,
}

impl Service {
    #[distributed_lock(key = "order:<id>", client = &self.arc)]
    async fn from_ref_arc(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "order:<id>", client = self.boxed)]
    async fn from_box(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

#[distributed_lock(key = "order:<id>", client = &locks)]
async fn from_ref_ref(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = from_static(1);
    let _ = from_once_lock(1);
    fn _calls(locks: Arc<LockClient>) {
        let _ = from_ref(&locks, 1);
        let _ = from_ref_ref(&locks, 1);
        let _ = from_arc(locks, 1);
    }
}
