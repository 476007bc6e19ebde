//! The registry: which job types this binary serves, by kind.
//!
//! `#[jobq::job]` submits a [`Registration`] to `inventory`; the runtime collects them at
//! build time, adds the types registered explicitly with
//! [`RuntimeBuilder::register`](crate::RuntimeBuilder::register), and refuses to build when
//! two different types claim one kind.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::context::JobContext;
use crate::error::{Classification, Classify, Error};
use crate::job::Job;
use crate::retry::RetryPolicy;

/// A job type's handler with its policies, its type erased so the runtime can hold many.
#[derive(Clone)]
pub struct JobHandler {
    inner: Arc<dyn ErasedJob>,
}

impl fmt::Debug for JobHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHandler")
            .field("kind", &self.kind())
            .field("type", &self.type_name())
            .field("queue", &self.queue())
            .finish_non_exhaustive()
    }
}

/// A failed attempt as the handler reported it, before the runtime decides what happens
/// next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Retryable, permanent or cancel, with a stable code and an optional Retry-After.
    pub class: Classification,
    /// The error's `Display`, for people.
    pub message: String,
}

trait ErasedJob: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn type_name(&self) -> &'static str;
    fn queue(&self) -> &'static str;
    fn lease(&self) -> Duration;
    fn limits(&self) -> crate::KindLimits;
    fn timeout(&self) -> Option<Duration>;
    fn retry(&self) -> RetryPolicy;
    fn check(&self, payload: &str) -> Result<(), String>;
    fn periodic(&self) -> Option<Result<crate::maintenance::Periodic, Error>>;
    fn run(
        &self,
        ctx: JobContext,
        version: i32,
        payload: String,
    ) -> BoxFuture<'static, Result<(), Failure>>;
}

struct Typed<J>(std::marker::PhantomData<fn() -> J>);

impl<J: Job> ErasedJob for Typed<J> {
    fn kind(&self) -> &'static str {
        J::KIND
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<J>()
    }
    fn queue(&self) -> &'static str {
        J::QUEUE
    }
    fn lease(&self) -> Duration {
        J::LEASE
    }
    fn limits(&self) -> crate::KindLimits {
        J::LIMITS
    }
    fn timeout(&self) -> Option<Duration> {
        J::TIMEOUT
    }
    fn retry(&self) -> RetryPolicy {
        J::RETRY
    }
    fn check(&self, payload: &str) -> Result<(), String> {
        J::decode(J::VERSION, payload)
            .map(drop)
            .map_err(|e| e.message)
    }
    fn periodic(&self) -> Option<Result<crate::maintenance::Periodic, Error>> {
        let (schedule, args) = J::periodic()?;
        Some(scheduler_entry::<J>(schedule, args))
    }
    fn run(
        &self,
        ctx: JobContext,
        version: i32,
        payload: String,
    ) -> BoxFuture<'static, Result<(), Failure>> {
        Box::pin(async move {
            let decoded = match u32::try_from(version) {
                Ok(v) => J::decode(v, &payload),
                Err(_) => Err(crate::job::DecodeError::unknown_version(
                    J::KIND,
                    0,
                    J::VERSION,
                )),
            };
            let args: J::Args = decoded.map_err(|e| Failure {
                class: Classification::permanent(e.code),
                message: e.message,
            })?;
            drop(payload);
            J::run(ctx, args).await.map_err(|e| Failure {
                class: e.classify(),
                message: e.to_string(),
            })
        })
    }
}

impl JobHandler {
    /// The handler of job type `J`.
    pub fn of<J: Job>() -> Self {
        JobHandler {
            inner: Arc::new(Typed::<J>(std::marker::PhantomData)),
        }
    }

    /// The kind it serves.
    pub fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// The Rust type behind it.
    pub fn type_name(&self) -> &'static str {
        self.inner.type_name()
    }

    /// Its default queue.
    pub fn queue(&self) -> &'static str {
        self.inner.queue()
    }

    /// Its lease.
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// Its code's concurrency and rate limits.
    pub fn limits(&self) -> crate::KindLimits {
        self.inner.limits()
    }

    /// Its per-attempt timeout.
    pub fn timeout(&self) -> Option<Duration> {
        self.inner.timeout()
    }

    /// Its retry policy.
    pub fn retry(&self) -> RetryPolicy {
        self.inner.retry()
    }

    /// Whether `payload` decodes as this kind's args; the error says why not.
    ///
    /// # Errors
    ///
    /// The decoding error, for people.
    pub fn check_payload(&self, payload: &serde_json::Value) -> Result<(), String> {
        self.inner.check(&payload.to_string())
    }

    /// The kind's own schedule (`#[job(cron = …)]`), as the scheduler runs it.
    pub(crate) fn periodic(&self) -> Option<Result<crate::maintenance::Periodic, Error>> {
        self.inner.periodic()
    }

    /// Decodes `payload` of payload version `version` and runs the handler; no timeout,
    /// no panic catching (the executor adds those).
    pub(crate) fn call(
        &self,
        ctx: JobContext,
        version: i32,
        payload: String,
    ) -> BoxFuture<'static, Result<(), Failure>> {
        self.inner.run(ctx, version, payload)
    }
}

