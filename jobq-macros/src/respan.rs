//! Re-spanning generated tokens at a user's token, so a type error in generated code is
//! reported where the user wrote the thing it is about.

use proc_macro2::{Span, TokenStream};

/// `tokens` with every span set to `span`.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = proc_macro2::TokenTree::Group(group);
            }
            tt.set_span(span);
            tt
        })
        .collect()
}
