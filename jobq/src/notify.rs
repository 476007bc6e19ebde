//! Wake-ups. An insert of due jobs notifies `jobq_insert` with each queue's name inside
//! its own statement, so the notification is delivered when the inserting transaction
//! commits, and never if it rolls back. The listener wakes that queue's producer.
//!
//! PostgreSQL commits notifying transactions one at a time (it holds a cluster-wide lock
//! from the notifying commit until its WAL is flushed), so an insert skips the queues
//! this process notified in the same database within a short cooldown ([`WakeUps`]).
//! What a skipped insert committed is found by the producer woken by the notification
//! before it: a producer whose claim found jobs claims again a few times when the queue
//! runs dry ([`TRAIL`]). A notification is only a hint: producers also poll, so a lost
//! one costs latency, never a job. After a lost connection the listener reconnects and
//! wakes every producer, since notifications sent meanwhile are gone.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::store::NOTIFY_CHANNEL;

/// The shortest and the longest cooldown of a queue's wake-ups. A queue starts at the
/// shortest; its cooldown doubles after one in which two or more inserts were skipped
/// (a steady stream), and drops back to the shortest after one that was quiet.
pub(crate) const COOLDOWN: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_millis(8));

/// A producer whose claim found jobs claims again this long after the queue ran dry,
/// then twice as long each time it finds none, up to the second figure: these
/// trailing claims find the jobs of inserts that skipped their wake-up.
pub(crate) const TRAIL: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_millis(32));

/// The queues this process notified lately, per database: the record every insert
/// consults, whichever pool or transaction it runs in.
pub(crate) static WAKE_UPS: LazyLock<WakeUps> = LazyLock::new(WakeUps::default);

/// When each queue was last notified in each database (keyed `queue`, U+001F, database
/// as `store::database_sql!` names it), and its cooldown.
#[derive(Debug, Default)]
pub(crate) struct WakeUps(Mutex<HashMap<String, Cooldown>>);

#[derive(Debug, Clone, Copy)]
struct Cooldown {
    last: Instant,
    length: Duration,
    skipped: u32,
}

impl WakeUps {
    /// The keys of `queues`, in any database, still within their cooldown at `now`: an
    /// insert skips those of its own database.
    pub(crate) fn recent(&self, queues: &[String], now: Instant) -> Vec<String> {
        if queues.is_empty() {
            return Vec::new();
        }
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .filter(|(key, c)| {
                now.duration_since(c.last) < c.length
                    && queues.iter().any(|q| key.split('\u{1f}').next() == Some(q))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Records what an insert in `database` did: it skipped the queues among `recent`,
    /// and notified the others.
    pub(crate) fn inserted(
        &self,
        queues: &[String],
        recent: &[String],
        database: &str,
        now: Instant,
    ) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() > 4096 {
            map.retain(|_, c| now.duration_since(c.last) < Duration::from_secs(1));
        }
        for queue in queues {
            let key = format!("{queue}\u{1f}{database}");
            let skipped = recent.contains(&key);
            let c = map.entry(key).or_insert(Cooldown {
                last: now,
                length: COOLDOWN.0,
                skipped: 0,
            });
            if skipped {
                c.skipped += 1;
            } else {
                c.length = if c.skipped >= 2 {
                    (c.length * 2).min(COOLDOWN.1)
                } else {
                    COOLDOWN.0
                };
                c.skipped = 0;
                c.last = now;
            }
        }
    }
}

/// One wake-up signal per queue this runtime serves.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    by_queue: HashMap<String, Arc<Notify>>,
}

impl Wakers {
    pub(crate) fn new<'a>(queues: impl IntoIterator<Item = &'a str>) -> Self {
        Wakers {
            by_queue: queues
                .into_iter()
                .map(|q| (q.to_owned(), Arc::new(Notify::new())))
                .collect(),
        }
    }

    pub(crate) fn get(&self, queue: &str) -> Option<Arc<Notify>> {
        self.by_queue.get(queue).cloned()
    }

