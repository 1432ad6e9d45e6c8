//! The publish watch: an idle worker's wake-up signal fires for a publish of another
//! connection to the file (as another process's would), also after the write-ahead log
//! was checkpointed and after the file was replaced under its path; with the watch off
//! it does not fire (those publishes are left to polling). The watcher's claim finds
//! nothing first, as an idle worker's does: the watch looks only while one did.

use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use queue_core::{Envelope, QueueName, Transport, TransportExt};
use transport_sqlite::{SqliteOptions, SqliteTransport};

fn url(db: &Path) -> String {
    format!("sqlite://{}", db.display())
}

async fn open(db: &Path, watch: bool) -> Arc<dyn Transport> {
    let every = watch.then_some(Duration::from_millis(2));
    let options = SqliteOptions::new(url(db)).with_watch(every);
    Arc::new(
        SqliteTransport::connect(options)
            .await
            .expect("open the file"),
    )
}

fn job(q: &QueueName) -> Envelope {
    Envelope::builder(q.as_str(), "job")
        .build()
        .expect("an envelope")
}

/// Works `q` empty on `watcher`, so that its last claim found nothing, as an idle
/// worker's did before it waits: the watch looks only then.
async fn idle(watcher: &dyn Transport, q: &QueueName) {
    while let Some(r) = watcher.reserve(q).await.expect("claim") {
        watcher.ack(&r).await.expect("ack");
    }
}

/// Whether `watcher`'s signal for `q` fires within `within` of `publisher` publishing.
async fn woken(
    watcher: &dyn Transport,
    publisher: &dyn Transport,
    q: &QueueName,
    within: Duration,
) -> bool {
    let signal = watcher.wake_signal(q).expect("a wake-up signal");
    idle(watcher, q).await;
    // The watch's first look wakes everyone; let it pass.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut notified = pin!(signal.notified());
    notified.as_mut().enable();
    publisher.publish(job(q)).await.expect("publish");
    tokio::time::timeout(within, notified).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_connections_publish_wakes_an_idle_worker() {
    let dir = tempfile::tempdir().expect("a directory");
    let db = dir.path().join("jobs.db");
    let q = QueueName::new("watched").expect("a queue");
    let watcher = open(&db, true).await;
    let publisher = open(&db, true).await;
    assert!(
        woken(
            watcher.as_ref(),
            publisher.as_ref(),
            &q,
            Duration::from_secs(10)
        )
        .await
    );

    // The log folded into the file and started over, truncated or at its length (its
    // next commits overwrite it from the start): still seen.
    for checkpoint in ["TRUNCATE", "RESTART", "RESTART"] {
        let checkpointing = sqlx::SqlitePool::connect(&url(&db)).await.expect("a pool");
        sqlx::query(&format!("PRAGMA wal_checkpoint({checkpoint})"))
            .execute(&checkpointing)
            .await
            .expect("checkpoint");
        checkpointing.close().await;
        let seen = woken(
            watcher.as_ref(),
            publisher.as_ref(),
            &q,
            Duration::from_secs(10),
        )
        .await;
        assert!(seen, "after a {checkpoint} checkpoint");
    }

    // Without the watch nothing but polling finds it.
    let unwatched = open(&db, false).await;
    assert!(
        !woken(
            unwatched.as_ref(),
            publisher.as_ref(),
            &q,
            Duration::from_millis(500)
        )
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_file_is_watched_anew() {
    let dir = tempfile::tempdir().expect("a directory");
    let db = dir.path().join("jobs.db");
    let q = QueueName::new("watched").expect("a queue");
    let watcher = open(&db, true).await;
    let signal = watcher.wake_signal(&q).expect("a wake-up signal");
    idle(watcher.as_ref(), &q).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    // A restore: another file renamed over the path, then published to.
    let other = dir.path().join("restored.db");
    let restored = open(&other, false).await;
    drop(restored);
    for suffix in ["", "-wal", "-shm"] {
        let from = format!("{}{suffix}", other.display());
        let to = format!("{}{suffix}", db.display());
        if Path::new(&from).exists() {
            std::fs::rename(&from, &to).expect("replace the file");
        } else {
            let _ = std::fs::remove_file(&to);
        }
    }
    let publisher = open(&db, true).await;
    let mut notified = pin!(signal.notified());
    notified.as_mut().enable();
    publisher.publish(job(&q)).await.expect("publish");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), notified)
            .await
            .is_ok(),
        "the watch follows the new file"
    );
}
