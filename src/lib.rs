//! Switchyard: durable background jobs and messages behind one [`Transport`] trait, over
//! SQLite (the embedded default), PostgreSQL, MySQL/MariaDB and RabbitMQ.
//!
//! Pick backends with Cargo features (`sqlite` by default), build a transport from the
//! environment with [`connect`], and publish, reserve and ack:
//!
//! ```
//! use switchyard::{Config, Envelope, QueueName, TransportExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> switchyard::Result<()> {
//! # let dir = tempfile::tempdir().expect("a temporary directory");
//! # let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
//! // In production this comes from `Config::from_env()` (DATABASE_URL, QUEUE_* …).
//! let config = Config::from_lookup(|var| (var == "DATABASE_URL").then(|| url.clone()))?;
//! let transport = switchyard::connect(&config).await?;
//!
//! let invoice = Envelope::builder("invoices", "send_invoice")
//!     .payload(&serde_json::json!({ "customer": 42, "amount_cents": 1999 }))
//!     .build()?;
//! transport.publish(invoice).await?;
//!
//! let queue = QueueName::new("invoices")?;
//! if let Some(job) = transport.reserve(&queue).await? {
//!     let data: serde_json::Value = job.envelope.payload_as()?;
//!     assert_eq!(data["customer"], 42);
//!     transport.ack(&job).await?; // done: the message is removed
//! }
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

pub use queue_core::schedule::{Cadence, CatchUp, Schedule};
pub use queue_core::sql::ClaimCounters;
/// The worker runtime: handlers by kind, retries, heartbeats, graceful shutdown.
pub use queue_core::status::{JobState, JobStatus, Jobs, StatusStore, WaitError};
pub use queue_core::tenants::TenantSelection;
pub use queue_core::{
    checkpoint, job_log, labels, metrics, schedule, status, trace_context, worker,
};
pub use queue_core::{
    parse_duration, reason, redact_url, AckReport, BackendKind, CancellationToken, Capabilities,
    Claim, ClaimStrategy, Config, ConfigError, Controls, DeadLetter, DeadLetters, DeadSelection,
    DecodeError, DrainSetting, Duplicate, Envelope, EnvelopeBuilder, Error, GiveBack,
    HeldSelection, Holding, Holdings, Identifier, LeaseToken, Limit, LimitBy, LimitStore,
    LimitUsage, OnConflict, Paused, Published, QueueName, QueueStats, Receipt, Reservation, Result,
    Scope, SecretUrl, Start, Transport, TransportExt, Unique, UniqueScope,
    DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_VISIBILITY_TIMEOUT, ENVELOPE_VERSION,
};

mod router;
pub use router::{canary_side, Router};
pub mod tenants;

#[cfg(feature = "otlp")]
#[cfg_attr(docsrs, doc(cfg(feature = "otlp")))]
pub mod otlp;

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use transport_sqlite::{SqliteInbox, SqliteOptions, SqliteSynchronous, SqliteTransport};

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use transport_pg::{PgInbox, PgOptions, PgTransport};

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use transport_mysql::{MySqlInbox, MySqlOptions, MySqlTransport, ServerInfo};

#[cfg(all(feature = "mysql", not(feature = "postgres")))]
pub use transport_mysql::sqlx;
/// The sqlx that the SQL transports' outboxes and inboxes take transactions of (one
/// crate whichever SQL backend is enabled).
#[cfg(feature = "postgres")]
pub use transport_pg::sqlx;
#[cfg(all(feature = "sqlite", not(any(feature = "postgres", feature = "mysql"))))]
pub use transport_sqlite::sqlx;

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use transport_amqp::{AmqpOptions, AmqpTransport, QueueKind};

/// Builds the transport that `config` selects: `QUEUE_BACKEND=exec` uses the SQL
/// database of `DATABASE_URL`, chosen by its scheme; `QUEUE_BACKEND=rabbitmq` the broker
/// of `AMQP_URL`. During a migration ([`Config::migrating`]: a canary, or the previous
/// backend still drained) it is a [`Router`] over both.
///
/// # Errors
/// [`Error::Config`] naming the setting when the backend is not compiled into this build
/// (with the Cargo feature that adds it), and whatever the transport's own connect
/// reports.
pub async fn connect(config: &Config) -> Result<Arc<dyn Transport>> {
    Ok(open(config, true).await?.0)
}

