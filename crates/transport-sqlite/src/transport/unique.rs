//! Unique keys on SQLite: the key table's statements, run by the shared algorithm
//! ([`queue_core::sql::unique`]) inside the publish's transaction. A publish holds
//! SQLite's write lock from its first statement (`BEGIN IMMEDIATE`), so publishers of a
//! key never race here; the algorithm's lost-race paths are for the server backends.

use queue_core::sql::unique::{publish_unique, KeyHold, KeyHolder, KeyRow, KeyStatements, TakeKey};
use queue_core::Published;
use sqlx::SqliteConnection;

use super::*;

/// Whether a job with the id is stored, live or dead.
const ID_STORED: &str = "SELECT EXISTS (SELECT 1 FROM \"switchyard_jobs\" WHERE id = ?1)
    OR EXISTS (SELECT 1 FROM \"switchyard_jobs_dead\" WHERE id = ?1)";

/// The key's row: its job, scope, whether its hold lasts, and its age in µs.
const LOCK_KEY: &str = "SELECT id, scope, COALESCE(hold_until > {NOW}, 0), {NOW} - first_at
  FROM \"switchyard_jobs_unique\" WHERE queue = ?1 AND unique_key = ?2";

/// Creates a key's row; nothing when it exists.
const INSERT_KEY: &str = "INSERT INTO \"switchyard_jobs_unique\"
    (queue, unique_key, id, scope, hold_until, first_at)
    VALUES (?1, ?2, ?3, ?4, {NOW} + ?5, {NOW})
    ON CONFLICT (queue, unique_key) DO NOTHING";

/// Points a key's row at a new job.
const MOVE_KEY: &str = "UPDATE \"switchyard_jobs_unique\"
   SET id = ?3, scope = ?4, hold_until = {NOW} + ?5, first_at = {NOW}
 WHERE queue = ?1 AND unique_key = ?2";

/// The state of a key's job: claimed or not, and its envelope.
const HOLDER: &str = "SELECT token IS NOT NULL, envelope FROM \"switchyard_jobs\" WHERE id = ?1";

/// Debounces a job no worker has claimed: its new envelope, due ?3 µs from now (out of
/// the claim index until then, as a delayed publish).
const REPLACE_JOB: &str = "UPDATE \"switchyard_jobs\"
   SET envelope = ?2, available_at = {NOW} + ?3, visible_at = {NOW} + ?3, ready = (?3 <= 0)
 WHERE id = ?1 AND token IS NULL";

/// Holds an acked job's key for its `done` period, while the job is still held under
/// its token.
const HOLD_KEY: &str = "UPDATE \"switchyard_jobs_unique\" SET hold_until = {NOW} + ?4
 WHERE queue = ?1 AND unique_key = ?2 AND id = ?3
   AND EXISTS (SELECT 1 FROM \"switchyard_jobs\" j WHERE j.id = ?3 AND j.token = ?5)";

/// The key table's statements, specialised for this transport's table.
#[derive(Debug)]
pub(crate) struct KeySql {
    id_stored: String,
    lock_key: String,
    insert_key: String,
    move_key: String,
    holder: String,
    replace_job: String,
    hold_key: String,
}

impl KeySql {
    pub(crate) fn new(table: &str) -> Self {
        let s = |sql: &str| crate::sql::specialise(sql, table);
        KeySql {
            id_stored: s(ID_STORED),
            lock_key: s(LOCK_KEY),
            insert_key: s(INSERT_KEY),
            move_key: s(MOVE_KEY),
            holder: s(HOLDER),
            replace_job: s(REPLACE_JOB),
            hold_key: s(HOLD_KEY),
        }
    }
}

/// The statements on one transaction.
struct SqliteKeys<'a> {
    t: &'a SqliteTransport,
    conn: &'a mut SqliteConnection,
}

#[async_trait]
impl KeyStatements for SqliteKeys<'_> {
    async fn id_stored(&mut self, id: &str) -> Result<bool> {
        sqlx::query_scalar(&self.t.keys.id_stored)
            .bind(id)
            .fetch_one(&mut *self.conn)
            .await
            .backend()
    }

    async fn lock_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRow>> {
        let row: Option<(String, String, bool, i64)> = sqlx::query_as(&self.t.keys.lock_key)
            .bind(queue)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(row.map(|(id, scope, held, age_us)| KeyRow {
            id,
            scope,
            held,
            age_us,
        }))
    }

    async fn insert_key(&mut self, take: TakeKey<'_>) -> Result<bool> {
        let done = sqlx::query(&self.t.keys.insert_key)
            .bind(take.queue)
            .bind(take.key)
            .bind(take.id)
            .bind(take.scope)
            .bind(take.hold_us)
            .execute(&mut *self.conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }

    async fn move_key(&mut self, take: TakeKey<'_>) -> Result<()> {
        sqlx::query(&self.t.keys.move_key)
            .bind(take.queue)
            .bind(take.key)
            .bind(take.id)
            .bind(take.scope)
            .bind(take.hold_us)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn holder(&mut self, id: &str) -> Result<KeyHolder> {
        let row: Option<(bool, String)> = sqlx::query_as(&self.t.keys.holder)
            .bind(id)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(match row {
            None => KeyHolder::Gone,
            Some((true, _)) => KeyHolder::Claimed,
            Some((false, envelope)) => KeyHolder::Waiting(envelope),
        })
    }

    async fn insert_job(&mut self, env: &Envelope) -> Result<()> {
        let rows = queue_core::sql::encoded(vec![env.clone()], self.t.options.max_payload_bytes)?;
        self.t.insert_keyed(self.conn, &rows).await
    }

    async fn replace_job(&mut self, id: &str, envelope: &str, due_us: i64) -> Result<bool> {
        let done = sqlx::query(&self.t.keys.replace_job)
            .bind(id)
            .bind(envelope)
            .bind(due_us)
            .execute(&mut *self.conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }
}

impl SqliteTransport {
    /// Stores `envelopes`, some with unique keys, on `conn` (a transaction holding the
    /// write lock): those without first, as one batch, then each with a key in turn.
    pub(super) async fn publish_with_keys(
        &self,
        conn: &mut SqliteConnection,
        envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        let (unique, plain): (Vec<Envelope>, Vec<Envelope>) =
            envelopes.into_iter().partition(|e| e.unique.is_some());
        if !plain.is_empty() {
            let rows = queue_core::sql::encoded(plain, self.options.max_payload_bytes)?;
            self.insert_keyed(conn, &rows).await?;
        }
        let mut published = Published::all_stored();
        let mut keys = SqliteKeys { t: self, conn };
        for env in &unique {
            if let Some(dup) = publish_unique(&mut keys, env).await? {
                published.duplicates.push(dup);
            }
        }
        Ok(published)
    }

    /// [`publish_with_keys`](Self::publish_with_keys) in a write transaction of its own.
    pub(super) async fn insert_unique_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let published = self.publish_with_keys(&mut tx, envelopes).await?;
        tx.commit().await.backend()?;
        Ok(published)
    }

    /// Holds acked jobs' keys for their `done` periods (see [`HOLD_KEY`]).
    pub(super) async fn hold_done_keys(&self, holds: &[KeyHold]) -> Result<()> {
        for hold in holds {
            sqlx::query(&self.keys.hold_key)
                .bind(&hold.queue)
                .bind(&hold.key)
                .bind(&hold.id)
                .bind(hold.period_us)
                .bind(hold.token.to_string())
                .execute(&self.writer)
                .await
                .backend()?;
        }
        Ok(())
    }
}
