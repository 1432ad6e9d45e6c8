//! Limits in a SQL store: the decision every SQL backend makes in one transaction over
//! its two limit tables (`<table>_limits`, a row per key with its bucket, locked while a
//! job takes it; `<table>_holds`, a row per job holding a slot or booked a
//! start), and the statements a backend runs for it ([`LimitTable`]).
//!
//! A slot is a holder row naming the lease's token, held while `held_until` is ahead of
//! the store's clock: renewed by the lease's heartbeat, deleted by its ack, release or
//! dead letter, and left to run out with the lease when the worker dies. Each statement
//! that touches it names the token, so a stale lease frees nothing. A rate's bucket
//! refills by the store's clock; a job that finds it empty books the next free start
//! (a holder row without a token), takes the token ahead (the bucket goes negative), and
//! is told to come back then.

use std::time::Duration;

use async_trait::async_trait;

pub use super::dialect::Dialect;
use crate::error::Result;
use crate::limit::{Acquired, Denial, Want};
use crate::limit_store::LimitLease;

/// How long a job denied a slot waits, at the least; each wait is up to twice this.
pub const SLOT_WAIT: Duration = Duration::from_millis(500);

/// One start in this many deletes its key's holder rows that ran out.
const EXPIRE_ONE_IN: u32 = 32;

/// How late a job may come back for its booked start and still take it (a worker
/// polling an idle queue looks once a second at the longest).
const LATE_GRACE_US: i64 = 1_500_000;

/// How long a booked start is kept past its time, for a job that comes back late.
pub const BOOKING_KEPT_US: i64 = 3_600_000_000;

/// A key's row, locked.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    /// Tokens left (`None`: never used; a full bucket).
    pub tokens: Option<f64>,
    /// When the bucket was last refilled (µs).
    pub refilled_us: i64,
    /// The store's clock (µs).
    pub now_us: i64,
    /// The key's slots, as last declared (`None`: no concurrency limit).
    pub concurrency: Option<i64>,
}

/// This job's own holder row under a key.
#[derive(Debug, Clone)]
pub struct Mine {
    /// The lease holding the slot (`None`: a booked start).
    pub token: Option<String>,
    /// A booked start's time (µs).
    pub run_at_us: Option<i64>,
    /// Until when the row counts (µs).
    pub held_until_us: i64,
}

/// A write to a holder row.
#[derive(Debug, Clone, Copy)]
pub struct Hold<'a> {
    /// The key.
    pub key: &'a str,
    /// The lease, for a slot; `None` for a booked start.
    pub token: Option<&'a str>,
    /// A booked start's time (µs).
    pub run_at_us: Option<i64>,
    /// Until when the row counts (µs).
    pub until_us: i64,
}

/// What a backend runs on its limit tables, inside one transaction.
#[async_trait]
pub trait LimitTable: Send {
    /// Locks `key`'s row: its bucket and the store's clock; `None` when it is missing.
    async fn lock(&mut self, queue: &str, key: &str) -> Result<Option<Bucket>>;

    /// Creates `key`'s row unless another transaction has.
    async fn ensure(&mut self, queue: &str, key: &str) -> Result<()>;

    /// Deletes `key`'s holder rows that ran out by `now_us`.
    async fn expire(&mut self, queue: &str, key: &str, now_us: i64) -> Result<()>;

    /// The job's own holder row under `key`.
    async fn mine(&mut self, queue: &str, key: &str, id: &str) -> Result<Option<Mine>>;

