//! `#[derive(Classify)]`: enums (`#[jobq(...)]` on each variant) and structs (on the
//! type). An unannotated variant or struct is retryable, with the snake_case of its name
//! as its code.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{
    Attribute, Data, DeriveInput, Fields, Ident, Index, LitInt, LitStr, Member, Path, Token,
};

use crate::case;
use crate::ctxt::Errors;

const KEYS: &str = "`retryable`, `permanent`, `cancel`, `code = \"...\"`, `retry_after = field`";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Disposition {
    Retryable,
    Permanent,
    Cancel,
}

impl Disposition {
    fn key(self) -> &'static str {
        match self {
            Disposition::Retryable => "retryable",
            Disposition::Permanent => "permanent",
            Disposition::Cancel => "cancel",
        }
    }

    fn variant(self) -> Ident {
        let name = match self {
            Disposition::Retryable => "Retryable",
            Disposition::Permanent => "Permanent",
            Disposition::Cancel => "Cancel",
        };
        Ident::new(name, Span::call_site())
    }
}

/// What the `#[jobq(...)]` attributes of one item say.
#[derive(Default)]
struct Rule {
    disposition: Option<(Disposition, Span)>,
    code: Option<LitStr>,
    retry_after: Option<Member>,
    krate: Option<Path>,
}

/// Where the attributes sit, which decides the keys allowed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// On a struct: every key, and `crate`.
    Struct,
    /// On an enum: `crate` only.
    Enum,
    /// On a variant: every key but `crate`.
    Variant,
}

