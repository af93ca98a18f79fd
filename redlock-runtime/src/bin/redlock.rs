//! `redlock`: who holds a lock, since when, who waits — and a way to free it, from a
//! terminal. Install from a checkout with `cargo install --path redlock-runtime --features
//! cli` (once the crate is published: `cargo install redlock-runtime --features cli`).
//!
//! ```text
//! redlock list 'order:*'          # a table: key, holder, held for, ttl, token, waiting
//!                                 # (a read lock's readers, a semaphore's permits below it)
//! redlock inspect order:42        # one key; exit code 1 when free
//! redlock unlock order:42 --force # frees it whoever holds it; prints whom it evicted
//! redlock watch order:42          # follows it live until Ctrl-C
//! redlock vouch redis://a/ redis://b/ redis://c/
//!                                 # a new RedLock deployment's masters vote at once
//! ```
//!
//! The servers come from `--url` or `REDLOCK_URL`, in any mode's syntax: one URL,
//! a comma-separated list for RedLock, `cluster:…` or `sentinel:NAME:…`; `vouch` takes
//! the masters as arguments too.
//! Exit codes: 0 done, 1 the key is free (`inspect`, `unlock`), 2 an error (one line
//! on stderr).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use redlock_runtime::{LockClient, LockError, LockInfo, LockKind};

