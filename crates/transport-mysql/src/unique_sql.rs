//! The statements of unique keys on MySQL: the key table (beside the queue's), and the
//! job state a key's holder is read from (the job's row). Shared by the transport's own publishes and by the key store this database
//! keeps for RabbitMQ as its control store.

use std::collections::{BTreeMap, HashMap, HashSet};

use queue_core::sql::lossy;
use queue_core::sql::unique::{KeyRow, TakeKey};
use queue_core::Result;
use sqlx::{MySqlConnection, MySqlPool};

use crate::error::SqlxResultExt;
use crate::sql::{padded, with_list};

/// Ids or keys in one statement's list; an insert of key rows takes half as many rows.
const LIST: usize = 1_000;

/// Whether a job with the id is stored, live, dead (a tombstone) or moved in dead.
const ID_STORED: &str = "SELECT EXISTS (SELECT 1 FROM `switchyard_jobs` WHERE id = ?)
    OR EXISTS (SELECT 1 FROM `switchyard_jobs_dead` WHERE id = ?)";

/// Which of the ids `{IN}` are stored, live, dead (a tombstone) or moved in dead (bind
/// the list twice).
const IDS_STORED: &str = "SELECT id FROM `switchyard_jobs` WHERE id IN ({IN})
    UNION ALL SELECT id FROM `switchyard_jobs_dead` WHERE id IN ({IN})";

/// Creates the key rows `{ROWS}` (each a [`NEW_KEY_ROW`]) that do not exist, and locks
/// those that do, unchanged, in the order given (the keys' order: two batches then wait
/// for each other's keys in one order, never in a cycle).
const INSERT_NEW_KEYS: &str = "INSERT INTO `switchyard_jobs_unique`
    (queue, unique_key, id, scope, hold_until, first_at, gone_after) VALUES {ROWS}
    ON DUPLICATE KEY UPDATE id = id";

/// The jobs the keys `{IN}` of a queue name and when they took them: read before
/// [`INSERT_NEW_KEYS`] (not locked), and again after it has locked them.
const KEY_HOLDERS: &str = "SELECT unique_key, id, first_at FROM `switchyard_jobs_unique`
 WHERE queue = ? AND unique_key IN ({IN})";

/// One row of [`INSERT_NEW_KEYS`].
const NEW_KEY_ROW: &str = "(?, ?, ?, ?, {NOW} + ?, {NOW}, {NOW} + ?)";

/// The key's row, locked: its job, scope, whether its hold lasts, its age in µs, and
/// whether a broker's job counts as gone.
const LOCK_KEY: &str = "SELECT id, scope, COALESCE(hold_until > {NOW}, 0),
       CAST({NOW} AS SIGNED) - first_at, COALESCE(gone_after <= {NOW}, 0)
  FROM `switchyard_jobs_unique` WHERE queue = ? AND unique_key = ? FOR UPDATE";

/// Creates a key's row; nothing when another transaction created it first.
const INSERT_KEY: &str = "INSERT IGNORE INTO `switchyard_jobs_unique`
    (queue, unique_key, id, scope, hold_until, first_at, gone_after)
    VALUES (?, ?, ?, ?, {NOW} + ?, {NOW}, {NOW} + ?)";

/// Points a key's row at a new job (its values first, then the key).
const MOVE_KEY: &str = "UPDATE `switchyard_jobs_unique`
   SET id = ?, scope = ?, hold_until = {NOW} + ?, first_at = {NOW}, gone_after = {NOW} + ?
 WHERE queue = ? AND unique_key = ?";

/// The state of a key's job (a tombstone is a gone job): claimed or not, and its
/// envelope.
const HOLDER: &str =
    "SELECT token IS NOT NULL, envelope FROM `switchyard_jobs` WHERE id = ? AND ready < 2";

/// Debounces a job no worker has claimed: its new envelope, due in some µs (out of the
/// claim order until then, as a delayed publish).
const REPLACE_JOB: &str = "UPDATE `switchyard_jobs`
   SET envelope = ?, available_at = {NOW} + ?, visible_at = {NOW} + ?, ready = (? <= 0)
 WHERE id = ? AND token IS NULL AND ready < 2";

/// Holds an acked job's key for its `done` period (a throttle's longer hold stays),
/// while the job is still held under its token.
const HOLD_KEY: &str = "UPDATE `switchyard_jobs_unique` u
   SET hold_until = GREATEST(COALESCE(u.hold_until, 0), {NOW} + ?)
 WHERE u.queue = ? AND u.unique_key = ? AND u.id = ?
   AND EXISTS (SELECT 1 FROM `switchyard_jobs` j WHERE j.id = ? AND j.token = ?)";

/// A broker's job is about to be acked: gone, its key held for its `done` period.
const HOLD_BROKER_KEY: &str = "UPDATE `switchyard_jobs_unique`
   SET hold_until = GREATEST(COALESCE(hold_until, 0), {NOW} + ?), gone_after = {NOW}
 WHERE queue = ? AND unique_key = ? AND id = ?";

