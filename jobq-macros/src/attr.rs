//! Parses the keys of `#[job(...)]` with `syn::meta::parser`. Each key is checked on its
//! own here (is it known, given once, of the right shape); `check` relates the keys to
//! the handler. Errors are collected, never returned early, so one compile lists them all.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, LitInt, LitStr, Path, Token};

use crate::ctxt::Errors;
use crate::grammar::{self, Millis, Policy};
use crate::limits::{self, LimitsAttr};
use crate::time::{self, TimeAttr};

/// Every key `#[job]` accepts, for the "unknown key" message.
const KEYS: &str = "`kind`, `name`, `retry`, `idempotency`, `queue`, `priority`, `lease`, \
                    `timeout`, `cron`, `tz`, `every`, `missed`, `unique`, `debounce`, \
                    `max_age`, `version`, `ordering`, `ordering_scope`, `concurrency`, \
                    `concurrency_key`, `rate`, `rate_key`, `burst`, `crate`";

/// The longest kind and queue names the runtime accepts, and its shortest lease, checked
/// here for errors that point at the token. They are jobq's `MAX_KIND_LEN`,
/// `MAX_QUEUE_LEN` and `MIN_LEASE`: every expansion asserts at compile time that the two
/// crates agree ([`crate::expand`]), so neither can change alone.
pub(crate) const MAX_KIND_LEN: usize = 200;
pub(crate) const MAX_QUEUE_LEN: usize = 100;
pub(crate) const MIN_LEASE: Millis = Millis(300);

/// A value and the span of the token it came from.
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// The keys of one `#[job(...)]`, each `None` when not given (or malformed).
#[derive(Default)]
pub(crate) struct JobAttr {
    pub(crate) kind: Option<LitStr>,
    pub(crate) name: Option<Ident>,
    pub(crate) retry: Option<Spanned<Policy>>,
    pub(crate) idempotency: Option<Ident>,
    pub(crate) queue: Option<LitStr>,
    pub(crate) priority: Option<Spanned<i16>>,
    pub(crate) lease: Option<Spanned<Millis>>,
    pub(crate) timeout: Option<Spanned<Millis>>,
    /// `ordering = field`: the args field whose `to_string()` is the ordering key.
    pub(crate) ordering: Option<Ident>,
    /// `ordering_scope = "billing"`: the key's scope, shared by every kind naming it.
    pub(crate) ordering_scope: Option<LitStr>,
    pub(crate) krate: Option<Path>,
    /// `cron`, `tz`, `every`, `missed`, `unique`, `debounce`, `max_age`, `version`.
    pub(crate) time: TimeAttr,
    /// `concurrency`, `concurrency_key`, `rate`, `rate_key`, `burst`.
    pub(crate) limits: LimitsAttr,
}

/// Parses the attribute's arguments, recording every mistake in `errors`.
pub(crate) fn parse(args: TokenStream, errors: &mut Errors) -> JobAttr {
    let mut out = JobAttr::default();
    let mut seen: Vec<String> = Vec::new();
    let parser = syn::meta::parser(|meta| {
        let key = meta.path.get_ident().map(ToString::to_string);
        let result = match key.as_deref() {
            Some(k) if seen.iter().any(|s| s == k) => Err(meta.error(format!(
                "duplicate key `{k}`: each `#[job]` key may be given once"
            ))),
            Some("kind") => name_lit(&meta, "kind", MAX_KIND_LEN).map(|v| out.kind = Some(v)),
            Some("name") => {
                ident(&meta, "name", "name = SendInvoiceJob").map(|v| out.name = Some(v))
            }
            Some("retry") => retry(&meta).map(|v| out.retry = Some(v)),
            Some("idempotency") => ident(&meta, "idempotency", "idempotency = invoice_id")
                .map(|v| out.idempotency = Some(v)),
            Some("queue") => name_lit(&meta, "queue", MAX_QUEUE_LEN).map(|v| out.queue = Some(v)),
            Some("priority") => priority(&meta).map(|v| out.priority = Some(v)),
            Some("lease") => duration(&meta, "lease", "lease = \"5m\"").and_then(|d| {
                if d.value < MIN_LEASE {
                    Err(syn::Error::new(
                        d.span,
                        "`lease` must be at least 300ms: shorter leases cannot be kept alive \
                         by heartbeats",
                    ))
                } else {
                    out.lease = Some(d);
                    Ok(())
                }
            }),
            Some("timeout") => duration(&meta, "timeout", "timeout = \"30s\"").and_then(|d| {
                if d.value == Millis(0) {
                    Err(syn::Error::new(
                        d.span,
                        "`timeout` must be longer than 0; leave it out for no limit",
                    ))
                } else {
                    out.timeout = Some(d);
                    Ok(())
                }
            }),
            Some("ordering") => {
                ident(&meta, "ordering", "ordering = account_id").map(|v| out.ordering = Some(v))
            }
            Some("ordering_scope") => name_lit(&meta, "ordering_scope", MAX_KIND_LEN)
                .map(|v| out.ordering_scope = Some(v)),
            Some("crate") => crate_path(&meta).map(|v| out.krate = Some(v)),
            Some("cron") => time::parse_cron(&meta).map(|v| out.time.cron = Some(v)),
            Some("tz") => time::parse_tz(&meta).map(|v| out.time.tz = Some(v)),
            Some("every") => time::parse_every(&meta).map(|v| out.time.every = Some(v)),
            Some("missed") => time::parse_missed(&meta).map(|v| out.time.missed = Some(v)),
            Some("unique") => time::parse_unique(&meta).map(|v| out.time.unique = Some(v)),
            Some("debounce") => time::parse_debounce(&meta).map(|v| out.time.debounce = Some(v)),
            Some("max_age") => time::parse_max_age(&meta).map(|v| out.time.max_age = Some(v)),
            Some("version") => time::parse_version(&meta).map(|v| out.time.version = Some(v)),
            Some("concurrency") => {
                limits::parse_count(&meta, "concurrency").map(|v| out.limits.concurrency = Some(v))
            }
            Some("concurrency_key") => limits::parse_field(&meta, "concurrency_key")
                .map(|v| out.limits.concurrency_key = Some(v)),
            Some("rate") => limits::parse_rate(&meta).map(|v| out.limits.rate = Some(v)),
            Some("rate_key") => {
                limits::parse_field(&meta, "rate_key").map(|v| out.limits.rate_key = Some(v))
            }
            Some("burst") => {
                limits::parse_count(&meta, "burst").map(|v| out.limits.burst = Some(v))
            }
            _ => Err(meta.error(format!(
                "unknown `#[job]` key `{}`; expected one of {KEYS}",
                path_text(&meta.path)
            ))),
        };
        if let Some(k) = key {
            seen.push(k);
        }
        if let Err(err) = result {
            errors.push(err);
            skip_value(meta.input)?;
        }
        Ok(())
    });
    if let Err(err) = parser.parse2(args) {
        errors.push(err);
    }
    out
}

