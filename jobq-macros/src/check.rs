//! Validates the handler's signature and relates the `#[job]` keys to it, producing the
//! facts `expand` needs: the generated type's name, the kind, whether the handler takes a
//! context, the args type and the error type.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{
    FnArg, GenericArgument, Ident, ItemFn, LitStr, PatType, PathArguments, ReturnType, Type,
};

use crate::attr::JobAttr;
use crate::case;
use crate::ctxt::Errors;

/// What a valid handler looks like to `expand`.
pub(crate) struct Handler<'a> {
    /// The generated type: `name = ...` or the PascalCase of the function's name.
    pub(crate) type_name: Ident,
    /// `kind = "..."` or the function's name.
    pub(crate) kind: LitStr,
    /// The context parameter, when the handler takes one.
    pub(crate) ctx: Option<&'a PatType>,
    /// The args parameter.
    pub(crate) args: &'a PatType,
    /// `T` of the returned `Result<T, E>`.
    pub(crate) ok_ty: &'a Type,
    /// `E` of the returned `Result<T, E>`.
    pub(crate) err_ty: &'a Type,
}

const SIGNATURE: &str = "`async fn name(ctx: JobContext, args: Args) -> Result<(), E>` (the `ctx` parameter may be left out)";

/// Checks `func` against the `#[job]` contract; `None` when anything is wrong (and every
/// mistake is in `errors`).
pub(crate) fn handler<'a>(
    func: &'a ItemFn,
    attr: &JobAttr,
    errors: &mut Errors,
) -> Option<Handler<'a>> {
    let sig = &func.sig;
    let before = errors.is_empty();
    let mut ok = true;
    let mut fail = |errors: &mut Errors, err: syn::Error| {
        errors.push(err);
        ok = false;
    };

    if sig.asyncness.is_none() {
        fail(
            errors,
            syn::Error::new(
                sig.fn_token.span,
                format!("a `#[job]` handler must be an `async fn`: {SIGNATURE}"),
            ),
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        fail(
            errors,
            syn::Error::new(
                unsafety.span,
                "a `#[job]` handler cannot be `unsafe`: the runtime calls it with no safety \
                 contract to uphold",
            ),
        );
    }
    if let Some(abi) = &sig.abi {
        fail(
            errors,
            syn::Error::new_spanned(abi, "a `#[job]` handler cannot have an `extern` ABI"),
        );
    }
    if let Some(variadic) = &sig.variadic {
        fail(
            errors,
            syn::Error::new_spanned(variadic, "a `#[job]` handler cannot be variadic"),
        );
    }
    const GENERIC: &str = "a `#[job]` handler cannot be generic: a job kind has exactly one \
                           args type and one error type, stored and decoded by name";
    if !sig.generics.params.is_empty() {
        fail(errors, syn::Error::new_spanned(&sig.generics, GENERIC));
    } else if let Some(clause) = &sig.generics.where_clause {
        fail(errors, syn::Error::new_spanned(clause, GENERIC));
    }

    let mut typed: Vec<&PatType> = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => fail(
                errors,
                syn::Error::new_spanned(
                    receiver,
                    "a `#[job]` handler is a free function, not a method: remove `self` \
                     (the runtime has no value to call it on)",
                ),
            ),
            FnArg::Typed(pat) => {
                if let Type::ImplTrait(it) = &*pat.ty {
                    fail(errors, syn::Error::new_spanned(it, GENERIC));
                }
                typed.push(pat);
            }
        }
    }
    let (ctx, args) = match typed.as_slice() {
        [args] => (None, Some(*args)),
        [ctx, args] => (Some(*ctx), Some(*args)),
        [] => {
            if sig.receiver().is_none() {
                fail(
                    errors,
                    syn::Error::new(
                        sig.paren_token.span.join(),
                        format!("a `#[job]` handler takes its args as a parameter: {SIGNATURE}"),
                    ),
                );
            }
            (None, None)
        }
        [_, _, extra @ ..] => {
            fail(
                errors,
                syn::Error::new_spanned(
                    quote::quote!(#(#extra),*),
                    format!(
                        "a `#[job]` handler takes at most two parameters, the context and \
                         the args: {SIGNATURE}; put everything else in the args type"
                    ),
                ),
            );
            (None, None)
        }
    };

    let result = result_types(&sig.output);
    if result.is_none() {
        const RESULT: &str = "a `#[job]` handler must return `Result<(), E>` where `E` \
                              implements `jobq::Classify` (derive it with \
                              `#[derive(jobq::Classify)]`, or use `jobq::JobError`)";
        let err = match &sig.output {
            ReturnType::Default => syn::Error::new(sig.paren_token.span.close(), RESULT),
            ReturnType::Type(_, ty) => syn::Error::new_spanned(ty, RESULT),
        };
        fail(errors, err);
    }

    let fn_name = sig.ident.unraw();
    let type_name = match &attr.name {
        Some(name) => name.clone(),
        None => Ident::new(&case::pascal(&fn_name.to_string()), sig.ident.span()),
    };
    if type_name == fn_name {
        let span = attr.name.as_ref().map_or(sig.ident.span(), Ident::span);
        fail(
            errors,
            syn::Error::new(
                span,
                format!(
                    "the generated job type would be named `{type_name}`, like the function; \
                 choose another with `name = ...` (the unit struct and the function share \
                 a namespace)"
                ),
            ),
        );
    }
    let kind = attr
        .kind
        .clone()
        .unwrap_or_else(|| LitStr::new(&fn_name.to_string(), sig.ident.span()));

    let (args, (ok_ty, err_ty)) = (args?, result?);
    if !ok || !before {
        return None;
    }
    Some(Handler {
        type_name,
        kind,
        ctx,
        args,
        ok_ty,
        err_ty,
    })
}

/// `T` and `E` of a return type spelled `Result<T, E>` (any path ending in `Result`).
fn result_types(output: &ReturnType) -> Option<(&Type, &Type)> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let Type::Path(path) = &**ty else {
        return None;
    };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(generic) = &last.arguments else {
        return None;
    };
    let mut types = generic.args.iter().filter_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(ok), Some(err), None) if generic.args.len() == 2 => Some((ok, err)),
        _ => None,
    }
}

/// Whether `ty` is `()`.
pub(crate) fn is_unit(ty: &Type) -> bool {
    matches!(ty, Type::Tuple(t) if t.elems.is_empty())
        || ty.to_token_stream().to_string().replace(' ', "") == "()"
}
