//! Writes the code of `#[job]`: the job type, its `jobq::Job` impl, its inherent enqueue
//! helpers, compile-time checks spanned at the user's tokens, and the `inventory`
//! registration. On error, the user's function is emitted unchanged beside the errors.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{ItemFn, Path};

use crate::attr::{self, JobAttr};
use crate::check::{self, Handler};
use crate::ctxt::Errors;
use crate::grammar::{Millis, Policy};
use crate::respan::respan;

/// `#[job(...)]` on `item`.
pub(crate) fn job(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let attr = attr::parse(args, &mut errors);
    crate::time::check(&attr.time, &mut errors);
    crate::limits::check(&attr.limits, &mut errors);
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "`#[job]` goes on an `async fn` handler, like \
                 `#[job] async fn send_invoice(ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError>`",
            ));
            let errors = errors.into_compile_errors();
            return quote!(#item #errors);
        }
    };
    match check::handler(&func, &attr, &mut errors) {
        Some(handler) if errors.is_empty() => generate(&func, &attr, &handler),
        _ => {
            // The function stays, so completion keeps working and the only messages are
            // the ones above; it may be unused now that no job type calls it.
            let errors = errors.into_compile_errors();
            quote! {
                #[allow(dead_code)]
                #func
                #errors
            }
        }
    }
}