/// Like [`connect`], but creates and migrates nothing: for tools that only read or manage
/// an existing store. A SQLite file, a PostgreSQL schema, a MySQL database (`QUEUE_SCHEMA`)
/// or a table (`QUEUE_TABLE`) that does not exist is an [`Error::Config`] naming it, and
/// so is a table at an older schema version (run `switchyard migrate`), instead of a new
/// empty store that reports "no messages".
pub async fn connect_existing(config: &Config) -> Result<Arc<dyn Transport>> {
    Ok(open(config, false).await?.0)
}

/// A transport and the store of job status beside it, where there is one.
type Opened = (Arc<dyn Transport>, Option<Arc<dyn StatusStore>>);

async fn open(config: &Config, create: bool) -> Result<Opened> {
    let (primary, primary_status) = open_backend(config, config.backend, create).await?;
    if !config.migrating() {
        return Ok((primary, primary_status));
    }
    // A canary, or a flip whose previous backend is still drained: both backends.
    let other_kind = config.backend.other();
    let other = open_backend(config, other_kind, create).await;
    // Draining only because the other backend's URL happens to be set: without that
    // backend, run on the configured one alone rather than not at all.
    let detected = config.canary_percent == 0 && config.drain == DrainSetting::Detect;
    let other = match other {
        Err(err) if detected => {
            tracing::warn!(error = %err, "not draining {other_kind} (its URL is set, QUEUE_DRAIN is not): it cannot be opened; set QUEUE_DRAIN=none to silence this");
            return Ok((primary, primary_status));
        }
        other => other,
    };
    let (other, other_status) = other
        .map_err(|err| match err {
            Error::Config(_) => err,
            err => Error::backend(
                "router",
                err.is_transient(),
                format!(
                    "the migration needs the {other_kind} backend too (QUEUE_CANARY_PERCENT={}, QUEUE_DRAIN={}), and it failed: {err}; set QUEUE_DRAIN=none and QUEUE_CANARY_PERCENT=0 to run on {} alone",
                    config.canary_percent,
                    config.drain_from().map_or("none".to_owned(), |k| k.to_string()),
                    config.backend
                ),
            ),
        })?;
    let router = Router::new(primary, config.backend, other, config.canary_percent);
    // The SQL side's store: during a migration the exec backend keeps status for both.
    Ok((Arc::new(router), primary_status.or(other_status)))
}

/// A transport and the store of job status and results that `config` calls for
/// (`QUEUE_STATUS`, on by default): the SQL transport's own, the exec side's during a
/// migration, or, for a RabbitMQ deployment, the SQL store in `DATABASE_URL` when it is
/// set. Without a store (status off, or none to keep it in) it publishes and cannot
/// wait. [`Jobs::publish_and_wait`] for request/reply.
pub async fn connect_jobs(config: &Config) -> Result<Jobs> {
    jobs(config, true).await
}

/// Like [`connect_jobs`], but creates and migrates nothing (see [`connect_existing`]).
pub async fn connect_existing_jobs(config: &Config) -> Result<Jobs> {
    jobs(config, false).await
}

async fn jobs(config: &Config, create: bool) -> Result<Jobs> {
    let (transport, store) = open(config, create).await?;
    Ok(Jobs::new(transport, store.filter(|_| config.status))
        .with_tenant(config.tenant.as_ref().map(Identifier::as_str)))
}

/// A worker for `queue` in one call: the transport `config` selects ([`connect`]) and,
/// unless status is off (`QUEUE_STATUS=off`, [`Config::status`]), the store of
/// [`connect_jobs`], so that its jobs show on the dashboard and answer `publish --wait`.
/// To publish from the same process over the same connections, use [`connect_jobs`] and
/// [`Worker::for_jobs`](worker::Worker::for_jobs).
///
/// # Errors
/// [`Error::Config`] for a bad queue name, and whatever [`connect_jobs`] reports.
pub async fn connect_worker(
    config: &Config,
    queue: &str,
    options: worker::WorkerOptions,
) -> Result<worker::Worker> {
    let queue = QueueName::new(queue)?;
    let jobs = connect_jobs(config).await?;
    Ok(worker::Worker::for_jobs(&jobs, queue, options))
}

