//! Cluster-wide concurrency and rate limits, enforced by the claim.
//!
//! A kind's limits come from its code (`#[job(concurrency = 5, rate = "100/s")]`), a
//! queue's from the builder (`.queue_limit("mail", 20)`), and either may be overridden by
//! an operator (`jobq limit set`); all are rows of `jobq.limits`, which every runtime
//! reads again within a poll interval ([`LimitCache`]).
//!
//! A claim that involves no limit is today's single statement. One whose limits are all
//! kind-wide (a kind's concurrency and bucket, a queue's concurrency) is one statement
//! too: it counts running rows, reads the buckets, locks candidates within the free slots
//! and tokens (`FOR UPDATE SKIP LOCKED`), claims them and charges the buckets. One with
//! per-key limits runs in a transaction: it takes a transaction-scoped advisory lock per
//! limited kind and queue, counts and locks candidates the same way, decides here
//! ([`plan`]) which to claim, which to defer and which buckets to charge, and writes all
//! of it in one statement.
//!
//! Two claims must never both see the last free slot or the last token. Every claim that
//! takes jobs of a limited kind or queue raises its generation in `jobq.limit_gens`, in
//! the statement that claims and only if it is still the value read with the usage (the
//! row lock makes a concurrent claim wait for the first to commit, then find the value
//! changed). A claim overtaken so takes nothing and is tried again under the locks; the
//! locked claims wait for each other, so they read usage no other locked claim is
//! changing. A claim that takes nothing writes nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::error::Error;
use crate::store::{
    self, BucketRate, BucketState, Candidate, ClaimParams, ClaimPlan, ClaimedJob, CodeLimit,
    LimitRow,
};

/// A rate: `count` jobs per second, minute or hour (`rate = "100/s"`, `"10/min"`,
/// `"5/h"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    count: u32,
    per_secs: u32,
}

impl Rate {
    /// `count` per second.
    pub const fn per_second(count: u32) -> Self {
        Rate { count, per_secs: 1 }
    }

    /// `count` per minute.
    pub const fn per_minute(count: u32) -> Self {
        Rate {
            count,
            per_secs: 60,
        }
    }

    /// `count` per hour.
    pub const fn per_hour(count: u32) -> Self {
        Rate {
            count,
            per_secs: 3600,
        }
    }

    /// The jobs allowed per period.
    pub const fn count(&self) -> u32 {
        self.count
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        Duration::from_secs(self.per_secs as u64)
    }

    /// Parses `N/s`, `N/min` or `N/h` (as `jobq limit set --rate` takes it).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with code `invalid_rate` for anything else, or a count of 0.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = || {
            Error::invalid(
                "invalid_rate",
                format!("rate `{text}` is not `N/s`, `N/min` or `N/h` with N at least 1"),
            )
        };
        let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || count > i32::MAX as u32 {
            return Err(bad());
        }
        match unit.trim() {
            "s" => Ok(Rate::per_second(count)),
            "min" => Ok(Rate::per_minute(count)),
            "h" => Ok(Rate::per_hour(count)),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.per_secs {
            1 => "s",
            60 => "min",
            3600 => "h",
            _ => return write!(f, "{}/{}s", self.count, self.per_secs),
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// A kind's limits as its code declares them (`#[job(concurrency = …, rate = …)]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindLimits {
    concurrency: Option<u32>,
    per_key: bool,
    rate: Option<Rate>,
    burst: Option<u32>,
    rate_per_key: bool,
}

impl KindLimits {
    /// No limit.
    pub const NONE: KindLimits = KindLimits {
        concurrency: None,
        per_key: false,
        rate: None,
        burst: None,
        rate_per_key: false,
    };

    /// At most `n` jobs of the kind running at once across all nodes.
    #[must_use]
    pub const fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// The concurrency limit counts per concurrency key (`concurrency_key = field`, or
    /// the enqueue builder's `.concurrency_key(k)`); jobs without a key share one group.
    #[must_use]
    pub const fn per_key(mut self) -> Self {
        self.per_key = true;
        self
    }

    /// At most `rate` jobs started, with bursts of at most [`burst`](Self::burst).
    #[must_use]
    pub const fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// The bucket's size: how many jobs may start at once after a quiet spell (default:
    /// the rate's count, one period's worth).
    #[must_use]
    pub const fn burst(mut self, n: u32) -> Self {
        self.burst = Some(n);
        self
    }

    /// Each rate key (`rate_key = field`, or `.rate_key(k)`) has a bucket of its own;
    /// jobs without a key share the kind's.
    #[must_use]
    pub const fn rate_per_key(mut self) -> Self {
        self.rate_per_key = true;
        self
    }

    /// Whether any limit is set.
    pub const fn is_none(&self) -> bool {
        self.concurrency.is_none() && self.rate.is_none()
    }

    /// The code row of `kind`, if it has a limit.
    pub(crate) fn code_row(&self, kind: &str) -> Option<CodeLimit> {
        if self.is_none() {
            return None;
        }
        Some(CodeLimit {
            scope: "kind",
            name: kind.to_owned(),
            concurrency: self.concurrency.map(clamp_i32),
            per_key: self.per_key,
            rate: self
                .rate
                .map(|r| (clamp_i32(r.count), f64::from(r.per_secs))),
            burst: self.burst.map(clamp_i32),
            rate_per_key: self.rate_per_key,
        })
    }
}

fn clamp_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// How one kind's claims are limited, as in force now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct KindRule {
    pub(crate) concurrency: Option<i64>,
    pub(crate) per_key: bool,
    /// The kind's rate (unlimited for a kind with no rate and a throttle in force), and
    /// whether each rate key has a bucket of its own.
    pub(crate) bucket: Option<(BucketRate, bool)>,
}

