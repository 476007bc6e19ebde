//! Writes attempt outcomes, fenced, and batched: successes that arrive together are
//! completed in one `UPDATE … FROM unnest(…)`. Once the statement that wrote an outcome
//! has committed (or the write is given up on), the completer settles the attempt: its
//! metrics, and its removal from the running set, whose heartbeat kept the lease alive
//! until then. An attempt that still holds its slot is told then too.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use crate::error::{Disposition, Error};
use crate::store::{self, FailParams, FenceResult};

use super::lease::RunningSet;
use super::producer::Rewinds;

/// The most outcomes one flush writes.
const MAX_BATCH: usize = 1000;

/// An outcome to write for the attempt fenced by `(id, fence)` (its lease generation).
#[derive(Debug, Clone)]
pub(crate) enum Write {
    Complete {
        id: i64,
        fence: i64,
        /// The recorded output, serialized JSON.
        output: Option<String>,
    },
    Fail {
        id: i64,
        fence: i64,
        disposition: Disposition,
        code: String,
        message: String,
        /// When the job runs again (`retry::next_state`); `None`: it does not.
        retry_in: Option<Duration>,
    },
    HandBack {
        id: i64,
        fence: i64,
    },
}

impl Write {
    fn fence(&self) -> (i64, i64) {
        match self {
            Write::Complete { id, fence, .. }
            | Write::Fail { id, fence, .. }
            | Write::HandBack { id, fence } => (*id, *fence),
        }
    }
}

/// What became of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Written {
    /// Applied; the job's new state (`done` for a completion, without an allocation per
    /// job; read back for a failure).
    Applied(Option<Cow<'static, str>>),
    /// The attempt had completed the job itself, in its own transaction.
    AlreadyDone,
    /// The attempt no longer held the job; nothing changed.
    Stale,
}

/// Writes one outcome directly (no batching); used by the completer for failures and
/// hand-backs and by `Runtime::drain`.
pub(crate) async fn write_one(
    conn: &mut PgConnection,
    write: &Write,
    now: Option<DateTime<Utc>>,
) -> Result<Written, Error> {
    match write {
        Write::Complete { id, fence, output } => {
            let outputs = [output.as_deref()];
            let r = store::job_complete_with_outputs(conn, &[(*id, *fence)], &outputs, now).await?;
            Ok(match r.first() {
                Some(FenceResult::Applied) => Written::Applied(Some(Cow::Borrowed("done"))),
                Some(FenceResult::AlreadyDone) => Written::AlreadyDone,
                _ => Written::Stale,
            })
        }
        Write::Fail {
            id,
            fence,
            disposition,
            code,
            message,
            retry_in,
        } => {
            let state = store::job_fail(
                conn,
                &FailParams {
                    id: *id,
                    fence: *fence,
                    disposition: *disposition,
                    code,
                    message,
                    retry_in_secs: retry_in.map(|d| d.as_secs_f64()),
                    now,
                },
            )
            .await?;
            Ok(match state {
                Some(s) => Written::Applied(Some(Cow::Owned(s))),
                None => Written::Stale,
            })
        }
        Write::HandBack { id, fence } => {
            if store::job_hand_back(conn, *id, *fence).await? {
                Ok(Written::Applied(None))
            } else {
                Ok(Written::Stale)
            }
        }
    }
}

/// What is left of an attempt once its outcome is written: done by the completer, so an
/// attempt that gave its slot back ends when its handler returns.
#[derive(Debug)]
pub(crate) struct Settle {
    pub(crate) kind: std::sync::Arc<str>,
    pub(crate) queue: std::sync::Arc<str>,
    /// When the job's claim was sent (the `finished` metric's duration starts there).
    pub(crate) claimed: Instant,
    /// A hand-back by the shutdown, counted in its report once applied.
    pub(crate) interrupted: bool,
}

impl Settle {
    /// Records what became of `write` (`None`: given up on) and takes the attempt out
    /// of the running set.
    fn done(self, write: &Write, written: Option<&Written>, running: &RunningSet) {
        if let Some(Written::Applied(state)) = written {
            if let Some(state) = state {
                let code = match write {
                    Write::Fail { code, .. } => Some(code.as_str()),
                    _ => None,
                };
                let secs = self.claimed.elapsed().as_secs_f64();
                crate::metrics::finished(&self.kind, &self.queue, state, code, secs);
            }
            if self.interrupted {
                running.count_handed_back();
            }
        }
        let (id, fence) = write.fence();
        running.remove(id, fence);
    }
}

