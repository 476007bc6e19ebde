//! Procedural macros for jobq: `#[job]` and `#[derive(Classify)]`. Use them through the
//! `jobq` crate's re-exports (`jobq::job`, `jobq::Classify`); their documentation lives
//! there.
//!
//! The entry points only dispatch: `attr` parses the `#[job(...)]` keys, `check`
//! validates the handler's signature and the keys against each other, `expand` writes
//! the code, `classify` is the `Classify` derive and `event` the `Event` derive. Every mistake becomes a `syn::Error` at the
//! user's token; nothing here panics.

mod attr;
mod case;
mod check;
mod classify;
mod ctxt;
mod event;
mod expand;
mod grammar;
mod limits;
mod respan;
mod time;

use proc_macro::TokenStream;

/// (Implemented in `jobq-macros`; use it as `jobq::job`.)
#[proc_macro_attribute]
pub fn job(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::job(args.into(), item.into()).into()
}

/// (Implemented in `jobq-macros`; use it as `jobq::upgrade`.)
#[proc_macro_attribute]
pub fn upgrade(args: TokenStream, item: TokenStream) -> TokenStream {
    time::upgrade(args.into(), item.into()).into()
}

/// (Implemented in `jobq-macros`; use it as `jobq::Classify`.)
#[proc_macro_derive(Classify, attributes(jobq))]
pub fn derive_classify(input: TokenStream) -> TokenStream {
    classify::derive(input.into()).into()
}

/// (Implemented in `jobq-macros`; use it as `jobq::Event`.)
#[proc_macro_derive(Event, attributes(event))]
pub fn derive_event(input: TokenStream) -> TokenStream {
    event::derive(input.into()).into()
}
