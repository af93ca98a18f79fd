//! The lottery's database: the users and the draws, in SQLite (the classic version of
//! this job records its winners in MySQL; the statements are the same). Every draw is
//! recorded, so that a round drawn twice is seen, not hidden; and the database, not
//! the worker, refuses a draw whose fencing token (round mode) or term (leader mode) is
//! below the highest it has recorded for that lock (`FENCE`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY);
-- One row per draw: a round drawn twice has two.
CREATE TABLE IF NOT EXISTS draws (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    round_at TEXT    NOT NULL,  -- the scheduled instant, UTC
    worker   INTEGER NOT NULL,
    token    INTEGER NOT NULL,  -- the fencing token, or the scheduler's term
    winners  TEXT    NOT NULL
);
-- The highest token each lock's holders have written with.
CREATE TABLE IF NOT EXISTS fences (
    lock  TEXT    PRIMARY KEY,
    fence INTEGER NOT NULL
);
";

/// The fenced write: raises the lock's fence to the writer's token unless a higher
/// token has written; `changes() = 0` means refused. One statement, so that nothing
/// slips between the check and the write; the draw is inserted in the same
/// transaction, which commits only if this changed a row. (Postgres takes the same
/// statement; MySQL writes it `INSERT … ON DUPLICATE KEY UPDATE fence = IF(…)`.)
pub const FENCE: &str = "INSERT INTO fences (lock, fence) VALUES (?1, ?2)
    ON CONFLICT (lock) DO UPDATE SET fence = excluded.fence WHERE fence <= excluded.fence";

/// The database file every process of a run opens.
#[derive(Debug, Clone)]
pub struct Db {
    path: PathBuf,
}

/// What the database did with a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    Written,
    /// Refused: a writer with token `seen` came first.
    Stale {
        seen: u64,
    },
}

impl Db {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Db { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `call` on a fresh connection, off the async threads.
    async fn with<T: Send + 'static>(
        &self,
        call: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> rusqlite::Result<T> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let mut connection = Connection::open(path)?;
            // Another process's write transaction: wait for it rather than fail.
            connection.busy_timeout(Duration::from_secs(10))?;
            call(&mut connection)
        })
        .await
        .map_err(|error| rusqlite::Error::ToSqlConversionFailure(error.into()))?
    }

    /// Creates the tables (if need be) and the users 1..=`users`.
    pub async fn create(&self, users: u32) -> rusqlite::Result<()> {
        self.with(move |connection| {
            connection.execute_batch(SCHEMA)?;
            let transaction = connection.transaction()?;
            for id in 1..=users {
                transaction.execute("INSERT OR IGNORE INTO users (id) VALUES (?1)", [id])?;
            }
            transaction.commit()
        })
        .await
    }

    /// `count` users at random.
    pub async fn pick(&self, count: usize) -> rusqlite::Result<Vec<u32>> {
        self.with(move |connection| {
            let mut query =
                connection.prepare("SELECT id FROM users ORDER BY random() LIMIT ?1")?;
            let mut ids = query
                .query_map([count as i64], |row| row.get(0))?
                .collect::<rusqlite::Result<Vec<u32>>>()?;
            ids.sort_unstable();
            Ok(ids)
        })
        .await
    }

    /// Raises `lock`'s fence to `token` (a new scheduler's term, before it looks at
    /// what is drawn), or says who is newer.
    pub async fn claim(&self, lock: &str, token: u64) -> rusqlite::Result<Fenced> {
        let lock = lock.to_owned();
        self.with(move |connection| {
            let transaction =
                connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let fenced = fence(&transaction, &lock, token)?;
            transaction.commit()?;
            Ok(fenced)
        })
        .await
    }

    /// Records a draw of the round at `round_at`, fenced by `token` on `lock`: written
    /// in one transaction with the fence, or refused by it.
    pub async fn record(
        &self,
        lock: &str,
        round_at: &str,
        worker: u32,
        token: u64,
        winners: &str,
    ) -> rusqlite::Result<Fenced> {
        let (lock, round_at, winners) = (lock.to_owned(), round_at.to_owned(), winners.to_owned());
        self.with(move |connection| {
            let transaction =
                connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let fenced = fence(&transaction, &lock, token)?;
            if fenced == Fenced::Written {
                transaction.execute(
                    "INSERT INTO draws (round_at, worker, token, winners) VALUES (?1, ?2, ?3, ?4)",
                    params![round_at, worker, token as i64, winners],
                )?;
                transaction.commit()?;
            }
            Ok(fenced)
        })
        .await
    }

    /// The draws of the round at `round_at`, as (worker, token), in the order written.
    pub async fn draws(&self, round_at: &str) -> rusqlite::Result<Vec<(u32, u64)>> {
        let round_at = round_at.to_owned();
        self.with(move |connection| {
            let mut query = connection
                .prepare("SELECT worker, token FROM draws WHERE round_at = ?1 ORDER BY id")?;
            query
                .query_map([round_at], |row| {
                    Ok((row.get(0)?, row.get::<_, i64>(1)? as u64))
                })?
                .collect()
        })
        .await
    }

    /// The worker that drew the round first, if any did.
    pub async fn drawn_by(&self, round_at: &str) -> rusqlite::Result<Option<u32>> {
        let round_at = round_at.to_owned();
        self.with(move |connection| {
            connection
                .query_row(
                    "SELECT worker FROM draws WHERE round_at = ?1 ORDER BY id LIMIT 1",
                    [round_at],
                    |row| row.get(0),
                )
                .optional()
        })
        .await
    }
}

/// `FENCE` inside a transaction; on refusal, reads the fence that refused it.
fn fence(connection: &Connection, lock: &str, token: u64) -> rusqlite::Result<Fenced> {
    // SQLite's integers are i64: tokens (about 2^51 today) fit.
    if connection.execute(FENCE, params![lock, token as i64])? == 1 {
        return Ok(Fenced::Written);
    }
    let seen: i64 =
        connection.query_row("SELECT fence FROM fences WHERE lock = ?1", [lock], |row| {
            row.get(0)
        })?;
    Ok(Fenced::Stale { seen: seen as u64 })
}
