// Field paths, tuple fields, hash tags, `self` paths, `Display` types.
use redlock_runtime::{LockError, distributed_lock};

pub struct Customer {
    pub id: u32,
}

pub struct Order {
    pub id: u64,
    pub customer: Customer,
    pub pair: (u8, (u16, String)),
}

#[distributed_lock(key = "order:{<order.customer.id>}:<order.id>")]
async fn field_paths(order: &Order) -> Result<u64, LockError> {
    Ok(order.id)
}

#[distributed_lock(key = "pair:<order.pair.0>:<order.pair.1.1>:<pair.1>")]
async fn tuple_fields(order: Order, pair: (String, u8)) -> Result<Order, LockError> {
    let _ = pair;
    Ok(order)
}

#[distributed_lock(key = "{shop}:<<<name>>>")]
async fn hash_tag_and_escapes(name: String) -> Result<String, LockError> {
    Ok(name)
}

impl Order {
    #[distributed_lock(key = "order:<self.customer.id>:<self.pair.1.0>:<self>")]
    async fn nested_self(&self) -> Result<u64, LockError> {
        Ok(self.id)
    }
}

impl std::fmt::Display for Order {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.id)
    }
}

// Destructured parameters are fine when the key names whole parameters.
#[distributed_lock(key = "point:<id>")]
async fn destructured(id: u64, (x, y): (i32, i32), _: u8) -> Result<i32, LockError> {
    let _ = id;
    Ok(x + y)
}

fn main() {
    let order = Order {
        id: 1,
        customer: Customer { id: 2 },
        pair: (3, (4, "5".into())),
    };
    let _ = field_paths(&order);
    let _ = order.nested_self();
    let _ = tuple_fields(order, ("a".into(), 1));
    let _ = hash_tag_and_escapes("a".into());
    let _ = destructured(1, (2, 3), 4);
}
