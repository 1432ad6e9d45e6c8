use std::time::Duration;

use queue_core::{
    ClaimStrategy, Config, SecretUrl, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_VISIBILITY_TIMEOUT,
};

/// Options of a [`MySqlTransport`](crate::MySqlTransport).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MySqlOptions {
    /// `mysql://user:password@host:port/database` (also `mariadb://`).
    pub url: SecretUrl,
    /// Table name (`QUEUE_TABLE`); the dead letters live in `<table>_dead`.
    pub table: String,
    /// Schema (`QUEUE_SCHEMA`), MySQL's database, for per-tenant isolation; created when
    /// missing (unless [`create`](Self::create) is off). `None` uses the database of the URL.
    pub schema: Option<String>,
    /// Claim strategy (`QUEUE_CLAIM`).
    pub claim: ClaimStrategy,
    /// Lease of a reservation (`QUEUE_VISIBILITY_TIMEOUT`).
    pub visibility_timeout: Duration,
    /// Connections in the pool.
    pub max_connections: u32,
    /// How long one attempt to open a connection (TCP, TLS, login) may take
    /// (`QUEUE_CONNECT_TIMEOUT`). The first connection that fails is reported at once
    /// with the host, port and cause, instead of after `acquire_timeout`.
    pub connect_timeout: Duration,
    /// How long an operation waits for a pooled connection (and a connection attempt
    /// lasts) before it fails with a transient error.
    pub acquire_timeout: Duration,
    /// How often a statement that lost a deadlock or a lock wait (errors 1213, 1205) is
    /// run again, with a bounded backoff, before the error reaches the caller.
    pub lock_retries: u32,
    /// The largest encoded envelope accepted.
    pub max_payload_bytes: usize,
    /// Create the schema and tables when missing and apply pending migrations on
    /// connect (the default). Off, for tools that only read or manage an existing store,
    /// connect creates and changes nothing: a missing schema or table, or one at another
    /// schema version, is a [`Config`](queue_core::Error::Config) error naming it.
    pub create: bool,
    /// How often, from the first worker on, the transport reads the newest row's seq to
    /// wake its idle workers on publishes of other processes (MySQL has no `NOTIFY`).
    /// `None` leaves those to the workers' own polling (20 ms to 1 s by default).
    pub watch: Option<Duration>,
}

impl MySqlOptions {
    /// Options for `url` with the contract's defaults.
    pub fn new(url: impl Into<String>) -> Self {
        MySqlOptions {
            url: SecretUrl::new(url),
            table: Config::DEFAULT_TABLE.into(),
            schema: None,
            claim: ClaimStrategy::default(),
            visibility_timeout: DEFAULT_VISIBILITY_TIMEOUT,
            max_connections: 10,
            connect_timeout: Config::DEFAULT_CONNECT_TIMEOUT,
            acquire_timeout: Duration::from_secs(10),
            lock_retries: 10,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            create: true,
            watch: Some(Duration::from_millis(20)),
        }
    }

    /// Options from the environment configuration.
    pub fn from_config(config: &Config) -> Self {
        MySqlOptions {
            table: config.table.as_str().into(),
            schema: config.schema.as_ref().map(|s| s.as_str().into()),
            claim: config.claim,
            visibility_timeout: config.visibility_timeout,
            connect_timeout: config.connect_timeout,
            watch: config
                .watch
                .unwrap_or(MySqlOptions::new(config.database_url.expose()).watch),
            ..MySqlOptions::new(config.database_url.expose())
        }
    }

    /// Sets whether connect creates and migrates the store (`true`, the default) or
    /// only opens an existing one, creating nothing.
    pub fn with_create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets how long one connection attempt may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the table.
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets the schema.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
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

    /// Sets the pool size.
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets how often idle workers' wake-ups for other processes' publishes are checked
    /// (`None`: never, the workers poll).
    pub fn with_watch(mut self, every: Option<Duration>) -> Self {
        self.watch = every;
        self
    }

    /// Sets how long an operation waits for a connection.
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }
}
