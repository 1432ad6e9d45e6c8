//! The inbox's main case: messages from RabbitMQ, their effects and the inbox in the
//! application's PostgreSQL database. A delivery whose worker died after its commit but
//! before its ack comes back, and its effect stays single.

#![cfg(all(feature = "amqp", feature = "postgres"))]

use std::time::Duration;

use queue_core::{Envelope, Error, QueueName, Reservation, Result, Transport, TransportExt};
use switchyard::sqlx::{self, postgres::PgPoolOptions};
use switchyard::{AmqpOptions, AmqpTransport, PgInbox};

fn amqp_url() -> String {
    std::env::var("SWITCHYARD_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn pg_url() -> String {
    std::env::var("SWITCHYARD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::backend("postgres", false, e)
}

async fn delivery(t: &AmqpTransport, q: &QueueName) -> Result<Reservation> {
    for _ in 0..400 {
        if let Some(r) = t.reserve(q).await? {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(Error::InvalidInput(format!(
        "nothing was delivered from {q}"
    )))
}

/// One delivery handled the inbox's way; whether it did the work.
async fn handle(
    pool: &sqlx::PgPool,
    inbox: &PgInbox,
    effects: &str,
    r: &Reservation,
) -> Result<bool> {
    let mut tx = pool.begin().await.map_err(err)?;
    let first = inbox.claim(&mut tx, r.id()).await?;
    if first {
        sqlx::query(&format!("INSERT INTO {effects} VALUES ($1)"))
            .bind(r.id())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    tx.commit().await.map_err(err)?;
    Ok(first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_redelivery_finds_its_id_in_the_postgres_inbox() -> Result<()> {
    for (backend, url, port) in [
        ("RabbitMQ", amqp_url(), 5672),
        ("PostgreSQL", pg_url(), 5432),
    ] {
        if let Some(reason) = queue_core::conformance::skip_unless_reachable(backend, &url, port) {
            eprintln!("SKIPPED: {reason}");
            return Ok(());
        }
    }
    let t = AmqpTransport::connect(AmqpOptions::new(amqp_url())).await?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg_url())
        .await
        .map_err(err)?;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let schema = format!("sy_inbox_{}", &tag[..12]);
    let inbox = PgInbox::open(pool.clone(), Some(&schema), None).await?;
    let effects = format!("\"{schema}\".effects");
    sqlx::query(&format!("CREATE TABLE {effects} (message uuid NOT NULL)"))
        .execute(&pool)
        .await
        .map_err(err)?;
    let q = QueueName::new(format!("inbox.{tag}"))?;

    let outcome = async {
        let sent = Envelope::builder(q.as_str(), "charge").build()?;
        t.publish(sent.clone()).await?;
        let first = delivery(&t, &q).await?;
        assert!(
            handle(&pool, &inbox, &effects, &first).await?,
            "the first delivery works"
        );
        // The worker dies after its commit, before its ack: the broker delivers again.
        t.release(
            &first,
            Duration::ZERO,
            Some("the worker died before its ack"),
        )
        .await?;
        let again = delivery(&t, &q).await?;
        assert_eq!(again.id(), sent.id);
        assert!(
            !handle(&pool, &inbox, &effects, &again).await?,
            "the redelivery was taken for a first delivery"
        );
        t.ack(&again).await?;
        let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {effects}"))
            .fetch_one(&pool)
            .await
            .map_err(err)?;
        assert_eq!(count, 1, "the effect ran once");
        assert!(t.stats(Some(&q)).await?.iter().all(|s| s.ready == 0));
        Ok::<(), Error>(())
    }
    .await;
    let _ = t.delete_queue(&q).await;
    t.close().await;
    let _ = sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&pool)
        .await;
    outcome
}
