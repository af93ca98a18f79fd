//! Checks the function against the arguments, then generates the wrapped function.
//!
//! ```text
//! #(#attrs)* #vis #sig {
//!     let __key = format!("order:{}", id);            // before the body moves `id`
//!     // (with `keys = [..]`: `<[String]>::to_vec(&[format!(..), format!(..)])`)
//!     let __client = Some(AsLockClient::as_lock_client(&(self.locks)).clone());  // or None
//!     let __body = async move {
//!         // Never runs: fixes the block's type to the function's, before the body.
//!         if let Some(never) = None::<#return_type> { return never; }
//!         #body
//!     };
//!     from_result(run_locked(__client, __key, LockSpec { .., label: "order:<id>", mode },
//!         __body, Conversions { into_result, from_lock_error, skipped }).await)
//!     // (with `keys = [..]`: `run_locked_all`, the same arguments, mode `Exclusive`)
//! }
//! ```
//!
//! On any error the user's function is emitted unchanged beside the `compile_error!`s,
//! so rust-analyzer keeps working inside the body and no follow-on errors appear.

use std::time::Duration;

use proc_macro2::{Ident, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{FnArg, LitStr, Pat, ReturnType, Signature, Type};

use crate::args::{self, Args, ArgsParser, Mode, WithSpan};
use crate::errors::Errors;
use crate::item::LockedFn;
use crate::key::{self, Field, Part, Placeholder};

pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();

    let (positional_key, args) = positional_key(args, &mut errors);
    let mut parser = ArgsParser::new(&mut errors);
    if let Some(key) = positional_key {
        parser.set_key(key);
    }
    let parsed = syn::meta::parser(|meta| parser.parse(meta)).parse2(args);
    let args = match parsed {
        Ok(()) => Some(parser.finish()),
        Err(err) => {
            errors.push(err);
            None
        }
    };

    let function = match syn::parse2::<LockedFn>(item.clone()) {
        Ok(function) => function,
        Err(err) => {
            errors.push(syn::Error::new(
                err.span(),
                format_args!("#[distributed_lock] goes on an `async fn`: {err}"),
            ));
            return with_errors(item, errors);
        }
    };

    let return_type = check_signature(&function.sig, &mut errors);
    let Some(args) = args else {
        return with_errors(item, errors);
    };
    // Every template is checked, `key`'s and each of `keys`, even when both are given
    // (an error already): every mistake is reported at once.
    let key = args
        .key
        .as_ref()
        .map(|lit| key_expression(lit, &function.sig, &mut errors));
    let keys = args.keys.as_ref().map(|lits| {
        lits.iter()
            .map(|lit| key_expression(lit, &function.sig, &mut errors))
            .collect::<Vec<_>>()
    });
    let lock_keys = match (key, keys) {
        (Some(key), None) => Some(LockKeys::One(key)),
        (None, Some(keys)) => Some(LockKeys::All(keys)),
        _ => None,
    };

    match (return_type, lock_keys) {
        (Some(return_type), Some(keys)) if errors.is_empty() => {
            generate(&function, &args, return_type, keys)
        }
        _ => with_errors(item, errors),
    }
}

/// The expressions that build the key strings of one call.
enum LockKeys {
    /// `key = "..."`.
    One(TokenStream),
    /// `keys = [...]`, in the order written (the runtime sorts and deduplicates them).
    All(Vec<TokenStream>),
}

/// `#[distributed_lock("order:<id>")]`: a key without its name. Reported with the fix,
/// and taken as the key so that nothing else complains about a missing one.
fn positional_key(args: TokenStream, errors: &mut Errors) -> (Option<LitStr>, TokenStream) {
    let mut tokens = args.clone().into_iter().peekable();
    let Some(proc_macro2::TokenTree::Literal(literal)) = tokens.peek().cloned() else {
        return (None, args);
    };
    let Ok(lit) = syn::parse2::<LitStr>(literal.into_token_stream()) else {
        return (None, args);
    };
    tokens.next();
    errors.push(syn::Error::new(
        lit.span(),
        format_args!(
            "the key needs its name: write `key = {}`",
            lit.to_token_stream()
        ),
    ));
    if matches!(tokens.peek(), Some(proc_macro2::TokenTree::Punct(p)) if p.as_char() == ',') {
        tokens.next();
    }
    (Some(lit), tokens.collect())
}

/// The user's function untouched, plus every error.
fn with_errors(item: TokenStream, errors: Errors) -> TokenStream {
    let mut tokens = errors.into_compile_errors();
    tokens.extend(item);
    tokens
}