/// Skips what is left of one `key = value` entry, up to the next top-level comma.
fn skip_value(input: ParseStream<'_>) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<proc_macro2::TokenTree>()?;
    }
    Ok(())
}

fn path_text(path: &Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    segments.join("::")
}

/// The `=` of `key = value`, with a message showing the expected form.
fn equals<'a>(meta: &'a ParseNestedMeta<'_>, example: &str) -> syn::Result<ParseStream<'a>> {
    if meta.input.peek(Token![=]) {
        meta.value()
    } else {
        Err(meta.error(format!("expected `{example}`")))
    }
}

fn lit_str(meta: &ParseNestedMeta<'_>, key: &str, example: &str) -> syn::Result<LitStr> {
    let input = equals(meta, example)?;
    input.parse::<LitStr>().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{key}` takes a string literal, like `{example}`"),
        )
    })
}

fn name_lit(meta: &ParseNestedMeta<'_>, key: &str, max: usize) -> syn::Result<LitStr> {
    let example = if key == "queue" {
        "queue = \"mail\"".to_owned()
    } else if key == "ordering_scope" {
        "ordering_scope = \"billing\"".to_owned()
    } else {
        format!("{key} = \"send_invoice\"")
    };
    let lit = lit_str(meta, key, &example)?;
    let value = lit.value();
    if value.trim().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{key}` must not be empty"),
        ));
    }
    if value.len() > max {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{key}` is {} bytes long; the limit is {max}", value.len()),
        ));
    }
    Ok(lit)
}

fn ident(meta: &ParseNestedMeta<'_>, key: &str, example: &str) -> syn::Result<Ident> {
    let input = equals(meta, example)?;
    input.parse::<Ident>().map_err(|e| {
        let what = if key == "idempotency" || key == "ordering" {
            "a field of the args type"
        } else {
            "an identifier"
        };
        syn::Error::new(e.span(), format!("`{key}` takes {what}, like `{example}`"))
    })
}

fn retry(meta: &ParseNestedMeta<'_>) -> syn::Result<Spanned<Policy>> {
    let lit = lit_str(meta, "retry", "retry = \"exp(max=10,jitter)\"")?;
    grammar::policy(&lit.value())
        .map(|value| Spanned {
            value,
            span: lit.span(),
        })
        .map_err(|msg| syn::Error::new(lit.span(), msg))
}

fn duration(meta: &ParseNestedMeta<'_>, key: &str, example: &str) -> syn::Result<Spanned<Millis>> {
    let lit = lit_str(meta, key, example)?;
    grammar::duration(&lit.value())
        .map(|value| Spanned {
            value,
            span: lit.span(),
        })
        .map_err(|msg| syn::Error::new(lit.span(), format!("`{key}`: {msg}")))
}

fn priority(meta: &ParseNestedMeta<'_>) -> syn::Result<Spanned<i16>> {
    const MESSAGE: &str = "`priority` takes a whole number from -32768 to 32767 (smaller runs \
                           first), like `priority = -5`";
    let input = equals(meta, "priority = 0")?;
    let span = input.span();
    let negative = input.parse::<Option<Token![-]>>()?.is_some();
    let lit = input
        .parse::<LitInt>()
        .map_err(|_| syn::Error::new(span, MESSAGE))?;
    let digits = if negative {
        format!("-{}", lit.base10_digits())
    } else {
        lit.base10_digits().to_owned()
    };
    if !lit.suffix().is_empty() {
        return Err(syn::Error::new(lit.span(), MESSAGE));
    }
    let value = digits
        .parse::<i16>()
        .map_err(|_| syn::Error::new(lit.span(), MESSAGE))?;
    Ok(Spanned {
        value,
        span: lit.span(),
    })
}

fn crate_path(meta: &ParseNestedMeta<'_>) -> syn::Result<Path> {
    let lit = lit_str(meta, "crate", "crate = \"my_jobq\"")?;
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            "`crate` takes the path jobq is reachable at, like `crate = \"my_jobq\"` or \
             `crate = \"::deps::jobq\"`",
        )
    })
}
