//! `#[distributed_lock]` with `#[tracing::instrument(err)]`, against a real redis-server:
//! attributes expand from the top down, so the order decides what the span covers.
//!
//! - `#[distributed_lock]` above `#[tracing::instrument(err)]`: the span covers the
//!   acquisition, and `err` logs a lock error at ERROR inside it.
//! - `#[tracing::instrument(err)]` above `#[distributed_lock]`: the span starts inside the
//!   lock, around the body only; a lock error is never logged (the span is not even
//!   created).
//!
//! The lock is made busy by another client holding it; `wait = "0s"` makes the annotated
//! call fail at once with `LockError::Timeout`. Each test captures its own thread's events
//! (`set_default` on a current-thread runtime), so the tests do not see each other's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_runtime::{LockClient, LockError, distributed_lock};
use redlock_testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// `instrument` written below the lock: its span is entered before the acquisition.
#[distributed_lock(key = "below:<id>", client = locks, wait = "0s", lease = "10s")]
#[tracing::instrument(err, skip(locks))]
async fn instrument_below(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    tracing::info!("body");
    Ok(id)
}

/// `instrument` written above the lock: its span is entered once the lock is held.
#[tracing::instrument(err, skip(locks))]
#[distributed_lock(key = "above:<id>", client = locks, wait = "0s", lease = "10s")]
async fn instrument_above(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    tracing::info!("body");
    Ok(id)
}

/// The scheduled-job shape the docs recommend: the span covers the acquisition, and a
/// busy lock is a skipped run (`Ok(None)`), not an error.
#[distributed_lock(key = "job:<id>", client = locks, wait = "0s", lease = "10s", on_busy = "skip")]
#[tracing::instrument(err, skip(locks))]
async fn skipping_job(locks: &LockClient, id: u64) -> Result<Option<u64>, LockError> {
    tracing::info!("body");
    Ok(Some(id))
}

#[derive(Debug)]
enum Record {
    NewSpan(String),
    Event {
        level: Level,
        /// The names of the spans around the event, outermost first.
        spans: Vec<String>,
        fields: String,
    },
}

/// Every span created and every event, in order.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<Record>>>);

impl Captured {
    fn take(&self) -> Vec<Record> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

struct FieldText(String);

impl Visit for FieldText {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let name = attrs.metadata().name().to_owned();
        self.0.lock().unwrap().push(Record::NewSpan(name));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|span| span.name().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        let mut fields = FieldText(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(Record::Event {
            level: *event.metadata().level(),
            spans,
            fields: fields.0,
        });
    }
}

fn errors(records: &[Record]) -> Vec<&Record> {
    records
        .iter()
        .filter(|record| matches!(record, Record::Event { level, .. } if *level == Level::ERROR))
        .collect()
}

fn created(records: &[Record], name: &str) -> bool {
    records
        .iter()
        .any(|record| matches!(record, Record::NewSpan(span) if span == name))
}

/// An event inside the span `span` whose fields contain `text`.
fn event_in(records: &[Record], span: &str, level: Level, text: &str) -> bool {
    records.iter().any(|record| {
        matches!(record, Record::Event { level: l, spans, fields }
            if *l == level && spans.iter().any(|s| s == span) && fields.contains(text))
    })
}

async fn hold(other: &LockClient, key: &str) -> redlock_runtime::LockGuard {
    other
        .lock(key)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the other client takes the lock")
}

#[tokio::test]
async fn instrument_below_the_lock_covers_the_acquisition_and_logs_lock_errors() {
    let captured = Captured::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();

    // Busy: the call fails with Timeout, and `err` logs it at ERROR inside the span.
    let held = hold(&other, "below:1").await;
    captured.take();
    let error = instrument_below(&locks, 1).await.unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    let records = captured.take();
    assert!(created(&records, "instrument_below"), "{records:#?}");
    assert!(
        event_in(&records, "instrument_below", Level::ERROR, "error=")
            && event_in(&records, "instrument_below", Level::ERROR, "below:1"),
        "the lock error was not logged at ERROR in the span: {records:#?}"
    );
    assert_eq!(errors(&records).len(), 1, "{records:#?}");
    held.release().await.unwrap();

    // Free: the body runs inside the same span, and nothing is logged at ERROR.
    assert_eq!(instrument_below(&locks, 1).await.unwrap(), 1);
    let records = captured.take();
    assert!(
        event_in(&records, "instrument_below", Level::INFO, "body"),
        "{records:#?}"
    );
    assert!(errors(&records).is_empty(), "{records:#?}");
}

#[tokio::test]
async fn instrument_above_the_lock_starts_inside_it_and_never_sees_lock_errors() {
    let captured = Captured::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();

    // Busy: the same Timeout, but no ERROR is logged, and the span is never created:
    // it would have started only once the lock was held.
    let held = hold(&other, "above:1").await;
    captured.take();
    let error = instrument_above(&locks, 1).await.unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    let records = captured.take();
    assert!(
        errors(&records).is_empty(),
        "a lock error was logged: {records:#?}"
    );
    assert!(!created(&records, "instrument_above"), "{records:#?}");
    held.release().await.unwrap();

    // Free: the span exists, around the body.
    assert_eq!(instrument_above(&locks, 1).await.unwrap(), 1);
    let records = captured.take();
    assert!(created(&records, "instrument_above"), "{records:#?}");
    assert!(
        event_in(&records, "instrument_above", Level::INFO, "body"),
        "{records:#?}"
    );
    assert!(errors(&records).is_empty(), "{records:#?}");
}

#[tokio::test]
async fn a_skipped_run_below_the_lock_logs_no_error() {
    let captured = Captured::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();

    let held = hold(&other, "job:1").await;
    captured.take();
    assert_eq!(skipping_job(&locks, 1).await.unwrap(), None);
    let records = captured.take();
    assert!(created(&records, "skipping_job"), "{records:#?}");
    assert!(
        errors(&records).is_empty(),
        "a skipped run logged an error: {records:#?}"
    );
    assert!(
        !event_in(&records, "skipping_job", Level::INFO, "body"),
        "{records:#?}"
    );
    held.release().await.unwrap();
}