/// A status store that keeps the transport it came from open (its pool and listener
/// stop with the transport).
#[cfg(feature = "amqp")]
#[derive(Debug)]
struct KeptOpen {
    store: Arc<dyn StatusStore>,
    _owner: Arc<dyn Transport>,
}

// A forwarding impl: every method is written out, so that no default ever stands in
// for the store's own.
#[cfg(feature = "amqp")]
#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl StatusStore for KeptOpen {
    async fn record(&self, updates: &[queue_core::status::StatusUpdate]) -> Result<()> {
        self.store.record(updates).await
    }
    async fn reset(&self, ids: &[uuid::Uuid]) -> Result<u64> {
        self.store.reset(ids).await
    }
    async fn get(&self, id: uuid::Uuid) -> Result<Option<JobStatus>> {
        self.store.get(id).await
    }
    async fn recent(&self, limit: usize) -> Result<Vec<JobStatus>> {
        self.store.recent(limit).await
    }
    async fn prune(&self, older_than: std::time::Duration) -> Result<u64> {
        self.store.prune(older_than).await
    }
    async fn throughput(
        &self,
        window: std::time::Duration,
        bucket: std::time::Duration,
    ) -> Result<Vec<queue_core::status::Throughput>> {
        self.store.throughput(window, bucket).await
    }
    async fn list(&self, filter: &status::JobFilter) -> Result<Vec<JobStatus>> {
        self.store.list(filter).await
    }
    async fn counts(&self) -> Result<Vec<status::StateCount>> {
        self.store.counts().await
    }
    async fn attempts(&self, id: uuid::Uuid) -> Result<Vec<status::Attempt>> {
        self.store.attempts(id).await
    }
    async fn register_worker(&self, worker: &status::WorkerInfo) -> Result<()> {
        self.store.register_worker(worker).await
    }
    async fn worker_heartbeat(&self, id: uuid::Uuid, jobs_done: u64) -> Result<bool> {
        self.store.worker_heartbeat(id, jobs_done).await
    }
    async fn worker_stopped(&self, id: uuid::Uuid) -> Result<()> {
        self.store.worker_stopped(id).await
    }
    async fn workers(&self) -> Result<Vec<status::WorkerInfo>> {
        self.store.workers().await
    }
    fn watch(&self) -> Option<tokio::sync::broadcast::Receiver<uuid::Uuid>> {
        self.store.watch()
    }
    fn unique_keys(&self) -> Option<Arc<dyn queue_core::UniqueKeyStore>> {
        self.store.unique_keys()
    }
    fn limits(&self) -> Option<Arc<dyn queue_core::LimitStore>> {
        self.store.limits()
    }
    fn controls(&self) -> Option<Arc<dyn queue_core::Controls>> {
        self.store.controls()
    }
    fn schedules(&self) -> Option<Arc<dyn queue_core::schedule::ScheduleStore>> {
        self.store.schedules()
    }

    fn checkpoints(&self) -> Option<Arc<dyn queue_core::checkpoint::CheckpointStore>> {
        self.store.checkpoints()
    }

    fn job_logs(&self) -> Option<Arc<dyn queue_core::job_log::JobLogStore>> {
        self.store.job_logs()
    }
}

/// Builds the transport of one backend (`exec`: the SQL database of `DATABASE_URL`;
/// `rabbitmq`: the broker of `AMQP_URL`), whatever `QUEUE_BACKEND` says; with `create`
/// false nothing is created or migrated (see [`connect_existing`]).
pub async fn connect_backend(
    config: &Config,
    kind: BackendKind,
    create: bool,
) -> Result<Arc<dyn Transport>> {
    Ok(open_backend(config, kind, create).await?.0)
}

/// The error for opening a store with several tenants named: a transport opens one
/// tenant's store, and opening none of them (the URLs still say `{tenant}`) must not
/// fall back to a shared one.
pub fn several_tenants_error(selection: &TenantSelection) -> Error {
    ConfigError::new(
        "QUEUE_SCHEMA",
        Some(selection.to_string()),
        "one tenant: this names several, and a transport opens one tenant's store (`switchyard work`, `stats` and `dead list` serve several; in code, open each with switchyard::tenants::tenant_configs)",
    )
    .into()
}

