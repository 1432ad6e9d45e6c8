//! The statements of unique keys on SQLite: the key table (beside the queue's), and the
//! job state a key's holder is read from (the job's row). Shared by the transport's own publishes and by the key store this database
//! keeps for RabbitMQ as its control store.

use std::collections::HashSet;

use queue_core::sql::unique::{KeyRow, TakeKey};
use queue_core::Result;
use sqlx::{SqliteConnection, SqlitePool};

use crate::error::SqlxResultExt;

/// Which of the ids in the JSON array ?1 are stored, live or dead.
const IDS_STORED: &str = "SELECT id FROM \"switchyard_jobs\" WHERE id IN (SELECT value FROM json_each(?1))
    UNION ALL SELECT id FROM \"switchyard_jobs_dead\" WHERE id IN (SELECT value FROM json_each(?1))";

/// Creates the rows of keys that have none, from the JSON array ?1 of [queue, key, id,
/// scope, hold µs, gone-after µs]; the ids of the jobs whose rows it created. (`WHERE
/// true` tells SQLite's parser the `ON CONFLICT` is the insert's, not a join's.)
const INSERT_NEW_KEYS: &str = "INSERT INTO \"switchyard_jobs_unique\"
    (queue, unique_key, id, scope, hold_until, first_at, gone_after)
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3,
           {NOW} + (value ->> 4), {NOW}, {NOW} + (value ->> 5)
      FROM json_each(?1) WHERE true
    ON CONFLICT (queue, unique_key) DO NOTHING
    RETURNING id";

