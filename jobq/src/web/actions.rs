//! The actions, every one a POST through [`crate::admin::Admin`] as the signed-in actor
//! (the guard has already refused read-only viewers and requests without the CSRF
//! token). Each answers with a redirect to the page it came from and a message.

use axum::extract::{Extension, Form, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Shared;
use super::auth::Ctx;
use super::pages::{Params, admin, error_page, param};
use super::view::encode;
use crate::JobId;
use crate::admin::{BulkReplay, Filter};
use crate::error::Error;

fn reason(form: &Params) -> Option<&str> {
    form.get("reason")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
}

/// 303 to `base + path` with `msg` shown there.
fn back(ctx: &Ctx, path: &str, msg: &str) -> Response {
    let sep = if path.contains('?') { '&' } else { '?' };
    let to = format!("{}{path}{sep}msg={}", ctx.base, encode(msg));
    match HeaderValue::from_str(&to) {
        Ok(v) => (StatusCode::SEE_OTHER, [(header::LOCATION, v)]).into_response(),
        Err(_) => (StatusCode::OK, format!("{msg}\n")).into_response(),
    }
}

pub(super) async fn replay(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<i64>,
    Form(form): Form<Params>,
) -> Response {
    match admin(&app, &ctx).replay(JobId(id), reason(&form)).await {
        Ok(t) => back(
            &ctx,
            &format!("/jobs/{id}"),
            &format!("replayed: {} → {}", t.before, t.after),
        ),
        Err(e) => error_page(&e),
    }
}

pub(super) async fn cancel(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<i64>,
    Form(form): Form<Params>,
) -> Response {
    match admin(&app, &ctx).cancel(JobId(id), reason(&form)).await {
        Ok(t) if t.after == "running" => back(
            &ctx,
            &format!("/jobs/{id}"),
            "cancel requested: the running attempt finishes, then the job is cancelled",
        ),
        Ok(t) => back(
            &ctx,
            &format!("/jobs/{id}"),
            &format!("cancelled: {} → {}", t.before, t.after),
        ),
        Err(e) => error_page(&e),
    }
}

pub(super) async fn retry_now(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<i64>,
    Form(form): Form<Params>,
) -> Response {
    match admin(&app, &ctx).retry_now(JobId(id), reason(&form)).await {
        Ok(_) => back(&ctx, &format!("/jobs/{id}"), "due now"),
        Err(e) => error_page(&e),
    }
}

pub(super) async fn edit_payload(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<i64>,
    Form(form): Form<Params>,
) -> Response {
    let text = form.get("payload").map(String::as_str).unwrap_or("");
    let payload: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return error_page(&Error::invalid(
                "invalid_payload",
                format!("the payload is not JSON: {e}"),
            ));
        }
    };
    match admin(&app, &ctx)
        .edit_payload(JobId(id), payload, reason(&form))
        .await
    {
        Ok(_) => back(&ctx, &format!("/jobs/{id}"), "payload replaced"),
        Err(e) => error_page(&e),
    }
}

/// Replays one group of the failed page (queue, kind and code, all required) at the
/// configured rate, in the background: the page answers at once with the count.
pub(super) async fn replay_group(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Form(form): Form<Params>,
) -> Response {
    let field = |k: &str| param(&form, k);
    let (Some(queue), Some(kind), Some(code)) = (field("queue"), field("kind"), field("code"))
    else {
        return error_page(&Error::invalid(
            "invalid_filter",
            "a group replay needs its queue, kind and code",
        ));
    };
    let filter = Filter::default().queue(queue).kind(kind).code(code);
    let rate = app.config.replay_rate;
    let admin = admin(&app, &ctx);
    let dry = BulkReplay {
        dry_run: true,
        ..BulkReplay::at_rate(rate)
    };
    let matched = match admin.replay_many(&filter, dry, None).await {
        Ok(r) => r.matched,
        Err(e) => return error_page(&e),
    };
    let why = reason(&form).map(str::to_owned);
    let (k, c) = (kind.to_owned(), code.to_owned());
    tokio::spawn(async move {
        match admin
            .replay_many(&filter, BulkReplay::at_rate(rate), why.as_deref())
            .await
        {
            Ok(r) => {
                tracing::info!(kind = %k, code = %c, replayed = r.replayed, skipped = r.skipped, "dashboard bulk replay done")
            }
            Err(e) => {
                tracing::warn!(kind = %k, code = %c, error = %e, "dashboard bulk replay stopped")
            }
        }
    });
    back(
        &ctx,
        "/failed",
        &format!("replaying {matched} {kind} jobs failed with {code} at {rate}/s"),
    )
}

async fn set_paused(app: Shared, ctx: Ctx, queue: String, form: Params, pause: bool) -> Response {
    let a = admin(&app, &ctx);
    let r = if pause {
        a.pause(&queue, reason(&form)).await
    } else {
        a.resume(&queue, reason(&form)).await
    };
    match r {
        Ok(c) => back(
            &ctx,
            "/queues",
            &format!(
                "{} {}",
                c.queue,
                if c.paused { "paused" } else { "resumed" }
            ),
        ),
        Err(e) => error_page(&e),
    }
}

pub(super) async fn pause(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Path(queue): Path<String>,
    Form(form): Form<Params>,
) -> Response {
    set_paused(app, ctx, queue, form, true).await
}

pub(super) async fn resume(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Path(queue): Path<String>,
    Form(form): Form<Params>,
) -> Response {
    set_paused(app, ctx, queue, form, false).await
}
