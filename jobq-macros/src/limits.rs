//! The limit keys of `#[job]`: `concurrency = N`, `concurrency_key = field`,
//! `rate = "N/s"` (or `/min`, `/h`), `rate_key = field`, `burst = N`. Parsed and related
//! to each other here; expanded to the kind's `LIMITS` and its key functions.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::meta::ParseNestedMeta;
use syn::{Ident, LitInt, LitStr, Token};

use crate::attr::Spanned;
use crate::ctxt::Errors;

/// The limit keys of one `#[job(...)]`.
#[derive(Default)]
pub(crate) struct LimitsAttr {
    pub(crate) concurrency: Option<Spanned<u32>>,
    pub(crate) concurrency_key: Option<Ident>,
    /// `(count, seconds per period)`.
    pub(crate) rate: Option<Spanned<(u32, u32)>>,
    pub(crate) rate_key: Option<Ident>,
    pub(crate) burst: Option<Spanned<u32>>,
}

/// `concurrency = N` or `burst = N`: a whole number of at least 1.
pub(crate) fn parse_count(meta: &ParseNestedMeta<'_>, key: &str) -> syn::Result<Spanned<u32>> {
    let message = format!(
        "`{key}` takes a whole number from 1 to {}, like `{key} = 5`",
        i32::MAX
    );
    if !meta.input.peek(Token![=]) {
        return Err(meta.error(format!("expected `{key} = 5`")));
    }
    let input = meta.value()?;
    let span = input.span();
    let lit = input
        .parse::<LitInt>()
        .map_err(|_| syn::Error::new(span, &message))?;
    let value = lit
        .base10_parse::<u32>()
        .ok()
        .filter(|v| *v >= 1 && *v <= i32::MAX as u32 && lit.suffix().is_empty())
        .ok_or_else(|| syn::Error::new(lit.span(), &message))?;
    Ok(Spanned {
        value,
        span: lit.span(),
    })
}

/// `rate = "100/s"`: a count of at least 1 per `s`, `min` or `h`.
pub(crate) fn parse_rate(meta: &ParseNestedMeta<'_>) -> syn::Result<Spanned<(u32, u32)>> {
    const MESSAGE: &str = "`rate` takes a string like `\"100/s\"`, `\"10/min\"` or `\"5/h\"` (a count of at least 1 per second, minute or hour)";
    if !meta.input.peek(Token![=]) {
        return Err(meta.error("expected `rate = \"100/s\"`"));
    }
    let input = meta.value()?;
    let span = input.span();
    let lit = input
        .parse::<LitStr>()
        .map_err(|_| syn::Error::new(span, MESSAGE))?;
    rate(&lit.value())
        .map(|value| Spanned {
            value,
            span: lit.span(),
        })
        .ok_or_else(|| syn::Error::new(lit.span(), MESSAGE))
}

fn rate(text: &str) -> Option<(u32, u32)> {
    let (n, unit) = text.split_once('/')?;
    let n: u32 = n
        .trim()
        .parse()
        .ok()
        .filter(|n| *n >= 1 && *n <= i32::MAX as u32)?;
    let secs = match unit.trim() {
        "s" => 1,
        "min" => 60,
        "h" => 3600,
        _ => return None,
    };
    Some((n, secs))
}

/// `concurrency_key = field` / `rate_key = field`.
pub(crate) fn parse_field(meta: &ParseNestedMeta<'_>, key: &str) -> syn::Result<Ident> {
    let example = format!("{key} = destination");
    if !meta.input.peek(Token![=]) {
        return Err(meta.error(format!("expected `{example}`")));
    }
    meta.value()?.parse::<Ident>().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{key}` takes a field of the args type, like `{example}`"),
        )
    })
}

/// Relates the keys: a key or a burst needs its limit.
pub(crate) fn check(l: &LimitsAttr, errors: &mut Errors) {
    if let (Some(key), None) = (&l.concurrency_key, &l.concurrency) {
        errors.push(syn::Error::new(
            key.span(),
            "`concurrency_key` needs `concurrency = N`: the most running jobs per key",
        ));
    }
    if let (Some(key), None) = (&l.rate_key, &l.rate) {
        errors.push(syn::Error::new(
            key.span(),
            "`rate_key` needs `rate = \"N/s\"`: each key's rate",
        ));
    }
    if let (Some(burst), None) = (&l.burst, &l.rate) {
        errors.push(syn::Error::new(
            burst.span,
            "`burst` needs `rate = \"N/s\"`: it is the size of the rate's bucket",
        ));
    }
}

/// `const LIMITS` and the key functions, or nothing without limits.
pub(crate) fn expand(l: &LimitsAttr, p: &TokenStream) -> TokenStream {
    let mut chain = TokenStream::new();
    if let Some(c) = &l.concurrency {
        let n = c.value;
        chain.extend(quote_spanned!(c.span=> .concurrency(#n)));
    }
    if l.concurrency_key.is_some() {
        chain.extend(quote!(.per_key()));
    }
    if let Some(r) = &l.rate {
        let (n, secs) = r.value;
        let ctor = match secs {
            1 => quote!(per_second),
            60 => quote!(per_minute),
            _ => quote!(per_hour),
        };
        chain.extend(quote_spanned!(r.span=> .rate(#p::Rate::#ctor(#n))));
    }
    if let Some(b) = &l.burst {
        let n = b.value;
        chain.extend(quote_spanned!(b.span=> .burst(#n)));
    }
    if l.rate_key.is_some() {
        chain.extend(quote!(.rate_per_key()));
    }
    if chain.is_empty() {
        return chain;
    }
    let key_fn = |name: &str, field: &Option<Ident>| {
        field.as_ref().map(|field| {
            let f = Ident::new(name, Span::call_site());
            // `args.<field>` carries the user's span: a missing field or one without
            // `Display` is reported at their token.
            let access = quote_spanned!(field.span()=> (*args).#field);
            quote! {
                fn #f(
                    args: &<Self as #p::Job>::Args,
                ) -> ::core::option::Option<::std::string::String> {
                    ::core::option::Option::Some(::std::string::ToString::to_string(&#access))
                }
            }
        })
    };
    let ckey = key_fn("concurrency_key", &l.concurrency_key);
    let rkey = key_fn("rate_key", &l.rate_key);
    quote! {
        const LIMITS: #p::KindLimits = #p::KindLimits::NONE #chain;
        #ckey
        #rkey
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rates() {
        assert_eq!(super::rate("100/s"), Some((100, 1)));
        assert_eq!(super::rate("10/min"), Some((10, 60)));
        assert_eq!(super::rate("5 / h"), Some((5, 3600)));
        assert_eq!(super::rate("0/s"), None);
        assert_eq!(super::rate("10/d"), None);
        assert_eq!(super::rate("10"), None);
    }
}
