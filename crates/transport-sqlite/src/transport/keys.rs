//! Ordering keys on SQLite: parking what a key's head holds up, and handing the key on
//! when the head leaves.
//!
//! Only a key's oldest message is ever claimable; the rest wait parked. SQLite has one
//! writer at a time, so a publish that parks and an ack that hands on are never
//! interleaved: each is one write transaction.

use super::*;

impl SqliteTransport {
    /// Stores `rows` on `conn`, inside a transaction when any has an ordering key: a
    /// message whose key has an older one stored (or earlier in the batch) is parked
    /// until the key is handed to it.
    pub(super) async fn insert_keyed(
        &self,
        conn: &mut sqlx::SqliteConnection,
        rows: &[Encoded],
    ) -> Result<()> {
        if rows.iter().all(|r| r.env.ordering_key.is_none()) {
            return self.insert_envelopes(conn, rows).await;
        }
        let before: i64 = sqlx::query_scalar(&self.sql.max_seq)
            .fetch_one(&mut *conn)
            .await
            .backend()?;
        self.insert_envelopes(conn, rows).await?;
        self.park_new(conn, before).await
    }

    /// Parks the keyed rows above seq `after` that have an older message of their key.
    pub(super) async fn park_new(
        &self,
        conn: &mut sqlx::SqliteConnection,
        after: i64,
    ) -> Result<()> {
        sqlx::query(&self.sql.park_new)
            .bind(after)
            .execute(conn)
            .await
            .backend()
            .map(|_| ())
    }

    /// Hands each `(queue, key)` whose head just left to the key's next message, and
    /// wakes this process's workers of the queues that got a ready one.
    pub(super) async fn hand_on(
        &self,
        conn: &mut sqlx::SqliteConnection,
        keys: &[(&str, &str)],
    ) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let keys = serde_json::to_string(keys).map_err(|e| Error::backend(TRANSPORT, false, e))?;
        let handed: Vec<(Vec<u8>, i64)> = sqlx::query_as(&self.sql.hand_on)
            .bind(keys)
            .fetch_all(conn)
            .await
            .backend()?;
        for (queue, ready) in handed {
            if ready != 0 {
                self.engine.wakers.wake(&lossy(queue));
            }
        }
        Ok(())
    }

    /// Acks a batch with keyed messages in one write transaction, handing each acked
    /// message's key to its next message.
    pub(super) async fn ack_keyed(
        &self,
        reservations: &[Reservation],
        pairs: String,
    ) -> Result<AckReport> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let touched: Vec<(String, String)> = sqlx::query_as(&self.sql.ack_batch)
            .bind(pairs)
            .fetch_all(&mut *tx)
            .await
            .backend()?;
        let touched: std::collections::HashSet<(String, uuid::Uuid)> = touched
            .into_iter()
            .filter_map(|(id, token)| Some((id, uuid::Uuid::parse_str(&token).ok()?)))
            .collect();
        let keys: Vec<(&str, &str)> = reservations
            .iter()
            .filter(|r| touched.contains(&(r.id().to_string(), r.token().0)))
            .filter_map(|r| {
                let key = r.envelope.ordering_key.as_deref()?;
                Some((r.envelope.queue.as_str(), key))
            })
            .collect();
        self.hand_on(&mut tx, &keys).await?;
        tx.commit().await.backend()?;
        Ok(pair_report(reservations, &touched))
    }
}
