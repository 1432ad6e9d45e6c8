use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use queue_core::connect::Endpoint;
use queue_core::sql::{
    limit, lossy, micros, micros_between, pair_report, ClaimedRow, DeadRow, EngineState,
    KeptConnections, LeaseOp, PairOp, Replayed, SqlBackend, StartMode, StatsRow, StoreSettings,
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
use crate::sql::{padded, with_list, Statements};
use crate::status::MySqlStatusStore;
use crate::watch::{watch_publishes, WatchSql};

/// Rows per publish statement: 13 parameters each, well under MySQL's 65,535.
const PUBLISH_CHUNK: usize = 500;
/// The most values one `IN` list carries.
const MAX_LIST: usize = 4_096;

/// The server a transport talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `VERSION()` as the server reports it.
    pub version: String,
    /// MariaDB rather than MySQL.
    pub mariadb: bool,
    /// Whether it has `FOR UPDATE SKIP LOCKED` (MySQL 8.0.1+, MariaDB 10.6+).
    pub skip_locked: bool,
}

impl ServerInfo {
    /// Reads `VERSION()` (`8.0.36`, `10.11.19-MariaDB-0+deb12u1`).
    pub fn parse(version: &str) -> Self {
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        let mut parts = version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor, patch) = (
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
        );
        let skip_locked = if mariadb {
            (major, minor) >= (10, 6)
        } else {
            (major, minor, patch) >= (8, 0, 1)
        };
        ServerInfo {
            version: version.to_owned(),
            mariadb,
            skip_locked,
        }
    }
}

/// A [`Transport`](queue_core::Transport) over a MySQL or MariaDB (InnoDB) table.
///
/// Sessions run at `READ COMMITTED`, so a claim's scan takes no gap locks and never
/// blocks publishers; deadlocks and lock-wait timeouts are retried with a bounded
/// backoff (see [`MySqlTransport::lock_retries`]).
pub struct MySqlTransport {
    pool: MySqlPool,
    sql: Arc<Statements>,
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
        let url = options.url.expose().replacen("mariadb://", "mysql://", 1);
        let connect = MySqlConnectOptions::from_str(&url)
            .map_err(|e| {
                ConfigError::new(
                    "DATABASE_URL",
                    Some(options.url.to_string()),
                    format!("expected mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE ({e})"),
                )
            })?
            .charset("utf8mb4");
        let endpoint = Endpoint::from_url("MySQL", &url, 3306);
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
        Ok(MySqlTransport {
            status: Arc::new(MySqlStatusStore::new(
                pool.clone(),
                schema.as_deref(),
                &table,
            )),
            pool,
            sql: Arc::new(Statements::new(
                schema.as_deref(),
                &table,
                server.skip_locked,
            )),
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

    /// Drops this transport's job and dead-letter tables, messages and all.
    pub async fn drop_store(&self) -> Result<()> {
        uninstall(&self.pool, self.schema.as_deref(), &self.table).await
    }

    /// Publishes inside the caller's own transaction (the transactional outbox): the
    /// message exists if and only if the transaction commits.
    pub async fn publish_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, MySql>,
        envelope: Envelope,
    ) -> Result<()> {
        self.publish_batch_tx(tx, vec![envelope]).await
    }

    /// Publishes several messages inside the caller's own transaction.
    pub async fn publish_batch_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, MySql>,
        envelopes: Vec<Envelope>,
    ) -> Result<()> {
        let rows = self.encode(envelopes)?;
        for chunk in rows.chunks(PUBLISH_CHUNK) {
            self.insert_rows(tx, chunk).await.backend()?;
        }
        for (env, _) in &rows {
            self.cursors
                .forget_outranked(env.queue.as_str(), -i32::from(env.priority));
        }
        Ok(())
    }

    /// Runs `op` again while it loses a deadlock or a lock wait (errors 1213, 1205), with
    /// a bounded, jittered backoff; each retry is counted and logged.
    async fn retrying<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T>
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

    fn encode(&self, envelopes: Vec<Envelope>) -> Result<Vec<(Envelope, String)>> {
        let mut rows = Vec::with_capacity(envelopes.len());
        for env in envelopes {
            let json = env.to_json();
            if json.len() > self.options.max_payload_bytes {
                env.check_size(self.options.max_payload_bytes)?;
            }
            rows.push((env, json));
        }
        Ok(rows)
    }

