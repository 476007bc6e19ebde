//! The outbox and the inbox: inserting events in the caller's transaction, the relay's
//! claim (one claimant per aggregate, through a session-level advisory lock) and its
//! bookkeeping, retention, the operator's reads and replay, and the inbox's one-statement
//! apply.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::error::Error;

/// The advisory-lock namespace of the relay's per-aggregate claims ("outb" in ASCII: the
/// two-key form of `pg_try_advisory_lock`).
const RELAY_LOCK_NS: i32 = 0x6f75_7462;

/// An event validated in Rust (`Event::validate`): the columns of its `jobq.outbox` row,
/// written by a plain `INSERT` ([`outbox_insert`], or the enqueue statement it rides, see
/// [`outbox_row_sql!`]) rather than through `jobq.publish`, whose PL/pgSQL call costs
/// about as much on the server as the row itself.
#[derive(Debug, Clone)]
pub(crate) struct NewEvent {
    pub(crate) id: Uuid,
    pub(crate) event_type: String,
    pub(crate) aggregate_type: Option<String>,
    pub(crate) aggregate_id: Option<String>,
    pub(crate) aggregate_version: Option<i64>,
    /// JSON text.
    pub(crate) payload: String,
    /// A JSON object of strings, or `None` for no headers.
    pub(crate) headers: Option<String>,
}

impl NewEvent {
    /// The object `jobq.publish(event jsonb)` reads (migration 0012), for the callers
    /// who write the event in a statement of their own ([`param`](crate::outbox::param)).
    pub(crate) fn to_param(&self) -> EventParam {
        // The payload and headers are JSON text already; the rest is escaped by serde.
        let mut json = String::with_capacity(self.payload.len() + 160);
        json.push_str("{\"id\":\"");
        json.push_str(&self.id.to_string());
        json.push_str("\",\"type\":");
        json.push_str(&json_string(&self.event_type));
        if let (Some(kind), Some(id)) = (&self.aggregate_type, &self.aggregate_id) {
            json.push_str(",\"aggregate_type\":");
            json.push_str(&json_string(kind));
            json.push_str(",\"aggregate_id\":");
            json.push_str(&json_string(id));
        }
        if let Some(version) = self.aggregate_version {
            json.push_str(",\"aggregate_version\":");
            json.push_str(&version.to_string());
        }
        json.push_str(",\"payload\":");
        json.push_str(&self.payload);
        if let Some(headers) = &self.headers {
            json.push_str(",\"headers\":");
            json.push_str(headers);
        }
        json.push('}');
        EventParam { id: self.id, json }
    }

    /// Binds the event as the seven parameters of [`outbox_row_sql!`], in its order.
    pub(crate) fn bind<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        q.bind(self.id)
            .bind(&self.event_type)
            .bind(&self.aggregate_type)
            .bind(&self.aggregate_id)
            .bind(self.aggregate_version)
            .bind(&self.payload)
            .bind(&self.headers)
    }

    /// [`bind`](Self::bind) for a statement written with or without the event.
    pub(crate) fn bind_opt<'q>(event: Option<&'q NewEvent>, q: PgQuery<'q>) -> PgQuery<'q> {
        match event {
            Some(e) => e.bind(q),
            None => q,
        }
    }
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// An event validated and serialized for `jobq.publish(event jsonb)`, the SQL function
/// that writes an outbox row (see [`param`](crate::outbox::param)). Binds as `jsonb`.
#[derive(Debug, Clone)]
pub struct EventParam {
    id: Uuid,
    json: String,
}

impl EventParam {
    /// The event's id: what `jobq.publish` returns for it.
    pub fn id(&self) -> Uuid {
        self.id
    }
}

impl sqlx::Type<sqlx::Postgres> for EventParam {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_name("jsonb")
    }
}

impl sqlx::postgres::PgHasArrayType for EventParam {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_name("_jsonb")
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for EventParam {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        // jsonb's binary form: format version 1, then the JSON text.
        buf.push(1);
        buf.extend_from_slice(self.json.as_bytes());
        Ok(sqlx::encode::IsNull::No)
    }
}

