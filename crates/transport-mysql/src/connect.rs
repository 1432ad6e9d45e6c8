//! The first connection: TLS settings checked before it, bounded by the connect
//! timeout, and a failure reported as one line naming the server and the cause.
//!
//! The pool alone would retry a refused or hanging connection until its acquire timeout
//! and then say only "pool timed out while waiting for an open connection".

use std::time::Duration;

use queue_core::connect::{io_cause, tls_cause, Endpoint, TlsParams};
use queue_core::{ConfigError, Error, Result, SecretUrl};
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError};
use sqlx::Connection;
use sqlx::MySqlConnection;

use crate::error::TRANSPORT;

/// The TLS settings of a `mysql://` URL, by the names MySQL's clients and sqlx accept.
const TLS: TlsParams<'static> = TlsParams {
    setting: "DATABASE_URL",
    mode: &["ssl-mode", "sslmode"],
    modes: &[
        "DISABLED",
        "PREFERRED",
        "REQUIRED",
        "VERIFY_CA",
        "VERIFY_IDENTITY",
    ],
    tls_modes: &["REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"],
    ca: &["ssl-ca", "sslca"],
    cert: &["ssl-cert", "sslcert"],
    key: &["ssl-key", "sslkey"],
};

/// Checks the URL's TLS settings before any connection.
pub(crate) fn check_tls_settings(url: &SecretUrl) -> Result<()> {
    Ok(TLS.check(url.expose(), cfg!(feature = "tls"))?)
}

/// The driver's options for `url` (`mariadb://` read as `mysql://`), in utf8mb4.
pub(crate) fn connect_options(url: &SecretUrl) -> Result<MySqlConnectOptions> {
    use std::str::FromStr;
    let plain = url.expose().replacen("mariadb://", "mysql://", 1);
    Ok(MySqlConnectOptions::from_str(&plain)
        .map_err(|e| {
            ConfigError::new(
                "DATABASE_URL",
                Some(url.to_string()),
                format!("expected mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE ({e})"),
            )
        })?
        .charset("utf8mb4"))
}

/// Opens one connection within `timeout`, or fails naming the server and the cause.
pub(crate) async fn first_connection(
    options: &MySqlConnectOptions,
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<MySqlConnection> {
    match tokio::time::timeout(timeout, MySqlConnection::connect_with(options)).await {
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
            let number = db
                .try_downcast_ref::<MySqlDatabaseError>()
                .map_or(0, MySqlDatabaseError::number);
            let message = db.message();
            match number {
                // A user that REQUIRE SSL is refused the same way without TLS.
                1045 | 1698 => (
                    false,
                    format!("authentication refused: {message} (wrong user or password, or a user that requires TLS: ssl-mode=REQUIRED or stricter)"),
                ),
                1049 => (false, format!("the database does not exist: {message}")),
                1040 | 1129 => (true, format!("the server refuses connections for now: {message}")),
                _ => (false, format!("{message} (error {number})")),
            }
        }
        sqlx::Error::Configuration(e) => (false, format!("invalid connection settings: {e}")),
        other => (true, other.to_string()),
    };
    Error::backend(TRANSPORT, transient, format!("{endpoint}: {cause}"))
}
