//! The `#[distributed_lock]` attribute, re-exported as `redlock_runtime::distributed_lock`.
//!
//! Use it through `redlock-runtime`: the code it generates calls that crate.
//!
//! Layout: `args` parses the attribute's arguments, `key` the key template, `item` the
//! function's signature; `expand` checks them together and generates the code.

mod args;
mod errors;
mod expand;
mod item;
mod key;

use proc_macro::TokenStream;

/// Runs an `async fn` while holding a distributed lock on Redis.
///
/// ```no_run
/// use redlock_runtime::distributed_lock;
/// # use redlock_runtime::LockError;
/// # pub struct Receipt;
/// # pub enum PayError { Lock(LockError) }
/// # impl From<LockError> for PayError { fn from(e: LockError) -> Self { PayError::Lock(e) } }
///
/// #[distributed_lock(key = "order:<id>", wait = "3s", lease = "10s")]
/// async fn pay_order(id: u64, amount: u64) -> Result<Receipt, PayError> {
///     // Only one caller at a time, in any process, gets here for a given `id`.
/// #   let _ = amount;
/// #   Ok(Receipt)
/// }
/// ```
///
/// Each call builds the key from its arguments, acquires the lock (waiting up to
/// `wait`), runs the body, and releases the lock on every way out: return, `?`, panic,
/// or the future being dropped. A failure to lock is returned as the function's error,
/// so the error type must implement `From<redlock_runtime::LockError>`.
///
/// # Arguments
///
/// | Argument | Value | Default | Meaning |
/// |---|---|---|---|
/// | `key` | string template, **required** | — | The lock's Redis key. `<name>` is replaced by the parameter `name` (`self` included), `<name.field.0>` by a field of one, each formatted with `Display`. `<<` and `>>` write a literal `<` and `>`; everything else is literal, so `"order:{<id>}"` keeps `{…}` as a Redis Cluster hash tag. Not a `format!` string: `{id}` naming a parameter is a compile error (it would be the literal text `{id}`, one key for every call) that shows both fixes, `<id>` and `{<id>}`; a `{…}` naming no parameter is a literal hash tag. |
/// | `keys` | array of string templates | — | Instead of `key`: several keys locked as one, e.g. `keys = ["account:<from>", "account:<to>"]` for a transfer. Each template is written and checked as `key`'s. The call holds every key or none: the lock is exclusive (not with `mode` or `permits`), and every other argument means what it does for one key (`on_busy = "skip"` skips when any key is held elsewhere). See [Several keys](#several-keys). |
/// | `wait` | duration string | `"0s"` | How long to wait for the lock; `"0s"` makes one attempt. On timeout the body does not run and the function returns the `LockError` (`is_busy()`), or `Ok(None)` with `on_busy = "skip"`. Whole milliseconds. |
/// | `lease` | duration string | watchdog | How long the lock lives in Redis without renewal. Omitted: the runtime's watchdog renews the lock while the body runs. At least 1 ms, whole milliseconds (Redis's resolution). |
/// | `hold_at_least` | duration string | none | Keeps the lock at least this long even if the body finishes sooner (e.g. to rate-limit a job). Must not exceed `lease` when both are given. |
/// | `client` | expression | default client | The `LockClient` to use: a `LockClient`, a reference to one (`&LockClient`, `&&LockClient`), or an `Arc`/`Box` of one (`&Arc<LockClient>` too), e.g. `client = self.locks`, or a static set at startup — `static LOCKS: OnceLock<LockClient>` with `client = LOCKS.get().expect("connected at startup")` (every constructor is `async`, so a `LazyLock` cannot build one). Omitted: the client set with `redlock_runtime::set_default_client`, or else one connected once to `REDLOCK_URL` (default `redis://127.0.0.1:6379/`). |
/// | `on_busy` | `"error"` or `"skip"` | `"error"` | When another holds the lock for the whole `wait`: `"error"` returns `LockError::Timeout`; `"skip"` returns `Ok(None)` without running the body, for functions returning `Result<Option<T>, E>` — a scheduled job that another instance runs (as ShedLock skips). Redis being unavailable is an error either way (`is_unavailable()`). |
/// | `on_lost` | `"abort"` or `"continue"` | `"abort"` | What happens when the lock is lost while the body runs (lease expired, key deleted): `"abort"` stops the body at its next `.await` and returns the `LockError`; `"continue"` lets it finish. A body that ran to its end always returns its own result (see below). |
/// | `mode` | `"read"` or `"write"` | `"write"` | `"read"`: a shared read lock — any number of readers of the key at once, none while a writer holds it (a plain lock without `mode` counts as a writer); writer-preferring, so a waiting writer is not starved by new readers. `"write"`: the exclusive lock, the same lock as giving no `mode` (and as `LockClient::write_lock`). Not with `permits`. |
/// | `permits` | integer literal, 1 to 1_000_000 | none | A semaphore: at most N callers hold the key at once, across processes; each holder has its own lease (or watchdog), so a holder that dies returns its permit at its lease end. Every use of the key must give the same N (another count is a `LockError` naming both). Not with `mode`. |
///
/// ```no_run
/// # use redlock_runtime::{distributed_lock, LockError};
/// # pub struct Doc;
/// // Many readers at once; `save_doc` (a writer) waits for them and excludes them.
/// #[distributed_lock(key = "doc:<id>", mode = "read")]
/// async fn load_doc(id: u64) -> Result<Doc, LockError> {
/// #   let _ = id;
/// #   Ok(Doc)
/// }
///
/// #[distributed_lock(key = "doc:<id>", mode = "write", wait = "5s")]
/// async fn save_doc(id: u64, doc: Doc) -> Result<(), LockError> {
/// #   let _ = (id, doc);
/// #   Ok(())
/// }
///
/// // At most 5 calls to a tenant's partner API at once, across every process; a sixth
/// // caller waits up to 30 s for a permit.
/// #[distributed_lock(key = "partner:<tenant>", permits = 5, wait = "30s")]
/// async fn call_partner(tenant: &str) -> Result<(), LockError> {
/// #   let _ = tenant;
///     Ok(())
/// }
/// ```
///
/// Durations use [humantime]'s grammar: `"250ms"`, `"3s"`, `"1m30s"`, `"2h"`. They are
/// parsed at compile time, so a typo is a compile error.
///
/// Inside the body, `redlock_runtime::current_lock()` returns the key and the fencing
/// token of the lock being held (a read share or a permit has its own token). A nested
/// call that locks the same key in the same task runs directly instead of deadlocking:
/// a `mode = "read"` call inside a write (or plain) lock of the key re-enters the write
/// lock. A write requested while the task holds only a *read* lock of the key cannot be
/// granted without deadlocking on itself: it fails at once with a `LockError`, without
/// waiting. The nested call's own `on_lost` applies to the lock it re-enters: with
/// `"abort"` (the default) it returns `LockError::Lost` without running its body when
/// that lock is already lost (an enclosing `on_lost = "continue"` call outlived its
/// lease), and stops its body when the lock is lost while it runs.
///
/// # Several keys
///
/// `keys = [...]` locks several keys as one: the body runs only while the call holds
/// every one of them, as a transfer between two accounts must.
///
/// ```no_run
/// use redlock_runtime::{current_lock, current_locks, distributed_lock};
/// # use redlock_runtime::LockError;
///
/// #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "3s", lease = "10s")]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
///     // One lock per key, in canonical order: the keys sorted, each once.
///     for lock in current_locks() {
///         // Pass `lock.fencing_token()` with the writes to `lock.key()`'s account.
/// #       let _ = (lock.key(), lock.fencing_token());
///     }
///     // The first of them.
///     let _first = current_lock();
/// #   let _ = amount;
///     Ok(())
/// }
/// ```
///
/// - The keys are built from the arguments, then deduplicated and sorted, and taken in
///   that order, so `transfer(a, b)` and `transfer(b, a)` running at once do not
///   deadlock. A key that comes out twice at run time (`transfer(a, a)`) is locked once.
/// - `wait` covers taking all of them. When one stays held elsewhere for the whole `wait`,
///   the keys already taken are released and the call returns `LockError::Timeout`
///   naming that key, or `Ok(None)` with `on_busy = "skip"`: no key stays locked by a
///   call whose body did not run.
/// - `lease`, the watchdog, `hold_at_least` and `on_lost` apply to each key: losing any
///   one of them is losing the lock.
/// - `redlock_runtime::current_locks()` returns every lock of the innermost annotated
///   call, in the canonical order, each with its key and its own fencing token;
///   `current_lock()` returns the first of them.
/// - Refused at compile time, each with the fix: `keys = []`, `key` and `keys` together,
///   `mode` or `permits` with `keys` (a lock of several keys is exclusive), a value that
///   is not an array of string literals, and the same template written twice
///   (`["account:<from>", "account:<from>"]` is most likely a copy whose placeholder was
///   meant to change). A wrong placeholder is reported on its own template.
/// - A key that an enclosing annotated call of the same task holds with the same
///   client is re-entered, not taken again; the others are taken as above.
/// - The metrics' `lock` label of every key is the templates joined with `", "`
///   (`"account:<from>, account:<to>"`).
///
/// The attribute works on free functions, methods (`&self`, `&mut self`,
/// `self: Arc<Self>`), generic functions, `impl Trait` parameters and `async fn` in
/// traits and trait impls. The signature is kept as written; the returned future is
/// `Send` whenever the body's future is.
///
/// [humantime]: https://docs.rs/humantime
///
/// # Equivalent code without the macro
///
/// The example above does what this code does with the runtime's builder API:
///
/// ```no_run
/// # use redlock_runtime::{LockClient, LockError};
/// # use std::time::Duration;
/// # pub struct Receipt;
/// # pub enum PayError { Lock(LockError) }
/// # impl From<LockError> for PayError { fn from(e: LockError) -> Self { PayError::Lock(e) } }
/// async fn pay_order(id: u64, amount: u64) -> Result<Receipt, PayError> {
///     // The `client = ...` argument, or else the default client.
///     let client: LockClient = redlock_runtime::default_client().await?;
///     let guard = client
///         .lock(format!("order:{}", id))
///         .wait(Duration::from_secs(3))
///         .lease(Duration::from_secs(10))
///         .acquire()
///         .await?;
///     // The fencing token to pass along with the writes the lock protects
///     // (`redlock_runtime::current_lock()` returns it inside the macro's body).
///     let _token = guard.fencing_token();
///     let body = async move {
///         // The function's body.
/// #       let _ = amount;
/// #       Ok(Receipt)
///     };
///     let result = tokio::select! {
///         result = body => result,
///         // on_lost = "abort": stop the body when the lock is lost.
///         () = guard.lost() => return Err(LockError::Lost { key: guard.key().to_owned() }.into()),
///     };
///     // The body ran to its end: its result stands, even if the release finds the
///     // lock gone (that is logged as a warning).
///     let _ = guard.release().await;
///     result
/// }
/// ```
///
/// **A body that completed keeps its result**, with either `on_lost`: when the release
/// then finds the lock gone (its lease ran out, the key was deleted or taken), the
/// function still returns what the body returned, and the loss is logged as a `tracing`
/// warning with the key and the fencing token. Returning `Lost` instead would hide
/// whether the work (a charge, a draw) was done, and invite a retry that does it twice.
/// Inside the body, `current_lock().map(|lock| lock.is_lost())` tells whether the lock
/// may be gone already; writes rely on the fencing token then. Only a body *stopped* by
/// `on_lost = "abort"` returns `Err(LockError::Lost)`.
///
/// Reentrancy: the generated code skips locking when the same task already holds the
/// key *with the same client* through an enclosing `#[distributed_lock]` call. A nested
/// call through another `LockClient` is a different owner and waits like any other.
///
/// With `mode = "read"` the builder is `client.read_lock(key)`, with `permits = N`
/// `client.semaphore(key, N)`; `mode = "write"` is `client.lock(key)` as above (the
/// same lock as `client.write_lock(key)`). With `hold_at_least = "…"` the builder also
/// gets `.hold_at_least(d)`; with `on_lost = "continue"` the body is simply awaited
/// without watching `guard.lost()`; with `on_busy = "skip"` the acquire's
/// `Err(e) if e.is_busy()` becomes `return Ok(None)` before the body.
///
/// # With `#[tracing::instrument]`
///
/// Attributes expand from the top down: the upper one rewrites the function first, and
/// the lower one then wraps what it produced. So the attribute written *below* is the
/// *outer* one at run time, and the order decides what the span covers:
///
/// - **`#[tracing::instrument]` below `#[distributed_lock]`**: the span covers waiting
///   for and acquiring the lock as well as the body, and `err` logs a failure to lock
///   at ERROR inside the span (``ERROR pay_order{id=42}: error=lock `order:42` not
///   acquired: …``). Use it to see lock waits and lock failures in your traces. For a
///   scheduled job add `on_busy = "skip"`, so that finding the lock taken is `Ok(None)`,
///   not an ERROR line from every other instance.
/// - **`#[tracing::instrument]` above `#[distributed_lock]`**: the span starts only once
///   the lock is held and covers the body alone; a failure to lock never reaches it (no
///   span is created, `err` logs nothing). Use it to time the protected work alone, when
///   the caller reports lock failures itself.
///
/// ```no_run
/// # use redlock_runtime::{distributed_lock, LockError};
/// // Below: the span covers the acquisition; `err` logs lock errors (and body errors).
/// #[distributed_lock(key = "order:<id>", wait = "3s")]
/// #[tracing::instrument(err)]
/// async fn pay_order(id: u64) -> Result<(), LockError> {
/// #   let _ = id;
///     Ok(())
/// }
///
/// // Below, for a scheduled job: a busy lock is a quiet skip (`Ok(None)`), while
/// // Redis being down is still logged at ERROR.
/// #[distributed_lock(key = "report:<day>", on_busy = "skip")]
/// #[tracing::instrument(err)]
/// async fn nightly_report(day: u32) -> Result<Option<()>, LockError> {
/// #   let _ = day;
///     Ok(Some(()))
/// }
///
/// // Above: the span starts inside the lock and times the body only; a failure to
/// // lock is returned to the caller without any span or log line from here.
/// #[tracing::instrument(err)]
/// #[distributed_lock(key = "invoice:<id>", wait = "3s")]
/// async fn render_invoice(id: u64) -> Result<(), LockError> {
/// #   let _ = id;
///     Ok(())
/// }
/// ```
///
/// # Compile-time checks
///
/// Errors point at the offending token: a missing `key`, unknown or duplicate
/// arguments, the mistakes of `keys` listed under [Several keys](#several-keys), a placeholder that names no parameter (the message lists the parameters),
/// `<>`, an unclosed `<`, invalid or zero durations, `hold_at_least` longer than
/// `lease`, an `on_lost` other than `"abort"`/`"continue"`, a `mode` other than
/// `"read"`/`"write"`, a `permits` that is not an integer literal from 1 to 1_000_000,
/// `mode` and `permits` together, a fn that is not `async`, and a key given without
/// `key =`. The type system decides the rest, with messages that say what to change: a
/// return type that is not a `Result` (any alias of one is fine:
/// `AppResult<T>`, `io::Result<T>`, `anyhow::Result<T>`), an error type without
/// `From<LockError>` (named, with the `impl` to add), a `client` that is not a
/// `LockClient` (with how to make one), and `on_busy = "skip"` without
/// `Result<Option<T>, E>`. The body is checked against the declared return type as
/// in a function without the attribute: `Ok("x")` or `return id;` in a function
/// returning `Result<u64, E>` is rustc's own mismatch on that expression.
///
/// A placeholder that formats to an empty string is not refused: `"user:<name>"` with
/// `name == ""` locks the key `user:`, shared by every empty name.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
