//! A server that is not the primary: a hot standby after a failover, or a URL that
//! points at a replica. Its writes fail with SQLSTATE 25006 ("read-only transaction").
//!
//! At connect time such a server is refused with a message that says so. Later, a
//! connection that hits 25006 is stale (its server was demoted, or a failover moved the
//! primary elsewhere): the error is transient, and every connection opened before it is
//! dropped at its next checkout, so that the pool reconnects instead of sending every
//! retry back to the read-only server. A new connection that lands on a standby is
//! refused by the pool's `after_connect` check, so the pool keeps retrying until a
//! primary answers at the URL.

use queue_core::connect::Endpoint;
use queue_core::{Error, Result};
use sqlx::pool::PoolConnectionMetadata;
use sqlx::PgConnection;

use crate::error::TRANSPORT;
use crate::read_only;

/// The pool's `before_acquire` check.
pub(crate) async fn still_usable(
    _conn: &mut PgConnection,
    meta: PoolConnectionMetadata,
) -> std::result::Result<bool, sqlx::Error> {
    Ok(!read_only::opened_before_read_only(meta.age))
}

/// The pool's `after_connect` check: a standby is no connection for a queue.
pub(crate) async fn refuse_standby_conn(
    conn: &mut PgConnection,
) -> std::result::Result<(), sqlx::Error> {
    if in_recovery(conn).await? {
        return Err(sqlx::Error::Protocol(
            "the server is a hot standby (read-only, in recovery): waiting for a primary".into(),
        ));
    }
    Ok(())
}

async fn in_recovery(conn: &mut PgConnection) -> std::result::Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(conn)
        .await
}

/// Refuses a standby at connect time, saying what it is and what to do.
pub(crate) async fn refuse_standby(conn: &mut PgConnection, endpoint: &Endpoint) -> Result<()> {
    match in_recovery(conn).await {
        Ok(false) => Ok(()),
        Ok(true) => Err(Error::backend(
            TRANSPORT,
            false,
            format!(
                "{endpoint} is a hot standby (read-only, in recovery): point DATABASE_URL at the primary (the writer endpoint)"
            ),
        )),
        Err(err) => Err(Error::backend(
            TRANSPORT,
            true,
            format!("{endpoint}: could not ask whether it is a standby: {err}"),
        )),
    }
}
