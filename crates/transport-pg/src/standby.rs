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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use queue_core::connect::Endpoint;
use queue_core::{Error, Result};
use sqlx::pool::PoolConnectionMetadata;
use sqlx::PgConnection;

use crate::TRANSPORT;

/// SQLSTATE of a write on a read-only server.
pub(crate) const READ_ONLY: &str = "25006";

/// When this process last saw 25006, in milliseconds since [`epoch`] (0: never). One
/// clock for every pool of the process: a pool on a healthy server only reconnects
/// once for nothing.
static READ_ONLY_SEEN: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Records that a statement failed with 25006.
pub(crate) fn saw_read_only() {
    READ_ONLY_SEEN.store(now_ms(), Ordering::Relaxed);
}

/// Whether a pooled connection of this age was opened before the last 25006: it may
/// point at the demoted server, so the pool drops it (`before_acquire`).
pub(crate) fn opened_before_read_only(age: Duration) -> bool {
    let seen = READ_ONLY_SEEN.load(Ordering::Relaxed);
    if seen == 0 {
        return false;
    }
    let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
    now_ms().saturating_sub(age_ms) <= seen
}

/// The pool's `before_acquire` check.
pub(crate) async fn still_usable(
    _conn: &mut PgConnection,
    meta: PoolConnectionMetadata,
) -> std::result::Result<bool, sqlx::Error> {
    Ok(!opened_before_read_only(meta.age))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connections_older_than_the_last_read_only_error_are_dropped() {
        std::thread::sleep(Duration::from_millis(5));
        saw_read_only();
        // Opened long ago: before the error.
        assert!(opened_before_read_only(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(5));
        // Opened just now: after it.
        assert!(!opened_before_read_only(Duration::ZERO));
    }
}
