//! The pages: overview, jobs list and detail, failed groups, queues, audit log. Each
//! handler reads through `jobq::stats` / `jobq::admin` and turns the answer into strings
//! for its template.

use std::collections::HashMap;

use askama::Template;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, NaiveDateTime, Utc};

use super::Shared;
use super::auth::Ctx;
use super::view::{age, bars, or_dash, query, time};
use crate::JobId;
use crate::admin::{Admin, AuditQuery, Filter, JobQuery};
use crate::error::Error;
use crate::stats::{self, StatsOptions};

/// What the layout needs on every page.
#[derive(Debug)]
pub(super) struct Page {
    pub(super) title: String,
    pub(super) nav: &'static str,
    pub(super) base: String,
    /// The overview's URL: the prefix itself (a nested router does not answer the
    /// prefix with a trailing slash), or `/` at the root.
    pub(super) home: String,
    pub(super) csrf: String,
    pub(super) actor: String,
    pub(super) read_only: bool,
    pub(super) flash: Option<String>,
}

impl Page {
    pub(super) fn new(ctx: &Ctx, nav: &'static str, title: impl Into<String>, q: &Params) -> Page {
        Page {
            title: title.into(),
            nav,
            base: ctx.base.clone(),
            home: if ctx.base.is_empty() {
                "/".to_owned()
            } else {
                ctx.base.clone()
            },
            csrf: ctx.csrf.clone(),
            actor: ctx.actor.clone(),
            read_only: !ctx.sees_payloads(),
            flash: q.get("msg").filter(|m| !m.is_empty()).cloned(),
        }
    }
}

pub(super) type Params = HashMap<String, String>;

pub(super) fn param<'a>(q: &'a Params, key: &str) -> Option<&'a str> {
    q.get(key).map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// Reads each `(key, slot)` given in `q` with `parse`; the error names the first key
/// whose value does not parse.
fn parse_into<T>(
    q: &Params,
    slots: [(&str, &mut Option<T>); 2],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<(), Box<Response>> {
    for (key, slot) in slots {
        if let Some(v) = param(q, key) {
            match parse(v) {
                Some(x) => *slot = Some(x),
                None => {
                    return Err(Box::new(error_page(&Error::invalid(
                        "invalid_filter",
                        format!("{key} is not valid: {v}"),
                    ))));
                }
            }
        }
    }
    Ok(())
}

/// An error page: the admin error's message with a fitting status.
pub(super) fn error_page(e: &Error) -> Response {
    let status = match e {
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::WrongState { .. } => StatusCode::CONFLICT,
        Error::Invalid { .. } | Error::Config(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::warn!(error = %e, "dashboard request failed");
    }
    super::view::message(status, &format!("{} ({})", e, e.code()))
}

pub(super) fn render(t: &impl Template) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "dashboard template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "template error\n").into_response()
        }
    }
}

pub(super) fn admin(app: &Shared, ctx: &Ctx) -> Admin {
    Admin::new(app.pool.clone()).actor(ctx.actor.clone())
}

/// `2026-12-01T21:00` (a `datetime-local` input, read as UTC) or RFC 3339.
fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]
                .iter()
                .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
                .map(|t| t.and_utc())
        })
}

// ---------------------------------------------------------------- overview

#[derive(Debug)]
struct QueueRow {
    queue: String,
    paused: bool,
    due: i64,
    scheduled: i64,
    retrying: i64,
    running: String,
    oldest: String,
    business_age: String,
    done: i64,
    failed: i64,
}

#[derive(Debug)]
struct WorkerRow {
    id: String,
    queues: String,
    last_seen: String,
}

#[derive(Debug)]
struct Flag {
    what: String,
    why: String,
}

