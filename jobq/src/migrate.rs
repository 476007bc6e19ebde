//! `jobq::migrate(&pool)`: creates and upgrades jobq's schema.
//!
//! jobq keeps its own bookkeeping in `jobq.schema_migrations`, never in sqlx's
//! `_sqlx_migrations`, so an application's own `sqlx::migrate!` on the same database
//! neither sees jobq's versions nor reports them missing (`VersionMissing`), in either
//! order. Migrations run in one transaction under an advisory lock, so any number of
//! processes may call `migrate` at once; each version is applied exactly once.

use sqlx::PgPool;

use crate::error::Error;
use crate::store;

/// One migration: a version, a name, and its SQL (from `migrations/` at the repository
/// root, embedded at compile time).
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Increasing from 1 (numbers may be skipped).
    pub version: i64,
    /// A short name.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// Every migration jobq has, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "jobs",
        sql: include_str!("../migrations/0001_jobs.sql"),
    },
    Migration {
        version: 2,
        name: "operations",
        sql: include_str!("../migrations/0002_operations.sql"),
    },
    Migration {
        version: 3,
        name: "fencing",
        sql: include_str!("../migrations/0003_fencing.sql"),
    },
    Migration {
        version: 4,
        name: "scale",
        sql: include_str!("../migrations/0004_scale.sql"),
    },
    Migration {
        version: 5,
        name: "time",
        sql: include_str!("../migrations/0005_time.sql"),
    },
    Migration {
        version: 6,
        name: "outbox",
        sql: include_str!("../migrations/0006_outbox.sql"),
    },
    Migration {
        version: 7,
        name: "dashboard",
        sql: include_str!("../migrations/0007_dashboard.sql"),
    },
    Migration {
        version: 8,
        name: "ordering",
        sql: include_str!("../migrations/0008_ordering.sql"),
    },
    Migration {
        version: 9,
        name: "limits",
        sql: include_str!("../migrations/0009_limits.sql"),
    },
    Migration {
        version: 10,
        name: "traces",
        sql: include_str!("../migrations/0010_traces.sql"),
    },
    Migration {
        version: 11,
        name: "limit_gens",
        sql: include_str!("../migrations/0011_limit_gens.sql"),
    },
    Migration {
        version: 12,
        name: "outbox_publish",
        sql: include_str!("../migrations/0012_outbox_publish.sql"),
    },
    Migration {
        version: 13,
        name: "outbox_lean",
        sql: include_str!("../migrations/0013_outbox_lean.sql"),
    },
    Migration {
        version: 14,
        name: "state_id_churn",
        sql: include_str!("../migrations/0014_state_id_churn.sql"),
    },
];

/// Applies every migration not yet applied, in one transaction.
///
/// # Errors
///
/// [`Error::Migrate`] naming the migration that failed, or [`Error::Database`] when the
/// database cannot be reached. Nothing is applied when an error is returned.
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    let mut tx = pool.begin().await?;
    let applied = store::migrations_begin(&mut tx).await?;
    for m in MIGRATIONS {
        if applied.contains(&m.version) {
            continue;
        }
        store::migration_apply(&mut tx, m.version, m.name, m.sql).await?;
        tracing::info!(version = m.version, name = m.name, "jobq migration applied");
    }
    tx.commit().await?;
    Ok(())
}
