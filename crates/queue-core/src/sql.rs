//! Building blocks that the SQL transports share: the claim-and-quarantine loop, the
//! decoding of a claimed row, time conversions and fencing. For transport crates; not
//! semver-stable.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::capabilities::Capabilities;
use crate::dead_letters::{DeadLetter, DeadSelection};
use crate::envelope::Envelope;
use crate::error::ConfigError;
use crate::error::{Error, Result};
use crate::names::Identifier;
use crate::names::QueueName;
use crate::redact::{unsupported_secret_param, SecretUrl};
use crate::reservation::{AckReport, LeaseToken, Receipt, Reservation};
use crate::transport::{Claim, Scope, Start};

/// How many rounds one reserve spends skipping malformed rows before it returns.
const QUARANTINE_ROUNDS: usize = 16;

/// Which claimed messages a claim marks started (the mode parameter of the claim SQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartMode {
    /// None: claimed ahead of use (a prefetch).
    None = 0,
    /// All (a plain reserve).
    All = 1,
    /// Those that come with no attempts (a fast worker's prefetch).
    Fresh = 2,
    /// None, and the claim takes any row no worker holds, due or not (a move to another
    /// backend, [`Scope::Any`]).
    Move = 3,
}

impl StartMode {
    /// The mode of `claim`.
    pub fn of(claim: Claim) -> Self {
        match (claim.scope, claim.start) {
            (Scope::Any, _) => StartMode::Move,
            (Scope::Due, Start::All) => StartMode::All,
            (Scope::Due, Start::None) => StartMode::None,
            (Scope::Due, Start::Fresh) => StartMode::Fresh,
        }
    }
}

/// A claimed row, read as plainly as possible so that no stored value can fail a claim.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    /// The row number (publish order).
    pub seq: i64,
    /// The id column.
    pub id: String,
    /// The priority column.
    pub priority: i64,
    /// The attempts column, after the claim.
    pub attempts: i64,
    /// The due time, in microseconds since the epoch.
    pub available_at: i64,
    /// The last error column.
    pub last_error: Option<String>,
    /// The stored envelope text.
    pub envelope: Vec<u8>,
    /// Whether the claim marked the message started.
    pub started: bool,
}

impl ClaimedRow {
    /// The envelope, with the row's delivery state laid over it, or why the row is
    /// malformed.
    pub fn decode(&self) -> std::result::Result<Envelope, String> {
        let text = std::str::from_utf8(&self.envelope)
            .map_err(|e| format!("cannot decode envelope: not UTF-8 text ({e})"))?;
        let mut env = Envelope::from_json(text).map_err(|e| e.to_string())?;
        if env.id.to_string() != self.id {
            return Err(format!(
                "the envelope's id {} does not match the row's id {}",
                env.id, self.id
            ));
        }
        // The columns carry the delivery state; the JSON carries the message as published.
        env.attempts = attempts_u32(self.attempts);
        env.available_at = time_from_micros(self.available_at);
        env.last_error.clone_from(&self.last_error);
        Ok(env)
    }
}

/// Connections a transport keeps out of its pool between hot-path statements (claims,
/// acks, publishes). sqlx's pool pings every connection it gets back: one more round
/// trip and two wake-ups per statement, which cost a busy drain about a third of its
/// throughput. A connection whose statement failed must not be kept: it goes back to the
/// pool, whose ping finds out whether it is broken. A connection kept unused for a while
/// goes back too, so that the pool's idle and lifetime limits still apply to it.
#[derive(Debug)]
pub struct KeptConnections<C> {
    kept: Mutex<Kept<C>>,
    most: usize,
}

#[derive(Debug)]
struct Kept<C> {
    conns: Vec<(C, Instant)>,
    closed: bool,
}

/// How long a kept connection may sit unused before it goes back to the pool.
const KEPT_IDLE: Duration = Duration::from_secs(5);

impl<C> KeptConnections<C> {
    /// Keeps at most a third of a pool of `pool_size` connections, and never more than
    /// [`KEPT_CONNECTIONS`]: the rest of the pool stays free for everything else
    /// (heartbeats, releases, stats, the caller's own transactions).
    pub fn for_pool(pool_size: u32) -> Self {
        let third = usize::try_from(pool_size / 3).unwrap_or(KEPT_CONNECTIONS);
        KeptConnections {
            kept: Mutex::new(Kept {
                conns: Vec::new(),
                closed: false,
            }),
            most: third.min(KEPT_CONNECTIONS),
        }
    }

