//! `#[derive(Event)]`: a struct with named fields becomes a typed outbox event,
//! `#[event(type = "order_paid", aggregate = order_id, version = version)]`, its event
//! type declared once. `aggregate_type = "order"` names the aggregate (default: the
//! aggregate field's name without a trailing `_id`).

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Path};

use crate::classify::{crate_path, value};
use crate::ctxt::Errors;

const KEYS: &str = "`type = \"...\"`, `aggregate = field`, `version = field`, `aggregate_type = \"...\"`, `crate = \"...\"`";

#[derive(Default)]
struct Keys {
    event_type: Option<LitStr>,
    aggregate: Option<Ident>,
    version: Option<Ident>,
    aggregate_type: Option<LitStr>,
    krate: Option<Path>,
}

fn set<T>(
    slot: &mut Option<T>,
    v: T,
    meta: &syn::meta::ParseNestedMeta<'_>,
    key: &str,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(meta.error(format!("duplicate key `{key}`")));
    }
    *slot = Some(v);
    Ok(())
}

pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(i) => i,
        Err(e) => return e.into_compile_error(),
    };
    let mut errors = Errors::default();
    let mut keys = Keys::default();
    let mut seen_attr = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("event")) {
        seen_attr = true;
        let parsed = attr.parse_nested_meta(|meta| {
            let key = meta.path.get_ident().map(|i| i.to_string());
            match key.as_deref() {
                Some("type") => {
                    let v: LitStr = value(&meta, "type = \"order_paid\"")?.parse()?;
                    if v.value().trim().is_empty() || v.value().len() > 200 {
                        return Err(syn::Error::new(
                            v.span(),
                            "the event type must be 1 to 200 bytes and not blank",
                        ));
                    }
                    set(&mut keys.event_type, v, &meta, "type")
                }
                Some("aggregate") => {
                    let v: Ident = value(&meta, "aggregate = order_id")?.parse()?;
                    set(&mut keys.aggregate, v, &meta, "aggregate")
                }
                Some("version") => {
                    let v: Ident = value(&meta, "version = version")?.parse()?;
                    set(&mut keys.version, v, &meta, "version")
                }
                Some("aggregate_type") => {
                    let v: LitStr = value(&meta, "aggregate_type = \"order\"")?.parse()?;
                    if v.value().is_empty() {
                        return Err(syn::Error::new(
                            v.span(),
                            "the aggregate type must not be empty",
                        ));
                    }
                    set(&mut keys.aggregate_type, v, &meta, "aggregate_type")
                }
                Some("crate") => {
                    let p = crate_path(&meta)?;
                    set(&mut keys.krate, p, &meta, "crate")
                }
                _ => Err(meta.error(format!("unknown key; `#[event(...)]` takes {KEYS}"))),
            }
        });
        if let Err(e) = parsed {
            errors.push(e);
        }
    }
    let name = &input.ident;
    let fields: Vec<Ident> = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => f.named.iter().filter_map(|f| f.ident.clone()).collect(),
            _ => {
                errors.push(syn::Error::new(
                    name.span(),
                    "`#[derive(Event)]` needs a struct with named fields",
                ));
                Vec::new()
            }
        },
        _ => {
            errors.push(syn::Error::new(
                name.span(),
                "`#[derive(Event)]` needs a struct with named fields",
            ));
            Vec::new()
        }
    };
    if !seen_attr {
        errors.push(syn::Error::new(
            name.span(),
            "`#[derive(Event)]` needs `#[event(type = \"...\")]` naming the event type",
        ));
    } else if keys.event_type.is_none() && errors.is_empty() {
        errors.push(syn::Error::new(
            name.span(),
            "missing `type = \"...\"` in `#[event(...)]`",
        ));
    }
    for field in [&keys.aggregate, &keys.version].into_iter().flatten() {
        if !fields.is_empty() && !fields.contains(field) {
            errors.push(syn::Error::new(
                field.span(),
                format!("`{name}` has no field `{field}`"),
            ));
        }
    }
    match (&keys.aggregate, &keys.version) {
        (Some(a), None) => errors.push(syn::Error::new(a.span(), "`aggregate = ...` needs `version = field` too: the inbox orders an aggregate's events by version")),
        (None, Some(v)) => errors.push(syn::Error::new(v.span(), "`version = ...` needs `aggregate = field` too")),
        _ => {}
    }
    if keys.aggregate_type.is_some() && keys.aggregate.is_none() {
        errors.push(syn::Error::new(
            name.span(),
            "`aggregate_type` needs `aggregate = field`",
        ));
    }
    if !errors.is_empty() {
        return errors.into_compile_errors();
    }
    let krate = keys.krate.unwrap_or_else(|| syn::parse_quote!(::jobq));
    let p = quote!(#krate::__private);
    let event_type = keys.event_type.map(|t| t.value()).unwrap_or_default();
    let aggregate = match (keys.aggregate, keys.version) {
        (Some(a), Some(v)) => {
            let kind = keys.aggregate_type.map(|t| t.value()).unwrap_or_else(|| {
                let s = a.to_string();
                s.strip_suffix("_id")
                    .filter(|s| !s.is_empty())
                    .unwrap_or(&s)
                    .to_owned()
            });
            let id = quote_spanned!(a.span()=> #p::event_aggregate_id(&self.#a));
            let version = quote_spanned!(v.span()=> #p::event_version(&self.#v));
            quote! {
                fn aggregate(&self) -> ::core::option::Option<(&'static str, #p::String, i64)> {
                    ::core::option::Option::Some((#kind, #id, #version))
                }
            }
        }
        _ => quote!(),
    };
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        impl #impl_generics #p::EventData for #name #ty_generics #where_clause {
            const EVENT_TYPE: &'static str = #event_type;
            #aggregate
        }
    }
}
