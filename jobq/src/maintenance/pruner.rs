//! The pruner: deletes terminal jobs once they are older than the retention policy, in
//! bounded batches, on one node at a time.
//!
//! Policy (defaults): `done` jobs go 7 days after they finished; `failed` and `cancelled`
//! jobs 30 days after (long enough to notice, fix and replay them). Each kind may have
//! its own [`Retention`]. A job's effect-ledger rows are deleted with the job and never
//! before, so an effect key outlives every possible replay of its job. Each statement
//! deletes at most [`PrunerConfig::batch`] rows (`FOR UPDATE SKIP LOCKED`), so pruning
//! never holds long locks or blocks workers. Inbox rows go after
//! [`PrunerConfig::inbox_after`] (default 30 days), in batches too; each aggregate's last
//! applied version is kept, so stale deliveries are still rejected. Only the leader (an advisory lock on a
//! dedicated connection, see [`Leader`](super::Leader)) prunes; when it dies, another
//! node takes over at its next interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Leader, Resume};
use crate::error::Error;
use crate::store::{self, PruneParams};

/// The advisory-lock key of the pruner's leader election ("jobqprun" in ASCII).
pub const PRUNER_LOCK: i64 = 0x6a6f_6271_7072_756e;

/// How long terminal jobs are kept after they finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// `done` jobs (default 7 days).
    pub done_after: Duration,
    /// `failed` jobs (default 30 days).
    pub failed_after: Duration,
    /// `cancelled` jobs (default 30 days).
    pub cancelled_after: Duration,
}

const DAY: Duration = Duration::from_secs(24 * 3600);

impl Default for Retention {
    fn default() -> Self {
        Retention {
            done_after: DAY * 7,
            failed_after: DAY * 30,
            cancelled_after: DAY * 30,
        }
    }
}

/// The pruner's settings.
#[derive(Debug, Clone)]
pub struct PrunerConfig {
    /// Time between passes (default 60 s).
    pub interval: Duration,
    /// `done` jobs are deleted this long after they finished (default 7 days).
    pub done_after: Duration,
    /// `failed` jobs (default 30 days).
    pub failed_after: Duration,
    /// `cancelled` jobs (default 30 days).
    pub cancelled_after: Duration,
    /// Kinds with their own retention, replacing the three above for that kind.
    pub per_kind: HashMap<String, Retention>,
    /// The most rows one statement deletes (default 1,000).
    pub batch: i64,
    /// The actor written to the pass's audit row (default `pruner`).
    pub actor: String,
    /// Inbox rows (`jobq.inbox`, one per event a consumer applied) are deleted this long
    /// after they were applied (default 30 days). A redelivery of a deleted event is no
    /// longer recognised by its id; a versioned one is still rejected as stale, since the
    /// last applied version of each aggregate (`jobq.inbox_aggregates`) is kept. Keep it
    /// longer than any broker redelivers or replays.
    pub inbox_after: Duration,
}

impl Default for PrunerConfig {
    fn default() -> Self {
        let r = Retention::default();
        PrunerConfig {
            interval: Duration::from_secs(60),
            done_after: r.done_after,
            failed_after: r.failed_after,
            cancelled_after: r.cancelled_after,
            per_kind: HashMap::new(),
            batch: 1000,
            actor: "pruner".to_owned(),
            inbox_after: DAY * 30,
        }
    }
}

/// What a pass deleted (or, for a dry run, would delete).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// `done` jobs.
    pub done: u64,
    /// `failed` jobs.
    pub failed: u64,
    /// `cancelled` jobs.
    pub cancelled: u64,
    /// Delete statements run.
    pub batches: u64,
    /// Inbox rows (not jobs; not in [`total`](Self::total)).
    pub inbox: u64,
}

impl PruneReport {
    /// All jobs.
    pub fn total(&self) -> u64 {
        self.done + self.failed + self.cancelled
    }
}

/// Deletes terminal jobs past their retention.
#[derive(Debug, Clone)]
pub struct Pruner {
    pool: PgPool,
    config: PrunerConfig,
    starts: Arc<Starts>,
}

/// The rows one rule deletes.
enum Rows<'a> {
    Jobs(&'a PruneParams<'a>),
    /// Inbox rows applied before this time.
    Inbox(DateTime<Utc>),
}

/// What a pass has done so far: its counts, and its audit row once it has one.
#[derive(Debug, Default)]
struct Pass {
    report: PruneReport,
    audit_row: Option<i64>,
}

