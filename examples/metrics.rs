//! The locks' metrics, exported to Prometheus (feature `metrics` of redlock-runtime).
//!
//! ```text
//! cargo run --example metrics
//! ```
//!
//! Installs `metrics-exporter-prometheus` as the process's recorder, listening on
//! 127.0.0.1 (a free port), takes a few locks against a throwaway `redis-server` (or
//! `REDLOCK_URL`), then scrapes its own `/metrics` endpoint over HTTP and prints what
//! Prometheus would read:
//! - `ship` under `#[distributed_lock(key = "order:<id>")]` for three orders: one
//!   `lock="order:<id>"` series for all of them (the key's template, never an id);
//! - two tasks of one client taking turns at `report`: the second waits
//!   (`redlock_waiting`) and gets the lock handed off (`redlock_handoffs_total`);
//! - `export` held in watchdog mode while the watchdog renews it, and another client
//!   giving up on it (`outcome="timeout"`);
//! - `invoice` force-unlocked by an operator while held (`cause="forced"`).

use std::process::ExitCode;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use redlock_runtime::{LockClient, LockError, distributed_lock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Histogram buckets for the `_seconds` metrics: from a round trip on loopback to a
/// long hold.
const BUCKETS: &[f64] = &[0.001, 0.01, 0.1, 1.0, 10.0];

#[distributed_lock(key = "order:<id>", wait = "5s", lease = "10s", client = locks)]
async fn ship(id: u64, locks: &LockClient) -> Result<u64, LockError> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(id)
}

/// Takes the locks whose metrics the scrape shows.
async fn take_a_few_locks(url: &str) -> Result<(), LockError> {
    let locks = LockClient::builder(url)
        .watchdog_lease(Duration::from_secs(2))
        .renew_every(Duration::from_millis(100))
        .connect()
        .await?;
    let other = LockClient::connect(url).await?;

    for id in 1..=3 {
        ship(id, &locks).await?;
    }

    // Two tasks of one client: the second waits in line, and the first's release
    // hands the lock to it.
    let first = locks.lock("report").label("report").acquire().await?;
    let second = tokio::spawn({
        let locks = locks.clone();
        async move {
            let guard = locks
                .lock("report")
                .label("report")
                .wait(Duration::from_secs(5))
                .acquire()
                .await?;
            guard.release().await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await?;
    second.await.expect("the second task")?;

    // Watchdog mode: renewed every 100 ms while held; another client gives up on it.
    let export = locks
        .lock("export:2026-05")
        .label("export")
        .acquire()
        .await?;
    let gave_up = other
        .lock("export:2026-05")
        .label("export")
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(gave_up.is_err_and(|error| error.is_timeout()));
    tokio::time::sleep(Duration::from_millis(350)).await;
    export.release().await?;

    // An operator frees a held lock: its holder finds out at its release.
    let invoice = locks
        .lock("invoice:7")
        .label("invoice")
        .lease(Duration::from_secs(30))
        .acquire()
        .await?;
    other.force_unlock("invoice:7").await?;
    assert!(invoice.release().await.is_err_and(|error| error.is_lost()));
    Ok(())
}

/// `GET /metrics` on the exporter, as Prometheus does.
async fn scrape(port: u16) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!(
            "the exporter answered {head}"
        )));
    }
    Ok(body.to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    let (_server, url) = redlock_testkit::redlock_url_or_throwaway_server();
    let port = redlock_testkit::free_port();
    let installed = PrometheusBuilder::new()
        .with_http_listener(([127, 0, 0, 1], port))
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .and_then(PrometheusBuilder::install);
    if let Err(error) = installed {
        eprintln!("metrics: cannot start the Prometheus exporter: {error}");
        return ExitCode::FAILURE;
    }
    if let Err(error) = take_a_few_locks(&url).await {
        eprintln!("metrics: {error}");
        return ExitCode::FAILURE;
    }
    match scrape(port).await {
        Ok(body) => {
            println!("GET http://127.0.0.1:{port}/metrics\n");
            print!("{body}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("metrics: scraping the exporter failed: {error}");
            ExitCode::FAILURE
        }
    }
}
