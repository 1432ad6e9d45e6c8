//! One worker per tenant in one `work` process. Each tenant has its own store,
//! connections, claims and handler slots (`--concurrency` each), so a backlog in one
//! cannot hold back another's jobs: fairness by construction, not by scheduling.

use std::time::Duration;
use switchyard::worker::{Worker, WorkerReport};

use switchyard::{Cadence, Config, Error, Result, Schedule};
use tokio::task::JoinHandle;

use super::exec_handler::ExecHandler;
use super::Serving;
use crate::metrics_listener::Gauged;

/// The tenants' workers, started.
#[derive(Default)]
pub(super) struct Running {
    workers: Vec<(Option<String>, JoinHandle<Result<WorkerReport>>)>,
}

impl Running {
    /// Opens `config`'s tenant and starts its worker.
    pub(super) async fn start(&mut self, serving: &Serving, config: &Config) -> Result<()> {
        let tenant = config.tenant.as_ref().map(|t| t.as_str().to_owned());
        let several = serving.several;
        let jobs = switchyard::connect_jobs(config).await.inspect_err(|err| {
            // With one store the error is the command's own, reported once.
            if several {
                tracing::error!(tenant, error = %err, "cannot open the tenant's store");
            }
        })?;
        let (transport, status) = (jobs.transport().clone(), jobs.store().cloned());
        let mut options = serving.options.clone();
        if let Some(t) = &tenant {
            options = options.with_tenant(t.clone());
        }
        // Pruning is a schedule of the store, fired once an hour by one of its workers;
        // a store that keeps no schedules is pruned by each worker itself.
        let prune_by_schedule = status.as_ref().is_some_and(|s| s.schedules().is_some());
        if let (Some(older_than), true) = (serving.prune_older_than, prune_by_schedule) {
            crate::pruning::prune_once(&transport, status.as_ref(), older_than).await;
            options = options.with_schedules([Schedule::prune(older_than, hourly()?)]);
        }
        let mut worker = Worker::new(transport.clone(), serving.queue.clone(), options).handle_any(
            ExecHandler {
                command: serving.command.clone(),
                stderr_log: serving.stderr_log,
                control: serving.control.clone(),
            },
        );
        if let Some(store) = &status {
            worker = worker.with_status(store.clone());
        }
        if let Ok(mut sources) = serving.sources.lock() {
            sources.push(Gauged {
                tenant: tenant.clone(),
                transport: transport.clone(),
                store: None,
            });
        }
        if let (Some(older_than), false) = (serving.prune_older_than, prune_by_schedule) {
            crate::pruning::start_periodic(transport, status, older_than, serving.shutdown.clone())
                .await;
        }
        let (shutdown, abort) = (serving.shutdown.clone(), serving.abort.clone());
        let name = tenant.clone();
        self.workers.push((
            tenant,
            tokio::spawn(async move {
                let report = worker.run_until(shutdown.clone(), abort).await;
                if let Err(err) = &report {
                    // One tenant's worker failing stops them all, as it would stop a
                    // process serving one: the supervisor sees the exit and the cause.
                    if several {
                        tracing::error!(tenant = name, error = %err, "the tenant's worker failed; stopping the others");
                    }
                    shutdown.cancel();
                }
                report
            }),
        ));
        Ok(())
    }

    fn serves(&self, tenant: Option<&str>) -> bool {
        self.workers.iter().any(|(t, _)| t.as_deref() == tenant)
    }

    /// Looks up the pattern's tenants every `--tenant-rescan` until shutdown, and starts
    /// a worker for each one not yet served. A failed lookup or start is logged and
    /// tried again at the next one.
    pub(super) async fn rescan(&mut self, serving: &Serving, config: &Config) {
        loop {
            tokio::select! {
                () = serving.shutdown.cancelled() => return,
                () = tokio::time::sleep(serving.rescan_every) => {}
            }
            let found = match switchyard::tenants::tenant_configs(config).await {
                Ok(found) => found,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot look for new tenants; trying again later");
                    continue;
                }
            };
            for tenant in found {
                let name = tenant.tenant.as_ref().map(|t| t.as_str().to_owned());
                if self.serves(name.as_deref()) || serving.shutdown.is_cancelled() {
                    continue;
                }
                if self.start(serving, &tenant).await.is_ok() {
                    tracing::info!(tenant = name, "serving a new tenant");
                }
            }
        }
    }

    /// Waits for every worker; their reports, or the first failure.
    pub(super) async fn finish(self) -> Result<Vec<(Option<String>, WorkerReport)>> {
        let mut reports = Vec::new();
        let mut failed = None;
        for (tenant, handle) in self.workers {
            match handle.await {
                Ok(Ok(report)) => reports.push((tenant, report)),
                Ok(Err(err)) => {
                    failed.get_or_insert(err);
                }
                Err(join) => {
                    failed.get_or_insert(Error::InvalidInput(format!(
                        "the worker of tenant {} ended abnormally: {join}",
                        tenant.as_deref().unwrap_or("(none)")
                    )));
                }
            }
        }
        failed.map_or(Ok(reports), Err)
    }
}

/// The cadence of the pruning schedule `work --prune-older-than` stores.
fn hourly() -> switchyard::Result<Cadence> {
    Cadence::every(Duration::from_secs(3600))
}
