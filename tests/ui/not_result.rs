use redlock_runtime::distributed_lock;

#[distributed_lock(key = "order:<id>")]
async fn pay_order(id: u64) -> Option<u64> {
    Some(id)
}

#[distributed_lock(key = "order:<id>")]
async fn cancel_order(id: u64) {
    let _ = id;
}

fn main() {}
