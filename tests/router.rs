//! The shared conformance suite against the migration router, over two SQLite stores
//! with half of the publishes sent to each (a 50% canary): every rule of the contract
//! holds across the pair, each message settled on the store it came from.

#![cfg(feature = "sqlite")]

use std::sync::Arc;

use async_trait::async_trait;
use queue_core::conformance::{Harness, OpenOptions, Store};
use queue_core::{BackendKind, Error, Result, Transport, TransportExt};
use sqlx::Connection;
use switchyard::{Router, SqliteOptions, SqliteTransport};

struct RouterHarness;

struct RouterStore {
    dir: tempfile::TempDir,
}

impl RouterStore {
    fn url(&self, name: &str) -> String {
        format!("sqlite://{}", self.dir.path().join(name).display())
    }

    async fn side(&self, url: String, options: &OpenOptions) -> Result<Arc<SqliteTransport>> {
        let t = SqliteTransport::connect(
            SqliteOptions::new(url)
                .with_table(options.table.clone())
                .with_visibility_timeout(options.visibility_timeout),
        )
        .await?;
        Ok(Arc::new(t))
    }
}

#[async_trait]
impl Harness for RouterHarness {
    async fn store(&self) -> Result<Box<dyn Store>> {
        let dir = tempfile::tempdir().map_err(|e| Error::backend("sqlite", false, e))?;
        Ok(Box::new(RouterStore { dir }))
    }
}

#[async_trait]
impl Store for RouterStore {
    async fn open_with_status(
        &self,
        options: OpenOptions,
    ) -> Result<(
        Arc<dyn Transport>,
        Option<Arc<dyn queue_core::status::StatusStore>>,
    )> {
        let primary = self.side(self.url("primary.db"), &options).await?;
        let other = self.side(self.url("other.db"), &options).await?;
        // During a migration the configured side keeps the status of both.
        let status = primary.status_store();
        let router = Router::new(primary, BackendKind::Exec, other, 50);
        Ok((Arc::new(router), Some(status)))
    }

    async fn open_unreachable(&self, options: OpenOptions) -> Result<Arc<dyn Transport>> {
        let url = format!(
            "sqlite://{}",
            self.dir.path().join("missing-dir").join("x.db").display()
        );
        let primary = self.side(url.clone(), &options).await?;
        let other = self.side(url, &options).await?;
        Ok(Arc::new(Router::new(primary, BackendKind::Exec, other, 50)))
    }

    /// Into the primary store's file.
    async fn insert_raw(&self, table: &str, queue: &str, id: &str, body: &str) -> Result<()> {
        let mut conn = sqlx::SqliteConnection::connect(&self.url("primary.db"))
            .await
            .map_err(|e| Error::backend("sqlite", false, e))?;
        let now = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)";
        sqlx::query(&format!(
            "INSERT INTO {table} (id, queue, kind, available_at, visible_at, created_at, envelope) \
             VALUES (?1, ?2, 'raw', {now}, {now}, {now}, ?3)"
        ))
        .bind(id)
        .bind(queue)
        .bind(body)
        .execute(&mut conn)
        .await
        .map_err(|e| Error::backend("sqlite", false, e))?;
        Ok(())
    }
}

fn harness() -> Arc<dyn Harness> {
    Arc::new(RouterHarness)
}

queue_core::conformance_tests!(crate::harness());

/// A backend that fails every call, as an unreachable one would.
#[derive(Debug)]
struct Down;

#[async_trait]
impl Transport for Down {
    fn name(&self) -> &'static str {
        "down"
    }
    fn capabilities(&self) -> queue_core::Capabilities {
        queue_core::Capabilities::default()
    }
    async fn publish_batch(&self, _: Vec<queue_core::Envelope>) -> Result<queue_core::Published> {
        Err(down())
    }
    async fn claim(
        &self,
        _: &queue_core::QueueName,
        _: queue_core::Claim<'_>,
    ) -> Result<Vec<queue_core::Reservation>> {
        Err(down())
    }
    async fn ack_batch(&self, _: &[queue_core::Reservation]) -> Result<queue_core::AckReport> {
        Err(down())
    }
    async fn give_back(
        &self,
        _: &queue_core::Reservation,
        _: queue_core::GiveBack<'_>,
    ) -> Result<()> {
        Err(down())
    }
    async fn dead_letter(
        &self,
        _: &queue_core::Reservation,
        _: &str,
        _: Option<&str>,
    ) -> Result<()> {
        Err(down())
    }
    async fn extend(&self, _: &queue_core::Reservation, _: std::time::Duration) -> Result<()> {
        Err(down())
    }
    async fn stats(
        &self,
        _: Option<&queue_core::QueueName>,
    ) -> Result<Vec<queue_core::QueueStats>> {
        Err(down())
    }
}

