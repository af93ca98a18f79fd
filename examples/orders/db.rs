//! The shared database: one SQLite file that every instance opens. It holds the
//! customers' balances, the orders and the charges, and the accounts of the
//! transfers; it — not the service — refuses a write whose fencing token is below the
//! highest it has recorded for the order (`PAY`) or for either account (`MOVE`).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// Every customer starts with this much, in cents.
pub const OPENING_BALANCE: i64 = 10_000;

/// Every account of the transfers starts with this much, in cents.
pub const OPENING_ACCOUNT: i64 = 100_000;

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
CREATE TABLE customers (
    id      INTEGER PRIMARY KEY,
    balance INTEGER NOT NULL
);
CREATE TABLE orders (
    id       INTEGER PRIMARY KEY,
    customer INTEGER NOT NULL REFERENCES customers(id),
    amount   INTEGER NOT NULL,
    status   TEXT    NOT NULL DEFAULT 'pending',
    -- The highest fencing token a payment of this order was written with.
    fence    INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE charges (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id INTEGER NOT NULL REFERENCES orders(id),
    amount   INTEGER NOT NULL,
    fence    INTEGER NOT NULL,
    instance TEXT    NOT NULL
);
CREATE TABLE accounts (
    id      INTEGER PRIMARY KEY,
    balance INTEGER NOT NULL,
    -- The highest fencing token a transfer wrote this account with.
    fence   INTEGER NOT NULL DEFAULT 0
);
";

/// The fenced write: the order is marked paid, and its fence raised to the payer's
/// token, only if no payment with a newer token was written first. Checked and
/// written in one statement, so that no writer slips in between; the rest of the
/// payment (debit, charge row) is in the same transaction and commits only if this
/// statement changed the row. (Postgres and MySQL take the same statement.)
pub const PAY: &str = "UPDATE orders SET status = 'paid', fence = ?2 WHERE id = ?1 AND fence <= ?2";

/// The fenced write of one account of a transfer: its new balance, and its fence
/// raised to the transfer's token for this account, only if no transfer with a newer
/// token wrote the account first. A transfer runs it for both accounts, each with its
/// own token, in one transaction that commits only if both rows changed (`transfer`).
pub const MOVE: &str = "UPDATE accounts SET balance = ?2, fence = ?3 WHERE id = ?1 AND fence <= ?3";

/// Opens the database as an instance does: waiting for another process's write
/// transaction rather than failing at once.
pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open(path)?;
    connection.busy_timeout(Duration::from_secs(10))?;
    // WAL without a sync at every commit (only at checkpoints): what services
    // sharing one SQLite file usually run with.
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(connection)
}

/// Creates the database with one customer per order (same number), each order of
/// `amount` cents, and `accounts` accounts (1, 2, …) of `OPENING_ACCOUNT` each.
pub fn create(path: &Path, orders: &[(u64, i64)], accounts: u64) -> rusqlite::Result<()> {
    let mut connection = open(path)?;
    connection.execute_batch(SCHEMA)?;
    let transaction = connection.transaction()?;
    for &(id, amount) in orders {
        let id = id as i64;
        transaction.execute(
            "INSERT INTO customers (id, balance) VALUES (?1, ?2)",
            params![id, OPENING_BALANCE],
        )?;
        transaction.execute(
            "INSERT INTO orders (id, customer, amount) VALUES (?1, ?1, ?2)",
            params![id, amount],
        )?;
    }
    for id in 1..=accounts as i64 {
        transaction.execute(
            "INSERT INTO accounts (id, balance) VALUES (?1, ?2)",
            params![id, OPENING_ACCOUNT],
        )?;
    }
    transaction.commit()
}

/// The order's status (`pending`, `paid`), or `None` for no such order.
pub fn status(path: &Path, id: u64) -> rusqlite::Result<Option<String>> {
    let id = id as i64;
    open(path)?
        .query_row("SELECT status FROM orders WHERE id = ?1", [id], |row| {
            row.get(0)
        })
        .optional()
}

/// What the database did with a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    Charged,
    /// Refused: a payment with token `seen` was written first.
    Stale {
        seen: u64,
    },
}