    /// A kept connection, if there is one that was used recently.
    pub fn take(&self) -> Option<C> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        // Stale ones are dropped (back to the pool) after the lock is released.
        let stale = kept
            .conns
            .iter()
            .position(|(_, at)| at.elapsed() < KEPT_IDLE)
            .unwrap_or(kept.conns.len());
        let stale: Vec<(C, Instant)> = kept.conns.drain(..stale).collect();
        let conn = kept.conns.pop().map(|(c, _)| c);
        drop(kept);
        drop(stale);
        conn
    }

    /// A kept connection, or else one from `acquire` (the pool's, awaited only then).
    pub async fn take_or<E>(
        &self,
        acquire: impl std::future::Future<Output = std::result::Result<C, E>>,
    ) -> std::result::Result<C, E> {
        match self.take() {
            Some(conn) => Ok(conn),
            None => acquire.await,
        }
    }

    /// Keeps a connection whose statement succeeded; beyond the limit, or once the
    /// transport is closing, it is dropped (back to the pool).
    pub fn keep(&self, conn: C) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if !kept.closed && kept.conns.len() < self.most {
            kept.conns.push((conn, Instant::now()));
        }
    }

    /// Gives every kept connection back and keeps none from now on: the pool waits for
    /// every connection it lent out before it closes.
    pub fn close(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.closed = true;
        let conns = std::mem::take(&mut kept.conns);
        drop(kept);
        drop(conns);
    }
}

/// The most connections a SQL transport keeps for its hot path: enough for a worker's
/// two overlapping claims and its ack flush.
pub const KEPT_CONNECTIONS: usize = 3;

/// Refuses a table whose newest applied schema version (`newest`, from the migration
/// ledger) is beyond the `known` versions of this build: an older build misreads a newer
/// schema, and could for example claim messages that newer workers hold.
pub fn check_schema_version(table: &str, newest: Option<i64>, known: i64) -> Result<()> {
    match newest {
        Some(newest) if newest > known => Err(ConfigError::new(
            "QUEUE_TABLE",
            Some(table.to_owned()),
            format!(
                "a table at schema version {known} or older; this one is at version {newest}, \
                 written by a newer switchyard: upgrade this build (an older one could claim \
                 messages twice)"
            ),
        )
        .into()),
        _ => Ok(()),
    }
}

/// The error of an open that must not create anything (read-only tools) and found part
/// of the store missing: names the setting that points at it (`QUEUE_SCHEMA`), its value,
/// what is accepted, what is missing, and that nothing was created.
pub fn missing_store(setting: &str, value: &str, accepted: &str, missing: &str) -> Error {
    ConfigError::new(
        setting,
        Some(value.to_owned()),
        format!(
            "{accepted}; {missing} (nothing was created): run `switchyard migrate` to create it, or check QUEUE_SCHEMA / QUEUE_TABLE"
        ),
    )
    .into()
}

/// For an open that must not migrate (read-only tools): the table must be at exactly
/// this build's schema version. An older one is refused rather than read, since this
/// build's statements name columns and tables (the status table) that the older schema
/// lacks, and upgrading it is `switchyard migrate`'s job, not a reader's.
pub fn check_existing_version(table: &str, newest: Option<i64>, known: i64) -> Result<()> {
    check_schema_version(table, newest, known)?;
    match newest {
        Some(newest) if newest >= known => Ok(()),
        found => Err(ConfigError::new(
            "QUEUE_TABLE",
            Some(table.to_owned()),
            format!(
                "a table at schema version {known}; this one is at {} (nothing was changed): run `switchyard migrate` to upgrade it",
                found.map_or_else(
                    || "no recorded version".to_owned(),
                    |v| format!("version {v}")
                )
            ),
        )
        .into()),
    }
}

/// How long a promotion of due rows counts as fresh.
const PROMOTE_EVERY: Duration = Duration::from_millis(50);

/// Paces the promotion of due rows (delayed messages, lapsed leases) into the claim
/// order, so that a busy drain does not pay for it on every batch.
#[derive(Debug, Default)]
pub struct PromotePacer(Mutex<Option<Instant>>);

impl PromotePacer {
    fn recent(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < PROMOTE_EVERY)
    }

    /// Notes that a promotion runs now.
    pub fn mark(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
}

