//! Following one job's record as it changes.

use std::time::Duration;

use tokio::sync::broadcast;
use uuid::Uuid;

use super::record::JobStatus;
use super::store::StatusStore;
use crate::error::Result;

/// Polling readers start at this pause and double it up to [`POLL_MAX`].
const POLL_MIN: Duration = Duration::from_millis(10);
/// The longest pause of a polling reader.
const POLL_MAX: Duration = Duration::from_millis(250);
/// Readers woken by notifications still read this often, in case one was lost.
const WATCH_FALLBACK: Duration = Duration::from_secs(1);

/// Waits until the record of `id` is newer than `after_version`, and returns it; `None`
/// once `deadline` passes first. Woken by the store's notifications where it has them,
/// else by polling with backoff.
pub async fn next_change(
    store: &dyn StatusStore,
    id: Uuid,
    after_version: u64,
    deadline: tokio::time::Instant,
) -> Result<Option<JobStatus>> {
    // Subscribed before reading, so that a change between the read and the wait is seen.
    let mut watch = store.watch();
    let mut pause = POLL_MIN;
    loop {
        if let Some(status) = store.get(id).await? {
            if status.version > after_version {
                return Ok(Some(status));
            }
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        match watch.as_mut() {
            Some(rx) => {
                let until = deadline.min(now + WATCH_FALLBACK);
                loop {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        // The nil id: notifications may have been missed; read.
                        Ok(Ok(changed)) if changed != id && !changed.is_nil() => continue,
                        // Ours, or notifications were dropped (lagged) or stopped: read.
                        Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => break,
                        Ok(Err(broadcast::error::RecvError::Closed)) => {
                            watch = None;
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
            None => {
                tokio::time::sleep_until(deadline.min(now + pause)).await;
                pause = (pause * 2).min(POLL_MAX);
            }
        }
    }
}