/// Writes `events` to `jobq.outbox`, in order, in one statement on the caller's
/// connection (and transaction).
pub(crate) async fn outbox_insert(
    conn: &mut PgConnection,
    events: &[NewEvent],
) -> Result<(), Error> {
    match events {
        [] => {}
        [event] => {
            event
                .bind(sqlx::query(outbox_row_sql!(
                    "$1", "$2", "$3", "$4", "$5", "$6", "$7"
                )))
                .execute(&mut *conn)
                .await?;
        }
        _ => {
            let column = |f: fn(&NewEvent) -> Option<&str>| -> Vec<Option<&str>> {
                events.iter().map(f).collect()
            };
            sqlx::query(
                r#"
                INSERT INTO jobq.outbox
                    (id, event_type, aggregate_type, aggregate_id, aggregate_version, agg_key,
                     payload, headers)
                SELECT id, event_type, aggregate_type, aggregate_id, aggregate_version,
                       coalesce(aggregate_type || ':' || aggregate_id, 'event:' || id::text),
                       payload::jsonb, coalesce(headers::jsonb, '{}')
                FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int8[],
                            $6::text[], $7::text[]) WITH ORDINALITY
                     AS t(id, event_type, aggregate_type, aggregate_id, aggregate_version,
                          payload, headers, n)
                ORDER BY n
                "#,
            )
            .bind(events.iter().map(|e| e.id).collect::<Vec<_>>())
            .bind(column(|e| Some(&e.event_type)))
            .bind(column(|e| e.aggregate_type.as_deref()))
            .bind(column(|e| e.aggregate_id.as_deref()))
            .bind(
                events
                    .iter()
                    .map(|e| e.aggregate_version)
                    .collect::<Vec<_>>(),
            )
            .bind(column(|e| Some(&e.payload)))
            .bind(column(|e| e.headers.as_deref()))
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// The classified error when `jobq.publish` rejected an event: SQLSTATE 22023 from
/// schema `jobq`, with the code as the constraint name; or an event id that is not a
/// UUID, which the function leaves to uuid's own input check (SQLSTATE 22P02 raised in
/// `jobq.publish`, migration 0013).
pub(crate) fn publish_rejection(err: &sqlx::Error) -> Option<Error> {
    let db = err.as_database_error()?;
    let pg = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
    if pg.code() == "22P02" && pg.r#where()?.contains("function jobq.publish(jsonb)") {
        return Some(Error::invalid(
            "invalid_event",
            format!(
                "jobq.publish: invalid_event: event id is not a UUID: {}",
                pg.message()
            ),
        ));
    }
    if pg.code() != "22023" || pg.schema() != Some("jobq") {
        return None;
    }
    let code = match pg.constraint()? {
        "invalid_event" => "invalid_event",
        "payload_too_large" => "payload_too_large",
        _ => return None,
    };
    Some(Error::invalid(code, pg.message().to_owned()))
}

/// An event's aggregate: its type, id and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Aggregate {
    /// The aggregate's type, `order`.
    pub kind: String,
    /// Its id, as text.
    pub id: String,
    /// The version this event brings it to; events of one aggregate are relayed in
    /// version order.
    pub version: Option<i64>,
}

/// An outbox row as the relay hands it to a [`Sink`](crate::outbox::Sink).
#[derive(Debug, Clone, Serialize)]
pub struct OutboxEvent {
    /// The event id (UUIDv7): the broker's message id, so the broker's dedupe and the
    /// consumer's inbox recognise a re-send.
    pub id: Uuid,
    /// The event type, `order_paid`.
    pub event_type: String,
    /// The aggregate it belongs to, if any.
    pub aggregate: Option<Aggregate>,
    /// The payload, serialized JSON.
    pub payload: String,
    /// Headers given at publish time (trace context among them).
    pub headers: BTreeMap<String, String>,
    /// When it was written.
    pub created_at: DateTime<Utc>,
    /// Failed publish attempts so far.
    pub attempts: i32,
}