/// A job type's entry in the binary-wide `inventory`, submitted by `#[jobq::job]`.
#[derive(Debug)]
pub struct Registration {
    make: fn() -> JobHandler,
}

impl Registration {
    /// The registration of job type `J`.
    pub const fn new<J: Job>() -> Self {
        Registration {
            make: JobHandler::of::<J>,
        }
    }

    /// The handler it registers.
    pub fn handler(&self) -> JobHandler {
        (self.make)()
    }
}

inventory::collect!(Registration);

/// Every job type registered through `inventory` in this binary.
pub fn registered_jobs() -> Vec<JobHandler> {
    inventory::iter::<Registration>
        .into_iter()
        .map(Registration::handler)
        .collect()
}

/// Handlers by kind.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    by_kind: BTreeMap<&'static str, JobHandler>,
}

impl Registry {
    /// Adds `handler`; the same type twice is fine, two types for one kind are not.
    pub(crate) fn add(&mut self, handler: JobHandler) -> Result<(), Error> {
        crate::store::validate_name("kind", handler.kind(), crate::job::MAX_KIND_LEN)?;
        crate::store::validate_name("queue", handler.queue(), crate::job::MAX_QUEUE_LEN)?;
        if let Some(existing) = self.by_kind.get(handler.kind()) {
            if existing.type_name() == handler.type_name() {
                return Ok(());
            }
            return Err(Error::DuplicateKind {
                kind: handler.kind().to_owned(),
                first: existing.type_name(),
                second: handler.type_name(),
            });
        }
        self.by_kind.insert(handler.kind(), handler);
        Ok(())
    }

    pub(crate) fn get(&self, kind: &str) -> Option<&JobHandler> {
        self.by_kind.get(kind)
    }

    pub(crate) fn handlers(&self) -> impl Iterator<Item = &JobHandler> {
        self.by_kind.values()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_kind.is_empty()
    }
}

/// The schedule entry of `J` at `schedule` with `args`: named by the schedule or the kind;
/// its slots copy the job `J::with(args)` would enqueue, less any uniqueness rule (a slot
/// is unique by its own key).
pub(crate) fn scheduler_entry<J: Job>(
    schedule: crate::maintenance::Schedule,
    args: J::Args,
) -> Result<crate::maintenance::Periodic, Error> {
    schedule.validate()?;
    let mut template = crate::EnqueueBuilder::<J>::new(args).into_new_job()?;
    template.time.unique_key = None;
    template.time.replace = None;
    template.idempotency_key = None;
    let name = schedule.name().unwrap_or(J::KIND).to_owned();
    crate::store::validate_name("kind", &name, crate::limits::MAX_KIND_LEN).map_err(|_| {
        Error::invalid(
            "invalid_schedule",
            format!("schedule name `{name}` must be 1 to 200 bytes"),
        )
    })?;
    Ok(crate::maintenance::Periodic {
        name,
        schedule,
        template,
    })
}

/// The schedules of a runtime: the registered kinds' own and the builder's, with no two
/// of one name.
pub(crate) fn scheduler_entries(
    registry: &Registry,
    explicit: Vec<Result<crate::maintenance::Periodic, Error>>,
) -> Result<Vec<crate::maintenance::Periodic>, Error> {
    let mut out: Vec<crate::maintenance::Periodic> = Vec::new();
    for entry in registry
        .handlers()
        .filter_map(|h| h.periodic())
        .chain(explicit)
    {
        let entry = entry?;
        if out.iter().any(|p| p.name == entry.name) {
            return Err(Error::Config(format!(
                "two schedules are named `{}`; give each its own with `Schedule::named`",
                entry.name
            )));
        }
        out.push(entry);
    }
    Ok(out)
}
