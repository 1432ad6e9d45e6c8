//! Finding tenants: the databases of a server that hold a store.

use queue_core::connect::Endpoint;
use queue_core::{Identifier, Result};

use crate::error::SqlxResultExt;
use crate::MySqlOptions;

/// The databases of the server of `options.url` that hold a table named
/// `options.table`: the tenants a pattern (`QUEUE_SCHEMA=acme_*`) can match. Opens one
/// connection and creates nothing.
pub async fn databases_with_table(options: &MySqlOptions) -> Result<Vec<String>> {
    crate::connect::check_tls_settings(&options.url)?;
    let table = Identifier::table("QUEUE_TABLE", options.table.as_str())?;
    let connect = crate::connect::connect_options(&options.url)?;
    let endpoint = Endpoint::from_url("MySQL", options.url.expose(), 3306);
    let mut conn =
        crate::connect::first_connection(&connect, &endpoint, options.connect_timeout).await?;
    // CAST: information_schema's columns are utf8, and may come back as bytes.
    let databases: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(table_schema AS CHAR(64)) FROM information_schema.tables \
         WHERE table_name = ? AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .bind(table.as_str())
    .fetch_all(&mut conn)
    .await
    .backend()?;
    sqlx::Connection::close(conn).await.ok();
    Ok(databases)
}