/// Whether a job with the id is stored, live or dead.
const ID_STORED: &str = "SELECT EXISTS (SELECT 1 FROM \"switchyard_jobs\" WHERE id = ?1)
    OR EXISTS (SELECT 1 FROM \"switchyard_jobs_dead\" WHERE id = ?1)";

/// The key's row (the transaction holds the write lock): its job, scope, whether its
/// hold lasts, its age in µs, and whether a broker's job counts as gone.
const LOCK_KEY: &str = "SELECT id, scope, COALESCE(hold_until > {NOW}, 0), {NOW} - first_at,
       COALESCE(gone_after <= {NOW}, 0)
  FROM \"switchyard_jobs_unique\" WHERE queue = ?1 AND unique_key = ?2";

/// Creates a key's row; nothing when it exists.
const INSERT_KEY: &str = "INSERT INTO \"switchyard_jobs_unique\"
    (queue, unique_key, id, scope, hold_until, first_at, gone_after)
    VALUES (?1, ?2, ?3, ?4, {NOW} + ?5, {NOW}, {NOW} + ?6)
    ON CONFLICT (queue, unique_key) DO NOTHING";

/// Points a key's row at a new job.
const MOVE_KEY: &str = "UPDATE \"switchyard_jobs_unique\"
   SET id = ?3, scope = ?4, hold_until = {NOW} + ?5, first_at = {NOW}, gone_after = {NOW} + ?6
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
const HOLD_KEY: &str = "UPDATE \"switchyard_jobs_unique\"
   SET hold_until = MAX(COALESCE(hold_until, 0), {NOW} + ?4)
 WHERE queue = ?1 AND unique_key = ?2 AND id = ?3
   AND EXISTS (SELECT 1 FROM \"switchyard_jobs\" j WHERE j.id = ?3 AND j.token = ?5)";

/// A broker's job is about to be acked: gone, its key held for its `done` period.
const HOLD_BROKER_KEY: &str = "UPDATE \"switchyard_jobs_unique\"
   SET hold_until = MAX(COALESCE(hold_until, 0), {NOW} + ?4), gone_after = {NOW}
 WHERE queue = ?1 AND unique_key = ?2 AND id = ?3";

/// The broker has the message: gone once it expires, or at the latest after a week (?4
/// µs from now). Only while the publish is unconfirmed: a job that already ended (a fast
/// consumer) stays gone.
const CONFIRM_KEY: &str = "UPDATE \"switchyard_jobs_unique\" SET gone_after = {NOW} + ?4
 WHERE queue = ?1 AND unique_key = ?2 AND id = ?3 AND gone_after > {NOW}";

/// A broker's job is gone (its publish failed, or it left the key's scope): the key is
/// free once a throttle's hold has run out.
const FREE_KEY: &str = "UPDATE \"switchyard_jobs_unique\" SET gone_after = {NOW}
 WHERE queue = ?1 AND unique_key = ?2 AND id = ?3";

/// Deletes up to 1,000 key rows that hold nothing: the hold has run out and the job is
/// gone (a broker's by its `gone_after`, the transport's own by its row). Only rows a
/// job took over ?1 µs ago (a minute), as on the server backends (here the write lock
/// already keeps a publish and the delete apart).
const PRUNE_KEYS: &str = "DELETE FROM \"switchyard_jobs_unique\" WHERE (queue, unique_key) IN (
    SELECT u.queue, u.unique_key FROM \"switchyard_jobs_unique\" u
     WHERE u.first_at <= {NOW} - ?1
       AND (u.hold_until IS NULL OR u.hold_until <= {NOW})
       AND CASE WHEN u.gone_after IS NULL
                THEN NOT EXISTS (SELECT 1 FROM \"switchyard_jobs\" j WHERE j.id = u.id)
                ELSE u.gone_after <= {NOW} END
     LIMIT 1000)";

/// The key table's statements, specialised for one table.
#[derive(Debug)]
pub(crate) struct KeySql {
    pub(crate) id_stored: String,
    pub(crate) ids_stored: String,
    insert_new_keys: String,
    lock_key: String,
    insert_key: String,
    move_key: String,
    pub(crate) holder: String,
    pub(crate) replace_job: String,
    pub(crate) hold_key: String,
    pub(crate) hold_broker_key: String,
    pub(crate) confirm_key: String,
    pub(crate) free_key: String,
    prune_keys: String,
}

impl KeySql {
    pub(crate) fn new(table: &str) -> Self {
        let s = |sql: &str| crate::sql::specialise(sql, table);
        KeySql {
            id_stored: s(ID_STORED),
            ids_stored: s(IDS_STORED),
            insert_new_keys: s(INSERT_NEW_KEYS),
            lock_key: s(LOCK_KEY),
            insert_key: s(INSERT_KEY),
            move_key: s(MOVE_KEY),
            holder: s(HOLDER),
            replace_job: s(REPLACE_JOB),
            hold_key: s(HOLD_KEY),
            hold_broker_key: s(HOLD_BROKER_KEY),
            confirm_key: s(CONFIRM_KEY),
            free_key: s(FREE_KEY),
            prune_keys: s(PRUNE_KEYS),
        }
    }

    /// The key's row.
    pub(crate) async fn lock_key(
        &self,
        conn: &mut SqliteConnection,
        queue: &str,
        key: &str,
    ) -> Result<Option<KeyRow>> {
        let row: Option<(String, String, bool, i64, bool)> = sqlx::query_as(&self.lock_key)
            .bind(queue)
            .bind(key)
            .fetch_optional(conn)
            .await
            .backend()?;
        Ok(row.map(|(id, scope, held, age_us, gone)| KeyRow {
            id,
            scope,
            held,
            age_us,
            gone,
        }))
    }

    /// Deletes up to 1,000 key rows that hold nothing, of keys taken longer than
    /// `older_than_us` ago; how many.
    pub(crate) async fn prune(&self, writer: &SqlitePool, older_than_us: i64) -> Result<u64> {
        Ok(sqlx::query(&self.prune_keys)
            .bind(older_than_us)
            .execute(writer)
            .await
            .backend()?
            .rows_affected())
    }

    /// Creates the rows of `takes`' keys that have none; the ids of the jobs whose rows
    /// it created.
    pub(crate) async fn insert_new_keys(
        &self,
        conn: &mut SqliteConnection,
        takes: &[TakeKey<'_>],
    ) -> Result<HashSet<String>> {
        let rows: Vec<_> = takes
            .iter()
            .map(|t| (t.queue, t.key, t.id, t.scope, t.hold_us, t.gone_after_us))
            .collect();
        let rows = serde_json::to_string(&rows)
            .map_err(|e| queue_core::Error::backend(crate::error::TRANSPORT, false, e))?;
        let created: Vec<String> = sqlx::query_scalar(&self.insert_new_keys)
            .bind(rows)
            .fetch_all(conn)
            .await
            .backend()?;
        Ok(created.into_iter().collect())
    }

    /// Creates the key's row (`move_to` false) or points it at a new job; whether it
    /// wrote.
    pub(crate) async fn write_key(
        &self,
        conn: &mut SqliteConnection,
        take: TakeKey<'_>,
        move_to: bool,
    ) -> Result<bool> {
        let sql = if move_to {
            &self.move_key
        } else {
            &self.insert_key
        };
        let done = sqlx::query(sql)
            .bind(take.queue)
            .bind(take.key)
            .bind(take.id)
            .bind(take.scope)
            .bind(take.hold_us)
            .bind(take.gone_after_us)
            .execute(conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }
}
