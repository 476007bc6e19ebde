//! The producer: one per queue. It claims as many jobs as it has free slots, plus a few
//! ahead of them while its handlers are short (see [`Ahead`]), hands each to an executor
//! task, and when the queue runs dry waits for a wake-up or the poll interval. While the
//! queue is busy, two claims may be in flight at once (see [`MAX_CLAIMS`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, warn};

use super::completer::{Completer, write_one};
use super::executor::{
    AttemptEnv, SlotTurn, attempt_context, attempt_span, execute, outcome_write, recorded,
    run_claimed,
};
use super::lease::RunningSet;
use super::{Config, DrainReport, DrainedAttempt};
use crate::error::Error;
use crate::maintenance::Pace;
use crate::notify::TRAIL;
use crate::store::{ClaimParams, ClaimPosition, ClaimedJob};

pub(crate) struct Producer {
    pub(crate) config: Arc<Config>,
    pub(crate) queue: String,
    pub(crate) concurrency: usize,
    /// The most jobs claimed ahead of free slots.
    pub(crate) prefetch: usize,
    pub(crate) wake: Arc<Notify>,
    pub(crate) running: RunningSet,
    pub(crate) completer: Completer,
    pub(crate) attempts: TaskTracker,
    /// Where this runtime's completer freed jobs (see [`Rewinds`]).
    pub(crate) rewinds: Arc<Rewinds>,
}