/// A rule's key among [`Starts`]: its state (`inbox` for the inbox) and kind.
type RuleKey = (&'static str, Option<String>);

/// Where each rule's next pass starts: from the oldest row, or, while passes from there
/// are slow, from the last row the rule deleted ([`Resume`]; timed by each full pass's
/// first batch). At the end of a five-minute hold, first batches from the oldest took one
/// to two seconds.
#[derive(Debug, Default)]
struct Starts(Mutex<HashMap<RuleKey, Arc<Resume<DateTime<Utc>>>>>);

impl Starts {
    fn of(&self, key: &RuleKey) -> Arc<Resume<DateTime<Utc>>> {
        let mut starts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        starts.entry(key.clone()).or_default().clone()
    }
}

/// One delete rule: a state, an age, and which kinds.
struct Rule<'a> {
    state: &'static str,
    age: Duration,
    kind: Option<&'a str>,
}

impl Pruner {
    /// A pruner over `pool`.
    pub fn new(pool: PgPool, config: PrunerConfig) -> Self {
        Pruner {
            pool,
            config,
            starts: Arc::default(),
        }
    }

    fn rules(&self) -> Vec<Rule<'_>> {
        let c = &self.config;
        let mut rules = vec![
            Rule {
                state: "done",
                age: c.done_after,
                kind: None,
            },
            Rule {
                state: "failed",
                age: c.failed_after,
                kind: None,
            },
            Rule {
                state: "cancelled",
                age: c.cancelled_after,
                kind: None,
            },
        ];
        for (kind, r) in &c.per_kind {
            rules.push(Rule {
                state: "done",
                age: r.done_after,
                kind: Some(kind),
            });
            rules.push(Rule {
                state: "failed",
                age: r.failed_after,
                kind: Some(kind),
            });
            rules.push(Rule {
                state: "cancelled",
                age: r.cancelled_after,
                kind: Some(kind),
            });
        }
        rules
    }

    async fn now(&self, now: Option<DateTime<Utc>>) -> Result<DateTime<Utc>, Error> {
        match now {
            Some(now) => Ok(now),
            None => store::db_now(&mut *self.pool.acquire().await?).await,
        }
    }

    /// One pass, by the database's clock: every rule, batch after batch, until less than
    /// a batch is due. Writes one `prune` audit row when it deleted anything: inserted
    /// with the first batch that deletes and brought up to date with each later one, in
    /// that batch's transaction, so the row accounts for every deletion that committed,
    /// also when the pass fails halfway.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached (batches already deleted
    /// stay deleted).
    pub async fn run_once(&self) -> Result<PruneReport, Error> {
        self.run_once_at(None).await
    }

    /// One pass as if the time were `now` (`None`: the database's clock).
    ///
    /// # Errors
    ///
    /// As [`run_once`](Self::run_once).
    pub async fn run_once_at(&self, now: Option<DateTime<Utc>>) -> Result<PruneReport, Error> {
        let now = self.now(now).await?;
        let except: Vec<String> = self.config.per_kind.keys().cloned().collect();
        let mut pass = Pass::default();
        for rule in self.rules() {
            let p = params(&rule, now, &except);
            let key = (rule.state, rule.kind.map(str::to_owned));
            self.deletions(&key, &mut pass, Rows::Jobs(&p)).await?;
        }
        let inbox_before = cutoff(now, self.config.inbox_after);
        self.deletions(&("inbox", None), &mut pass, Rows::Inbox(inbox_before))
            .await?;
        Ok(pass.report)
    }

    /// Deletes the rows of the rule `key` batch after batch, each from where the one
    /// before ended (see `job_prune_batch`), the first from where [`Starts`] says, until
    /// less than a batch is due; counted in `pass`.
    async fn deletions(&self, key: &RuleKey, pass: &mut Pass, rows: Rows<'_>) -> Result<(), Error> {
        let batch = self.config.batch.max(1);
        let size = u64::try_from(batch).unwrap_or(u64::MAX);
        let resume = self.starts.of(key);
        let start = resume.start(Instant::now());
        let (mut from, mut full) = (start.flatten(), start.is_none());
        loop {
            let mut tx = self.pool.begin().await?;
            let started = Instant::now();
            let (n, last) = match &rows {
                Rows::Jobs(p) => store::job_prune_batch(&mut tx, p, from, batch).await?,
                Rows::Inbox(before) => {
                    store::inbox_prune_batch(&mut tx, *before, from, batch).await?
                }
            };
            if std::mem::take(&mut full) {
                resume.ran_full(started, started.elapsed());
            }
            from = last.or(from);
            // Counted once committed, as the audit row says.
            let mut report = pass.report;
            report.batches += 1;
            add(&mut report, key.0, n);
            self.audit(&mut tx, &mut pass.audit_row, n, &report).await?;
            tx.commit().await?;
            pass.report = report;
            resume.reached(last);
            if n < size {
                return Ok(());
            }
        }
    }

    /// Records every rule's last full pass as one that took `took` (tests: a slow pass
    /// without a slow table).
    #[cfg(test)]
    pub(crate) fn ran_full_passes(&self, took: Duration) {
        let starts = self.starts.0.lock().unwrap_or_else(|p| p.into_inner());
        for resume in starts.values() {
            resume.ran_full(Instant::now(), took);
        }
    }

    /// After a batch that deleted `n` rows, in its transaction: writes the pass's audit
    /// row with the counts so far (`report`), or brings it up to date.
    async fn audit(
        &self,
        tx: &mut sqlx::PgConnection,
        audit_row: &mut Option<i64>,
        n: u64,
        report: &PruneReport,
    ) -> Result<(), Error> {
        if n > 0 {
            let detail = serde_json::to_value(report).unwrap_or_default();
            let row = store::audit_prune_pass(tx, *audit_row, &self.config.actor, &detail).await?;
            *audit_row = Some(row);
        }
        Ok(())
    }

    /// Counts what a pass at `now` would delete; deletes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn dry_run(&self, now: Option<DateTime<Utc>>) -> Result<PruneReport, Error> {
        let now = self.now(now).await?;
        let except: Vec<String> = self.config.per_kind.keys().cloned().collect();
        let mut report = PruneReport::default();
        let mut conn = self.pool.acquire().await?;
        for rule in self.rules() {
            let n = store::job_prune_count(&mut conn, &params(&rule, now, &except)).await?;
            add(&mut report, rule.state, n);
        }
        let inbox_before = cutoff(now, self.config.inbox_after);
        report.inbox = store::inbox_prune_count(&mut conn, inbox_before).await?;
        Ok(report)
    }

    /// Runs a pass every (jittered) interval while this node leads, until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        // Each pass borrows the leadership in turn: the lock is never contended.
        let leader = tokio::sync::Mutex::new(Leader::new(self.pool.clone(), PRUNER_LOCK));
        let (this, leading) = (&self, &leader);
        super::every(self.config.interval, stop, || async move {
            if !leading.lock().await.check().await {
                return;
            }
            match this.run_once().await {
                Ok(r) if r.total() > 0 => info!(
                    done = r.done,
                    failed = r.failed,
                    cancelled = r.cancelled,
                    inbox = r.inbox,
                    batches = r.batches,
                    "pruner deleted jobs past their retention"
                ),
                Ok(r) if r.inbox > 0 => info!(
                    inbox = r.inbox,
                    "pruner deleted inbox rows past their retention"
                ),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "pruner pass failed"),
            }
        })
        .await;
        leader.into_inner().resign().await;
    }
}

