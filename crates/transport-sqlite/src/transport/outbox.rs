//! The transactional outbox: publishing inside the caller's own transaction.

use queue_core::Published;

use super::*;

impl SqliteTransport {
    /// Publishes inside the caller's own transaction (the transactional outbox): the
    /// message exists if and only if the transaction commits.
    ///
    /// Begin the transaction on [`pool`](Self::pool), this transport's one write
    /// connection: the application's writes and the message then commit together, and
    /// this process's idle workers, woken here, claim only after the commit (their claim
    /// waits for the same connection). Until the commit, every operation of this
    /// transport that uses the write connection (claims, acks, heartbeats, stats) waits
    /// for it: keep the transaction short and write only through `tx`.
    /// A transaction on another connection to the same file works too; this process's
    /// workers then find the message by polling.
    ///
    /// ```no_run
    /// # async fn f(t: &transport_sqlite::SqliteTransport, env: queue_core::Envelope) -> queue_core::Result<()> {
    /// let backend = |e| queue_core::Error::backend("sqlite", false, e);
    /// let mut tx = t.pool().begin().await.map_err(backend)?;
    /// // … the caller's own writes on `tx` …
    /// t.publish_tx(&mut tx, env).await?;
    /// tx.commit().await.map_err(backend)?;
    /// # Ok(()) }
    /// ```
    pub async fn publish_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, Sqlite>,
        envelope: Envelope,
    ) -> Result<Published> {
        self.publish_batch_tx(tx, vec![envelope]).await
    }

    /// Publishes several messages inside the caller's own transaction; none is stored
    /// when one of them is too large.
    pub async fn publish_batch_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, Sqlite>,
        mut envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        let queues: Vec<String> = envelopes
            .iter()
            .map(|e| e.queue.as_str().to_owned())
            .collect();
        let published = if envelopes.iter().any(|e| e.unique.is_some()) {
            for env in &mut envelopes {
                env.normalize_for_store()?;
                env.check_size(self.options.max_payload_bytes)?;
            }
            self.publish_with_keys(tx, envelopes).await?
        } else {
            let rows = queue_core::sql::encoded(envelopes, self.options.max_payload_bytes)?;
            self.insert_keyed(tx, &rows).await?;
            Published::all_stored()
        };
        self.engine
            .wakers
            .wake_each(queues.iter().map(String::as_str));
        Ok(published)
    }
}
