//! The annotated function, with only its signature parsed.
//!
//! The body stays raw tokens (like tokio-macros): half-typed code still expands, and
//! the body is re-emitted exactly as written.

use proc_macro2::{Delimiter, Group, TokenTree};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Signature, Visibility};

pub(crate) struct LockedFn {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub sig: Signature,
    /// `{ ... }`, unparsed.
    pub body: Group,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        let body = match input.parse::<TokenTree>() {
            Ok(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => group,
            _ => {
                return Err(syn::Error::new(
                    sig.ident.span(),
                    "#[distributed_lock] needs a function with a body: the lock is taken around it",
                ));
            }
        };
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after the function body"));
        }
        Ok(LockedFn {
            attrs,
            vis,
            sig,
            body,
        })
    }
}
