// `mode = "read"`, `mode = "write"` and `permits = N`, alone and with the other arguments.
use redlock_runtime::{LockClient, LockError, distributed_lock};

pub struct Doc;

#[distributed_lock(key = "doc:<id>", mode = "read")]
async fn load_doc(id: u64) -> Result<Doc, LockError> {
    let _ = id;
    Ok(Doc)
}

#[distributed_lock(key = "doc:<id>", mode = "write", wait = "5s", lease = "10s")]
async fn save_doc(id: u64, doc: Doc) -> Result<(), LockError> {
    let _ = (id, doc);
    Ok(())
}

#[distributed_lock(key = "partner:<tenant>", permits = 5)]
async fn call_partner(tenant: &str) -> Result<u64, LockError> {
    let _ = tenant;
    Ok(1)
}

// Before the key, with a client, `on_busy = "skip"` and `hold_at_least`.
#[distributed_lock(permits = 5, key = "report:<day>", client = locks, wait = "1s", lease = "1m",
                   hold_at_least = "1s", on_busy = "skip", on_lost = "continue")]
async fn report(locks: &LockClient, day: u32) -> Result<Option<()>, LockError> {
    let _ = day;
    Ok(Some(()))
}

struct Cache {
    locks: LockClient,
}

impl Cache {
    #[distributed_lock(key = "cache:<name>", mode = "read", client = self.locks)]
    async fn get(&self, name: &str) -> Result<Option<String>, LockError> {
        let _ = name;
        Ok(None)
    }

    #[distributed_lock(key = "cache:<name>", mode = "write", client = self.locks)]
    async fn put(&self, name: &str, value: String) -> Result<(), LockError> {
        let _ = (name, value);
        Ok(())
    }
}

fn main() {
    let _ = load_doc(1);
    let _ = save_doc(1, Doc);
    let _ = call_partner("acme");
    let _ = |locks: &'static LockClient| report(locks, 1);
    let _ = |cache: &'static Cache| (cache.get("k"), cache.put("k", String::new()));
}