/// What a SQL transport provides for [`reserve_rows`].
#[async_trait]
pub trait RowClaims: Send + Sync {
    /// Claims up to `max` ready rows of `queue` under `token`.
    async fn claim_ready(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
    ) -> Result<Vec<ClaimedRow>>;

    /// Moves due waiting rows into the claim order; returns how many. Calls
    /// [`PromotePacer::mark`].
    async fn promote_due(&self) -> Result<u64>;

    /// The transport's pacer for [`promote_due`](RowClaims::promote_due).
    fn promote_pacer(&self) -> &PromotePacer;

    /// Moves the row `seq` held under `token` to the dead-letter store with reason
    /// `malformed`; `false` when the lease is gone.
    async fn quarantine_row(&self, seq: i64, token: LeaseToken, why: &str) -> Result<bool>;
}

/// Claims up to `claim.max` messages under a lease of `lease`: claims rows, decodes
/// them, quarantines the malformed ones (and claims again in their place, a bounded
/// number of times), and returns the reservations in delivery order.
pub async fn reserve_rows(
    claims: &dyn RowClaims,
    queue: &QueueName,
    claim: Claim,
    lease: Duration,
) -> Result<Vec<Reservation>> {
    let (max, start) = (claim.max, StartMode::of(claim));
    let mut out = Vec::with_capacity(max.min(1024));
    for _ in 0..QUARANTINE_ROUNDS {
        if out.len() >= max {
            break;
        }
        let token = LeaseToken::generate();
        let mut rows = match claim_rows(claims, queue, max - out.len(), token, start).await {
            Ok(rows) => rows,
            // What was claimed in an earlier round is returned, never left leased.
            Err(err) if !out.is_empty() => {
                tracing::warn!(error = %err, "a later claim round failed; returning what was claimed");
                break;
            }
            Err(err) => return Err(err),
        };
        if rows.is_empty() {
            break;
        }
        rows.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.available_at, r.seq));
        let mut quarantined = 0;
        for row in rows {
            match row.decode() {
                Ok(envelope) => {
                    let receipt =
                        Receipt::new(envelope.id, token, u64::try_from(row.seq).unwrap_or(0));
                    out.push(Reservation::new(envelope, receipt, lease, row.started));
                }
                Err(why) => {
                    tracing::warn!(queue = %queue, message_id = %row.id, error = %why, "malformed message quarantined");
                    // If the move fails the row stays leased and is quarantined again
                    // when its lease runs out; the good rows are still returned.
                    match claims.quarantine_row(row.seq, token, &why).await {
                        Ok(_) => quarantined += 1,
                        Err(err) => {
                            tracing::warn!(error = %err, "quarantine failed; retrying after the lease")
                        }
                    }
                }
            }
        }
        if quarantined == 0 {
            break;
        }
    }
    Ok(out)
}

/// Claims up to `max` rows. Promotion runs before the claim unless it ran in the last
/// few milliseconds; then it runs only when the claim comes back short, so a busy drain
/// does not pay for it on every batch and an idle queue still sees due rows at once.
async fn claim_rows(
    claims: &dyn RowClaims,
    queue: &QueueName,
    max: usize,
    token: LeaseToken,
    start: StartMode,
) -> Result<Vec<ClaimedRow>> {
    let recent = claims.promote_pacer().recent();
    if !recent {
        claims.promote_due().await?;
    }
    let mut rows = claims.claim_ready(queue, max, token, start).await?;
    if rows.len() < max && recent {
        // The rows already claimed are committed: a failure from here on must not lose
        // them, so it only ends this claim early.
        let more = match claims.promote_due().await {
            Ok(0) => Ok(Vec::new()),
            Ok(_) => {
                claims
                    .claim_ready(queue, max - rows.len(), token, start)
                    .await
            }
            Err(err) => Err(err),
        };
        match more {
            Ok(more) => rows.extend(more),
            Err(err) if rows.is_empty() => return Err(err),
            Err(err) => {
                tracing::warn!(error = %err, "a second claim round failed; returning what was claimed")
            }
        }
    }
    Ok(rows)
}

/// What a SQL dead-letter row holds for a moved dead letter: the stored text (the
/// envelope, or the raw text of a malformed one), the priority and the expiry.
pub fn dead_row(letter: &DeadLetter) -> (String, i16, Option<DateTime<Utc>>) {
    match &letter.envelope {
        Some(env) => (env.to_json(), env.priority, env.expires_at),
        None => (letter.raw.clone().unwrap_or_default(), 0, None),
    }
}