fn event_from_row(r: &sqlx::postgres::PgRow) -> Result<OutboxEvent, Error> {
    let agg_type: Option<String> = r.try_get("aggregate_type")?;
    let agg_id: Option<String> = r.try_get("aggregate_id")?;
    let headers: sqlx::types::Json<BTreeMap<String, String>> = r.try_get("headers")?;
    Ok(OutboxEvent {
        id: r.try_get("id")?,
        event_type: r.try_get("event_type")?,
        aggregate: match (agg_type, agg_id) {
            (Some(kind), Some(id)) => Some(Aggregate {
                kind,
                id,
                version: r.try_get("aggregate_version")?,
            }),
            _ => None,
        },
        payload: r.try_get("payload")?,
        headers: headers.0,
        created_at: r.try_get("created_at")?,
        attempts: r.try_get("attempts")?,
    })
}

/// The relay's claim, step 1, outside any transaction: from the oldest `window`
/// unpublished rows (from `seq` `from` on; `None`: from the oldest of all), the
/// aggregates none of whose rows waits for a backoff, at most `batch` of them, each taken
/// only if this session gets its advisory lock (another relay holding it is relaying that
/// aggregate now). Returns the aggregate keys taken, and the window's first `seq` (`None`
/// when it was empty). The locks are session-level: they outlive the statement and are
/// released by [`outbox_unlock`] after the bookkeeping committed, or with the connection
/// when the relay dies.
///
/// `from` is an index condition of `outbox_unpublished_idx`: the scan begins there
/// instead of walking the entries of rows published before it, which stay in the index
/// while a snapshot is held open.
pub(crate) async fn outbox_lock(
    conn: &mut PgConnection,
    window: i64,
    batch: i64,
    from: Option<i64>,
) -> Result<(Vec<String>, Option<i64>), Error> {
    let (keys, first) = sqlx::query_as(
        r#"
        WITH win AS MATERIALIZED (
            SELECT seq, agg_key, retry_at FROM jobq.outbox
            WHERE published_at IS NULL
              AND seq >= coalesce($4, -9223372036854775808)
            ORDER BY seq
            LIMIT $1
        ),
        due AS MATERIALIZED (
            SELECT agg_key FROM win
            GROUP BY agg_key
            HAVING bool_and(retry_at IS NULL OR retry_at <= now())
            ORDER BY min(seq)
            LIMIT $2
        )
        SELECT ARRAY(SELECT agg_key FROM due WHERE pg_try_advisory_lock($3, hashtext(agg_key))),
               (SELECT min(seq) FROM win)
        "#,
    )
    .bind(window)
    .bind(batch)
    .bind(RELAY_LOCK_NS)
    .bind(from)
    .fetch_one(&mut *conn)
    .await?;
    Ok((keys, first))
}

/// The relay's claim, step 2: the unpublished rows of the aggregates `keys` this session
/// locked, read in a snapshot taken after the locks, so everything a previous holder
/// marked is seen; aggregates with a row waiting for a backoff are left out. At most
/// `batch` rows — the first row of every aggregate before the second of any, so one long
/// aggregate cannot starve the others — returned in (aggregate, version, seq) order.
pub(crate) async fn outbox_claim(
    conn: &mut PgConnection,
    keys: &[String],
    batch: i64,
) -> Result<Vec<OutboxEvent>, Error> {
    let rows = sqlx::query(
        r#"
        WITH held AS MATERIALIZED (
            SELECT o.agg_key FROM jobq.outbox o
            WHERE o.agg_key = ANY($1) AND o.published_at IS NULL
            GROUP BY o.agg_key
            HAVING bool_and(o.retry_at IS NULL OR o.retry_at <= now())
        ),
        ranked AS MATERIALIZED (
            SELECT o.id, o.agg_key,
                   row_number() OVER (PARTITION BY o.agg_key
                                      ORDER BY o.aggregate_version NULLS FIRST, o.seq) AS rn
            FROM jobq.outbox o
            WHERE o.agg_key IN (SELECT agg_key FROM held) AND o.published_at IS NULL
        ),
        chosen AS MATERIALIZED (
            SELECT id FROM ranked ORDER BY rn, agg_key LIMIT $2
        )
        SELECT o.id, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version,
               o.payload::text AS payload, o.headers, o.created_at, o.attempts
        FROM jobq.outbox o
        WHERE o.id IN (SELECT id FROM chosen)
        ORDER BY o.agg_key, o.aggregate_version NULLS FIRST, o.seq
        "#,
    )
    .bind(keys)
    .bind(batch)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(event_from_row).collect()
}

