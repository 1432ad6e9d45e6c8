//! Where one run measures, provisioned per backend: a fresh SQLite file, a table of its
//! own on PostgreSQL or MySQL, fresh queues on RabbitMQ; dropped afterwards.

use std::sync::Arc;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "amqp"))]
use std::sync::Mutex;
#[cfg(feature = "amqp")]
use std::time::Duration;
#[cfg(feature = "postgres")]
use std::time::Instant;

#[cfg(feature = "postgres")]
use switchyard::TransportExt;
use switchyard::{BackendKind, ClaimStrategy, Config, Error, Jobs, QueueName, Result, Transport};
use uuid::Uuid;

use super::report::Contention;
#[cfg(feature = "postgres")]
use super::workload::{jobs, queue};

/// Where one run measures: a fresh store that nothing else uses (a temporary SQLite
/// file, or a table of its own in PostgreSQL, dropped afterwards).
pub(super) struct Target {
    config: Config,
    _dir: Option<tempfile::TempDir>,
    #[cfg(feature = "postgres")]
    pg: Mutex<Vec<Arc<switchyard::PgTransport>>>,
    #[cfg(feature = "mysql")]
    mysql: Mutex<Vec<Arc<switchyard::MySqlTransport>>>,
    #[cfg(feature = "amqp")]
    amqp: Mutex<Vec<Arc<switchyard::AmqpTransport>>>,
}

impl Target {
    pub(super) fn new(config: &Config, claim: ClaimStrategy) -> Result<Self> {
        let mut config = config.clone();
        config.claim = claim;
        // One backend at a time, even during a migration.
        config.canary_percent = 0;
        config.drain = switchyard::DrainSetting::Off;
        let mut dir = None;
        match config.database_url.scheme().as_str() {
            // Fresh queue names per measurement, deleted afterwards.
            _ if config.backend == BackendKind::RabbitMq => {}
            "sqlite" => {
                // A fresh file per run: the user's database is never touched.
                let d = tempfile::tempdir()
                    .map_err(|e| Error::io("cannot create a temporary directory", e))?;
                let url = format!("sqlite://{}", d.path().join("bench.db").display());
                let lookup_url = url.clone();
                let fresh =
                    Config::from_lookup(|var| (var == "DATABASE_URL").then(|| lookup_url.clone()))?;
                config.database_url = fresh.database_url;
                dir = Some(d);
            }
            _ => {
                // A table of its own, in the configured schema: the user's queues are
                // never touched.
                config.table = switchyard::Identifier::table(
                    "QUEUE_TABLE",
                    format!("bench_{}", &Uuid::new_v4().simple().to_string()[..12]),
                )?;
            }
        }
        Ok(Target {
            config,
            _dir: dir,
            #[cfg(feature = "postgres")]
            pg: Mutex::default(),
            #[cfg(feature = "mysql")]
            mysql: Mutex::default(),
            #[cfg(feature = "amqp")]
            amqp: Mutex::default(),
        })
    }

    /// The configuration of the store, as another process would open it.
    pub(super) fn config(&self) -> &Config {
        &self.config
    }

    /// A transport on the store; `pool` sizes a PostgreSQL pool for that many
    /// concurrent callers.
    pub(super) async fn open(&self, pool: Option<u32>) -> Result<Arc<dyn Transport>> {
        Ok(self.open_jobs(pool).await?.transport().clone())
    }

    /// A transport on the store and its status store, where it keeps one.
    pub(super) async fn open_jobs(&self, pool: Option<u32>) -> Result<Jobs> {
        #[cfg(feature = "amqp")]
        if self.config.backend == BackendKind::RabbitMq {
            // Should the bench be killed, its queues go after an idle hour.
            let options = switchyard::AmqpOptions::from_config(&self.config)
                .with_queue_expires(Duration::from_secs(3600));
            let t = Arc::new(switchyard::AmqpTransport::connect(options).await?);
            if let Ok(mut amqp) = self.amqp.lock() {
                amqp.push(t.clone());
            }
            return Ok(Jobs::new(t, None));
        }
        #[cfg(feature = "postgres")]
        if matches!(
            self.config.database_url.scheme().as_str(),
            "postgres" | "postgresql"
        ) {
            let mut options = switchyard::PgOptions::from_config(&self.config);
            if let Some(n) = pool {
                options = options.with_max_connections(n);
            }
            let t = Arc::new(switchyard::PgTransport::connect(options).await?);
            if let Ok(mut pg) = self.pg.lock() {
                pg.push(t.clone());
            }
            let status = t.status_store();
            return Ok(Jobs::new(t, Some(status)));
        }
        #[cfg(feature = "mysql")]
        if matches!(
            self.config.database_url.scheme().as_str(),
            "mysql" | "mariadb"
        ) {
            let mut options = switchyard::MySqlOptions::from_config(&self.config);
            if let Some(n) = pool {
                options = options.with_max_connections(n);
            }
            let t = Arc::new(switchyard::MySqlTransport::connect(options).await?);
            if let Ok(mut my) = self.mysql.lock() {
                my.push(t.clone());
            }
            let status = t.status_store();
            return Ok(Jobs::new(t, Some(status)));
        }
        let _ = pool;
        switchyard::connect_jobs(&self.config).await
    }