/// The row a SQL transport's reservation came from: its receipt's tag is the row's
/// `seq` ([`reserve_rows`] sets it); -1, which matches no row, if it is out of range.
pub fn row_seq(reservation: &Reservation) -> i64 {
    i64::try_from(reservation.receipt.tag()).unwrap_or(-1)
}

/// Splits a batch into the reservations a statement touched (by id and token) and those
/// whose lease was lost.
pub fn pair_report(reservations: &[Reservation], touched: &HashSet<(String, Uuid)>) -> AckReport {
    let mut report = AckReport::default();
    for r in reservations {
        if touched.contains(&(r.id().to_string(), r.token().0)) {
            report.acked.push(r.id());
        } else {
            report.lost.push(r.id());
        }
    }
    report
}

/// `Ok` when a statement touched the reserved row; [`Error::LeaseLost`] when the lease
/// was gone and nothing changed.
pub fn fenced(touched: bool, reservation: &Reservation) -> Result<()> {
    if touched {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            message_id: reservation.id(),
        })
    }
}

/// The error of a replay of one id that moved nothing: the id is unknown, or a live
/// message has it.
pub fn replay_refused(id: &str, dead_exists: bool) -> Error {
    if dead_exists {
        Error::InvalidInput(format!(
            "dead letter {id} was not replayed: a live message has the same id"
        ))
    } else {
        Error::NotFound {
            what: "dead letter",
            id: id.to_owned(),
        }
    }
}

/// The id of a dead-letter selection, and its age cutoff in microseconds.
pub fn selection_parts(selection: &DeadSelection) -> Result<(Option<String>, Option<i64>)> {
    Ok(match selection {
        DeadSelection::Id(id) => (Some(id.clone()), None),
        DeadSelection::All => (None, None),
        DeadSelection::OlderThan(age) => (None, Some(micros(*age))),
    })
}

/// A duration in whole microseconds, saturating.
pub fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A row count for a `LIMIT` parameter, saturating.
pub fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Microseconds from `from` to `to` (negative when `to` is earlier), saturating.
pub fn micros_between(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    (to - from)
        .num_microseconds()
        .unwrap_or(if to > from { i64::MAX } else { i64::MIN })
}

/// A time from microseconds since the epoch (the earliest time when out of range).
pub fn time_from_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// An attempts column as a count (negative reads as 0).
pub fn attempts_u32(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// The idle workers' wake-up signals of one transport, by queue: a publish of this
/// process wakes them at once (other processes are seen by polling, or `NOTIFY`).
#[derive(Debug, Default)]
pub struct Wakers {
    by_queue: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Wakers {
    /// The signal of `queue`.
    pub fn get(&self, queue: &str) -> Arc<Notify> {
        let mut map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(queue.to_owned()).or_default().clone()
    }

    /// Wakes the workers of `queue`.
    pub fn wake(&self, queue: &str) {
        let map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(queue) {
            n.notify_waiters();
        }
    }

    /// Wakes the workers of these queues (consecutive repeats are skipped).
    pub fn wake_each<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        let map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return;
        }
        let mut last = None;
        for q in queues {
            if last != Some(q) {
                if let Some(n) = map.get(q) {
                    n.notify_waiters();
                }
                last = Some(q);
            }
        }
    }

    /// Wakes every queue's workers.
    pub fn wake_all(&self) {
        let map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        map.values().for_each(|n| n.notify_waiters());
    }
}

pub use crate::text::lossy;

/// What a server-backed SQL transport checks before it connects.
#[derive(Debug, Clone, Copy)]
pub struct StoreSettings<'a> {
    /// The backend's name in errors (`PostgreSQL`).
    pub backend: &'a str,
    /// The URL schemes it accepts.
    pub schemes: &'a [&'a str],
    /// The URL's form, for errors (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`).
    pub url_form: &'a str,
    /// `DATABASE_URL`.
    pub url: &'a SecretUrl,
    /// `QUEUE_TABLE`.
    pub table: &'a str,
    /// `QUEUE_SCHEMA`.
    pub schema: Option<&'a str>,
    /// `QUEUE_VISIBILITY_TIMEOUT`.
    pub lease: Duration,
    /// The pool size.
    pub max_connections: u32,
}