/// `#[derive(Classify)]` on `input`.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(err) => return err.into_compile_error(),
    };
    let mut errors = Errors::default();
    let place = match &input.data {
        Data::Enum(_) => Place::Enum,
        _ => Place::Struct,
    };
    let container = parse_rule(&input.attrs, place, &mut errors);
    let krate = container
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::jobq));
    let p = quote!(#krate::__private);
    let body = match &input.data {
        Data::Struct(data) => {
            check_fields(&data.fields, &mut errors);
            let code = case::snake(&input.ident.unraw().to_string());
            let arm = arm(
                &p,
                quote!(Self),
                &input.ident,
                &data.fields,
                container,
                code,
                &mut errors,
            );
            quote!(match self { #arm })
        }
        Data::Enum(data) if data.variants.is_empty() => quote!(match *self {}),
        Data::Enum(data) => {
            let arms: Vec<TokenStream> = data
                .variants
                .iter()
                .map(|v| {
                    let rule = parse_rule(&v.attrs, Place::Variant, &mut errors);
                    check_fields(&v.fields, &mut errors);
                    let ident = &v.ident;
                    let code = case::snake(&ident.unraw().to_string());
                    arm(
                        &p,
                        quote!(Self::#ident),
                        ident,
                        &v.fields,
                        rule,
                        code,
                        &mut errors,
                    )
                })
                .collect();
            quote!(match self { #(#arms)* })
        }
        Data::Union(data) => {
            errors.push(syn::Error::new(
                data.union_token.span,
                "`Classify` can be derived for enums and structs, not unions; implement \
                 `jobq::Classify` by hand",
            ));
            TokenStream::new()
        }
    };
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let (body, errors) = if errors.is_empty() {
        (body, TokenStream::new())
    } else {
        // Still implement the trait, so the only messages are the ones below.
        (quote!(::core::unreachable!()), errors.into_compile_errors())
    };
    quote! {
        #[automatically_derived]
        impl #impl_generics #p::Classify for #name #ty_generics #where_clause {
            fn classify(&self) -> #p::Classification {
                #body
            }
        }
        #errors
    }
}

/// One match arm: `pattern => classification,`.
fn arm(
    p: &TokenStream,
    path: TokenStream,
    ident: &Ident,
    fields: &Fields,
    rule: Rule,
    default_code: String,
    errors: &mut Errors,
) -> TokenStream {
    let disposition = rule.disposition.map_or(Disposition::Retryable, |(d, _)| d);
    let code = LitStr::new(
        &rule.code.map_or(default_code, |c| c.value()),
        Span::call_site(),
    );
    let variant = disposition.variant();
    let mut pattern = quote!(#path { .. });
    let mut after = quote!(::core::option::Option::None);
    if let Some(member) = rule.retry_after {
        let span = member.span();
        if disposition == Disposition::Retryable {
            match field_exists(ident, fields, &member) {
                Ok(()) => {
                    let binding = Ident::new("retry_after", span);
                    pattern = quote!(#path { #member: #binding, .. });
                    // Spanned at the user's field name, path included: a field that is
                    // not a `Duration` is reported there.
                    let p = crate::respan::respan(p.clone(), span);
                    after = quote_spanned!(span=> #p::RetryAfter::retry_after(#binding));
                }
                Err(err) => errors.push(err),
            }
        } else {
            errors.push(syn::Error::new(
                span,
                format!(
                    "`retry_after` only applies to retryable failures, and `{ident}` is \
                     `{}`; remove `retry_after` or mark it `retryable`",
                    disposition.key()
                ),
            ));
        }
    }
    quote! {
        #pattern => #p::classification(#p::Disposition::#variant, #code, #after),
    }
}

/// Whether `member` names a field of `fields`, with a message listing them if not.
fn field_exists(ident: &Ident, fields: &Fields, member: &Member) -> syn::Result<()> {
    let found = fields.members().any(|m| m == *member);
    if found {
        return Ok(());
    }
    let names: Vec<String> = fields
        .members()
        .map(|m| match m {
            Member::Named(n) => format!("`{n}`"),
            Member::Unnamed(i) => format!("`{}`", i.index),
        })
        .collect();
    let shown = match member {
        Member::Named(n) => n.to_string(),
        Member::Unnamed(i) => i.index.to_string(),
    };
    let msg = if names.is_empty() {
        format!(
            "`{ident}` has no fields, so `retry_after = {shown}` names nothing; \
             `retry_after` takes a field of type `Duration`"
        )
    } else {
        format!(
            "`{ident}` has no field `{shown}`; `retry_after` takes one of its fields, of \
             type `Duration`: {}",
            names.join(", ")
        )
    };
    Err(syn::Error::new(member.span(), msg))
}

/// `#[jobq(...)]` on a field is a mistake: say where it goes.
fn check_fields(fields: &Fields, errors: &mut Errors) {
    for field in fields {
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("jobq")) {
            errors.push(syn::Error::new_spanned(
                attr,
                "`#[jobq(...)]` goes on the error type or on a variant, not on a field; \
                 to use a field as the Retry-After, write `#[jobq(retry_after = field)]` on \
                 its variant",
            ));
        }
    }
}

/// Parses every `#[jobq(...)]` in `attrs`, recording mistakes in `errors`.
fn parse_rule(attrs: &[Attribute], place: Place, errors: &mut Errors) -> Rule {
    let mut rule = Rule::default();
    let mut seen: Vec<String> = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("jobq")) {
        let result = attr.parse_nested_meta(|meta| {
            let key = meta.path.get_ident().map(ToString::to_string);
            let result = one_key(&meta, key.as_deref(), place, &seen, &mut rule);
            if let Some(k) = key {
                seen.push(k);
            }
            if let Err(err) = result {
                errors.push(err);
                while !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                    meta.input.parse::<proc_macro2::TokenTree>()?;
                }
            }
            Ok(())
        });
        if let Err(err) = result {
            errors.push(err);
        }
    }
    rule
}

fn one_key(
    meta: &ParseNestedMeta<'_>,
    key: Option<&str>,
    place: Place,
    seen: &[String],
    rule: &mut Rule,
) -> syn::Result<()> {
    if let Some(k) = key
        && seen.iter().any(|s| s == k)
    {
        return Err(meta.error(format!("duplicate key `{k}`: each key may be given once")));
    }
    if place == Place::Enum {
        return match key {
            Some("crate") => crate_path(meta).map(|p| rule.krate = Some(p)),
            _ => Err(meta.error(
                "on an enum, `#[jobq(...)]` takes only `crate = \"...\"`; put `retryable`, \
                 `permanent`, `cancel`, `code` and `retry_after` on each variant",
            )),
        };
    }
    match key {
        Some(k @ ("retryable" | "permanent" | "cancel")) => {
            let d = match k {
                "retryable" => Disposition::Retryable,
                "permanent" => Disposition::Permanent,
                _ => Disposition::Cancel,
            };
            if !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                return Err(meta.error(format!("`{k}` is a flag: write `#[jobq({k})]`")));
            }
            if let Some((other, _)) = rule.disposition {
                return Err(meta.error(format!(
                    "`{k}` conflicts with `{}`: a failure is either retryable, permanent or \
                     cancel",
                    other.key()
                )));
            }
            rule.disposition = Some((d, meta.path.span()));
            Ok(())
        }
        Some("code") => {
            let lit: LitStr = value(meta, "code = \"rate_limited\"")?
                .parse()
                .map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`code` takes a string literal, like `code = \"rate_limited\"`",
                    )
                })?;
            if lit.value().trim().is_empty() {
                return Err(syn::Error::new(lit.span(), "`code` must not be empty"));
            }
            rule.code = Some(lit);
            Ok(())
        }
        Some("retry_after") => {
            let input = value(meta, "retry_after = wait")?;
            let member = if input.peek(LitInt) {
                let lit: LitInt = input.parse()?;
                let index = lit.base10_parse::<u32>()?;
                Member::Unnamed(Index {
                    index,
                    span: lit.span(),
                })
            } else {
                Member::Named(input.call(Ident::parse_any).map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`retry_after` takes a field name (or a tuple index like `0`) of type \
                         `Duration`, like `retry_after = wait`",
                    )
                })?)
            };
            rule.retry_after = Some(member);
            Ok(())
        }
        Some("crate") if place == Place::Struct => crate_path(meta).map(|p| rule.krate = Some(p)),
        Some("crate") => Err(meta.error("`crate = \"...\"` goes on the enum, not on a variant")),
        _ => Err(meta.error(format!(
            "unknown `jobq` key `{}`; expected one of {KEYS}",
            meta.path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect::<Vec<_>>()
                .join("::")
        ))),
    }
}

pub(crate) fn value<'a>(
    meta: &'a ParseNestedMeta<'_>,
    example: &str,
) -> syn::Result<syn::parse::ParseStream<'a>> {
    if meta.input.peek(Token![=]) {
        meta.value()
    } else {
        Err(meta.error(format!("expected `{example}`")))
    }
}

pub(crate) fn crate_path(meta: &ParseNestedMeta<'_>) -> syn::Result<Path> {
    let lit: LitStr = value(meta, "crate = \"my_jobq\"")?.parse()?;
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            "`crate` takes the path jobq is reachable at, like `crate = \"my_jobq\"`",
        )
    })
}
