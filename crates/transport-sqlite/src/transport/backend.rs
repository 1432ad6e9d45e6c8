//! The SQL engine's primitives over this backend's statements.

use queue_core::sql::unique::KeyHold;
use queue_core::Published;

use super::*;

#[async_trait]
impl SqlBackend for SqliteTransport {
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
        let rows = queue_core::sql::encoded(envelopes, self.options.max_payload_bytes)?;
        let keyed = rows.iter().any(|r| r.env.ordering_key.is_some());
        if rows.len() <= INSERT_CHUNK && !keyed {
            // One statement is atomic on its own: no explicit transaction needed.
            let mut conn = self.writer.acquire().await.backend()?;
            self.insert_envelopes(&mut conn, &rows).await?;
        } else {
            let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
            self.insert_keyed(&mut tx, &rows).await?;
            tx.commit().await.backend()?;
        }
        tracing::debug!(count = rows.len(), "published");
        Ok(())
    }

    async fn insert_unique(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        self.insert_unique_batch(envelopes).await
    }

    async fn hold_keys(&self, holds: &[KeyHold]) -> Result<()> {
        self.hold_done_keys(holds).await
    }

    async fn prune_keys(&self) -> Result<u64> {
        self.prune_unique_keys(queue_core::sql::unique::PRUNE_AFTER)
            .await
    }

    async fn claim_locked(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>> {
        // One writer: a claim never meets another of this process's, and other
        // processes wait for the write lock, so "skip locked" is simply the claim.
        let token = token.to_string();
        if start == StartMode::Move {
            return self
                .claim_with(&self.sql.claim_for_move, queue, max, &token, None, by)
                .await;
        }
        let sql = if by.needles.is_empty() {
            &self.sql.claim_skip_locked
        } else {
            &self.sql.claim_skip_locked_labels
        };
        self.claim_with(sql, queue, max, &token, Some(start), by)
            .await
    }

    async fn optimistic_candidates(
        &self,
        queue: &QueueName,
        window: usize,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<i64>> {
        let candidates = if by.needles.is_empty() {
            sqlx::query_scalar(&self.sql.claim_candidates)
                .bind(queue.as_str())
                .bind(queue_core::sql::limit(window))
        } else {
            sqlx::query_scalar(&self.sql.claim_candidates_labels)
                .bind(queue.as_str())
                .bind(queue_core::sql::limit(window))
                .bind(needles_json(&by.needles)?)
        };
        candidates.fetch_all(&self.reader).await.backend()
    }

    async fn optimistic_take(
        &self,
        queue: &QueueName,
        seqs: &[i64],
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>> {
        let list = serde_json::to_string(seqs).map_err(|e| Error::backend(TRANSPORT, false, e))?;
        let rows = sqlx::query(&self.sql.claim_optimistic)
            .bind(token.to_string())
            .bind(micros(self.options.visibility_timeout))
            .bind(list)
            .bind(queue.as_str())
            .bind(queue_core::sql::limit(seqs.len()))
            .bind(start as i64)
            .bind(by.holder)
            .fetch_all(&self.writer)
            .await
            .backend()?;
        rows.iter()
            .map(claimed_row)
            .collect::<std::result::Result<Vec<_>, _>>()
            .backend()
    }

    async fn promote_due(&self) -> Result<u64> {
        self.promote().await
    }

    async fn sweep_expired(&self) -> Result<u64> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let cutoff: i64 = sqlx::query_scalar(&self.sql.select_now)
            .fetch_one(&mut *tx)
            .await
            .backend()?;
        let copied = sqlx::query(&self.sql.copy_expired)
            .bind(cutoff)
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        if copied > 0 {
            sqlx::query(&self.sql.delete_expired)
                .bind(cutoff)
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        tx.commit().await.backend()?;
        Ok(copied)
    }

    async fn move_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
        key: Option<(&str, &str)>,
    ) -> Result<bool> {
        self.move_leased_to_dead(seq, token, reason, error, key)
            .await
    }

    async fn repair_keys(&self) -> Result<u64> {
        Ok(sqlx::query(&self.sql.repair_keys)
            .execute(&self.writer)
            .await
            .backend()?
            .rows_affected())
    }

    async fn by_pairs(&self, op: PairOp, reservations: &[Reservation]) -> Result<AckReport> {
        let pairs: Vec<[String; 2]> = reservations
            .iter()
            .map(|r| [r.id().to_string(), r.token().to_string()])
            .collect();
        let pairs =
            serde_json::to_string(&pairs).map_err(|e| Error::backend(TRANSPORT, false, e))?;
        if op == PairOp::Ack
            && reservations
                .iter()
                .any(|r| r.envelope.ordering_key.is_some())
        {
            return self.ack_keyed(reservations, pairs).await;
        }
        let query = match op {
            PairOp::Ack => sqlx::query_as(&self.sql.ack_batch).bind(pairs),
            PairOp::Start(lease) => sqlx::query_as(&self.sql.start_batch)
                .bind(pairs)
                .bind(lease),
        };
        // Matched on (id, token): a batch may hold a stale copy of a message beside the
        // current one.
        let touched: Vec<(String, String)> = query.fetch_all(&self.writer).await.backend()?;
        // A token this transport wrote always parses; anything else matches nothing.
        let touched: std::collections::HashSet<(String, uuid::Uuid)> = touched
            .into_iter()
            .filter_map(|(id, token)| Some((id, uuid::Uuid::parse_str(&token).ok()?)))
            .collect();
        Ok(pair_report(reservations, &touched))
    }

    async fn on_lease(&self, op: LeaseOp<'_>, reservation: &Reservation) -> Result<bool> {
        let (id, token) = (
            reservation.id().to_string(),
            reservation.token().to_string(),
        );
        let query = match op {
            LeaseOp::Release(delay, error) => {
                sqlx::query(&self.sql.release).bind(delay).bind(error)
            }
            LeaseOp::Snooze(delay) => sqlx::query(&self.sql.snooze).bind(delay),
            LeaseOp::Abandon => sqlx::query(&self.sql.abandon),
            LeaseOp::Extend(lease) => sqlx::query(&self.sql.extend).bind(lease),
        };
        let done = query
            .bind(id)
            .bind(token)
            .execute(&self.writer)
            .await
            .backend()?
            .rows_affected();
        Ok(done == 1)
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
            .bind(q)
            .bind(now)
            .fetch_all(&self.reader)
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
            .fetch_all(&self.reader)
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

    async fn held_rows(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HeldRow>> {
        let rows = sqlx::query(&self.sql.held)
            .bind(queue.map(QueueName::as_str))
            .bind(id)
            .bind(queue_core::sql::limit(limit))
            .fetch_all(&self.reader)
            .await
            .backend()?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let text = |i: usize| -> Result<Option<String>> {
                Ok(row.try_get::<Option<Vec<u8>>, _>(i).backend()?.map(lossy))
            };
            out.push(HeldRow {
                id: text(0)?.unwrap_or_default(),
                queue: text(1)?.unwrap_or_default(),
                kind: text(2)?.unwrap_or_default(),
                holder: text(3)?,
                claimed_at_us: row.try_get(4).backend()?,
                lease_until_us: row.try_get::<Option<i64>, _>(5).backend()?.unwrap_or(0),
                started: row.try_get::<Option<i64>, _>(6).backend()?.unwrap_or(0) != 0,
                attempts: row.try_get::<Option<i64>, _>(7).backend()?.unwrap_or(0),
            });
        }
        Ok(out)
    }

    async fn dead_rows(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadRow>> {
        let rows = sqlx::query(&self.sql.list_dead)
            .bind(queue.map(QueueName::as_str))
            .bind(queue_core::sql::limit(limit))
            .fetch_all(&self.reader)
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
                attempts: row.try_get::<Option<i64>, _>(3).backend()?.unwrap_or(0),
                reason: text(4)?,
                last_error: row.try_get::<Option<Vec<u8>>, _>(5).backend()?.map(lossy),
                dead_at_us: row.try_get::<Option<i64>, _>(6).backend()?.unwrap_or(0),
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
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let before = self.cutoff(&mut tx, age_us).await?;
        let max_seq: i64 = sqlx::query_scalar(&self.sql.max_seq)
            .fetch_one(&mut *tx)
            .await
            .backend()?;
        let q = queue.map(QueueName::as_str);
        sqlx::query(&self.sql.replay_dead)
            .bind(q)
            .bind(id)
            .bind(before)
            .execute(&mut *tx)
            .await
            .backend()?;
        self.park_new(&mut tx, max_seq).await?;
        let moved = sqlx::query(&self.sql.delete_replayed)
            .bind(q)
            .bind(id)
            .bind(before)
            .bind(max_seq)
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        tx.commit().await.backend()?;
        Ok(Replayed {
            count: moved,
            queues: None,
        })
    }

    async fn dead_exists(&self, id: &str) -> Result<bool> {
        sqlx::query_scalar(&self.sql.dead_exists)
            .bind(id)
            .fetch_one(&self.reader)
            .await
            .backend()
    }

    async fn purge_dead(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        age_us: Option<i64>,
    ) -> Result<u64> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let before = self.cutoff(&mut tx, age_us).await?;
        let purged = sqlx::query(&self.sql.purge_dead)
            .bind(queue.map(QueueName::as_str))
            .bind(id)
            .bind(before)
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        tx.commit().await.backend()?;
        Ok(purged)
    }

    async fn insert_dead(&self, letters: &[DeadLetter]) -> Result<()> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await.backend()?;
        for letter in letters {
            let (text, priority, expires_at, labels) = queue_core::sql::dead_row(letter);
            sqlx::query(&self.sql.insert_dead)
                .bind(&letter.id)
                .bind(&letter.queue)
                .bind(queue_core::text::kind_column(&letter.kind))
                .bind(i64::from(priority))
                .bind(i64::from(letter.attempts))
                .bind(expires_at.map(|t| t.timestamp_micros()))
                .bind(queue_core::text::reason_text(&letter.reason))
                .bind(
                    letter
                        .last_error
                        .as_deref()
                        .map(queue_core::text::error_text),
                )
                .bind(letter.dead_at.timestamp_micros())
                .bind(text)
                .bind(labels)
                .bind(
                    letter
                        .envelope
                        .as_ref()
                        .and_then(|e| e.ordering_key.as_deref()),
                )
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        tx.commit().await.backend()
    }
}
