//! The scheduler: enqueues each periodic schedule's slots, exactly once across all nodes,
//! and fails pending jobs past their maximum age.
//!
//! Schedules are rows in `jobq.schedules`, upserted by every runtime that serves them.
//! A row's `next_slot` is the durable cursor (the earliest slot not yet handled), so a
//! restart, a second node or a handoff neither repeats nor forgets a slot: a pass locks
//! the row (`FOR UPDATE SKIP LOCKED`), enqueues the due slots — each job keyed
//! `schedule:<name>:<slot>` by the idempotency index, so even two passes that both
//! thought a slot due could not enqueue it twice — and moves the cursor, in one
//! transaction. Slots whose time passed while no node ran are handled by the schedule's
//! [`Missed`] policy.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::Error;
use crate::store::{self, NewJob};

/// What to do with slots whose time passed while no node ran (or the schedule was paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// Enqueue nothing for them; only a slot that is on time runs.
    Skip,
    /// Enqueue one job, for the latest of them (the default).
    #[default]
    Once,
    /// Enqueue each of them, at most the latest `max`.
    All {
        /// The most missed slots enqueued at once.
        max: u32,
    },
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missed::Skip => f.write_str("skip"),
            Missed::Once => f.write_str("once"),
            Missed::All { max } => write!(f, "all(max = {max})"),
        }
    }
}

impl FromStr for Missed {
    type Err = Error;

    /// `skip`, `once` or `all(max = N)` with `N` at least 1.
    fn from_str(s: &str) -> Result<Self, Error> {
        let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        match compact.as_str() {
            "skip" => return Ok(Missed::Skip),
            "once" => return Ok(Missed::Once),
            _ => {}
        }
        compact
            .strip_prefix("all(max=")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| *n >= 1)
            .map(|max| Missed::All { max })
            .ok_or_else(|| {
                Error::invalid(
                    "invalid_schedule",
                    format!("missed-slot policy `{s}`: expected `skip`, `once` or `all(max = N)`"),
                )
            })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Spec {
    Cron(String),
    Every(Duration),
}

/// When a periodic job runs: a cron expression (seconds optional) in a named time zone,
/// or a fixed interval; with a stable name and a [`Missed`] policy.
///
/// ```
/// use std::time::Duration;
/// use jobq::{Missed, Schedule};
/// let nightly = Schedule::cron("0 3 * * *").tz("Europe/Berlin").named("nightly-eu");
/// let often = Schedule::every(Duration::from_secs(900)).missed(Missed::Skip);
/// let next = nightly.next_after("2026-03-28T12:00:00Z".parse().unwrap()).unwrap();
/// assert_eq!(next.to_rfc3339(), "2026-03-29T01:00:00+00:00"); // 03:00 CEST
/// # let _ = often;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    name: Option<String>,
    spec: Spec,
    tz: String,
    missed: Missed,
}

/// A schedule parsed once: the cron pattern and the zone.
#[derive(Debug, Clone)]
struct Compiled {
    cron: Option<croner::Cron>,
    every: Option<Duration>,
    tz: chrono_tz::Tz,
}

impl Schedule {
    /// Slots at the times a cron expression names (5 fields, or 6 with seconds first), in
    /// UTC unless [`tz`](Self::tz) says otherwise.
    pub fn cron(expression: impl Into<String>) -> Self {
        Schedule {
            name: None,
            spec: Spec::Cron(expression.into()),
            tz: "UTC".to_owned(),
            missed: Missed::Once,
        }
    }

    /// Slots every `interval`, at multiples of it since the Unix epoch (so every node agrees
    /// on them); the time zone does not matter.
    pub fn every(interval: Duration) -> Self {
        Schedule {
            name: None,
            spec: Spec::Every(interval),
            tz: "UTC".to_owned(),
            missed: Missed::Once,
        }
    }

    /// The IANA time zone the cron expression is read in (`Europe/Berlin`); daylight saving
    /// time is handled: a slot in a skipped hour runs right after it, one in a repeated
    /// hour runs once.
    pub fn tz(mut self, tz: impl Into<String>) -> Self {
        self.tz = tz.into();
        self
    }

    /// The schedule's stable name (default: the job's kind). Several schedules of one kind
    /// need names of their own.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The missed-slot policy (default [`Missed::Once`]).
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// The name, if one was given.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The expression as stored and shown: the cron text, or `every 15m`.
    pub fn expression(&self) -> String {
        match &self.spec {
            Spec::Cron(c) => c.clone(),
            Spec::Every(d) => format!("every {}", format_duration(*d)),
        }
    }

    /// Checks the expression and the zone.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with code `invalid_schedule`.
    pub fn validate(&self) -> Result<(), Error> {
        self.compile().map(drop)
    }

