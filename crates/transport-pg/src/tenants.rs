//! Finding tenants: the schemas of a database that hold a store.

use queue_core::connect::Endpoint;
use queue_core::{Identifier, Result};

use crate::error::SqlxResultExt;
use crate::PgOptions;

/// The schemas of the database of `options.url` that hold a table named
/// `options.table`: the tenants a pattern (`QUEUE_SCHEMA=acme_*`) can match. Opens one
/// connection and creates nothing.
pub async fn schemas_with_table(options: &PgOptions) -> Result<Vec<String>> {
    crate::connect::check_tls_settings(&options.url)?;
    let table = Identifier::table("QUEUE_TABLE", options.table.as_str())?;
    let connect = crate::connect::connect_options(&options.url)?;
    let endpoint = Endpoint::from_url("PostgreSQL", options.url.expose(), 5432);
    let mut conn =
        crate::connect::first_connection(&connect, &endpoint, options.connect_timeout).await?;
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT table_schema::text FROM information_schema.tables \
         WHERE table_name = $1 AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .bind(table.as_str())
    .fetch_all(&mut conn)
    .await
    .backend()?;
    sqlx::Connection::close(conn).await.ok();
    Ok(schemas)
}
