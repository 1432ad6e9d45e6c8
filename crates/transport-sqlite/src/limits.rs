//! Workers' limits kept in this database ([`queue_core::sql::limits`]): for the
//! transport's own jobs, and for RabbitMQ's when this database is its control store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::sql::broker_keys::again_while_transient;
use queue_core::sql::limit_waits::{self, WaitTable};
use queue_core::sql::limits::{acquire, Bucket, Dialect, Hold, LimitStatements, LimitTable, Mine};
use queue_core::sql::micros;
use queue_core::{Acquired, LimitLease, LimitStore, LimitUsage, Parked, Result, Want};
use sqlx::{Row, SqliteConnection, SqlitePool};

use crate::error::SqlxResultExt;

/// How many times an acquire runs in all when it fails transiently (the write lock
/// was busy past the busy timeout).
const DEADLOCK_TRIES: usize = 20;

/// The limit tables of one table of jobs.
#[derive(Debug)]
pub(crate) struct SqliteLimits {
    pool: SqlitePool,
    sql: Arc<LimitStatements>,
    /// The transport's snooze, which parks a job.
    park: String,
}

impl SqliteLimits {
    pub(crate) fn new(pool: SqlitePool, table: &str) -> Self {
        let sql = LimitStatements::new(Dialect::Sqlite).map(|s| crate::sql::specialise(s, table));
        SqliteLimits {
            pool,
            sql: Arc::new(sql),
            park: crate::sql::specialise(crate::sql::SNOOZE, table),
        }
    }
}

/// The limit tables on one transaction.
struct Tables<'a> {
    sql: &'a LimitStatements,
    park: &'a str,
    conn: &'a mut SqliteConnection,
}