/// Requires `async fn ... -> Result<..>`; returns the return type.
fn check_signature<'a>(sig: &'a Signature, errors: &mut Errors) -> Option<&'a Type> {
    let return_type = match &sig.output {
        ReturnType::Type(_, ty) => Some(&**ty),
        ReturnType::Default => None,
    };
    if sig.asyncness.is_none() {
        let message = if return_type.is_some_and(|ty| last_segment_is(ty, "Pin")) {
            "#[distributed_lock] needs a native `async fn`, but this fn returns a pinned future: \
             `#[async_trait]` probably rewrote it first. Remove `#[async_trait]` (async fn in \
             traits is stable since Rust 1.75), or lock inside a helper `async fn` it calls"
        } else {
            "#[distributed_lock] needs an `async fn`: write `async fn`, the lock is awaited"
        };
        errors.push(syn::Error::new(sig.fn_token.span, message));
    }
    match return_type {
        // Whether it is a `Result` whose error converts from `LockError` is the type
        // system's call (an alias under any name is fine): see `LockedResult` in the
        // runtime, named in the expansion on this type's span.
        Some(ty) if sig.asyncness.is_some() || !last_segment_is(ty, "Pin") => Some(ty),
        Some(_) => None,
        None => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "#[distributed_lock] functions must return a `Result<T, E>` whose error type \
                 implements `From<redlock_runtime::LockError>`, so a failure to lock can be \
                 returned: add e.g. `-> Result<(), LockError>`",
            ));
            None
        }
    }
}

/// True for `Result<..>`, `io::Result<T>`, `anyhow::Result<T>`, `crate::Result<T>`, ...
fn last_segment_is(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == name),
        Type::Paren(paren) => last_segment_is(&paren.elem, name),
        Type::Group(group) => last_segment_is(&group.elem, name),
        _ => false,
    }
}

/// What a placeholder's root may name.
enum Binding {
    /// `id: u64`, `mut id: u64`: usable.
    Param(Ident),
    /// `self`, `&self`, `self: Arc<Self>`.
    Receiver,
    /// A name bound inside a destructuring parameter such as `(a, b): (u32, u32)`.
    InPattern { param: String },
}

fn bindings(sig: &Signature) -> Vec<(String, Binding)> {
    let mut out = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => out.push(("self".to_string(), Binding::Receiver)),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) => out.push((
                    pat.ident.unraw().to_string(),
                    Binding::Param(pat.ident.clone()),
                )),
                Pat::Wild(_) => {}
                pat => {
                    let param = typed.to_token_stream().to_string().replace(" : ", ": ");
                    let mut names = Vec::new();
                    pattern_names(pat, &mut names);
                    for name in names {
                        out.push((
                            name.unraw().to_string(),
                            Binding::InPattern {
                                param: param.clone(),
                            },
                        ));
                    }
                }
            },
        }
    }
    out
}

/// The names a pattern binds.
fn pattern_names(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(pat) => {
            out.push(pat.ident.clone());
            if let Some((_, sub)) = &pat.subpat {
                pattern_names(sub, out);
            }
        }
        Pat::Or(pat) => pat.cases.iter().take(1).for_each(|p| pattern_names(p, out)),
        Pat::Paren(pat) => pattern_names(&pat.pat, out),
        Pat::Reference(pat) => pattern_names(&pat.pat, out),
        Pat::Slice(pat) => pat.elems.iter().for_each(|p| pattern_names(p, out)),
        Pat::Struct(pat) => pat.fields.iter().for_each(|f| pattern_names(&f.pat, out)),
        Pat::Tuple(pat) => pat.elems.iter().for_each(|p| pattern_names(p, out)),
        Pat::TupleStruct(pat) => pat.elems.iter().for_each(|p| pattern_names(p, out)),
        Pat::Type(pat) => pattern_names(&pat.pat, out),
        _ => {}
    }
}

