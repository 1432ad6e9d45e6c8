//! A worker's view of an operator's controls ([`crate::Controls`]): what is paused and
//! which jobs are marked cancelled, read from the store every [`REFRESH`] by a task of
//! its own, so that the fetch loop and running jobs read it without waiting on the
//! store. The marks are read again only when their count or newest time changed.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::controls::{Controls, Paused};

/// How often the view is read from the store.
pub(super) const REFRESH: Duration = Duration::from_millis(250);

/// What the view last read.
#[derive(Debug, Default)]
struct Seen {
    paused: Vec<Paused>,
    /// The marks' count and newest time when `cancelled` was read.
    marks: Option<(u64, i64)>,
    cancelled: HashSet<Uuid>,
}

/// The controls store and the worker's view of it.
#[derive(Debug)]
pub(super) struct ControlView {
    store: Arc<dyn Controls>,
    seen: RwLock<Arc<Seen>>,
}

impl ControlView {
    pub(super) fn new(store: Arc<dyn Controls>) -> Self {
        ControlView {
            store,
            seen: RwLock::default(),
        }
    }

    /// The store, for a cancelled job's mark.
    pub(super) fn store(&self) -> &Arc<dyn Controls> {
        &self.store
    }

    /// Reads the store once. A failed read keeps the last view (a store that is down
    /// pauses and cancels nothing new).
    pub(super) async fn refresh(&self) {
        let last = self.snapshot();
        let read = async {
            let paused = self.store.paused().await?;
            let marks = self.store.marks().await?;
            let cancelled = if last.marks == Some(marks) {
                last.cancelled.clone()
            } else if marks.0 == 0 {
                HashSet::new()
            } else {
                self.store.cancelled().await?.into_iter().collect()
            };
            Ok::<_, crate::Error>(Seen {
                paused,
                marks: Some(marks),
                cancelled,
            })
        };
        match read.await {
            Ok(seen) => {
                if let Ok(mut slot) = self.seen.write() {
                    *slot = Arc::new(seen);
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "reading paused queues and cancellations failed; keeping the last view");
            }
        }
    }

    /// Refreshes the view every [`REFRESH`] until `stop`.
    pub(super) fn spawn_refresh(
        self: &Arc<Self>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let view = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(REFRESH) => view.refresh().await,
                }
            }
        })
    }

    fn snapshot(&self) -> Arc<Seen> {
        self.seen.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Whether all of `queue` is paused.
    pub(super) fn queue_paused(&self, queue: &str) -> bool {
        self.snapshot()
            .paused
            .iter()
            .any(|p| p.queue == queue && p.kind.is_none())
    }

    /// Whether jobs of `kind` in `queue` must not start (the queue or the kind paused).
    pub(super) fn start_paused(&self, queue: &str, kind: &str) -> bool {
        self.snapshot()
            .paused
            .iter()
            .any(|p| p.queue == queue && p.kind.as_deref().is_none_or(|k| k == kind))
    }

    /// Whether job `id` is marked cancelled, as last read: a mark forgotten since may
    /// still show; [`Controls::is_marked`] tells for sure.
    pub(super) fn is_cancelled(&self, id: Uuid) -> bool {
        self.snapshot().cancelled.contains(&id)
    }
}
