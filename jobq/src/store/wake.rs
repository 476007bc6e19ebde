//! Statements that wake producers apart from the insert that made their jobs: the
//! wake-ups sent after a commit (see [`crate::pooled`]).

use sqlx::{PgConnection, PgPool, Row};

use super::NOTIFY_CHANNEL;
use crate::error::Error;

/// How an insert wakes the producers of the queues it inserted due jobs into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake<'a> {
    /// It does not: the caller wakes them after the commit, or nobody does.
    No,
    /// The statement notifies; PostgreSQL delivers the notification when the
    /// transaction commits, and folds a transaction's identical ones into one.
    InStatement,
    /// As [`Wake::InStatement`], unless the statement's database is one of these (as
    /// [`database_sql!`] names them): then it does not notify, and returns its
    /// transaction ([`TxOf`]) for a wake-up sent once that transaction has committed.
    UnlessRouted(&'a [String]),
}

impl<'a> Wake<'a> {
    /// The channel to bind for the statement's own notification, if it may send one.
    pub(crate) fn channel(self) -> Option<&'static str> {
        match self {
            Wake::No => None,
            Wake::InStatement | Wake::UnlessRouted(_) => Some(NOTIFY_CHANNEL),
        }
    }

    /// The routed databases to bind (`NULL`: none).
    pub(crate) fn routes(self) -> Option<&'a [String]> {
        match self {
            Wake::UnlessRouted(routes) => Some(routes),
            Wake::No | Wake::InStatement => None,
        }
    }
}

/// Where an insert given routes ([`Wake::UnlessRouted`]) ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxOf {
    /// The database, as [`database_sql!`] names it.
    pub(crate) database: String,
    /// The transaction's id (a 64-bit `xid8`; it does not wrap around) when the database
    /// was among the routes, so that the statement did not notify.
    pub(crate) xid: Option<i64>,
}

impl TxOf {
    /// The `tx_database` and `tx_xid` columns of an insert's row.
    pub(crate) fn from_row(row: &sqlx::postgres::PgRow) -> Result<Option<TxOf>, Error> {
        let database: Option<String> = row.try_get("tx_database")?;
        let xid: Option<i64> = row.try_get("tx_xid")?;
        Ok(database.map(|database| TxOf { database, xid }))
    }
}

/// The database `pool` connects to, as [`database_sql!`] names it.
pub(crate) async fn database_of(pool: &PgPool) -> Result<String, Error> {
    Ok(
        sqlx::query_scalar(concat!("SELECT ", database_sql!(), " AS database"))
            .fetch_one(pool)
            .await?,
    )
}

/// Notifies `queues` inside the caller's transaction (delivered when it commits): the
/// way back when a wake-up meant for after the commit has no pool to go through.
pub(crate) async fn queues_notify(conn: &mut PgConnection, queues: &[&str]) -> Result<(), Error> {
    sqlx::query("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q")
        .bind(NOTIFY_CHANNEL)
        .bind(queues)
        .execute(conn)
        .await?;
    Ok(())
}

/// Sends, in one statement of its own, the wake-ups of `queues` and of `watched`
/// transactions' queues (pairs of an xid and a queue) whose transaction has committed;
/// returns the watched xids whose transaction is still open. An aborted transaction
/// wakes nothing; one too old for PostgreSQL to know its fate wakes its queues.
///
/// A transaction counts as committed only once no snapshot can see it running
/// (`pg_xact_status` looks at the running transactions first), so a producer woken by
/// this sees its jobs.
pub(crate) async fn committed_notify(
    conn: &mut PgConnection,
    queues: &[String],
    watched_xids: &[i64],
    watched_queues: &[&str],
) -> Result<Vec<i64>, Error> {
    // One row per (xid, queue), the plain queues with no xid (a NULL status, so they
    // notify); PostgreSQL folds a transaction's identical notifications, so a queue
    // named twice wakes once. One aggregate row, so the notifications are sent however
    // many rows there are. (Deduplicating with DISTINCT, a join and a UNION first cost
    // a sixth more per statement.)
    let xids: Vec<Option<i64>> = queues
        .iter()
        .map(|_| None)
        .chain(watched_xids.iter().copied().map(Some))
        .collect();
    let all_queues: Vec<&str> = queues
        .iter()
        .map(String::as_str)
        .chain(watched_queues.iter().copied())
        .collect();
    // An aggregate evaluates its argument for every row: `looked` sends the wake-ups.
    let (open, _looked): (Option<Vec<i64>>, i64) = sqlx::query_as(
        r#"
        SELECT array_agg(w.xid) FILTER (WHERE s.status = 'in progress') AS open,
               count((CASE WHEN s.status IS NULL OR s.status = 'committed'
                           THEN pg_notify($1, w.q) END) IS NULL) AS looked
        FROM unnest($2::int8[], $3::text[]) AS w(xid, q),
             LATERAL (SELECT pg_xact_status(w.xid::text::xid8) AS status) s
        "#,
    )
    .bind(NOTIFY_CHANNEL)
    .bind(&xids)
    .bind(&all_queues)
    .fetch_one(conn)
    .await?;
    Ok(open.unwrap_or_default())
}
