// Any return type that *is* a `Result` whose error converts from `LockError` is accepted,
// whatever it is called: `anyhow::Result`-like, a crate's own alias (`AppResult<T>`), the full
// path, `io::Result<T>` (`io::Error` has `From<LockError>`), a boxed error.
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

#[derive(Debug)]
pub struct AppError;
impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}
pub type AppResult<T> = std::result::Result<T, AppError>;

#[distributed_lock(key = "app:<id>")]
async fn app_result(id: u64) -> AppResult<u64> {
    Ok(id)
}

#[distributed_lock(key = "io:<id>")]
async fn io_result(id: u64) -> std::io::Result<u64> {
    Ok(id)
}

type Boxed = Box<dyn std::error::Error + Send + Sync>;

#[distributed_lock(key = "boxed:<id>")]
async fn boxed(id: u64) -> std::result::Result<u64, Boxed> {
    Ok(id)
}

fn main() {
    let _ = app_result(1);
    let _ = io_result(1);
    let _ = boxed(1);
    let _ = anyhow_result(1);
    let _ = own_result(1);
    let _ = full_path(1);
}