fn generate(func: &ItemFn, attr: &JobAttr, h: &Handler<'_>) -> TokenStream {
    let krate: Path = attr
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::jobq));
    let p = quote!(#krate::__private);
    let vis = &func.vis;
    let fn_name = &func.sig.ident;
    let name = &h.type_name;
    let kind = &h.kind;
    let args_ty = &h.args.ty;
    let err_ty = h.err_ty;

    let docs: Vec<_> = func
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();
    // A `#[cfg]` on the handler applies to everything generated from it.
    let cfgs: Vec<_> = func
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .collect();
    let cfg = quote!(#(#cfgs)*);
    let doc = if docs.is_empty() {
        let text = format!(
            " The `{}` job, declared with `#[jobq::job]` on `{}`.",
            kind.value(),
            fn_name
        );
        quote!(#[doc = #text])
    } else {
        quote!(#(#docs)*)
    };

    let queue = attr
        .queue
        .as_ref()
        .map(|q| quote!(const QUEUE: &'static str = #q;));
    let priority = attr.priority.as_ref().map(|pr| {
        let lit = Literal::i16_unsuffixed(pr.value);
        quote_spanned!(pr.span=> const PRIORITY: i16 = #lit;)
    });
    let retry = attr.retry.as_ref().map(|r| {
        let policy = policy(&p, &r.value);
        quote_spanned!(r.span=> const RETRY: #p::RetryPolicy = #policy;)
    });
    let lease = attr.lease.as_ref().map(|l| {
        let d = duration(l.value);
        quote_spanned!(l.span=> const LEASE: ::core::time::Duration = #d;)
    });
    let timeout = attr.timeout.as_ref().map(|t| {
        let d = duration(t.value);
        quote_spanned!(t.span=>
            const TIMEOUT: ::core::option::Option<::core::time::Duration> =
                ::core::option::Option::Some(#d);
        )
    });
    let time = crate::time::expand(&attr.time, &p, args_ty);
    let idempotency = attr
        .idempotency
        .as_ref()
        .map(|field| field_key_fn(&p, "idempotency_key", field));
    let ordering = attr
        .ordering
        .as_ref()
        .map(|field| field_key_fn(&p, "ordering_key", field));
    let ordering_scope = attr.ordering_scope.as_ref().map(|scope| {
        quote_spanned!(scope.span()=>
            const ORDERING_SCOPE: ::core::option::Option<&'static str> =
                ::core::option::Option::Some(#scope);
        )
    });
    let limits = crate::limits::expand(&attr.limits, &p);

    // The call of the user's function. The signature of `run` carries the span of the
    // user's function, so a future that is not `Send` is reported there.
    let call = match h.ctx {
        Some(param) => {
            // A context parameter of another type is reported at the user's type, with
            // `HandlerContext`'s message.
            let ty = &param.ty;
            let span = ty.span();
            let p = respan(p.clone(), span);
            let ctx = quote_spanned!(span=> <#ty as #p::HandlerContext>::from_context(ctx));
            quote!(#fn_name(#ctx, args))
        }
        None => quote!(#fn_name(args)),
    };
    let unit = check::is_unit(h.ok_ty);
    let ctx_param = match h.ctx {
        Some(_) => quote!(ctx),
        None if unit => quote!(_ctx),
        None => quote!(ctx),
    };
    let ok_ty = h.ok_ty;
    let body = if unit {
        call
    } else {
        // `Ok(value)` of a `Serialize` type is recorded as the job's output
        // (`jobs.output`); any other value is dropped (autoref specialisation: the
        // `Serialize` impl is found first when it applies).
        quote!({
            let __jobq_out = ::core::clone::Clone::clone(&ctx);
            async move {
                let __jobq_value: #ok_ty = #call.await?;
                {
                    #[allow(unused_imports)]
                    use #p::{RecordOther as _, RecordSerialize as _};
                    (&#p::OutputOf(&__jobq_value)).__jobq_record(&__jobq_out);
                }
                ::core::result::Result::Ok(())
            }
        })
    };
    let sig_span = func.sig.ident.span();
    let run_ret = quote_spanned! {sig_span=>
        impl ::core::future::Future<
            Output = ::core::result::Result<(), <Self as #p::Job>::Error>,
        > + ::core::marker::Send
    };

    // `type Args = #args_ty` and `type Error = #err_ty` below carry the user's spans: a
    // type that misses a bound is reported at the user's token, once per missing trait
    // (serde's and `Classify`'s own `on_unimplemented` hints say what to derive).

    let enqueue_doc = format!(
        " Enqueues one `{}` job through `conn`: `&mut tx` (the job exists exactly when \
         `tx` commits), `&pool` or `&mut PgConnection`.",
        kind.value()
    );
    let with_doc = format!(
        " Starts an enqueue of a `{}` job with options: \
         `{name}::with(args).run_after(t).priority(p).enqueue(conn)`.",
        kind.value()
    );
    let many_doc = format!(
        " Enqueues many `{}` jobs in one round trip; returns one `Enqueued` per input, in \
         order.",
        kind.value()
    );

    let (max_kind, max_queue) = (crate::attr::MAX_KIND_LEN, crate::attr::MAX_QUEUE_LEN);
    let min_lease_ms = u128::from(crate::attr::MIN_LEASE.0);
    quote! {
        // The limits this macro checked against are jobq's own.
        const _: () = {
            ::core::assert!(
                #p::MAX_KIND_LEN == #max_kind
                    && #p::MAX_QUEUE_LEN == #max_queue
                    && #p::MIN_LEASE.as_millis() == #min_lease_ms,
                "jobq and jobq-macros disagree on MAX_KIND_LEN, MAX_QUEUE_LEN or MIN_LEASE: use the same version of both"
            );
        };

        #cfg
        #doc
        #[derive(::core::fmt::Debug, ::core::clone::Clone, ::core::marker::Copy)]
        #vis struct #name;

        // `#[job]` requires an `async fn` even when the body has nothing to await.
        #[allow(clippy::unused_async)]
        #func

        #cfg
        impl #p::Job for #name {
            const KIND: &'static str = #kind;
            #queue
            #priority
            #retry
            #lease
            #timeout
            type Args = #args_ty;
            type Error = #err_ty;

            #idempotency
            #ordering
            #ordering_scope
            #time
            #limits

            fn run(#ctx_param: #p::JobContext, args: <Self as #p::Job>::Args) -> #run_ret {
                #body
            }
        }

        #cfg
        impl #name {
            #[doc = #enqueue_doc]
            ///
            /// # Errors
            ///
            /// When the job is rejected before reaching the database (payload too large,
            /// a bad queue name), its args do not serialize, or the insert fails.
            #[allow(dead_code)]
            #vis fn enqueue<'__jobq, __JobqConn>(
                conn: __JobqConn,
                args: #args_ty,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<#p::Enqueued, #p::Error>,
            > + ::core::marker::Send + use<'__jobq, __JobqConn>
            where
                __JobqConn: ::core::convert::Into<#p::Conn<'__jobq>>,
            {
                <Self as #p::Job>::enqueue(conn, args)
            }

            #[doc = #with_doc]
            #[allow(dead_code)]
            #vis fn with(args: #args_ty) -> #p::EnqueueBuilder<Self> {
                <Self as #p::Job>::with(args)
            }

            #[doc = #many_doc]
            ///
            /// # Errors
            ///
            /// As `enqueue`; nothing is inserted if any job is rejected.
            #[allow(dead_code)]
            #vis fn enqueue_many<'__jobq, __JobqConn, __JobqArgs>(
                conn: __JobqConn,
                args: __JobqArgs,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<::std::vec::Vec<#p::Enqueued>, #p::Error>,
            > + ::core::marker::Send + use<'__jobq, __JobqConn, __JobqArgs>
            where
                __JobqConn: ::core::convert::Into<#p::Conn<'__jobq>>,
                __JobqArgs: ::core::iter::IntoIterator<Item = #args_ty>,
            {
                <Self as #p::Job>::enqueue_many(conn, args)
            }
        }

        #cfg
        const _: () = {
            #p::inventory::submit! {
                #p::Registration::new::<#name>()
            }
        };
    }
}

fn duration(d: Millis) -> TokenStream {
    if d.0.is_multiple_of(1000) {
        let secs = Literal::u64_unsuffixed(d.0 / 1000);
        quote!(::core::time::Duration::from_secs(#secs))
    } else {
        let millis = Literal::u64_unsuffixed(d.0);
        quote!(::core::time::Duration::from_millis(#millis))
    }
}

fn policy(p: &TokenStream, policy: &Policy) -> TokenStream {
    match policy {
        Policy::Exponential {
            max,
            base,
            cap,
            jitter,
        } => {
            let max = Literal::u32_unsuffixed(*max);
            let base = base.map(|b| {
                let d = duration(b);
                quote!(.base(#d))
            });
            let cap = cap.map(|c| {
                let d = duration(c);
                quote!(.cap(#d))
            });
            let jitter = jitter.then(|| quote!(.jitter(true)));
            quote!(#p::RetryPolicy::exponential(#max) #base #cap #jitter)
        }
        Policy::Fixed { delay, max } => {
            let d = duration(*delay);
            let max = max.map(|m| {
                let m = Literal::u32_unsuffixed(m);
                quote!(.max(#m))
            });
            quote!(#p::RetryPolicy::fixed(#d) #max)
        }
        Policy::None => quote!(#p::RetryPolicy::none()),
    }
}

/// `fn <name>(args) -> Option<String>` returning `args.<field>.to_string()`, for the keys
/// taken from a field (`idempotency`, `ordering`). `args.<field>` carries the user's
/// span: a field that does not exist, or is not `Display`, is reported at their token.
fn field_key_fn(p: &TokenStream, name: &str, field: &syn::Ident) -> TokenStream {
    let name = syn::Ident::new(name, Span::call_site());
    let key = quote_spanned!(field.span()=> ::std::string::ToString::to_string(&(*args).#field));
    quote! {
        fn #name(
            args: &<Self as #p::Job>::Args,
        ) -> ::core::option::Option<::std::string::String> {
            ::core::option::Option::Some(#key)
        }
    }
}
