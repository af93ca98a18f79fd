//! The attribute's arguments: `key = "order:<id>", wait = "3s", lease = "10s", ...`.
//!
//! Parsed with [`syn::meta::parser`]. Errors in values (a bad duration, an unknown
//! argument, a duplicate) are collected in [`Errors`] so the user sees all of them at
//! once; only a syntax error (say, a missing `=`) stops the parse.

use std::time::Duration;

use proc_macro2::Span;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, UnOp};

use crate::errors::Errors;

/// Every argument the attribute accepts, in the order the docs list them.
pub(crate) const ARGUMENTS: &[&str] = &[
    "key",
    "keys",
    "wait",
    "lease",
    "hold_at_least",
    "client",
    "on_lost",
    "on_busy",
    "mode",
    "permits",
];

/// The largest `permits = N` accepted: far above any real cap on concurrent callers,
/// so a larger number is a typo (or a semaphore that limits nothing).
pub(crate) const MAX_PERMITS: u32 = 1_000_000;

/// Which lock of the key the function takes: `mode = "read"` / `"write"`, `permits = N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// No `mode`, or `mode = "write"`: the exclusive lock.
    Exclusive,
    /// `mode = "read"`: shared with other readers, excludes writers.
    Read,
    /// `permits = N`: one of N permits of a semaphore.
    Permits(u32),
}

/// The parsed, validated arguments.
pub(crate) struct Args {
    /// The key template literal, not yet parsed (see [`crate::key`]).
    pub key: Option<LitStr>,
    /// `keys = ["account:<from>", "account:<to>"]`: the templates of a lock of several
    /// keys at once, each a literal not yet parsed. Without errors: never empty, no two
    /// alike, and only with [`Mode::Exclusive`].
    pub keys: Option<Vec<LitStr>>,
    pub wait: Option<WithSpan<Duration>>,
    pub lease: Option<WithSpan<Duration>>,
    pub hold_at_least: Option<WithSpan<Duration>>,
    pub client: Option<Expr>,
    pub abort_on_lost: bool,
    /// `on_busy = "skip"`, with the literal's span.
    pub skip_if_busy: Option<Span>,
    pub mode: Mode,
}

/// A value with the span of the literal it came from.
pub(crate) struct WithSpan<T> {
    pub value: T,
    pub span: Span,
}

/// One argument that may be given at most once.
struct Slot<T> {
    name: &'static str,
    value: Option<T>,
    /// Given at least once, even with a value that was rejected.
    given: bool,
    /// The name's span where it was first given.
    span: Option<Span>,
}

impl<T> Slot<T> {
    const fn new(name: &'static str) -> Self {
        Slot {
            name,
            value: None,
            given: false,
            span: None,
        }
    }

    /// Records that the argument appears (before its value is checked); reports a
    /// duplicate on the second occurrence's name.
    fn given(&mut self, errors: &mut Errors, name: &Ident) {
        if self.given {
            errors.push(syn::Error::new(
                name.span(),
                format_args!(
                    "duplicate `{}` argument: give it once (remove this one or the earlier one)",
                    self.name
                ),
            ));
        }
        self.given = true;
        self.span.get_or_insert(name.span());
    }

    /// Stores the first valid value.
    fn set(&mut self, value: T) {
        if self.value.is_none() {
            self.value = Some(value);
        }
    }

    fn get(self) -> Option<T> {
        self.value
    }

    fn is_given(&self) -> bool {
        self.given
    }

    /// Where the argument was first given, if it was.
    fn name_span(&self) -> Option<Span> {
        self.span
    }
}

/// The accumulating parser fed to [`syn::meta::parser`].
pub(crate) struct ArgsParser<'e> {
    errors: &'e mut Errors,
    key: Slot<LitStr>,
    keys: Slot<Vec<LitStr>>,
    wait: Slot<WithSpan<Duration>>,
    lease: Slot<WithSpan<Duration>>,
    hold_at_least: Slot<WithSpan<Duration>>,
    client: Slot<Expr>,
    on_lost: Slot<WithSpan<bool>>,
    on_busy: Slot<WithSpan<bool>>,
    /// `mode = "read"` or `"write"`.
    mode: Slot<Mode>,
    permits: Slot<u32>,
}

