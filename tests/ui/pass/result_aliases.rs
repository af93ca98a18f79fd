// Any return type whose path ends in `Result` is accepted: `anyhow::Result`-like, a crate's own
// alias. (`io::Result<T>` passes the macro too, but `io::Error` has no `From<LockError>`.)
use redlock_runtime::{LockError, distributed_lock};

mod anyhow {
    #[derive(Debug)]
    pub struct Error;
    impl From<redlock_runtime::LockError> for Error {
        fn from(_: redlock_runtime::LockError) -> Self {
            Error
        }
    }
    pub type Result<T, E = Error> = std::result::Result<T, E>;
}

pub type Result<T> = std::result::Result<T, LockError>;

#[distributed_lock(key = "anyhow:<id>")]
async fn anyhow_result(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

#[distributed_lock(key = "own:<id>")]
async fn own_result(id: u64) -> Result<u64> {
    Ok(id)
}

#[distributed_lock(key = "full:<id>")]
async fn full_path(id: u64) -> std::result::Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = anyhow_result(1);
    let _ = own_result(1);
    let _ = full_path(1);
}