    /// The first slot strictly after `t`.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the schedule does not parse or has no slot after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Result<DateTime<Utc>, Error> {
        self.compile()?.next_after(t)
    }

    fn compile(&self) -> Result<Compiled, Error> {
        let invalid = |msg: String| Error::invalid("invalid_schedule", msg);
        let tz = chrono_tz::Tz::from_str(&self.tz)
            .map_err(|_| invalid(format!("unknown time zone `{}`", self.tz)))?;
        match &self.spec {
            Spec::Cron(expr) => {
                let cron = parse_cron(expr).map_err(invalid)?;
                Ok(Compiled {
                    cron: Some(cron),
                    every: None,
                    tz,
                })
            }
            Spec::Every(d) if d.as_millis() == 0 => {
                Err(invalid("`every` must be longer than 0".into()))
            }
            Spec::Every(d) => Ok(Compiled {
                cron: None,
                every: Some(*d),
                tz,
            }),
        }
    }
}

/// Parses a cron expression as jobq reads them (seconds optional); the macro checks with
/// the same rules.
fn parse_cron(expr: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| format!("cron expression `{expr}`: {e}"))
}

fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

impl Compiled {
    fn next_after(&self, t: DateTime<Utc>) -> Result<DateTime<Utc>, Error> {
        if let Some(every) = self.every {
            let step = i64::try_from(every.as_millis()).unwrap_or(i64::MAX);
            let now = t.timestamp_millis();
            let next = (now.div_euclid(step) + 1).saturating_mul(step);
            return DateTime::from_timestamp_millis(next)
                .ok_or_else(|| Error::invalid("invalid_schedule", "no slot after this time"));
        }
        let Some(cron) = &self.cron else {
            return Err(Error::invalid("invalid_schedule", "empty schedule"));
        };
        let local = self.tz.from_utc_datetime(&t.naive_utc());
        cron.find_next_occurrence(&local, false)
            .map(|d| d.with_timezone(&Utc))
            .map_err(|e| Error::invalid("invalid_schedule", format!("no slot after {t}: {e}")))
    }

    /// The slots to enqueue at `now` for a cursor at `cursor` (the earliest unhandled slot),
    /// and the next cursor (the first slot after `now`).
    fn due(
        &self,
        cursor: DateTime<Utc>,
        now: DateTime<Utc>,
        missed: Missed,
        grace: Duration,
    ) -> Result<(Vec<DateTime<Utc>>, DateTime<Utc>), Error> {
        /// Bounds the walk over a very long outage of a very frequent schedule.
        const MAX_STEPS: usize = 1_000_000;
        let keep = match missed {
            Missed::All { max } => usize::try_from(max).unwrap_or(usize::MAX).max(1),
            Missed::Skip | Missed::Once => 1,
        };
        let mut latest = std::collections::VecDeque::with_capacity(keep.min(1024));
        let mut s = cursor;
        let mut steps = 0;
        while s <= now && steps < MAX_STEPS {
            if latest.len() == keep {
                latest.pop_front();
            }
            latest.push_back(s);
            s = self.next_after(s)?;
            steps += 1;
        }
        if s <= now {
            s = self.next_after(now)?;
        }
        let slots: Vec<DateTime<Utc>> = latest.into_iter().collect();
        let Some(last) = slots.last().copied() else {
            return Ok((slots, s));
        };
        let period = (s - last).to_std().unwrap_or(grace);
        let late = (now - last).to_std().unwrap_or_default() > grace.min(period);
        let slots = match missed {
            Missed::Skip if late => Vec::new(),
            _ => slots,
        };
        Ok((slots, s))
    }
}

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Time between passes (default 1 s): slots are enqueued at most this late.
    pub interval: Duration,
    /// How late a slot may be enqueued and still count as on time for [`Missed::Skip`]
    /// (default 60 s, and never more than the schedule's period).
    pub grace: Duration,
    /// The most expired jobs one statement fails (default 1,000).
    pub batch: i64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            interval: Duration::from_secs(1),
            grace: Duration::from_secs(60),
            batch: 1000,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerReport {
    /// Jobs enqueued for slots (duplicates not counted).
    pub enqueued: u64,
    /// The slots enqueued, by schedule name.
    pub slots: BTreeMap<String, Vec<DateTime<Utc>>>,
    /// Pending jobs failed with code `expired`.
    pub expired: u64,
}

/// One schedule a runtime serves: the schedule and the job template its slots copy.
#[derive(Debug, Clone)]
pub(crate) struct Periodic {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) template: NewJob,
}

/// Enqueues periodic slots and expires old jobs.
#[derive(Debug, Clone)]
pub struct Scheduler {
    pool: PgPool,
    config: SchedulerConfig,
    entries: Vec<(Periodic, Compiled)>,
}