impl<'e> ArgsParser<'e> {
    pub(crate) fn new(errors: &'e mut Errors) -> Self {
        ArgsParser {
            errors,
            key: Slot::new("key"),
            keys: Slot::new("keys"),
            wait: Slot::new("wait"),
            lease: Slot::new("lease"),
            hold_at_least: Slot::new("hold_at_least"),
            client: Slot::new("client"),
            on_lost: Slot::new("on_lost"),
            on_busy: Slot::new("on_busy"),
            mode: Slot::new("mode"),
            permits: Slot::new("permits"),
        }
    }

    /// A key given without its name (already reported).
    pub(crate) fn set_key(&mut self, key: LitStr) {
        self.key.given = true;
        self.key.set(key);
    }

    /// Parses one `name = value` pair.
    pub(crate) fn parse(&mut self, meta: ParseNestedMeta) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().cloned() else {
            let err = syn::Error::new(
                meta.path.span(),
                format_args!("unknown argument: expected one of {}", list(ARGUMENTS)),
            );
            skip_value(&meta)?;
            self.errors.push(err);
            return Ok(());
        };
        let arg = name.to_string();
        if !ARGUMENTS.contains(&arg.as_str()) {
            self.errors.push(syn::Error::new(
                name.span(),
                format_args!(
                    "unknown argument `{arg}`{}: expected one of {}",
                    mode_hint(&arg).unwrap_or_else(|| did_you_mean(&arg, ARGUMENTS)),
                    list(ARGUMENTS)
                ),
            ));
            return skip_value(&meta);
        }
        if !meta.input.peek(syn::Token![=]) {
            return Err(meta.error(format_args!(
                "expected `{arg} = ...`, e.g. {}",
                example(&arg)
            )));
        }
        let value: Expr = meta.value()?.parse()?;
        match arg.as_str() {
            "key" => {
                self.key_conflict(&name, self.key.is_given(), self.keys.is_given());
                self.key.given(self.errors, &name);
            }
            "keys" => {
                self.key_conflict(&name, self.keys.is_given(), self.key.is_given());
                self.keys.given(self.errors, &name);
            }
            "wait" => self.wait.given(self.errors, &name),
            "lease" => self.lease.given(self.errors, &name),
            "hold_at_least" => self.hold_at_least.given(self.errors, &name),
            "client" => self.client.given(self.errors, &name),
            "on_lost" => self.on_lost.given(self.errors, &name),
            "on_busy" => self.on_busy.given(self.errors, &name),
            "mode" => {
                self.conflict(&name, self.mode.is_given(), self.permits.is_given());
                self.mode.given(self.errors, &name);
            }
            "permits" => {
                self.conflict(&name, self.permits.is_given(), self.mode.is_given());
                self.permits.given(self.errors, &name);
            }
            _ => unreachable!("every name in ARGUMENTS is handled"),
        }
        if arg == "client" {
            self.client.set(value);
            return Ok(());
        }
        if arg == "keys" {
            if let Some(keys) = key_templates(&value, self.errors) {
                self.keys.set(keys);
            }
            return Ok(());
        }
        if arg == "permits" {
            match permits(&value) {
                Ok(permits) => self.permits.set(permits),
                Err(err) => self.errors.push(err),
            }
            return Ok(());
        }
        let Some(lit) = string_literal(&value) else {
            self.errors.push(syn::Error::new_spanned(
                &value,
                format_args!("`{arg}` takes a string literal, e.g. {}", example(&arg)),
            ));
            return Ok(());
        };
        match arg.as_str() {
            "key" => self.key.set(lit),
            "wait" => {
                if let Some(d) = self.duration(&arg, &lit) {
                    self.wait.set(d);
                }
            }
            "lease" => {
                if let Some(d) = self.duration(&arg, &lit) {
                    if d.value.is_zero() {
                        self.errors.push(syn::Error::new(
                            lit.span(),
                            "`lease` must be longer than zero: give a lease such as \"10s\", \
                             or omit `lease` to let the watchdog renew the lock while the body runs",
                        ));
                    } else {
                        self.lease.set(d);
                    }
                }
            }
            "hold_at_least" => {
                if let Some(d) = self.duration(&arg, &lit) {
                    self.hold_at_least.set(d);
                }
            }
            "on_lost" => match lit.value().as_str() {
                "abort" => self.on_lost.set(spanned(true, &lit)),
                "continue" => self.on_lost.set(spanned(false, &lit)),
                other => self.errors.push(syn::Error::new(
                    lit.span(),
                    format_args!(
                        "unknown `on_lost` value {other:?}: expected \"abort\" (stop the body when \
                         the lock is lost, the default) or \"continue\" (let it finish)"
                    ),
                )),
            },
            "on_busy" => match lit.value().as_str() {
                "skip" => self.on_busy.set(spanned(true, &lit)),
                "error" => self.on_busy.set(spanned(false, &lit)),
                other => self.errors.push(syn::Error::new(
                    lit.span(),
                    format_args!(
                        "unknown `on_busy` value {other:?}: expected \"skip\" (return `Ok(None)` \
                         without running the body when another holds the lock) or \"error\" \
                         (return `LockError::Timeout`, the default)"
                    ),
                )),
            },
            "mode" => match lit.value().as_str() {
                "read" => self.mode.set(Mode::Read),
                "write" => self.mode.set(Mode::Exclusive),
                other => self.errors.push(syn::Error::new(
                    lit.span(),
                    format_args!(
                        "unknown `mode` value {other:?}: expected \"read\" (shared with other \
                         readers, excludes writers) or \"write\" (exclusive, the default); for a \
                         semaphore that lets N callers in at once, write `permits = N` instead \
                         of `mode`"
                    ),
                )),
            },
            _ => unreachable!("every name in ARGUMENTS is handled"),
        }
        Ok(())
    }

    /// `mode` and `permits` together, reported on the later one (`name`) once: when it
    /// appears for the first time (`again` false) after the other (`other` true).
    fn conflict(&mut self, name: &Ident, again: bool, other: bool) {
        if again || !other {
            return;
        }
        let (this, earlier) = if name == "mode" {
            ("mode", "permits")
        } else {
            ("permits", "mode")
        };
        self.errors.push(syn::Error::new(
            name.span(),
            format_args!(
                "`{this}` cannot be combined with `{earlier}`: a semaphore (`permits = N`) has \
                 no read/write mode; keep `permits` for at most N holders at once, or keep \
                 `mode` for a read/write lock, and remove the other"
            ),
        ));
    }

    /// `key` and `keys` together, reported on the later one (`name`) once, as
    /// [`Self::conflict`] does.
    fn key_conflict(&mut self, name: &Ident, again: bool, other: bool) {
        if again || !other {
            return;
        }
        let (this, earlier) = if name == "key" {
            ("key", "keys")
        } else {
            ("keys", "key")
        };
        self.errors.push(syn::Error::new(
            name.span(),
            format_args!(
                "`{this}` cannot be combined with `{earlier}`: give one key with \
                 `key = \"order:<id>\"`, or several locked as one with \
                 `keys = [\"account:<from>\", \"account:<to>\"]` (put this key's template in \
                 that list), and remove the other"
            ),
        ));
    }

    fn duration(&mut self, arg: &str, lit: &LitStr) -> Option<WithSpan<Duration>> {
        match humantime::parse_duration(&lit.value()) {
            Ok(value) => match resolution_problem(arg, value) {
                None => Some(spanned(value, lit)),
                Some(problem) => {
                    self.errors.push(syn::Error::new(lit.span(), problem));
                    None
                }
            },
            Err(err) => {
                self.errors.push(syn::Error::new(
                    lit.span(),
                    format_args!(
                        "invalid duration {:?} for `{arg}`: {err}; write a duration such as \
                         \"250ms\", \"3s\" or \"1m30s\"",
                        lit.value()
                    ),
                ));
                None
            }
        }
    }

    /// Checks what concerns several arguments and returns the result.
    pub(crate) fn finish(self) -> Args {
        let ArgsParser {
            errors,
            key,
            keys,
            wait,
            lease,
            hold_at_least,
            client,
            on_lost,
            on_busy,
            mode,
            permits,
        } = self;
        if !key.is_given() && !keys.is_given() {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key` argument: name the lock, e.g. \
                 #[distributed_lock(key = \"order:<id>\")] where `<id>` is a parameter \
                 (or `keys = [\"account:<from>\", \"account:<to>\"]` to lock several keys as one)",
            ));
        }
        if keys.is_given() {
            // A lock of several keys is exclusive: reported on `mode` or `permits`,
            // whichever order they come in, since that is the one to remove.
            if let Some(span) = mode.name_span() {
                errors.push(syn::Error::new(
                    span,
                    "`mode` cannot be combined with `keys`: a lock of several keys is always \
                     exclusive (the write lock of every key); remove `mode`, or lock one key \
                     with `key = \"...\"` to give it a `mode`",
                ));
            }
            if let Some(span) = permits.name_span() {
                errors.push(syn::Error::new(
                    span,
                    "`permits` cannot be combined with `keys`: a lock of several keys is always \
                     exclusive, not a semaphore; remove `permits`, or lock one key with \
                     `key = \"...\"` to make it a semaphore",
                ));
            }
        }
        let lease = lease.get();
        let hold_at_least = hold_at_least.get();
        if let (Some(lease), Some(hold)) = (&lease, &hold_at_least)
            && hold.value > lease.value
        {
            errors.push(syn::Error::new(
                hold.span,
                format_args!(
                    "`hold_at_least` ({}) is longer than `lease` ({}): the lock would expire \
                         before it may be released; shorten `hold_at_least` or lengthen `lease`",
                    humantime::format_duration(hold.value),
                    humantime::format_duration(lease.value)
                ),
            ));
        }
        Args {
            key: key.get(),
            keys: keys.get(),
            wait: wait.get(),
            lease,
            hold_at_least,
            client: client.get(),
            abort_on_lost: on_lost.get().is_none_or(|on_lost| on_lost.value),
            skip_if_busy: on_busy
                .get()
                .filter(|on_busy| on_busy.value)
                .map(|on_busy| on_busy.span),
            // Both given is an error already; either one alone decides.
            mode: match (mode.get(), permits.get()) {
                (_, Some(permits)) => Mode::Permits(permits),
                (Some(mode), None) => mode,
                (None, None) => Mode::Exclusive,
            },
        }
    }
}

