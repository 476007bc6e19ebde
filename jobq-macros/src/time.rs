//! The `#[job]` keys about time and uniqueness — `cron`, `tz`, `every`, `missed`,
//! `unique(...)`, `debounce`, `max_age`, `version` — parsed (`parse_*`, called from
//! `attr`), related to each other (`check`) and written out (`expand`); and
//! `#[jobq::upgrade(from = N)]`.

use std::str::FromStr;

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::meta::ParseNestedMeta;
use syn::punctuated::Punctuated;
use syn::{Ident, LitInt, LitStr, Token};

use crate::attr::Spanned as At;
use crate::ctxt::Errors;
use crate::grammar::{self, Millis};

/// The keys of this module, each `None` when not given.
#[derive(Default)]
pub(crate) struct TimeAttr {
    pub(crate) cron: Option<LitStr>,
    pub(crate) tz: Option<LitStr>,
    pub(crate) every: Option<At<Millis>>,
    pub(crate) missed: Option<At<Missed>>,
    pub(crate) unique: Option<UniqueAttr>,
    pub(crate) debounce: Option<At<Millis>>,
    pub(crate) max_age: Option<At<Millis>>,
    pub(crate) version: Option<At<u32>>,
}

/// `missed = "skip" | "once" | "all(max = N)"`.
#[derive(Clone, Copy)]
pub(crate) enum Missed {
    Skip,
    Once,
    All(u32),
}

/// `unique(by = [..], period = "..", states = [..])`.
pub(crate) struct UniqueAttr {
    pub(crate) by: Vec<Ident>,
    pub(crate) period: Option<At<Millis>>,
    pub(crate) states: Vec<Ident>,
}

const STATES: &[(&str, &str)] = &[
    ("pending", "Pending"),
    ("running", "Running"),
    ("done", "Done"),
    ("failed", "Failed"),
    ("cancelled", "Cancelled"),
];

fn lit(meta: &ParseNestedMeta<'_>, key: &str, example: &str) -> syn::Result<LitStr> {
    if !meta.input.peek(Token![=]) {
        return Err(meta.error(format!("expected `{example}`")));
    }
    meta.value()?.parse::<LitStr>().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{key}` takes a string literal, like `{example}`"),
        )
    })
}

fn duration(meta: &ParseNestedMeta<'_>, key: &str, example: &str) -> syn::Result<At<Millis>> {
    let l = lit(meta, key, example)?;
    let value = grammar::duration(&l.value())
        .map_err(|msg| syn::Error::new(l.span(), format!("`{key}`: {msg}")))?;
    if value == Millis(0) {
        return Err(syn::Error::new(
            l.span(),
            format!("`{key}` must be longer than 0"),
        ));
    }
    Ok(At {
        value,
        span: l.span(),
    })
}

/// `cron = "0 3 * * *"`: checked with the runtime's parser (seconds optional).
pub(crate) fn parse_cron(meta: &ParseNestedMeta<'_>) -> syn::Result<LitStr> {
    let l = lit(meta, "cron", "cron = \"0 3 * * *\"")?;
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(&l.value())
        .map_err(|e| {
            syn::Error::new(
                l.span(),
                format!(
                    "`cron`: `{}` is not a cron expression: {e} (5 fields, or 6 with seconds first)",
                    l.value()
                ),
            )
        })?;
    Ok(l)
}

/// `tz = "Europe/Berlin"`: an IANA zone name.
pub(crate) fn parse_tz(meta: &ParseNestedMeta<'_>) -> syn::Result<LitStr> {
    let l = lit(meta, "tz", "tz = \"Europe/Berlin\"")?;
    chrono_tz::Tz::from_str(&l.value()).map_err(|_| {
        syn::Error::new(
            l.span(),
            format!(
                "`tz`: unknown time zone `{}`; use an IANA name like `Europe/Berlin` or `UTC`",
                l.value()
            ),
        )
    })?;
    Ok(l)
}

pub(crate) fn parse_every(meta: &ParseNestedMeta<'_>) -> syn::Result<At<Millis>> {
    duration(meta, "every", "every = \"15m\"")
}

pub(crate) fn parse_debounce(meta: &ParseNestedMeta<'_>) -> syn::Result<At<Millis>> {
    duration(meta, "debounce", "debounce = \"30s\"")
}

pub(crate) fn parse_max_age(meta: &ParseNestedMeta<'_>) -> syn::Result<At<Millis>> {
    duration(meta, "max_age", "max_age = \"24h\"")
}

pub(crate) fn parse_missed(meta: &ParseNestedMeta<'_>) -> syn::Result<At<Missed>> {
    let l = lit(meta, "missed", "missed = \"once\"")?;
    let text: String = l.value().chars().filter(|c| !c.is_whitespace()).collect();
    let value = match text.as_str() {
        "skip" => Some(Missed::Skip),
        "once" => Some(Missed::Once),
        t => t
            .strip_prefix("all(max=")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| *n >= 1)
            .map(Missed::All),
    };
    value
        .map(|value| At {
            value,
            span: l.span(),
        })
        .ok_or_else(|| {
            syn::Error::new(
                l.span(),
                "`missed` takes `\"skip\"`, `\"once\"` or `\"all(max = N)\"` with N at least 1",
            )
        })
}