impl Scheduler {
    pub(crate) fn new(
        pool: PgPool,
        config: SchedulerConfig,
        periodic: Vec<Periodic>,
    ) -> Result<Self, Error> {
        let mut entries = Vec::with_capacity(periodic.len());
        for p in periodic {
            let compiled = p.schedule.compile()?;
            entries.push((p, compiled));
        }
        Ok(Scheduler {
            pool,
            config,
            entries,
        })
    }

    /// The names of the schedules it serves.
    pub fn schedules(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(p, _)| p.name.as_str())
    }

    /// Writes (or updates) the rows of its schedules, by the database's clock: a new
    /// schedule starts at its first slot after now; a changed expression or zone restarts
    /// from now; otherwise the cursor and the pause are kept.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn register(&self) -> Result<(), Error> {
        self.register_at(None).await
    }

    /// As [`register`](Self::register), as if the time were `now`.
    ///
    /// # Errors
    ///
    /// As [`register`](Self::register).
    pub async fn register_at(&self, now: Option<DateTime<Utc>>) -> Result<(), Error> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        let now = match now {
            Some(t) => t,
            None => store::db_now(&mut conn).await?,
        };
        for (p, compiled) in &self.entries {
            let first = compiled.next_after(now)?;
            store::schedule_upsert(
                &mut conn,
                &store::ScheduleUpsert {
                    name: &p.name,
                    expression: &p.schedule.expression(),
                    tz: &p.schedule.tz,
                    missed: &p.schedule.missed.to_string(),
                    job: &p.template,
                    first_slot: first,
                },
            )
            .await?;
        }
        Ok(())
    }

    /// One pass, by the database's clock.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once(&self) -> Result<SchedulerReport, Error> {
        self.run_once_at(None).await
    }

    /// One pass as if the time were `now` (`None`: the database's clock).
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once_at(&self, now: Option<DateTime<Utc>>) -> Result<SchedulerReport, Error> {
        self.pass(now, None).await
    }

    /// One pass; with `expiry`, the expiry sweep only when that pace says it is due.
    async fn pass(
        &self,
        now: Option<DateTime<Utc>>,
        expiry: Option<&super::Pace>,
    ) -> Result<SchedulerReport, Error> {
        let mut report = SchedulerReport::default();
        let names: Vec<String> = self.entries.iter().map(|(p, _)| p.name.clone()).collect();
        if !names.is_empty() {
            let due = {
                let mut conn = self.pool.acquire().await?;
                store::schedules_due(&mut conn, &names, now).await?
            };
            for name in due {
                let Some((p, compiled)) = self.entries.iter().find(|(p, _)| p.name == name) else {
                    continue;
                };
                let slots = self.fire(p, compiled, now).await?;
                if !slots.is_empty() {
                    report.enqueued += u64::try_from(slots.len()).unwrap_or(0);
                    report.slots.insert(name, slots);
                }
            }
            self.gauges(&names, now).await?;
        }
        // Expired jobs are never claimed (the claim tests `expires_at`), so a sweep that
        // has grown slow may wait: it only writes down their ends.
        let sweep = async {
            loop {
                let mut conn = self.pool.acquire().await?;
                let n = store::job_expire_due(&mut conn, self.config.batch, now).await?;
                report.expired += n;
                if n < u64::try_from(self.config.batch).unwrap_or(0) {
                    return Ok::<_, Error>(());
                }
            }
        };
        super::paced(expiry, sweep).await.transpose()?;
        Ok(report)
    }

    /// Refreshes the schedule gauges of the schedules it serves.
    async fn gauges(&self, names: &[String], now: Option<DateTime<Utc>>) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        let now = match now {
            Some(t) => t,
            None => store::db_now(&mut conn).await?,
        };
        for row in store::schedules_list(&mut conn).await? {
            if names.contains(&row.name) {
                let lag = (now - row.next_slot).to_std().unwrap_or_default();
                crate::metrics::schedule_gauges(&row.name, lag.as_secs_f64(), row.paused);
            }
        }
        Ok(())
    }

    /// Enqueues the due slots of one schedule and moves its cursor, in one transaction
    /// holding its row; nothing when another node holds it.
    async fn fire(
        &self,
        p: &Periodic,
        compiled: &Compiled,
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<DateTime<Utc>>, Error> {
        let mut tx = self.pool.begin().await?;
        let Some(row) = store::schedule_lock(&mut tx, &p.name, now).await? else {
            return Ok(Vec::new());
        };
        if row.paused || row.next_slot > row.now {
            return Ok(Vec::new());
        }
        let (slots, next) =
            compiled.due(row.next_slot, row.now, p.schedule.missed, self.config.grace)?;
        let jobs: Vec<NewJob> = slots
            .iter()
            .map(|slot| {
                let mut job = p.template.clone();
                job.idempotency_key = Some(slot_key(&p.name, *slot));
                job.run_after = Some(*slot);
                job.delay_secs = None;
                job
            })
            .collect();
        let queues = NewJob::due_queues(&jobs);
        let wake = store::Wake {
            queues: &queues,
            recent: &[],
        };
        let (done, _) = store::job_insert_many(&mut tx, &jobs, wake).await?;
        let mut enqueued = Vec::new();
        for (slot, e) in slots.iter().zip(&done) {
            if !e.duplicate {
                enqueued.push(*slot);
                crate::metrics::enqueued(&p.template.kind, &p.template.queue, 1);
            }
        }
        let last = slots.last().copied().zip(done.last().map(|e| e.id.0));
        store::schedule_advance(&mut tx, &p.name, next, last).await?;
        tx.commit().await?;
        crate::metrics::schedule_slots(&p.name, u64::try_from(enqueued.len()).unwrap_or(0));
        Ok(enqueued)
    }

    /// Runs a pass every (jittered) interval until `stop`. An expiry sweep that has grown
    /// slow is spaced out (see [`Pace`](super::Pace)).
    pub async fn run(self, stop: CancellationToken) {
        let this = &self;
        let expiry = &super::Pace::default();
        super::every(self.config.interval, stop, || async move {
            match this.pass(None, Some(expiry)).await {
                Ok(r) if r.enqueued + r.expired > 0 => info!(
                    enqueued = r.enqueued,
                    expired = r.expired,
                    "scheduler enqueued periodic slots or expired old jobs"
                ),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "scheduler pass failed"),
            }
        })
        .await;
    }
}