struct Request {
    write: Write,
    /// Taken when settled; a request dropped unsettled (its flush panicked) settles as
    /// given up on, so its lease is left to expire instead of being kept alive for good.
    settle: Option<Settle>,
    running: RunningSet,
    /// Told once the attempt is settled, if it waits for that.
    ack: Option<oneshot::Sender<()>>,
    _queued: Backlogged,
}

impl Request {
    fn settled(mut self, written: Option<&Written>) {
        if let Some(written) = written {
            report(&self.write, written);
        }
        if let Some(settle) = self.settle.take() {
            settle.done(&self.write, written, &self.running);
        }
        if let Some(ack) = self.ack.take() {
            let _ = ack.send(());
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(settle) = self.settle.take() {
            settle.done(&self.write, None, &self.running);
        }
    }
}

/// The sending side, held by every attempt of a runtime.
#[derive(Debug, Clone)]
pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<Request>,
    /// Outcomes queued or being written.
    backlog: Arc<AtomicUsize>,
    max_backlog: usize,
    running: RunningSet,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write.fmt(f)
    }
}

impl Completer {
    /// Starts the completer task; it ends once every `Completer` clone is dropped and the
    /// queue is written out.
    ///
    /// `max_backlog` is how many outcomes may wait for their commit after their attempts
    /// gave their slots back (see [`Self::has_room`]); `running` is where their attempts
    /// are until settled.
    pub(crate) fn spawn(
        pool: PgPool,
        max_backlog: usize,
        running: RunningSet,
        rewinds: Arc<Rewinds>,
    ) -> (Completer, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(pool, rx, rewinds));
        let completer = Completer {
            tx,
            backlog: Arc::new(AtomicUsize::new(0)),
            max_backlog,
            running,
        };
        (completer, task)
    }

    /// Whether the backlog is short enough for one more attempt to give its slot back
    /// before its outcome is committed. Past it (the database commits slower than the
    /// handlers finish), attempts keep their slots until written, so claiming slows to
    /// the pace of committing instead of piling up `running` jobs whose leases age.
    pub(crate) fn has_room(&self) -> bool {
        self.backlog.load(Ordering::Relaxed) < self.max_backlog
    }

    /// Queues `write`; the completer settles its attempt once it is committed (or given
    /// up on).
    pub(crate) fn send(&self, write: Write, settle: Settle) {
        self.queue(write, settle, None);
    }

    /// [`send`](Self::send), and waits until the attempt is settled.
    pub(crate) async fn write(&self, write: Write, settle: Settle) {
        let (ack, done) = oneshot::channel();
        self.queue(write, settle, Some(ack));
        let _ = done.await;
    }

    fn queue(&self, write: Write, settle: Settle, ack: Option<oneshot::Sender<()>>) {
        self.backlog.fetch_add(1, Ordering::Relaxed);
        let request = Request {
            write,
            settle: Some(settle),
            running: self.running.clone(),
            ack,
            _queued: Backlogged(self.backlog.clone()),
        };
        // The completer is gone only once every sender is: settled here, unwritten (the
        // lease expires and the reaper returns the job).
        if let Err(mpsc::error::SendError(request)) = self.tx.send(request) {
            request.settled(None);
        }
    }
}

/// Takes one outcome off the backlog when its request is settled, however it ends.
struct Backlogged(Arc<AtomicUsize>);

