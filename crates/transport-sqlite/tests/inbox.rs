//! The consumer inbox on SQLite: a message delivered twice (its lease lapsed while the
//! first handler committed) has its effect once.

use std::sync::Arc;
use std::time::Duration;

use queue_core::{Envelope, Error, QueueName, Reservation, Result, TransportExt};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::SqlitePool;
use transport_sqlite::{SqliteInbox, SqliteOptions, SqliteTransport};

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::backend("sqlite", false, e)
}

/// The application's own pool on the queue's file, as a web process would have.
async fn app_pool(path: &std::path::Path) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(30)),
        )
        .await
        .expect("the application's pool")
}

/// Reserves until the lapsed lease is reclaimed.
async fn redelivered(t: &SqliteTransport, q: &QueueName) -> Result<Reservation> {
    for _ in 0..200 {
        if let Some(r) = t.reserve(q).await? {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(Error::InvalidInput(
        "the lapsed lease was never reclaimed".into(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_twice_has_its_effect_once() -> Result<()> {
    let dir = tempfile::tempdir().map_err(err)?;
    let path = dir.path().join("app.db");
    let lease = Duration::from_millis(400);
    let t = Arc::new(
        SqliteTransport::connect(
            SqliteOptions::new(format!("sqlite://{}", path.display()))
                .with_visibility_timeout(lease),
        )
        .await?,
    );
    let pool = app_pool(&path).await;
    let inbox = SqliteInbox::open(pool.clone(), None).await?;
    sqlx::query("CREATE TABLE effects (message TEXT NOT NULL)")
        .execute(&pool)
        .await
        .map_err(err)?;
    let q = QueueName::new("inbox.twice")?;
    let sent = Envelope::builder(q.as_str(), "charge").build()?;
    t.publish(sent.clone()).await?;

    // The first delivery does its work and is slow to commit: its lease lapses.
    let first = t.reserve(&q).await?.expect("the first delivery");
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
    assert!(inbox.claim(&mut tx, first.id()).await?, "first claim");
    sqlx::query("INSERT INTO effects VALUES (?)")
        .bind(first.id().to_string())
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    tokio::time::sleep(lease * 2).await;

    // Meanwhile another worker takes the message again: on SQLite its claim waits for
    // the write lock the first transaction holds, and runs once it commits.
    let again = tokio::spawn({
        let (t, inbox, pool, q) = (t.clone(), inbox.clone(), pool.clone(), q.clone());
        async move {
            let second = redelivered(&t, &q).await?;
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
            let first_time = inbox.claim(&mut tx, second.id()).await?;
            if first_time {
                sqlx::query("INSERT INTO effects VALUES (?)")
                    .bind(second.id().to_string())
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
            tx.commit().await.map_err(err)?;
            t.ack(&second).await?;
            Ok::<bool, Error>(first_time)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!again.is_finished(), "the second delivery did not wait");
    tx.commit().await.map_err(err)?;
    assert!(
        !again.await.map_err(err)??,
        "the redelivery was taken for a first delivery"
    );
    let stale = t.ack(&first).await;
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
        .fetch_one(&pool)
        .await
        .map_err(err)?;
    assert_eq!(count, 1, "the effect ran once");

    assert_eq!(inbox.prune(Duration::from_secs(3600)).await?, 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(inbox.prune(Duration::from_millis(10)).await?, 1);
    let mut tx = pool.begin().await.map_err(err)?;
    assert!(
        inbox.claim(&mut tx, sent.id).await?,
        "a pruned id counts as new"
    );
    tx.rollback().await.map_err(err)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_claim_leaves_the_id_unclaimed_and_bad_names_are_refused() -> Result<()> {
    let dir = tempfile::tempdir().map_err(err)?;
    let pool = app_pool(&dir.path().join("app.db")).await;
    let inbox = SqliteInbox::open(pool.clone(), Some("billing_inbox")).await?;
    let again = SqliteInbox::open(pool.clone(), Some("billing_inbox")).await?;
    let id = uuid::Uuid::now_v7();
    let mut tx = pool.begin().await.map_err(err)?;
    assert!(inbox.claim(&mut tx, id).await?);
    tx.rollback().await.map_err(err)?;
    let mut tx = pool.begin().await.map_err(err)?;
    assert!(
        again.claim(&mut tx, id).await?,
        "a rolled-back claim left the id behind"
    );
    tx.commit().await.map_err(err)?;
    let mut tx = pool.begin().await.map_err(err)?;
    assert!(!inbox.claim(&mut tx, id).await?);
    tx.commit().await.map_err(err)?;

    let bad = SqliteInbox::open(pool.clone(), Some("inbox; DROP TABLE x")).await;
    assert!(
        matches!(&bad, Err(Error::Config(e)) if e.to_string().contains("inbox table")),
        "{bad:?}"
    );
    Ok(())
}
