use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use queue_core::sql::{
    attempts_u32, fenced, lossy, micros, micros_between, pair_report, replay_refused, reserve_rows,
    row_seq, sql_capabilities, time_from_micros, ClaimedRow, PromotePacer, RowClaims, StartMode,
    Wakers,
};
use queue_core::{
    reason, text, AckReport, Capabilities, Claim, ConfigError, DeadLetter, DeadLetters,
    DeadSelection, Envelope, Error, GiveBack, Identifier, LeaseToken, QueueName, QueueStats,
    Reservation, Result, Transport,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous as SqlxSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};
use tokio::sync::{Mutex, Notify};

use crate::error::{SqlxResultExt, TRANSPORT};
use crate::migrate::{check_existing, migrate};
use crate::options::{SqliteOptions, SqliteSynchronous};
use crate::sql::Statements;
use crate::status::SqliteStatusStore;

/// Rows per multi-row INSERT: 11 parameters each, well under SQLite's 32,766.
const INSERT_CHUNK: usize = 500;
/// How often a transport moves expired messages to the dead-letter store.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A [`Transport`] over one SQLite database file.
///
/// All writes of one transport go through one connection, so a process never fights
/// itself for SQLite's write lock; other processes wait on it through the busy timeout.
/// Reads (stats, dead-letter listing, optimistic candidates) use a small separate pool.
pub struct SqliteTransport {
    writer: SqlitePool,
    reader: SqlitePool,
    sql: Arc<Statements>,
    options: SqliteOptions,
    last_sweep: Mutex<Option<Instant>>,
    pacer: PromotePacer,
    /// Wakes this process's idle workers of a queue when this transport publishes to it.
    wakers: Wakers,
    status: Arc<SqliteStatusStore>,
}

impl fmt::Debug for SqliteTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteTransport")
            .field("url", &self.options.url)
            .field("table", &self.options.table)
            .field("claim", &self.options.claim)
            .finish_non_exhaustive()
    }
}

/// Reads a claimed row as bytes and integers, so that no stored value can fail the claim.
fn claimed_row(row: &SqliteRow) -> std::result::Result<ClaimedRow, sqlx::Error> {
    Ok(ClaimedRow {
        seq: row.try_get(0)?,
        id: lossy(row.try_get(1)?),
        priority: row.try_get::<Option<i64>, _>(2)?.unwrap_or(0),
        attempts: row.try_get::<Option<i64>, _>(3)?.unwrap_or(0),
        available_at: row.try_get::<Option<i64>, _>(4)?.unwrap_or(0),
        last_error: row.try_get::<Option<Vec<u8>>, _>(5)?.map(lossy),
        envelope: row.try_get::<Option<Vec<u8>>, _>(6)?.unwrap_or_default(),
        started: row.try_get::<Option<bool>, _>(7)?.unwrap_or(false),
    })
}