/// Releases the session's advisory locks on the aggregates `keys` ([`outbox_lock`]'s
/// result: one unlock per lock taken, so two keys of one hash release both).
pub(crate) async fn outbox_unlock(conn: &mut PgConnection, keys: &[String]) -> Result<(), Error> {
    if keys.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "SELECT count(*) FROM unnest($1::text[]) k WHERE pg_advisory_unlock($2, hashtext(k))",
    )
    .bind(keys)
    .bind(RELAY_LOCK_NS)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Marks `ids` published (the broker acknowledged them). Returns how many rows changed.
pub(crate) async fn outbox_mark_published(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<u64, Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(
        "UPDATE jobq.outbox SET published_at = now(), retry_at = NULL
         WHERE id = ANY($1) AND published_at IS NULL",
    )
    .bind(ids)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// One failed publish: the event, the error's code and message, and the backoff.
#[derive(Debug, Clone)]
pub(crate) struct PublishFailure {
    pub(crate) id: Uuid,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) retry_in_secs: f64,
}

/// Records failed publishes: one more attempt, the error, and when to try again.
pub(crate) async fn outbox_mark_failed(
    conn: &mut PgConnection,
    failures: &[PublishFailure],
) -> Result<(), Error> {
    if failures.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = failures.iter().map(|f| f.id).collect();
    let codes: Vec<&str> = failures.iter().map(|f| f.code.as_str()).collect();
    let messages: Vec<&str> = failures
        .iter()
        .map(|f| super::truncate_message(&f.message))
        .collect();
    let delays: Vec<f64> = failures.iter().map(|f| f.retry_in_secs).collect();
    sqlx::query(
        "UPDATE jobq.outbox o
         SET attempts = o.attempts + 1, last_error_code = f.code, last_error = f.message,
             retry_at = now() + make_interval(secs => f.delay)
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::float8[]) AS f(id, code, message, delay)
         WHERE o.id = f.id AND o.published_at IS NULL",
    )
    .bind(&ids)
    .bind(&codes)
    .bind(&messages)
    .bind(&delays)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Deletes up to `batch` rows published more than `older_than_secs` ago and at `from`
/// or later (`None`: any time), oldest first. Returns how many it deleted and when the
/// last of them was published, where the next batch starts (as
/// [`job_prune_batch`](super::job_prune_batch)'s, for the same reason).
pub(crate) async fn outbox_prune_batch(
    pool: &PgPool,
    older_than_secs: f64,
    from: Option<DateTime<Utc>>,
    batch: i64,
) -> Result<(u64, Option<DateTime<Utc>>), Error> {
    let (n, last): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "WITH del AS (
             DELETE FROM jobq.outbox WHERE id IN (
                 SELECT id FROM jobq.outbox
                 WHERE published_at IS NOT NULL
                   AND published_at < now() - make_interval(secs => $1)
                   AND published_at >= coalesce($3, '-infinity'::timestamptz)
                 ORDER BY published_at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED)
             RETURNING published_at)
         SELECT count(*), max(published_at) FROM del",
    )
    .bind(older_than_secs)
    .bind(batch)
    .bind(from)
    .fetch_one(pool)
    .await?;
    Ok((u64::try_from(n).unwrap_or(0), last))
}

/// Unpublished events of one type: how many, and the age of the oldest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxLag {
    /// The event type.
    pub event_type: String,
    /// Unpublished events of this type.
    pub unpublished: i64,
    /// Seconds since the oldest of them was written.
    pub oldest_age_secs: f64,
}