impl Drop for Backlogged {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The most flushes in flight at once.
const MAX_FLUSHES: usize = 4;

/// A flush starts while others are in flight only once this many outcomes wait; fewer
/// wait for a flush to finish and go in the next one, so batches stay large.
const OVERLAP_MIN: usize = 32;

/// Collects outcomes and flushes them. With one flush at a time, an outcome that arrived
/// during a flush waited for that flush and then its own: one and a half commits on
/// average, during which its attempt held its slot. Flushes overlap once enough outcomes
/// wait (PostgreSQL commits them together), and whatever queues while they run goes in
/// the next one. Returns when every sender is gone and every flush has finished.
async fn run(pool: PgPool, mut rx: mpsc::UnboundedReceiver<Request>, rewinds: Arc<Rewinds>) {
    let mut batch: Vec<Request> = Vec::with_capacity(64);
    let mut flushes = JoinSet::new();
    let mut open = true;
    loop {
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let room = flushes.len() < MAX_FLUSHES;
        if !batch.is_empty()
            && (flushes.is_empty() || (room && (batch.len() >= OVERLAP_MIN || !open)))
        {
            let (pool, rewinds) = (pool.clone(), rewinds.clone());
            let batch = std::mem::take(&mut batch);
            flushes.spawn(async move { flush(&pool, batch, &rewinds).await });
            continue;
        }
        if !open && batch.is_empty() && flushes.is_empty() {
            return;
        }
        tokio::select! {
            r = rx.recv(), if open && batch.len() < MAX_BATCH => match r {
                Some(r) => batch.push(r),
                None => open = false,
            },
            Some(done) = flushes.join_next(), if !flushes.is_empty() => {
                if let Err(e) = done {
                    error!(error = %e, "a completion flush panicked; its jobs stay running until their leases expire and the reaper returns them");
                }
            }
        }
    }
}

async fn flush(pool: &PgPool, mut batch: Vec<Request>, rewinds: &Rewinds) {
    let (completes, others): (Vec<Request>, Vec<Request>) = batch
        .drain(..)
        .partition(|r| matches!(r.write, Write::Complete { .. }));
    if !completes.is_empty() {
        let fences: Vec<(i64, i64)> = completes.iter().map(|r| r.write.fence()).collect();
        let outputs: Vec<Option<&str>> = completes
            .iter()
            .map(|r| match &r.write {
                Write::Complete { output, .. } => output.as_deref(),
                _ => None,
            })
            .collect();
        let results = with_retry("complete", || async {
            let mut conn = pool.acquire().await?;
            store::job_complete_unsettled(&mut conn, &fences, &outputs, None).await
        })
        .await;
        match results {
            Some((results, ordered)) => {
                for (req, res) in completes.into_iter().zip(results) {
                    let written = match res {
                        FenceResult::Applied => Written::Applied(Some(Cow::Borrowed("done"))),
                        FenceResult::AlreadyDone => Written::AlreadyDone,
                        FenceResult::Stale => Written::Stale,
                    };
                    req.settled(Some(&written));
                }
                // The next jobs of the completed ordered jobs' keys, once their attempts
                // have their acks: a settle that fails is left to the sweeper. This
                // runtime's producers claim from where the freed jobs now are.
                if !ordered.is_empty() {
                    let settled = async {
                        let mut conn = pool.acquire().await?;
                        store::ordering_settle_freed(
                            &mut conn,
                            &ordered,
                            store::SETTLE_PATIENCE,
                            None,
                        )
                        .await
                    };
                    match settled.await {
                        Ok(freed) => rewinds.note(&freed),
                        Err(e) => {
                            warn!(error = %e, jobs = ordered.len(), "releasing the next jobs of ordering keys failed; the sweeper will");
                        }
                    }
                }
            }
            None => {
                for req in completes {
                    req.settled(None);
                }
            }
        }
    }
    for req in others {
        let result = with_retry("fail", || async {
            let mut conn = pool.acquire().await?;
            write_one(&mut conn, &req.write, None).await
        })
        .await;
        req.settled(result.as_ref());
    }
}

fn report(write: &Write, written: &Written) {
    let (id, fence) = write.fence();
    match written {
        Written::Stale => warn!(
            job.id = id,
            job.fence = fence,
            "stale write ignored: this attempt no longer holds the job (its lease expired and the job was rescued, claimed again or changed by an operator)"
        ),
        Written::AlreadyDone => {
            debug!(
                job.id = id,
                job.fence = fence,
                "job was completed in its own transaction"
            )
        }
        Written::Applied(_) => {}
    }
}

/// Retries a write through passing database errors (a restart, a killed connection) for
/// about half a minute. Giving up loses nothing: the job stays `running` until its lease
/// expires and the reaper returns it, so the attempt counts and the job runs again.
async fn with_retry<T, F, Fut>(what: &str, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=10 {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) if attempt < 10 => {
                warn!(error = %e, attempt, "writing {what} outcome failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                error!(error = %e, "writing {what} outcome failed; giving up, the reaper will return the job when its lease expires");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush that panics drops its requests: their attempts leave the running set, so
    /// their leases expire and the reaper returns the jobs, instead of the heartbeat
    /// keeping them alive with no outcome ever to come.
    #[test]
    fn a_request_dropped_unsettled_leaves_the_running_set() {
        let running = RunningSet::default();
        running.insert(7, super::super::lease::Running::idle(3));
        let request = Request {
            write: Write::Complete {
                id: 7,
                fence: 3,
                output: None,
            },
            settle: Some(Settle {
                kind: "k".into(),
                queue: "q".into(),
                claimed: Instant::now(),
                interrupted: false,
            }),
            running: running.clone(),
            ack: None,
            _queued: Backlogged(Arc::new(AtomicUsize::new(1))),
        };
        drop(request);
        assert!(running.snapshot().is_empty());
    }
}