/// The limits in force, as one runtime last read them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Effective {
    pub(crate) kinds: HashMap<String, KindRule>,
    pub(crate) queues: HashMap<String, i64>,
}

impl Effective {
    /// Whether a claim of `kinds` from `queue` is held to a limit (the queue's, or one of
    /// a kind's); a claim that is not is the plain one.
    pub(crate) fn bind(&self, queue: &str, kinds: &[String]) -> bool {
        self.queues.contains_key(queue) || kinds.iter().any(|k| self.kinds.contains_key(k))
    }

    fn from_rows(rows: &[LimitRow], throttled: &[String]) -> Self {
        let mut e = Effective::default();
        for r in rows {
            if r.scope == "queue" {
                if let Some(c) = r.concurrency {
                    e.queues.insert(r.name.clone(), i64::from(c));
                }
                continue;
            }
            let bucket = match (r.rate_count, r.rate_secs) {
                (Some(count), Some(secs)) => {
                    Some((BucketRate::new(count, secs, r.burst), r.rate_per_key))
                }
                _ => None,
            };
            let rule = KindRule {
                concurrency: r.concurrency.map(i64::from),
                per_key: r.per_key,
                bucket,
            };
            if rule.concurrency.is_some() || rule.bucket.is_some() {
                e.kinds.insert(r.name.clone(), rule);
            }
        }
        for kind in throttled {
            let rule = e.kinds.entry(kind.clone()).or_insert(KindRule {
                concurrency: None,
                per_key: false,
                bucket: None,
            });
            if rule.bucket.is_none() {
                rule.bucket = Some((BucketRate::UNLIMITED, true));
            }
        }
        e
    }
}

/// One runtime's view of `jobq.limits`: written from its code on first use, read again
/// when older than the poll interval, so an operator's change reaches every node within
/// a poll interval.
#[derive(Debug)]
pub(crate) struct LimitCache {
    code: Vec<CodeLimit>,
    kinds: Vec<String>,
    queues: Vec<String>,
    max_age: Duration,
    state: Mutex<Option<(Instant, Arc<Effective>)>>,
}

impl LimitCache {
    /// The cache of a runtime serving `kinds` (with their code limits) and `queues` (with
    /// the builder's queue limits), refreshed every `max_age`.
    pub(crate) fn new(
        kinds: impl IntoIterator<Item = (String, KindLimits)>,
        queues: impl IntoIterator<Item = (String, Option<u32>)>,
        max_age: Duration,
    ) -> Self {
        let mut code = Vec::new();
        let mut kind_names = Vec::new();
        for (kind, limits) in kinds {
            code.extend(limits.code_row(&kind));
            kind_names.push(kind);
        }
        let mut queue_names = Vec::new();
        for (queue, limit) in queues {
            if let Some(n) = limit {
                code.push(CodeLimit {
                    scope: "queue",
                    name: queue.clone(),
                    concurrency: Some(clamp_i32(n)),
                    per_key: false,
                    rate: None,
                    burst: None,
                    rate_per_key: false,
                });
            }
            queue_names.push(queue);
        }
        LimitCache {
            code,
            kinds: kind_names,
            queues: queue_names,
            max_age,
            state: Mutex::new(None),
        }
    }

