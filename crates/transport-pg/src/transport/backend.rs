//! The SQL engine's primitives over this backend's statements.

use queue_core::sql::unique::KeyHold;

use super::*;

#[async_trait]
impl SqlBackend for PgTransport {
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
        self.ensure_listening();
    }

    async fn insert(&self, envelopes: Vec<Envelope>) -> Result<()> {
        let batch = self.encode(envelopes)?;
        match self.store(true, &batch).await {
            // An id was stored already (or twice in this batch): nothing of the failed
            // statement was kept, so store it again, skipping what is stored.
            Err(err) if is_unique_violation(&err) => self.store(false, &batch).await.backend(),
            stored => stored.backend(),
        }
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
        let (sql, start) = match start {
            StartMode::Move => (&self.sql.claim_for_move, StartMode::None),
            start if by.needles.is_empty() => (&self.sql.claim_skip_locked, start),
            start => (&self.sql.claim_skip_locked_labels, start),
        };
        let mut conn = self.kept.take_or(self.pool.acquire()).await.backend()?;
        let mut query = sqlx::query(sql)
            .bind(token.0)
            .bind(micros(self.options.visibility_timeout))
            .bind(queue.as_str())
            .bind(limit(max))
            .bind(start as i32)
            .bind(by.holder);
        if !by.needles.is_empty() {
            query = query.bind(&by.needles);
        }
        let rows = query.fetch_all(&mut *conn).await.backend()?;
        self.kept.keep(conn);
        rows.iter()
            .map(claimed_row)
            .collect::<std::result::Result<_, _>>()
            .backend()
    }

    async fn optimistic_candidates(
        &self,
        queue: &QueueName,
        window: usize,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<i64>> {
        self.candidates(queue, window, by).await
    }

    async fn optimistic_take(
        &self,
        queue: &QueueName,
        seqs: &[i64],
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>> {
        self.take(queue, seqs, token, start, by).await
    }

    async fn optimistic_round(
        &self,
        queue: &QueueName,
        slice: OptimisticSlice,
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Option<(usize, Vec<ClaimedRow>)>> {
        self.round(queue, slice, token, start, by).await.map(Some)
    }

    async fn promote_due(&self) -> Result<u64> {
        self.promote().await
    }

    async fn sweep_expired(&self) -> Result<u64> {
        let any: bool = sqlx::query_scalar(&self.sql.any_expired)
            .persistent(false)
            .fetch_one(&self.pool)
            .await
            .backend()?;
        if !any {
            return Ok(0);
        }
        Ok(sqlx::query(&self.sql.move_expired)
            .persistent(false)
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected())
    }

    async fn move_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
        key: Option<(&str, &str)>,
    ) -> Result<bool> {
        match key {
            Some(key) => {
                self.move_keyed_to_dead(seq, token, reason, error, key)
                    .await
            }
            None => self.move_leased_to_dead(seq, token, reason, error).await,
        }
    }

    async fn repair_keys(&self) -> Result<u64> {
        self.repair().await
    }

    async fn by_pairs(&self, op: PairOp, reservations: &[Reservation]) -> Result<AckReport> {
        match op {
            PairOp::Ack => {
                // A batch with keyed messages is acked in one transaction under their
                // keys' locks, which hands each key on (rows without a key hand nothing
                // on); the rest is one plain statement.
                if reservations
                    .iter()
                    .all(|r| r.envelope.ordering_key.is_none())
                {
                    self.pairs(&self.sql.ack_batch, reservations, None).await
                } else {
                    self.ack_keyed(reservations).await
                }
            }
            PairOp::Start(lease) => {
                self.pairs(&self.sql.start_batch, reservations, Some(lease))
                    .await
            }
        }
    }

    async fn on_lease(&self, op: LeaseOp<'_>, reservation: &Reservation) -> Result<bool> {
        let query = match op {
            LeaseOp::Release(delay, error) => {
                sqlx::query(&self.sql.release).bind(delay).bind(error)
            }
            LeaseOp::Snooze(delay) => sqlx::query(&self.sql.snooze).bind(delay),
            LeaseOp::Abandon => sqlx::query(&self.sql.abandon),
            LeaseOp::Extend(lease) => sqlx::query(&self.sql.extend).bind(lease),
        };
        let done = query
            .bind(reservation.id().to_string())
            .bind(reservation.token().0)
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected();
        Ok(done == 1)
    }

    async fn stats_rows(
        &self,
        queue: Option<&QueueName>,
    ) -> Result<(Vec<StatsRow>, Vec<(String, u64)>)> {
        let q = queue.map(QueueName::as_str);
        let mut waiting = Vec::new();
        for row in sqlx::query(&self.sql.stats_jobs)
            .bind(q)
            .fetch_all(&self.pool)
            .await
            .backend()?
        {
            waiting.push(StatsRow {
                queue: row.try_get(0).backend()?,
                ready: count(row.try_get(1).backend()?),
                delayed: count(row.try_get(2).backend()?),
                reserved: count(row.try_get(3).backend()?),
                oldest_ready_us: row.try_get(4).backend()?,
            });
        }
        let mut dead = Vec::new();
        for row in sqlx::query(&self.sql.stats_dead)
            .bind(q)
            .fetch_all(&self.pool)
            .await
            .backend()?
        {
            dead.push((row.try_get(0).backend()?, count(row.try_get(1).backend()?)));
        }
        Ok((waiting, dead))
    }

    async fn held_rows(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        limit_n: usize,
    ) -> Result<Vec<HeldRow>> {
        let rows = sqlx::query(&self.sql.held)
            .bind(queue.map(QueueName::as_str))
            .bind(id)
            .bind(limit(limit_n))
            .fetch_all(&self.pool)
            .await
            .backend()?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(HeldRow {
                id: row.try_get(0).backend()?,
                queue: row.try_get(1).backend()?,
                kind: row.try_get(2).backend()?,
                holder: row.try_get(3).backend()?,
                claimed_at_us: row.try_get(4).backend()?,
                lease_until_us: row.try_get::<Option<i64>, _>(5).backend()?.unwrap_or(0),
                started: row.try_get(6).backend()?,
                attempts: i64::from(row.try_get::<i32, _>(7).backend()?),
            });
        }
        Ok(out)
    }

    async fn dead_rows(&self, queue: Option<&QueueName>, limit_n: usize) -> Result<Vec<DeadRow>> {
        let rows = sqlx::query(&self.sql.list_dead)
            .bind(queue.map(QueueName::as_str))
            .bind(limit(limit_n))
            .fetch_all(&self.pool)
            .await
            .backend()?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(DeadRow {
                id: row.try_get(0).backend()?,
                queue: row.try_get(1).backend()?,
                kind: row.try_get(2).backend()?,
                attempts: i64::from(row.try_get::<i32, _>(3).backend()?),
                reason: row.try_get(4).backend()?,
                last_error: row.try_get(5).backend()?,
                dead_at_us: row.try_get::<Option<i64>, _>(6).backend()?.unwrap_or(0),
                body: row.try_get(7).backend()?,
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
        let mut tx = self.pool.begin().await.backend()?;
        // The selected dead letters, locked, then their keys' locks, then exactly those
        // moved: a replayed message with an ordering key goes behind every message of
        // its key, and no publish or hand-over of the key runs in between.
        let selected: Vec<(String, Option<String>)> = sqlx::query_as(&self.sql.select_replayed)
            .bind(queue.map(QueueName::as_str))
            .bind(id)
            .bind(age_us)
            .fetch_all(&mut *tx)
            .await
            .backend()?;
        let mut locks: Vec<String> = selected.iter().filter_map(|(_, k)| k.clone()).collect();
        locks.sort();
        locks.dedup();
        self.lock_keys(&mut tx, &locks).await.backend()?;
        let ids: Vec<&str> = selected.iter().map(|(id, _)| id.as_str()).collect();
        let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(&self.sql.replay_dead)
            .bind(queue.map(QueueName::as_str))
            .bind(id)
            .bind(age_us)
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .backend()?;
        let mut moved: Vec<(String, i64)> = Vec::new();
        for (q, _, _) in &rows {
            match moved.iter_mut().find(|(m, _)| m == q) {
                Some((_, n)) => *n += 1,
                None => moved.push((q.clone(), 1)),
            }
        }
        let queues: Vec<String> = moved.iter().map(|(q, _)| q.clone()).collect();
        if self.options.notify && !queues.is_empty() {
            sqlx::query(&self.sql.notify_queues)
                .bind(&self.channel)
                .bind(&queues)
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        tx.commit().await.backend()?;
        let count: i64 = moved.iter().map(|(_, n)| n).sum();
        Ok(Replayed {
            count: u64::try_from(count).unwrap_or(0),
            queues: Some(queues),
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
        Ok(sqlx::query(&self.sql.purge_dead)
            .bind(queue.map(QueueName::as_str))
            .bind(id)
            .bind(age_us)
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected())
    }

    async fn insert_dead(&self, letters: &[DeadLetter]) -> Result<()> {
        let mut tx = self.pool.begin().await.backend()?;
        for letter in letters {
            let (text, priority, expires_at, labels) = queue_core::sql::dead_row(letter);
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
                .bind(text)
                .bind(labels)
                .bind(
                    letter
                        .envelope
                        .as_ref()
                        .and_then(|e| e.ordering_key.clone()),
                )
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        tx.commit().await.backend()
    }
}