async fn open_backend(config: &Config, kind: BackendKind, create: bool) -> Result<Opened> {
    if let Some(selection) = &config.tenants {
        return Err(several_tenants_error(selection));
    }
    match kind {
        BackendKind::Exec => open_sql(config, create).await,
        BackendKind::RabbitMq => open_amqp(config, create).await,
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
fn with_status<T: Transport + 'static>(t: T, status: Arc<dyn StatusStore>) -> Opened {
    (Arc::new(t), Some(status))
}

async fn open_sql(config: &Config, create: bool) -> Result<Opened> {
    let scheme = config.database_url.scheme();
    match scheme.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let t = SqliteTransport::connect(
                SqliteOptions::from_config(config).with_create_if_missing(create),
            )
            .await?;
            let status = t.status_store();
            Ok(with_status(t, status))
        }
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => {
            let _ = create;
            Err(missing_backend(
                "DATABASE_URL",
                &config.database_url.to_string(),
                "this build has no SQLite transport: enable the Cargo feature `sqlite`",
            ))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let t =
                PgTransport::connect(PgOptions::from_config(config).with_create(create)).await?;
            let status = t.status_store();
            Ok(with_status(t, status))
        }
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => Err(missing_backend(
            "DATABASE_URL",
            &config.database_url.to_string(),
            "this build has no PostgreSQL transport: enable the Cargo feature `postgres`",
        )),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            let t = MySqlTransport::connect(MySqlOptions::from_config(config).with_create(create))
                .await?;
            let status = t.status_store();
            Ok(with_status(t, status))
        }
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => Err(missing_backend(
            "DATABASE_URL",
            &config.database_url.to_string(),
            "this build has no MySQL transport: enable the Cargo feature `mysql`",
        )),
        _ => Err(missing_backend(
            "DATABASE_URL",
            &config.database_url.to_string(),
            "expected sqlite://PATH, postgres://… or mysql://…",
        )),
    }
}

/// RabbitMQ, with the SQL store of `DATABASE_URL` (when set, and status is on) as its
/// control store: start marks, so that a crash charges only the deliveries whose
/// handlers had started. That store keeps the job status too. A tool that only reads
/// (`create` false) goes without it when that store cannot be opened.
#[cfg(feature = "amqp")]
async fn open_amqp(config: &Config, create: bool) -> Result<Opened> {
    // A tool that only reads fails at once when the broker is down; the others wait for
    // it up to reconnect_timeout, as they would after a dropped connection.
    let mut options = AmqpOptions::from_config(config).with_retry_first_connect(create);
    let mut status = None;
    if config.status && config.database_url_set {
        match open_sql(config, create).await {
            Ok((sql, Some(store))) => {
                let store: Arc<dyn StatusStore> = Arc::new(KeptOpen { store, _owner: sql });
                options = options.with_control_store(store.clone());
                status = Some(store);
            }
            Ok((_, None)) => {}
            Err(err) if !create => {
                tracing::debug!(error = %err, "no control store beside RabbitMQ for this read-only use");
            }
            Err(err) => return Err(err),
        }
    }
    Ok((Arc::new(AmqpTransport::connect(options).await?), status))
}

#[cfg(not(feature = "amqp"))]
async fn open_amqp(_config: &Config, _create: bool) -> Result<Opened> {
    Err(missing_backend(
        "QUEUE_BACKEND",
        "rabbitmq",
        "this build has no RabbitMQ transport: enable the Cargo feature `amqp`, or use QUEUE_BACKEND=exec",
    ))
}

fn missing_backend(setting: &str, value: &str, expected: &str) -> Error {
    ConfigError::new(setting, Some(value.to_owned()), expected).into()
}

// The README's example compiles as a doctest, with every feature CI builds with
// (tests/readme_example.rs also builds it as a crate of its own and runs it).
#[cfg(all(doctest, feature = "sqlite", feature = "postgres"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// So do the guide's.
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../docs/jobs.md")]
struct GuideDoctests;

#[cfg(all(doctest, feature = "sqlite", feature = "otlp"))]
#[doc = include_str!("../docs/tracing.md")]
struct TracingDoctests;
