use std::time::Duration;

use queue_core::{
    ClaimStrategy, Config, SecretUrl, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_VISIBILITY_TIMEOUT,
};

/// How hard SQLite syncs commits to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SqliteSynchronous {
    /// Every commit is on disk before it returns (SQLite's `FULL`): no acknowledged
    /// publish or ack is lost on power failure. The default.
    #[default]
    Full,
    /// Commits survive a crash of the process but not of the machine (`NORMAL` in WAL
    /// mode); several times faster on slow disks.
    Normal,
}

/// Options of a [`SqliteTransport`](crate::SqliteTransport).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// `sqlite://PATH` (created when missing) or `sqlite::memory:`.
    pub url: SecretUrl,
    /// Table name (`QUEUE_TABLE`); the dead letters live in `<table>_dead`.
    pub table: String,
    /// `QUEUE_SCHEMA`: SQLite has none, so any value is a configuration error.
    pub schema: Option<String>,
    /// Claim strategy (`QUEUE_CLAIM`).
    pub claim: ClaimStrategy,
    /// Lease of a reservation (`QUEUE_VISIBILITY_TIMEOUT`).
    pub visibility_timeout: Duration,
    /// How long a statement waits for another process's write lock.
    pub busy_timeout: Duration,
    /// Durability of commits.
    pub synchronous: SqliteSynchronous,
    /// The largest encoded envelope accepted.
    pub max_payload_bytes: usize,
    /// Create the database file and the tables when missing and apply pending
    /// migrations (the default). Read-only tools turn this off, so that a mistyped path
    /// or `QUEUE_TABLE` is an error naming it instead of a new empty database or table;
    /// a table at another schema version is an error too. (An in-memory database is
    /// always created: it cannot exist before.)
    pub create_if_missing: bool,
    /// How often idle workers look for publishes of other processes on the file (the
    /// files' `stat`, and `PRAGMA data_version` after a change; see `watch.rs`): 2 ms by
    /// default; `None` leaves those publishes to the workers' polling, 20 ms backing off
    /// to 1 s. `QUEUE_WATCH` sets it from the environment.
    pub watch: Option<Duration>,
}

impl SqliteOptions {
    /// Options for `url` with the contract's defaults.
    pub fn new(url: impl Into<String>) -> Self {
        SqliteOptions {
            url: SecretUrl::new(url),
            table: Config::DEFAULT_TABLE.into(),
            schema: None,
            claim: ClaimStrategy::default(),
            visibility_timeout: DEFAULT_VISIBILITY_TIMEOUT,
            busy_timeout: Duration::from_secs(30),
            synchronous: SqliteSynchronous::default(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            create_if_missing: true,
            watch: Some(Duration::from_millis(2)),
        }
    }

    /// Options from the environment configuration.
    pub fn from_config(config: &Config) -> Self {
        SqliteOptions {
            url: config.database_url.clone(),
            table: config.table.as_str().into(),
            schema: config.schema.as_ref().map(|s| s.as_str().into()),
            claim: config.claim,
            visibility_timeout: config.visibility_timeout,
            watch: config
                .watch
                .unwrap_or(SqliteOptions::new(config.database_url.expose()).watch),
            ..SqliteOptions::new(config.database_url.expose())
        }
    }

    /// Sets the table.
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets the claim strategy.
    pub fn with_claim(mut self, claim: ClaimStrategy) -> Self {
        self.claim = claim;
        self
    }

    /// Sets the lease of a reservation.
    pub fn with_visibility_timeout(mut self, lease: Duration) -> Self {
        self.visibility_timeout = lease;
        self
    }

    /// Sets how long a statement waits for another process's write lock.
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets whether a missing database file or table is created (and migrations
    /// applied).
    pub fn with_create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Sets how often idle workers look for other processes' publishes (`None`: only
    /// by polling).
    pub fn with_watch(mut self, every: Option<Duration>) -> Self {
        self.watch = every;
        self
    }

    /// Sets the durability of commits.
    pub fn with_synchronous(mut self, synchronous: SqliteSynchronous) -> Self {
        self.synchronous = synchronous;
        self
    }
}