/// Outbox lag per event type, largest age first.
pub(crate) async fn outbox_lag(pool: &PgPool) -> Result<Vec<OutboxLag>, Error> {
    let rows = sqlx::query(
        "SELECT event_type, count(*) AS n,
                extract(epoch FROM now() - min(created_at))::float8 AS age
         FROM jobq.outbox WHERE published_at IS NULL
         GROUP BY event_type ORDER BY age DESC, event_type",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(OutboxLag {
                event_type: r.try_get("event_type")?,
                unpublished: r.try_get("n")?,
                oldest_age_secs: r.try_get("age")?,
            })
        })
        .collect()
}

/// Unpublished events whose last publish failed with one error code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublishFailures {
    /// The sink's stable code (`nats_stream_not_found`, `amqp_nack`, …).
    pub code: String,
    /// Unpublished events whose last attempt failed with it.
    pub events: i64,
}

/// Unpublished events whose last publish failed, counted by error code, most first.
pub(crate) async fn outbox_failure_codes(pool: &PgPool) -> Result<Vec<PublishFailures>, Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT last_error_code, count(*) FROM jobq.outbox
         WHERE published_at IS NULL AND last_error_code IS NOT NULL
         GROUP BY last_error_code ORDER BY count(*) DESC, last_error_code",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(code, events)| PublishFailures { code, events })
        .collect())
}

/// An unpublished event as the operator sees it.
#[derive(Debug, Clone, Serialize)]
pub struct StuckEvent {
    /// The event.
    pub event: OutboxEvent,
    /// The last publish error's code.
    pub last_error_code: Option<String>,
    /// The last publish error's message.
    pub last_error: Option<String>,
    /// When the relay tries it again.
    pub retry_at: Option<DateTime<Utc>>,
}

/// Unpublished events older than `older_than_secs` or with a failed attempt, oldest
/// first, at most `limit`.
pub(crate) async fn outbox_stuck(
    pool: &PgPool,
    older_than_secs: f64,
    limit: i64,
) -> Result<Vec<StuckEvent>, Error> {
    let rows = sqlx::query(
        "SELECT id, event_type, aggregate_type, aggregate_id, aggregate_version,
                payload::text AS payload, headers, created_at, attempts,
                last_error_code, last_error, retry_at
         FROM jobq.outbox
         WHERE published_at IS NULL
           AND (attempts > 0 OR created_at < now() - make_interval(secs => $1))
         ORDER BY seq LIMIT $2",
    )
    .bind(older_than_secs)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StuckEvent {
                event: event_from_row(r)?,
                last_error_code: r.try_get("last_error_code")?,
                last_error: r.try_get("last_error")?,
                retry_at: r.try_get("retry_at")?,
            })
        })
        .collect()
}

/// Replays event `id`: unpublished again and due now, attempts and error kept, with an
/// audit row (`outbox_replay`) in the same statement. Returns whether the event exists.
pub(crate) async fn outbox_replay(
    conn: &mut PgConnection,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<bool, Error> {
    let found: Option<bool> = sqlx::query_scalar(
        "WITH upd AS (
             UPDATE jobq.outbox o SET published_at = NULL, retry_at = NULL
             FROM (SELECT id, published_at FROM jobq.outbox WHERE id = $1 FOR UPDATE) old
             WHERE o.id = old.id
             RETURNING o.id, o.event_type, old.published_at
         ), audit AS (
             INSERT INTO jobq.job_audit (job_id, action, actor, reason, before_state, after_state, detail)
             SELECT NULL, 'outbox_replay', $2, $3,
                    CASE WHEN published_at IS NULL THEN 'unpublished' ELSE 'published' END,
                    'unpublished',
                    jsonb_build_object('event_id', id, 'event_type', event_type)
             FROM upd
         )
         SELECT true FROM upd",
    )
    .bind(id)
    .bind(actor)
    .bind(reason)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(found.is_some())
}