    async fn insert_rows(
        &self,
        conn: &mut MySqlConnection,
        rows: &[(Envelope, String)],
    ) -> std::result::Result<(), sqlx::Error> {
        let values = vec![self.sql.publish_row.as_str(); rows.len()].join(", ");
        let sql = self.sql.publish.replace("{ROWS}", &values);
        let local_now = Utc::now();
        let mut query = sqlx::query(&sql);
        for (env, json) in rows {
            // Delay and expiry become offsets from the publisher's clock, applied to the
            // server's.
            let due = micros_between(local_now, env.available_at).max(0);
            let expires = env.expires_at.map(|t| micros_between(local_now, t));
            let priority = i32::from(env.priority);
            query = query
                .bind(env.id.to_string())
                .bind(env.queue.as_str())
                // The columns are indexes and operator views; the envelope JSON keeps
                // every field as published.
                .bind(text::kind_column(&env.kind))
                .bind(priority)
                .bind(-priority)
                .bind(i64::from(env.attempts))
                .bind(i8::from(due == 0))
                .bind(due)
                .bind(expires)
                .bind(env.last_error.as_deref().map(text::error_text))
                .bind(json.as_str());
        }
        query.execute(conn).await.map(|_| ())
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

    /// Locks up to `max` ready rows, skipping rows other claims hold, claims them and
    /// reads them back, in one transaction.
    async fn lock_and_claim(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
        lease: i64,
    ) -> std::result::Result<Vec<MySqlRow>, sqlx::Error> {
        // IN lists of up to 4,096 values stay far below MySQL's 65,535 placeholders; a
        // larger reserve comes back short, as the contract allows.
        let max = max.min(MAX_LIST);
        let mut conn = self.kept.take_or(self.pool.acquire()).await?;
        let mut tx = conn.begin().await?;
        let mut locked: Vec<(i64, i32, i64)> = Vec::new();
        if let Some(c) = self.cursors.get(queue.as_str()) {
            locked = sqlx::query_as(&self.sql.claim_lock_after)
                .bind(queue.as_str())
                .bind(c.prio_rank)
                .bind(c.visible_at)
                .bind(c.visible_at)
                .bind(c.seq)
                .bind(limit(max))
                .fetch_all(&mut *tx)
                .await?;
        }
        if locked.is_empty() {
            locked = sqlx::query_as(&self.sql.claim_lock)
                .bind(queue.as_str())
                .bind(limit(max))
                .fetch_all(&mut *tx)
                .await?;
        }
        let seqs: Vec<i64> = locked.iter().map(|(seq, _, _)| *seq).collect();
        if seqs.is_empty() {
            tx.commit().await?;
            self.kept.keep(conn);
            self.cursors.after_claim(queue.as_str(), &locked, max);
            return Ok(Vec::new());
        }
        let update = with_list(&self.sql.claim_locked, seqs.len());
        let mut q = sqlx::query(&update)
            .bind(start as i64)
            .bind(start as i64)
            .bind(token.to_string())
            .bind(lease);
        for s in padded(&seqs) {
            q = q.bind(s);
        }
        q.execute(&mut *tx).await?;
        let rows = self.read_claimed(&mut tx, token, &seqs).await?;
        tx.commit().await?;
        self.kept.keep(conn);
        // Only a committed claim moves the cursor: rows of a claim rolled back stay
        // ahead of it.
        self.cursors.after_claim(queue.as_str(), &locked, max);
        Ok(rows)
    }

    /// Locks up to `max` rows no worker holds, due or not, and claims them for a move,
    /// in one transaction (the claim cursor is neither used nor moved).
    async fn claim_for_move_locked(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        lease: i64,
    ) -> std::result::Result<Vec<MySqlRow>, sqlx::Error> {
        let max = max.min(MAX_LIST);
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let seqs: Vec<i64> = sqlx::query_scalar(&self.sql.claim_lock_move)
            .bind(queue.as_str())
            .bind(limit(max))
            .fetch_all(&mut *tx)
            .await?;
        if seqs.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let update = with_list(&self.sql.claim_move_locked, seqs.len());
        let mut q = sqlx::query(&update).bind(token.to_string()).bind(lease);
        for s in padded(&seqs) {
            q = q.bind(s);
        }
        q.execute(&mut *tx).await?;
        let rows = self.read_claimed(&mut tx, token, &seqs).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn read_claimed(
        &self,
        conn: &mut MySqlConnection,
        token: LeaseToken,
        seqs: &[i64],
    ) -> std::result::Result<Vec<MySqlRow>, sqlx::Error> {
        let select = with_list(&self.sql.claimed, seqs.len());
        let mut q = sqlx::query(&select).bind(token.to_string());
        for s in padded(seqs) {
            q = q.bind(s);
        }
        q.fetch_all(conn).await
    }

    /// Moves the row `seq` held under `token` to the dead-letter store, byte for byte, in
    /// one transaction. `false` when the lease is gone.
    async fn move_leased_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
    ) -> Result<bool> {
        let token = token.to_string();
        let (reason, error) = (text::reason_text(reason), error.map(text::error_text));
        self.retrying("dead-letter", || async {
            let mut tx = self.pool.begin().await?;
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
            tx.commit().await?;
            Ok(true)
        })
        .await
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
        let wanted: std::collections::HashSet<(String, String)> = reservations
            .iter()
            .map(|r| (r.id().to_string(), r.token().to_string()))
            .collect();
        let touched = self
            .retrying(what, || async {
                let mut conn = self.kept.take_or(self.pool.acquire()).await?;
                let mut tx = conn.begin().await?;
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
                tx.commit().await?;
                self.kept.keep(conn);
                Ok(touched)
            })
            .await?;
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

impl MySqlTransport {
    /// The store of job status and results beside this transport's messages.
    pub fn status_store(&self) -> Arc<dyn queue_core::status::StatusStore> {
        self.status.clone()
    }
}

#[async_trait]
impl SqlBackend for MySqlTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn max_payload_bytes(&self) -> usize {
        self.options.max_payload_bytes
    }

    fn lease(&self) -> Duration {
        self.options.visibility_timeout
    }

    fn claim_strategy(&self) -> ClaimStrategy {
        self.options.claim
    }

    fn engine(&self) -> &EngineState {
        &self.engine
    }

    fn watch_publishes(&self) {
        self.ensure_watching();
    }

    async fn insert(&self, envelopes: Vec<Envelope>) -> Result<()> {
        let rows = self.encode(envelopes)?;
        self.retrying("publish", || async {
            if rows.len() <= PUBLISH_CHUNK {
                let mut conn = self.kept.take_or(self.pool.acquire()).await?;
                self.insert_rows(&mut conn, &rows).await?;
                self.kept.keep(conn);
                Ok(())
            } else {
                let mut tx = self.pool.begin().await?;
                for chunk in rows.chunks(PUBLISH_CHUNK) {
                    self.insert_rows(&mut tx, chunk).await?;
                }
                tx.commit().await
            }
        })
        .await?;
        for (env, _) in &rows {
            self.cursors
                .forget_outranked(env.queue.as_str(), -i32::from(env.priority));
        }
        Ok(())
    }

    async fn claim_locked(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
    ) -> Result<Vec<ClaimedRow>> {
        let lease = micros(self.options.visibility_timeout);
        // One transaction each: a lost deadlock rolls it back whole, so it simply runs
        // again.
        let rows = if start == StartMode::Move {
            self.retrying("claim", || {
                self.claim_for_move_locked(queue, max, token, lease)
            })
            .await?
        } else {
            self.retrying("claim", || {
                self.lock_and_claim(queue, max, token, start, lease)
            })
            .await?
        };
        rows.iter()
            .map(claimed_row)
            .collect::<std::result::Result<_, _>>()
            .backend()
    }

    async fn optimistic_round(
        &self,
        queue: &QueueName,
        want: usize,
        window: usize,
        token: LeaseToken,
        start: StartMode,
    ) -> Result<(Vec<ClaimedRow>, usize)> {
        let lease = micros(self.options.visibility_timeout);
        let candidates: Vec<i64> = sqlx::query_scalar(&self.sql.claim_candidates)
            .bind(queue.as_str())
            .bind(limit(window))
            .fetch_all(&self.pool)
            .await
            .backend()?;
        if candidates.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let update = with_list(&self.sql.claim_optimistic, candidates.len());
        let took = self
            .retrying("claim", || async {
                let mut q = sqlx::query(&update)
                    .bind(start as i64)
                    .bind(start as i64)
                    .bind(token.to_string())
                    .bind(lease)
                    .bind(queue.as_str());
                for s in padded(&candidates) {
                    q = q.bind(s);
                }
                Ok(q.bind(limit(want))
                    .execute(&self.pool)
                    .await?
                    .rows_affected())
            })
            .await?;
        let mut rows = Vec::new();
        if took > 0 {
            let mut conn = self.pool.acquire().await.backend()?;
            for row in self
                .read_claimed(&mut conn, token, &candidates)
                .await
                .backend()?
            {
                rows.push(claimed_row(&row).backend()?);
            }
        }
        Ok((rows, candidates.len()))
    }

    async fn promote_due(&self) -> Result<u64> {
        self.promote().await
    }

    async fn sweep_expired(&self) -> Result<u64> {
        let any: i64 = sqlx::query_scalar(&self.sql.any_expired)
            .fetch_one(&self.pool)
            .await
            .backend()?;
        if any == 0 {
            return Ok(0);
        }
        let moved = self
            .retrying("expire", || async {
                let mut tx = self.pool.begin().await?;
                let seqs: Vec<i64> = sqlx::query_scalar(&self.sql.lock_expired)
                    .fetch_all(&mut *tx)
                    .await?;
                if !seqs.is_empty() {
                    let copy = with_list(&self.sql.copy_expired, seqs.len());
                    let bury = with_list(&self.sql.bury_by_seqs, seqs.len());
                    for sql in [&copy, &bury] {
                        let mut q = sqlx::query(sql);
                        for s in padded(&seqs) {
                            q = q.bind(s);
                        }
                        q.execute(&mut *tx).await?;
                    }
                }
                tx.commit().await?;
                Ok(seqs.len())
            })
            .await?;
        Ok(moved as u64)
    }

    async fn move_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
    ) -> Result<bool> {
        self.move_leased_to_dead(seq, token, reason, error).await
    }

    async fn by_pairs(&self, op: PairOp, reservations: &[Reservation]) -> Result<AckReport> {
        match op {
            PairOp::Ack => {
                self.pairs("ack", &self.sql.delete_by_seqs, reservations, None)
                    .await
            }
            PairOp::Start(lease) => {
                self.pairs("start", &self.sql.start_by_seqs, reservations, Some(lease))
                    .await
            }
        }
    }

    async fn on_lease(&self, op: LeaseOp<'_>, reservation: &Reservation) -> Result<bool> {
        match op {
            LeaseOp::Release(d, error) => {
                self.fenced_update(
                    "release",
                    &self.sql.release,
                    reservation,
                    &[Some(d), Some(d), Some(d)],
                    error,
                )
                .await
            }
            LeaseOp::Abandon => {
                self.fenced_update("abandon", &self.sql.abandon, reservation, &[], None)
                    .await
            }
            LeaseOp::Extend(lease) => {
                self.fenced_update(
                    "extend",
                    &self.sql.extend,
                    reservation,
                    &[Some(lease)],
                    None,
                )
                .await
            }
        }
    }

    async fn stats_rows(
        &self,
        queue: Option<&QueueName>,
    ) -> Result<(Vec<StatsRow>, Vec<(String, u64)>)> {
        let now = self.now().await?;
        let q = queue.map(QueueName::as_str);
        let count = |n: Option<i64>| u64::try_from(n.unwrap_or(0)).unwrap_or(0);
        let mut waiting = Vec::new();
        for row in sqlx::query(&self.sql.stats_jobs)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(q)
            .bind(q)
            .fetch_all(&self.pool)
            .await
            .backend()?
        {
            let oldest: Option<i64> = row.try_get(4).backend()?;
            waiting.push(StatsRow {
                queue: lossy(row.try_get(0).backend()?),
                ready: count(row.try_get(1).backend()?),
                delayed: count(row.try_get(2).backend()?),
                reserved: count(row.try_get(3).backend()?),
                oldest_ready_us: oldest.map(|t| now.saturating_sub(t)),
            });
        }
        let mut dead = Vec::new();
        for row in sqlx::query(&self.sql.stats_dead)
            .bind(q)
            .bind(q)
            .fetch_all(&self.pool)
            .await
            .backend()?
        {
            dead.push((
                lossy(row.try_get(0).backend()?),
                count(row.try_get(1).backend()?),
            ));
        }
        Ok((waiting, dead))
    }

    async fn dead_rows(&self, queue: Option<&QueueName>, limit_n: usize) -> Result<Vec<DeadRow>> {
        let q = queue.map(QueueName::as_str);
        let rows = sqlx::query(&self.sql.list_dead)
            .bind(q)
            .bind(q)
            .bind(limit(limit_n))
            .fetch_all(&self.pool)
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
            out.push(DeadRow {
                id: text(0)?,
                queue: text(1)?,
                kind: text(2)?,
                attempts: i64::from(row.try_get::<i32, _>(3).backend()?),
                reason: text(4)?,
                last_error: row.try_get::<Option<Vec<u8>>, _>(5).backend()?.map(lossy),
                dead_at_us: row.try_get(6).backend()?,
                body: text(7)?,
            });
        }
        Ok(out)
    }

