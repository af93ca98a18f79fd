// The card's example, verbatim, plus every argument and key shape on free functions.
use redlock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
pub struct Receipt {
    pub id: u64,
    pub amount: u64,
}

#[derive(Debug)]
pub enum PayError {
    Lock(LockError),
    Declined,
}

impl From<LockError> for PayError {
    fn from(err: LockError) -> Self {
        PayError::Lock(err)
    }
}

#[distributed_lock(key = "order:<id>", wait = "3s", lease = "10s")]
async fn pay_order(id: u64, amount: u64) -> Result<Receipt, PayError> {
    if amount == 0 {
        return Err(PayError::Declined);
    }
    Ok(Receipt { id, amount })
}

// Hash tag, escaped angle brackets, several placeholders, every argument.
#[distributed_lock(
    key = "{order:<id>}:<<<amount>>>:<<literal>>",
    wait = "1m30s",
    lease = "2m",
    hold_at_least = "250ms",
    on_lost = "continue"
)]
async fn all_arguments(id: u64, amount: u64) -> Result<u64, LockError> {
    Ok(id + amount)
}

// No placeholder; watchdog mode; on_lost explicitly "abort".
#[distributed_lock(key = "nightly-report", on_lost = "abort")]
async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

// `?` and early `return` in the body have the function's return type.
#[distributed_lock(key = "parse:<text>")]
async fn parse(text: &str) -> Result<u64, PayError> {
    if text.is_empty() {
        return Ok(0);
    }
    let n: u64 = text.parse().map_err(|_| PayError::Declined)?;
    Ok(n)
}

// Keywords and raw identifiers as parameter names, `mut` parameters.
#[distributed_lock(key = "kind:<type>:<count>")]
async fn raw_ident(r#type: &str, mut count: u32) -> Result<u32, LockError> {
    count += 1;
    let _ = r#type;
    Ok(count)
}

fn main() {
    let _ = pay_order(1, 2);
    let _ = all_arguments(1, 2);
    let _ = nightly_report();
    let _ = parse("7");
    let _ = raw_ident("a", 1);
    let _ = PayError::Declined;
}