    /// The limits in force if they were read within the poll interval; `None` when
    /// [`LimitCache::get`] must read them.
    pub(crate) async fn fresh(&self) -> Option<Arc<Effective>> {
        self.unexpired(&*self.state.lock().await)
    }

    /// The limits in `state` if read within the poll interval.
    fn unexpired(&self, state: &Option<(Instant, Arc<Effective>)>) -> Option<Arc<Effective>> {
        state
            .as_ref()
            .filter(|(at, _)| at.elapsed() < self.max_age)
            .map(|(_, e)| e.clone())
    }

    /// The limits in force, read again when older than the poll interval (the first
    /// call writes this runtime's code limits first).
    pub(crate) async fn get(
        &self,
        conn: &mut PgConnection,
        now: Option<DateTime<Utc>>,
    ) -> Result<Arc<Effective>, Error> {
        let mut state = self.state.lock().await;
        if let Some(e) = self.unexpired(&state) {
            return Ok(e);
        }
        if state.is_none() {
            store::limits_seed(conn, &self.code, &self.kinds, &self.queues).await?;
        }
        let rows = store::limits_effective(conn).await?;
        let throttled = store::rate_throttled_kinds(conn, now).await?;
        let e = Arc::new(Effective::from_rows(&rows, &throttled));
        *state = Some((Instant::now(), e.clone()));
        Ok(e)
    }
}

/// How often a producer whose kinds are all at their concurrency limit looks again (a
/// slot freed anywhere is taken within this, not within a poll interval).
pub(crate) const LIMIT_RECHECK: Duration = Duration::from_millis(100);

/// What a claim within limits took, and when a limit that held jobs back may let them
/// go: a kind-wide bucket's next token, [`LIMIT_RECHECK`] for a full concurrency limit,
/// at once when candidates were deferred (others may be due). An idle producer waits for
/// that (or a wake-up), not a whole poll interval.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub(crate) jobs: Vec<ClaimedJob>,
    pub(crate) retry_in: Option<Duration>,
}