/// The templates of `keys = ["account:<from>", "account:<to>"]`, every mistake in it
/// reported on its own token: an empty list, a value that is no array, an element that
/// is no string literal, a template given twice. The valid templates are returned
/// whatever else is wrong, so that their placeholders are checked too.
fn key_templates(value: &Expr, errors: &mut Errors) -> Option<Vec<LitStr>> {
    let example = "`keys = [\"account:<from>\", \"account:<to>\"]`";
    let mut inner = value;
    // A list passed through a `macro_rules!` fragment arrives in an invisible group.
    while let Expr::Group(group) = inner {
        inner = &group.expr;
    }
    let Expr::Array(array) = inner else {
        let message = match string_literal(value) {
            Some(lit) => format!(
                "`keys` takes a list of key templates in `[...]`: write `keys = [{lit}]`, \
                 or `key = {lit}` for one key",
                lit = lit.to_token_stream()
            ),
            None => format!(
                "`keys` takes a list of string literals written out in the attribute, the key \
                 templates to lock as one, e.g. {example}"
            ),
        };
        errors.push(syn::Error::new_spanned(value, message));
        return None;
    };
    if array.elems.is_empty() {
        errors.push(syn::Error::new_spanned(
            value,
            format!(
                "`keys` is empty: list the key templates to lock as one, e.g. {example}, \
                 or write `key = \"order:<id>\"` for one key"
            ),
        ));
        return None;
    }
    let mut templates: Vec<LitStr> = Vec::new();
    for element in &array.elems {
        let Some(lit) = string_literal(element) else {
            // `keys = [from, to]`: a parameter's value goes in a template as `<from>`.
            let hint = match element {
                Expr::Path(path) => path
                    .path
                    .get_ident()
                    .map(|name| format!(" (for the value of `{name}`, write `\"<{name}>\"`)"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            errors.push(syn::Error::new_spanned(
                element,
                format!(
                    "each of `keys` is a key template, a string literal with the parameters \
                     in `<...>`{hint}: e.g. {example}"
                ),
            ));
            continue;
        };
        if templates
            .iter()
            .any(|earlier| earlier.value() == lit.value())
        {
            errors.push(syn::Error::new(
                lit.span(),
                format_args!(
                    "`keys` lists {} twice: both would be the same key on every call, so one \
                     of them is probably meant to name another parameter; correct this one, \
                     or remove it",
                    lit.to_token_stream()
                ),
            ));
            continue;
        }
        templates.push(lit);
    }
    Some(templates)
}

/// The value of `permits = N`: an integer literal from 1 to [`MAX_PERMITS`], or the
/// error to report on it.
fn permits(value: &Expr) -> syn::Result<u32> {
    let mut inner = value;
    // A literal passed through a `macro_rules!` fragment arrives in an invisible group.
    while let Expr::Group(group) = inner {
        inner = &group.expr;
    }
    let fix = "write the number of callers allowed in at once, e.g. `permits = 5`";
    let error = |message: String| Err(syn::Error::new_spanned(value, message));
    match inner {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => match int.base10_parse::<u64>() {
            Ok(0) => error(format!(
                "`permits` must be at least 1: a semaphore of 0 permits never lets a caller \
                 in; {fix}, or remove `permits` for an exclusive lock"
            )),
            Ok(n) if n <= u64::from(MAX_PERMITS) => Ok(n as u32),
            _ => error(format!(
                "`permits = {}` is more than {}, the most `permits` accepts: a \
                 semaphore that large limits nothing; {fix}, or remove `permits` to let every \
                 caller in",
                int,
                grouped(MAX_PERMITS)
            )),
        },
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => error(format!(
            "`permits` must be a positive whole number, not a negative one; {fix}"
        )),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => error(match lit.value().trim().parse::<u64>() {
            Ok(n) if (1..=u64::from(MAX_PERMITS)).contains(&n) => format!(
                "`permits` takes an integer literal, not a string: write `permits = {n}` \
                 (without quotes)"
            ),
            _ => format!("`permits` takes an integer literal, not a string; {fix}"),
        }),
        Expr::Lit(ExprLit {
            lit: Lit::Float(_), ..
        }) => error(format!(
            "`permits` takes a whole number of holders, not a fraction; {fix}"
        )),
        Expr::Lit(_) => error(format!("`permits` takes an integer literal; {fix}")),
        _ => error(format!(
            "`permits` takes an integer literal, known at compile time; {fix} (for a count \
             known only at run time, call `client.semaphore(key, n)` instead of the attribute)"
        )),
    }
}

/// Redis counts leases in whole milliseconds: a duration it would round (or refuse at
/// run time) is refused here. A zero `wait` (one attempt) is fine; a zero lease is
/// refused where `lease` is checked.
fn resolution_problem(arg: &str, value: Duration) -> Option<String> {
    let sub_millisecond = value.subsec_nanos() % 1_000_000;
    if value.is_zero() || sub_millisecond == 0 {
        return None;
    }
    let shown = humantime::format_duration(value);
    Some(if value < Duration::from_millis(1) {
        format!(
            "`{arg}` of {shown} is below Redis's 1 ms resolution: use at least \"1ms\"{}",
            if arg == "wait" {
                " (or \"0s\" for a single attempt)"
            } else {
                ""
            }
        )
    } else {
        let whole = Duration::from_millis(value.as_millis() as u64);
        format!(
            "`{arg}` of {shown} is not a whole number of milliseconds, Redis's resolution: \
             write \"{}\" or \"{}\"",
            humantime::format_duration(whole),
            humantime::format_duration(whole + Duration::from_millis(1))
        )
    })
}

fn spanned<T>(value: T, lit: &LitStr) -> WithSpan<T> {
    WithSpan {
        value,
        span: lit.span(),
    }
}

/// The string literal an argument's value is, if it is one.
fn string_literal(value: &Expr) -> Option<LitStr> {
    let mut value = value;
    // A literal passed through a `macro_rules!` fragment arrives in an invisible group.
    while let Expr::Group(group) = value {
        value = &group.expr;
    }
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit.clone()),
        _ => None,
    }
}

/// Consumes an unknown argument's value (`= expr` or `(...)`) so parsing can go on.
fn skip_value(meta: &ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _group: proc_macro2::Group = meta.input.parse()?;
    }
    Ok(())
}

