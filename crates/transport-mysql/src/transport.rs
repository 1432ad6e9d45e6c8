use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use queue_core::connect::Endpoint;
use queue_core::sql::{
    limit, lossy, micros, micros_between, pair_report, ClaimBy, ClaimedRow, DeadRow, Encoded,
    EngineState, HeldRow, KeptConnections, LeaseOp, PairOp, Replayed, SqlBackend, StartMode,
    StatsRow, StoreSettings,
};
use queue_core::{
    text, AckReport, ClaimStrategy, ConfigError, DeadLetter, Envelope, LeaseToken, QueueName,
    Reservation, Result,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Executor, MySql, MySqlConnection, MySqlPool, Row};
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use crate::connect;
use crate::cursor::ClaimCursors;
use crate::error::{is_lock_conflict, SqlxResultExt, TRANSPORT};
use crate::migrate::{check_existing, migrate, uninstall};
use crate::options::MySqlOptions;
use crate::server::ServerInfo;
use crate::sql::{label_params, padded, with_list, Statements};
use crate::status::MySqlStatusStore;
use crate::watch::{watch_publishes, WatchSql};

/// Binds the six values of `{DEAD_SELECTION}`: queue, id and dead-before, each twice.
macro_rules! bind_selection {
    ($query:expr, $queue:expr, $id:expr, $before:expr) => {
        $query
            .bind($queue)
            .bind($queue)
            .bind($id)
            .bind($id)
            .bind($before)
            .bind($before)
    };
}

mod backend;
mod claim;
mod keys;
mod outbox;
mod unique;

/// Rows per publish statement: 13 parameters each, well under MySQL's 65,535.
const PUBLISH_CHUNK: usize = 500;
/// The most values one `IN` list carries.
const MAX_LIST: usize = 4_096;

/// A [`Transport`](queue_core::Transport) over a MySQL or MariaDB (InnoDB) table.
///
/// Sessions run at `READ COMMITTED`, so a claim's scan takes no gap locks and never
/// blocks publishers; deadlocks and lock-wait timeouts are retried with a bounded
/// backoff (see [`MySqlTransport::lock_retries`]).
pub struct MySqlTransport {
    pool: MySqlPool,
    sql: Arc<Statements>,
    keys: Arc<unique::KeySql>,
    options: MySqlOptions,
    schema: Option<String>,
    table: String,
    server: ServerInfo,
    /// Wake-ups of this process's idle workers (fed by publishes of this transport and
    /// by the publish watch) and the engine's pacing.
    engine: EngineState,
    /// How the publish watch connects, and whether it runs.
    connect: MySqlConnectOptions,
    watching: Mutex<bool>,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
    lock_retries: AtomicU64,
    /// Connections kept out of the pool for the hot path.
    kept: KeptConnections<PoolConnection<MySql>>,
    /// Where each queue's last full skip-locked claim ended.
    cursors: ClaimCursors,
    status: Arc<MySqlStatusStore>,
}

impl fmt::Debug for MySqlTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlTransport")
            .field("url", &self.options.url)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("claim", &self.options.claim)
            .field("server", &self.server.version)
            .finish_non_exhaustive()
    }
}

fn claimed_row(row: &MySqlRow) -> std::result::Result<ClaimedRow, sqlx::Error> {
    Ok(ClaimedRow {
        seq: row.try_get(0)?,
        // Columns with a binary collation come back as bytes.
        id: lossy(row.try_get(1)?),
        priority: i64::from(row.try_get::<i32, _>(2)?),
        attempts: i64::from(row.try_get::<i32, _>(3)?),
        available_at: row.try_get(4)?,
        last_error: row.try_get::<Option<Vec<u8>>, _>(5)?.map(lossy),
        envelope: row.try_get(6)?,
        started: row.try_get::<i8, _>(7)? != 0,
    })
}