/// Claims as [`store::job_claim`] does, within the limits in force: today's single
/// statement when neither the queue nor any served kind is limited; one statement that
/// reads usage and claims when every limit of the served kinds is kind-wide; else the
/// locked transaction described in the module docs (also the fallback of a
/// one-statement claim that another claim overtook). Jobs over a per-key limit are
/// deferred (`scheduled`): over a concurrency key's limit by `defer`, over a rate key's
/// bucket to the time of their token.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    p: &ClaimParams<'_>,
    limits: &Effective,
    defer: Duration,
) -> Result<Claimed, Error> {
    let queue_cap = limits.queues.get(p.queue).copied();
    if !limits.bind(p.queue, p.kinds) {
        return Ok(Claimed {
            jobs: store::job_claim(conn, p).await?,
            retry_in: None,
        });
    }
    let rule = |k: &String| limits.kinds.get(k);
    let caps: Vec<Option<i64>> = p
        .kinds
        .iter()
        .map(|k| rule(k).filter(|r| !r.per_key).and_then(|r| r.concurrency))
        .collect();
    let rates: Vec<Option<BucketRate>> = p
        .kinds
        .iter()
        .map(|k| match rule(k).and_then(|r| r.bucket) {
            Some((rate, false)) => Some(rate),
            _ => None,
        })
        .collect();
    let per_key: Vec<String> = filter_kinds(limits, |r| r.concurrency.is_some() && r.per_key);
    let key_buckets: Vec<String> = filter_kinds(limits, |r| matches!(r.bucket, Some((_, true))));
    let gen_keys: Vec<Option<i64>> = p
        .kinds
        .iter()
        .map(|k| rule(k).map(|_| store::lock_key("kind", k)))
        .collect();
    let params = store::CandidateParams {
        queue: p.queue,
        kinds: p.kinds,
        caps: &caps,
        rates: &rates,
        per_key_kinds: &per_key,
        key_bucket_kinds: &key_buckets,
        queue_cap,
        limit: p.limit,
        lease_secs: p.lease_secs,
        now: p.now,
        gen_keys: &gen_keys,
        queue_gen_key: queue_cap.map(|_| store::lock_key("queue", p.queue)),
    };
    // Kind-wide limits only: the windows are the whole decision, so one statement
    // reads, claims and charges, with no transaction around it.
    let kind_wide = !p
        .kinds
        .iter()
        .any(|k| per_key.contains(k) || key_buckets.contains(k));
    if kind_wide {
        let (jobs, read) = store::claim_kind_wide(conn, &params, p.worker).await?;
        if !read.conflict {
            return Ok(Claimed {
                retry_in: retry_after(limits, &read, p.now),
                jobs,
            });
        }
    }
    let mut keys: Vec<i64> = gen_keys.iter().flatten().copied().collect();
    keys.extend(params.queue_gen_key);
    let mut tx = store::claim_begin(conn, &keys).await?;
    let (jobs, read, deferred) = if kind_wide {
        let (jobs, read) = store::claim_kind_wide(&mut tx, &params, p.worker).await?;
        (jobs, read, false)
    } else {
        let read = store::claim_candidates(&mut tx, &params).await?;
        let now = read.now.or(p.now).unwrap_or_else(Utc::now);
        let running: HashMap<&str, i64> = read
            .kinds
            .iter()
            .map(|k| (k.kind.as_str(), k.running))
            .collect();
        let plan = plan(
            now,
            &limits.kinds,
            &read.candidates,
            read.total,
            &running,
            defer,
        );
        let jobs = if plan == ClaimPlan::default() {
            Vec::new()
        } else {
            let gens = plan_gens(&plan, &read, params.queue_gen_key);
            store::claim_apply(&mut tx, p, &plan, &gens).await?
        };
        let mut read = read;
        read.conflict = jobs.is_empty() && !plan.take.is_empty();
        (jobs, read, !plan.defer.is_empty())
    };
    tx.commit().await?;
    // Taken over by another claim, or only deferrals: others may be due now.
    let again = read.conflict || (jobs.is_empty() && deferred);
    Ok(Claimed {
        retry_in: if again {
            Some(Duration::ZERO)
        } else {
            retry_after(limits, &read, p.now)
        },
        jobs,
    })
}

/// The generations a plan claims under, `(key, seen)` in key order: those of the kinds
/// it takes jobs of, and the queue's when it takes any.
fn plan_gens(
    plan: &ClaimPlan,
    read: &store::ClaimRead,
    queue_key: Option<i64>,
) -> Vec<(i64, Option<i64>)> {
    let taken: Vec<&str> = read
        .candidates
        .iter()
        .filter(|c| plan.take.contains(&c.id))
        .map(|c| c.kind.as_str())
        .collect();
    let mut gens: Vec<(i64, Option<i64>)> = read
        .kinds
        .iter()
        .filter(|k| taken.contains(&k.kind.as_str()))
        .filter_map(|k| k.gen_key.map(|key| (key, k.seen_gen)))
        .collect();
    if let (Some(key), false) = (queue_key, plan.take.is_empty()) {
        gens.push((key, read.queue_gen));
    }
    gens.sort_unstable();
    gens.dedup_by_key(|g| g.0);
    gens
}

/// When a kind held back entirely may go again: its bucket's next token, or
/// [`LIMIT_RECHECK`] for a full concurrency limit (a full queue holds back every kind).
fn retry_after(
    limits: &Effective,
    read: &store::ClaimRead,
    at: Option<DateTime<Utc>>,
) -> Option<Duration> {
    let now = read.now.or(at).unwrap_or_else(Utc::now);
    read.kinds
        .iter()
        .filter(|u| u.window <= 0)
        .filter_map(|u| {
            let rule = limits.kinds.get(&u.kind)?;
            let full = read.total == 0
                || rule
                    .concurrency
                    .is_some_and(|c| !rule.per_key && u.running >= c);
            match rule.bucket {
                _ if full => Some(LIMIT_RECHECK),
                Some((rate, false)) => (rate.next_token(u.bucket.as_ref(), now, 0) - now)
                    .to_std()
                    .ok(),
                _ => None,
            }
        })
        .min()
        .or((read.total == 0).then_some(LIMIT_RECHECK))
}