fn example(arg: &str) -> &'static str {
    match arg {
        "key" => "`key = \"order:<id>\"`",
        "keys" => "`keys = [\"account:<from>\", \"account:<to>\"]`",
        "wait" => "`wait = \"3s\"`",
        "lease" => "`lease = \"10s\"`",
        "hold_at_least" => "`hold_at_least = \"250ms\"`",
        "client" => "`client = self.locks`",
        "on_lost" => "`on_lost = \"continue\"`",
        "on_busy" => "`on_busy = \"skip\"`",
        "mode" => "`mode = \"read\"` or `mode = \"write\"`",
        "permits" => "`permits = 5`",
        _ => "`key = \"order:<id>\"`",
    }
}

/// `` `a`, `b`, `c` ``
pub(crate) fn list(names: &[impl AsRef<str>]) -> String {
    names
        .iter()
        .map(|name| format!("`{}`", name.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `1_000_000`, as the number is written in Rust.
fn grouped(n: u32) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('_');
        }
        out.push(digit);
    }
    out
}

/// `read`, `write`, ... given as an argument of its own: the `mode` or `permits` it means.
fn mode_hint(name: &str) -> Option<String> {
    match name {
        "read" | "write" => Some(format!(" (did you mean `mode = \"{name}\"`?)")),
        "shared" | "readonly" | "read_only" | "reader" => {
            Some(" (did you mean `mode = \"read\"`?)".to_string())
        }
        "exclusive" | "writer" => Some(" (did you mean `mode = \"write\"`?)".to_string()),
        "semaphore" | "max_holders" | "max_concurrent" | "concurrency" | "limit" => {
            Some(" (did you mean `permits = N`?)".to_string())
        }
        _ => None,
    }
}