    async fn replay_dead(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        age_us: Option<i64>,
    ) -> Result<Replayed> {
        let before = self.cutoff(age_us).await?;
        let q = queue.map(QueueName::as_str);
        let moved = self
            .retrying("replay", || async {
                let mut tx = self.pool.begin().await?;
                bind_selection!(sqlx::query(&self.sql.unbury), q, id, before)
                    .execute(&mut *tx)
                    .await?;
                let max_seq: i64 = sqlx::query_scalar(&self.sql.max_seq)
                    .fetch_one(&mut *tx)
                    .await?;
                bind_selection!(sqlx::query(&self.sql.replay_dead), q, id, before)
                    .execute(&mut *tx)
                    .await?;
                let moved = bind_selection!(
                    sqlx::query(&self.sql.delete_replayed).bind(max_seq),
                    q,
                    id,
                    before
                )
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(moved)
            })
            .await?;
        if moved > 0 {
            // Replayed messages may outrank a claim cursor.
            self.cursors.clear();
        }
        Ok(Replayed {
            count: moved,
            queues: None,
        })
    }

    async fn dead_exists(&self, id: &str) -> Result<bool> {
        sqlx::query_scalar(&self.sql.dead_exists)
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .backend()
    }

    async fn purge_dead(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        age_us: Option<i64>,
    ) -> Result<u64> {
        let before = self.cutoff(age_us).await?;
        let q = queue.map(QueueName::as_str);
        let mut purged = 0;
        loop {
            let n = self.purge_slice(q, id, before).await?;
            purged += n;
            if n < 4_096 {
                break;
            }
        }
        if id.is_none() && before.is_none() && q.is_none() {
            // No dead letter is left, so a tombstone left (by a version-1 purge during an
            // upgrade) has none either: free its id. Cheap only here, with no
            // tombstones of live dead letters to step over.
            self.retrying("purge", || async {
                sqlx::query(&self.sql.delete_orphan_tombstones)
                    .execute(&self.pool)
                    .await
            })
            .await?;
        }
        Ok(purged)
    }