#[derive(Parser)]
#[command(
    name = "redlock",
    version,
    about = "Inspect and free redlock locks in Redis; vouch for a new RedLock deployment"
)]
struct Cli {
    /// The Redis server(s): a URL, a comma-separated list (RedLock), `cluster:URL,…`
    /// or `sentinel:NAME:URL,…`.
    #[arg(long, env = "REDLOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,
    /// How long to wait for Redis to answer, e.g. `3s`.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration, global = true)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lists the locks whose keys match PATTERN (Redis glob syntax; default: all).
    List {
        #[arg(default_value = "*")]
        pattern: String,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Shows who holds KEY; exit code 1 when it is free.
    Inspect {
        key: String,
        /// A JSON object (`null` when free) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Frees KEY whoever holds it (its holder finds out at its next renewal);
    /// refuses without --force.
    Unlock {
        key: String,
        /// Yes, evict the holder.
        #[arg(long)]
        force: bool,
    },
    /// Follows KEY live — holder changes, waiting count — until Ctrl-C.
    Watch {
        key: String,
        /// How often to look, e.g. `200ms`.
        #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
        every: Duration,
    },
    /// Vouches for the masters of a new RedLock deployment, so that they vote at once
    /// instead of sitting out max_lease: you assert that no lock taken on them can
    /// still run (they are new, or every client of theirs has been stopped for longer
    /// than max_lease). Refuses them all, writing nothing, if any holds redlock data.
    Vouch {
        /// Every master of the deployment (default: those of --url / REDLOCK_URL).
        urls: Vec<String>,
        /// The deployment's max_lease, as its clients set it, e.g. `60s` (the default).
        #[arg(long, value_parser = humantime::parse_duration)]
        max_lease: Option<Duration>,
    },
}

/// A failure the user reads: one line, no backtrace.
struct Failure(String);

impl From<LockError> for Failure {
    fn from(error: LockError) -> Self {
        Failure(error.chain().to_string())
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error)
            if matches!(
                error.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error)
            if error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            // `redlock` alone: the help, as a usage error.
            let _ = error.print();
            return ExitCode::from(2);
        }
        Err(error) => {
            // One line, like every other error here; `--help` has the rest.
            let text = error.to_string();
            let line = text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with("Usage:"))
                .filter(|line| !line.starts_with("For more information"))
                .collect::<Vec<_>>()
                .join(" ");
            let line = line.strip_prefix("error: ").unwrap_or(&line).to_owned();
            return fail(Failure(format!("{line} (see `redlock --help`)")));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(Failure(format!("cannot start: {error}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(failure) => fail(failure),
    }
}

fn fail(Failure(message): Failure) -> ExitCode {
    eprintln!("redlock: {message}");
    ExitCode::from(2)
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let url = match &cli.command {
        Command::Vouch { urls, .. } if !urls.is_empty() => Some(urls.join(",")),
        _ => cli.url,
    };
    let Some(url) = url.filter(|url| !url.trim().is_empty()) else {
        return Err(Failure(
            "no server given: pass --url redis://host:port/ or set REDLOCK_URL".into(),
        ));
    };
    if cli.timeout.is_zero() {
        return Err(Failure("--timeout must be above zero".into()));
    }
    if let Command::Unlock { key, force: false } = &cli.command {
        return Err(Failure(format!(
            "refusing to free `{key}` without --force: its holder keeps running until \
             its next renewal and may still write; see `redlock inspect {key}` first"
        )));
    }
    let host = gethostname::gethostname();
    let mut builder = LockClient::builder_from_spec(&url)
        .name(format!(
            "redlock-cli@{}:{}",
            host.to_string_lossy(),
            std::process::id()
        ))
        .connect_timeout(cli.timeout)
        .response_timeout(cli.timeout);
    if let Command::Vouch {
        max_lease: Some(max_lease),
        ..
    } = &cli.command
    {
        builder = builder.max_lease(*max_lease);
    }
    let client = builder.connect().await?;
    let mut out = std::io::stdout().lock();
    let written = |result: std::io::Result<()>| {
        result.map_err(|error| Failure(format!("cannot write the output: {error}")))
    };
    match cli.command {
        Command::List { pattern, json } => {
            let locks = client.locks(&pattern).await?;
            if json {
                let rows: Vec<_> = locks.iter().map(to_json).collect();
                written(writeln!(out, "{}", serde_json::Value::Array(rows)))?;
            } else {
                written(write_table(&mut out, &locks))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { key, json } => {
            let info = client.inspect(&key).await?;
            if json {
                let value = info.as_ref().map_or(serde_json::Value::Null, to_json);
                written(writeln!(out, "{value}"))?;
            } else if let Some(info) = &info {
                written(write_table(&mut out, std::slice::from_ref(info)))?;
            } else {
                eprintln!("redlock: {key} is free");
            }
            Ok(if info.is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Unlock { key, .. } => match client.evict(&key).await? {
            Some(evicted) if evicted.kind() != LockKind::Exclusive => {
                // Each share: its client, its token and the lease it had left.
                let shares: Vec<String> = evicted
                    .shares()
                    .iter()
                    .map(|share| {
                        format!(
                            "{} (client {}), token {}, ttl {}",
                            share.name(),
                            share.client_id(),
                            share.fencing_token(),
                            short(share.ttl())
                        )
                    })
                    .collect();
                written(writeln!(
                    out,
                    "freed {key}: evicted {} ({})",
                    evicted.holder(),
                    shares.join("; ")
                ))?;
                Ok(ExitCode::SUCCESS)
            }
            Some(evicted) => {
                written(writeln!(
                    out,
                    "freed {key}: evicted {} (token {}, held for {})",
                    evicted.holder(),
                    evicted.fencing_token(),
                    short(evicted.held_for())
                ))?;
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("redlock: {key} was free; nothing to do");
                Ok(ExitCode::from(1))
            }
        },
        Command::Vouch { .. } => {
            let vouched = client.vouch_for_blank_masters().await?;
            written(match vouched {
                0 => writeln!(
                    out,
                    "nothing to vouch for: every master was already vouched for"
                ),
                1 => writeln!(out, "vouched for 1 master: it votes at once"),
                n => writeln!(out, "vouched for {n} masters: they vote at once"),
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Watch { key, every } => {
            if every.is_zero() {
                return Err(Failure("--every must be above zero".into()));
            }
            written(writeln!(
                out,
                "watching {key} every {} (Ctrl-C to stop)",
                short(every)
            ))?;
            drop(out);
            let started = tokio::time::Instant::now();
            let mut last: Option<Option<(String, u64, usize)>> = None;
            let mut tick = tokio::time::interval(every);
            let stop = tokio::signal::ctrl_c();
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => return Ok(ExitCode::SUCCESS),
                    _ = tick.tick() => {}
                }
                // A Redis outage or failover is reported and watched through.
                let info = match client.inspect(&key).await {
                    Ok(info) => info,
                    Err(error) => {
                        eprintln!("redlock: {} (still watching)", error.chain());
                        last = None;
                        tokio::select! {
                            _ = &mut stop => return Ok(ExitCode::SUCCESS),
                            _ = tokio::time::sleep(every.max(std::time::Duration::from_secs(1))) => {}
                        }
                        continue;
                    }
                };
                let now = info.as_ref().map(|info| {
                    (
                        info.holder().to_owned(),
                        info.fencing_token(),
                        info.waiting(),
                    )
                });
                if last.as_ref() == Some(&now) {
                    continue;
                }
                let at = short(started.elapsed());
                let line = match &info {
                    // A key held in shares has no one token or start: the shares' count,
                    // lease and waiters.
                    Some(info) if info.kind() != LockKind::Exclusive => format!(
                        "+{at} {key} held by {} (ttl {}, {} waiting)",
                        info.holder(),
                        short(info.ttl()),
                        info.waiting()
                    ),
                    Some(info) => format!(
                        "+{at} {key} held by {} (token {}, held for {}, ttl {}, {} waiting)",
                        info.holder(),
                        info.fencing_token(),
                        short(info.held_for()),
                        short(info.ttl()),
                        info.waiting()
                    ),
                    None => format!("+{at} {key} is free"),
                };
                let mut out = std::io::stdout().lock();
                written(writeln!(out, "{line}").and_then(|()| out.flush()))?;
                last = Some(now);
            }
        }
    }
}

fn to_json(info: &LockInfo) -> serde_json::Value {
    serde_json::json!({
        "key": info.key(),
        "holder": info.holder(),
        "fencing_token": info.fencing_token(),
        "held_for_ms": info.held_for().as_millis() as u64,
        "ttl_ms": info.ttl().as_millis() as u64,
        "waiting": info.waiting(),
        "kept": info.is_kept(),
        "kind": match info.kind() {
            LockKind::Read => "read",
            LockKind::Semaphore { .. } => "semaphore",
            _ => "exclusive",
        },
        "permits": match info.kind() {
            LockKind::Semaphore { permits } => Some(permits),
            _ => None,
        },
        "shares": info
            .shares()
            .iter()
            .map(|share| serde_json::json!({
                "client_id": share.client_id(),
                "name": share.name(),
                "fencing_token": share.fencing_token(),
                "ttl_ms": share.ttl().as_millis() as u64,
                "kept": share.is_kept(),
            }))
            .collect::<Vec<_>>(),
    })
}

fn write_table(out: &mut impl Write, locks: &[LockInfo]) -> std::io::Result<()> {
    let header = [
        "KEY",
        "HOLDER",
        "HELD FOR",
        "TTL",
        "FENCING TOKEN",
        "WAITING",
    ];
    let rows: Vec<[String; 6]> = locks
        .iter()
        .map(|info| {
            [
                info.key().to_owned(),
                if info.is_kept() {
                    format!("{} (kept)", info.holder())
                } else {
                    info.holder().to_owned()
                },
                if info.kind() == LockKind::Exclusive {
                    short(info.held_for())
                } else {
                    // Not recorded for a key held in shares.
                    "-".to_owned()
                },
                short(info.ttl()),
                if info.kind() == LockKind::Exclusive {
                    info.fencing_token().to_string()
                } else {
                    "-".to_owned()
                },
                info.waiting().to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut text = String::new();
        for (index, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if index > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            if index + 1 < cells.len() {
                text.extend(std::iter::repeat_n(' ', width - cell.chars().count()));
            }
        }
        text
    };
    writeln!(out, "{}", line(&header.map(str::to_owned)))?;
    for (row, info) in rows.iter().zip(locks) {
        writeln!(out, "{}", line(row))?;
        // A key held in shares: one line per reader or permit holder under its row.
        let what = match info.kind() {
            LockKind::Read => "reader",
            _ => "permit",
        };
        for share in info.shares() {
            writeln!(
                out,
                "  {what} held by {} (client {}), token {}, ttl {}{}",
                share.name(),
                share.client_id(),
                share.fencing_token(),
                short(share.ttl()),
                if share.is_kept() { " (kept)" } else { "" }
            )?;
        }
    }
    if rows.is_empty() {
        writeln!(out, "(no locks)")?;
    }
    Ok(())
}

/// `850ms`, `12.3s`, `4m05s`, `2h13m`: short enough for a table.
fn short(duration: Duration) -> String {
    let ms = duration.as_millis();
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}
