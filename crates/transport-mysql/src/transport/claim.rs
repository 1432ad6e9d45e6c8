//! The claim statements of this backend: a locked claim that walks from the queue's
//! cursor, a move's claim, and reading claimed rows back.

use super::*;

impl MySqlTransport {
    /// Locks up to `max` ready rows, skipping rows other claims hold, claims them and
    /// reads them back, in one transaction.
    pub(super) async fn lock_and_claim(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
        lease: i64,
        by: &ClaimBy<'_>,
    ) -> std::result::Result<Vec<MySqlRow>, sqlx::Error> {
        // IN lists of up to 4,096 values stay far below MySQL's 65,535 placeholders; a
        // larger reserve comes back short, as the contract allows.
        let max = max.min(MAX_LIST);
        // The queue's cursor marks where unfiltered claims left off: a claim that passes
        // over other labels neither starts from it nor moves it.
        let filtered = !by.needles.is_empty();
        let mut conn = self.kept.take_or(self.pool.acquire()).await?;
        let mut tx = conn.begin().await?;
        let mut locked: Vec<(i64, i32, i64)> = Vec::new();
        if filtered {
            let mut q = sqlx::query_as(&self.sql.claim_lock_labels).bind(queue.as_str());
            for needle in label_params(&by.needles) {
                q = q.bind(needle);
            }
            locked = q.bind(limit(max)).fetch_all(&mut *tx).await?;
        } else if let Some(c) = self.cursors.get(queue.as_str()) {
            locked = sqlx::query_as(&self.sql.claim_lock_after)
                .bind(queue.as_str())
                .bind(c.prio_rank)
                .bind(c.visible_at)
                .bind(c.visible_at)
                .bind(c.seq)
                .bind(limit(max))
                .fetch_all(&mut *tx)
                .await?;
        }
        if locked.is_empty() && !filtered {
            locked = sqlx::query_as(&self.sql.claim_lock)
                .bind(queue.as_str())
                .bind(limit(max))
                .fetch_all(&mut *tx)
                .await?;
        }
        let seqs: Vec<i64> = locked.iter().map(|(seq, _, _)| *seq).collect();
        if seqs.is_empty() {
            tx.commit().await?;
            self.kept.keep(conn);
            if !filtered {
                self.cursors.after_claim(queue.as_str(), &locked, max);
            }
            return Ok(Vec::new());
        }
        let update = with_list(&self.sql.claim_locked, seqs.len());
        let mut q = sqlx::query(&update)
            .bind(start as i64)
            .bind(start as i64)
            .bind(token.to_string())
            .bind(lease)
            .bind(by.holder);
        for s in padded(&seqs) {
            q = q.bind(s);
        }
        q.execute(&mut *tx).await?;
        let rows = self.read_claimed(&mut tx, token, &seqs).await?;
        tx.commit().await?;
        self.kept.keep(conn);
        // Only a committed claim moves the cursor: rows of a claim rolled back stay
        // ahead of it.
        if !filtered {
            self.cursors.after_claim(queue.as_str(), &locked, max);
        }
        Ok(rows)
    }

    /// Locks up to `max` rows no worker holds, due or not, and claims them for a move,
    /// in one transaction (the claim cursor is neither used nor moved).
    pub(super) async fn claim_for_move_locked(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        lease: i64,
        holder: &str,
    ) -> std::result::Result<Vec<MySqlRow>, sqlx::Error> {
        let max = max.min(MAX_LIST);
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let seqs: Vec<i64> = sqlx::query_scalar(&self.sql.claim_lock_move)
            .bind(queue.as_str())
            .bind(limit(max))
            .fetch_all(&mut *tx)
            .await?;
        if seqs.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let update = with_list(&self.sql.claim_move_locked, seqs.len());
        let mut q = sqlx::query(&update)
            .bind(token.to_string())
            .bind(lease)
            .bind(holder);
        for s in padded(&seqs) {
            q = q.bind(s);
        }
        q.execute(&mut *tx).await?;
        let rows = self.read_claimed(&mut tx, token, &seqs).await?;
        tx.commit().await?;
        Ok(rows)
    }

    pub(super) async fn read_claimed(
        &self,
        conn: &mut MySqlConnection,
        token: LeaseToken,
        seqs: &[i64],
    ) -> std::result::Result<Vec<MySqlRow>, sqlx::Error> {
        let select = with_list(&self.sql.claimed, seqs.len());
        let mut q = sqlx::query(&select).bind(token.to_string());
        for s in padded(seqs) {
            q = q.bind(s);
        }
        q.fetch_all(conn).await
    }
}