impl Producer {
    pub(crate) async fn run(self, stop: CancellationToken) {
        // `slots` bounds the handlers running; `held` the jobs claimed and not finished,
        // which is the slots plus however many `ahead` grants.
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let held = Arc::new(Semaphore::new(self.concurrency));
        let finished = Arc::new(AtomicU64::new(0));
        let mut ahead = Ahead::new(self.prefetch);
        let mut line = None;
        let mut backoff = Duration::from_millis(100);
        // Whether the last claim came back full: the queue has more due jobs than slots.
        let mut busy = false;
        // The wait before the next trailing claim (see `notify::TRAIL`), once the queue
        // runs dry after claims that found jobs.
        let mut trail = None;
        let mut cursor = Cursor::new(self.config.kinds.len());
        // Claims in flight, and the permits gathered for the next one.
        let mut claims = FuturesUnordered::new();
        let mut permits: Vec<OwnedSemaphorePermit> = Vec::new();
        // When a busy producer with no claim in flight claims with fewer permits than it
        // gathers for (see `GATHER_WAIT`).
        let mut gathered_by: Option<Instant> = None;
        // After a failed claim, no claim starts before this.
        let mut paused_until: Option<Instant> = None;
        loop {
            // Claims in flight run to the end once claiming stops, and their jobs are
            // handed back (dropped mid-statement, the claim could still commit jobs no
            // attempt holds, stuck `running` until their leases expire).
            let stopping = stop.is_cancelled();
            if stopping && claims.is_empty() {
                return;
            }
            let now = Instant::now();
            paused_until = paused_until.filter(|t| *t > now);
            let capacity =
                self.concurrency + ahead.resize(&held, finished.load(Ordering::Relaxed), now);
            while let Ok(p) = held.clone().try_acquire_owned() {
                permits.push(p);
            }
            let overlap = busy && capacity / MAX_CLAIMS >= MIN_OVERLAP;
            let room = !stopping
                && paused_until.is_none()
                && claims.len() < if overlap { MAX_CLAIMS } else { 1 };
            let target = if busy { (capacity / 2).max(1) } else { 1 };
            if permits.is_empty() {
                gathered_by = None;
            } else if gathered_by.is_none() && claims.is_empty() {
                gathered_by = Some(now + GATHER_WAIT);
            }
            let gathered = permits.len() >= target
                || (claims.is_empty() && gathered_by.is_some_and(|by| by <= now));
            if room && gathered {
                let want = if overlap {
                    permits.len().min(capacity / MAX_CLAIMS)
                } else {
                    permits.len()
                };
                let taken: Vec<_> = permits.drain(..want).collect();
                gathered_by = None;
                cursor.rewind(&self.config.kinds, self.rewinds.take(&self.queue));
                let start = cursor.start(now);
                let (config, queue) = (&self.config, self.queue.as_str());
                claims.push(async move {
                    let sent = Instant::now();
                    let claimed = claim(config, queue, taken.len(), None, Some(start)).await;
                    (claimed, taken, sent)
                });
                continue;
            }
            let (claimed, mut taken, sent) = tokio::select! {
                biased;
                _ = stop.cancelled(), if !stopping => continue,
                Some(done) = claims.next(), if !claims.is_empty() => done,
                p = held.clone().acquire_owned(), if room => {
                    match p {
                        Ok(p) => permits.push(p),
                        Err(_) => return,
                    }
                    continue;
                }
                _ = sleep_until_some(gathered_by), if room && claims.is_empty() => continue,
                _ = sleep_until_some(paused_until), if !stopping => continue,
            };
            let want = taken.len();
            let (jobs, retry_in) = match claimed {
                Ok((c, ran)) => {
                    if let Some(ran) = ran {
                        cursor.record(ran, &self.config.kinds, &c.jobs);
                    }
                    backoff = Duration::from_millis(100);
                    (c.jobs, c.retry_in)
                }
                Err(e) => {
                    warn!(queue = %self.queue, error = %e, "claim failed; retrying in {backoff:?}");
                    drop(taken);
                    paused_until = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            let got = jobs.len();
            busy = got == want;
            if got > 0 {
                trail = Some(TRAIL.0);
            }
            for (job, permit) in jobs.into_iter().zip(taken.drain(..)) {
                let env = AttemptEnv {
                    config: self.config.clone(),
                    running: self.running.clone(),
                    completer: self.completer.clone(),
                    slots: slots.clone(),
                    turn: SlotTurn::next(&mut line),
                    finished: finished.clone(),
                    stopping: stop.clone(),
                };
                self.attempts.spawn(run_claimed(env, job, sent, permit));
            }
            drop(taken);
            if got == 0 && claims.is_empty() {
                // The queue has no more due jobs: wait for a wake-up or the next poll.
                // (A short claim is not enough to go idle: with other workers claiming
                // from the same queue, SKIP LOCKED returns fewer rows than asked while
                // plenty are due, and waiting for a poll here idled whole processes.
                // Claiming again costs one statement when the queue is really dry.)
                // Jobs held back by a limit are looked at again when it may let them
                // go (a bucket's next token, a concurrency recheck), at least
                // MIN_LIMIT_WAIT later so tokens are claimed a few at a time.
                permits.clear();
                let mut wait = retry_in.map_or(self.config.poll_interval, |d| {
                    d.clamp(
                        MIN_LIMIT_WAIT,
                        self.config.poll_interval.max(MIN_LIMIT_WAIT),
                    )
                });
                if let Some(t) = trail {
                    wait = wait.min(t);
                    trail = Some(t * 2).filter(|next| *next <= TRAIL.1);
                }
                // A claim from a position finds nothing behind it: a job that became due
                // there (a transaction that began before the last job claimed and
                // committed after it) must not wait for the poll, but for the full claim.
                if let Some(full) = cursor.full_in(Instant::now()) {
                    wait = wait.min(full);
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Sleeps until `at`; never ends for `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The most claims one producer has in flight at once. While the queue is busy, a
/// claim for half the producer's capacity starts as soon as that many slots are free,
/// even while the claim before it still runs: on a server with few cores, one claim at a
/// time left them idle between a claim's rows coming back and the next claim starting.
const MAX_CLAIMS: usize = 2;

/// Claims overlap only where each would claim at least this many jobs: a small
/// producer's claims are cheap, and splitting them only makes more statements, which
/// in several processes sharing a queue also scan past each other's locked rows.
const MIN_OVERLAP: usize = 64;

/// The shortest wait for jobs a limit held back, so tokens are claimed a few at a time
/// (a bucket smaller than its rate's 10 ms worth runs a little below its rate).
const MIN_LIMIT_WAIT: Duration = Duration::from_millis(10);

/// How long a busy producer with no claim in flight waits for more free slots before it
/// claims.
///
/// While the queue is busy, jobs finish a few at a time (the attempts of one completed
/// batch drop their permits one by one), and claiming whenever one frees makes many tiny
/// claims: each is a statement and a commit, and each scans the claim index past the
/// entries of the jobs claimed before it. So a busy producer gathers half of its capacity
/// (slots plus jobs ahead) before it claims, waiting at most this long when no claim is
/// in flight. An idle queue (the last claim came back short) is not delayed: a wake-up
/// claims at once.
const GATHER_WAIT: Duration = Duration::from_millis(5);

/// A job claimed ahead of the free slots is one expected to start within this long.
const AHEAD_WINDOW: Duration = Duration::from_millis(10);

/// How long the start rate is counted over before it is updated.
const PACE_SAMPLE: Duration = Duration::from_millis(10);

/// How many jobs a producer claims ahead of its free slots.
///
/// A process with few slots claims in small batches: every claim and every completion
/// flush is a statement and a commit for a handful of jobs. Claiming ahead keeps
/// batches large. The jobs claimed ahead wait in this process for a slot, their
/// leases kept alive by the heartbeat like those of running attempts, and a graceful
/// shutdown hands them back at once without counting an attempt.
///
/// A job waiting here could have started on an idle worker elsewhere, so the number is
/// sized by how fast this queue's handlers free their slots (handlers returned per
/// second, not started: a burst of starts into idle slots says nothing of how soon they
/// free): only the jobs expected to start within [`AHEAD_WINDOW`], at most the
/// configured prefetch. Slow handlers get few or none (16 slots of 100 ms handlers:
/// one; of one second: none); a queue of no-op jobs gets the whole prefetch.
struct Ahead {
    max: usize,
    /// Permits added to `held` beyond the slots.
    granted: usize,
    since: Instant,
    counted: u64,
    /// Handlers returned per second, smoothed.
    per_sec: f64,
}

impl Ahead {
    fn new(max: usize) -> Self {
        Ahead {
            max,
            granted: 0,
            since: Instant::now(),
            counted: 0,
            per_sec: 0.0,
        }
    }

    /// Updates the rate from `finished` (handlers returned so far), resizes `held`
    /// to the slots plus the jobs to claim ahead, and returns how many that is. Permits
    /// in use cannot be taken back: a shrink takes effect as they return.
    fn resize(&mut self, held: &Semaphore, finished: u64, now: Instant) -> usize {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= PACE_SAMPLE {
            let rate = finished.saturating_sub(self.counted) as f64 / elapsed.as_secs_f64();
            self.per_sec = (self.per_sec + rate) / 2.0;
            self.since = now;
            self.counted = finished;
        }
        let want = self.want();
        if want > self.granted {
            held.add_permits(want - self.granted);
            self.granted = want;
        } else if want < self.granted {
            self.granted -= held.forget_permits(self.granted - want);
        }
        self.granted
    }

    fn want(&self) -> usize {
        let expected = self.per_sec * AHEAD_WINDOW.as_secs_f64();
        if expected >= self.max as f64 {
            self.max
        } else {
            // Below `max`, so it fits; truncation is the intent.
            expected as usize
        }
    }
}

/// Where a producer's claims start.
///
/// A claim reads the claim index from the start of each served kind's range, passing
/// the entries of jobs claimed before it. Those are normally few: a claim marks the
/// entries of rows it finds dead and vacuum removes them. While an old snapshot is held
/// open (a long transaction, a stuck replica slot) nothing can, and every claim reads
/// every job claimed since the snapshot was taken: after 100,000 claims, 2,000 index
/// pages per claim of 100.
///
/// So the rule is a claim from the start ("full"), but once one takes longer than
/// [`Pace::FREE`] (5 ms), the claims after it start after the last job each kind claimed,
/// until a full claim is due again: 20 times the full claim's cost later (at most a
/// minute; see [`Pace`]), so that full claims take a twentieth of the time.
/// A job that becomes due behind a kind's position (a higher priority, a retry or a
/// transaction that committed late with an earlier `run_after`, a job another claim
/// locked and handed back) waits for the next full claim, and a producer whose queue
/// looks dry from its positions waits no longer than that for it: while claims are slow,
/// claim order holds within that window rather than exactly. Limited claims always start
/// from the start.
#[derive(Debug)]
pub(crate) struct Cursor {
    /// Per served kind, the last job claimed (`None`: none yet).
    after: Vec<Option<ClaimPosition>>,
    /// When the next full claim is due.
    full: Pace,
    /// Whether the last claim started from the positions.
    from_positions: bool,
}

impl Cursor {
    pub(crate) fn new(kinds: usize) -> Cursor {
        Cursor {
            after: vec![None; kinds],
            full: Pace::default(),
            from_positions: false,
        }
    }

    /// The positions a claim starting `now` starts after, or `None` for a full claim.
    pub(crate) fn start(&self, now: Instant) -> Option<Vec<Option<ClaimPosition>>> {
        (!self.full.due(now)).then(|| self.after.clone())
    }

    /// How long from `now` until a full claim is due (zero: at once), after a claim
    /// from positions (a full claim that came back short has seen every job due).
    pub(crate) fn full_in(&self, now: Instant) -> Option<Duration> {
        self.from_positions.then(|| self.full.due_in(now))
    }

    /// Moves each kind's position back to just before `to`'s place for it where it is
    /// past that place (see [`Rewinds`]). A kind without a position claims from its
    /// start anyway.
    pub(crate) fn rewind(&mut self, kinds: &[String], to: Vec<(String, ClaimPosition)>) {
        for (kind, at) in to {
            let Some(i) = kinds.iter().position(|k| *k == kind) else {
                continue;
            };
            if let Some(after) = &mut self.after[i]
                && *after >= at
            {
                // Claims start strictly after a position; ids are unique.
                *after = ClaimPosition {
                    id: at.id - 1,
                    ..at
                };
            }
        }
    }

    /// Records a claim that ran as `ran` says, and the jobs it claimed. A kind's position
    /// moves to its last job claimed: forward after a claim from a position, anywhere
    /// after a full one (which read the kind from its start). A kind that claimed nothing
    /// keeps its position.
    pub(crate) fn record(&mut self, ran: Ran, kinds: &[String], jobs: &[ClaimedJob]) {
        let Ran { full, at, took } = ran;
        self.from_positions = !full;
        if full {
            self.full.ran(at, took);
        }
        for (kind, after) in kinds.iter().zip(self.after.iter_mut()) {
            let last = jobs
                .iter()
                .filter(|j| *j.kind == **kind)
                .map(ClaimedJob::position)
                .max();
            if last.is_some() {
                *after = if full { last } else { (*after).max(last) };
            }
        }
    }
}

/// Places in claim order where this runtime's completer just made jobs claimable (the
/// next jobs of ordering keys), the earliest per queue and kind, for the producers to
/// rewind their [`Cursor`]s to.
///
/// A freed job takes its place among the jobs due at its release, but its release
/// commits a moment later, and releases of concurrent flushes commit in any order: a
/// claim from positions in between passes its place, and it then waited for the next
/// full claim. Releases by other processes are not seen here; those jobs wait for a full
/// claim as before.
#[derive(Debug, Default)]
pub(crate) struct Rewinds(std::sync::Mutex<HashMap<(String, String), ClaimPosition>>);

impl Rewinds {
    /// Notes the claimable jobs among `freed`.
    pub(crate) fn note(&self, freed: &[crate::store::Freed]) {
        let Ok(mut at) = self.0.lock() else {
            return;
        };
        for f in freed.iter().filter(|f| f.pending) {
            at.entry((f.queue.clone(), f.kind.clone()))
                .and_modify(|p| *p = (*p).min(f.position))
                .or_insert(f.position);
        }
    }

    /// Takes what was noted for `queue`: per kind, the earliest place.
    fn take(&self, queue: &str) -> Vec<(String, ClaimPosition)> {
        let Ok(mut at) = self.0.lock() else {
            return Vec::new();
        };
        if at.is_empty() {
            return Vec::new();
        }
        let mut taken = Vec::new();
        at.retain(|(q, kind), p| {
            let mine = q == queue;
            if mine {
                taken.push((kind.clone(), *p));
            }
            !mine
        });
        taken
    }
}

/// How a claim that keeps a [`Cursor`] ran, for [`Cursor::record`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ran {
    /// Whether it read from the start.
    full: bool,
    at: Instant,
    took: Duration,
}

/// Claims within the limits in force (read again when older than the poll interval).
/// A claim that keeps a cursor gives `start`, where the cursor said to start
/// ([`Cursor::start`]), and gets back how it ran; limited claims always start from the
/// start, and record nothing.
async fn claim(
    config: &Config,
    queue: &str,
    limit: usize,
    now: Option<DateTime<Utc>>,
    start: Option<Option<Vec<Option<ClaimPosition>>>>,
) -> Result<(crate::flow::limits::Claimed, Option<Ran>), Error> {
    let limits = match config.limits.fresh().await {
        Some(limits) => limits,
        None => {
            let mut conn = config.own.acquire().await?;
            config.limits.get(&mut conn, now).await?
        }
    };
    // A limited claim runs on a session that keeps its plans (see `LIMITED_CLAIM_SETTINGS`).
    let limited = limits.bind(queue, &config.kinds);
    let pool = if limited {
        &config.limited
    } else {
        &config.own
    };
    let mut held = pool.acquire().await?;
    let start = start.filter(|_| !limited);
    let at = Instant::now();
    let after = start.as_ref().and_then(Option::as_deref);
    let jobs = crate::flow::limits::claim(
        &mut held,
        &ClaimParams {
            queue,
            kinds: &config.kinds,
            lease_secs: &config.lease_secs,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            worker: &config.worker_id,
            now,
            after,
        },
        &limits,
        config.poll_interval,
    )
    .await?;
    let ran = start.map(|after| Ran {
        full: after.is_none(),
        at,
        took: at.elapsed(),
    });
    Ok((jobs, ran))
}

/// The most attempts one `Runtime::drain` runs: a handler that keeps enqueueing due jobs
/// of its own kind would otherwise never let it return.
pub(crate) const MAX_DRAIN_ATTEMPTS: usize = 100_000;

/// `Runtime::drain`: claims and runs due jobs on the current task until none is due.
pub(crate) async fn drain(
    config: &Arc<Config>,
    now: Option<DateTime<Utc>>,
) -> Result<DrainReport, Error> {
    let mut report = DrainReport::default();
    loop {
        if report.attempts.len() >= MAX_DRAIN_ATTEMPTS {
            warn!(
                attempts = report.attempts.len(),
                "drain stopped after {MAX_DRAIN_ATTEMPTS} attempts; jobs may still be due"
            );
            return Ok(report);
        }
        // Scheduled jobs due by the drain's clock become pending first, as the promoter
        // would make them.
        let mut held = config.own.acquire().await?;
        crate::maintenance::promote_all(&mut held, 1000, now).await?;
        drop(held);
        let mut ran = 0;
        for queue in config.queues.keys() {
            // One at a time: this task is a single slot, and a claimed job's lease starts
            // at the claim, so claiming ahead would age leases of jobs not yet started.
            let claimed = claim(config, queue, 1, now, None).await?.0.jobs;
            for job in claimed {
                ran += 1;
                report.attempts.push(drain_one(config, job, now).await?);
            }
        }
        if ran == 0 {
            return Ok(report);
        }
    }
}

async fn drain_one(
    config: &Arc<Config>,
    mut job: ClaimedJob,
    now: Option<DateTime<Utc>>,
) -> Result<DrainedAttempt, Error> {
    let Some(handler) = config.registry.get(&job.kind).cloned() else {
        return Err(Error::Config(format!("no handler for kind `{}`", job.kind)));
    };
    let span = attempt_span(&job);
    async {
        let lease = handler.lease();
        let deadline = Arc::new(crate::context::Deadline::new(Instant::now() + lease));
        let ctx = attempt_context(config, &job, lease, CancellationToken::new(), deadline);
        let payload = std::mem::take(&mut job.payload);
        let version = job.payload_version;
        let recorder = ctx.clone();
        let outcome = execute(&handler, ctx, (version, payload), std::future::pending()).await;
        let (outcome, output) = recorded(&recorder, outcome);
        tracing::Span::current().record("job.outcome", outcome.label());
        let mut state = None;
        if let Some(write) = outcome_write(&handler, &job, &outcome, output) {
            let mut conn = config.own.acquire().await?;
            state = match write_one(&mut conn, &write, now).await? {
                super::completer::Written::Applied(s) => s.map(Cow::into_owned),
                super::completer::Written::AlreadyDone => Some("done".to_owned()),
                super::completer::Written::Stale => None,
            };
        }
        Ok(DrainedAttempt {
            id: crate::JobId(job.id),
            kind: job.kind.to_string(),
            attempt: u32::try_from(job.attempt).unwrap_or(0),
            outcome,
            state,
        })
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `ahead` a steady `per_sec` of returned handlers for `ms` milliseconds,
    /// sampling every millisecond as a busy producer would; returns the last size.
    fn steady(
        ahead: &mut Ahead,
        held: &Semaphore,
        clock: &mut (Instant, u64),
        per_sec: u64,
        ms: u64,
    ) -> usize {
        let mut granted = 0;
        for _ in 0..ms {
            clock.0 += Duration::from_millis(1);
            clock.1 += per_sec / 1000;
            granted = ahead.resize(held, clock.1, clock.0);
        }
        granted
    }

    #[test]
    fn claims_ahead_what_starts_within_the_window_up_to_the_prefetch() {
        let held = Semaphore::new(4);
        let mut ahead = Ahead::new(64);
        let mut clock = (Instant::now(), 0);
        // 2,000 handlers a second free 20 slots in 10 ms (the smoothed rate approaches
        // it from below).
        let granted = steady(&mut ahead, &held, &mut clock, 2_000, 200);
        assert!((19..=20).contains(&granted), "{granted}");
        assert_eq!(held.available_permits(), 4 + granted);
        // No-op handlers: the whole prefetch.
        assert_eq!(steady(&mut ahead, &held, &mut clock, 50_000, 200), 64);
        assert_eq!(held.available_permits(), 4 + 64);
        // Slow handlers: none.
        assert_eq!(steady(&mut ahead, &held, &mut clock, 0, 200), 0);
        assert_eq!(held.available_permits(), 4);
    }

    #[test]
    fn a_shrink_waits_for_permits_in_use() {
        let held = Arc::new(Semaphore::new(2));
        let mut ahead = Ahead::new(8);
        let mut clock = (Instant::now(), 0);
        assert_eq!(steady(&mut ahead, &held, &mut clock, 50_000, 100), 8);
        let in_use = held.clone().try_acquire_many_owned(10).unwrap();
        // The handlers stop returning; the permits out cannot be taken back yet.
        assert_eq!(steady(&mut ahead, &held, &mut clock, 0, 200), 8);
        drop(in_use);
        assert_eq!(steady(&mut ahead, &held, &mut clock, 0, 1), 0);
        assert_eq!(held.available_permits(), 2);
    }

    #[test]
    fn no_prefetch_never_grants() {
        let held = Semaphore::new(3);
        let mut ahead = Ahead::new(0);
        let mut clock = (Instant::now(), 0);
        assert_eq!(steady(&mut ahead, &held, &mut clock, 50_000, 100), 0);
        assert_eq!(held.available_permits(), 3);
    }

    fn job(kind: &str, priority: i16, id: i64) -> ClaimedJob {
        ClaimedJob {
            id,
            fence: 1,
            attempt: 1,
            max_attempts: 3,
            kind: Arc::from(kind),
            queue: Arc::from("default"),
            payload: "{}".to_owned(),
            priority,
            created_at: DateTime::UNIX_EPOCH,
            payload_version: 1,
            trace_context: None,
            wait_secs: 0.0,
            run_after: DateTime::UNIX_EPOCH,
        }
    }

    fn ran(full: bool, at: Instant, took: Duration) -> Ran {
        Ran { full, at, took }
    }

    fn freed(queue: &str, kind: &str, pending: bool, id: i64) -> crate::store::Freed {
        crate::store::Freed {
            queue: queue.to_owned(),
            kind: kind.to_owned(),
            pending,
            position: job(kind, 0, id).position(),
        }
    }

    #[test]
    fn a_cursor_rewinds_to_jobs_freed_behind_it_and_never_forward() {
        let kinds = ["a".to_owned(), "b".to_owned()];
        let t0 = Instant::now();
        let mut cursor = Cursor::new(2);
        // A slow full claim: claims start from positions (a after 9, b after 3).
        cursor.record(
            ran(true, t0, Duration::from_millis(10)),
            &kinds,
            &[job("a", 0, 9), job("b", 0, 3)],
        );
        let rewinds = Rewinds::default();
        rewinds.note(&[
            freed("default", "a", true, 7),
            freed("default", "a", true, 5),
            // Scheduled, not claimable: no rewind.
            freed("default", "a", false, 2),
            // Ahead of b's position already.
            freed("default", "b", true, 10),
            freed("other", "a", true, 1),
        ]);
        cursor.rewind(&kinds, rewinds.take("default"));
        let at = cursor
            .start(t0 + Duration::from_millis(20))
            .expect("from positions");
        // Just before the earliest freed job of `a`: the next claim finds it.
        assert_eq!(at[0].map(|p| p.id), Some(4));
        assert_eq!(at[1].map(|p| p.id), Some(3));
        assert!(rewinds.take("default").is_empty(), "taken once");
        let other = rewinds.take("other");
        assert_eq!(other.len(), 1);
        assert_eq!((other[0].0.as_str(), other[0].1.id), ("a", 1));
        // A kind without a position stays without (it claims from its start).
        let mut fresh = Cursor::new(2);
        fresh.rewind(&kinds, vec![("a".to_owned(), job("a", 0, 1).position())]);
        assert_eq!(fresh.after, vec![None, None]);
    }

    #[test]
    fn cursor_claims_from_positions_only_while_full_claims_are_slow() {
        let kinds = ["a".to_owned(), "b".to_owned()];
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut cursor = Cursor::new(2);
        assert_eq!(cursor.start(t0), None, "the first claim is full");

        // A fast full claim: the next is full too.
        cursor.record(
            ran(true, t0, ms(1)),
            &kinds,
            &[job("a", 0, 5), job("a", 0, 7)],
        );
        assert_eq!(cursor.start(t0 + ms(1)), None);

        // A slow one: claims from positions for 20 times its cost.
        cursor.record(
            ran(true, t0, ms(10)),
            &kinds,
            &[job("a", 0, 7), job("a", 0, 9)],
        );
        let at = |c: &Cursor, t| {
            c.start(t)
                .map(|a| a.iter().map(|p| p.map(|p| p.id)).collect::<Vec<_>>())
        };
        assert_eq!(at(&cursor, t0 + ms(150)), Some(vec![Some(9), None]));
        assert_eq!(at(&cursor, t0 + ms(200)), None, "a full claim is due");
        // An idle producer waits no longer than that for the full claim after a claim
        // from positions; after a full one, for a wake-up or the poll.
        assert_eq!(cursor.full_in(t0 + ms(150)), None);
        cursor.record(ran(false, t0 + ms(15), ms(1)), &kinds, &[]);
        assert_eq!(cursor.full_in(t0 + ms(150)), Some(ms(50)));
        // Due already (it fell due while that claim ran): at once, not at the poll.
        assert_eq!(cursor.full_in(t0 + ms(200)), Some(Duration::ZERO));

        // From a position, a kind's position only moves forward; one claiming nothing
        // keeps its own.
        cursor.record(ran(false, t0 + ms(20), ms(1)), &kinds, &[job("b", 0, 3)]);
        cursor.record(
            ran(false, t0 + ms(30), ms(1)),
            &kinds,
            &[job("a", 0, 8), job("b", 1, 2)],
        );
        assert_eq!(at(&cursor, t0 + ms(40)), Some(vec![Some(9), Some(2)]));
        // A full claim moves it back to what it found first.
        cursor.record(ran(true, t0 + ms(50), ms(10)), &kinds, &[job("a", -1, 100)]);
        assert_eq!(at(&cursor, t0 + ms(60)), Some(vec![Some(100), Some(2)]));
        let a = cursor.start(t0 + ms(60)).unwrap()[0].unwrap();
        assert_eq!((a.priority, a.id), (-1, 100));

        // A full claim at least every minute, however long they take.
        cursor.record(ran(true, t0, ms(6)), &kinds, &[]);
        assert!(cursor.start(t0 + ms(119)).is_some());
        assert_eq!(cursor.start(t0 + ms(120)), None);
        cursor.record(ran(true, t0, ms(5_000)), &kinds, &[]);
        assert!(cursor.start(t0 + ms(59_999)).is_some());
        assert_eq!(cursor.start(t0 + ms(60_000)), None);
    }
}
