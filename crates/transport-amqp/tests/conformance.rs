//! The shared conformance suite against the local RabbitMQ (`SWITCHYARD_TEST_AMQP_URL`),
//! with quorum queues (the default) and with classic queues (priorities).
//!
//! Every case runs here; those that need a capability RabbitMQ lacks (a lease that runs
//! out, claims that hold nothing ahead, tables) end at once, saying which.
//! Cases use fresh queue names; a case's queues are deleted after it, and expire on
//! the broker after ten idle minutes should the test process die first.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use queue_core::conformance::{Harness, OpenOptions, Store};
use queue_core::{QueueName, Result, Transport};
use support::url;
use transport_amqp::{AmqpOptions, AmqpTransport, QueueKind};

/// The transports a case opened, to delete their queues afterwards.
type Opened = Arc<Mutex<Vec<Arc<AmqpTransport>>>>;

struct AmqpHarness {
    kind: QueueKind,
    opened: Opened,
    /// Whether each store has a SQL control store beside the broker.
    controlled: bool,
}

struct AmqpStore {
    kind: QueueKind,
    opened: Opened,
    /// The SQLite control store every transport of this store shares, in its own
    /// directory.
    control: Option<(tempfile::TempDir, Arc<transport_sqlite::SqliteTransport>)>,
}

impl AmqpStore {
    fn options(&self, url: String) -> AmqpOptions {
        let options = AmqpOptions::new(url)
            .with_queue_kind(self.kind)
            .with_queue_expires(Duration::from_secs(600))
            .with_reconnect_timeout(Duration::from_secs(2));
        match &self.control {
            Some((_, sql)) => options.with_control_store(sql.status_store()),
            None => options,
        }
    }
}

#[async_trait]
impl Harness for AmqpHarness {
    async fn store(&self) -> Result<Box<dyn Store>> {
        let control = if self.controlled {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let url = format!("sqlite://{}", dir.path().join("control.db").display());
            let sql = transport_sqlite::SqliteTransport::connect(
                transport_sqlite::SqliteOptions::new(url),
            )
            .await?;
            Some((dir, Arc::new(sql)))
        } else {
            None
        };
        Ok(Box::new(AmqpStore {
            kind: self.kind,
            opened: self.opened.clone(),
            control,
        }))
    }

    fn skip_reason(&self) -> Option<String> {
        support::skip_reason()
    }

    async fn teardown(&self) {
        let opened: Vec<_> = std::mem::take(&mut *self.opened.lock().expect("the list"));
        for t in opened {
            for q in t.queues() {
                if let Ok(q) = QueueName::new(q) {
                    let _ = t.delete_queue(&q).await;
                }
            }
            t.close().await;
        }
    }
}

#[async_trait]
impl Store for AmqpStore {
    async fn open_with_status(
        &self,
        _options: OpenOptions,
    ) -> Result<(
        Arc<dyn Transport>,
        Option<Arc<dyn queue_core::status::StatusStore>>,
    )> {
        let t = Arc::new(AmqpTransport::connect(self.options(url())).await?);
        self.opened.lock().expect("the list").push(t.clone());
        let control = self.control.as_ref().map(|(_, sql)| sql.status_store());
        Ok((t, control))
    }

    async fn open_unreachable(&self, _options: OpenOptions) -> Result<Arc<dyn Transport>> {
        let url = "amqp://guest:guest@127.0.0.1:1/%2f".to_owned();
        Ok(Arc::new(AmqpTransport::connect(self.options(url)).await?))
    }

    /// "Table" is meaningless here: the body goes to `queue` as it is.
    async fn insert_raw(&self, _table: &str, queue: &str, id: &str, body: &str) -> Result<()> {
        let t = Arc::new(AmqpTransport::connect(self.options(url())).await?);
        self.opened.lock().expect("the list").push(t.clone());
        let q = QueueName::new(queue)?;
        t.publish_raw(&q, id, body).await
    }
}

fn harness(kind: QueueKind) -> Arc<dyn Harness> {
    Arc::new(AmqpHarness {
        kind,
        opened: Opened::default(),
        controlled: false,
    })
}

/// Quorum queues with a SQLite control store beside the broker, where unique keys and
/// limits live.
fn controlled() -> Arc<dyn Harness> {
    Arc::new(AmqpHarness {
        kind: QueueKind::Quorum,
        opened: Opened::default(),
        controlled: true,
    })
}

mod quorum {
    queue_core::conformance_tests!(super::harness(transport_amqp::QueueKind::Quorum));
}

/// Classic queues: priorities, and the attempt counted by republishing a redelivery.
mod classic {
    queue_core::conformance_tests!(super::harness(transport_amqp::QueueKind::Classic));
}

/// The cases of unique keys, which RabbitMQ keeps in its control store.
mod control_store {
    queue_core::conformance_tests!(unique_keys: super::controlled());
    queue_core::conformance_tests!(limits: super::controlled());
}
