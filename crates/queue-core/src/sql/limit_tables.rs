//! The limit store of a SQL backend, written once: [`sql_limits!`](crate::sql_limits)
//! implements [`LimitStore`](crate::LimitStore) for a backend's store over its sqlx pool,
//! with the backend's own transaction start, text columns and park statement.

/// Implements [`LimitTable`](crate::sql::limits::LimitTable),
/// [`WaitTable`](crate::sql::limit_waits::WaitTable) and [`LimitStore`](crate::LimitStore)
/// for `$store` (a struct with `pool: $pool`, `sql: Arc<LimitStatements>` and `park:
/// String`, the transport's snooze), in a transport crate (which has sqlx, async-trait
/// and its own `crate::error::SqlxResultExt`).
///
/// - `begin: |pool| …` starts a transaction (SQLite: `BEGIN IMMEDIATE`, its writer);
/// - `text: path` reads a text column as `Result<Option<String>>` (MySQL's binary
///   collation hands text over as bytes);
/// - `park_job: path` runs the park statement, `(conn, sql, id, job_token, backstop_us)
///   -> Result<bool>`, whose parameters differ by backend;
/// - `tries` is how many times a transaction that failed transiently runs in all.
// `crate::error` is meant: each transport maps sqlx's errors its own way.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! sql_limits {
    (
        $store:ident,
        conn: $conn:ty,
        begin: |$p:ident| $begin:expr,
        text: $text:path,
        park_job: $park:path,
        tries: $tries:expr $(,)?
    ) => {
        #[allow(unused_imports)]
        use crate::error::SqlxResultExt as _;
        #[allow(unused_imports)]
        use sqlx::Row as _;

        /// The limit tables on one transaction.
        struct Tables<'a> {
            sql: &'a $crate::sql::limits::LimitStatements,
            park: &'a str,
            conn: &'a mut $conn,
        }

        #[async_trait::async_trait]
        impl $crate::sql::limits::LimitTable for Tables<'_> {
            async fn lock(
                &mut self,
                queue: &str,
                key: &str,
            ) -> $crate::Result<Option<$crate::sql::limits::Bucket>> {
                let row = sqlx::query(&self.sql.lock)
                    .bind(queue)
                    .bind(key)
                    .fetch_optional(&mut *self.conn)
                    .await
                    .backend()?;
                row.map(|row| {
                    Ok($crate::sql::limits::Bucket {
                        tokens: row.try_get(0).backend()?,
                        refilled_us: row.try_get(1).backend()?,
                        now_us: row.try_get(2).backend()?,
                        concurrency: row.try_get::<Option<i32>, _>(3).backend()?.map(i64::from),
                    })
                })
                .transpose()
            }

            async fn ensure(&mut self, queue: &str, key: &str) -> $crate::Result<()> {
                sqlx::query(&self.sql.ensure)
                    .bind(queue)
                    .bind(key)
                    .execute(&mut *self.conn)
                    .await
                    .backend()
                    .map(|_| ())
            }

            async fn expire(&mut self, queue: &str, key: &str, now_us: i64) -> $crate::Result<()> {
                sqlx::query(&self.sql.expire)
                    .bind(queue)
                    .bind(key)
                    .bind(now_us)
                    .execute(&mut *self.conn)
                    .await
                    .backend()
                    .map(|_| ())
            }

            async fn mine(
                &mut self,
                queue: &str,
                key: &str,
                id: &str,
            ) -> $crate::Result<Option<$crate::sql::limits::Mine>> {
                let row = sqlx::query(&self.sql.mine)
                    .bind(queue)
                    .bind(key)
                    .bind(id)
                    .fetch_optional(&mut *self.conn)
                    .await
                    .backend()?;
                row.map(|r| {
                    Ok($crate::sql::limits::Mine {
                        token: $text(&r, 0)?,
                        run_at_us: r.try_get(1).backend()?,
                        held_until_us: r.try_get(2).backend()?,
                    })
                })
                .transpose()
            }

            async fn running(
                &mut self,
                lease: $crate::LimitLease<'_>,
                key: &str,
                now_us: i64,
            ) -> $crate::Result<u64> {
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

            async fn hold(
                &mut self,
                lease: $crate::LimitLease<'_>,
                hold: $crate::sql::limits::Hold<'_>,
            ) -> $crate::Result<()> {
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

            async fn unhold(
                &mut self,
                lease: $crate::LimitLease<'_>,
                key: &str,
            ) -> $crate::Result<()> {
                sqlx::query(&self.sql.unhold)
                    .bind(lease.queue)
                    .bind(key)
                    .bind(lease.id)
                    .execute(&mut *self.conn)
                    .await
                    .backend()
                    .map(|_| ())
            }

            async fn unwait(&mut self, queue: &str, key: &str, id: &str) -> $crate::Result<()> {
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
                want: &$crate::Want,
                tokens: Option<f64>,
                refilled_us: i64,
            ) -> $crate::Result<()> {
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

        #[async_trait::async_trait]
        impl $crate::sql::limit_waits::WaitTable for Tables<'_> {
            async fn park_job(
                &mut self,
                id: &str,
                job_token: &str,
                backstop_us: i64,
            ) -> $crate::Result<bool> {
                $park(&mut *self.conn, self.park, id, job_token, backstop_us).await
            }

            async fn wait(
                &mut self,
                queue: &str,
                key: &str,
                id: &str,
                now_us: i64,
            ) -> $crate::Result<()> {
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

            async fn waiters(
                &mut self,
                queue: &str,
                key: &str,
                n: i64,
            ) -> $crate::Result<Vec<(String, i64)>> {
                let rows = sqlx::query(&self.sql.waiters)
                    .bind(queue)
                    .bind(key)
                    .bind(n)
                    .fetch_all(&mut *self.conn)
                    .await
                    .backend()?;
                rows.iter()
                    .map(|r| Ok(($text(r, 0)?.unwrap_or_default(), r.try_get(1).backend()?)))
                    .collect()
            }

            async fn wake_job(
                &mut self,
                queue: &str,
                id: &str,
                since_us: i64,
            ) -> $crate::Result<bool> {
                let done = sqlx::query(&self.sql.wake)
                    .bind(since_us)
                    .bind(id)
                    .bind(queue)
                    .execute(&mut *self.conn)
                    .await
                    .backend()?;
                Ok(done.rows_affected() == 1)
            }

            async fn lease_keys(
                &mut self,
                lease: $crate::LimitLease<'_>,
            ) -> $crate::Result<Vec<String>> {
                let rows = sqlx::query(&self.sql.lease_keys)
                    .bind(lease.queue)
                    .bind(lease.id)
                    .bind(lease.token)
                    .fetch_all(&mut *self.conn)
                    .await
                    .backend()?;
                rows.iter()
                    .map(|r| Ok($text(r, 0)?.unwrap_or_default()))
                    .collect()
            }

            async fn release(&mut self, lease: $crate::LimitLease<'_>) -> $crate::Result<()> {
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

        #[async_trait::async_trait]
        impl $crate::LimitStore for $store {
            async fn acquire(
                &self,
                lease: $crate::LimitLease<'_>,
                hold: std::time::Duration,
                wants: &[$crate::Want],
            ) -> $crate::Result<$crate::Acquired> {
                let answers = self.acquire_batch(&[(lease, hold, wants)]).await?;
                answers.into_iter().next().ok_or_else(|| {
                    $crate::Error::Conflict("a limit batch of one came back empty".into())
                })
            }

            async fn acquire_batch(
                &self,
                batch: &[($crate::LimitLease<'_>, std::time::Duration, &[$crate::Want])],
            ) -> $crate::Result<Vec<$crate::Acquired>> {
                $crate::sql::broker_keys::again_while_transient($tries, || async {
                    let mut tx = {
                        let $p = &self.pool;
                        $begin
                    }
                    .await
                    .backend()?;
                    let mut out = Vec::with_capacity(batch.len());
                    for (lease, hold, wants) in batch {
                        let tables = Tables {
                            sql: &self.sql,
                            park: &self.park,
                            conn: &mut tx,
                        };
                        out.push($crate::sql::limits::acquire(tables, *lease, *hold, wants).await?);
                    }
                    tx.commit().await.backend()?;
                    Ok(out)
                })
                .await
            }

            async fn extend(
                &self,
                lease: $crate::LimitLease<'_>,
                hold: std::time::Duration,
            ) -> $crate::Result<bool> {
                let done = sqlx::query(&self.sql.extend)
                    .bind($crate::sql::micros(hold))
                    .bind(lease.queue)
                    .bind(lease.id)
                    .bind(lease.token)
                    .execute(&self.pool)
                    .await
                    .backend()?;
                Ok(done.rows_affected() > 0)
            }

            async fn release(&self, lease: $crate::LimitLease<'_>) -> $crate::Result<u64> {
                $crate::sql::broker_keys::again_while_transient($tries, || async {
                    let mut tx = {
                        let $p = &self.pool;
                        $begin
                    }
                    .await
                    .backend()?;
                    let mut tables = Tables {
                        sql: &self.sql,
                        park: &self.park,
                        conn: &mut tx,
                    };
                    let woken = $crate::sql::limit_waits::release(&mut tables, lease).await?;
                    tx.commit().await.backend()?;
                    Ok(woken)
                })
                .await
            }

            async fn park(
                &self,
                lease: $crate::LimitLease<'_>,
                job_token: &str,
                wants: &[$crate::Want],
                backstop: std::time::Duration,
            ) -> $crate::Result<$crate::Parked> {
                $crate::sql::broker_keys::again_while_transient($tries, || async {
                    let mut tx = {
                        let $p = &self.pool;
                        $begin
                    }
                    .await
                    .backend()?;
                    let mut tables = Tables {
                        sql: &self.sql,
                        park: &self.park,
                        conn: &mut tx,
                    };
                    let parked = $crate::sql::limit_waits::park(
                        &mut tables,
                        lease,
                        job_token,
                        wants,
                        $crate::sql::micros(backstop),
                    )
                    .await?;
                    tx.commit().await.backend()?;
                    Ok(parked)
                })
                .await
            }

            async fn wake_parked(&self) -> $crate::Result<u64> {
                let keys = sqlx::query(&self.sql.waiting_keys)
                    .fetch_all(&self.pool)
                    .await
                    .backend()?;
                let keys: Vec<(String, String)> = keys
                    .iter()
                    .map(|r| {
                        Ok((
                            $text(r, 0)?.unwrap_or_default(),
                            $text(r, 1)?.unwrap_or_default(),
                        ))
                    })
                    .collect::<$crate::Result<_>>()?;
                let mut woken = 0;
                for (queue, key) in &keys {
                    woken += $crate::sql::broker_keys::again_while_transient($tries, || async {
                        let mut tx = {
                            let $p = &self.pool;
                            $begin
                        }
                        .await
                        .backend()?;
                        let mut tables = Tables {
                            sql: &self.sql,
                            park: &self.park,
                            conn: &mut tx,
                        };
                        let woken =
                            $crate::sql::limit_waits::wake_key(&mut tables, queue, key).await?;
                        tx.commit().await.backend()?;
                        Ok(woken)
                    })
                    .await?;
                }
                Ok(woken)
            }

            async fn usage(&self) -> $crate::Result<Vec<$crate::LimitUsage>> {
                let rows = sqlx::query(&self.sql.usage)
                    .fetch_all(&self.pool)
                    .await
                    .backend()?;
                rows.iter()
                    .map(|r| {
                        let concurrency: Option<i32> = r.try_get(2).backend()?;
                        let running: i64 = r.try_get(5).backend()?;
                        Ok($crate::LimitUsage {
                            queue: $text(r, 0)?.unwrap_or_default(),
                            key: $text(r, 1)?.unwrap_or_default(),
                            concurrency: concurrency.and_then(|n| u32::try_from(n).ok()),
                            running: u64::try_from(running).unwrap_or(0),
                            rate_per_second: r.try_get(3).backend()?,
                            tokens: r.try_get(4).backend()?,
                        })
                    })
                    .collect()
            }
        }
    };
}
