//! SQLite stores any type in any column: rows written by another program with bytes
//! that are not UTF-8 or numbers that are text must be quarantined, not fail the claim.

use queue_core::{reason, DeadLetters, Envelope, QueueName, Transport, TransportExt};
use sqlx::Connection;
use transport_sqlite::{SqliteOptions, SqliteTransport};

const NOW: &str = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)";

/// A transport on a fresh file, and a raw connection to write what another program might.
async fn open() -> (tempfile::TempDir, SqliteTransport, sqlx::SqliteConnection) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let t = SqliteTransport::connect(SqliteOptions::new(url.clone()))
        .await
        .expect("connect");
    let raw = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("raw connection");
    (dir, t, raw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_foreign_bytes_and_types_are_quarantined_and_the_queue_goes_on() {
    let (_dir, t, mut raw) = open().await;
    let now = NOW;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_kind_or_queue_never_breaks_dead_list_or_stats() {
    let (_dir, t, mut raw) = open().await;
    let now = NOW;
    sqlx::query(&format!(
        "INSERT INTO switchyard_jobs (id, queue, kind, priority, available_at, visible_at, created_at, envelope) \
         VALUES ('x1', 'foreign', X'FF', -9223372036854775808, {now}, {now}, {now}, 'garbage')"
    ))
    .execute(&mut raw)
    .await
    .expect("insert a foreign row");
    let q = QueueName::new("foreign").expect("queue");
    assert!(t.reserve(&q).await.expect("reserve").is_none());
    let dead = t
        .dead_list(None, 10)
        .await
        .expect("dead list survives foreign bytes");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].kind, "\u{fffd}");
    assert_eq!(dead[0].reason, reason::MALFORMED);
    let stats = t.stats(None).await.expect("stats survive foreign bytes");
    assert_eq!(stats.iter().map(|s| s.dead).sum::<u64>(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_numbers_are_never_reused_and_keywords_work_as_table_names() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let t = SqliteTransport::connect(SqliteOptions::new(url.clone()).with_table("select"))
        .await
        .expect("a keyword is a fine table name once quoted");
    let q = QueueName::new("seq").expect("queue");
    for _ in 0..2 {
        t.publish(Envelope::builder("seq", "k").build().expect("envelope"))
            .await
            .expect("publish");
    }
    let all = t.reserve_batch(&q, 2).await.expect("reserve");
    let top = all.iter().map(|r| r.receipt.tag()).max().expect("two rows");
    t.ack_batch(&all).await.expect("ack");
    t.publish(Envelope::builder("seq", "k").build().expect("envelope"))
        .await
        .expect("publish");
    let next = t
        .reserve(&q)
        .await
        .expect("reserve")
        .expect("the third message");
    assert!(
        next.receipt.tag() > top,
        "a deleted row's number was reused"
    );
}

/// A build refuses a table whose schema is newer than the versions it knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_from_a_newer_build_is_refused() {
    let (dir, t, mut raw) = open().await;
    drop(t);
    sqlx::query(
        "INSERT INTO switchyard_migrations (target, version, applied_at) VALUES ('switchyard_jobs', 99, 0)",
    )
    .execute(&mut raw)
    .await
    .expect("record a newer version");
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let refused = SqliteTransport::connect(SqliteOptions::new(url))
        .await
        .expect_err("a newer schema is refused")
        .to_string();
    assert!(
        refused.contains("version 99") && refused.contains("upgrade"),
        "{refused}"
    );
}
