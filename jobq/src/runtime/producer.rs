//! The producer: one per queue. It claims only as many jobs as it has free slots (a
//! batch's leases start together, so claiming more than can start now would burn the
//! later jobs' leases while they wait), hands each to an executor task, and when the queue
//! runs dry waits for a wake-up or the poll interval.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, warn};

use super::completer::{Completer, write_one};
use super::executor::{
    AttemptEnv, attempt_context, attempt_span, execute, outcome_write, run_claimed,
};
use super::lease::RunningSet;
use super::spares::{LINGER, Spares};
use super::{Config, DrainReport, DrainedAttempt};
use crate::error::Error;
use crate::store::{self, ClaimParams, ClaimedJob};

pub(crate) struct Producer {
    pub(crate) config: Arc<Config>,
    pub(crate) queue: String,
    pub(crate) concurrency: usize,
    pub(crate) wake: Arc<Notify>,
    pub(crate) running: RunningSet,
    pub(crate) completer: Completer,
    pub(crate) attempts: TaskTracker,
}

impl Producer {
    pub(crate) async fn run(self, stop: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let conn = Spares::new(self.config.pool.clone());
        let mut backoff = Duration::from_millis(100);
        // Whether the last claim came back full: the queue has more due jobs than slots.
        let mut busy = false;
        loop {
            let first = match slots.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    // Every slot is taken: keep the connection only for a short wait.
                    let waited = tokio::select! {
                        _ = stop.cancelled() => return,
                        p = tokio::time::timeout(LINGER, slots.clone().acquire_owned()) => p,
                    };
                    let p = match waited {
                        Ok(p) => p,
                        Err(_) => {
                            conn.release();
                            tokio::select! {
                                _ = stop.cancelled() => return,
                                p = slots.clone().acquire_owned() => p,
                            }
                        }
                    };
                    match p {
                        Ok(p) => p,
                        Err(_) => return,
                    }
                }
            };
            let mut permits = vec![first];
            while let Ok(p) = slots.clone().try_acquire_owned() {
                permits.push(p);
            }
            if busy {
                gather(&slots, &mut permits, self.concurrency).await;
            }
            let want = permits.len();
            let sent = Instant::now();
            let claimed = claim(&self.config, &conn, &self.queue, want, None).await;
            let jobs = match claimed {
                Ok(jobs) => {
                    backoff = Duration::from_millis(100);
                    jobs
                }
                Err(e) => {
                    warn!(queue = %self.queue, error = %e, "claim failed; retrying in {backoff:?}");
                    drop(permits);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            let got = jobs.len();
            busy = got == want;
            for (job, permit) in jobs.into_iter().zip(permits.drain(..)) {
                let env = AttemptEnv {
                    config: self.config.clone(),
                    running: self.running.clone(),
                    completer: self.completer.clone(),
                };
                self.attempts.spawn(run_claimed(env, job, sent, permit));
            }
            drop(permits);
            if got == 0 {
                conn.release();
                // The queue has no more due jobs: wait for a wake-up or the next poll.
                // (A short claim is not enough to go idle: with other workers claiming
                // from the same queue, SKIP LOCKED returns fewer rows than asked while
                // plenty are due, and waiting for a poll here idled whole processes.
                // Claiming again costs one statement when the queue is really dry.)
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                }
            }
        }
    }
}

/// How long a busy producer waits for more free slots before it claims.
const GATHER_WAIT: Duration = Duration::from_millis(5);

/// While the queue is busy, slots free a few at a time (the attempts of one completed
/// batch drop their permits one by one), and claiming whenever one frees makes many
/// tiny claims: each is a statement and a commit, and each scans the claim index past
/// the entries of the jobs claimed before it. So a busy producer waits up to
/// [`GATHER_WAIT`] for half of its slots before it claims. An idle queue (the last
/// claim came back short) is not delayed: a wake-up claims at once.
async fn gather(
    slots: &Arc<Semaphore>,
    permits: &mut Vec<OwnedSemaphorePermit>,
    concurrency: usize,
) {
    let target = (concurrency / 2).max(1);
    if permits.len() >= target {
        return;
    }
    let deadline = tokio::time::sleep(GATHER_WAIT);
    tokio::pin!(deadline);
    while permits.len() < target {
        tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => permits.push(p),
                Err(_) => return,
            },
            _ = &mut deadline => break,
        }
    }
    while let Ok(p) = slots.clone().try_acquire_owned() {
        permits.push(p);
    }
}

/// Claims on a connection from `conn`, keeping it there if the claim succeeded.
async fn claim(
    config: &Config,
    conn: &Spares,
    queue: &str,
    limit: usize,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<ClaimedJob>, Error> {
    let mut held = conn.take().await?;
    let jobs = store::job_claim(
        &mut held,
        &ClaimParams {
            queue,
            kinds: &config.kinds,
            lease_secs: &config.lease_secs,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            worker: &config.worker_id,
            now,
        },
    )
    .await?;
    conn.keep(held);
    Ok(jobs)
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
    let conn = Spares::new(config.pool.clone());
    loop {
        if report.attempts.len() >= MAX_DRAIN_ATTEMPTS {
            warn!(
                attempts = report.attempts.len(),
                "drain stopped after {MAX_DRAIN_ATTEMPTS} attempts; jobs may still be due"
            );
            return Ok(report);
        }
        let mut ran = 0;
        for queue in config.queues.keys() {
            // One at a time: this task is a single slot, and a claimed job's lease starts
            // at the claim, so claiming ahead would age leases of jobs not yet started.
            let claimed = claim(config, &conn, queue, 1, now).await?;
            // The attempt writes its outcome on a connection of its own: on a pool of
            // one, a kept one would leave it none.
            conn.release();
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
        let (deadline, _) = tokio::sync::watch::channel(Instant::now() + handler.lease());
        let ctx = attempt_context(config, &job, CancellationToken::new(), Arc::new(deadline));
        let payload = std::mem::take(&mut job.payload);
        let outcome = execute(&handler, ctx, payload, std::future::pending()).await;
        tracing::Span::current().record("job.outcome", outcome.label());
        let mut state = None;
        if let Some(write) = outcome_write(&handler, &job, &outcome) {
            let mut conn = config.pool.acquire().await?;
            state = match write_one(&mut conn, &write, now).await? {
                super::completer::Written::Applied(s) => s,
                super::completer::Written::AlreadyDone => Some("done".to_owned()),
                super::completer::Written::Stale => None,
            };
        }
        Ok(DrainedAttempt {
            id: crate::JobId(job.id),
            kind: job.kind.clone(),
            attempt: u32::try_from(job.attempt).unwrap_or(0),
            outcome,
            state,
        })
    }
    .instrument(span)
    .await
}
