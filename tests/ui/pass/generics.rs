// Generic functions, `impl Trait` parameters, where clauses, lifetimes.
use std::fmt::{Debug, Display};

use redlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "item:<id>")]
async fn generic<T: Display + Send>(id: T) -> Result<String, LockError> {
    Ok(id.to_string())
}

#[distributed_lock(key = "item:<id>:<name>")]
async fn impl_trait(id: impl Display, name: impl AsRef<str> + Display) -> Result<usize, LockError> {
    Ok(id.to_string().len() + name.as_ref().len())
}

#[distributed_lock(key = "item:<key>")]
async fn where_clause<K, V>(key: K, value: V) -> Result<V, LockError>
where
    K: Display,
    V: Debug + Clone,
{
    let _ = key;
    Ok(value.clone())
}

#[distributed_lock(key = "item:<name>")]
async fn borrowed<'a>(name: &'a str, buffer: &'a mut Vec<u8>) -> Result<&'a str, LockError> {
    buffer.extend_from_slice(name.as_bytes());
    Ok(name)
}

#[distributed_lock(key = "item:<name>")]
async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

fn main() {
    let _ = generic(1u8);
    let _ = impl_trait(1, "a");
    let _ = where_clause("k", vec![1]);
    let mut buffer = Vec::new();
    let _ = borrowed("a", &mut buffer);
    let _ = elided("a");
}