/// Deletes up to `batch` inbox rows applied before `before` and at `from` or later
/// (`None`: any time), oldest first. The aggregates' last applied versions
/// (`jobq.inbox_aggregates`) stay: they are what makes a stale delivery stale. Returns
/// how many rows it deleted and when the last of them was applied, where the next batch
/// starts (as [`job_prune_batch`](super::job_prune_batch)'s, for the same reason).
pub(crate) async fn inbox_prune_batch(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
    from: Option<DateTime<Utc>>,
    batch: i64,
) -> Result<(u64, Option<DateTime<Utc>>), Error> {
    let (n, last): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "WITH del AS (
             DELETE FROM jobq.inbox WHERE (consumer, event_id) IN (
                 SELECT consumer, event_id FROM jobq.inbox
                 WHERE applied_at < $1
                   AND applied_at >= coalesce($3, '-infinity'::timestamptz)
                 ORDER BY applied_at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED)
             RETURNING applied_at)
         SELECT count(*), max(applied_at) FROM del",
    )
    .bind(before)
    .bind(batch)
    .bind(from)
    .fetch_one(&mut *conn)
    .await?;
    Ok((u64::try_from(n).unwrap_or(0), last))
}

/// How many inbox rows were applied before `before`.
pub(crate) async fn inbox_prune_count(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
) -> Result<u64, Error> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.inbox WHERE applied_at < $1")
        .bind(before)
        .fetch_one(&mut *conn)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// What the inbox made of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum InboxOutcome {
    /// First time: recorded; apply its effect in the same transaction.
    New,
    /// This consumer already applied this event id.
    Duplicate,
    /// This consumer already applied version `applied` (≥ this event's) of the aggregate.
    Stale {
        /// The version applied last.
        applied: i64,
    },
}

/// Records `(consumer, event_id)` and, with a version, raises the consumer's last applied
/// version of the aggregate, both in one statement on the caller's transaction; an event
/// whose version is not above the last applied one records nothing.
pub(crate) async fn inbox_apply(
    conn: &mut PgConnection,
    consumer: &str,
    event_id: Uuid,
    aggregate: Option<(&str, &str, Option<i64>)>,
) -> Result<InboxOutcome, Error> {
    let (at, ai, av) = match aggregate {
        Some((t, i, v)) => (Some(t), Some(i), v),
        None => (None, None, None),
    };
    let row = sqlx::query(
        r#"
        WITH agg AS (
            INSERT INTO jobq.inbox_aggregates AS a (consumer, aggregate_type, aggregate_id, version, event_id)
            SELECT $1, $3, $4, $5, $2 WHERE $5::bigint IS NOT NULL AND $3::text IS NOT NULL
            ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE
                SET version = EXCLUDED.version, event_id = EXCLUDED.event_id, applied_at = now()
                WHERE a.version < EXCLUDED.version
            RETURNING 1
        ),
        ins AS (
            INSERT INTO jobq.inbox (consumer, event_id, aggregate_type, aggregate_id, aggregate_version)
            SELECT $1, $2, $3, $4, $5
            WHERE $5::bigint IS NULL OR $3::text IS NULL OR EXISTS (SELECT 1 FROM agg)
            ON CONFLICT (consumer, event_id) DO NOTHING
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM ins) AS new,
               EXISTS (SELECT 1 FROM jobq.inbox WHERE consumer = $1 AND event_id = $2) AS seen,
               (SELECT version FROM jobq.inbox_aggregates
                WHERE consumer = $1 AND aggregate_type = $3 AND aggregate_id = $4) AS applied
        "#,
    )
    .bind(consumer)
    .bind(event_id)
    .bind(at)
    .bind(ai)
    .bind(av)
    .fetch_one(&mut *conn)
    .await?;
    let new: bool = row.try_get("new")?;
    let seen: bool = row.try_get("seen")?;
    let applied: Option<i64> = row.try_get("applied")?;
    Ok(if new {
        InboxOutcome::New
    } else if seen || applied.is_none() {
        InboxOutcome::Duplicate
    } else {
        InboxOutcome::Stale {
            applied: applied.unwrap_or_default(),
        }
    })
}
