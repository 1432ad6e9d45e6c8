//! What the MySQL tests share: the server to test against, and a database (MySQL's
//! schema) of its own per test, so that tests run in parallel without seeing each other.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use queue_core::{ClaimStrategy, Error, Result};
use sqlx::{Connection, MySqlConnection};
use transport_mysql::{MySqlOptions, MySqlTransport};

/// The test server: `SWITCHYARD_TEST_MYSQL_URL`, by default the local MariaDB.
pub fn url() -> String {
    std::env::var("SWITCHYARD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// `None` when the server answers; otherwise why the tests skip (a failure under CI).
pub fn skip_reason() -> Option<String> {
    queue_core::conformance::skip_unless_reachable("MySQL/MariaDB", &url(), 3306)
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

pub fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::backend("mysql", false, e)
}

/// A database of its own, dropped (with everything in it) when this value is dropped.
#[derive(Debug)]
pub struct Database {
    pub name: String,
}

impl Database {
    /// A fresh, unique name; the first transport creates it. Databases that earlier,
    /// killed test runs left behind are dropped after an hour.
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
        let mut conn = MySqlConnection::connect(&url()).await.map_err(err)?;
        let stale: Vec<Vec<u8>> = sqlx::query_scalar(
            "SELECT CAST(schema_name AS BINARY) FROM information_schema.schemata WHERE schema_name LIKE 'sy\\_test\\_%'",
        )
        .fetch_all(&mut conn)
        .await
        .map_err(err)?;
        for s in stale {
            let s = String::from_utf8_lossy(&s).into_owned();
            let created = s
                .split('_')
                .nth(2)
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(u64::MAX);
            if created.saturating_add(3600) < secs {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{s}`"))
                    .execute(&mut conn)
                    .await;
            }
        }
        Ok(Database { name })
    }

    pub fn options(&self, claim: ClaimStrategy) -> MySqlOptions {
        MySqlOptions::new(url())
            .with_schema(self.name.clone())
            .with_claim(claim)
            .with_max_connections(4)
    }

    pub async fn open(&self, claim: ClaimStrategy) -> Result<Arc<MySqlTransport>> {
        Ok(Arc::new(
            MySqlTransport::connect(self.options(claim)).await?,
        ))
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut conn) = MySqlConnection::connect(&url()).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{name}`"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}