fn params<'a>(rule: &Rule<'a>, now: DateTime<Utc>, except: &'a [String]) -> PruneParams<'a> {
    PruneParams {
        state: rule.state,
        before: cutoff(now, rule.age),
        kind: rule.kind,
        except_kinds: except,
    }
}

/// `now` less `age`: what is older goes. A retention too long to subtract keeps
/// everything (year 1 is before any row).
fn cutoff(now: DateTime<Utc>, age: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .filter(|t| chrono::Datelike::year(t) >= 1)
        .or_else(|| DateTime::from_timestamp(-62_135_596_800, 0))
        .unwrap_or(now)
}

fn add(report: &mut PruneReport, state: &str, n: u64) {
    match state {
        "done" => report.done += n,
        "failed" => report.failed += n,
        "inbox" => report.inbox += n,
        _ => report.cancelled += n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_too_long_to_subtract_keeps_everything() {
        let now = Utc::now();
        let first = DateTime::from_timestamp(-62_135_596_800, 0).unwrap();
        assert_eq!(cutoff(now, Duration::MAX), first);
        assert_eq!(
            cutoff(now, Duration::from_secs(200_000_000 * 86_400)),
            first
        );
        assert_eq!(
            cutoff(now, Duration::from_secs(60)),
            now - chrono::Duration::seconds(60)
        );
    }
}