/// The expression that builds the key string; placeholders resolved against `sig`.
///
/// Every generated token carries the key literal's span, so a placeholder whose value
/// is not `Display` is reported on the key, not inside the expansion.
fn key_expression(lit: &LitStr, sig: &Signature, errors: &mut Errors) -> TokenStream {
    let parts = key::parse(lit, errors);
    let bindings = bindings(sig);
    let span = lit.span();
    for braced in key::braced_names(&lit.value()) {
        if let Some(message) = format_habit(lit, &braced, &bindings) {
            errors.push(syn::Error::new(span, message));
        }
    }
    let mut format = String::new();
    let mut values = Vec::new();
    for part in &parts {
        match part {
            Part::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Part::Placeholder(placeholder) => {
                format.push_str("{}");
                match resolve(placeholder, &bindings, sig, span) {
                    Ok(value) => values.push(value),
                    Err(message) => errors.push(syn::Error::new(span, message)),
                }
            }
        }
    }
    if values.is_empty() {
        let text = LitStr::new(&format.replace("{{", "{").replace("}}", "}"), span);
        quote_spanned!(span=> ::redlock_runtime::__private::String::from(#text))
    } else {
        let format = LitStr::new(&format, span);
        quote_spanned!(span=> ::redlock_runtime::__private::format!(#format, #(#values),*))
    }
}

/// `key = "order:{id}"` where `id` is a parameter: written as for `format!`, it would
/// lock the literal key `order:{id}` on every call, serialising them all on one key.
/// Refused with both fixes spelled out; a `{…}` naming no parameter is a hash tag.
fn format_habit(
    lit: &LitStr,
    braced: &key::Braced,
    bindings: &[(String, Binding)],
) -> Option<String> {
    let placeholder = &braced.placeholder;
    let root = placeholder
        .root
        .strip_prefix("r#")
        .unwrap_or(&placeholder.root);
    let binding = bindings.iter().find(|(name, _)| name == root);
    if !matches!(binding, Some((_, Binding::Param(_) | Binding::Receiver))) {
        return None;
    }
    let template = lit.value();
    let written = &template[braced.range.clone()];
    let with = |replacement: &str| {
        let mut key = template.clone();
        key.replace_range(braced.range.clone(), replacement);
        LitStr::new(&key, lit.span()).to_token_stream().to_string()
    };
    let path = &placeholder.text;
    let value = format!("<{path}>");
    let tag = format!("{{<{path}>}}");
    Some(format!(
        "`{written}` in the key is literal text, not the value of `{path}`: the key is not a \
         `format!` string, so calls would lock {literal} as written, the same key whatever \
         `{path}` is. Write `{value}` for the value: `key = {by_value}`; or `{tag}` to make the \
         value a Redis Cluster hash tag: `key = {by_tag}`",
        literal = lit.to_token_stream(),
        by_value = with(&value),
        by_tag = with(&tag),
    ))
}

fn resolve(
    placeholder: &Placeholder,
    bindings: &[(String, Binding)],
    sig: &Signature,
    span: Span,
) -> Result<TokenStream, String> {
    let root_name = placeholder
        .root
        .strip_prefix("r#")
        .unwrap_or(&placeholder.root);
    let found = bindings.iter().find(|(name, _)| name == root_name);
    let root = match found {
        Some((_, Binding::Param(ident))) => {
            let mut ident = ident.clone();
            ident.set_span(span);
            ident.into_token_stream()
        }
        Some((_, Binding::Receiver)) => quote_spanned!(span=> self),
        Some((name, Binding::InPattern { param })) => {
            return Err(format!(
                "placeholder `<{}>` names `{name}`, which is bound inside the destructured \
                 parameter `{param}`: a key can only name whole parameters; give that parameter \
                 a name (e.g. `pair: (u32, u32)`) and use a field path such as `<pair.0>`",
                placeholder.text
            ));
        }
        None => {
            let names: Vec<&str> = bindings
                .iter()
                .filter(|(_, binding)| !matches!(binding, Binding::InPattern { .. }))
                .map(|(name, _)| name.as_str())
                .collect();
            let fn_name = &sig.ident;
            return Err(if root_name == "self" {
                format!(
                    "placeholder `<{}>` needs a `self` parameter, but `{fn_name}` is not a method \
                     ({})",
                    placeholder.text,
                    if names.is_empty() {
                        "it has no parameters".to_string()
                    } else {
                        format!("its parameters are {}", args::list(&names))
                    }
                )
            } else if names.is_empty() {
                format!(
                    "placeholder `<{}>` names no parameter: `{fn_name}` has no parameters; \
                     add one, or write the key without placeholders",
                    placeholder.text
                )
            } else {
                format!(
                    "placeholder `<{}>` names no parameter of `{fn_name}`{}: its parameters are {}",
                    placeholder.text,
                    args::did_you_mean(root_name, &names),
                    args::list(&names)
                )
            });
        }
    };
    // The fields are where a typo is reported (rustc's E0609 "no field `warehous` on type
    // `&Inventory`", which names the field and the type). On the key literal's own span,
    // rustc would add "a field with a similar name exists" as a suggestion replacing that
    // span, i.e. the whole key, with the bare field name: applying it destroys the key.
    // Located at the key but resolved at the call site, the span belongs to the expansion,
    // and rustc offers no field suggestion there (nor a struct's list of fields; a tuple's
    // is still given). Name resolution is unchanged: call-site hygiene is what a field
    // written by the user has. tests/ui/field_typo.rs holds the message.
    let field_span = Span::call_site().located_at(span);
    let fields = placeholder.fields.iter().map(|field| match field {
        Field::Named(name) => match name.strip_prefix("r#") {
            Some(raw) => Ident::new_raw(raw, field_span).into_token_stream(),
            None => Ident::new(name, field_span).into_token_stream(),
        },
        Field::Index(index) => syn::Index {
            index: *index,
            span: field_span,
        }
        .into_token_stream(),
    });
    Ok(quote_spanned!(span=> #root #(. #fields)*))
}

fn duration(d: Duration) -> TokenStream {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    quote!(::redlock_runtime::__private::Duration::new(#secs, #nanos))
}

fn optional_duration(d: Option<&WithSpan<Duration>>) -> TokenStream {
    match d {
        Some(d) => {
            let d = duration(d.value);
            quote!(::redlock_runtime::__private::Option::Some(#d))
        }
        None => quote!(::redlock_runtime::__private::Option::None),
    }
}

fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = proc_macro2::TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// The return type as a turbofish argument: `impl Trait` (not allowed there) becomes `_`.
fn body_type(ty: &Type) -> Type {
    let mut ty = ty.clone();
    infer_impl_trait(&mut ty);
    ty
}

fn infer_impl_trait(ty: &mut Type) {
    match ty {
        Type::ImplTrait(_) => *ty = syn::parse_quote!(_),
        Type::Path(path) => {
            if let Some(qself) = &mut path.qself {
                infer_impl_trait(&mut qself.ty);
            }
            for segment in &mut path.path.segments {
                if let syn::PathArguments::AngleBracketed(args) = &mut segment.arguments {
                    for arg in &mut args.args {
                        if let syn::GenericArgument::Type(ty) = arg {
                            infer_impl_trait(ty);
                        }
                    }
                }
            }
        }
        Type::Array(array) => infer_impl_trait(&mut array.elem),
        Type::Group(group) => infer_impl_trait(&mut group.elem),
        Type::Paren(paren) => infer_impl_trait(&mut paren.elem),
        Type::Ptr(ptr) => infer_impl_trait(&mut ptr.elem),
        Type::Reference(reference) => infer_impl_trait(&mut reference.elem),
        Type::Slice(slice) => infer_impl_trait(&mut slice.elem),
        Type::Tuple(tuple) => tuple.elems.iter_mut().for_each(infer_impl_trait),
        _ => {}
    }
}

fn generate(function: &LockedFn, args: &Args, return_type: &Type, keys: LockKeys) -> TokenStream {
    let LockedFn {
        attrs,
        vis,
        sig,
        body,
    } = function;
    let key_var = format_ident!("__redlock_key", span = Span::mixed_site());
    let client_var = format_ident!("__redlock_client", span = Span::mixed_site());
    let body_var = format_ident!("__redlock_body", span = Span::mixed_site());

    let client = match &args.client {
        Some(expr) => quote_spanned! {expr.span()=>
            ::redlock_runtime::__private::Option::Some(
                ::redlock_runtime::__private::Clone::clone(
                    ::redlock_runtime::AsLockClient::as_lock_client(&(#expr))
                )
            )
        },
        None => quote!(::redlock_runtime::__private::Option::None),
    };
    let wait = duration(args.wait.as_ref().map_or(Duration::ZERO, |w| w.value));
    let lease = optional_duration(args.lease.as_ref());
    let hold_at_least = optional_duration(args.hold_at_least.as_ref());
    let abort_on_lost = args.abort_on_lost;
    // The metrics' `lock` label: the key's template as written, never a key with its
    // values filled in, so that a function's locks are one time series, not one per id.
    // Several keys: their templates as written, joined ("account:<from>, account:<to>").
    let templates: Vec<String> = match &args.keys {
        Some(keys) => keys.iter().map(LitStr::value).collect(),
        None => args.key.iter().map(LitStr::value).collect(),
    };
    let label = LitStr::new(&templates.join(", "), Span::call_site());
    let mode = match args.mode {
        Mode::Exclusive => quote!(::redlock_runtime::__private::LockMode::Exclusive),
        Mode::Read => quote!(::redlock_runtime::__private::LockMode::Read),
        Mode::Permits(permits) => quote!(::redlock_runtime::__private::LockMode::Permits(#permits)),
    };
    let body_type = body_type(return_type);

    // Every conversion is named through a trait on the return type's span: a return
    // type that is no `Result`, an error type without `From<LockError>`, or a
    // `skip` without `Option` is reported there, with the trait's message.
    let ty_span = return_type.span();
    // One span for every mention of the type, so that rustc reports one error, not one
    // per mention (a type's own span covers it whole, a path's only its first token).
    let body_type = respan(body_type.into_token_stream(), ty_span);
    // With `impl Trait` in the return type the type cannot be named here (it holds
    // `_`): let inference pick the same conversions instead.
    let inferred = body_type.to_string().contains('_');
    let into_result = if inferred {
        quote_spanned!(ty_span=> ::redlock_runtime::LockedResult::into_result)
    } else {
        quote_spanned!(ty_span=> <#body_type as ::redlock_runtime::LockedResult>::into_result)
    };
    let from_lock_error = if inferred {
        quote_spanned!(ty_span=> ::redlock_runtime::FromLockError::from_lock_error)
    } else {
        quote_spanned! {ty_span=>
            <<#body_type as ::redlock_runtime::LockedResult>::Error
                as ::redlock_runtime::FromLockError>::from_lock_error
        }
    };
    let from_result = if inferred {
        quote_spanned!(ty_span=> ::redlock_runtime::LockedResult::from_result)
    } else {
        quote_spanned!(ty_span=> <#body_type as ::redlock_runtime::LockedResult>::from_result)
    };
    let skipped = match args.skip_if_busy {
        Some(_) => quote_spanned! {ty_span=>
            ::redlock_runtime::__private::Option::Some(
                <#body_type as ::redlock_runtime::SkippableResult>::skipped
            )
        },
        None => quote!(::redlock_runtime::__private::Option::None),
    };
    // One key: `run_locked`; several, locked as one: `run_locked_all`, with the same
    // arguments but the list of keys.
    let (let_keys, run_locked) = match keys {
        LockKeys::One(key) => (
            quote!(let #key_var: ::redlock_runtime::__private::String = #key;),
            quote_spanned!(ty_span=> ::redlock_runtime::__private::run_locked),
        ),
        // `__private` exports no `Vec`: the slice's inherent `to_vec` needs no name and
        // no trait in scope (a copy of each key, beside the Redis round trips).
        LockKeys::All(keys) => (
            quote! {
                let #key_var = <[::redlock_runtime::__private::String]>::to_vec(&[#(#keys),*]);
            },
            quote_spanned!(ty_span=> ::redlock_runtime::__private::run_locked_all),
        ),
    };
    let run = quote_spanned! {ty_span=>
        #from_result(
            #run_locked(
                #client_var,
                #key_var,
                ::redlock_runtime::__private::LockSpec {
                    wait: #wait,
                    lease: #lease,
                    hold_at_least: #hold_at_least,
                    abort_on_lost: #abort_on_lost,
                    label: #label,
                    mode: #mode,
                },
                #body_var,
                ::redlock_runtime::__private::Conversions {
                    into_result: #into_result,
                    from_lock_error: #from_lock_error,
                    skipped: #skipped,
                },
            ).await
        )
    };

    // The body's type is fixed before rustc checks the body. An async block declares no
    // return type: its first `return` (or else its tail) decides it, so `return id;` or
    // `Ok("x")` in a `Result<u64, _>` function would be reported against the expansion,
    // not on the expression. A `return` that never runs, written first and located at
    // the function's return type, fixes it: the body's `return`s, `?`s and tail are then
    // ordinary mismatches on the user's expression, and rustc's "return type inferred to
    // be ... here" points at the signature.
    let never = format_ident!(
        "__redlock_never",
        span = Span::mixed_site().located_at(ty_span)
    );
    let typed_return = quote! {
        if let ::redlock_runtime::__private::Some(#never) =
            ::redlock_runtime::__private::Option::<#body_type>::None
        {
            return #never;
        }
    };

    // The body is a block inside the async block (its own scope: a `use` in it shadows
    // nothing the expansion names). As the tail of another block, a one-line body such
    // as `{ save(id).await }` is what rustc's `unused_braces` lints ("unnecessary braces
    // around block return value"), on the user's braces, with a fix that removes them and
    // breaks the function. The braces' span keeps their location but belongs to the
    // expansion (call-site hygiene, which braces do not use), and rustc lints no braces
    // that come from an expansion. Only the braces: every token inside keeps its own
    // span, so the user's code is linted as before. tests/ui/pass/no_warnings.rs.
    let mut body = body.clone();
    body.set_span(Span::call_site().located_at(body.span()));

    quote! {
        #(#attrs)*
        #vis #sig {
            #let_keys
            let #client_var = #client;
            let #body_var = async move {
                #typed_return
                #body
            };
            #run
        }
    }
}
