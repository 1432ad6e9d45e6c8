//! The shared conformance suite against MySQL/MariaDB, with both claim strategies. Every
//! case gets a database of its own on the test server.

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use queue_core::conformance::{Harness, OpenOptions, Store};
use queue_core::{ClaimStrategy, Result, Transport};
use sqlx::Connection;
use support::Database;
use transport_mysql::{MySqlOptions, MySqlTransport};

struct MySqlHarness {
    claim: ClaimStrategy,
}

struct MySqlStore {
    db: Database,
    claim: ClaimStrategy,
}

impl MySqlStore {
    fn options(&self, url: String, options: OpenOptions) -> MySqlOptions {
        MySqlOptions::new(url)
            .with_schema(self.db.name.clone())
            .with_table(options.table)
            .with_claim(self.claim)
            .with_visibility_timeout(options.visibility_timeout)
            .with_max_connections(4)
    }
}

#[async_trait]
impl Harness for MySqlHarness {
    async fn store(&self) -> Result<Box<dyn Store>> {
        Ok(Box::new(MySqlStore {
            db: Database::fresh().await?,
            claim: self.claim,
        }))
    }

    fn skip_reason(&self) -> Option<String> {
        support::skip_reason()
    }
}

#[async_trait]
impl Store for MySqlStore {
    async fn open_with_status(
        &self,
        options: OpenOptions,
    ) -> Result<(
        Arc<dyn Transport>,
        Option<Arc<dyn queue_core::status::StatusStore>>,
    )> {
        let t = MySqlTransport::connect(self.options(support::url(), options)).await?;
        let status = t.status_store();
        Ok((Arc::new(t), Some(status)))
    }

    async fn open_unreachable(&self, options: OpenOptions) -> Result<Arc<dyn Transport>> {
        let url = "mysql://root@127.0.0.1:1/nowhere".to_owned();
        let t = MySqlTransport::connect(self.options(url, options)).await?;
        Ok(Arc::new(t))
    }

    async fn insert_raw(&self, table: &str, queue: &str, id: &str, body: &str) -> Result<()> {
        let mut conn = sqlx::MySqlConnection::connect(&support::url())
            .await
            .map_err(support::err)?;
        let now = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";
        sqlx::query(&format!(
            "INSERT INTO `{}`.`{table}` (id, queue, kind, available_at, visible_at, created_at, envelope) \
             VALUES (?, ?, 'raw', {now}, {now}, {now}, ?)",
            self.db.name
        ))
        .bind(id)
        .bind(queue)
        .bind(body)
        .execute(&mut conn)
        .await
        .map_err(support::err)?;
        Ok(())
    }
}

fn harness(claim: ClaimStrategy) -> Arc<dyn Harness> {
    Arc::new(MySqlHarness { claim })
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
