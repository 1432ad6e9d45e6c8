//! What the PostgreSQL tests share: the server to test against, and a fresh schema per
//! test so that tests run in parallel without seeing each other.
#![allow(dead_code, unreachable_pub)]

pub mod server;

use std::sync::Arc;

use queue_core::{ClaimStrategy, Error, Result};
use transport_pg::sqlx::{self, Connection, PgConnection};
use transport_pg::{PgOptions, PgTransport};

/// The test server: `SWITCHYARD_TEST_PG_URL`, by default the local one.
pub fn url() -> String {
    std::env::var("SWITCHYARD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// `None` when the server answers; otherwise why the tests skip. Under `CI=true` an
/// unreachable server fails the test instead.
pub fn skip_reason() -> Option<String> {
    queue_core::conformance::skip_unless_reachable("PostgreSQL", &url(), 5432)
}

/// Runs `f` on a runtime of its own, within 240 s, unless the server is unreachable
/// outside CI (then the test says SKIPPED and why).
pub fn with_server<F, Fut>(f: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    if let Some(reason) = skip_reason() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(240), f())
                .await
                .expect("the test finished within 240 s")
                .expect("the test succeeded");
        });
}

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::backend("postgres", false, e)
}

/// A schema of its own, dropped (with everything in it) when this value is dropped.
#[derive(Debug)]
pub struct Schema {
    pub name: String,
}

impl Schema {
    /// A fresh, unique schema name; it is created by the first transport that uses it.
    /// Schemas that earlier, killed test runs left behind are dropped after an hour.
    pub async fn fresh() -> Result<Self> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = format!(
            "sy_test_{secs}_{}",
            uuid::Uuid::new_v4()
                .simple()
                .to_string()
                .get(..8)
                .unwrap_or("x")
        );
        let mut conn = PgConnection::connect(&url()).await.map_err(err)?;
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'sy\\_test\\_%'",
        )
        .fetch_all(&mut conn)
        .await
        .map_err(err)?;
        for s in stale {
            let created = s
                .split('_')
                .nth(2)
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(u64::MAX);
            if created.saturating_add(3600) < secs {
                let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{s}\" CASCADE"))
                    .execute(&mut conn)
                    .await;
            }
        }
        Ok(Schema { name })
    }

    pub fn options(&self, claim: ClaimStrategy) -> PgOptions {
        PgOptions::new(url())
            .with_schema(self.name.clone())
            .with_claim(claim)
            .with_max_connections(4)
    }

    pub async fn open(&self, claim: ClaimStrategy) -> Result<Arc<PgTransport>> {
        Ok(Arc::new(PgTransport::connect(self.options(claim)).await?))
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside async code; a thread with its own runtime does the I/O.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&url()).await {
                    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}
