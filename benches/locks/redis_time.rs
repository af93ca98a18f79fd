//! Where the time of an uncontended cycle goes inside Redis: its own time per cycle
//! (`INFO commandstats`) and per command (`SLOWLOG` with a 0 µs threshold), for each
//! lock. Redis is one thread, so its time per cycle bounds throughput.

use std::collections::{BTreeMap, HashMap};

use crate::contenders::Lock;
use crate::context::{BLOCK_LEN, Bench};
use crate::scenarios;
use crate::stats::{median, number};

/// Notes Redis's time per command; returns its time per cycle in µs, redlock's then
/// rslock's, for the uncontended breakdown.
pub async fn run(bench: &mut Bench) -> [f64; 2] {
    let mut server_time = [0.0; 2];
    for ((lock, commands), time) in [
        (&bench.redlock, &["evalsha"][..]),
        (&bench.rslock, &["evalsha", "set"][..]),
    ]
    .into_iter()
    .zip(&mut server_time)
    {
        let key = format!("bench:uncontended:{}", lock.name());
        let before = command_usec(&mut bench.ping, commands).await;
        let n = BLOCK_LEN / bench.scale;
        scenarios::cycle_block(lock, &key, n).await;
        let after = command_usec(&mut bench.ping, commands).await;
        *time = (after - before) / n as f64;
    }
    let per_command = command_durations(
        &mut bench.ping,
        &bench.redlock,
        &bench.rslock,
        200 / bench.scale,
    )
    .await;
    bench.report.note(format!(
        "Redis's time per command, median from SLOWLOG with a 0 µs threshold: {per_command}"
    ));
    server_time
}

/// Total microseconds Redis spent in `commands` so far (`INFO commandstats`).
pub async fn command_usec(
    connection: &mut redis::aio::MultiplexedConnection,
    commands: &[&str],
) -> f64 {
    command_stats(connection)
        .await
        .iter()
        .filter(|(name, _)| commands.contains(&name.as_str()))
        .map(|(_, (_, usec))| usec)
        .sum()
}

/// Calls and microseconds of every command so far (`INFO commandstats`), by name.
pub async fn command_stats(
    connection: &mut redis::aio::MultiplexedConnection,
) -> HashMap<String, (f64, f64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> Option<f64> {
                fields
                    .split(',')
                    .find_map(|field| field.strip_prefix(key))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
        })
        .collect()
}

/// A numeric field of `INFO <section>` (0 when absent).
pub async fn info_field(
    connection: &mut redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(connection)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|line| {
            line.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// How long Redis itself spends in each command of a cycle: every command goes to the
/// SLOWLOG (threshold 0) for `n` cycles of each lock; the median per command and script.
async fn command_durations(
    connection: &mut redis::aio::MultiplexedConnection,
    redlock: &Lock,
    rslock: &Lock,
    n: usize,
) -> String {
    let mut parts = Vec::new();
    for lock in [redlock, rslock] {
        slowlog_everything(connection).await;
        scenarios::cycle_block(lock, &format!("bench:slowlog:{}", lock.name()), n).await;
        let by_command = slowlog_by_command(connection).await;
        parts.push(format!(
            "{}: {}",
            lock.name(),
            by_command
                .iter()
                .map(|(name, times)| format!(
                    "{name} {} µs (×{})",
                    number(median(times)),
                    times.len()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    parts.join("; ")
}

/// From now on every command goes to the SLOWLOG (threshold 0), which starts empty.
pub async fn slowlog_everything(connection: &mut redis::aio::MultiplexedConnection) {
    admin(connection, &["CONFIG", "SET", "slowlog-max-len", "100000"]).await;
    admin(
        connection,
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
    )
    .await;
    admin(connection, &["SLOWLOG", "RESET"]).await;
}

/// The commands logged since [`slowlog_everything`], their µs by command (`EVALSHA`
/// told apart by key and argument count: one script from another); then the SLOWLOG
/// is emptied and back at its default threshold.
pub async fn slowlog_by_command(
    connection: &mut redis::aio::MultiplexedConnection,
) -> BTreeMap<String, Vec<f64>> {
    admin(
        connection,
        &["CONFIG", "SET", "slowlog-log-slower-than", "10000"],
    )
    .await;
    let entries: redis::Value = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(connection)
        .await
        .expect("SLOWLOG GET");
    admin(connection, &["SLOWLOG", "RESET"]).await;
    let mut by_command: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let redis::Value::Array(entries) = entries else {
        return by_command;
    };
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(micros)), Some(redis::Value::Array(args))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let name = args
            .first()
            .map(text)
            .unwrap_or_default()
            .to_ascii_uppercase();
        if name == "CONFIG" || name == "SLOWLOG" {
            continue;
        }
        // EVALSHA <sha> <numkeys>: tell the scripts apart by key and argument count.
        let label = if name == "EVALSHA" {
            let keys = args.get(2).map(text).unwrap_or_default();
            format!("EVALSHA({keys} keys, {} args)", args.len() - 3)
        } else {
            name
        };
        by_command.entry(label).or_default().push(*micros as f64);
    }
    by_command
}

/// A CONFIG or SLOWLOG command, whose reply is not needed.
async fn admin(connection: &mut redis::aio::MultiplexedConnection, args: &[&str]) {
    let _: redis::Value = redis::cmd(args[0])
        .arg(&args[1..])
        .query_async(connection)
        .await
        .expect("SLOWLOG/CONFIG");
}
