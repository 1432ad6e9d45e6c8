//! The worker's part in schedules: storing the ones it was given, and firing due slots
//! beside its claims (see [`crate::schedule`]).

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::builder::Worker;
use crate::error::{Error, Result};
use crate::schedule::Scheduler;

impl Worker {
    /// Stores the worker's schedules and starts firing due slots, where its status store
    /// keeps schedules; the firing task, if any.
    pub(super) async fn start_schedules(
        &self,
        stop: CancellationToken,
    ) -> Result<Option<JoinHandle<()>>> {
        let Some(store) = self.status.as_ref().and_then(|s| s.schedules()) else {
            if self.options.schedules.is_empty() {
                return Ok(None);
            }
            return Err(Error::NotSupported(
                "schedules are kept in a SQL store beside the jobs: give the worker a status \
                 store (for RabbitMQ, DATABASE_URL as its control store)"
                    .to_owned(),
            ));
        };
        let scheduler = Scheduler::new(store, self.transport.clone())
            .with_tenant(self.tenant.clone())
            .with_status(self.status.clone());
        if !self.options.schedules.is_empty() {
            for (name, outcome) in scheduler.apply(&self.options.schedules).await? {
                tracing::info!(schedule = %name, ?outcome, "schedule stored");
            }
        }
        if self.options.drain || !self.options.fire_schedules {
            return Ok(None);
        }
        Ok(Some(tokio::spawn(scheduler.run(stop))))
    }
}