    /// Slots of `key` held at `now_us`, but this lease's own.
    async fn running(&mut self, lease: LimitLease<'_>, key: &str, now_us: i64) -> Result<u64>;

    /// Writes the job's holder row (replacing any other of the job under the key).
    async fn hold(&mut self, lease: LimitLease<'_>, hold: Hold<'_>) -> Result<()>;

    /// Deletes the job's holder row under `key` (a booked start, taken).
    async fn unhold(&mut self, lease: LimitLease<'_>, key: &str) -> Result<()>;

    /// Deletes the job's parked row under `key`, if any (it took a slot, or was woken).
    async fn unwait(&mut self, queue: &str, key: &str, id: &str) -> Result<()>;

    /// Saves `key`'s bucket and the limits last declared for it.
    async fn save(
        &mut self,
        queue: &str,
        want: &Want,
        tokens: Option<f64>,
        refilled_us: i64,
    ) -> Result<()>;
}

/// What one key says.
enum Verdict {
    /// Run: hold a slot (when limited), take a token (`Some`: the bucket after) or a
    /// booking (`took_booking`).
    Go {
        tokens: Option<f64>,
        took_booking: bool,
    },
    /// Out of tokens: booked at this time (`new_booking`: booked just now, the bucket
    /// after).
    Later {
        run_at_us: i64,
        new_booking: Option<f64>,
    },
}

/// Takes the slots and tokens of `wants` for `lease`, all or none (see the module
/// documentation). The caller commits whatever this returns: a denial writes only
/// bookings.
pub async fn acquire<T: LimitTable>(
    mut t: T,
    lease: LimitLease<'_>,
    hold: Duration,
    wants: &[Want],
) -> Result<Acquired> {
    let wants = merged(wants);
    let mut verdicts = Vec::with_capacity(wants.len());
    for want in &wants {
        let bucket = locked(&mut t, lease, &want.key).await?;
        let now = bucket.now_us;
        // Rows that ran out count for nothing; they are deleted now and then rather
        // than by every start, which would read all of a key's bookings each time.
        if fastrand::u32(..EXPIRE_ONE_IN) == 0 {
            t.expire(lease.queue, &want.key, now).await?;
        }
        let mine = t.mine(lease.queue, &want.key, lease.id).await?;
        if let Some(n) = want.concurrency {
            if held_before(mine.as_ref(), lease, now)
                || t.running(lease, &want.key, now).await? >= u64::from(n)
            {
                return Ok(Acquired::Wait {
                    after: jittered(SLOT_WAIT),
                    by: Denial::Concurrency,
                });
            }
        }
        let booked = mine
            .as_ref()
            .filter(|m| m.token.is_none())
            .and_then(|m| m.run_at_us);
        verdicts.push((want, now, verdict(want, &bucket, booked)));
    }
    let later = verdicts
        .iter()
        .filter_map(|(_, now, v)| match v {
            Verdict::Later { run_at_us, .. } => Some(run_at_us - now),
            _ => None,
        })
        .max();
    if let Some(wait_us) = later {
        book(&mut t, lease, &verdicts).await?;
        return Ok(Acquired::Wait {
            after: Duration::from_micros(u64::try_from(wait_us).unwrap_or(0)),
            by: Denial::Rate,
        });
    }
    grant(&mut t, lease, hold, &verdicts).await?;
    Ok(Acquired::Granted)
}

/// `key`'s row, locked, created first when missing.
async fn locked<T: LimitTable>(t: &mut T, lease: LimitLease<'_>, key: &str) -> Result<Bucket> {
    // The row is locked before any write: on MySQL a duplicate insert first takes
    // a shared lock, and two of those upgrading deadlock each other.
    if let Some(bucket) = t.lock(lease.queue, key).await? {
        return Ok(bucket);
    }
    t.ensure(lease.queue, key).await?;
    t.lock(lease.queue, key).await?.ok_or_else(|| {
        crate::Error::Conflict(format!(
            "the limit row of {key} in queue {} vanished while it was taken",
            lease.queue
        ))
    })
}

/// What `want`'s rate says of a start now, given the job's booked start (if any).
fn verdict(want: &Want, bucket: &Bucket, booked: Option<i64>) -> Verdict {
    let now = bucket.now_us;
    match (want.rate, booked) {
        (None, _) => Verdict::Go {
            tokens: None,
            took_booking: booked.is_some(),
        },
        (Some(_), Some(at)) if at > now => Verdict::Later {
            run_at_us: at,
            new_booking: None,
        },
        (Some(_), Some(at)) if now - at <= LATE_GRACE_US => Verdict::Go {
            tokens: None,
            took_booking: true,
        },
        // Booked, but back so late that running now would bunch starts up: it asks
        // again as if new (its booked start is lost).
        (Some(rate), _) => {
            if let Some(at) = booked {
                tracing::debug!(late_ms = (now - at) / 1000, key = %want.key, "back too late for its booked start; it asks again");
            }
            let per_us = rate.per_micro();
            let burst = f64::from(rate.burst);
            let elapsed = (now - bucket.refilled_us).max(0) as f64;
            // A late booking's token comes back first: the start it was taken for
            // never happened, so the rate is not spent on it.
            let refund = if booked.is_some() { 1.0 } else { 0.0 };
            let tokens = bucket
                .tokens
                .map_or(burst, |t| (t + refund + elapsed * per_us).min(burst));
            if tokens >= 1.0 {
                Verdict::Go {
                    tokens: Some(tokens - 1.0),
                    took_booking: booked.is_some(),
                }
            } else {
                let wait_us = ((1.0 - tokens) / per_us).ceil() as i64;
                Verdict::Later {
                    run_at_us: now + wait_us.max(1),
                    new_booking: Some(tokens - 1.0),
                }
            }
        }
    }
}

/// A denial by rate: books a start for each key that took a token for it just now.
async fn book<T: LimitTable>(
    t: &mut T,
    lease: LimitLease<'_>,
    verdicts: &[(&Want, i64, Verdict)],
) -> Result<()> {
    for (want, now, verdict) in verdicts {
        if let Verdict::Later {
            run_at_us,
            new_booking: Some(tokens),
        } = verdict
        {
            let booking = Hold {
                key: &want.key,
                token: None,
                run_at_us: Some(*run_at_us),
                until_us: run_at_us + BOOKING_KEPT_US,
            };
            t.hold(lease, booking).await?;
            t.save(lease.queue, want, Some(*tokens), *now).await?;
        }
    }
    Ok(())
}

/// A grant: holds a slot under each limited key and spends the tokens and bookings.
async fn grant<T: LimitTable>(
    t: &mut T,
    lease: LimitLease<'_>,
    hold: Duration,
    verdicts: &[(&Want, i64, Verdict)],
) -> Result<()> {
    let hold_us = crate::time_units::micros(hold);
    for (want, now, verdict) in verdicts {
        let Verdict::Go {
            tokens,
            took_booking,
        } = verdict
        else {
            continue;
        };
        if want.concurrency.is_some() {
            let slot = Hold {
                key: &want.key,
                token: Some(lease.token),
                run_at_us: None,
                until_us: now + hold_us,
            };
            t.hold(lease, slot).await?;
            // A job that came back from parking by its backstop leaves no waiter row
            // behind for a later release to wake (its retry delay would be cut short).
            t.unwait(lease.queue, &want.key, lease.id).await?;
        } else if *took_booking {
            t.unhold(lease, &want.key).await?;
        }
        if tokens.is_some() || want.rate.is_none() {
            t.save(lease.queue, want, *tokens, *now).await?;
        }
    }
    Ok(())
}

/// Whether the job's earlier lease still holds its slot under a key (it may still run):
/// a new lease waits for it to end or run out rather than take its row over.
pub(super) fn held_before(mine: Option<&Mine>, lease: LimitLease<'_>, now_us: i64) -> bool {
    mine.is_some_and(|m| {
        m.token.as_deref().is_some_and(|t| t != lease.token) && m.held_until_us > now_us
    })
}

/// `wants` one per key, sorted by key (one order for every transaction: two jobs sharing
/// keys cannot deadlock); two limits counting under one key keep the stricter of each.
pub(super) fn merged(wants: &[Want]) -> Vec<Want> {
    let mut out: Vec<Want> = Vec::with_capacity(wants.len());
    let mut sorted: Vec<&Want> = wants.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    for w in sorted {
        match out.last_mut() {
            Some(last) if last.key == w.key => {
                last.concurrency = match (last.concurrency, w.concurrency) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                last.rate = match (last.rate, w.rate) {
                    (Some(a), Some(b)) => Some(crate::limit::Rate {
                        burst: a.burst.min(b.burst),
                        ..if a.per_micro() <= b.per_micro() { a } else { b }
                    }),
                    (a, b) => a.or(b),
                };
            }
            _ => out.push(w.clone()),
        }
    }
    out
}

/// `base` to twice `base`: jobs denied together come back spread out.
fn jittered(base: Duration) -> Duration {
    base + base.mul_f64(fastrand::f64())
}

/// The limit tables' statements in one dialect, for the default table name: a backend
/// specialises them for its table as it does its own.
#[derive(Debug, Clone)]
pub struct LimitStatements {
    /// Creates a key's row (queue, key) unless it exists.
    pub ensure: String,
    /// A key's row, locked (queue, key): tokens, refilled_at, the clock, concurrency.
    pub lock: String,
    /// Deletes a key's holders that ran out (queue, key, now).
    pub expire: String,
    /// A job's holder row under a key (queue, key, id): token, run_at, held_until.
    pub mine: String,
    /// Slots held under a key (queue, key, now, id, token), but the lease's own.
    pub running: String,
    /// Writes a job's holder row (queue, key, id, token, run_at, held_until).
    pub hold: String,
    /// Deletes a job's booked start (queue, key, id).
    pub unhold: String,
    /// Saves a key's bucket and limits (concurrency, rate, tokens, refilled_at, queue,
    /// key).
    pub save: String,
    /// Renews a lease's live slots (hold µs, queue, id, token).
    pub extend: String,
    /// Deletes a lease's holder rows (queue, id, token).
    pub release: String,
    /// Each key's use: queue, key, concurrency, rate, tokens, running.
    pub usage: String,
    /// The keys a lease holds slots under (queue, id, token).
    pub lease_keys: String,
    /// Parks a job under a key, keeping its first time (queue, key, id, now).
    pub wait: String,
    /// A key's oldest parked jobs (queue, key, how many): id, since.
    pub waiters: String,
    /// Deletes a parked job's row (queue, key, id).
    pub unwait: String,
    /// Keys with parked jobs and a free slot, up to 64: queue, key.
    pub waiting_keys: String,
    /// Makes a parked job's row due now, in line as of when it first parked (since µs,
    /// id, queue), in the jobs table; ordering keys' parked rows are never touched.
    pub wake: String,
}

const ENSURE: &str =
    "INSERT {IGNORE}INTO \"switchyard_jobs_limits\" (queue, limit_key, refilled_at)
    VALUES (?, ?, {NOW}){NOTHING}";
const LOCK: &str =
    "SELECT tokens, refilled_at, {NOW_I64}, concurrency FROM \"switchyard_jobs_limits\"
 WHERE queue = ? AND limit_key = ?{FOR_UPDATE}";
const PG_LOCK: &str =
    "WITH l AS (SELECT tokens, refilled_at, concurrency FROM \"switchyard_jobs_limits\"
 WHERE queue = ? AND limit_key = ? FOR UPDATE)
SELECT tokens, refilled_at, {NOW_I64}, concurrency FROM l";
const EXPIRE: &str = "DELETE FROM \"switchyard_jobs_holds\"
 WHERE queue = ? AND limit_key = ? AND held_until <= ?";
const MINE: &str = "SELECT token, run_at, held_until FROM \"switchyard_jobs_holds\"
 WHERE queue = ? AND limit_key = ? AND id = ?";
const RUNNING: &str = "SELECT COUNT(*) FROM \"switchyard_jobs_holds\"
 WHERE queue = ? AND limit_key = ? AND token IS NOT NULL AND held_until > ?
   AND NOT (id = ? AND token = ?)";
const HOLD: &str = "INSERT INTO \"switchyard_jobs_holds\"
    (queue, limit_key, id, token, run_at, held_until) VALUES (?, ?, ?, ?, ?, ?){UPSERT}";
const UNHOLD: &str = "DELETE FROM \"switchyard_jobs_holds\"
 WHERE queue = ? AND limit_key = ? AND id = ? AND token IS NULL";
const SAVE: &str = "UPDATE \"switchyard_jobs_limits\"
   SET concurrency = ?, rate_per_second = ?, tokens = COALESCE(?, tokens), refilled_at = ?
 WHERE queue = ? AND limit_key = ?";
const EXTEND: &str = "UPDATE \"switchyard_jobs_holds\" SET held_until = {NOW} + ?
 WHERE queue = ? AND id = ? AND token = ? AND held_until > {NOW}";
const RELEASE: &str = "DELETE FROM \"switchyard_jobs_holds\"
 WHERE queue = ? AND id = ? AND token = ?";
const LEASE_KEYS: &str = "SELECT limit_key FROM \"switchyard_jobs_holds\"
 WHERE queue = ? AND id = ? AND token = ?";
const WAIT: &str = "INSERT {IGNORE}INTO \"switchyard_jobs_waits\" (queue, limit_key, id, since)
    VALUES (?, ?, ?, ?){NOTHING}";
const WAITERS: &str = "SELECT id, since FROM \"switchyard_jobs_waits\"
 WHERE queue = ? AND limit_key = ? ORDER BY since, id LIMIT ?";
const UNWAIT: &str = "DELETE FROM \"switchyard_jobs_waits\"
 WHERE queue = ? AND limit_key = ? AND id = ?";
/// Only keys whose slots are not all held: a saturated key's waiters wait for its release.
const WAITING_KEYS: &str = "SELECT DISTINCT w.queue, w.limit_key FROM \"switchyard_jobs_waits\" w
  LEFT JOIN \"switchyard_jobs_limits\" l ON l.queue = w.queue AND l.limit_key = w.limit_key
 WHERE l.concurrency IS NULL
    OR l.concurrency > (SELECT COUNT(*) FROM \"switchyard_jobs_holds\" h
                         WHERE h.queue = w.queue AND h.limit_key = w.limit_key
                           AND h.token IS NOT NULL AND h.held_until > {NOW})
 LIMIT 64";
/// The jobs table keeps its own clock and parking mark, filled in per dialect. The job
/// goes back in line as of `since` in the column its claim orders by: `visible_at` on
/// MySQL and SQLite, `available_at` on PostgreSQL (which keeps both at `since` there,
/// from `{SINCE_FROM}`, as the parameter is bound once). It is made ready at once, as a
/// give-back is: left to the next promotion of due rows, which a busy claimer skips for
/// a while, it would lose the freed slot to the key's jobs that were ready all along.
const WAKE: &str =
    "UPDATE \"switchyard_jobs\" SET available_at = {JOB_AVAILABLE}, visible_at = {JOB_SINCE}, ready = {READY}{SINCE_FROM}
 WHERE id = ? AND queue = ? AND token IS NULL AND {NOT_READY}
   AND visible_at > {JOB_NOW} AND visible_at <> {JOB_PARKED}";
const USAGE: &str = "SELECT l.queue, l.limit_key, l.concurrency, l.rate_per_second, l.tokens,
       (SELECT COUNT(*) FROM \"switchyard_jobs_holds\" h
         WHERE h.queue = l.queue AND h.limit_key = l.limit_key AND h.token IS NOT NULL
           AND h.held_until > {NOW}) AS running
  FROM \"switchyard_jobs_limits\" l
 ORDER BY running DESC, l.queue, l.limit_key LIMIT 1000";

impl LimitStatements {
    /// The statements in `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        let s = |sql: &str| dialect.write(sql);
        let (job_now, job_available, job_since, since_from, not_ready, job_parked) = match dialect {
            Dialect::Postgres => (
                "now()",
                "w.since",
                "w.since",
                "\n  FROM (SELECT LEAST(now(), to_timestamp(?::double precision / 1000000)) AS since) AS w",
                "NOT ready",
                "'infinity'",
            ),
            Dialect::MySql => (
                "{NOW}",
                "{NOW}",
                "LEAST({NOW}, ?)",
                "",
                "ready = 0",
                "9223372036854775807",
            ),
            Dialect::Sqlite => (
                "{NOW}",
                "{NOW}",
                "MIN({NOW}, ?)",
                "",
                "ready = 0",
                "9223372036854775807",
            ),
        };
        let ready = match dialect {
            Dialect::Postgres => "true",
            Dialect::MySql | Dialect::Sqlite => "1",
        };
        let wake = WAKE
            .replace("{READY}", ready)
            .replace("{JOB_AVAILABLE}", job_available)
            .replace("{JOB_SINCE}", job_since)
            .replace("{SINCE_FROM}", since_from)
            .replace("{JOB_NOW}", job_now)
            .replace("{NOT_READY}", not_ready)
            .replace("{JOB_PARKED}", job_parked);
        LimitStatements {
            ensure: s(ENSURE),
            lock: match dialect {
                // The clock is read above the locking scan: a read beside the lock would
                // be evaluated before a wait for it, and a refill from a clock that
                // waited behind a long transaction runs ahead of its rate.
                Dialect::Postgres => s(PG_LOCK),
                Dialect::MySql | Dialect::Sqlite => s(LOCK),
            },
            expire: s(EXPIRE),
            mine: s(MINE),
            running: s(RUNNING),
            hold: s(HOLD),
            unhold: s(UNHOLD),
            save: s(SAVE),
            extend: s(EXTEND),
            release: s(RELEASE),
            usage: s(USAGE),
            lease_keys: s(LEASE_KEYS),
            wait: s(WAIT),
            waiters: s(WAITERS),
            unwait: s(UNWAIT),
            waiting_keys: s(WAITING_KEYS),
            wake: s(&wake),
        }
    }

