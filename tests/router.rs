//! The shared conformance suite against the migration router, over two SQLite stores
//! with half of the publishes sent to each (a 50% canary): every rule of the contract
//! holds across the pair, each message settled on the store it came from.

#![cfg(feature = "sqlite")]

use std::sync::Arc;

use async_trait::async_trait;
use queue_core::conformance::{Harness, OpenOptions, Store};
use queue_core::{BackendKind, Error, Result, Transport};
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

    async fn side(&self, url: String, options: &OpenOptions) -> Result<Arc<dyn Transport>> {
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
    async fn open(&self, options: OpenOptions) -> Result<Arc<dyn Transport>> {
        let primary = self.side(self.url("primary.db"), &options).await?;
        let other = self.side(self.url("other.db"), &options).await?;
        Ok(Arc::new(Router::new(primary, BackendKind::Exec, other, 50)))
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