/// The broker has the message: gone once it expires, or at the latest after a week (some
/// µs from now). Only while the publish is unconfirmed: a job that already ended (a fast
/// consumer) stays gone.
const CONFIRM_KEY: &str = "UPDATE `switchyard_jobs_unique` SET gone_after = {NOW} + ?
 WHERE queue = ? AND unique_key = ? AND id = ? AND gone_after > {NOW}";

/// A broker's job is gone (its publish failed, or it left the key's scope): the key is
/// free once a throttle's hold has run out.
const FREE_KEY: &str = "UPDATE `switchyard_jobs_unique` SET gone_after = {NOW}
 WHERE queue = ? AND unique_key = ? AND id = ?";

/// Up to 1,000 key rows that hold nothing (the hold has run out and the job is gone: a
/// broker's by its `gone_after`, the transport's own by its row, a tombstone being
/// gone), of keys taken more than some µs ago, locked (rows a publish holds are skipped
/// where the server has `SKIP LOCKED`). The look for the job may predate a publish that
/// took the row over and has committed since: [`PRUNE_DELETE`], a statement of its own,
/// looks again.
const PRUNE_CANDIDATES: &str = "SELECT queue, unique_key FROM `switchyard_jobs_unique`
 WHERE {PRUNABLE} LIMIT 1000 FOR UPDATE {SKIP_LOCKED}";

/// Deletes one locked candidate if it still holds nothing.
const PRUNE_DELETE: &str =
    "DELETE FROM `switchyard_jobs_unique` WHERE queue = ? AND unique_key = ? AND {PRUNABLE}";

/// Whether a key row holds nothing (see [`PRUNE_CANDIDATES`]).
const PRUNABLE: &str = "first_at <= {NOW} - ?
   AND (hold_until IS NULL OR hold_until <= {NOW})
   AND CASE WHEN gone_after IS NULL
            THEN NOT EXISTS (SELECT 1 FROM `switchyard_jobs` j
                              WHERE j.id = `switchyard_jobs_unique`.id AND j.ready < 2)
            ELSE gone_after <= {NOW} END";

/// A locked key row as read: id, scope, held, age in µs, gone.
type LockedKey = (Vec<u8>, Vec<u8>, i64, i64, i64);

/// The key table's statements, specialised for one table.
#[derive(Debug)]
pub(crate) struct KeySql {
    pub(crate) id_stored: String,
    ids_stored: String,
    key_holders: String,
    insert_new_keys: String,
    new_key_row: String,
    lock_key: String,
    insert_key: String,
    move_key: String,
    pub(crate) holder: String,
    pub(crate) replace_job: String,
    pub(crate) hold_key: String,
    pub(crate) hold_broker_key: String,
    pub(crate) confirm_key: String,
    pub(crate) free_key: String,
    prune_candidates: String,
    prune_delete: String,
}

impl KeySql {
    pub(crate) fn new(schema: Option<&str>, table: &str, skip_locked: bool) -> Self {
        let s = |sql: &str| crate::sql::specialise(sql, schema, table);
        KeySql {
            id_stored: s(ID_STORED),
            ids_stored: s(IDS_STORED),
            key_holders: s(KEY_HOLDERS),
            insert_new_keys: s(INSERT_NEW_KEYS),
            new_key_row: s(NEW_KEY_ROW),
            lock_key: s(LOCK_KEY),
            insert_key: s(INSERT_KEY),
            move_key: s(MOVE_KEY),
            holder: s(HOLDER),
            replace_job: s(REPLACE_JOB),
            hold_key: s(HOLD_KEY),
            hold_broker_key: s(HOLD_BROKER_KEY),
            confirm_key: s(CONFIRM_KEY),
            free_key: s(FREE_KEY),
            prune_candidates: s(&PRUNE_CANDIDATES.replace("{PRUNABLE}", PRUNABLE).replace(
                "{SKIP_LOCKED}",
                if skip_locked { "SKIP LOCKED" } else { "" },
            )),
            prune_delete: s(&PRUNE_DELETE.replace("{PRUNABLE}", PRUNABLE)),
        }
    }

    /// The key's row, locked until the transaction ends.
    pub(crate) async fn lock_key(
        &self,
        conn: &mut MySqlConnection,
        queue: &str,
        key: &str,
    ) -> Result<Option<KeyRow>> {
        let row: Option<LockedKey> = sqlx::query_as(&self.lock_key)
            .bind(queue)
            .bind(key)
            .fetch_optional(conn)
            .await
            .backend()?;
        Ok(row.map(|(id, scope, held, age_us, gone)| KeyRow {
            id: lossy(id),
            scope: lossy(scope),
            held: held != 0,
            age_us,
            gone: gone != 0,
        }))
    }

