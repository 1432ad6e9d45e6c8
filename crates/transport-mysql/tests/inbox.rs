//! The consumer inbox on MySQL and MariaDB: a message delivered twice (its lease lapsed while
//! the first handler committed) has its effect once.

mod support;

use std::sync::Arc;
use std::time::Duration;

use queue_core::{ClaimStrategy, Envelope, Error, QueueName, Result, TransportExt};
use support::{err, with_server, Database};
use transport_mysql::{MySqlInbox, MySqlTransport};

/// Reserves until the lapsed lease is reclaimed (the sweep runs on a claim's schedule).
async fn redelivered(t: &MySqlTransport, q: &QueueName) -> Result<queue_core::Reservation> {
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

#[test]
fn a_message_delivered_twice_has_its_effect_once() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let lease = Duration::from_millis(400);
        let t = Arc::new(
            MySqlTransport::connect(
                db.options(ClaimStrategy::SkipLocked)
                    .with_visibility_timeout(lease),
            )
            .await?,
        );
        let pool = t.pool().clone();
        let inbox = MySqlInbox::open(pool.clone(), Some(&db.name), None).await?;
        let effects = format!("`{}`.effects", db.name);
        sqlx::query(&format!(
            "CREATE TABLE {effects} (message CHAR(36) NOT NULL)"
        ))
        .execute(&pool)
        .await
        .map_err(err)?;
        let q = QueueName::new("inbox.twice")?;
        let sent = Envelope::builder(q.as_str(), "charge").build()?;
        t.publish(sent.clone()).await?;

        // The first delivery does its work and is slow to commit: its lease lapses.
        let first = t.reserve(&q).await?.expect("the first delivery");
        let mut tx = pool.begin().await.map_err(err)?;
        assert!(inbox.claim(&mut tx, first.id()).await?, "first claim");
        sqlx::query(&format!("INSERT INTO {effects} VALUES (?)"))
            .bind(first.id().to_string())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tokio::time::sleep(lease * 2).await;

        // Meanwhile the message is delivered again; that handler's claim waits for the
        // first transaction.
        let second = redelivered(&t, &q).await?;
        assert_eq!(second.id(), sent.id);
        let again = tokio::spawn({
            let (t, inbox, pool, effects) =
                (t.clone(), inbox.clone(), pool.clone(), effects.clone());
            async move {
                let mut tx = pool.begin().await.map_err(err)?;
                let first_time = inbox.claim(&mut tx, second.id()).await?;
                if first_time {
                    sqlx::query(&format!("INSERT INTO {effects} VALUES (?)"))
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
        assert!(!again.is_finished(), "the second claim did not wait");
        tx.commit().await.map_err(err)?;
        assert!(
            !again.await.map_err(err)??,
            "the redelivery was taken for a first delivery"
        );
        // The stale first worker's ack is fenced; its work stands, once.
        let stale = t.ack(&first).await;
        assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
        let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {effects}"))
            .fetch_one(&pool)
            .await
            .map_err(err)?;
        assert_eq!(count, 1, "the effect ran once");

        // Pruning keeps recent ids and removes old ones.
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
    });
}

#[test]
fn a_rolled_back_claim_leaves_the_id_unclaimed_and_bad_names_are_refused() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = MySqlTransport::connect(db.options(ClaimStrategy::SkipLocked)).await?;
        let inbox =
            MySqlInbox::open(t.pool().clone(), Some(&db.name), Some("billing_inbox")).await?;
        // Opening again (another process, a restart) finds the table as it is.
        let again =
            MySqlInbox::open(t.pool().clone(), Some(&db.name), Some("billing_inbox")).await?;
        let id = uuid::Uuid::now_v7();
        let mut tx = t.pool().begin().await.map_err(err)?;
        assert!(inbox.claim(&mut tx, id).await?);
        tx.rollback().await.map_err(err)?;
        let mut tx = t.pool().begin().await.map_err(err)?;
        assert!(
            again.claim(&mut tx, id).await?,
            "a rolled-back claim left the id behind"
        );
        tx.commit().await.map_err(err)?;
        let mut tx = t.pool().begin().await.map_err(err)?;
        assert!(!inbox.claim(&mut tx, id).await?);
        tx.commit().await.map_err(err)?;

        let bad = MySqlInbox::open(t.pool().clone(), None, Some("inbox; DROP TABLE x")).await;
        assert!(
            matches!(&bad, Err(Error::Config(e)) if e.to_string().contains("inbox table")),
            "{bad:?}"
        );
        Ok(())
    });
}