#[async_trait]
impl queue_core::Holdings for Down {
    async fn held(
        &self,
        _: queue_core::HeldSelection<'_>,
        _: usize,
    ) -> Result<Vec<queue_core::Holding>> {
        Err(down())
    }
}

#[async_trait]
impl queue_core::DeadLetters for Down {
    async fn dead_list(
        &self,
        _: Option<&queue_core::QueueName>,
        _: usize,
    ) -> Result<Vec<queue_core::DeadLetter>> {
        Err(down())
    }
    async fn dead_replay(
        &self,
        _: Option<&queue_core::QueueName>,
        _: &queue_core::DeadSelection,
    ) -> Result<u64> {
        Err(down())
    }
    async fn dead_purge(
        &self,
        _: Option<&queue_core::QueueName>,
        _: &queue_core::DeadSelection,
    ) -> Result<u64> {
        Err(down())
    }
}

fn down() -> Error {
    Error::backend("down", true, "unreachable")
}

/// `n` jobs of kind `k` on the queue `q`.
fn jobs_of_q(n: usize) -> Vec<queue_core::Envelope> {
    (0..n)
        .map(|_| {
            queue_core::Envelope::builder("q", "k")
                .build()
                .expect("an envelope")
        })
        .collect()
}

/// While the backend being drained is down, the configured one is still served, and
/// what it hands out is never dropped because the other failed.
#[tokio::test]
async fn a_backend_that_is_down_does_not_stop_the_other() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::backend("sqlite", false, e))?;
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let primary: Arc<dyn Transport> =
        Arc::new(SqliteTransport::connect(SqliteOptions::new(url)).await?);
    let router = Router::new(primary, BackendKind::Exec, Arc::new(Down), 0);
    let q = queue_core::QueueName::new("q")?;
    router.publish_batch(jobs_of_q(4)).await?;
    // Both orders of asking (the first side alternates).
    let mut got = router.reserve_batch(&q, 2).await?;
    got.extend(router.reserve_batch(&q, 2).await?);
    assert_eq!(got.len(), 4);
    assert_eq!(router.ack_batch(&got).await?.acked.len(), 4);
    Ok(())
}

/// A side whose acks fail does not hold back the other's: the other side's acks commit
/// and are reported acked, the failing side's are reported lost (after tries of their
/// own) and come back as after a lost lease.
#[tokio::test]
async fn one_sides_failing_acks_do_not_hold_back_the_others() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::backend("sqlite", false, e))?;
    let url = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    let primary = Arc::new(SqliteTransport::connect(SqliteOptions::new(url("p.db"))).await?);
    let other = Arc::new(SqliteTransport::connect(SqliteOptions::new(url("o.db"))).await?);
    let router = Router::new(primary.clone(), BackendKind::Exec, other.clone(), 50);
    let q = queue_core::QueueName::new("q")?;
    let jobs = 20;
    router.publish_batch(jobs_of_q(jobs)).await?;
    let mut got = Vec::new();
    while got.len() < jobs {
        let more = router.reserve_batch(&q, jobs).await?;
        assert!(!more.is_empty(), "{} of {jobs} reserved", got.len());
        got.extend(more);
    }
    // The side acked first is the one that fails.
    primary.close().await;
    let report = router.ack_batch(&got).await?;
    assert!(
        !report.acked.is_empty() && !report.lost.is_empty(),
        "a 50% canary put all {jobs} jobs on one side: {report:?}"
    );
    assert_eq!(report.acked.len() + report.lost.len(), jobs);
    let left = |stats: Vec<queue_core::QueueStats>| {
        stats
            .into_iter()
            .map(|s| s.ready + s.reserved + s.delayed)
            .sum::<u64>()
    };
    assert_eq!(
        left(other.stats(Some(&q)).await?),
        0,
        "the healthy side kept acked jobs"
    );
    let reopened = SqliteTransport::connect(SqliteOptions::new(url("p.db"))).await?;
    assert_eq!(
        left(reopened.stats(Some(&q)).await?),
        report.lost.len() as u64,
        "the failing side's jobs are not all still there"
    );
    reopened.close().await;
    other.close().await;
    Ok(())
}