    /// Each statement through `f` (a backend's table specialisation).
    pub fn map(self, f: impl Fn(&str) -> String) -> Self {
        LimitStatements {
            ensure: f(&self.ensure),
            lock: f(&self.lock),
            expire: f(&self.expire),
            mine: f(&self.mine),
            running: f(&self.running),
            hold: f(&self.hold),
            unhold: f(&self.unhold),
            save: f(&self.save),
            extend: f(&self.extend),
            release: f(&self.release),
            usage: f(&self.usage),
            lease_keys: f(&self.lease_keys),
            wait: f(&self.wait),
            waiters: f(&self.waiters),
            unwait: f(&self.unwait),
            waiting_keys: f(&self.waiting_keys),
            wake: f(&self.wake),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_per_dialect() {
        let pg = LimitStatements::new(Dialect::Postgres);
        assert!(
            pg.running.contains("AND NOT (id = $4 AND token = $5)"),
            "{}",
            pg.running
        );
        assert!(pg.lock.contains("FOR UPDATE)"), "{}", pg.lock);
        assert!(pg
            .lock
            .contains("clock_timestamp()) * 1000000)::bigint, concurrency FROM l"));
        let my = LimitStatements::new(Dialect::MySql);
        assert!(my
            .ensure
            .starts_with("INSERT IGNORE INTO `switchyard_jobs_limits`"));
        assert!(my.hold.contains("ON DUPLICATE KEY UPDATE"));
        let lite = LimitStatements::new(Dialect::Sqlite);
        assert!(!lite.lock.contains("FOR UPDATE"));
        assert!(lite.extend.contains("{NOW}"));
    }
}