fn filter_kinds(limits: &Effective, f: impl Fn(&KindRule) -> bool) -> Vec<String> {
    limits
        .kinds
        .iter()
        .filter(|(_, r)| f(r))
        .map(|(k, _)| k.clone())
        .collect()
}

/// One bucket as a claim's plan charges it.
struct Charge {
    /// Tokens taken by this claim.
    taken: u32,
    /// Candidates deferred to its later tokens.
    deferred: u32,
    bucket: Option<BucketState>,
    rate: BucketRate,
}

/// Decides a limited claim: walks `candidates` in claim order and claims each one its
/// limits allow, up to `total`. A candidate over its kind's concurrency limit or kind-wide
/// bucket is left pending (those limits already bound the window); one over its
/// concurrency key's limit is deferred by `defer`; one over its rate key's bucket is
/// deferred to the time of its token. Charged buckets get their tokens left as of `now`.
pub(crate) fn plan(
    now: DateTime<Utc>,
    rules: &HashMap<String, KindRule>,
    candidates: &[Candidate],
    total: i64,
    running: &HashMap<&str, i64>,
    defer: Duration,
) -> ClaimPlan {
    let mut out = ClaimPlan::default();
    let mut taken_kind: HashMap<&str, i64> = HashMap::new();
    let mut taken_key: HashMap<(&str, &str), i64> = HashMap::new();
    let mut buckets: HashMap<(&str, &str), Charge> = HashMap::new();
    let later = now + chrono::Duration::from_std(defer).unwrap_or(chrono::Duration::seconds(1));
    for c in candidates {
        if out.take.len() as i64 >= total {
            break;
        }
        let Some(rule) = rules.get(&c.kind) else {
            out.take.push(c.id);
            continue;
        };
        let ckey = c.concurrency_key.as_deref().unwrap_or("");
        if let Some(cap) = rule.concurrency {
            if rule.per_key {
                let used = c.key_running + taken_key.get(&(c.kind.as_str(), ckey)).unwrap_or(&0);
                if used >= cap {
                    out.defer.push((c.id, later));
                    continue;
                }
            } else {
                let used = running.get(c.kind.as_str()).unwrap_or(&0)
                    + taken_kind.get(c.kind.as_str()).unwrap_or(&0);
                if used >= cap {
                    continue;
                }
            }
        }
        if let Some((rate, per_key)) = rule.bucket {
            let b = buckets
                .entry((c.kind.as_str(), c.bucket_key.as_str()))
                .or_insert(Charge {
                    taken: 0,
                    deferred: 0,
                    bucket: c.bucket,
                    rate,
                });
            if rate.available(b.bucket.as_ref(), now) - f64::from(b.taken) < 1.0 {
                if per_key {
                    let n = b.taken + b.deferred;
                    out.defer
                        .push((c.id, rate.next_token(b.bucket.as_ref(), now, n)));
                    b.deferred += 1;
                }
                continue;
            }
            b.taken += 1;
        }
        *taken_kind.entry(c.kind.as_str()).or_default() += 1;
        *taken_key.entry((c.kind.as_str(), ckey)).or_default() += 1;
        out.take.push(c.id);
    }
    for ((kind, key), b) in buckets {
        if b.taken > 0 && b.rate.per_sec.is_finite() {
            let left = b.rate.available(b.bucket.as_ref(), now) - f64::from(b.taken);
            out.charge
                .push((kind.to_owned(), key.to_owned(), left, now));
        }
    }
    out.charge.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
            + chrono::Duration::microseconds((secs * 1e6) as i64)
    }

    fn cand(id: i64, kind: &str, ckey: Option<&str>, bkey: &str, key_running: i64) -> Candidate {
        Candidate {
            id,
            kind: kind.to_owned(),
            concurrency_key: ckey.map(str::to_owned),
            bucket_key: bkey.to_owned(),
            key_running,
            bucket: None,
        }
    }

    #[test]
    fn rates_parse_and_print() {
        assert_eq!(Rate::parse("100/s").unwrap(), Rate::per_second(100));
        assert_eq!(Rate::parse("10/min").unwrap(), Rate::per_minute(10));
        assert_eq!(Rate::parse(" 5 / h ").unwrap(), Rate::per_hour(5));
        for bad in ["0/s", "10", "10/d", "x/s", "-1/s", ""] {
            let e = Rate::parse(bad).unwrap_err();
            assert_eq!(e.code(), "invalid_rate", "{bad}");
        }
        assert_eq!(Rate::per_minute(10).to_string(), "10/min");
    }

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let rate = BucketRate::new(10, 1.0, Some(5));
        assert_eq!(rate.available(None, at(0.0)), 5.0);
        let empty = BucketState {
            tokens: 0.0,
            refilled_at: at(0.0),
        };
        assert!((rate.available(Some(&empty), at(0.25)) - 2.5).abs() < 1e-9);
        assert_eq!(rate.available(Some(&empty), at(100.0)), 5.0);
        // The next tokens after an empty bucket: 0.1 s apart.
        assert_eq!(rate.next_token(Some(&empty), at(0.0), 0), at(0.1));
        assert_eq!(rate.next_token(Some(&empty), at(0.0), 2), at(0.3));
        // A throttle: nothing before its time, then one token at once.
        let throttled = BucketState {
            tokens: 1.0,
            refilled_at: at(30.0),
        };
        assert_eq!(rate.available(Some(&throttled), at(29.0)), 0.0);
        assert_eq!(rate.next_token(Some(&throttled), at(29.0), 0), at(30.0));
        assert_eq!(rate.next_token(Some(&throttled), at(29.0), 1), at(30.1));
        assert_eq!(rate.available(Some(&throttled), at(30.0)), 1.0);
        // Default burst: the rate's count.
        assert_eq!(BucketRate::new(100, 60.0, None).burst, 100.0);
    }

    #[test]
    fn per_key_concurrency_defers_saturated_keys_and_takes_others() {
        let rules = HashMap::from([(
            "k".to_owned(),
            KindRule {
                concurrency: Some(2),
                per_key: true,
                bucket: None,
            },
        )]);
        let cands = vec![
            cand(1, "k", Some("a"), "k", 1),
            cand(2, "k", Some("a"), "k", 1),
            cand(3, "k", Some("b"), "k", 2),
            cand(4, "k", Some("c"), "k", 0),
            cand(5, "other", None, "other", 0),
        ];
        let p = plan(
            at(0.0),
            &rules,
            &cands,
            10,
            &HashMap::new(),
            Duration::from_secs(1),
        );
        assert_eq!(p.take, vec![1, 4, 5]);
        assert_eq!(p.defer, vec![(2, at(1.0)), (3, at(1.0))]);
        assert!(p.charge.is_empty());
    }

    #[test]
    fn per_key_buckets_charge_and_defer_to_the_next_token() {
        let rules = HashMap::from([(
            "k".to_owned(),
            KindRule {
                concurrency: None,
                per_key: false,
                bucket: Some((BucketRate::new(2, 1.0, Some(2)), true)),
            },
        )]);
        let mut cands: Vec<Candidate> = (1..=4).map(|i| cand(i, "k", None, "a", 0)).collect();
        cands.push(cand(5, "k", None, "b", 0));
        let p = plan(
            at(0.0),
            &rules,
            &cands,
            10,
            &HashMap::new(),
            Duration::from_secs(1),
        );
        assert_eq!(p.take, vec![1, 2, 5]);
        assert_eq!(p.defer, vec![(3, at(0.5)), (4, at(1.0))]);
        assert_eq!(
            p.charge,
            vec![
                ("k".to_owned(), "a".to_owned(), 0.0, at(0.0)),
                ("k".to_owned(), "b".to_owned(), 1.0, at(0.0)),
            ]
        );
    }

    #[test]
    fn the_total_stops_the_walk() {
        let rules = HashMap::new();
        let cands: Vec<Candidate> = (1..=4).map(|i| cand(i, "k", None, "k", 0)).collect();
        let p = plan(
            at(0.0),
            &rules,
            &cands,
            2,
            &HashMap::new(),
            Duration::from_secs(1),
        );
        assert_eq!(p.take, vec![1, 2]);
    }
}
