//! The SQL engine's primitives over this backend's statements.

use queue_core::sql::unique::KeyHold;
use queue_core::Published;

use super::*;

#[async_trait]
impl SqlBackend for MySqlTransport {
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
        self.retrying("publish", || async {
            if keyed {
                let mut tx = self.pool.begin().await?;
                self.insert_keyed(&mut tx, &rows).await?;
                tx.commit().await
            } else if rows.len() <= PUBLISH_CHUNK {
                let mut conn = self.kept.take_or(self.pool.acquire()).await?;
                self.insert_rows(&mut conn, &rows, None).await?;
                self.kept.keep(conn);
                Ok(())
            } else {
                let mut tx = self.pool.begin().await?;
                for chunk in rows.chunks(PUBLISH_CHUNK) {
                    self.insert_rows(&mut tx, chunk, None).await?;
                }
                tx.commit().await
            }
        })
        .await?;
        for Encoded { env, .. } in &rows {
            self.cursors
                .forget_outranked(env.queue.as_str(), -i32::from(env.priority));
        }
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
        let lease = micros(self.options.visibility_timeout);
        // One transaction each: a lost deadlock rolls it back whole, so it simply runs
        // again.
        let rows = if start == StartMode::Move {
            self.retrying("claim", || {
                self.claim_for_move_locked(queue, max, token, lease, by.holder)
            })
            .await?
        } else {
            self.retrying("claim", || {
                self.lock_and_claim(queue, max, token, start, lease, by)
            })
            .await?
        };
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
        let candidates = if by.needles.is_empty() {
            sqlx::query_scalar(&self.sql.claim_candidates).bind(queue.as_str())
        } else {
            let mut q = sqlx::query_scalar(&self.sql.claim_candidates_labels).bind(queue.as_str());
            for needle in label_params(&by.needles) {
                q = q.bind(needle);
            }
            q
        };
        candidates
            .bind(limit(window))
            .fetch_all(&self.pool)
            .await
            .backend()
    }

    async fn optimistic_take(
        &self,
        queue: &QueueName,
        seqs: &[i64],
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>> {
        let lease = micros(self.options.visibility_timeout);
        let update = with_list(&self.sql.claim_optimistic, seqs.len());
        let took = self
            .retrying_and(
                "optimistic claim",
                || self.engine.claims.conflict(),
                || async {
                    let mut q = sqlx::query(&update)
                        .bind(start as i64)
                        .bind(start as i64)
                        .bind(token.to_string())
                        .bind(lease)
                        .bind(by.holder)
                        .bind(queue.as_str());
                    for s in padded(seqs) {
                        q = q.bind(s);
                    }
                    Ok(q.bind(limit(seqs.len()))
                        .execute(&self.pool)
                        .await?
                        .rows_affected())
                },
            )
            .await?;
        let mut rows = Vec::new();
        if took > 0 {
            let mut conn = self.pool.acquire().await.backend()?;
            for row in self.read_claimed(&mut conn, token, seqs).await.backend()? {
                rows.push(claimed_row(&row).backend()?);
            }
        }
        Ok(rows)
    }

    async fn promote_due(&self) -> Result<u64> {
        self.promote().await
    }

    async fn sweep_expired(&self) -> Result<u64> {
        let any: i64 = sqlx::query_scalar(&self.sql.any_expired)
            .fetch_one(&self.pool)
            .await
            .backend()?;
        if any == 0 {
            return Ok(0);
        }
        let moved = self
            .retrying("expire", || async {
                let mut tx = self.pool.begin().await?;
                let seqs: Vec<i64> = sqlx::query_scalar(&self.sql.lock_expired)
                    .fetch_all(&mut *tx)
                    .await?;
                if !seqs.is_empty() {
                    let copy = with_list(&self.sql.copy_expired, seqs.len());
                    let bury = with_list(&self.sql.bury_by_seqs, seqs.len());
                    for sql in [&copy, &bury] {
                        let mut q = sqlx::query(sql);
                        for s in padded(&seqs) {
                            q = q.bind(s);
                        }
                        q.execute(&mut *tx).await?;
                    }
                }
                tx.commit().await?;
                Ok(seqs.len())
            })
            .await?;
        Ok(moved as u64)
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
        self.repair().await
    }

    async fn by_pairs(&self, op: PairOp, reservations: &[Reservation]) -> Result<AckReport> {
        match op {
            PairOp::Ack => {
                self.pairs("ack", &self.sql.delete_by_seqs, reservations, None)
                    .await
            }
            PairOp::Start(lease) => {
                self.pairs("start", &self.sql.start_by_seqs, reservations, Some(lease))
                    .await
            }
        }
    }

    async fn on_lease(&self, op: LeaseOp<'_>, reservation: &Reservation) -> Result<bool> {
        match op {
            LeaseOp::Release(d, error) => {
                self.fenced_update(
                    "release",
                    &self.sql.release,
                    reservation,
                    &[Some(d), Some(d), Some(d)],
                    error,
                )
                .await
            }
            LeaseOp::Snooze(d) => {
                self.fenced_update(
                    "snooze",
                    &self.sql.snooze,
                    reservation,
                    &[Some(d), Some(d), Some(d)],
                    None,
                )
                .await
            }
            LeaseOp::Abandon => {
                self.fenced_update("abandon", &self.sql.abandon, reservation, &[], None)
                    .await
            }
            LeaseOp::Extend(lease) => {
                self.fenced_update(
                    "extend",
                    &self.sql.extend,
                    reservation,
                    &[Some(lease)],
                    None,
                )
                .await
            }
        }
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
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(q)
            .bind(q)
            .fetch_all(&self.pool)
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
            .bind(q)
            .fetch_all(&self.pool)
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
        limit_n: usize,
    ) -> Result<Vec<HeldRow>> {
        let rows = sqlx::query(&self.sql.held)
            .bind(queue.map(QueueName::as_str))
            .bind(queue.map(QueueName::as_str))
            .bind(id)
            .bind(id)
            .bind(limit(limit_n))
            .fetch_all(&self.pool)
            .await
            .backend()?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(HeldRow {
                id: lossy(row.try_get(0).backend()?),
                queue: lossy(row.try_get(1).backend()?),
                kind: lossy(row.try_get(2).backend()?),
                holder: row.try_get::<Option<Vec<u8>>, _>(3).backend()?.map(lossy),
                claimed_at_us: row.try_get(4).backend()?,
                lease_until_us: row.try_get(5).backend()?,
                started: row.try_get::<i8, _>(6).backend()? != 0,
                attempts: i64::from(row.try_get::<i32, _>(7).backend()?),
            });
        }
        Ok(out)
    }

    async fn dead_rows(&self, queue: Option<&QueueName>, limit_n: usize) -> Result<Vec<DeadRow>> {
        let q = queue.map(QueueName::as_str);
        let rows = sqlx::query(&self.sql.list_dead)
            .bind(q)
            .bind(q)
            .bind(limit(limit_n))
            .fetch_all(&self.pool)
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
                attempts: i64::from(row.try_get::<i32, _>(3).backend()?),
                reason: text(4)?,
                last_error: row.try_get::<Option<Vec<u8>>, _>(5).backend()?.map(lossy),
                dead_at_us: row.try_get(6).backend()?,
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
        let before = self.cutoff(age_us).await?;
        let q = queue.map(QueueName::as_str);
        let moved = self
            .retrying("replay", || async {
                let mut tx = self.pool.begin().await?;
                // The selected dead letters, locked, then their keys' locks, then exactly
                // those moved: a replayed message with an ordering key goes behind every
                // message of its key, and no publish or hand-over of the key runs between.
                let selected: Vec<(Vec<u8>, Vec<u8>, Option<Vec<u8>>)> =
                    bind_selection!(sqlx::query_as(&self.sql.select_replayed), q, id, before)
                        .fetch_all(&mut *tx)
                        .await?;
                let mut keys: Vec<keys::Key> = selected
                    .iter()
                    .filter_map(|(_, q, k)| Some((lossy(q.clone()), lossy(k.clone()?))))
                    .collect();
                keys.sort();
                keys.dedup();
                self.lock_keys(&mut tx, &keys).await?;
                let ids: Vec<String> = selected.into_iter().map(|(id, _, _)| lossy(id)).collect();
                let max_seq: i64 = sqlx::query_scalar(&self.sql.max_seq)
                    .fetch_one(&mut *tx)
                    .await?;
                let mut moved = 0;
                for chunk in ids.chunks(MAX_LIST) {
                    // Their tombstones go first: the ids may be published again.
                    let unbury = with_list(&self.sql.delete_tombstones_by_ids, chunk.len());
                    let replay = with_list(&self.sql.replay_dead, chunk.len());
                    let delete = with_list(&self.sql.delete_replayed, chunk.len());
                    let mut u = sqlx::query(&unbury);
                    let mut r = sqlx::query(&replay);
                    for i in padded(chunk) {
                        u = u.bind(i.clone());
                        r = r.bind(i);
                    }
                    u.execute(&mut *tx).await?;
                    r.execute(&mut *tx).await?;
                    let mut d = sqlx::query(&delete).bind(max_seq);
                    for i in padded(chunk) {
                        d = d.bind(i);
                    }
                    moved += d.execute(&mut *tx).await?.rows_affected();
                }
                sqlx::query(&self.sql.park_new)
                    .bind(max_seq)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(moved)
            })
            .await?;
        if moved > 0 {
            // Replayed messages may outrank a claim cursor.
            self.cursors.clear();
        }
        Ok(Replayed {
            count: moved,
            queues: None,
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
        let before = self.cutoff(age_us).await?;
        let q = queue.map(QueueName::as_str);
        let mut purged = 0;
        loop {
            let n = self.purge_slice(q, id, before).await?;
            purged += n;
            if n < 4_096 {
                break;
            }
        }
        if id.is_none() && before.is_none() && q.is_none() {
            // No dead letter is left, so a tombstone left (by a version-1 purge during an
            // upgrade) has none either: free its id. Cheap only here, with no
            // tombstones of live dead letters to step over.
            self.retrying("purge", || async {
                sqlx::query(&self.sql.delete_orphan_tombstones)
                    .execute(&self.pool)
                    .await
            })
            .await?;
        }
        Ok(purged)
    }

    async fn insert_dead(&self, letters: &[DeadLetter]) -> Result<()> {
        self.retrying("dead insert", || async {
            let mut tx = self.pool.begin().await?;
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
                    .bind(&text)
                    .bind(&labels)
                    .bind(
                        letter
                            .envelope
                            .as_ref()
                            .and_then(|e| e.ordering_key.as_deref()),
                    )
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&self.sql.insert_tombstone)
                    .bind(&letter.id)
                    .bind(&letter.queue)
                    .bind(queue_core::text::kind_column(&letter.kind))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        })
        .await
    }
}
