//! Checks the function against the arguments, then generates the wrapped function.
//!
//! ```text
//! #(#attrs)* #vis #sig {
//!     let __key = format!("order:{}", id);            // before the body moves `id`
//!     let __client = Some(client_from(&(self.locks)));  // or None: the default client
//!     let __body = typed_body::<#return_type, _>(async move #body);
//!     run_locked(__client, __key, LockSpec { .. }, __body).await
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

use crate::args::{self, Args, ArgsParser, WithSpan};
use crate::errors::Errors;
use crate::item::LockedFn;
use crate::key::{self, Field, Part, Placeholder};

pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();

    let mut parser = ArgsParser::new(&mut errors);
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
    let key = args
        .key
        .as_ref()
        .map(|lit| key_expression(lit, &function.sig, &mut errors));

    match (return_type, key) {
        (Some(return_type), Some(key)) if errors.is_empty() => {
            generate(&function, &args, return_type, key)
        }
        _ => with_errors(item, errors),
    }
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
        Some(ty) if last_segment_is(ty, "Result") => Some(ty),
        Some(ty) if sig.asyncness.is_some() || !last_segment_is(ty, "Pin") => {
            errors.push(syn::Error::new_spanned(
                ty,
                "#[distributed_lock] functions must return a `Result<T, E>` whose error type \
                 implements `From<redlock_runtime::LockError>`, so a failure to lock can be \
                 returned: change the return type to e.g. `Result<T, LockError>`",
            ));
            None
        }
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
                Pat::Ident(pat) => {
                    out.push((pat.ident.unraw().to_string(), Binding::Param(pat.ident.clone())))
                }
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

fn resolve(
    placeholder: &Placeholder,
    bindings: &[(String, Binding)],
    sig: &Signature,
    span: Span,
) -> Result<TokenStream, String> {
    let root_name = placeholder.root.strip_prefix("r#").unwrap_or(&placeholder.root);
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
    let fields = placeholder.fields.iter().map(|field| match field {
        Field::Named(name) => match name.strip_prefix("r#") {
            Some(raw) => Ident::new_raw(raw, span).into_token_stream(),
            None => Ident::new(name, span).into_token_stream(),
        },
        Field::Index(index) => syn::Index {
            index: *index,
            span,
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

fn generate(function: &LockedFn, args: &Args, return_type: &Type, key: TokenStream) -> TokenStream {
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
            ::redlock_runtime::__private::Option::Some(::redlock_runtime::__private::client_from(&(#expr)))
        },
        None => quote!(::redlock_runtime::__private::Option::None),
    };
    let wait = duration(args.wait.as_ref().map_or(Duration::ZERO, |w| w.value));
    let lease = optional_duration(args.lease.as_ref());
    let hold_at_least = optional_duration(args.hold_at_least.as_ref());
    let abort_on_lost = args.abort_on_lost;

    // Spanned on the return type: an error type without `From<LockError>` is reported there.
    let run = quote_spanned! {return_type.span()=>
        ::redlock_runtime::__private::run_locked(
            #client_var,
            #key_var,
            ::redlock_runtime::__private::LockSpec {
                wait: #wait,
                lease: #lease,
                hold_at_least: #hold_at_least,
                abort_on_lost: #abort_on_lost,
            },
            #body_var,
        ).await
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            let #key_var: ::redlock_runtime::__private::String = #key;
            let #client_var = #client;
            let #body_var = ::redlock_runtime::__private::typed_body::<#return_type, _>(
                async move #body
            );
            #run
        }
    }
}
