//! SQLite stores any type in any column: rows written by another program with bytes
//! that are not UTF-8 or numbers that are text must be quarantined, not fail the claim.

use queue_core::{reason, Envelope, QueueName, Transport};
use sqlx::Connection;
use transport_sqlite::{SqliteOptions, SqliteTransport};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_foreign_bytes_and_types_are_quarantined_and_the_queue_goes_on() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let t = SqliteTransport::connect(SqliteOptions::new(url.clone()))
        .await
        .expect("connect");
    let mut raw = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("raw connection");
    let now = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)";
    sqlx::query(&format!(
        "INSERT INTO switchyard_jobs (id, queue, kind, priority, attempts, available_at, visible_at, created_at, envelope) \
         VALUES (X'FF00FE', 'foreign', 'k', 'high', 'many', {now}, {now}, {now}, X'7B22763A31FF')"
    ))
    .execute(&mut raw)
    .await
    .expect("insert a foreign row");
    let good = Envelope::builder("foreign", "good")
        .build()
        .expect("envelope");
    t.publish(good.clone()).await.expect("publish");

    let q = QueueName::new("foreign").expect("queue");
    let r = t
        .reserve(&q)
        .await
        .expect("reserve")
        .expect("the good message");
    assert_eq!(r.id(), good.id);
    t.ack(&r).await.expect("ack");

    let dead = t.dead_list(Some(&q), 10).await.expect("dead list");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].reason, reason::MALFORMED);
    assert!(
        dead[0]
            .raw
            .as_deref()
            .is_some_and(|b| b.starts_with("{\"v:1")),
        "{dead:?}"
    );
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("UTF-8")),
        "{dead:?}"
    );
    // The body is kept byte for byte in the dead table.
    let bytes: Vec<u8> =
        sqlx::query_scalar("SELECT CAST(envelope AS BLOB) FROM switchyard_jobs_dead")
            .fetch_one(&mut raw)
            .await
            .expect("the stored body");
    assert_eq!(bytes, b"{\"v:1\xff");
}