    /// Deletes up to 1,000 key rows that hold nothing, of keys taken longer than
    /// `older_than_us` ago; how many.
    pub(crate) async fn prune(
        &self,
        pool: &MySqlPool,
        older_than_us: i64,
    ) -> std::result::Result<u64, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let rows: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(&self.prune_candidates)
            .bind(older_than_us)
            .fetch_all(&mut *tx)
            .await?;
        let mut deleted = 0;
        for (queue, key) in rows {
            deleted += sqlx::query(&self.prune_delete)
                .bind(queue)
                .bind(key)
                .bind(older_than_us)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(deleted)
    }

    /// Which of `ids` are stored, live or dead.
    pub(crate) async fn ids_stored(
        &self,
        conn: &mut MySqlConnection,
        ids: &[&str],
    ) -> Result<HashSet<String>> {
        let mut stored = HashSet::new();
        for chunk in ids.chunks(LIST) {
            let sql = with_list(&self.ids_stored, chunk.len());
            let mut query = sqlx::query_scalar::<_, Vec<u8>>(&sql);
            for id in padded(chunk).chain(padded(chunk)) {
                query = query.bind(id);
            }
            stored.extend(
                query
                    .fetch_all(&mut *conn)
                    .await
                    .backend()?
                    .into_iter()
                    .map(lossy),
            );
        }
        Ok(stored)
    }

    /// Creates the rows of `takes`' keys that have none and locks the others, in the
    /// order of the keys (see [`INSERT_NEW_KEYS`]); the ids of the jobs whose rows it
    /// created. MySQL has no `RETURNING`, and its affected-rows count does not tell an
    /// insert from a row left as it was: the key rows are read before and, once all are
    /// locked, after; a row that names this batch's job and was not there before (or was
    /// another row: a prune can delete an unlocked row in between) was created here. A
    /// row another transaction created in between names its own job.
    pub(crate) async fn insert_new_keys(
        &self,
        conn: &mut MySqlConnection,
        takes: &[TakeKey<'_>],
    ) -> Result<HashSet<String>> {
        let before = self.key_rows(conn, takes).await?;
        let mut sorted: Vec<&TakeKey<'_>> = takes.iter().collect();
        sorted.sort_by_key(|t| (t.queue, t.key));
        for chunk in sorted.chunks(LIST / 2) {
            // Padded with the last row (which then meets its own row and leaves it), so
            // that a connection prepares a handful of statements, not one per size.
            let n = chunk.len().next_power_of_two();
            let rows = vec![self.new_key_row.as_str(); n].join(", ");
            let sql = self.insert_new_keys.replace("{ROWS}", &rows);
            let mut query = sqlx::query(&sql);
            for take in padded(chunk) {
                query = query
                    .bind(take.queue)
                    .bind(take.key)
                    .bind(take.id)
                    .bind(take.scope)
                    .bind(take.hold_us)
                    .bind(take.gone_after_us);
            }
            query.execute(&mut *conn).await.backend()?;
        }
        let after = self.key_rows(conn, takes).await?;
        Ok(takes
            .iter()
            .filter(|t| {
                let key = (t.queue.to_owned(), t.key.to_owned());
                let now = after.get(&key);
                now.is_some_and(|(id, _)| id == t.id) && before.get(&key) != now
            })
            .map(|t| t.id.to_owned())
            .collect())
    }

    /// The jobs `takes`' keys name and when they took them, by queue and key, where
    /// they have rows.
    async fn key_rows(
        &self,
        conn: &mut MySqlConnection,
        takes: &[TakeKey<'_>],
    ) -> Result<HashMap<(String, String), (String, i64)>> {
        let mut by_queue: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for take in takes {
            by_queue.entry(take.queue).or_default().push(take.key);
        }
        let mut rows = HashMap::new();
        for (queue, keys) in by_queue {
            for chunk in keys.chunks(LIST) {
                let sql = with_list(&self.key_holders, chunk.len());
                let mut query = sqlx::query_as::<_, (Vec<u8>, Vec<u8>, i64)>(&sql).bind(queue);
                for key in padded(chunk) {
                    query = query.bind(key);
                }
                for (key, id, at) in query.fetch_all(&mut *conn).await.backend()? {
                    rows.insert((queue.to_owned(), lossy(key)), (lossy(id), at));
                }
            }
        }
        Ok(rows)
    }

    /// Creates the key's row (`move_to` false) or points it at a new job; whether it
    /// wrote.
    pub(crate) async fn write_key(
        &self,
        conn: &mut MySqlConnection,
        take: TakeKey<'_>,
        move_to: bool,
    ) -> Result<bool> {
        let query = if move_to {
            sqlx::query(&self.move_key)
                .bind(take.id)
                .bind(take.scope)
                .bind(take.hold_us)
                .bind(take.gone_after_us)
                .bind(take.queue)
                .bind(take.key)
        } else {
            sqlx::query(&self.insert_key)
                .bind(take.queue)
                .bind(take.key)
                .bind(take.id)
                .bind(take.scope)
                .bind(take.hold_us)
                .bind(take.gone_after_us)
        };
        let done = query.execute(conn).await.backend()?;
        Ok(done.rows_affected() == 1)
    }
}
