//! The transactional outbox on SQLite: a message published inside the application's own
//! transaction exists if and only if that transaction commits, together with the
//! application's rows.

use std::time::Duration;

use queue_core::{Envelope, Error, QueueName, Transport, TransportExt, Unique};
use sqlx::Connection;
use transport_sqlite::{SqliteOptions, SqliteTransport};

async fn open() -> (tempfile::TempDir, SqliteTransport) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let t = SqliteTransport::connect(SqliteOptions::new(url))
        .await
        .expect("connect");
    sqlx::query("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
        .execute(t.pool())
        .await
        .expect("the application's table");
    (dir, t)
}

fn job(q: &QueueName, n: usize) -> Envelope {
    Envelope::builder(q.as_str(), "invoice.created")
        .payload(&serde_json::json!({ "invoice": n }))
        .build()
        .expect("a valid envelope")
}

async fn invoices(t: &SqliteTransport) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM invoices")
        .fetch_one(t.pool())
        .await
        .expect("count invoices")
}

/// Messages of `q` as another connection sees them: committed ones only.
async fn stored(dir: &tempfile::TempDir, q: &QueueName) -> i64 {
    let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("a connection of another program");
    sqlx::query_scalar("SELECT COUNT(*) FROM switchyard_jobs WHERE queue = ?")
        .bind(q.as_str())
        .fetch_one(&mut conn)
        .await
        .expect("count messages")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_neither_the_row_nor_the_message() {
    let (dir, t) = open().await;
    let q = QueueName::new("outbox.rollback").expect("queue");

    let mut tx = t.pool().begin().await.expect("begin");
    sqlx::query("INSERT INTO invoices (id, total) VALUES (1, 4200)")
        .execute(&mut *tx)
        .await
        .expect("the application's write");
    t.publish_tx(&mut tx, job(&q, 1)).await.expect("publish_tx");
    t.publish_batch_tx(&mut tx, vec![job(&q, 2), job(&q, 3)])
        .await
        .expect("publish_batch_tx");
    assert_eq!(
        stored(&dir, &q).await,
        0,
        "an uncommitted publish was visible"
    );
    tx.rollback().await.expect("rollback");

    assert_eq!(invoices(&t).await, 0);
    assert_eq!(stored(&dir, &q).await, 0, "a rolled-back publish survived");
    assert!(t.reserve(&q).await.expect("reserve").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_transaction_keeps_both_and_a_waiting_claim_gets_the_message() {
    let (_dir, t) = open().await;
    let t = std::sync::Arc::new(t);
    let q = QueueName::new("outbox.commit").expect("queue");

    let mut tx = t.pool().begin().await.expect("begin");
    sqlx::query("INSERT INTO invoices (id, total) VALUES (7, 990)")
        .execute(&mut *tx)
        .await
        .expect("the application's write");
    let sent = job(&q, 7);
    t.publish_tx(&mut tx, sent.clone())
        .await
        .expect("publish_tx");

    // A claim started now waits for the write connection the transaction holds, so it
    // runs after the commit and finds the message (it never sees an uncommitted row).
    let claim = tokio::spawn({
        let (t, q) = (t.clone(), q.clone());
        async move { t.reserve(&q).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !claim.is_finished(),
        "a claim ran inside the open transaction"
    );
    tx.commit().await.expect("commit");

    let r = tokio::time::timeout(Duration::from_secs(10), claim)
        .await
        .expect("the claim ran after the commit")
        .expect("the claim task")
        .expect("reserve")
        .expect("the committed message");
    assert_eq!(r.id(), sent.id);
    assert_eq!(r.envelope.payload.get(), sent.payload.get());
    t.ack(&r).await.expect("ack");
    assert_eq!(invoices(&t).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_stores_nothing_and_leaves_the_transaction_usable() {
    let (_dir, t) = open().await;
    let mut options = t.options().clone();
    options.max_payload_bytes = 1024;
    let t = SqliteTransport::connect(options)
        .await
        .expect("connect with a small payload limit");
    let q = QueueName::new("outbox.size").expect("queue");
    let big = Envelope::builder(q.as_str(), "invoice.created")
        .payload(&"x".repeat(4096))
        .build()
        .expect("a valid envelope");

    let mut tx = t.pool().begin().await.expect("begin");
    let err = t
        .publish_batch_tx(&mut tx, vec![job(&q, 1), big])
        .await
        .expect_err("an envelope over the limit");
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("1024")),
        "the error names the limit: {err}"
    );
    // The transaction goes on: the application decides what to commit.
    t.publish_tx(&mut tx, job(&q, 2)).await.expect("publish_tx");
    tx.commit().await.expect("commit");

    let r = t.reserve(&q).await.expect("reserve").expect("one message");
    assert_eq!(r.envelope.payload.get(), r#"{"invoice":2}"#);
    t.ack(&r).await.expect("ack");
    assert!(t.reserve(&q).await.expect("reserve").is_none());
}

/// A unique key in the caller's transaction is taken only if it commits; key rows whose
/// jobs are gone are pruned while held keys and throttles stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_keys_in_the_outbox_and_their_rows_pruned() {
    let (_dir, t) = open().await;
    let q = QueueName::new("unique").expect("queue");
    let keyed = |key: &str| {
        Envelope::builder(q.as_str(), key)
            .unique(Unique::new(key))
            .build()
            .expect("a valid envelope")
    };
    let mut tx = t.pool().begin().await.expect("begin");
    assert!(t
        .publish_tx(&mut tx, keyed("a"))
        .await
        .expect("publish")
        .duplicates
        .is_empty());
    tx.rollback().await.expect("rollback");
    let a = keyed("a");
    let mut tx = t.pool().begin().await.expect("begin");
    assert!(t
        .publish_tx(&mut tx, a.clone())
        .await
        .expect("publish")
        .duplicates
        .is_empty());
    let dup = t.publish_tx(&mut tx, keyed("a")).await.expect("publish");
    assert_eq!(dup.duplicates.first().map(|d| d.existing), Some(a.id));
    tx.commit().await.expect("commit");

    t.publish(keyed("held")).await.expect("publish");
    let throttle = || {
        Envelope::builder(q.as_str(), "thr")
            .unique(Unique::throttle("thr", Duration::from_secs(3600)))
            .build()
            .expect("a valid envelope")
    };
    t.publish(throttle()).await.expect("publish");
    let done = t.reserve_batch(&q, 10).await.expect("reserve");
    let (gone, kept): (Vec<_>, Vec<_>) = done.into_iter().partition(|r| r.envelope.kind != "held");
    t.ack_batch(&gone).await.expect("ack");
    assert_eq!(
        t.prune_unique_keys(Duration::ZERO).await.expect("prune"),
        1,
        "only the acked job's key row holds nothing"
    );
    assert!(t
        .publish(keyed("a"))
        .await
        .expect("publish")
        .duplicates
        .is_empty());
    assert_eq!(
        t.publish(keyed("held"))
            .await
            .expect("publish")
            .duplicates
            .len(),
        1
    );
    assert_eq!(
        t.publish(throttle())
            .await
            .expect("publish")
            .duplicates
            .len(),
        1
    );
    t.ack_batch(&kept).await.expect("ack");
}