impl SqliteTransport {
    /// Validates the options, opens (creating when missing) the database in WAL mode and
    /// applies the schema. Configuration errors are raised before anything is opened.
    pub async fn connect(options: SqliteOptions) -> Result<Self> {
        let table = Identifier::table("QUEUE_TABLE (table)", options.table.clone())?;
        if let Some(schema) = &options.schema {
            return Err(ConfigError::new(
                "QUEUE_SCHEMA",
                Some(schema.clone()),
                "SQLite has no schemas: unset QUEUE_SCHEMA and isolate tenants with QUEUE_TABLE or a separate database file",
            )
            .into());
        }
        if options.visibility_timeout < Duration::from_millis(100) {
            return Err(ConfigError::new(
                "QUEUE_VISIBILITY_TIMEOUT",
                Some(format!("{:?}", options.visibility_timeout)),
                "expected a lease of at least 100ms",
            )
            .into());
        }
        let url = options.url.expose();
        if options.url.scheme() != "sqlite" {
            return Err(ConfigError::new(
                "DATABASE_URL",
                Some(options.url.to_string()),
                "expected sqlite://PATH or sqlite::memory: for the SQLite transport",
            )
            .into());
        }
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| {
                ConfigError::new(
                    "DATABASE_URL",
                    Some(options.url.to_string()),
                    format!("expected sqlite://PATH ({e})"),
                )
            })?
            .create_if_missing(options.create_if_missing)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(options.busy_timeout)
            .synchronous(match options.synchronous {
                SqliteSynchronous::Full => SqlxSynchronous::Full,
                SqliteSynchronous::Normal => SqlxSynchronous::Normal,
            });
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        if !options.create_if_missing && !in_memory && !connect.get_filename().exists() {
            return Err(ConfigError::new(
                "DATABASE_URL",
                Some(options.url.to_string()),
                "an existing database file: this one does not exist (run `switchyard migrate` to create it, or check the path)",
            )
            .into());
        }
        let writer = SqlitePoolOptions::new()
            .min_connections(1)
            .max_connections(1)
            .acquire_timeout(options.busy_timeout + Duration::from_secs(30))
            .connect_with(connect.clone())
            .await
            .backend()?;
        // Read-only tools open without creating: a mistyped table is an error, not a new
        // empty table.
        if options.create_if_missing || in_memory {
            migrate(&writer, table.as_str()).await?;
        } else {
            check_existing(&writer, table.as_str()).await?;
        }
        // An in-memory database exists once per connection: everything shares the writer.
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(connect)
                .await
                .backend()?
        };
        tracing::debug!(url = %options.url, table = %table, claim = %options.claim, "sqlite transport ready");
        Ok(SqliteTransport {
            status: Arc::new(SqliteStatusStore::new(
                writer.clone(),
                reader.clone(),
                table.as_str(),
            )),
            writer,
            reader,
            sql: Arc::new(Statements::new(table.as_str())),
            options,
            last_sweep: Mutex::new(None),
            pacer: PromotePacer::default(),
            wakers: Wakers::default(),
        })
    }

    /// Claims up to `max` messages, marking started as `start` says.
    async fn reserve_inner(&self, queue: &QueueName, claim: Claim) -> Result<Vec<Reservation>> {
        if claim.max == 0 {
            return Ok(Vec::new());
        }
        if let Err(err) = self.sweep_expired().await {
            tracing::warn!(error = %err, "moving expired messages to the dead-letter store failed; retrying later");
        }
        reserve_rows(self, queue, claim, self.options.visibility_timeout).await
    }

    /// Runs a batch statement over `[id, token]` pairs (and an optional second
    /// parameter) that returns the ids it touched; the others lost their lease.
    async fn by_pairs(
        &self,
        sql: &str,
        reservations: &[Reservation],
        second: Option<i64>,
    ) -> Result<AckReport> {
        if reservations.is_empty() {
            return Ok(AckReport::default());
        }
        let pairs: Vec<[String; 2]> = reservations
            .iter()
            .map(|r| [r.id().to_string(), r.token().to_string()])
            .collect();
        let pairs =
            serde_json::to_string(&pairs).map_err(|e| Error::backend(TRANSPORT, false, e))?;
        let mut query = sqlx::query_as(sql).bind(pairs);
        if let Some(second) = second {
            query = query.bind(second);
        }
        // Matched on (seq, token): a batch may hold a stale copy of a message beside the
        // current one.
        let touched: Vec<(String, String)> = query.fetch_all(&self.writer).await.backend()?;
        // A token this transport wrote always parses; anything else matches nothing.
        let touched: std::collections::HashSet<(String, uuid::Uuid)> = touched
            .into_iter()
            .filter_map(|(id, token)| Some((id, uuid::Uuid::parse_str(&token).ok()?)))
            .collect();
        Ok(pair_report(reservations, &touched))
    }

    /// Runs a statement fenced by the reservation's token: `LeaseLost` when it touched
    /// nothing.
    async fn on_lease<'q>(
        &self,
        query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        reservation: &Reservation,
    ) -> Result<()> {
        let done = query.execute(&self.writer).await.backend()?.rows_affected();
        fenced(done == 1, reservation)
    }

    /// The options this transport runs with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// The pool of the write connection, for publishing inside the caller's own
    /// transaction on the same database.
    pub fn pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// Closes both pools.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    async fn now(&self) -> Result<i64> {
        sqlx::query_scalar(&self.sql.select_now)
            .fetch_one(&self.writer)
            .await
            .backend()
    }

    /// Moves unleased expired rows to the dead-letter store, at most once per second.
    async fn sweep_expired(&self) -> Result<()> {
        {
            let mut last = self.last_sweep.lock().await;
            if last.is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let cutoff: i64 = sqlx::query_scalar(&self.sql.select_now)
            .fetch_one(&mut *tx)
            .await
            .backend()?;
        let copied = sqlx::query(&self.sql.copy_expired)
            .bind(cutoff)
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        if copied > 0 {
            sqlx::query(&self.sql.delete_expired)
                .bind(cutoff)
                .execute(&mut *tx)
                .await
                .backend()?;
            tracing::info!(
                count = copied,
                "expired messages moved to the dead-letter store"
            );
        }
        tx.commit().await.backend()
    }

    /// Moves waiting rows whose time has come (due delays, lapsed leases) into the claim
    /// index, returning how many. Checks on the reader first, so an idle poll takes no
    /// write lock.
    async fn promote_due(&self) -> Result<u64> {
        self.pacer.mark();
        let any: bool = sqlx::query_scalar(&self.sql.any_due)
            .fetch_one(&self.reader)
            .await
            .backend()?;
        if !any {
            return Ok(0);
        }
        Ok(sqlx::query(&self.sql.promote_due)
            .execute(&self.writer)
            .await
            .backend()?
            .rows_affected())
    }

    async fn claim_ready(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
    ) -> Result<Vec<ClaimedRow>> {
        let lease = micros(self.options.visibility_timeout);
        let token = token.to_string();
        if start == StartMode::Move {
            let rows = sqlx::query(&self.sql.claim_for_move)
                .bind(&token)
                .bind(lease)
                .bind(queue.as_str())
                .bind(i64::try_from(max).unwrap_or(i64::MAX))
                .fetch_all(&self.writer)
                .await
                .backend()?;
            return rows
                .iter()
                .map(claimed_row)
                .collect::<Result<_, _>>()
                .backend();
        }
        match self.options.claim {
            queue_core::ClaimStrategy::SkipLocked => {
                let rows = sqlx::query(&self.sql.claim_skip_locked)
                    .bind(&token)
                    .bind(lease)
                    .bind(queue.as_str())
                    .bind(i64::try_from(max).unwrap_or(i64::MAX))
                    .bind(start as i64)
                    .fetch_all(&self.writer)
                    .await
                    .backend()?;
                rows.iter()
                    .map(claimed_row)
                    .collect::<Result<_, _>>()
                    .backend()
            }
            queue_core::ClaimStrategy::Optimistic => {
                self.claim_optimistic(queue, max, &token, lease, start)
                    .await
            }
        }
    }

    /// Reads eight times as many candidates as wanted without any lock, then claims up to `max`
    /// of those that are still ready with one compare-and-set. When competitors took
    /// some in between, fresh candidates are read (a few times at most), so a reserve
    /// does not come back short while rows are ready.
    async fn claim_optimistic(
        &self,
        queue: &QueueName,
        max: usize,
        token: &str,
        lease: i64,
        start: StartMode,
    ) -> Result<Vec<ClaimedRow>> {
        let mut claimed = Vec::new();
        for _ in 0..4 {
            let want = max - claimed.len();
            // A wide window lets competitors that read the same candidates each find
            // rows still free; the claim itself still takes the oldest ones.
            let window = want.saturating_mul(8).clamp(64, 4096);
            let round = async {
                let candidates: Vec<i64> = sqlx::query_scalar(&self.sql.claim_candidates)
                    .bind(queue.as_str())
                    .bind(i64::try_from(window).unwrap_or(i64::MAX))
                    .fetch_all(&self.reader)
                    .await
                    .backend()?;
                let list = serde_json::to_string(&candidates)
                    .map_err(|e| Error::backend(TRANSPORT, false, e))?;
                let rows = sqlx::query(&self.sql.claim_optimistic)
                    .bind(token)
                    .bind(lease)
                    .bind(list)
                    .bind(queue.as_str())
                    .bind(i64::try_from(want).unwrap_or(i64::MAX))
                    .bind(start as i64)
                    .fetch_all(&self.writer)
                    .await
                    .backend()?;
                let rows = rows
                    .iter()
                    .map(claimed_row)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .backend()?;
                Ok::<_, Error>((rows, candidates.len()))
            };
            match round.await {
                Ok((rows, candidates)) => {
                    claimed.extend(rows);
                    // Done when we got what we asked for, or the queue had no more.
                    if claimed.len() >= max || candidates < window {
                        break;
                    }
                }
                Err(err) if claimed.is_empty() => return Err(err),
                // Rows of earlier rounds are committed: return them, never drop them.
                Err(err) => {
                    tracing::warn!(error = %err, "a later claim round failed; returning what was claimed");
                    break;
                }
            }
        }
        Ok(claimed)
    }

    /// Moves the row `seq` that this transport holds under `token` to the dead-letter
    /// store, byte for byte, in one transaction. `false` when the lease is gone.
    async fn move_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
    ) -> Result<bool> {
        let token = token.to_string();
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let copied = sqlx::query(&self.sql.copy_leased_to_dead)
            .bind(seq)
            .bind(&token)
            .bind(text::reason_text(reason))
            .bind(error.map(text::error_text))
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        if copied == 0 {
            tx.rollback().await.backend()?;
            return Ok(false);
        }
        sqlx::query(&self.sql.delete_leased)
            .bind(seq)
            .bind(&token)
            .execute(&mut *tx)
            .await
            .backend()?;
        tx.commit().await.backend()?;
        Ok(true)
    }

    async fn insert_envelopes(
        &self,
        conn: &mut sqlx::SqliteConnection,
        rows: &[(Envelope, String)],
    ) -> Result<()> {
        let local_now = Utc::now();
        for chunk in rows.chunks(INSERT_CHUNK) {
            let mut qb: QueryBuilder<'_, Sqlite> = QueryBuilder::new(&self.sql.insert_jobs_head);
            qb.push_values(chunk, |mut b, (env, json)| {
                // Delay and expiry become offsets from the publisher's clock, applied to
                // SQLite's: the publisher's clock skew cannot shift them, and a due
                // time carried over from another backend keeps its place.
                let due = micros_between(local_now, env.available_at).max(0);
                let expires = env.expires_at.map(|t| micros_between(local_now, t));
                b.push_bind(env.id.to_string())
                    .push_bind(env.queue.as_str())
                    // The same columns as on the server backends, which cannot store
                    // every text; the envelope JSON keeps every field as published.
                    .push_bind(text::kind_column(&env.kind))
                    .push_bind(i64::from(env.priority))
                    .push_bind(i64::from(env.attempts))
                    .push_bind(i64::from(due == 0));
                for offset in [Some(due), Some(due), expires] {
                    b.push(&self.sql.now)
                        .push_unseparated(" + ")
                        .push_bind_unseparated(offset);
                }
                b.push_bind(env.last_error.as_deref().map(text::error_text))
                    .push(&self.sql.now)
                    .push_bind(json.as_str());
            });
            qb.push(&self.sql.insert_jobs_tail);
            qb.build().execute(&mut *conn).await.backend()?;
        }
        Ok(())
    }
}

