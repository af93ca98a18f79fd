//! Accumulated errors, reported together (like serde_derive's `Ctxt`).

use proc_macro2::TokenStream;

/// Every error found so far; all of them reach the user, each on its own token.
#[derive(Default)]
pub(crate) struct Errors {
    combined: Option<syn::Error>,
}

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.combined {
            Some(combined) => combined.combine(error),
            None => self.combined = Some(error),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.combined.is_none()
    }

    /// The `compile_error!` invocations, or nothing.
    pub(crate) fn into_compile_errors(self) -> TokenStream {
        self.combined
            .map(syn::Error::into_compile_error)
            .unwrap_or_default()
    }

    /// Each error's message, in the order found.
    #[cfg(test)]
    pub(crate) fn messages(&self) -> Vec<String> {
        self.combined
            .iter()
            .flat_map(|combined| combined.clone().into_iter().map(|e| e.to_string()))
            .collect()
    }
}
