//! Serving several tenants from one process: each tenant's configuration, found from
//! `QUEUE_SCHEMA`'s names and patterns (see [`queue_core::tenants`] for where each
//! backend keeps a tenant).
//!
//! ```no_run
//! # async fn run() -> switchyard::Result<()> {
//! use switchyard::worker::{Worker, WorkerOptions};
//! let config = switchyard::Config::from_env()?; // QUEUE_SCHEMA=acme,globex
//! for tenant in switchyard::tenants::tenant_configs(&config).await? {
//!     let jobs = switchyard::connect_jobs(&tenant).await?;
//!     let queue = switchyard::QueueName::new("emails")?;
//!     // Worker::for_jobs takes the tenant from `jobs`: JobContext::tenant() says it.
//!     let worker = Worker::for_jobs(&jobs, queue, WorkerOptions::default());
//!     # drop(worker);
//! }
//! # Ok(()) }
//! ```

use std::path::{Component, Path, PathBuf};

pub use queue_core::tenants::{fill, in_path, is_template, PLACEHOLDER};
use queue_core::{BackendKind, Config, ConfigError, Identifier, Result};

/// The configuration of each tenant `config` selects, sorted by name: the one tenant
/// (or none) of a plain `QUEUE_SCHEMA`, or the names of a list and the tenants that its
/// patterns match in the store (found anew on each call, so a caller that calls again
/// finds tenants added since). Patterns may match none yet: the list is then empty.
///
/// # Errors
/// [`Error::Config`](queue_core::Error::Config) when patterns cannot be looked up
/// (where tenants are RabbitMQ vhosts without a SQL store, or databases of their own
/// behind `{tenant}` in a server's URL), and what the lookup's connection reports.
pub async fn tenant_configs(config: &Config) -> Result<Vec<Config>> {
    let Some(selection) = &config.tenants else {
        return Ok(vec![config.clone()]);
    };
    let mut names: Vec<String> = selection
        .names
        .iter()
        .map(|n| n.as_str().to_owned())
        .collect();
    if !selection.patterns.is_empty() {
        let found = find(config).await?;
        names.extend(found.into_iter().filter(|n| selection.matches(n)));
    }
    names.sort();
    names.dedup();
    Ok(names
        .iter()
        // A schema or database named unlike a tenant (`acme-eu`) is not one.
        .filter_map(|n| Identifier::new("QUEUE_SCHEMA", n.as_str()).ok())
        .map(|n| config.for_tenant(&n))
        .collect())
}

/// Every tenant the store holds, whatever its name.
async fn find(config: &Config) -> Result<Vec<String>> {
    let url = config.database_url.expose();
    let scheme = config.database_url.scheme();
    let refuse = |why: &str| -> queue_core::Error {
        ConfigError::new(
            "QUEUE_SCHEMA",
            config.tenants.as_ref().map(ToString::to_string),
            format!("tenant names rather than patterns: {why}"),
        )
        .into()
    };
    if config.backend == BackendKind::RabbitMq && !config.database_url_set {
        return Err(refuse(
            "RabbitMQ cannot list its vhosts over AMQP, and no SQL store (DATABASE_URL) holds the tenants' schemas",
        ));
    }
    if scheme == "sqlite" {
        return sqlite_stores(config).await;
    }
    if is_template(url) {
        return Err(refuse(
            "with {tenant} in a server's DATABASE_URL each tenant is a database of its own, which switchyard does not list",
        ));
    }
    match scheme.as_str() {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            transport_pg::schemas_with_table(&crate::PgOptions::from_config(config)).await
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            transport_mysql::databases_with_table(&crate::MySqlOptions::from_config(config)).await
        }
        _ => Err(refuse(&format!(
            "this build cannot look up tenants in a {scheme} store"
        ))),
    }
}

/// The tenants of a SQLite URL with `{tenant}` in its path: the files that exist and
/// hold `QUEUE_TABLE`.
async fn sqlite_stores(config: &Config) -> Result<Vec<String>> {
    let mut stores = Vec::new();
    for (name, path) in sqlite_files(config)? {
        #[cfg(feature = "sqlite")]
        let holds = transport_sqlite::holds_table(&path, config.table.as_str()).await;
        #[cfg(not(feature = "sqlite"))]
        let holds: Result<bool> = {
            let _ = path;
            Ok(false)
        };
        match holds {
            Ok(true) => stores.push(name),
            Ok(false) => {}
            Err(err) => tracing::debug!(tenant = name, error = %err, "not a tenant's store"),
        }
    }
    Ok(stores)
}

/// The files that fit a SQLite URL with `{tenant}` in its path, with the tenant each
/// names.
fn sqlite_files(config: &Config) -> Result<Vec<(String, PathBuf)>> {
    let url = config
        .database_url
        .expose()
        .replace("%7btenant%7d", PLACEHOLDER)
        .replace("%7Btenant%7D", PLACEHOLDER);
    let url = url.as_str();
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let path = path.split('?').next().unwrap_or(path);
    let template = Path::new(path);
    let parts: Vec<String> = template
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let at = parts.iter().position(|p| p.contains(PLACEHOLDER));
    let Some(at) = at.filter(|_| parts.iter().filter(|p| p.contains(PLACEHOLDER)).count() == 1)
    else {
        return Err(ConfigError::new(
            "DATABASE_URL",
            Some(config.database_url.to_string()),
            "a SQLite path with {tenant} once (sqlite://data/{tenant}.db) for a pattern in QUEUE_SCHEMA to find tenants by",
        )
        .into());
    };
    let (before, after) = parts[at]
        .split_once(PLACEHOLDER)
        .unwrap_or((parts[at].as_str(), ""));
    let from_end = parts.len() - 1 - at;
    let pattern: PathBuf = template
        .components()
        .enumerate()
        .map(|(i, c)| match (i == at, c) {
            (true, _) => format!(
                "{}*{}",
                glob::Pattern::escape(before),
                glob::Pattern::escape(after)
            ),
            (false, Component::Normal(p)) => glob::Pattern::escape(&p.to_string_lossy()),
            (false, other) => other.as_os_str().to_string_lossy().into_owned(),
        })
        .collect();
    let paths = glob::glob(&pattern.to_string_lossy()).map_err(|e| {
        ConfigError::new(
            "DATABASE_URL",
            Some(config.database_url.to_string()),
            format!("a SQLite path that makes a file pattern ({e})"),
        )
    })?;
    let mut names = Vec::new();
    for path in paths.flatten() {
        let comps: Vec<String> = path
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let Some(part) = comps.len().checked_sub(from_end + 1).map(|i| &comps[i]) else {
            continue;
        };
        let name = part
            .strip_prefix(before)
            .and_then(|rest| rest.strip_suffix(after));
        // Files whose middle is not a tenant name (a backup, say) are not tenants.
        if let Some(name) = name.filter(|n| Identifier::new("tenant", *n).is_ok()) {
            names.push((name.to_owned(), path.clone()));
        }
    }
    Ok(names)
}
