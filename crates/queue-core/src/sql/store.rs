//! What every SQL store checks: schema versions, settings before connecting, and the
//! capabilities they share.

use std::time::Duration;

use crate::capabilities::Capabilities;
use crate::error::{ConfigError, Error, Result};
use crate::names::Identifier;
use crate::redact::{unsupported_secret_param, SecretUrl};

/// Refuses a table whose newest applied schema version (`newest`, from the migration
/// ledger) is beyond the `known` versions of this build: an older build misreads a newer
/// schema, and could for example claim messages that newer workers hold.
pub fn check_schema_version(table: &str, newest: Option<i64>, known: i64) -> Result<()> {
    match newest {
        Some(newest) if newest > known => Err(ConfigError::new(
            "QUEUE_TABLE",
            Some(table.to_owned()),
            format!(
                "a table at schema version {known} or older; this one is at version {newest}, \
                 written by a newer switchyard: upgrade this build (an older one could claim \
                 messages twice)"
            ),
        )
        .into()),
        _ => Ok(()),
    }
}

/// The error of an open that must not create anything (read-only tools) and found part
/// of the store missing: names the setting that points at it (`QUEUE_SCHEMA`), its value,
/// what is accepted, what is missing, and that nothing was created.
pub fn missing_store(setting: &str, value: &str, accepted: &str, missing: &str) -> Error {
    ConfigError::new(
        setting,
        Some(value.to_owned()),
        format!(
            "{accepted}; {missing} (nothing was created): run `switchyard migrate` to create it, or check QUEUE_SCHEMA / QUEUE_TABLE"
        ),
    )
    .into()
}

/// For an open that must not migrate (read-only tools): the table must be at exactly
/// this build's schema version. An older one is refused rather than read, since this
/// build's statements name columns and tables (the status table) that the older schema
/// lacks, and upgrading it is `switchyard migrate`'s job, not a reader's.
pub fn check_existing_version(table: &str, newest: Option<i64>, known: i64) -> Result<()> {
    check_schema_version(table, newest, known)?;
    match newest {
        Some(newest) if newest >= known => Ok(()),
        found => Err(ConfigError::new(
            "QUEUE_TABLE",
            Some(table.to_owned()),
            format!(
                "a table at schema version {known}; this one is at {} (nothing was changed): run `switchyard migrate` to upgrade it",
                found.map_or_else(
                    || "no recorded version".to_owned(),
                    |v| format!("version {v}")
                )
            ),
        )
        .into()),
    }
}

/// What a server-backed SQL transport checks before it connects.
#[derive(Debug, Clone, Copy)]
pub struct StoreSettings<'a> {
    /// The backend's name in errors (`PostgreSQL`).
    pub backend: &'a str,
    /// The URL schemes it accepts.
    pub schemes: &'a [&'a str],
    /// The URL's form, for errors (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`).
    pub url_form: &'a str,
    /// `DATABASE_URL`.
    pub url: &'a SecretUrl,
    /// `QUEUE_TABLE`.
    pub table: &'a str,
    /// `QUEUE_SCHEMA`.
    pub schema: Option<&'a str>,
    /// `QUEUE_VISIBILITY_TIMEOUT`.
    pub lease: Duration,
    /// The pool size.
    pub max_connections: u32,
}

impl StoreSettings<'_> {
    /// Validates the settings, raising configuration errors before any connection is
    /// made: the table and schema names, the lease, the URL's scheme, and no password-like
    /// URL parameter the driver would log. Returns the table and schema names.
    pub fn validate(&self) -> Result<(String, Option<String>)> {
        let table = Identifier::table("QUEUE_TABLE (table)", self.table)?;
        let schema = self
            .schema
            .map(|s| Identifier::new("QUEUE_SCHEMA (schema)", s))
            .transpose()?;
        if self.lease < Duration::from_millis(100) {
            return Err(ConfigError::new(
                "QUEUE_VISIBILITY_TIMEOUT",
                Some(format!("{:?}", self.lease)),
                "expected a lease of at least 100ms",
            )
            .into());
        }
        let url_error = |expected: String| -> Error {
            ConfigError::new("DATABASE_URL", Some(self.url.to_string()), expected).into()
        };
        if !self.schemes.contains(&self.url.scheme().as_str()) {
            return Err(url_error(format!(
                "expected {} for the {} transport",
                self.url_form, self.backend
            )));
        }
        if let Some(param) = unsupported_secret_param(self.url.expose(), &["password"]) {
            return Err(url_error(format!(
                "the {} transport does not support the query parameter `{param}` (the driver would log its value); put the password in the URL's user info",
                self.backend
            )));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::new(
                "max_connections",
                Some("0".into()),
                "expected at least 1 connection",
            )
            .into());
        }
        Ok((
            table.as_str().to_owned(),
            schema.map(|s| s.as_str().to_owned()),
        ))
    }
}