#[async_trait]
impl RowClaims for SqliteTransport {
    async fn claim_ready(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
    ) -> Result<Vec<ClaimedRow>> {
        self.claim_ready(queue, max, token, start).await
    }

    async fn promote_due(&self) -> Result<u64> {
        self.promote_due().await
    }

    fn promote_pacer(&self) -> &PromotePacer {
        &self.pacer
    }

    async fn quarantine_row(&self, seq: i64, token: LeaseToken, why: &str) -> Result<bool> {
        self.move_to_dead(seq, token, reason::MALFORMED, Some(why))
            .await
    }
}

#[async_trait]
impl Transport for SqliteTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn capabilities(&self) -> Capabilities {
        sql_capabilities(self.options.max_payload_bytes)
    }

    fn wake_signal(&self, queue: &QueueName) -> Option<Arc<Notify>> {
        Some(self.wakers.get(queue.as_str()))
    }

    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<()> {
        if envelopes.is_empty() {
            return Ok(());
        }
        // Validate everything before storing anything.
        let mut rows = Vec::with_capacity(envelopes.len());
        for env in envelopes {
            let json = env.to_json();
            if json.len() > self.options.max_payload_bytes {
                env.check_size(self.options.max_payload_bytes)?;
            }
            rows.push((env, json));
        }
        if rows.len() <= INSERT_CHUNK {
            // One statement is atomic on its own: no explicit transaction needed.
            let mut conn = self.writer.acquire().await.backend()?;
            self.insert_envelopes(&mut conn, &rows).await?;
        } else {
            let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
            self.insert_envelopes(&mut tx, &rows).await?;
            tx.commit().await.backend()?;
        }
        tracing::debug!(count = rows.len(), "published");
        self.wakers
            .wake_each(rows.iter().map(|(env, _)| env.queue.as_str()));
        Ok(())
    }

    async fn claim(&self, queue: &QueueName, claim: Claim) -> Result<Vec<Reservation>> {
        self.reserve_inner(queue, claim).await
    }

    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        self.by_pairs(&self.sql.ack_batch, reservations, None).await
    }

    async fn give_back(&self, reservation: &Reservation, how: GiveBack<'_>) -> Result<()> {
        match how {
            GiveBack::Retry { delay, error } => {
                let query = sqlx::query(&self.sql.release)
                    .bind(micros(delay))
                    .bind(error.map(text::error_text))
                    .bind(reservation.id().to_string())
                    .bind(reservation.token().to_string());
                self.on_lease(query, reservation).await
            }
            GiveBack::Unstarted => {
                let query = sqlx::query(&self.sql.abandon)
                    .bind(reservation.id().to_string())
                    .bind(reservation.token().to_string());
                self.on_lease(query, reservation).await
            }
        }
    }

    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        let lease = micros(self.options.visibility_timeout);
        self.by_pairs(&self.sql.start_batch, reservations, Some(lease))
            .await
    }

    async fn dead_letter(
        &self,
        reservation: &Reservation,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()> {
        // The receipt's tag is the row's seq; a replayed message gets a new row.
        let seq = row_seq(reservation);
        let moved = self
            .move_to_dead(seq, reservation.token(), reason, error)
            .await?;
        if moved {
            tracing::info!(message_id = %reservation.id(), reason, "dead-lettered");
        }
        fenced(moved, reservation)
    }

    async fn extend(&self, reservation: &Reservation, lease: Duration) -> Result<()> {
        let query = sqlx::query(&self.sql.extend)
            .bind(micros(lease))
            .bind(reservation.id().to_string())
            .bind(reservation.token().to_string());
        self.on_lease(query, reservation).await
    }

    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>> {
        let now = self.now().await?;
        let q = queue.map(QueueName::as_str);
        let mut by_queue: HashMap<String, QueueStats> = HashMap::new();
        let rows = sqlx::query(&self.sql.stats_jobs)
            .bind(q)
            .bind(now)
            .fetch_all(&self.reader)
            .await
            .backend()?;
        for row in rows {
            let name = lossy(row.try_get(0).backend()?);
            let count = |i: usize| -> Result<u64> {
                let n: Option<i64> = row.try_get(i).backend()?;
                Ok(u64::try_from(n.unwrap_or(0)).unwrap_or(0))
            };
            let oldest: Option<i64> = row.try_get(4).backend()?;
            let s = by_queue
                .entry(name.clone())
                .or_insert_with(|| QueueStats::new(name));
            s.ready = count(1)?;
            s.delayed = count(2)?;
            s.reserved = count(3)?;
            s.oldest_ready_age = oldest
                .map(|t| Duration::from_micros(u64::try_from(now.saturating_sub(t)).unwrap_or(0)));
        }
        let rows = sqlx::query(&self.sql.stats_dead)
            .bind(q)
            .fetch_all(&self.reader)
            .await
            .backend()?;
        for row in rows {
            let name = lossy(row.try_get(0).backend()?);
            let n: i64 = row.try_get(1).backend()?;
            by_queue
                .entry(name.clone())
                .or_insert_with(|| QueueStats::new(name))
                .dead = u64::try_from(n).unwrap_or(0);
        }
        let mut out: Vec<QueueStats> = by_queue.into_values().collect();
        out.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(out)
    }
}