    /// Wakes `queue`'s producer; a wake-up that arrives while it is busy is kept for its
    /// next wait, so none is lost.
    pub(crate) fn wake(&self, queue: &str) {
        if let Some(n) = self.by_queue.get(queue) {
            n.notify_one();
        }
    }

    pub(crate) fn wake_all(&self) {
        for n in self.by_queue.values() {
            n.notify_one();
        }
    }
}

/// Listens until `stop`, reconnecting with backoff.
pub(crate) async fn listen(pool: PgPool, wakers: Arc<Wakers>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut listener = tokio::select! {
            _ = stop.cancelled() => return,
            l = connect(&pool) => match l {
                Ok(l) => l,
                Err(e) => {
                    warn!(error = %e, "LISTEN connection failed; producers keep polling, retrying in {backoff:?}");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        debug!("listening on {NOTIFY_CHANNEL}");
        backoff = Duration::from_millis(100);
        // Anything enqueued while we were not listening has been missed.
        wakers.wake_all();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                msg = listener.try_recv() => match msg {
                    Ok(Some(n)) => wakers.wake(n.payload()),
                    Ok(None) => {
                        // sqlx has already reconnected and listens again.
                        warn!("LISTEN connection lost and re-established");
                        wakers.wake_all();
                    }
                    Err(e) => {
                        warn!(error = %e, "LISTEN connection failed; reconnecting");
                        wakers.wake_all();
                        break;
                    }
                }
            }
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(names: &[&str]) -> Vec<String> {
        names.iter().map(|q| (*q).to_owned()).collect()
    }

    #[test]
    fn a_queue_is_skipped_within_its_cooldown_in_its_own_database_only() {
        let w = WakeUps::default();
        let t0 = Instant::now();
        let mail = queues(&["mail"]);
        assert!(w.recent(&mail, t0).is_empty());
        w.inserted(&mail, &[], "db1", t0);
        let recent = w.recent(&mail, t0 + Duration::from_micros(500));
        assert_eq!(recent, vec!["mail\u{1f}db1".to_owned()]);
        // Another queue, and the same queue past its cooldown, are not recent.
        assert!(w.recent(&queues(&["sms"]), t0).is_empty());
        assert!(w.recent(&mail, t0 + COOLDOWN.0).is_empty());
        // Skipped in db1; in db2 the statement notified, and records it.
        w.inserted(&mail, &recent, "db2", t0 + Duration::from_micros(500));
        let mut both = w.recent(&mail, t0 + Duration::from_micros(600));
        both.sort();
        assert_eq!(
            both,
            vec!["mail\u{1f}db1".to_owned(), "mail\u{1f}db2".to_owned()]
        );
    }

    #[test]
    fn the_cooldown_doubles_while_inserts_keep_skipping_and_resets_when_quiet() {
        let w = WakeUps::default();
        let mail = queues(&["mail"]);
        let mut now = Instant::now();
        let mut step = |w: &WakeUps, after: Duration| {
            now += after;
            let recent = w.recent(&mail, now);
            w.inserted(&mail, &recent, "db", now);
            recent.is_empty()
        };
        assert!(step(&w, Duration::ZERO), "the first notifies");
        let tick = Duration::from_micros(300);
        // Three skips within the first cooldown, then a notification: the next
        // cooldown is twice as long.
        assert!(!step(&w, tick) && !step(&w, tick) && !step(&w, tick));
        assert!(step(&w, COOLDOWN.0));
        assert!(!step(&w, COOLDOWN.0 + tick), "within the doubled cooldown");
        // It never grows past the longest.
        for _ in 0..20 {
            while !step(&w, tick) {}
            step(&w, tick);
            step(&w, tick);
        }
        assert!(step(&w, COOLDOWN.1), "at most the longest cooldown");
        // A cooldown without skips drops it back to the shortest.
        assert!(step(&w, COOLDOWN.1 + tick));
        assert!(step(&w, COOLDOWN.0 + tick));
    }
}