#[async_trait]
impl LimitTable for Tables<'_> {
    async fn lock(&mut self, queue: &str, key: &str) -> Result<Option<Bucket>> {
        let row = sqlx::query(&self.sql.lock)
            .bind(queue)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        row.map(|row| {
            Ok(Bucket {
                tokens: row.try_get(0).backend()?,
                refilled_us: row.try_get(1).backend()?,
                now_us: row.try_get(2).backend()?,
                concurrency: row.try_get::<Option<i32>, _>(3).backend()?.map(i64::from),
            })
        })
        .transpose()
    }

    async fn ensure(&mut self, queue: &str, key: &str) -> Result<()> {
        sqlx::query(&self.sql.ensure)
            .bind(queue)
            .bind(key)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn expire(&mut self, queue: &str, key: &str, now_us: i64) -> Result<()> {
        sqlx::query(&self.sql.expire)
            .bind(queue)
            .bind(key)
            .bind(now_us)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn mine(&mut self, queue: &str, key: &str, id: &str) -> Result<Option<Mine>> {
        let row = sqlx::query(&self.sql.mine)
            .bind(queue)
            .bind(key)
            .bind(id)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        row.map(|r| {
            Ok(Mine {
                token: r.try_get(0).backend()?,
                run_at_us: r.try_get(1).backend()?,
                held_until_us: r.try_get(2).backend()?,
            })
        })
        .transpose()
    }

    async fn running(&mut self, lease: LimitLease<'_>, key: &str, now_us: i64) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(&self.sql.running)
            .bind(lease.queue)
            .bind(key)
            .bind(now_us)
            .bind(lease.id)
            .bind(lease.token)
            .fetch_one(&mut *self.conn)
            .await
            .backend()?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn hold(&mut self, lease: LimitLease<'_>, hold: Hold<'_>) -> Result<()> {
        sqlx::query(&self.sql.hold)
            .bind(lease.queue)
            .bind(hold.key)
            .bind(lease.id)
            .bind(hold.token)
            .bind(hold.run_at_us)
            .bind(hold.until_us)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn unhold(&mut self, lease: LimitLease<'_>, key: &str) -> Result<()> {
        sqlx::query(&self.sql.unhold)
            .bind(lease.queue)
            .bind(key)
            .bind(lease.id)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn unwait(&mut self, queue: &str, key: &str, id: &str) -> Result<()> {
        sqlx::query(&self.sql.unwait)
            .bind(queue)
            .bind(key)
            .bind(id)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn save(
        &mut self,
        queue: &str,
        want: &Want,
        tokens: Option<f64>,
        refilled_us: i64,
    ) -> Result<()> {
        sqlx::query(&self.sql.save)
            .bind(
                want.concurrency
                    .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
            )
            .bind(want.rate.map(|r| r.per_micro() * 1_000_000.0))
            .bind(tokens)
            .bind(refilled_us)
            .bind(queue)
            .bind(&want.key)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }
}

#[async_trait]
impl WaitTable for Tables<'_> {
    async fn park_job(&mut self, id: &str, job_token: &str, backstop_us: i64) -> Result<bool> {
        let done = sqlx::query(self.park)
            .bind(backstop_us)
            .bind(id)
            .bind(job_token)
            .execute(&mut *self.conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }

    async fn wait(&mut self, queue: &str, key: &str, id: &str, now_us: i64) -> Result<()> {
        sqlx::query(&self.sql.wait)
            .bind(queue)
            .bind(key)
            .bind(id)
            .bind(now_us)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn waiters(&mut self, queue: &str, key: &str, n: i64) -> Result<Vec<(String, i64)>> {
        let rows = sqlx::query(&self.sql.waiters)
            .bind(queue)
            .bind(key)
            .bind(n)
            .fetch_all(&mut *self.conn)
            .await
            .backend()?;
        rows.iter()
            .map(|r| Ok((r.try_get(0).backend()?, r.try_get(1).backend()?)))
            .collect()
    }

    async fn wake_job(&mut self, queue: &str, id: &str, since_us: i64) -> Result<bool> {
        let done = sqlx::query(&self.sql.wake)
            .bind(since_us)
            .bind(id)
            .bind(queue)
            .execute(&mut *self.conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }

    async fn lease_keys(&mut self, lease: LimitLease<'_>) -> Result<Vec<String>> {
        let rows = sqlx::query(&self.sql.lease_keys)
            .bind(lease.queue)
            .bind(lease.id)
            .bind(lease.token)
            .fetch_all(&mut *self.conn)
            .await
            .backend()?;
        rows.iter().map(|r| r.try_get(0).backend()).collect()
    }

    async fn release(&mut self, lease: LimitLease<'_>) -> Result<()> {
        sqlx::query(&self.sql.release)
            .bind(lease.queue)
            .bind(lease.id)
            .bind(lease.token)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }
}

#[async_trait]
impl LimitStore for SqliteLimits {
    async fn acquire(
        &self,
        lease: LimitLease<'_>,
        hold: Duration,
        wants: &[Want],
    ) -> Result<Acquired> {
        let answers = self.acquire_batch(&[(lease, hold, wants)]).await?;
        answers.into_iter().next().ok_or_else(|| {
            queue_core::Error::Conflict("a limit batch of one came back empty".into())
        })
    }

    async fn acquire_batch(
        &self,
        batch: &[(LimitLease<'_>, Duration, &[Want])],
    ) -> Result<Vec<Acquired>> {
        again_while_transient(DEADLOCK_TRIES, || async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.backend()?;
            let mut out = Vec::with_capacity(batch.len());
            for (lease, hold, wants) in batch {
                let tables = Tables {
                    sql: &self.sql,
                    park: &self.park,
                    conn: &mut tx,
                };
                out.push(acquire(tables, *lease, *hold, wants).await?);
            }
            tx.commit().await.backend()?;
            Ok(out)
        })
        .await
    }

    async fn extend(&self, lease: LimitLease<'_>, hold: Duration) -> Result<bool> {
        let done = sqlx::query(&self.sql.extend)
            .bind(micros(hold))
            .bind(lease.queue)
            .bind(lease.id)
            .bind(lease.token)
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(done.rows_affected() > 0)
    }

    async fn release(&self, lease: LimitLease<'_>) -> Result<u64> {
        again_while_transient(DEADLOCK_TRIES, || async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.backend()?;
            let mut tables = Tables {
                sql: &self.sql,
                park: &self.park,
                conn: &mut tx,
            };
            let woken = limit_waits::release(&mut tables, lease).await?;
            tx.commit().await.backend()?;
            Ok(woken)
        })
        .await
    }

    async fn park(
        &self,
        lease: LimitLease<'_>,
        job_token: &str,
        wants: &[Want],
        backstop: Duration,
    ) -> Result<Parked> {
        again_while_transient(DEADLOCK_TRIES, || async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.backend()?;
            let mut tables = Tables {
                sql: &self.sql,
                park: &self.park,
                conn: &mut tx,
            };
            let parked =
                limit_waits::park(&mut tables, lease, job_token, wants, micros(backstop)).await?;
            tx.commit().await.backend()?;
            Ok(parked)
        })
        .await
    }

    async fn wake_parked(&self) -> Result<u64> {
        let keys = sqlx::query(&self.sql.waiting_keys)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        let keys: Vec<(String, String)> = keys
            .iter()
            .map(|r| Ok((r.try_get(0).backend()?, r.try_get(1).backend()?)))
            .collect::<Result<_>>()?;
        let mut woken = 0;
        for (queue, key) in &keys {
            woken += again_while_transient(DEADLOCK_TRIES, || async {
                let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.backend()?;
                let mut tables = Tables {
                    sql: &self.sql,
                    park: &self.park,
                    conn: &mut tx,
                };
                let woken = limit_waits::wake_key(&mut tables, queue, key).await?;
                tx.commit().await.backend()?;
                Ok(woken)
            })
            .await?;
        }
        Ok(woken)
    }

    async fn usage(&self) -> Result<Vec<LimitUsage>> {
        let rows = sqlx::query(&self.sql.usage)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                let concurrency: Option<i32> = r.try_get(2).backend()?;
                let running: i64 = r.try_get(5).backend()?;
                Ok(LimitUsage {
                    queue: r.try_get(0).backend()?,
                    key: r.try_get(1).backend()?,
                    concurrency: concurrency.and_then(|n| u32::try_from(n).ok()),
                    running: u64::try_from(running).unwrap_or(0),
                    rate_per_second: r.try_get(3).backend()?,
                    tokens: r.try_get(4).backend()?,
                })
            })
            .collect()
    }
}
