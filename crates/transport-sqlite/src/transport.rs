use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use queue_core::sql::{
    lossy, micros, micros_between, pair_report, ClaimBy, ClaimedRow, DeadRow, Encoded, EngineState,
    HeldRow, LeaseOp, PairOp, Replayed, SqlBackend, StartMode, StatsRow,
};
use queue_core::{
    text, AckReport, ClaimStrategy, ConfigError, DeadLetter, Envelope, Error, Identifier,
    LeaseToken, QueueName, Reservation, Result,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous as SqlxSynchronous,
};
use sqlx::{Row, Sqlite, SqlitePool};

use crate::error::{SqlxResultExt, TRANSPORT};
use crate::migrate::{check_existing, migrate};
use crate::options::{SqliteOptions, SqliteSynchronous};
use crate::sql::Statements;
use crate::status::SqliteStatusStore;

mod backend;
mod keys;
mod outbox;
mod unique;

/// Rows per multi-row INSERT: 12 parameters each, well under SQLite's 32,766.
const INSERT_CHUNK: usize = 500;

/// A [`Transport`](queue_core::Transport) over one SQLite database file (through the
/// SQL engine of [`queue_core::sql`]).
///
/// All writes of one transport go through one connection, so a process never fights
/// itself for SQLite's write lock; other processes wait on it through the busy timeout.
/// Reads (stats, dead-letter listing, optimistic candidates) use a small separate pool.
pub struct SqliteTransport {
    writer: SqlitePool,
    reader: SqlitePool,
    sql: Arc<Statements>,
    keys: Arc<unique::KeySql>,
    options: SqliteOptions,
    /// Wake-ups of this process's idle workers (another process's publishes are seen
    /// by the watch, `watch.rs`) and the engine's pacing.
    engine: EngineState,
    status: Arc<SqliteStatusStore>,
    /// What the publish watch opens: the file's path (none in memory) and options.
    watched: Option<(std::path::PathBuf, SqliteConnectOptions)>,
    /// Whether the watch runs.
    watching: std::sync::Mutex<bool>,
    /// Stops the watch when the transport is closed or dropped.
    stop: tokio_util::sync::CancellationToken,
    _stop_on_drop: tokio_util::sync::DropGuard,
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
                "SQLite has no schemas: give each tenant its own file with {tenant} in DATABASE_URL's path (sqlite://data/{tenant}.db), or unset QUEUE_SCHEMA",
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
        let watched = (!in_memory).then(|| (connect.get_filename().to_path_buf(), connect.clone()));
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(connect)
                .await
                .backend()?
        };
        let stop = tokio_util::sync::CancellationToken::new();
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
            keys: Arc::new(unique::KeySql::new(table.as_str())),
            options,
            engine: EngineState::default(),
            watched,
            watching: std::sync::Mutex::new(false),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
        })
    }

    /// Starts the publish watch the first time a worker asks for a wake-up signal.
    pub(crate) fn ensure_watching(&self) {
        let (Some(every), Some((path, connect))) = (self.options.watch, &self.watched) else {
            return;
        };
        let mut watching = self.watching.lock().unwrap_or_else(|e| e.into_inner());
        if *watching || self.stop.is_cancelled() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(crate::watch::watch_publishes(
                connect.clone(),
                path.clone(),
                crate::watch::WatchSql {
                    max_seq: self.sql.max_seq.clone(),
                    queues_between: self.sql.queues_between.clone(),
                },
                every,
                self.engine.wakers.clone(),
                self.stop.clone(),
            ));
            *watching = true;
        }
    }

    /// The options this transport runs with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// The pool of the write connection, for publishing inside the caller's own
    /// transaction on the same database ([`publish_tx`](Self::publish_tx)).
    pub fn pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// What optimistic claims have lost to competitors so far.
    pub fn claim_counters(&self) -> queue_core::sql::ClaimCounters {
        self.engine.claims.read()
    }

    /// Closes both pools and stops the publish watch.
    pub async fn close(&self) {
        self.stop.cancel();
        self.writer.close().await;
        self.reader.close().await;
    }

    async fn now(&self) -> Result<i64> {
        sqlx::query_scalar(&self.sql.select_now)
            .fetch_one(&self.writer)
            .await
            .backend()
    }

    /// Moves waiting rows whose time has come (due delays, lapsed leases) into the claim
    /// index, returning how many. Checks on the reader first, so an idle poll takes no
    /// write lock.
    async fn promote(&self) -> Result<u64> {
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

    /// Runs a statement of one claim on the write connection.
    async fn claim_with(
        &self,
        sql: &str,
        queue: &QueueName,
        max: usize,
        token: &str,
        start: Option<StartMode>,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>> {
        let mut query = sqlx::query(sql)
            .bind(token)
            .bind(micros(self.options.visibility_timeout))
            .bind(queue.as_str())
            .bind(queue_core::sql::limit(max));
        if let Some(start) = start {
            query = query.bind(start as i64);
        }
        query = query.bind(by.holder);
        if !by.needles.is_empty() {
            query = query.bind(needles_json(&by.needles)?);
        }
        let rows = query.fetch_all(&self.writer).await.backend()?;
        rows.iter()
            .map(claimed_row)
            .collect::<std::result::Result<_, _>>()
            .backend()
    }

    /// The dead-before cutoff (database clock) of an age.
    async fn cutoff(
        &self,
        conn: &mut sqlx::SqliteConnection,
        age_us: Option<i64>,
    ) -> Result<Option<i64>> {
        let Some(age) = age_us else {
            return Ok(None);
        };
        let now: i64 = sqlx::query_scalar(&self.sql.select_now)
            .fetch_one(&mut *conn)
            .await
            .backend()?;
        Ok(Some(now.saturating_sub(age)))
    }

    /// Moves the row `seq` that this transport holds under `token` to the dead-letter
    /// store, byte for byte, in one transaction. `false` when the lease is gone.
    async fn move_leased_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
        key: Option<(&str, &str)>,
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
        self.hand_on(&mut tx, key.as_slice()).await?;
        tx.commit().await.backend()?;
        Ok(true)
    }

    async fn insert_envelopes(
        &self,
        conn: &mut sqlx::SqliteConnection,
        rows: &[Encoded],
    ) -> Result<()> {
        let local_now = Utc::now();
        for chunk in rows.chunks(INSERT_CHUNK) {
            // The text is made in one go and the values bound to it: sqlx's QueryBuilder,
            // formatting each placeholder as it bound its value, took 270 instructions a
            // value against 150 (callgrind, `docs/benchmarks.md`, 2026-11-28, late).
            let sql = self.sql.insert_jobs(chunk.len());
            let mut query = sqlx::query(&sql);
            for Encoded { env, json, labels } in chunk {
                // Delay and expiry become offsets from the publisher's clock, applied to
                // SQLite's: the publisher's clock skew cannot shift them, and a due
                // time carried over from another backend keeps its place.
                let due = micros_between(local_now, env.available_at).max(0);
                let expires = env.expires_at.map(|t| micros_between(local_now, t));
                query = query
                    .bind(env.id.to_string())
                    .bind(env.queue.as_str())
                    // The same columns as on the server backends, which cannot store
                    // every text; the envelope JSON keeps every field as published.
                    .bind(text::kind_column(&env.kind))
                    .bind(i64::from(env.priority))
                    .bind(i64::from(env.attempts))
                    .bind(i64::from(due == 0))
                    .bind(due)
                    .bind(expires)
                    .bind(env.last_error.as_deref().map(text::error_text))
                    .bind(json.as_str())
                    .bind(labels.as_deref())
                    .bind(env.ordering_key.as_deref());
            }
            query.execute(&mut *conn).await.backend()?;
        }
        Ok(())
    }

    /// The plan SQLite chooses for the claim on `queue` (`EXPLAIN QUERY PLAN`, one line
    /// per step), of messages carrying one of `labels` when there are any, to check that
    /// the claim walks the claim index at any depth.
    pub async fn explain_claim(
        &self,
        queue: &QueueName,
        max: usize,
        labels: &[String],
    ) -> Result<String> {
        let sql = if labels.is_empty() {
            &self.sql.claim_skip_locked
        } else {
            &self.sql.claim_skip_locked_labels
        };
        let explain = format!("EXPLAIN QUERY PLAN {sql}");
        let mut query = sqlx::query(&explain)
            .bind("explain")
            .bind(micros(self.options.visibility_timeout))
            .bind(queue.as_str())
            .bind(queue_core::sql::limit(max))
            .bind(0_i64)
            .bind("explain");
        if !labels.is_empty() {
            query = query.bind(needles_json(&queue_core::labels::needles(labels))?);
        }
        let rows = query.fetch_all(&self.reader).await.backend()?;
        let mut lines = Vec::with_capacity(rows.len());
        for row in rows {
            lines.push(row.try_get::<String, _>(3).backend()?);
        }
        Ok(lines.join("\n"))
    }

    /// The store of job status and results beside this transport's messages.
    pub fn status_store(&self) -> Arc<dyn queue_core::status::StatusStore> {
        self.status.clone()
    }
}

/// A label filter's needles as the JSON array its statements read with `json_each`.
fn needles_json(needles: &[String]) -> Result<String> {
    serde_json::to_string(needles).map_err(|e| Error::backend(TRANSPORT, false, e))
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
