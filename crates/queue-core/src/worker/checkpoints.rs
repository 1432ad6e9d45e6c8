//! The worker's part in checkpoints and job logs: each run's handles, a checkpoint
//! fenced the way its transport's leases can be (see [`crate::checkpoint`] and
//! [`crate::job_log`]).

use super::builder::Worker;
use crate::checkpoint::{Fence, JobCheckpoint};
use crate::job_log::JobLog;
use crate::reservation::Reservation;

impl Worker {
    /// The checkpoint handle of the run of `r`, where the worker's status store keeps
    /// checkpoints and its transport gives a fence ([`Fence::for_run`]). Elsewhere the
    /// handler's checkpoint calls say why not.
    pub(super) fn job_checkpoint(&self, r: &Reservation) -> Option<JobCheckpoint> {
        let store = self.status.as_ref()?.checkpoints()?;
        let fence = Fence::for_run(&self.transport.capabilities(), r)?;
        Some(JobCheckpoint::new(store, r.id(), fence))
    }

    /// The log of the run of `r`, where the worker's status store keeps job logs.
    pub(super) fn job_log(&self, r: &Reservation) -> Option<JobLog> {
        let store = self.status.as_ref()?.job_logs()?;
        Some(JobLog::new(store, r.id(), r.envelope.attempts + 1))
    }
}
