//! The worker's part in checkpoints: each run's handle, fenced the way its transport's
//! leases can be (see [`crate::checkpoint`]).

use super::builder::Worker;
use crate::checkpoint::{Fence, JobCheckpoint};
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
}