impl StoreSettings<'_> {
    /// Validates the settings, raising configuration errors before any connection is
    /// made: the table and schema names, the lease, the URL's scheme, and no password-like
    /// URL parameter the driver would log. Returns the table and schema names.
    pub fn validate(&self) -> Result<(String, Option<String>)> {
        let table = Identifier::table("QUEUE_TABLE (table)", self.table)?;
        let schema = self
            .schema
            .map(|s| Identifier::new("QUEUE_SCHEMA (schema)", s))
            .transpose()?;
        if self.lease < Duration::from_millis(100) {
            return Err(ConfigError::new(
                "QUEUE_VISIBILITY_TIMEOUT",
                Some(format!("{:?}", self.lease)),
                "expected a lease of at least 100ms",
            )
            .into());
        }
        let url_error = |expected: String| -> Error {
            ConfigError::new("DATABASE_URL", Some(self.url.to_string()), expected).into()
        };
        if !self.schemes.contains(&self.url.scheme().as_str()) {
            return Err(url_error(format!(
                "expected {} for the {} transport",
                self.url_form, self.backend
            )));
        }
        if let Some(param) = unsupported_secret_param(self.url.expose(), &["password"]) {
            return Err(url_error(format!(
                "the {} transport does not support the query parameter `{param}` (the driver would log its value); put the password in the URL's user info",
                self.backend
            )));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::new(
                "max_connections",
                Some("0".into()),
                "expected at least 1 connection",
            )
            .into());
        }
        Ok((
            table.as_str().to_owned(),
            schema.map(|s| s.as_str().to_owned()),
        ))
    }
}

/// What every SQL transport promises: exact FIFO, priorities, exact delays, lease
/// extension, idempotent publish, expiry, table isolation, transactional publish, and
/// crashes that charge only started messages.
pub fn sql_capabilities(max_payload_bytes: usize) -> Capabilities {
    Capabilities {
        exact_fifo: true,
        priorities: true,
        exact_delays: true,
        lease_extension: true,
        lease_expiry: true,
        exact_claims: true,
        idempotent_publish: true,
        expiry: true,
        table_isolation: true,
        transactional_publish: true,
        delayed_stats: true,
        charges_only_started: true,
        wake_signal: true,
        max_payload_bytes,
        ..Capabilities::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_newer_than_the_build_are_refused() {
        assert!(check_schema_version("jobs", None, 2).is_ok());
        assert!(check_schema_version("jobs", Some(2), 2).is_ok());
        let err = check_schema_version("jobs", Some(3), 2)
            .expect_err("a newer schema is refused")
            .to_string();
        assert!(
            err.contains("QUEUE_TABLE") && err.contains("version 3"),
            "{err}"
        );
        assert!(err.contains("upgrade"), "{err}");
    }

    #[test]
    fn read_only_opens_refuse_older_and_unversioned_schemas() {
        assert!(check_existing_version("jobs", Some(3), 3).is_ok());
        for (found, says) in [(Some(2), "version 2"), (None, "no recorded version")] {
            let err = check_existing_version("jobs", found, 3)
                .expect_err("an older schema is refused")
                .to_string();
            assert!(
                err.contains(says) && err.contains("switchyard migrate"),
                "{err}"
            );
            assert!(err.contains("nothing was changed"), "{err}");
        }
        assert!(check_existing_version("jobs", Some(4), 3).is_err());
    }

    #[test]
    fn kept_connections_leave_most_of_a_small_pool_free_and_none_after_close() {
        assert_eq!(KeptConnections::<u8>::for_pool(1).most, 0);
        assert_eq!(KeptConnections::<u8>::for_pool(4).most, 1);
        assert_eq!(KeptConnections::<u8>::for_pool(10).most, KEPT_CONNECTIONS);
        assert_eq!(KeptConnections::<u8>::for_pool(100).most, KEPT_CONNECTIONS);

        let kept = KeptConnections::for_pool(10);
        for c in 1..=5_u8 {
            kept.keep(c);
        }
        // The newest first; beyond the limit, nothing is kept.
        assert_eq!(kept.take(), Some(3));
        kept.keep(9);
        kept.close();
        assert_eq!(kept.take(), None);
        kept.keep(7);
        assert_eq!(kept.take(), None, "nothing is kept once closing");
    }
}