#[derive(Template)]
#[template(path = "overview_live.html")]
struct OverviewLive {
    base: String,
    at: String,
    window: String,
    queues: Vec<QueueRow>,
    workers: Vec<WorkerRow>,
    flags: Vec<Flag>,
    done_total: i64,
    failed_total: i64,
    done_chart: String,
    failed_chart: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct Overview {
    page: Page,
    live: String,
}

pub(super) async fn overview(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<Params>,
) -> Response {
    let opts = StatsOptions {
        window: app.config.window,
        ..StatsOptions::default()
    };
    let s = match stats::stats_with(&app.pool, &opts).await {
        Ok(s) => s,
        Err(e) => return error_page(&e),
    };
    let minutes = match stats::per_minute(&app.pool, app.config.window).await {
        Ok(m) => m,
        Err(e) => return error_page(&e),
    };
    let mut flags: Vec<Flag> = s
        .kinds
        .iter()
        .filter(|k| k.unserved)
        .map(|k| Flag {
            what: format!("{} on {}", k.kind, k.queue),
            why: "unserved: pending jobs, but no live worker serves this kind on this queue"
                .to_owned(),
        })
        .collect();
    flags.extend(
        s.runtimes
            .iter()
            .filter(|r| r.lease_too_short)
            .map(|r| Flag {
                what: r.kind.clone(),
                why: format!(
                    "lease too short: p99 run time {} is over half the lease {}",
                    age(Some(r.p99_secs)),
                    age(r.lease_secs)
                ),
            }),
    );
    let done: Vec<i64> = minutes.iter().map(|m| m.done).collect();
    let failed: Vec<i64> = minutes.iter().map(|m| m.failed).collect();
    let live = OverviewLive {
        base: ctx.base.clone(),
        at: time(Some(s.at)),
        window: age(Some(s.window_secs)),
        queues: s
            .queues
            .iter()
            .map(|q| QueueRow {
                queue: q.queue.clone(),
                paused: q.paused,
                due: q.due,
                scheduled: q.scheduled,
                retrying: q.retrying,
                running: match q.concurrency {
                    Some(c) => format!("{}/{c}", q.running),
                    None => format!("{}/—", q.running),
                },
                oldest: age(q.oldest_due_age_secs),
                business_age: age(q.oldest_due_created_age_secs),
                done: q.done,
                failed: q.failed,
            })
            .collect(),
        workers: s
            .workers
            .iter()
            .map(|w| WorkerRow {
                id: w.id.clone(),
                queues: w
                    .queues
                    .iter()
                    .map(|(q, c)| format!("{q}×{c}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                last_seen: time(Some(w.last_seen)),
            })
            .collect(),
        flags,
        done_total: done.iter().sum(),
        failed_total: failed.iter().sum(),
        done_chart: bars(&done, "done", "jobs done per minute"),
        failed_chart: bars(&failed, "failed", "jobs failed per minute"),
    };
    if param(&q, "live").is_some() {
        return render(&live);
    }
    let live = match live.render() {
        Ok(html) => html,
        Err(e) => {
            tracing::warn!(error = %e, "dashboard template failed");
            return (StatusCode::INTERNAL_SERVER_ERROR, "template error\n").into_response();
        }
    };
    render(&Overview {
        page: Page::new(&ctx, "overview", "Overview", &q),
        live,
    })
}

// ---------------------------------------------------------------- jobs list

#[derive(Debug)]
pub(super) struct JobLine {
    id: i64,
    kind: String,
    queue: String,
    state: String,
    attempts: String,
    code: String,
    created_at: String,
    run_after: String,
    finished_at: String,
}

impl JobLine {
    fn of(j: &crate::admin::JobSummary) -> JobLine {
        JobLine {
            id: j.id,
            kind: j.kind.clone(),
            queue: j.queue.clone(),
            state: j.state.clone(),
            attempts: format!("{}/{}", j.attempts, j.max_attempts),
            code: or_dash(j.last_error_code.as_deref()),
            created_at: time(Some(j.created_at)),
            run_after: time(Some(j.run_after)),
            finished_at: time(j.finished_at),
        }
    }
}

#[derive(Debug, Default)]
struct JobFilterForm {
    id: String,
    state: String,
    queue: String,
    kind: String,
    code: String,
    since: String,
    until: String,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct Jobs {
    page: Page,
    f: JobFilterForm,
    states: &'static [&'static str],
    jobs: Vec<JobLine>,
    next: Option<String>,
    first: Option<String>,
}

pub(super) async fn jobs(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<Params>,
) -> Response {
    let f = JobFilterForm {
        id: param(&q, "id").unwrap_or_default().to_owned(),
        state: param(&q, "state").unwrap_or_default().to_owned(),
        queue: param(&q, "queue").unwrap_or_default().to_owned(),
        kind: param(&q, "kind").unwrap_or_default().to_owned(),
        code: param(&q, "code").unwrap_or_default().to_owned(),
        since: param(&q, "since").unwrap_or_default().to_owned(),
        until: param(&q, "until").unwrap_or_default().to_owned(),
    };
    let mut query_ = JobQuery {
        state: param(&q, "state").map(str::to_owned),
        queue: param(&q, "queue").map(str::to_owned),
        kind: param(&q, "kind").map(str::to_owned),
        code: param(&q, "code").map(str::to_owned),
        ..JobQuery::default()
    };
    let ids = [("id", &mut query_.id), ("before", &mut query_.before)];
    if let Err(r) = parse_into(&q, ids, |v| v.parse().ok()) {
        return *r;
    }
    let times = [("since", &mut query_.since), ("until", &mut query_.until)];
    if let Err(r) = parse_into(&q, times, parse_time) {
        return *r;
    }
    let limit = app.config.page_size;
    let rows = match admin(&app, &ctx).jobs(&query_, limit).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    let filters = |before: &str| {
        query(&[
            ("id", &f.id),
            ("state", &f.state),
            ("queue", &f.queue),
            ("kind", &f.kind),
            ("code", &f.code),
            ("since", &f.since),
            ("until", &f.until),
            ("before", before),
        ])
    };
    let next = (rows.len() == limit as usize)
        .then(|| rows.last().map(|j| filters(&j.id.to_string())))
        .flatten();
    let first = query_.before.map(|_| filters(""));
    render(&Jobs {
        page: Page::new(&ctx, "jobs", "Jobs", &q),
        f,
        states: &["pending", "running", "done", "failed", "cancelled"],
        jobs: rows.iter().map(JobLine::of).collect(),
        next,
        first,
    })
}

// ---------------------------------------------------------------- job detail

#[derive(Debug)]
struct ErrorEntry {
    attempt: String,
    at: String,
    code: String,
    disposition: String,
    message: String,
}

#[derive(Debug)]
pub(super) struct AuditLine {
    job_id: Option<i64>,
    at: String,
    action: String,
    actor: String,
    reason: String,
    change: String,
    detail: String,
}

impl AuditLine {
    pub(super) fn of(a: &crate::admin::AuditRow, sees_payloads: bool) -> AuditLine {
        let detail = match &a.detail {
            // A payload correction keeps the payloads before and after: not for every eye.
            Some(_) if a.action == "edit_payload" && !sees_payloads => "(hidden)".to_owned(),
            Some(d) => d.to_string(),
            None => String::new(),
        };
        AuditLine {
            job_id: a.job_id,
            at: time(Some(a.created_at)),
            action: a.action.clone(),
            actor: a.actor.clone(),
            reason: or_dash(a.reason.as_deref()),
            change: format!(
                "{} → {}",
                or_dash(a.before_state.as_deref()),
                or_dash(a.after_state.as_deref())
            ),
            detail,
        }
    }
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    page: Page,
    id: i64,
    state: String,
    fields: Vec<(&'static str, String)>,
    payload: Option<String>,
    output: Option<String>,
    /// The trace the job was enqueued in, and its link when `WebConfig::trace_url` is set.
    trace_id: Option<String>,
    trace_link: Option<String>,
    errors: Vec<ErrorEntry>,
    audit: Vec<AuditLine>,
    can_replay: bool,
    can_cancel: bool,
    can_retry_now: bool,
}

fn json_str(v: &serde_json::Value, key: &str) -> String {
    match v.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => "—".to_owned(),
        Some(other) => other.to_string(),
    }
}

pub(super) async fn job(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Path(id): Path<i64>,
    Query(q): Query<Params>,
) -> Response {
    let d = match admin(&app, &ctx).job(JobId(id)).await {
        Ok(d) => d,
        Err(e) => return error_page(&e),
    };
    let j = &d.job;
    let now = Utc::now();
    let fields = vec![
        ("kind", j.kind.clone()),
        ("queue", j.queue.clone()),
        ("state", j.state.clone()),
        ("priority", j.priority.to_string()),
        ("attempts", format!("{} of {}", j.attempts, j.max_attempts)),
        ("payload version", j.payload_version.to_string()),
        ("run after", time(Some(j.run_after))),
        ("locked until", time(j.locked_until)),
        ("locked by", or_dash(j.locked_by.as_deref())),
        ("idempotency key", or_dash(j.idempotency_key.as_deref())),
        ("last error code", or_dash(j.last_error_code.as_deref())),
        ("last error", or_dash(j.last_error.as_deref())),
        ("cancel requested", j.cancel_requested.to_string()),
        ("created at", time(Some(j.created_at))),
        ("started at", time(j.started_at)),
        ("first failed at", time(j.first_failed_at)),
        ("last failed at", time(j.last_failed_at)),
        ("finished at", time(j.finished_at)),
    ];
    let errors = j
        .errors
        .as_array()
        .map(|a| {
            a.iter()
                .rev()
                .map(|e| ErrorEntry {
                    attempt: json_str(e, "attempt"),
                    at: json_str(e, "at"),
                    code: json_str(e, "code"),
                    disposition: json_str(e, "disposition"),
                    message: json_str(e, "message"),
                })
                .collect()
        })
        .unwrap_or_default();
    let payload = ctx
        .sees_payloads()
        .then(|| serde_json::to_string_pretty(&j.payload).unwrap_or_default());
    // What the handler returned may be as sensitive as what it was given.
    let output = j
        .output
        .as_ref()
        .filter(|_| ctx.sees_payloads())
        .map(|o| serde_json::to_string_pretty(o).unwrap_or_default());
    let trace_id = j.trace_id();
    let trace_link = trace_id.as_deref().and_then(|t| app.config.trace_link(t));
    render(&JobPage {
        page: Page::new(&ctx, "jobs", format!("Job {id}"), &q),
        id,
        output,
        trace_id,
        trace_link,
        state: j.state.clone(),
        can_replay: matches!(j.state.as_str(), "failed" | "cancelled"),
        can_cancel: matches!(j.state.as_str(), "pending" | "failed")
            || (j.state == "running" && !j.cancel_requested),
        can_retry_now: j.state == "pending" && j.run_after > now,
        fields,
        payload,
        errors,
        audit: d
            .audit
            .iter()
            .map(|a| AuditLine::of(a, ctx.sees_payloads()))
            .collect(),
    })
}

// ---------------------------------------------------------------- failed

#[derive(Debug)]
struct GroupRow {
    queue: String,
    kind: String,
    code: Option<String>,
    count: i64,
    last: String,
    list: String,
}

#[derive(Template)]
#[template(path = "failed.html")]
struct Failed {
    page: Page,
    groups: Vec<GroupRow>,
    recent: Vec<JobLine>,
    rate: f64,
}

pub(super) async fn failed(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<Params>,
) -> Response {
    let a = admin(&app, &ctx);
    let groups = match a.failed_groups().await {
        Ok(g) => g,
        Err(e) => return error_page(&e),
    };
    let recent = match a.failed(&Filter::default(), 20).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    render(&Failed {
        page: Page::new(&ctx, "failed", "Failed", &q),
        groups: groups
            .into_iter()
            .map(|g| GroupRow {
                list: query(&[
                    ("state", "failed"),
                    ("queue", &g.queue),
                    ("kind", &g.kind),
                    ("code", g.code.as_deref().unwrap_or("")),
                ]),
                queue: g.queue,
                kind: g.kind,
                code: g.code,
                count: g.count,
                last: time(g.last_finished_at),
            })
            .collect(),
        recent: recent
            .iter()
            .map(|t| JobLine {
                id: t.id,
                kind: t.kind.clone(),
                queue: t.queue.clone(),
                state: t.state.clone(),
                attempts: t.attempts.to_string(),
                code: or_dash(t.last_error_code.as_deref()),
                created_at: time(Some(t.created_at)),
                run_after: String::new(),
                finished_at: time(t.finished_at),
            })
            .collect(),
        rate: app.config.replay_rate,
    })
}

// ---------------------------------------------------------------- queues

#[derive(Debug)]
struct QueueLine {
    queue: String,
    paused: bool,
    paused_by: String,
    paused_at: String,
    due: i64,
    running: i64,
}

#[derive(Template)]
#[template(path = "queues.html")]
struct Queues {
    page: Page,
    queues: Vec<QueueLine>,
}

pub(super) async fn queues(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<Params>,
) -> Response {
    let s = match stats::stats(&app.pool).await {
        Ok(s) => s,
        Err(e) => return error_page(&e),
    };
    render(&Queues {
        page: Page::new(&ctx, "queues", "Queues", &q),
        queues: s
            .queues
            .iter()
            .map(|q| QueueLine {
                queue: q.queue.clone(),
                paused: q.paused,
                paused_by: or_dash(q.paused_by.as_deref()),
                paused_at: time(q.paused_at),
                due: q.due,
                running: q.running,
            })
            .collect(),
    })
}

// ---------------------------------------------------------------- audit

#[derive(Template)]
#[template(path = "audit.html")]
struct Audit {
    page: Page,
    action: String,
    actor: String,
    job: String,
    rows: Vec<AuditLine>,
    next: Option<String>,
}

pub(super) async fn audit(
    State(app): State<Shared>,
    Extension(ctx): Extension<Ctx>,
    Query(q): Query<Params>,
) -> Response {
    let mut aq = AuditQuery {
        action: param(&q, "action").map(str::to_owned),
        actor: param(&q, "actor").map(str::to_owned),
        ..AuditQuery::default()
    };
    let ids = [("job", &mut aq.job_id), ("before", &mut aq.before)];
    if let Err(r) = parse_into(&q, ids, |v| v.parse().ok()) {
        return *r;
    }
    let limit = app.config.page_size;
    let rows = match admin(&app, &ctx).audit_filtered(&aq, limit).await {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    let action = param(&q, "action").unwrap_or_default().to_owned();
    let actor = param(&q, "actor").unwrap_or_default().to_owned();
    let job = param(&q, "job").unwrap_or_default().to_owned();
    let next = (rows.len() == limit as usize)
        .then(|| {
            rows.last().map(|r| {
                query(&[
                    ("action", &action),
                    ("actor", &actor),
                    ("job", &job),
                    ("before", &r.id.to_string()),
                ])
            })
        })
        .flatten();
    render(&Audit {
        page: Page::new(&ctx, "audit", "Audit", &q),
        rows: rows
            .iter()
            .map(|a| AuditLine::of(a, ctx.sees_payloads()))
            .collect(),
        action,
        actor,
        job,
        next,
    })
}