pub(crate) fn parse_version(meta: &ParseNestedMeta<'_>) -> syn::Result<At<u32>> {
    const MESSAGE: &str = "`version` takes a whole number from 1 (the payload version new \
                           jobs are stored with), like `version = 2`";
    if !meta.input.peek(Token![=]) {
        return Err(meta.error("expected `version = 2`"));
    }
    let input = meta.value()?;
    let span = input.span();
    let l = input
        .parse::<LitInt>()
        .map_err(|_| syn::Error::new(span, MESSAGE))?;
    match l.base10_parse::<u32>() {
        Ok(v) if v >= 1 && l.suffix().is_empty() => Ok(At {
            value: v,
            span: l.span(),
        }),
        _ => Err(syn::Error::new(l.span(), MESSAGE)),
    }
}

fn idents(input: syn::parse::ParseStream<'_>) -> syn::Result<Vec<Ident>> {
    let content;
    syn::bracketed!(content in input);
    Ok(Punctuated::<Ident, Token![,]>::parse_terminated(&content)?
        .into_iter()
        .collect())
}

/// `unique`, or `unique(by = [a, b], period = "1h", states = [pending, running])`.
pub(crate) fn parse_unique(meta: &ParseNestedMeta<'_>) -> syn::Result<UniqueAttr> {
    let mut out = UniqueAttr {
        by: Vec::new(),
        period: None,
        states: Vec::new(),
    };
    if !meta.input.peek(syn::token::Paren) {
        return Ok(out);
    }
    meta.parse_nested_meta(|m| {
        let key = m.path.get_ident().map(ToString::to_string);
        match key.as_deref() {
            Some("by") => {
                let input = m.value()?;
                out.by = idents(input).map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`by` takes a list of fields of the args type, like `by = [customer_id]`",
                    )
                })?;
            }
            Some("period") => out.period = Some(duration(&m, "period", "period = \"1h\"")?),
            Some("states") => {
                let input = m.value()?;
                let states = idents(input)?;
                for s in &states {
                    if !STATES.iter().any(|(n, _)| s == n) {
                        return Err(syn::Error::new(
                            s.span(),
                            format!(
                                "unknown state `{s}`; expected some of `pending`, `running`, \
                                 `done`, `failed`, `cancelled`"
                            ),
                        ));
                    }
                }
                out.states = states;
            }
            _ => {
                return Err(m.error(
                    "unknown `unique` key; expected `by = [fields]`, `period = \"1h\"` or \
                     `states = [pending, running]`",
                ));
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// Relates the keys to each other.
pub(crate) fn check(t: &TimeAttr, errors: &mut Errors) {
    if let (Some(cron), Some(every)) = (&t.cron, &t.every) {
        let mut e = syn::Error::new(
            every.span,
            "`every` and `cron` cannot both be given: a schedule is one or the other",
        );
        e.combine(syn::Error::new(cron.span(), "`cron` given here"));
        errors.push(e);
    }
    if let Some(tz) = &t.tz
        && t.cron.is_none()
    {
        errors.push(syn::Error::new(
            tz.span(),
            "`tz` applies to a `cron` expression; add `cron = \"...\"` or remove `tz`",
        ));
    }
    if let Some(m) = &t.missed
        && t.cron.is_none()
        && t.every.is_none()
    {
        errors.push(syn::Error::new(
            m.span,
            "`missed` applies to a periodic job; add `cron = \"...\"` or `every = \"...\"`",
        ));
    }
}

fn duration_tokens(d: Millis) -> TokenStream {
    let millis = Literal::u64_unsuffixed(d.0);
    quote!(::core::time::Duration::from_millis(#millis))
}

/// The `Job` impl's items for these keys.
pub(crate) fn expand(t: &TimeAttr, p: &TokenStream, args_ty: &syn::Type) -> TokenStream {
    let mut out = TokenStream::new();
    if let Some(v) = &t.version {
        let lit = Literal::u32_unsuffixed(v.value);
        out.extend(quote_spanned!(v.span=> const VERSION: u32 = #lit;));
        if v.value > 1 {
            out.extend(decode(v, p, args_ty));
        }
    }
    if let Some(d) = &t.max_age {
        let d = duration_tokens(d.value);
        out.extend(quote! {
            const MAX_AGE: ::core::option::Option<::core::time::Duration> =
                ::core::option::Option::Some(#d);
        });
    }
    if let Some(d) = &t.debounce {
        let d = duration_tokens(d.value);
        out.extend(quote! {
            const DEBOUNCE: ::core::option::Option<::core::time::Duration> =
                ::core::option::Option::Some(#d);
        });
    }
    if let Some(u) = &t.unique {
        let period = u.period.as_ref().map(|d| {
            let d = duration_tokens(d.value);
            quote!(.period(#d))
        });
        let states = (!u.states.is_empty()).then(|| {
            let states = u.states.iter().map(|s| {
                let variant = STATES
                    .iter()
                    .find(|(n, _)| s == n)
                    .map_or("Pending", |(_, v)| v);
                let variant = Ident::new(variant, s.span());
                quote!(#p::UniqueState::#variant)
            });
            quote!(.states(&[#(#states),*]))
        });
        out.extend(quote! {
            const UNIQUE: ::core::option::Option<#p::Unique> =
                ::core::option::Option::Some(#p::Unique::new() #period #states);
        });
        if !u.by.is_empty() {
            // `(*args).<field>` carries the user's span: a field that does not exist is
            // reported at their token.
            let fields = u.by.iter().map(|f| quote_spanned!(f.span()=> &(*args).#f));
            out.extend(quote! {
                fn unique_key(
                    args: &<Self as #p::Job>::Args,
                ) -> ::core::option::Option<#p::serde_json::Value> {
                    #p::serde_json::to_value((#(#fields,)*)).ok()
                }
            });
        }
    }
    let schedule = match (&t.cron, &t.every) {
        (Some(cron), _) => {
            let tz = t.tz.as_ref().map(|tz| quote!(.tz(#tz)));
            Some((cron.span(), quote!(#p::Schedule::cron(#cron) #tz)))
        }
        (None, Some(every)) => {
            let d = duration_tokens(every.value);
            Some((every.span, quote!(#p::Schedule::every(#d))))
        }
        (None, None) => None,
    };
    if let Some((span, schedule)) = schedule {
        let missed = t.missed.as_ref().map(|m| {
            let policy = match m.value {
                Missed::Skip => quote!(#p::Missed::Skip),
                Missed::Once => quote!(#p::Missed::Once),
                Missed::All(max) => {
                    let max = Literal::u32_unsuffixed(max);
                    quote!(#p::Missed::All { max: #max })
                }
            };
            quote!(.missed(#policy))
        });
        // Spanned at the expression: args that are not `Default` are reported there.
        let args = quote_spanned!(span=> <#args_ty as ::core::default::Default>::default());
        out.extend(quote! {
            fn periodic() -> ::core::option::Option<(#p::Schedule, <Self as #p::Job>::Args)> {
                ::core::option::Option::Some((#schedule #missed, #args))
            }
        });
    }
    out
}

/// `decode` for `version = N > 1`: each older version `v` decodes as the `From` type of
/// the chain's link `v` and is upgraded link by link; a missing link is reported at
/// `version`.
fn decode(v: &At<u32>, p: &TokenStream, args_ty: &syn::Type) -> TokenStream {
    let n = v.value;
    let mut arms = Vec::new();
    // `ty` is the type of version `k`, written through the chain from the current one.
    let mut ty = quote!(#args_ty);
    let mut ups: Vec<TokenStream> = Vec::new();
    for k in (1..n).rev() {
        let from = Literal::u32_unsuffixed(k);
        let link = quote_spanned!(v.span=> <#ty as #p::Upgrade<#from>>);
        ups.insert(0, quote!(#link::upgrade));
        let old = quote!(#link::From);
        let chain = ups.iter().fold(quote!(old), |acc, up| quote!(#up(#acc)));
        arms.push(quote! {
            #from => {
                let old: #old = #p::decode_as(<Self as #p::Job>::KIND, version, payload)?;
                ::core::result::Result::Ok(#chain)
            }
        });
        ty = old;
    }
    let current = Literal::u32_unsuffixed(n);
    quote! {
        fn decode(
            version: u32,
            payload: &str,
        ) -> ::core::result::Result<<Self as #p::Job>::Args, #p::DecodeError> {
            match version {
                #current => #p::decode_as(<Self as #p::Job>::KIND, version, payload),
                #(#arms)*
                _ => ::core::result::Result::Err(#p::DecodeError::unknown_version(
                    <Self as #p::Job>::KIND, version, #current,
                )),
            }
        }
    }
}

/// `#[jobq::upgrade(from = N)] fn up(old: Old) -> New`: implements `Upgrade<N>` for `New`.
pub(crate) fn upgrade(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let e = syn::Error::new(
                Span::call_site(),
                "`#[jobq::upgrade(from = N)]` goes on a function `fn up(old: OldArgs) -> NewArgs`",
            )
            .into_compile_error();
            return quote!(#item #e);
        }
    };
    let mut from: Option<u32> = None;
    let mut krate: Option<syn::Path> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("from") {
            let l: LitInt = meta.value()?.parse()?;
            match l.base10_parse::<u32>() {
                Ok(v) if v >= 1 => from = Some(v),
                _ => {
                    return Err(syn::Error::new(
                        l.span(),
                        "`from` takes the payload version this upgrades, at least 1",
                    ));
                }
            }
            Ok(())
        } else if meta.path.is_ident("crate") {
            let l: LitStr = meta.value()?.parse()?;
            krate = Some(l.parse()?);
            Ok(())
        } else {
            Err(meta.error("unknown `upgrade` key; expected `from = N`"))
        }
    });
    let mut errors = Errors::default();
    if let Err(e) = syn::parse::Parser::parse2(parser, args) {
        errors.push(e);
    }
    let sig = &func.sig;
    let old_ty = match sig.inputs.iter().collect::<Vec<_>>().as_slice() {
        [syn::FnArg::Typed(pt)] => Some(pt.ty.clone()),
        _ => {
            errors.push(syn::Error::new_spanned(
                &sig.inputs,
                "an upgrade takes exactly one parameter, the old args: `fn up(old: OldArgs) -> NewArgs`",
            ));
            None
        }
    };
    let new_ty = match &sig.output {
        syn::ReturnType::Type(_, ty) => Some(ty.clone()),
        syn::ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.paren_token.span.close(),
                "an upgrade returns the new args: `fn up(old: OldArgs) -> NewArgs`",
            ));
            None
        }
    };
    if from.is_none() && errors.is_empty() {
        errors.push(syn::Error::new(
            Span::call_site(),
            "`#[jobq::upgrade]` needs `from = N`, the payload version it upgrades",
        ));
    }
    let (Some(from), Some(old_ty), Some(new_ty), true) = (from, old_ty, new_ty, errors.is_empty())
    else {
        let errors = errors.into_compile_errors();
        return quote!(#[allow(dead_code)] #func #errors);
    };
    let krate = krate.unwrap_or_else(|| syn::parse_quote!(::jobq));
    let p = quote!(#krate::__private);
    let name = &sig.ident;
    let from = Literal::u32_unsuffixed(from);
    quote! {
        #func

        impl #p::Upgrade<#from> for #new_ty {
            type From = #old_ty;
            fn upgrade(old: #old_ty) -> Self {
                #name(old)
            }
        }
    }
}