    /// The transport that publishes in the pickup measurement: on a server one of its
    /// own, as another process would be, so the worker is woken by `NOTIFY` (PostgreSQL)
    /// or polling (MySQL); on SQLite the worker's own (an embedded database's publishers
    /// share its process).
    pub(super) async fn publisher(
        &self,
        worker_side: &Arc<dyn Transport>,
    ) -> Result<Arc<dyn Transport>> {
        if matches!(worker_side.name(), "postgres" | "mysql" | "amqp") {
            self.open(None).await
        } else {
            Ok(worker_side.clone())
        }
    }

    /// The claim's plan (PostgreSQL).
    pub(super) async fn claim_plan(&self, q: &QueueName) -> Option<String> {
        #[cfg(feature = "postgres")]
        {
            let t = self.pg.lock().ok()?.first()?.clone();
            return t.explain_claim(q, 64, &[]).await.ok();
        }
        #[allow(unreachable_code)]
        {
            let _ = q;
            None
        }
    }

    /// Optimistic claims racing each other (PostgreSQL only; elsewhere `None`).
    pub(super) async fn contention(
        &self,
        reservers: usize,
        messages: usize,
    ) -> Result<Option<Contention>> {
        #[cfg(feature = "postgres")]
        {
            if !matches!(
                self.config.database_url.scheme().as_str(),
                "postgres" | "postgresql"
            ) {
                return Ok(None);
            }
            let t = self
                .open(Some(u32::try_from(reservers + 2).unwrap_or(u32::MAX)))
                .await?;
            let pg = self
                .pg
                .lock()
                .ok()
                .and_then(|pg| pg.last().cloned())
                .ok_or_else(|| Error::InvalidInput("bench: no PostgreSQL transport".into()))?;
            let q = queue("contention")?;
            for chunk in jobs(&q, messages)?.chunks(1_000) {
                t.publish_batch(chunk.to_vec()).await?;
            }
            let before = pg.claim_counters();
            let started = Instant::now();
            let tasks: Vec<_> = (0..reservers)
                .map(|_| {
                    let (t, q) = (t.clone(), q.clone());
                    tokio::spawn(async move {
                        loop {
                            let batch = t.reserve_batch(&q, 10).await?;
                            if batch.is_empty() {
                                return Ok::<(), Error>(());
                            }
                            t.ack_batch(&batch).await?;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await
                    .map_err(|e| Error::InvalidInput(format!("reserver failed: {e}")))??;
            }
            let elapsed = started.elapsed();
            let counted = pg.claim_counters().since(&before);
            return Ok(Some(Contention {
                reservers,
                jobs_per_s: messages as f64 / elapsed.as_secs_f64(),
                wasted_claim_ratio: counted.wasted_ratio(),
                conflicts: counted.conflicts,
            }));
        }
        #[allow(unreachable_code)]
        {
            let _ = (reservers, messages);
            Ok(None)
        }
    }

    /// Drops the run's tables or queues (a SQLite file goes with its directory).
    pub(super) async fn cleanup(&self) {
        #[cfg(feature = "amqp")]
        {
            let amqp: Vec<_> = self
                .amqp
                .lock()
                .map(|mut amqp| amqp.drain(..).collect())
                .unwrap_or_default();
            for t in amqp {
                for q in t.queues() {
                    if let Ok(q) = QueueName::new(q) {
                        if let Err(err) = t.delete_queue(&q).await {
                            errln!("bench: could not delete the benchmark queue {q}: {err}");
                        }
                    }
                }
                t.close().await;
            }
        }
        #[cfg(feature = "postgres")]
        {
            let pg: Vec<_> = self
                .pg
                .lock()
                .map(|mut pg| pg.drain(..).collect())
                .unwrap_or_default();
            if let Some(t) = pg.first() {
                if let Err(err) = t.drop_store().await {
                    errln!("bench: could not drop the benchmark tables: {err}");
                }
            }
            for t in pg {
                t.close().await;
            }
        }
        #[cfg(feature = "mysql")]
        {
            let my: Vec<_> = self
                .mysql
                .lock()
                .map(|mut my| my.drain(..).collect())
                .unwrap_or_default();
            if let Some(t) = my.first() {
                if let Err(err) = t.drop_store().await {
                    errln!("bench: could not drop the benchmark tables: {err}");
                }
            }
            for t in my {
                t.close().await;
            }
        }
    }
}