#[async_trait]
impl DeadLetters for SqliteTransport {
    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(&self.sql.list_dead)
            .bind(queue.map(QueueName::as_str))
            .bind(queue_core::sql::limit(limit))
            .fetch_all(&self.reader)
            .await
            .backend()?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let text = |i: usize| -> Result<String> {
                Ok(lossy(
                    row.try_get::<Option<Vec<u8>>, _>(i)
                        .backend()?
                        .unwrap_or_default(),
                ))
            };
            let mut d = DeadLetter::new(
                text(0)?,
                text(1)?,
                text(4)?,
                time_from_micros(row.try_get::<Option<i64>, _>(6).backend()?.unwrap_or(0)),
            );
            d.kind = text(2)?;
            d.attempts = attempts_u32(row.try_get::<Option<i64>, _>(3).backend()?.unwrap_or(0));
            d.last_error = row.try_get::<Option<Vec<u8>>, _>(5).backend()?.map(lossy);
            let body = text(7)?;
            match Envelope::from_json(&body) {
                Ok(mut env) => {
                    env.attempts = d.attempts;
                    env.last_error.clone_from(&d.last_error);
                    d.envelope = Some(env);
                }
                Err(_) => d.raw = Some(body),
            }
            out.push(d);
        }
        Ok(out)
    }

    async fn dead_replay(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let (id, before) = self.selection(&mut tx, selection).await?;
        let max_seq: i64 = sqlx::query_scalar(&self.sql.max_seq)
            .fetch_one(&mut *tx)
            .await
            .backend()?;
        let q = queue.map(QueueName::as_str);
        sqlx::query(&self.sql.replay_dead)
            .bind(q)
            .bind(id.as_deref())
            .bind(before)
            .execute(&mut *tx)
            .await
            .backend()?;
        let moved = sqlx::query(&self.sql.delete_replayed)
            .bind(q)
            .bind(id.as_deref())
            .bind(before)
            .bind(max_seq)
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        tx.commit().await.backend()?;
        if moved == 0 {
            if let DeadSelection::Id(id) = selection {
                let exists: bool = sqlx::query_scalar(&self.sql.dead_exists)
                    .bind(id)
                    .fetch_one(&self.reader)
                    .await
                    .backend()?;
                return Err(replay_refused(id, exists));
            }
        }
        if moved > 0 {
            self.wakers.wake_all();
        }
        tracing::info!(count = moved, "dead letters replayed");
        Ok(moved)
    }

    async fn dead_purge(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let (id, before) = self.selection(&mut tx, selection).await?;
        let purged = sqlx::query(&self.sql.purge_dead)
            .bind(queue.map(QueueName::as_str))
            .bind(id.as_deref())
            .bind(before)
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        tx.commit().await.backend()?;
        if purged == 0 {
            if let DeadSelection::Id(id) = selection {
                return Err(Error::NotFound {
                    what: "dead letter",
                    id: id.clone(),
                });
            }
        }
        Ok(purged)
    }

    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        for letter in letters {
            let (text, priority, expires_at) = queue_core::sql::dead_row(letter);
            sqlx::query(&self.sql.insert_dead)
                .bind(&letter.id)
                .bind(&letter.queue)
                .bind(queue_core::text::kind_column(&letter.kind))
                .bind(i64::from(priority))
                .bind(i64::from(letter.attempts))
                .bind(expires_at.map(|t| t.timestamp_micros()))
                .bind(queue_core::text::reason_text(&letter.reason))
                .bind(
                    letter
                        .last_error
                        .as_deref()
                        .map(queue_core::text::error_text),
                )
                .bind(letter.dead_at.timestamp_micros())
                .bind(text)
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        tx.commit().await.backend()?;
        Ok(letters.len() as u64)
    }
}