/// `" (did you mean `wait`?)"` when `name` is a likely typo of one of `candidates`.
pub(crate) fn did_you_mean(name: &str, candidates: &[impl AsRef<str>]) -> String {
    candidates
        .iter()
        .map(|c| (edit_distance(name, c.as_ref()), c.as_ref()))
        .filter(|(distance, c)| *distance <= 2.max(c.len() / 3) && *distance < name.len())
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse::Parser;

    /// The mode and the error messages of `#[distributed_lock(#args)]`.
    fn parse(args: &str) -> (Option<Mode>, Vec<String>) {
        let mut errors = Errors::default();
        let mut parser = ArgsParser::new(&mut errors);
        let tokens: proc_macro2::TokenStream = args.parse().expect("tokens");
        syn::meta::parser(|meta| parser.parse(meta))
            .parse2(tokens)
            .expect("no syntax error");
        let mode = parser.finish().mode;
        let messages = errors.messages();
        (messages.is_empty().then_some(mode), messages)
    }

    fn mode(args: &str) -> Mode {
        let (mode, errors) = parse(args);
        assert!(errors.is_empty(), "{args}: {errors:?}");
        mode.expect("no errors")
    }

    fn errors(args: &str) -> Vec<String> {
        let (_, errors) = parse(args);
        assert!(!errors.is_empty(), "{args}: accepted");
        errors
    }

    #[test]
    fn modes() {
        assert_eq!(mode(r#"key = "k""#), Mode::Exclusive);
        assert_eq!(mode(r#"key = "k", mode = "write""#), Mode::Exclusive);
        assert_eq!(mode(r#"key = "k", mode = "read""#), Mode::Read);
        assert_eq!(mode(r#"key = "k", permits = 5"#), Mode::Permits(5));
        assert_eq!(mode(r#"permits = 1, key = "k""#), Mode::Permits(1));
        assert_eq!(mode(r#"key = "k", permits = 5u32"#), Mode::Permits(5));
        assert_eq!(mode(r#"key = "k", permits = 0x10"#), Mode::Permits(16));
        assert_eq!(
            mode(r#"key = "k", permits = 1_000_000"#),
            Mode::Permits(MAX_PERMITS)
        );
    }

    #[test]
    fn bad_modes() {
        let e = errors(r#"key = "k", mode = "shared""#);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains(r#"unknown `mode` value "shared""#), "{e:?}");
        assert!(e[0].contains(r#""read""#) && e[0].contains(r#""write""#));
        assert!(e[0].contains("permits = N"));
        let e = errors(r#"key = "k", mode = read"#);
        assert!(e[0].contains("`mode` takes a string literal"), "{e:?}");
        let e = errors(r#"key = "k", mode = "read", mode = "write""#);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains("duplicate `mode`"), "{e:?}");
    }

    #[test]
    fn bad_permits() {
        for (value, expected) in [
            ("0", "at least 1"),
            ("-1", "not a negative one"),
            ("\"5\"", "write `permits = 5` (without quotes)"),
            ("\"five\"", "not a string"),
            ("2.5", "not a fraction"),
            ("1_000_001", "is more than 1_000_000"),
            ("99999999999999999999999", "is more than 1_000_000"),
            ("true", "takes an integer literal"),
            ("MAX", "known at compile time"),
        ] {
            let e = errors(&format!(r#"key = "k", permits = {value}"#));
            assert_eq!(e.len(), 1, "{value}: {e:?}");
            assert!(e[0].contains(expected), "{value}: {e:?}");
            assert!(e[0].contains("`permits = 5`"), "{value}: {e:?}");
        }
        let e = errors(r#"key = "k", permits = 5, permits = 6"#);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains("duplicate `permits`"), "{e:?}");
    }

    #[test]
    fn mode_with_permits() {
        let e = errors(r#"key = "k", mode = "read", permits = 5"#);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("`permits` cannot be combined with `mode`"),
            "{e:?}"
        );
        assert!(e[0].contains("a semaphore (`permits = N`) has no read/write mode"));
        let e = errors(r#"key = "k", permits = 5, mode = "write""#);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("`mode` cannot be combined with `permits`"),
            "{e:?}"
        );
        // Once, beside the duplicate; and every mistake of the values too.
        let e = errors(r#"key = "k", permits = 0, mode = "read", mode = "shared""#);
        assert_eq!(e.len(), 4, "{e:?}");
        assert_eq!(
            e.iter()
                .filter(|e| e.contains("cannot be combined"))
                .count(),
            1
        );
    }

    #[test]
    fn unknown_names_point_at_the_new_arguments() {
        let e = errors(r#"key = "k", mod = "read""#);
        assert!(e[0].contains("(did you mean `mode`?)"), "{e:?}");
        let e = errors(r#"key = "k", permit = 5"#);
        assert!(e[0].contains("(did you mean `permits`?)"), "{e:?}");
        let e = errors(r#"key = "k", read"#);
        assert!(e[0].contains(r#"(did you mean `mode = "read"`?)"#), "{e:?}");
        let e = errors(r#"key = "k", semaphore = 5"#);
        assert!(e[0].contains("(did you mean `permits = N`?)"), "{e:?}");
        assert!(e[0].contains("`on_busy`, `mode`, `permits`"), "{e:?}");
    }

    /// The templates of `keys` and the error messages of `#[distributed_lock(#args)]`.
    fn parse_keys(args: &str) -> (Option<Vec<String>>, Vec<String>) {
        let mut errors = Errors::default();
        let mut parser = ArgsParser::new(&mut errors);
        let tokens: proc_macro2::TokenStream = args.parse().expect("tokens");
        syn::meta::parser(|meta| parser.parse(meta))
            .parse2(tokens)
            .expect("no syntax error");
        let keys = parser
            .finish()
            .keys
            .map(|keys| keys.iter().map(LitStr::value).collect());
        (keys, errors.messages())
    }

    #[test]
    fn keys() {
        let (keys, e) = parse_keys(r#"keys = ["account:<from>", "account:<to>"], wait = "3s""#);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(keys.unwrap(), ["account:<from>", "account:<to>"]);
        // One template is a lock of one key, and so is a trailing comma fine.
        let (keys, e) = parse_keys(r#"keys = ["a:<x>",], mode = "write""#);
        assert_eq!(keys.unwrap(), ["a:<x>"]);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("`mode` cannot be combined with `keys`"));
    }

    #[test]
    fn bad_keys() {
        for (args, expected) in [
            ("keys = []", "`keys` is empty"),
            (
                r#"keys = "a:<x>""#,
                r#"write `keys = ["a:<x>"]`, or `key = "a:<x>"`"#,
            ),
            ("keys = ACCOUNTS", "`keys` takes a list of string literals"),
            (
                r#"keys = ["a", b]"#,
                r#"(for the value of `b`, write `"<b>"`)"#,
            ),
            (r#"keys = ["a", 1]"#, "each of `keys` is a key template"),
            (r#"keys = ["a", "a"]"#, r#"`keys` lists "a" twice"#),
            (
                r#"key = "a", keys = ["b"]"#,
                "`keys` cannot be combined with `key`",
            ),
            (
                r#"keys = ["b"], key = "a""#,
                "`key` cannot be combined with `keys`",
            ),
            (
                r#"permits = 2, keys = ["b"]"#,
                "`permits` cannot be combined with `keys`",
            ),
            (
                r#"keys = ["b"], mode = "read""#,
                "`mode` cannot be combined with `keys`",
            ),
        ] {
            let (_, e) = parse_keys(args);
            assert_eq!(e.len(), 1, "{args}: {e:?}");
            assert!(e[0].contains(expected), "{args}: {e:?}");
        }
        // Every mistake at once, and no "missing `key`" for a `keys` that was rejected.
        let (_, e) = parse_keys(r#"keys = [1, "a", "a", 2], keys = []"#);
        assert_eq!(e.len(), 5, "{e:?}");
        assert!(e.iter().all(|e| !e.contains("missing")), "{e:?}");
        let (_, e) = parse_keys(r#"wait = "1s""#);
        assert!(
            e[0].contains("missing `key`") && e[0].contains("keys = ["),
            "{e:?}"
        );
    }

    #[test]
    fn grouped_digits() {
        assert_eq!(grouped(1_000_000), "1_000_000");
        assert_eq!(grouped(100_000), "100_000");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1_000");
    }
}