/// Charges the order in one transaction, fenced by `token` (see `PAY`).
pub fn charge(path: &Path, id: u64, token: u64, instance: &str) -> rusqlite::Result<Charge> {
    // SQLite's integers are i64: tokens (about 2^51 today) and ids fit.
    let (id, token) = (id as i64, token as i64);
    let mut connection = open(path)?;
    // IMMEDIATE: take the write lock at BEGIN, so that two processes' transactions
    // queue on the busy timeout instead of one failing when it upgrades.
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if transaction.execute(PAY, params![id, token])? == 0 {
        let seen: i64 =
            transaction.query_row("SELECT fence FROM orders WHERE id = ?1", [id], |row| {
                row.get(0)
            })?;
        // Dropping the transaction rolls it back: nothing was written.
        return Ok(Charge::Stale { seen: seen as u64 });
    }
    transaction.execute(
        "UPDATE customers SET balance = balance - (SELECT amount FROM orders WHERE id = ?1)
          WHERE id = (SELECT customer FROM orders WHERE id = ?1)",
        [id],
    )?;
    transaction.execute(
        "INSERT INTO charges (order_id, amount, fence, instance)
         SELECT id, amount, ?2, ?3 FROM orders WHERE id = ?1",
        params![id, token, instance],
    )?;
    transaction.commit()?;
    Ok(Charge::Charged)
}

/// One order as the database has it, for the exactly-once check.
#[derive(Debug)]
pub struct Tally {
    pub id: u64,
    pub amount: i64,
    pub status: String,
    pub fence: i64,
    pub balance: i64,
    /// The charges written, as (fencing token, instance).
    pub charges: Vec<(i64, String)>,
}

/// Every order, with its customer's balance and its charges.
pub fn tally(path: &Path) -> rusqlite::Result<Vec<Tally>> {
    let connection = open(path)?;
    let mut orders = connection.prepare(
        "SELECT o.id, o.amount, o.status, o.fence, c.balance
           FROM orders o JOIN customers c ON c.id = o.customer ORDER BY o.id",
    )?;
    let mut charges = connection
        .prepare("SELECT fence, instance FROM charges WHERE order_id = ?1 ORDER BY id")?;
    let mut tallies = Vec::new();
    let rows = orders.query_map([], |row| {
        Ok(Tally {
            id: row.get::<_, i64>(0)? as u64,
            amount: row.get(1)?,
            status: row.get(2)?,
            fence: row.get(3)?,
            balance: row.get(4)?,
            charges: Vec::new(),
        })
    })?;
    for row in rows {
        let mut tally = row?;
        tally.charges = charges
            .query_map([tally.id as i64], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        tallies.push(tally);
    }
    Ok(tallies)
}

/// The balances of the two accounts of a transfer, read before it writes (a plain
/// read: nothing stops another writer between this and the write — the lock does);
/// `None` if either account does not exist.
pub fn read_pair(path: &Path, from: u64, to: u64) -> rusqlite::Result<Option<(i64, i64)>> {
    let connection = open(path)?;
    let balance = |id: u64| {
        connection
            .query_row(
                "SELECT balance FROM accounts WHERE id = ?1",
                [id as i64],
                |row| row.get::<_, i64>(0),
            )
            .optional()
    };
    Ok(balance(from)?.zip(balance(to)?))
}

/// What the database did with a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    Done,
    /// Refused, nothing written: a transfer with token `seen` wrote `account` first.
    Stale {
        account: u64,
        token: u64,
        seen: u64,
    },
}

/// One transfer as the service writes it: `amount` cents from `from` to `to`, whose
/// balances were read as `read` (`read_pair`); each account's write carries its own
/// fencing token.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    pub from: u64,
    pub to: u64,
    pub amount: i64,
    pub read: (i64, i64),
    pub from_token: u64,
    pub to_token: u64,
}

/// Writes the transfer in one transaction: both accounts' new balances (absolute
/// values, from what was read), each fenced by its own token (`MOVE`). Both rows are
/// written, or — one account's fence newer than its token — neither.
pub fn transfer(path: &Path, transfer: Transfer) -> rusqlite::Result<Moved> {
    let Transfer {
        from,
        to,
        amount,
        read: (from_balance, to_balance),
        from_token,
        to_token,
    } = transfer;
    let mut connection = open(path)?;
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (account, balance, token) in [
        (from, from_balance - amount, from_token),
        (to, to_balance + amount, to_token),
    ] {
        if transaction.execute(MOVE, params![account as i64, balance, token as i64])? == 0 {
            let seen: i64 = transaction.query_row(
                "SELECT fence FROM accounts WHERE id = ?1",
                [account as i64],
                |row| row.get(0),
            )?;
            // Dropping the transaction rolls it back: the other account's write too.
            return Ok(Moved::Stale {
                account,
                token,
                seen: seen as u64,
            });
        }
    }
    transaction.commit()?;
    Ok(Moved::Done)
}

/// Every account as (id, balance, fence), by id.
pub fn accounts(path: &Path) -> rusqlite::Result<Vec<(u64, i64, u64)>> {
    let connection = open(path)?;
    let mut query = connection.prepare("SELECT id, balance, fence FROM accounts ORDER BY id")?;
    query
        .query_map([], |row| {
            Ok((
                row.get::<_, i64>(0)? as u64,
                row.get(1)?,
                row.get::<_, i64>(2)? as u64,
            ))
        })?
        .collect()
}
