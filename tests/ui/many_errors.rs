use redlock_runtime::distributed_lock;

// Every mistake is reported at once, each on its own token.
#[distributed_lock(key = "order:<idd>", wait = "3 lightyears", lease = "0ms", on_lost = "panic", retry = 3)]
fn pay_order(id: u64) -> u64 {
    id
}

fn main() {}