    async fn insert_dead(&self, letters: &[DeadLetter]) -> Result<()> {
        self.retrying("dead insert", || async {
            let mut tx = self.pool.begin().await?;
            for letter in letters {
                let (text, priority, expires_at) = queue_core::sql::dead_row(letter);
                sqlx::query(&self.sql.insert_dead)
                    .bind(&letter.id)
                    .bind(&letter.queue)
                    .bind(queue_core::text::kind_column(&letter.kind))
                    .bind(i32::from(priority))
                    .bind(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
                    .bind(expires_at.map(|t| t.timestamp_micros()))
                    .bind(queue_core::text::reason_text(&letter.reason))
                    .bind(
                        letter
                            .last_error
                            .as_deref()
                            .map(queue_core::text::error_text),
                    )
                    .bind(letter.dead_at.timestamp_micros())
                    .bind(&text)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&self.sql.insert_tombstone)
                    .bind(&letter.id)
                    .bind(&letter.queue)
                    .bind(queue_core::text::kind_column(&letter.kind))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        })
        .await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_tell_whether_skip_locked_exists() {
        let cases = [
            ("10.11.19-MariaDB-0+deb12u1", true, true),
            ("10.5.23-MariaDB", true, false),
            ("10.6.0-MariaDB-log", true, true),
            ("8.0.36", false, true),
            ("8.0.0-dmr", false, false),
            ("5.7.44-log", false, false),
        ];
        for (version, mariadb, skip) in cases {
            let info = ServerInfo::parse(version);
            assert_eq!(
                (info.mariadb, info.skip_locked),
                (mariadb, skip),
                "{version}"
            );
        }
    }
}
