//! Publishing on MySQL: the rows of a publish, and publishing inside the caller's own
//! transaction (the transactional outbox).

use queue_core::Published;

use super::*;

impl MySqlTransport {
    /// Publishes inside the caller's own transaction (the transactional outbox): the
    /// message exists if and only if the transaction commits.
    pub async fn publish_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, MySql>,
        envelope: Envelope,
    ) -> Result<Published> {
        self.publish_batch_tx(tx, vec![envelope]).await
    }

    /// Publishes several messages inside the caller's own transaction. Messages with
    /// ordering keys or unique keys need it to run at READ COMMITTED (the transport's
    /// own connections, from [`pool`](Self::pool), do).
    pub async fn publish_batch_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, MySql>,
        mut envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        if envelopes.iter().any(|e| e.unique.is_some()) {
            for env in &mut envelopes {
                env.normalize_for_store()?;
                env.check_size(self.options.max_payload_bytes)?;
            }
            self.require_read_committed(tx, "unique keys").await?;
            let queues: Vec<(String, i16)> = envelopes
                .iter()
                .map(|e| (e.queue.as_str().to_owned(), e.priority))
                .collect();
            let published = self.publish_with_keys(tx, envelopes).await?;
            for (queue, priority) in queues {
                self.cursors.forget_outranked(&queue, -i32::from(priority));
            }
            return Ok(published);
        }
        let rows = queue_core::sql::encoded(envelopes, self.options.max_payload_bytes)?;
        if rows.iter().any(|r| r.env.ordering_key.is_some()) {
            self.require_read_committed(tx, "ordering keys").await?;
            self.insert_keyed(tx, &rows).await.backend()?;
        } else {
            for chunk in rows.chunks(PUBLISH_CHUNK) {
                self.insert_rows(tx, chunk, None).await.backend()?;
            }
        }
        for Encoded { env, .. } in &rows {
            self.cursors
                .forget_outranked(env.queue.as_str(), -i32::from(env.priority));
        }
        Ok(Published::all_stored())
    }

    /// Refuses a caller's transaction that is not READ COMMITTED for a publish that
    /// reads keys (`what`): a REPEATABLE READ snapshot older than a key's lock would miss
    /// a message published meanwhile (and a locking read there would lock gaps that hold
    /// up other publishers).
    async fn require_read_committed(&self, conn: &mut MySqlConnection, what: &str) -> Result<()> {
        let variable = if self.server.mariadb {
            "SELECT @@tx_isolation"
        } else {
            "SELECT @@transaction_isolation"
        };
        let isolation: String = sqlx::query_scalar(variable)
            .fetch_one(conn)
            .await
            .backend()?;
        if isolation != "READ-COMMITTED" {
            return Err(queue_core::Error::InvalidInput(format!(
                "messages with {what} are published in a READ COMMITTED transaction, not {isolation}: a snapshot older than the key's lock could miss a message of the key published meanwhile (the transport's own connections, from pool(), run at READ COMMITTED)"
            )));
        }
        Ok(())
    }

    /// Inserts `rows`; with `parked`, a batch with ordering keys: each row's key, and the
    /// parked ones waiting for theirs.
    pub(super) async fn insert_rows(
        &self,
        conn: &mut MySqlConnection,
        rows: &[Encoded],
        parked: Option<&[bool]>,
    ) -> std::result::Result<(), sqlx::Error> {
        let (row, statement) = match parked {
            Some(_) => (&self.sql.publish_row_keyed, &self.sql.publish_keyed),
            None => (&self.sql.publish_row, &self.sql.publish),
        };
        let values = vec![row.as_str(); rows.len()].join(", ");
        let sql = statement.replace("{ROWS}", &values);
        let local_now = Utc::now();
        let mut query = sqlx::query(&sql);
        for (n, Encoded { env, json, labels }) in rows.iter().enumerate() {
            let parked = parked.map(|p| p.get(n).copied().unwrap_or(false));
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
                .bind(i8::from(due == 0 && parked != Some(true)))
                .bind(due);
            if let Some(parked) = parked {
                query = query.bind(parked);
            }
            query = query
                .bind(expires)
                .bind(env.last_error.as_deref().map(text::error_text))
                .bind(json.as_str())
                .bind(labels.as_deref());
            if parked.is_some() {
                query = query.bind(env.ordering_key.as_deref());
            }
        }
        query.execute(conn).await.map(|_| ())
    }
}
