//! The attribute's arguments: `key = "order:<id>", wait = "3s", lease = "10s", ...`.
//!
//! Parsed with [`syn::meta::parser`]. Errors in values (a bad duration, an unknown
//! argument, a duplicate) are collected in [`Errors`] so the user sees all of them at
//! once; only a syntax error (say, a missing `=`) stops the parse.

use std::time::Duration;

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr};

use crate::errors::Errors;

/// Every argument the attribute accepts, in the order the docs list them.
pub(crate) const ARGUMENTS: &[&str] = &[
    "key",
    "wait",
    "lease",
    "hold_at_least",
    "client",
    "on_lost",
    "on_busy",
];

/// The parsed, validated arguments.
pub(crate) struct Args {
    /// The key template literal, not yet parsed (see [`crate::key`]).
    pub key: Option<LitStr>,
    pub wait: Option<WithSpan<Duration>>,
    pub lease: Option<WithSpan<Duration>>,
    pub hold_at_least: Option<WithSpan<Duration>>,
    pub client: Option<Expr>,
    pub abort_on_lost: bool,
    /// `on_busy = "skip"`, with the literal's span.
    pub skip_if_busy: Option<Span>,
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
}

impl<T> Slot<T> {
    const fn new(name: &'static str) -> Self {
        Slot {
            name,
            value: None,
            given: false,
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
}

/// The accumulating parser fed to [`syn::meta::parser`].
pub(crate) struct ArgsParser<'e> {
    errors: &'e mut Errors,
    key: Slot<LitStr>,
    wait: Slot<WithSpan<Duration>>,
    lease: Slot<WithSpan<Duration>>,
    hold_at_least: Slot<WithSpan<Duration>>,
    client: Slot<Expr>,
    on_lost: Slot<WithSpan<bool>>,
    on_busy: Slot<WithSpan<bool>>,
}

impl<'e> ArgsParser<'e> {
    pub(crate) fn new(errors: &'e mut Errors) -> Self {
        ArgsParser {
            errors,
            key: Slot::new("key"),
            wait: Slot::new("wait"),
            lease: Slot::new("lease"),
            hold_at_least: Slot::new("hold_at_least"),
            client: Slot::new("client"),
            on_lost: Slot::new("on_lost"),
            on_busy: Slot::new("on_busy"),
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
                    did_you_mean(&arg, ARGUMENTS),
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
            "key" => self.key.given(self.errors, &name),
            "wait" => self.wait.given(self.errors, &name),
            "lease" => self.lease.given(self.errors, &name),
            "hold_at_least" => self.hold_at_least.given(self.errors, &name),
            "client" => self.client.given(self.errors, &name),
            "on_lost" => self.on_lost.given(self.errors, &name),
            "on_busy" => self.on_busy.given(self.errors, &name),
            _ => unreachable!("every name in ARGUMENTS is handled"),
        }
        if arg == "client" {
            self.client.set(value);
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
            _ => unreachable!("every name in ARGUMENTS is handled"),
        }
        Ok(())
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
            wait,
            lease,
            hold_at_least,
            client,
            on_lost,
            on_busy,
        } = self;
        if !key.is_given() {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key` argument: name the lock, e.g. \
                 #[distributed_lock(key = \"order:<id>\")] where `<id>` is a parameter",
            ));
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
            wait: wait.get(),
            lease,
            hold_at_least,
            client: client.get(),
            abort_on_lost: on_lost.get().is_none_or(|on_lost| on_lost.value),
            skip_if_busy: on_busy
                .get()
                .filter(|on_busy| on_busy.value)
                .map(|on_busy| on_busy.span),
        }
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
        "wait" => "`wait = \"3s\"`",
        "lease" => "`lease = \"10s\"`",
        "hold_at_least" => "`hold_at_least = \"250ms\"`",
        "client" => "`client = self.locks`",
        "on_lost" => "`on_lost = \"continue\"`",
        "on_busy" => "`on_busy = \"skip\"`",
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
