//! The first connection: TLS settings checked before it, bounded by the connect
//! timeout, and a failure reported as one line naming the server and the cause.
//!
//! The pool alone would retry a refused or hanging connection until its acquire timeout
//! and then say only "pool timed out while waiting for an open connection".

use std::time::Duration;

use queue_core::connect::{io_cause, tls_cause, Endpoint, TlsParams};
use queue_core::{ConfigError, Error, Result, SecretUrl};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection;

use crate::error::TRANSPORT;

/// The TLS settings of a `postgres://` URL, by the names libpq and sqlx accept.
const TLS: TlsParams<'static> = TlsParams {
    setting: "DATABASE_URL",
    mode: &["sslmode", "ssl-mode"],
    modes: &[
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ],
    tls_modes: &["require", "verify-ca", "verify-full"],
    ca: &["sslrootcert", "ssl-root-cert", "ssl-ca"],
    cert: &["sslcert", "ssl-cert"],
    key: &["sslkey", "ssl-key"],
};

/// Checks the URL's TLS settings before any connection.
pub(crate) fn check_tls_settings(url: &SecretUrl) -> Result<()> {
    Ok(TLS.check(url.expose(), cfg!(feature = "tls"))?)
}

/// The driver's options for `url`, named `switchyard` in `pg_stat_activity`.
pub(crate) fn connect_options(url: &SecretUrl) -> Result<PgConnectOptions> {
    use std::str::FromStr;
    Ok(PgConnectOptions::from_str(url.expose())
        .map_err(|e| {
            ConfigError::new(
                "DATABASE_URL",
                Some(url.to_string()),
                format!("expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE ({e})"),
            )
        })?
        .application_name("switchyard"))
}

/// Opens one connection within `timeout`, or fails naming the server and the cause.
pub(crate) async fn first_connection(
    options: &PgConnectOptions,
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<PgConnection> {
    match tokio::time::timeout(timeout, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(describe(endpoint, err)),
        Err(_) => Err(Error::backend(TRANSPORT, true, endpoint.no_answer(timeout))),
    }
}

/// A failed connection attempt as one line: the server, then what went wrong.
fn describe(endpoint: &Endpoint, err: sqlx::Error) -> Error {
    let (transient, cause) = match &err {
        sqlx::Error::Io(io) => (true, io_cause(io)),
        sqlx::Error::Tls(tls) => (false, tls_cause(&tls.to_string())),
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = db.message();
            match code.as_str() {
                // 28000 is also pg_hba.conf turning the connection away, whose message
                // says why ("no encryption" for a TLS-only role).
                "28P01" | "28000" => (false, format!("authentication refused: {message}")),
                "3D000" => (false, format!("the database does not exist: {message}")),
                "57P03" | "53300" => (
                    true,
                    format!("the server refuses connections for now: {message}"),
                ),
                _ => (false, format!("{message} (SQLSTATE {code})")),
            }
        }
        sqlx::Error::Configuration(e) => (false, format!("invalid connection settings: {e}")),
        other => (true, other.to_string()),
    };
    Error::backend(TRANSPORT, transient, format!("{endpoint}: {cause}"))
}