/// The idempotency key of a schedule's slot.
pub(crate) fn slot_key(name: &str, slot: DateTime<Utc>) -> String {
    format!(
        "schedule:{name}:{}",
        slot.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn missed_parses_and_prints() {
        assert_eq!("skip".parse::<Missed>().unwrap(), Missed::Skip);
        assert_eq!(
            "all(max = 3)".parse::<Missed>().unwrap(),
            Missed::All { max: 3 }
        );
        assert_eq!(Missed::All { max: 3 }.to_string(), "all(max = 3)");
        assert!("all(max = 0)".parse::<Missed>().is_err());
        assert!("sometimes".parse::<Missed>().is_err());
    }

    #[test]
    fn berlin_spring_forward_and_fall_back() {
        let s = Schedule::cron("30 2 * * *").tz("Europe/Berlin");
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist, runs at 03:00.
        assert_eq!(
            s.next_after(t("2026-03-28T12:00:00Z")).unwrap(),
            t("2026-03-29T01:00:00Z")
        );
        // The next day: 02:30 CEST.
        assert_eq!(
            s.next_after(t("2026-03-29T01:00:00Z")).unwrap(),
            t("2026-03-30T00:30:00Z")
        );
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice, runs once.
        let first = s.next_after(t("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(first, t("2026-10-25T00:30:00Z"));
        assert_eq!(s.next_after(first).unwrap(), t("2026-10-26T01:30:00Z"));
    }

    #[test]
    fn every_aligns_to_the_epoch() {
        let s = Schedule::every(Duration::from_secs(900));
        assert_eq!(
            s.next_after(t("2026-01-01T00:07:00Z")).unwrap(),
            t("2026-01-01T00:15:00Z")
        );
        assert_eq!(s.expression(), "every 15m");
    }

    #[test]
    fn missed_policies_pick_slots() {
        let c = Schedule::every(Duration::from_secs(10)).compile().unwrap();
        let cursor = t("2026-01-01T00:00:10Z");
        let now = t("2026-01-01T00:00:45Z"); // slots 10, 20, 30, 40 due; 40 is 5 s old
        let g = Duration::from_secs(60);
        let (once, next) = c.due(cursor, now, Missed::Once, g).unwrap();
        assert_eq!(once, vec![t("2026-01-01T00:00:40Z")]);
        assert_eq!(next, t("2026-01-01T00:00:50Z"));
        let (all, _) = c.due(cursor, now, Missed::All { max: 3 }, g).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0], t("2026-01-01T00:00:20Z"));
        let (skip, _) = c.due(cursor, now, Missed::Skip, g).unwrap();
        assert_eq!(
            skip,
            vec![t("2026-01-01T00:00:40Z")],
            "on time within its period"
        );
        let late = t("2026-01-01T00:00:49Z");
        let (skip, _) = c
            .due(cursor, late, Missed::Skip, Duration::from_secs(5))
            .unwrap();
        assert!(skip.is_empty(), "9 s late with a 5 s grace");
    }

    #[test]
    fn bad_schedules_are_classified() {
        assert!(Schedule::cron("61 * * * *").validate().is_err());
        assert!(
            Schedule::cron("* * * * *")
                .tz("Mars/Olympus")
                .validate()
                .is_err()
        );
        assert!(Schedule::every(Duration::ZERO).validate().is_err());
    }
}