/// What every SQL transport promises: exact FIFO, priorities, exact delays, lease
/// extension, idempotent publish, expiry, table isolation, transactional publish,
/// crashes that charge only started messages, label claims, recorded holders, ordering
/// keys, and upkeep off the claim path.
pub fn sql_capabilities(max_payload_bytes: usize) -> Capabilities {
    Capabilities {
        exact_fifo: true,
        priorities: true,
        exact_delays: true,
        lease_extension: true,
        lease_expiry: true,
        exact_claims: true,
        idempotent_publish: true,
        expiry: true,
        table_isolation: true,
        transactional_publish: true,
        delayed_stats: true,
        charges_only_started: true,
        wake_signal: true,
        label_claims: true,
        holders: true,
        ordering_keys: true,
        unique_keys: true,
        limits: true,
        limit_parking: true,
        checkpoints: true,
        upkeep: true,
        unique_replace: true,
        max_payload_bytes,
        ..Capabilities::default()
    }
}

/// The tables a store's migration `scripts` create, in order, as the scripts name them
/// (the default name, quoted: `"switchyard_jobs_dead"`): what dropping the store drops,
/// read from the scripts so that a table a later migration adds is never left behind.
pub fn created_tables<'a>(scripts: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    const CREATE: &str = "CREATE TABLE IF NOT EXISTS ";
    let mut tables: Vec<&str> = Vec::new();
    for script in scripts {
        for (at, _) in script.match_indices(CREATE) {
            let rest = &script[at + CREATE.len()..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '(')
                .unwrap_or(rest.len());
            let name = &rest[..end];
            if !name.is_empty() && !tables.contains(&name) {
                tables.push(name);
            }
        }
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_the_scripts_create_is_named_once() {
        let scripts = [
            "CREATE TABLE IF NOT EXISTS \"switchyard_jobs\" (\n seq bigint);\n\
             CREATE TABLE IF NOT EXISTS \"switchyard_jobs_dead\"(id text);",
            "-- a comment\nCREATE TABLE IF NOT EXISTS `switchyard_jobs_keys` (q int);\n\
             CREATE TABLE IF NOT EXISTS \"switchyard_jobs_dead\" (id text);",
        ];
        assert_eq!(
            created_tables(scripts),
            [
                "\"switchyard_jobs\"",
                "\"switchyard_jobs_dead\"",
                "`switchyard_jobs_keys`"
            ]
        );
    }

    #[test]
    fn schemas_newer_than_the_build_are_refused() {
        assert!(check_schema_version("jobs", None, 2).is_ok());
        assert!(check_schema_version("jobs", Some(2), 2).is_ok());
        let err = check_schema_version("jobs", Some(3), 2)
            .expect_err("a newer schema is refused")
            .to_string();
        assert!(
            err.contains("QUEUE_TABLE") && err.contains("version 3"),
            "{err}"
        );
        assert!(err.contains("upgrade"), "{err}");
    }

    #[test]
    fn read_only_opens_refuse_older_and_unversioned_schemas() {
        assert!(check_existing_version("jobs", Some(3), 3).is_ok());
        for (found, says) in [(Some(2), "version 2"), (None, "no recorded version")] {
            let err = check_existing_version("jobs", found, 3)
                .expect_err("an older schema is refused")
                .to_string();
            assert!(
                err.contains(says) && err.contains("switchyard migrate"),
                "{err}"
            );
            assert!(err.contains("nothing was changed"), "{err}");
        }
        assert!(check_existing_version("jobs", Some(4), 3).is_err());
    }
}
