//! Ordering keys on PostgreSQL: the keys' locks, and the hand-over of a key from a head
//! that leaves (acked or dead-lettered) to the next message of the key.
//!
//! Only a key's oldest message is ever claimable; the rest wait parked. Publishers of a
//! key and the hand-overs of that key take the same transaction-scoped advisory lock
//! before they read, so a publisher never parks a message behind a head whose hand-over
//! has already looked for the next one, and two publishers never both find the key free.

use super::*;

/// The lock name of `queue`'s `key`: both, separated by a unit separator (which neither
/// a queue name nor, in practice, a key contains).
pub(super) fn key_lock(queue: &str, key: &str) -> String {
    format!("{queue}\u{1f}{key}")
}

impl PgTransport {
    /// Takes the locks of `keys` for the rest of the transaction on `conn`.
    pub(super) async fn lock_keys(
        &self,
        conn: &mut PgConnection,
        keys: &[String],
    ) -> std::result::Result<(), sqlx::Error> {
        if keys.is_empty() {
            return Ok(());
        }
        sqlx::query(&self.sql.lock_keys)
            .bind(keys)
            .execute(conn)
            .await
            .map(|_| ())
    }

    /// Acks messages with ordering keys and hands each key to its next message, in one
    /// transaction under the keys' locks.
    pub(super) async fn ack_keyed(&self, reservations: &[Reservation]) -> Result<AckReport> {
        let keys = keys_of(reservations);
        let (seqs, tokens) = super::seq_ordered(reservations);
        let mut tx = self.pool.begin().await.backend()?;
        self.lock_keys(&mut tx, &keys).await.backend()?;
        let touched: Vec<(String, Uuid)> = sqlx::query_as(&self.sql.ack_keyed)
            .bind(&seqs)
            .bind(&tokens)
            .bind(self.wake_channel())
            .fetch_all(&mut *tx)
            .await
            .backend()?;
        tx.commit().await.backend()?;
        let touched: HashSet<(String, Uuid)> = touched.into_iter().collect();
        Ok(pair_report(reservations, &touched))
    }

    /// Moves a leased message with ordering key `key` of `queue` to the dead-letter
    /// store and hands the key on, under its lock; whether the lease still held.
    pub(super) async fn move_keyed_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
        (queue, key): (&str, &str),
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await.backend()?;
        self.lock_keys(&mut tx, &[key_lock(queue, key)])
            .await
            .backend()?;
        let (moved, _woken): (i64, Option<i64>) = sqlx::query_as(&self.sql.move_keyed_to_dead)
            .bind(seq)
            .bind(token.0)
            .bind(text::reason_text(reason))
            .bind(error.map(text::error_text))
            .bind(self.wake_channel())
            .fetch_one(&mut *tx)
            .await
            .backend()?;
        tx.commit().await.backend()?;
        Ok(moved == 1)
    }

    /// Hands keys whose head left without handing them on to their next message.
    pub(super) async fn repair(&self) -> Result<u64> {
        Ok(sqlx::query(&self.sql.repair_keys)
            .persistent(false)
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected())
    }

    /// Hands on the keys of `batch`'s messages that were parked behind an earlier one of
    /// the batch (see [`HAND_ON_SKIPPED`](crate::sql::HAND_ON_SKIPPED)).
    pub(super) async fn hand_on_skipped(
        &self,
        conn: &mut PgConnection,
        batch: &Encoded,
    ) -> std::result::Result<(), sqlx::Error> {
        let (mut queues, mut keys) = (Vec::new(), Vec::new());
        for chunk in &batch.chunks {
            for ((queue, key), follows) in chunk.queues.iter().zip(&chunk.keys).zip(&chunk.follows)
            {
                if let (true, Some(key)) = (*follows, key) {
                    queues.push(queue.as_str());
                    keys.push(key.as_str());
                }
            }
        }
        if keys.is_empty() {
            return Ok(());
        }
        sqlx::query(&self.sql.hand_on_skipped)
            .bind(&queues)
            .bind(&keys)
            .bind(self.wake_channel())
            .execute(conn)
            .await
            .map(|_| ())
    }

    /// The channel a hand-over notifies, or none when notifications are off.
    fn wake_channel(&self) -> Option<&str> {
        self.options.notify.then_some(self.channel.as_str())
    }
}

/// The lock names of the reservations' keys.
fn keys_of(reservations: &[Reservation]) -> Vec<String> {
    reservations
        .iter()
        .filter_map(|r| {
            r.envelope
                .ordering_key
                .as_deref()
                .map(|k| key_lock(r.envelope.queue.as_str(), k))
        })
        .collect()
}