/// Session settings every connection gets: UTC, a strict `sql_mode` without
/// `SIMULTANEOUS_ASSIGNMENT` (the claim relies on left-to-right assignment), and
/// `READ COMMITTED`, so that scans take no gap locks that would block publishers.
const SESSION: [&str; 2] = [
    "SET time_zone = '+00:00', sql_mode = 'STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
];

impl MySqlTransport {
    /// Validates the options, connects, checks what the server can do, and applies the
    /// schema. Configuration errors are raised before any connection is made; a server
    /// without `SKIP LOCKED` refuses `skip-locked` with a configuration error.
    pub async fn connect(options: MySqlOptions) -> Result<Self> {
        let (table, schema) = StoreSettings {
            backend: "MySQL",
            schemes: &["mysql", "mariadb"],
            url_form: "mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
            url: &options.url,
            table: &options.table,
            schema: options.schema.as_deref(),
            lease: options.visibility_timeout,
            max_connections: options.max_connections,
        }
        .validate()?;
        connect::check_tls_settings(&options.url)?;
        let connect = connect::connect_options(&options.url)?;
        let endpoint = Endpoint::from_url("MySQL", options.url.expose(), 3306);
        let first = connect::first_connection(&connect, &endpoint, options.connect_timeout).await?;
        first.close().await.ok();
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .test_before_acquire(false)
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    for statement in SESSION {
                        conn.execute(statement).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect.clone())
            .await
            .backend()?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&pool)
            .await
            .backend()?;
        let server = ServerInfo::parse(&version);
        if options.claim == ClaimStrategy::SkipLocked && !server.skip_locked {
            return Err(ConfigError::new(
                "QUEUE_CLAIM",
                Some("skip-locked".into()),
                format!(
                    "this server ({version}) has no FOR UPDATE SKIP LOCKED (MySQL 8.0.1+ or MariaDB 10.6+ do): use QUEUE_CLAIM=optimistic"
                ),
            )
            .into());
        }
        // Read-only tools open without creating: a mistyped database or table is an
        // error, not a new empty store.
        if options.create {
            migrate(&pool, schema.as_deref(), &table).await?;
        } else {
            check_existing(&pool, schema.as_deref(), &table).await?;
        }
        tracing::debug!(url = %options.url, schema, table, claim = %options.claim, server = version, "mysql transport ready");
        let kept = KeptConnections::for_pool(options.max_connections);
        let stop = CancellationToken::new();
        let keys = Arc::new(unique::KeySql::new(
            schema.as_deref(),
            &table,
            server.skip_locked,
        ));
        Ok(MySqlTransport {
            status: Arc::new(MySqlStatusStore::new(
                pool.clone(),
                schema.as_deref(),
                &table,
                keys.clone(),
            )),
            pool,
            sql: Arc::new(Statements::new(
                schema.as_deref(),
                &table,
                server.skip_locked,
            )),
            keys,
            schema,
            table,
            server,
            options,
            engine: EngineState::default(),
            connect,
            watching: Mutex::new(false),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            lock_retries: AtomicU64::new(0),
            kept,
            cursors: ClaimCursors::default(),
        })
    }

    /// The options this transport runs with.
    pub fn options(&self) -> &MySqlOptions {
        &self.options
    }

    /// The server, as detected at connect time.
    pub fn server(&self) -> &ServerInfo {
        &self.server
    }

    /// The connection pool, for the caller's own queries and transactions.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// How many statements lost a deadlock or a lock wait and were run again, since the
    /// transport was opened.
    pub fn lock_retries(&self) -> u64 {
        self.lock_retries.load(Ordering::Relaxed)
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.stop.cancel();
        self.kept.close();
        self.pool.close().await;
    }

    /// Drops this transport's tables (jobs, dead letters, status and every other table
    /// its migrations made), messages and all.
    pub async fn drop_store(&self) -> Result<()> {
        uninstall(&self.pool, self.schema.as_deref(), &self.table).await
    }

    /// The plan the server chooses for the locking read of a claim on `queue`, of
    /// messages carrying one of `labels` when there are any: one line per table, `table
    /// access key rows extra`, to check that the claim walks the claim index at any depth.
    pub async fn explain_claim(
        &self,
        queue: &QueueName,
        max: usize,
        labels: &[String],
    ) -> Result<String> {
        let needles = queue_core::labels::needles(labels);
        let sql = if labels.is_empty() {
            format!("EXPLAIN {}", self.sql.claim_lock)
        } else {
            format!("EXPLAIN {}", self.sql.claim_lock_labels)
        };
        let mut query = sqlx::query(&sql).bind(queue.as_str());
        if !labels.is_empty() {
            for needle in label_params(&needles) {
                query = query.bind(needle);
            }
        }
        let rows = query
            .bind(limit(max))
            .fetch_all(&self.pool)
            .await
            .backend()?;
        let mut lines = Vec::with_capacity(rows.len());
        for row in rows {
            let text = |name: &str| -> String {
                row.try_get::<Option<String>, _>(name)
                    .ok()
                    .flatten()
                    .unwrap_or_default()
            };
            // An estimate, unsigned on MariaDB and signed on MySQL.
            let rows = row
                .try_get::<Option<u64>, _>("rows")
                .ok()
                .flatten()
                .or_else(|| {
                    row.try_get::<Option<i64>, _>("rows")
                        .ok()
                        .flatten()
                        .and_then(|n| u64::try_from(n).ok())
                })
                .unwrap_or_default();
            lines.push(format!(
                "{} {} {} rows={rows} {}",
                text("table"),
                text("type"),
                text("key"),
                text("Extra")
            ));
        }
        Ok(lines.join("\n"))
    }

    /// What optimistic claims have lost to competitors so far.
    pub fn claim_counters(&self) -> queue_core::sql::ClaimCounters {
        self.engine.claims.read()
    }

    /// Runs `op` again while it loses a deadlock or a lock wait (errors 1213, 1205), with
    /// a bounded, jittered backoff; each retry is counted and logged.
    async fn retrying<T, F, Fut>(&self, what: &str, op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        self.retrying_and(what, || {}, op).await
    }

    /// [`retrying`](Self::retrying) that also calls `on_conflict` at each retry (an
    /// optimistic claim counts its conflicts among the claim counters).
    async fn retrying_and<T, F, Fut>(
        &self,
        what: &str,
        on_conflict: impl Fn(),
        mut op: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, sqlx::Error>>,
    {
        let mut delay = Duration::from_millis(2);
        let mut attempt = 0;
        loop {
            match op().await {
                Err(err) if is_lock_conflict(&err) && attempt < self.options.lock_retries => {
                    attempt += 1;
                    self.lock_retries.fetch_add(1, Ordering::Relaxed);
                    on_conflict();
                    tracing::debug!(what, attempt, error = %err, "lock conflict; running again");
                    let jitter =
                        Duration::from_micros(u64::from(Uuid::new_v4().as_bytes()[0]) * 20);
                    tokio::time::sleep(delay + jitter).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                other => return other.backend(),
            }
        }
    }

    /// Starts the publish watch the first time a worker asks for a wake-up signal.
    fn ensure_watching(&self) {
        let Some(every) = self.options.watch else {
            return;
        };
        let mut watching = self.watching.lock().unwrap_or_else(|e| e.into_inner());
        if *watching || self.stop.is_cancelled() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(watch_publishes(
                self.connect.clone(),
                WatchSql {
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

    async fn promote(&self) -> Result<u64> {
        let mut conn = self.kept.take_or(self.pool.acquire()).await.backend()?;
        let any: i64 = sqlx::query_scalar(&self.sql.any_due)
            .fetch_one(&mut *conn)
            .await
            .backend()?;
        self.kept.keep(conn);
        if any == 0 {
            return Ok(0);
        }
        let promoted = self
            .retrying("promote", || async {
                Ok(sqlx::query(&self.sql.promote_due)
                    .execute(&self.pool)
                    .await?
                    .rows_affected())
            })
            .await?;
        if promoted > 0 {
            // Promoted rows keep their due times, which may lie before a cursor.
            self.cursors.clear();
        }
        Ok(promoted)
    }

    /// Moves the row `seq` held under `token` to the dead-letter store, byte for byte, in
    /// one transaction. `false` when the lease is gone.
    async fn move_leased_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
        key: Option<(&str, &str)>,
    ) -> Result<bool> {
        let token = token.to_string();
        let (reason, error) = (text::reason_text(reason), error.map(text::error_text));
        let keys: Vec<keys::Key> = key
            .map(|(q, k)| (q.to_owned(), k.to_owned()))
            .into_iter()
            .collect();
        let moved = self
            .retrying("dead-letter", || async {
                let mut tx = self.pool.begin().await?;
                self.lock_keys(&mut tx, &keys).await?;
                // Lock the row under this lease first: a reclaim in between then waits for
                // this move, or this move finds the lease gone and changes nothing.
                let held: Option<i64> = sqlx::query_scalar(&self.sql.lock_leased)
                    .bind(seq)
                    .bind(&token)
                    .fetch_optional(&mut *tx)
                    .await?;
                if held.is_none() {
                    tx.rollback().await?;
                    return Ok(false);
                }
                let copied = sqlx::query(&self.sql.copy_leased_to_dead)
                    .bind(&reason)
                    .bind(error.as_deref())
                    .bind(seq)
                    .bind(&token)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if copied == 0 {
                    tx.rollback().await?;
                    return Ok(false);
                }
                let buried = sqlx::query(&self.sql.bury_leased)
                    .bind(seq)
                    .bind(&token)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if buried != 1 {
                    tx.rollback().await?;
                    return Ok(false);
                }
                self.hand_on(&mut tx, &keys).await?;
                tx.commit().await?;
                Ok(true)
            })
            .await;
        if matches!(moved, Ok(true)) {
            self.wake_keys(&keys);
        }
        moved
    }

    /// Locks the rows of a batch, keeps those still held under their tokens, and runs
    /// `sql` (a statement over their seqs, with `lease` first when given) on them.
    async fn pairs(
        &self,
        what: &str,
        sql: &str,
        reservations: &[Reservation],
        lease: Option<i64>,
    ) -> Result<AckReport> {
        let mut report = AckReport::default();
        for chunk in reservations.chunks(MAX_LIST) {
            let part = self.by_pairs_chunk(what, sql, chunk, lease).await?;
            report.acked.extend(part.acked);
            report.lost.extend(part.lost);
        }
        Ok(report)
    }

    async fn by_pairs_chunk(
        &self,
        what: &str,
        sql: &str,
        reservations: &[Reservation],
        lease: Option<i64>,
    ) -> Result<AckReport> {
        if reservations.is_empty() {
            return Ok(AckReport::default());
        }
        let ids: Vec<String> = reservations.iter().map(|r| r.id().to_string()).collect();
        // Acks of keyed messages lock their keys first (see `keys`); starts change no key.
        let keys = if what == "ack" {
            keys::keys_of(reservations.iter().map(|r| &r.envelope))
        } else {
            Vec::new()
        };
        let wanted: std::collections::HashSet<(String, String)> = reservations
            .iter()
            .map(|r| (r.id().to_string(), r.token().to_string()))
            .collect();
        let touched = self
            .retrying(what, || async {
                let mut conn = self.kept.take_or(self.pool.acquire()).await?;
                let mut tx = conn.begin().await?;
                self.lock_keys(&mut tx, &keys).await?;
                let lock = with_list(&self.sql.lock_by_ids, ids.len());
                let mut q = sqlx::query_as::<_, (i64, Vec<u8>, Option<Vec<u8>>)>(&lock);
                for id in padded(&ids) {
                    q = q.bind(id);
                }
                let rows = q.fetch_all(&mut *tx).await?;
                let mut seqs = Vec::new();
                let mut touched = std::collections::HashSet::new();
                for (seq, id, token) in rows {
                    let Some(token) = token else { continue };
                    let (id, token) = (lossy(id), lossy(token));
                    if wanted.contains(&(id.clone(), token.clone())) {
                        seqs.push(seq);
                        if let Ok(token) = Uuid::parse_str(&token) {
                            touched.insert((id, token));
                        }
                    }
                }
                if !seqs.is_empty() {
                    let statement = with_list(sql, seqs.len());
                    let mut q = sqlx::query(&statement);
                    if let Some(lease) = lease {
                        q = q.bind(lease);
                    }
                    for s in padded(&seqs) {
                        q = q.bind(s);
                    }
                    q.execute(&mut *tx).await?;
                }
                if !keys.is_empty() {
                    // An ack removes heads: each hands its key to the next message.
                    let gone = keys::keys_of(
                        reservations
                            .iter()
                            .filter(|r| touched.contains(&(r.id().to_string(), r.token().0)))
                            .map(|r| &r.envelope),
                    );
                    self.hand_on(&mut tx, &gone).await?;
                }
                tx.commit().await?;
                self.kept.keep(conn);
                Ok(touched)
            })
            .await?;
        self.wake_keys(&keys);
        Ok(pair_report(reservations, &touched))
    }

    async fn fenced_update(
        &self,
        what: &str,
        sql: &str,
        reservation: &Reservation,
        binds: &[Option<i64>],
        text: Option<&str>,
    ) -> Result<bool> {
        let id = reservation.id().to_string();
        let token = reservation.token().to_string();
        let done = self
            .retrying(what, || async {
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = q.bind(*b);
                }
                if sql.contains("last_error") {
                    q = q.bind(text);
                }
                Ok(q.bind(&id)
                    .bind(&token)
                    .execute(&self.pool)
                    .await?
                    .rows_affected())
            })
            .await?;
        Ok(done == 1)
    }

    async fn now(&self) -> Result<i64> {
        sqlx::query_scalar(&self.sql.select_now)
            .fetch_one(&self.pool)
            .await
            .backend()
    }
}

impl MySqlTransport {
    /// The store of job status and results beside this transport's messages.
    pub fn status_store(&self) -> Arc<dyn queue_core::status::StatusStore> {
        self.status.clone()
    }
}

impl MySqlTransport {
    /// The dead-before cutoff (server clock) of an age.
    async fn cutoff(&self, age_us: Option<i64>) -> Result<Option<i64>> {
        match age_us {
            Some(age) => Ok(Some(self.now().await?.saturating_sub(age))),
            None => Ok(None),
        }
    }

    /// Deletes up to one `IN` list of the selected dead letters and their tombstones, in
    /// one transaction; how many dead letters.
    async fn purge_slice(
        &self,
        q: Option<&str>,
        id: Option<&str>,
        before: Option<i64>,
    ) -> Result<u64> {
        self.retrying("purge", || async {
            let mut tx = self.pool.begin().await?;
            let lock = sqlx::query_scalar::<_, Vec<u8>>(&self.sql.lock_dead);
            let ids: Vec<String> = bind_selection!(lock, q, id, before)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .map(lossy)
                .collect();
            if ids.is_empty() {
                tx.commit().await?;
                return Ok(0);
            }
            let mut deleted = 0;
            for sql in [
                &self.sql.delete_tombstones_by_ids,
                &self.sql.delete_dead_by_ids,
            ] {
                let sql = with_list(sql, ids.len());
                let mut q = sqlx::query(&sql);
                for id in padded(&ids) {
                    q = q.bind(id);
                }
                deleted = q.execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
            // The dead letters' count: the statement that ran last.
            Ok(deleted)
        })
        .await
    }
}
