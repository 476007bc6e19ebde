//! Collects every error a macro finds, so one compile reports all of them together
//! (serde's `internals/ctxt.rs`).

use proc_macro2::TokenStream;

/// The errors found so far.
#[derive(Default)]
pub(crate) struct Errors {
    first: Option<syn::Error>,
}

impl Errors {
    /// Records `err`.
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.first {
            Some(first) => first.combine(err),
            None => self.first = Some(err),
        }
    }

    /// Whether nothing went wrong.
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The errors as `compile_error!` invocations (empty when there are none).
    pub(crate) fn into_compile_errors(self) -> TokenStream {
        self.first
            .map(|e| e.into_compile_error())
            .unwrap_or_default()
    }
}
