//! The `#[distributed_lock]` attribute, re-exported as `redlock_runtime::distributed_lock`.
//!
//! Use it through `redlock-runtime`: the code it generates calls that crate.
//!
//! Layout: [`args`] parses the attribute's arguments, [`key`] the key template, [`item`]
//! the function's signature; [`expand`] checks them together and generates the code.

mod args;
mod errors;
mod expand;
mod item;
mod key;

use proc_macro::TokenStream;

/// Runs an `async fn` while holding a distributed lock on Redis.
///
/// ```rust,ignore
/// use redlock_runtime::distributed_lock;
///
/// #[distributed_lock(key = "order:<id>", wait = "3s", lease = "10s")]
/// async fn pay_order(id: u64, amount: u64) -> Result<Receipt, PayError> {
///     // Only one process at a time gets here for a given `id`.
/// #   todo!()
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
/// | `key` | string template, **required** | — | The lock's Redis key. `<name>` is replaced by the parameter `name` (`self` included), `<name.field.0>` by a field of one, each formatted with `Display`. `<<` and `>>` write a literal `<` and `>`; everything else is literal, so `"order:{<id>}"` keeps `{…}` as a Redis Cluster hash tag. |
/// | `wait` | duration string | `"0s"` | How long to wait for the lock; `"0s"` makes one attempt. On timeout the body does not run and the function returns the `LockError`. |
/// | `lease` | duration string | watchdog | How long the lock lives in Redis without renewal. Omitted: the runtime's watchdog renews the lock while the body runs. Must be longer than zero. |
/// | `hold_at_least` | duration string | none | Keeps the lock at least this long even if the body finishes sooner (e.g. to rate-limit a job). Must not exceed `lease` when both are given. |
/// | `client` | expression | default client | The `LockClient` to use: a `LockClient`, `&LockClient` or `Arc<LockClient>`, e.g. `client = self.locks` or `client = &*LOCKS`. Omitted: the client set with `redlock_runtime::set_default_client`. |
/// | `on_lost` | `"abort"` or `"continue"` | `"abort"` | What happens when the lock is lost while the body runs (lease expired, key deleted): `"abort"` stops the body at its next `.await` and returns the `LockError`; `"continue"` lets it finish. |
///
/// Durations use [humantime]'s grammar: `"250ms"`, `"3s"`, `"1m30s"`, `"2h"`. They are
/// parsed at compile time, so a typo is a compile error.
///
/// Inside the body, `redlock_runtime::current_lock()` returns the key and the fencing
/// token of the lock being held. A nested call that locks the same key in the same task
/// runs directly instead of deadlocking.
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
/// The example above expands to roughly this (the generated code also propagates
/// losing the lock into the body and supports reentrancy):
///
/// ```rust,ignore
/// async fn pay_order(id: u64, amount: u64) -> Result<Receipt, PayError> {
///     let client = redlock_runtime::default_client();
///     let guard = client
///         .lock(format!("order:{}", id))
///         .wait(Duration::from_secs(3))
///         .lease(Duration::from_secs(10))
///         .acquire()
///         .await?;
///     // `guard.fencing_token()` is available to pass to storage that checks it.
///     let result = tokio::select! {
///         result = async move { /* the body */ } => result,
///         lost = guard.lost() => return Err(lost.into()),
///     };
///     guard.release().await?;
///     result
/// }
/// ```
///
/// With `hold_at_least = "…"` the builder also gets `.hold_at_least(d)`; with
/// `on_lost = "continue"` the body is simply awaited without watching `guard.lost()`.
///
/// # Compile-time checks
///
/// Errors point at the offending token: a missing `key`, unknown or duplicate
/// arguments, a placeholder that names no parameter (the message lists the parameters),
/// `<>`, an unclosed `<`, invalid or zero durations, `hold_at_least` longer than
/// `lease`, an `on_lost` other than `"abort"`/`"continue"`, a fn that is not `async`, and
/// a return type that is not a `Result` (any path ending in `Result`, such as
/// `io::Result<T>` or `anyhow::Result<T>`, is accepted).
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
