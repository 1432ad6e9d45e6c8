//! Checkpoints: a small JSON cursor a long job stores as it goes, so that its next
//! delivery (after a crash, a deploy, a retry or a replay) resumes where it left off.
//!
//! A write is fenced: it lands only while the run that makes it still holds the job
//! (on the SQL backends its lease token is still the job row's; on RabbitMQ its start
//! is still the latest the control store recorded), so a worker that lost the job
//! can never overwrite its successor's cursor. It is refused with
//! [`crate::Error::LeaseLost`] instead.
//!
//! Kept in the SQL store beside the jobs (`<table>_ckpt`; RabbitMQ's control store),
//! read only when a handler asks, removed once the job completes, kept when it is
//! dead-lettered (a replay resumes from it), and pruned by age with finished status
//! (`switchyard prune`, the `switchyard.prune` schedule).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::reservation::{LeaseToken, Reservation};

/// The largest checkpoint, as JSON text: a cursor, not the job's data.
pub const MAX_CHECKPOINT_BYTES: usize = 64 * 1024;

/// What a checkpoint write is fenced by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// The lease token the job row holds (the SQL backends).
    Lease(LeaseToken),
    /// The attempt whose start the status store recorded last (RabbitMQ, whose lease
    /// tokens are the broker's delivery tags and repeat across connections).
    Start(u32),
}

impl Fence {
    /// The fence of the run of `reservation` over a transport with `capabilities`: a
    /// start recorded in the status store where the transport keeps its start marks
    /// there (RabbitMQ with a control store), else the job row's lease token (the SQL
    /// backends); `None` where the transport's runs cannot be fenced
    /// ([`Capabilities::checkpoints`]: RabbitMQ alone, the migration router).
    pub fn for_run(capabilities: &Capabilities, reservation: &Reservation) -> Option<Fence> {
        if !capabilities.checkpoints {
            None
        } else if capabilities.start_marks_in_status {
            Some(Fence::Start(reservation.envelope.attempts + 1))
        } else {
            Some(Fence::Lease(reservation.token()))
        }
    }
}

/// Where checkpoints are kept (see the [module docs](self)).
#[async_trait]
pub trait CheckpointStore: Send + Sync + fmt::Debug {
    /// Stores `value` (JSON text) as job `id`'s checkpoint, at `now` (µs since the
    /// epoch), if `fence` still holds; false, with nothing written, when it does not.
    async fn save(&self, id: Uuid, fence: Fence, value: &str, now: i64) -> Result<bool>;

    /// Job `id`'s checkpoint, if it has one.
    async fn load(&self, id: Uuid) -> Result<Option<String>>;

    /// Removes job `id`'s checkpoint.
    async fn clear(&self, id: Uuid) -> Result<()>;

    /// Removes the checkpoints last written before `before` (µs since the epoch); how
    /// many.
    async fn prune(&self, before: i64) -> Result<u64>;
}

/// One run's checkpoint: the store, the job and the run's fence.
#[derive(Debug, Clone)]
pub(crate) struct JobCheckpoint {
    store: Arc<dyn CheckpointStore>,
    id: Uuid,
    fence: Fence,
    /// Whether this run read or wrote one: then it is removed once the job completes.
    touched: Arc<AtomicBool>,
}

impl JobCheckpoint {
    pub(crate) fn new(store: Arc<dyn CheckpointStore>, id: Uuid, fence: Fence) -> Self {
        JobCheckpoint {
            store,
            id,
            fence,
            touched: Arc::default(),
        }
    }

    /// Stores `value` (JSON text), fenced by this run.
    pub(crate) async fn save(&self, value: &str) -> Result<()> {
        check_size(value)?;
        self.touched.store(true, Ordering::Relaxed);
        if self
            .store
            .save(
                self.id,
                self.fence,
                value,
                chrono::Utc::now().timestamp_micros(),
            )
            .await?
        {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                message_id: self.id,
            })
        }
    }

    /// The stored checkpoint, as JSON text.
    pub(crate) async fn load(&self) -> Result<Option<String>> {
        let value = self.store.load(self.id).await?;
        if value.is_some() {
            self.touched.store(true, Ordering::Relaxed);
        }
        Ok(value)
    }

    /// Whether this run read or wrote a checkpoint.
    pub(crate) fn touched(&self) -> bool {
        self.touched.load(Ordering::Relaxed)
    }

    /// Removes the checkpoint of a job that completed; a failure leaves it to pruning.
    pub(crate) async fn clear(&self) {
        if let Err(err) = self.store.clear(self.id).await {
            tracing::warn!(message_id = %self.id, error = %err, "could not remove the checkpoint of a completed job; pruning will");
        }
    }
}

/// Refuses a checkpoint over [`MAX_CHECKPOINT_BYTES`].
pub fn check_size(value: &str) -> Result<()> {
    if value.len() > MAX_CHECKPOINT_BYTES {
        return Err(Error::InvalidInput(format!(
            "a checkpoint of {} bytes of JSON is too large: at most {MAX_CHECKPOINT_BYTES} \
             (keep a cursor, not the job's data)",
            value.len()
        )));
    }
    Ok(())
}
