//! The shared conformance suite against PostgreSQL, with both claim strategies. Every
//! case gets a schema of its own in the test database.

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use queue_core::conformance::{Harness, OpenOptions, Store};
use queue_core::{ClaimStrategy, Error, Result, Transport};
use support::Schema;
use transport_pg::sqlx::{self, Connection};
use transport_pg::{PgOptions, PgTransport};

struct PgHarness {
    claim: ClaimStrategy,
}

struct PgStore {
    schema: Schema,
    claim: ClaimStrategy,
}

impl PgStore {
    fn options(&self, url: String, options: OpenOptions) -> PgOptions {
        PgOptions::new(url)
            .with_schema(self.schema.name.clone())
            .with_table(options.table)
            .with_claim(self.claim)
            .with_visibility_timeout(options.visibility_timeout)
            .with_max_connections(4)
    }
}

#[async_trait]
impl Harness for PgHarness {
    async fn store(&self) -> Result<Box<dyn Store>> {
        Ok(Box::new(PgStore {
            schema: Schema::fresh().await?,
            claim: self.claim,
        }))
    }

    fn skip_reason(&self) -> Option<String> {
        support::skip_reason()
    }
}

#[async_trait]
impl Store for PgStore {
    async fn open_with_status(
        &self,
        options: OpenOptions,
    ) -> Result<(
        Arc<dyn Transport>,
        Option<Arc<dyn queue_core::status::StatusStore>>,
    )> {
        let t = PgTransport::connect(self.options(support::url(), options)).await?;
        let status = t.status_store();
        Ok((Arc::new(t), Some(status)))
    }

    async fn open_unreachable(&self, options: OpenOptions) -> Result<Arc<dyn Transport>> {
        let url = "postgres://postgres@127.0.0.1:1/nowhere".to_owned();
        let t = PgTransport::connect(self.options(url, options)).await?;
        Ok(Arc::new(t))
    }

    async fn insert_raw(&self, table: &str, queue: &str, id: &str, body: &str) -> Result<()> {
        let err = |e| Error::backend("postgres", false, e);
        let mut conn = sqlx::PgConnection::connect(&support::url())
            .await
            .map_err(err)?;
        sqlx::query(&format!(
            "INSERT INTO \"{}\".\"{table}\" (id, queue, kind, available_at, visible_at, envelope) \
             VALUES ($1, $2, 'raw', now(), now(), $3)",
            self.schema.name
        ))
        .bind(id)
        .bind(queue)
        .bind(body)
        .execute(&mut conn)
        .await
        .map_err(err)?;
        Ok(())
    }
}

fn harness(claim: ClaimStrategy) -> Arc<dyn Harness> {
    Arc::new(PgHarness { claim })
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
