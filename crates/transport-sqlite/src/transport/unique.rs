//! Unique keys on SQLite: the key table's statements, run by the shared algorithm
//! ([`queue_core::sql::unique`]) inside the publish's transaction. A publish holds
//! SQLite's write lock from its first statement (`BEGIN IMMEDIATE`), so publishers of a
//! key never race here; the algorithm's lost-race paths are for the server backends.

use std::collections::HashSet;

use queue_core::sql::unique::{
    publish_in_order, KeyHold, KeyHolder, KeyRow, KeyStatements, TakeKey,
};
use queue_core::Published;
use sqlx::SqliteConnection;

use super::*;

pub(crate) use crate::unique_sql::KeySql;

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
        self.t.keys.lock_key(self.conn, queue, key).await
    }

    async fn insert_key(&mut self, take: TakeKey<'_>) -> Result<bool> {
        self.t.keys.write_key(self.conn, take, false).await
    }

    async fn move_key(&mut self, take: TakeKey<'_>) -> Result<()> {
        self.t
            .keys
            .write_key(self.conn, take, true)
            .await
            .map(|_| ())
    }

    async fn holder(&mut self, key: &KeyRow) -> Result<KeyHolder> {
        let row: Option<(bool, String)> = sqlx::query_as(&self.t.keys.holder)
            .bind(&key.id)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(match row {
            None => KeyHolder::Gone,
            Some((true, _)) => KeyHolder::Claimed,
            Some((false, envelope)) => KeyHolder::Waiting(envelope),
        })
    }

    async fn insert_jobs(&mut self, envelopes: Vec<Envelope>) -> Result<()> {
        let rows = queue_core::sql::encoded(envelopes, self.t.options.max_payload_bytes)?;
        self.t.insert_keyed(self.conn, &rows).await
    }

    async fn ids_stored(&mut self, ids: &[&str]) -> Result<HashSet<String>> {
        let ids = serde_json::to_string(ids)
            .map_err(|e| queue_core::Error::backend(crate::error::TRANSPORT, false, e))?;
        let stored: Vec<String> = sqlx::query_scalar(&self.t.keys.ids_stored)
            .bind(ids)
            .fetch_all(&mut *self.conn)
            .await
            .backend()?;
        Ok(stored.into_iter().collect())
    }

    async fn insert_new_keys(&mut self, takes: &[TakeKey<'_>]) -> Result<HashSet<String>> {
        self.t.keys.insert_new_keys(self.conn, takes).await
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
    /// Stores `envelopes`, some with unique keys, on `conn` (a transaction), in their
    /// order (see [`publish_in_order`]).
    pub(super) async fn publish_with_keys(
        &self,
        conn: &mut SqliteConnection,
        envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        publish_in_order(&mut SqliteKeys { t: self, conn }, envelopes).await
    }

    /// [`publish_with_keys`](Self::publish_with_keys) in a write transaction of its own.
    pub(super) async fn insert_unique_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let published = self.publish_with_keys(&mut tx, envelopes).await?;
        tx.commit().await.backend()?;
        Ok(published)
    }

    /// Deletes up to 1,000 unique-key rows that hold nothing any more (their holds have
    /// run out and their jobs are gone), of keys last taken longer than `older_than`
    /// ago; how many. Claims run it every minute with
    /// [`PRUNE_AFTER`](queue_core::sql::unique::PRUNE_AFTER); a shorter age is for
    /// tests and quiet stores (a key taken over meanwhile could be deleted).
    pub async fn prune_unique_keys(&self, older_than: Duration) -> Result<u64> {
        self.keys.prune(&self.writer, micros(older_than)).await
    }

    /// Holds acked jobs' keys for their `done` periods (fenced by their tokens).
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
