//! The shared conformance suite against SQLite, with both claim strategies. Every case
//! gets its own database file in a temporary directory.

use std::sync::Arc;

use async_trait::async_trait;
use queue_core::conformance::{Harness, OpenOptions, Store};
use queue_core::{ClaimStrategy, Error, Result, Transport};
use sqlx::Connection;
use transport_sqlite::{SqliteOptions, SqliteTransport};

struct SqliteHarness {
    claim: ClaimStrategy,
}

struct SqliteStore {
    dir: tempfile::TempDir,
    claim: ClaimStrategy,
}

impl SqliteStore {
    fn url(&self) -> String {
        format!("sqlite://{}", self.dir.path().join("queue.db").display())
    }

    fn options(&self, url: String, options: OpenOptions) -> SqliteOptions {
        SqliteOptions::new(url)
            .with_table(options.table)
            .with_claim(self.claim)
            .with_visibility_timeout(options.visibility_timeout)
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn store(&self) -> Result<Box<dyn Store>> {
        let dir = tempfile::tempdir().map_err(|e| Error::backend("sqlite", false, e))?;
        Ok(Box::new(SqliteStore {
            dir,
            claim: self.claim,
        }))
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn open_with_status(
        &self,
        options: OpenOptions,
    ) -> Result<(
        Arc<dyn Transport>,
        Option<Arc<dyn queue_core::status::StatusStore>>,
    )> {
        let t = SqliteTransport::connect(self.options(self.url(), options)).await?;
        let status = t.status_store();
        Ok((Arc::new(t), Some(status)))
    }

    async fn open_unreachable(&self, options: OpenOptions) -> Result<Arc<dyn Transport>> {
        let url = format!(
            "sqlite://{}",
            self.dir.path().join("missing-dir").join("x.db").display()
        );
        let t = SqliteTransport::connect(self.options(url, options)).await?;
        Ok(Arc::new(t))
    }

    async fn insert_raw(&self, table: &str, queue: &str, id: &str, body: &str) -> Result<()> {
        let mut conn = sqlx::SqliteConnection::connect(&self.url())
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

fn harness(claim: ClaimStrategy) -> Arc<dyn Harness> {
    Arc::new(SqliteHarness { claim })
}

mod skip_locked {
    queue_core::conformance_tests!(super::harness(queue_core::ClaimStrategy::SkipLocked));
}

mod optimistic {
    queue_core::conformance_tests!(super::harness(queue_core::ClaimStrategy::Optimistic));
}

mod status {
    queue_core::status_tests!(super::harness(queue_core::ClaimStrategy::SkipLocked));
}
