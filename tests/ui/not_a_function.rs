use redlock_runtime::distributed_lock;

#[distributed_lock(key = "order")]
struct Order {
    id: u64,
}

fn main() {}
