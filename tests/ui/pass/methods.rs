// Methods: `&self`, `&mut self`, `self: Arc<Self>`, `self` by value, `<self.id>`, `client = self.locks`.
use std::sync::Arc;

use redlock_runtime::{LockClient, LockError, distributed_lock};

pub struct Account {
    id: u64,
    balance: u64,
    locks: LockClient,
    shared: Arc<LockClient>,
}

impl Account {
    #[distributed_lock(key = "account:<self.id>", client = self.locks)]
    pub async fn balance(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>", client = &self.locks, lease = "5s")]
    pub async fn deposit(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.id>:<amount>", client = self.shared)]
    pub async fn withdraw(self: Arc<Self>, amount: u64) -> Result<u64, LockError> {
        Ok(self.balance.saturating_sub(amount))
    }

    #[distributed_lock(key = "account:<self.id>", client = self.shared.clone())]
    pub async fn close(self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<id>")]
    pub async fn associated(id: u64) -> Result<Self, LockError> {
        let _ = id;
        Err(LockError::from_macro_test())
    }
}

trait FromMacroTest {
    fn from_macro_test() -> Self;
}

impl FromMacroTest for LockError {
    fn from_macro_test() -> Self {
        unimplemented!()
    }
}

fn main() {
    fn _calls(account: Account) {
        let mut account = account;
        let _ = account.balance();
        let _ = account.deposit(1);
        let account = Arc::new(account);
        let _ = account.clone().withdraw(1);
        let _ = Account::associated(1);
    }
    fn _close(account: Account) {
        let _ = account.close();
    }
}