impl SqliteTransport {
    /// The store of job status and results beside this transport's messages.
    pub fn status_store(&self) -> Arc<dyn queue_core::status::StatusStore> {
        self.status.clone()
    }
}

impl SqliteTransport {
    /// The id and the dead-before cutoff (database clock) of a selection.
    async fn selection(
        &self,
        conn: &mut sqlx::SqliteConnection,
        selection: &DeadSelection,
    ) -> Result<(Option<String>, Option<i64>)> {
        Ok(match selection {
            DeadSelection::Id(id) => (Some(id.clone()), None),
            DeadSelection::All => (None, None),
            DeadSelection::OlderThan(age) => {
                let now: i64 = sqlx::query_scalar(&self.sql.select_now)
                    .fetch_one(&mut *conn)
                    .await
                    .backend()?;
                (None, Some(now - micros(*age)))
            }
            _ => {
                return Err(Error::InvalidInput(format!(
                    "unsupported dead-letter selection {selection:?}"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::*;

    /// The claim must stay an index walk in delivery order: no table scan, no sort.
    #[tokio::test]
    async fn claim_walks_the_claim_index_without_sorting() {
        let t = SqliteTransport::connect(SqliteOptions::new("sqlite::memory:"))
            .await
            .expect("connect");
        for (name, sql) in [
            ("skip-locked", &t.sql.claim_skip_locked),
            ("candidates", &t.sql.claim_candidates),
        ] {
            let explain = format!("EXPLAIN QUERY PLAN {sql}");
            let mut q = sqlx::query(&explain);
            q = match name {
                "skip-locked" => q.bind("token").bind(1_i64).bind("q").bind(16_i64),
                _ => q.bind("q").bind(16_i64),
            };
            let plan: Vec<String> = q
                .fetch_all(&t.writer)
                .await
                .expect("explain")
                .iter()
                .map(|r| r.get::<String, _>(3))
                .collect();
            let text = plan.join("\n");
            assert!(
                text.contains("USING INDEX switchyard_jobs_claim (queue=?)"),
                "{name}:\n{text}"
            );
            assert!(!text.contains("TEMP B-TREE"), "{name} sorts:\n{text}");
            assert!(
                !text.contains("SCAN switchyard_jobs"),
                "{name} scans:\n{text}"
            );
        }
    }
}
