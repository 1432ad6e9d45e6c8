//! What a transport's tests give the suite: a harness that makes isolated stores, and
//! the options a case opens a transport with.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::status::StatusStore;
use crate::{Result, Transport};

/// How a case wants a transport opened.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Table (or the backend's equivalent) for the transport's store.
    pub table: String,
    /// Lease length.
    pub visibility_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            table: "switchyard_jobs".into(),
            visibility_timeout: Duration::from_secs(30),
        }
    }
}

/// Makes fresh, isolated stores for the cases.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A fresh store that no other case uses.
    async fn store(&self) -> Result<Box<dyn Store>>;

    /// Why the cases cannot run here (the backend's server is unreachable outside CI),
    /// or `None` to run them. A harness must never skip under `CI=true`.
    fn skip_reason(&self) -> Option<String> {
        None
    }

    /// Removes what the case left on the server, after it passed or failed (a broker's
    /// queues, say, which would otherwise pile up). Nothing by default.
    async fn teardown(&self) {}
}

/// One isolated store (a database file, a schema, …).
#[async_trait]
pub trait Store: Send + Sync {
    /// Opens a transport over this store (runs migrations as needed).
    async fn open(&self, options: OpenOptions) -> Result<Arc<dyn Transport>> {
        Ok(self.open_with_status(options).await?.0)
    }

    /// Opens a transport and the job status store beside it, where the backend keeps
    /// one.
    async fn open_with_status(
        &self,
        options: OpenOptions,
    ) -> Result<(Arc<dyn Transport>, Option<Arc<dyn StatusStore>>)>;

    /// Opens a transport with `options` against a database that cannot be reached.
    /// Validation errors must win over connection errors: this proves they are raised
    /// before any SQL runs.
    async fn open_unreachable(&self, options: OpenOptions) -> Result<Arc<dyn Transport>>;

    /// Writes a message body directly into `table`, bypassing the transport's encoder
    /// (to plant a malformed row).
    async fn insert_raw(&self, table: &str, queue: &str, id: &str, body: &str) -> Result<()>;
}

/// What a case of a store kept beside the transport opens: the store, its transport,
/// its status store and that store.
pub(crate) type Beside<S> = (
    Box<dyn Store>,
    Arc<dyn Transport>,
    Arc<dyn StatusStore>,
    Arc<S>,
);

/// A fresh store's transport, its status store and the store `get` finds beside it, or
/// `None` where there is none (said why: `why_not`, as in "no store beside it keeps
/// limits"), as on RabbitMQ without a control store.
pub(crate) async fn open_beside<S: ?Sized>(
    h: &Arc<dyn Harness>,
    get: impl FnOnce(Option<&dyn StatusStore>, &crate::Capabilities) -> Option<Arc<S>>,
    why_not: &str,
) -> Result<Option<Beside<S>>> {
    let store = h.store().await?;
    let (t, status) = store.open_with_status(OpenOptions::default()).await?;
    let beside = get(status.as_deref(), &t.capabilities());
    match (status, beside) {
        (Some(status), Some(beside)) => Ok(Some((store, t, status, beside))),
        _ => {
            eprintln!("not applicable to {}: {why_not}", t.name());
            Ok(None)
        }
    }
}
