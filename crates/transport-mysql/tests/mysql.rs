//! What only MySQL/MariaDB needs shown: publishing inside the caller's transaction, that
//! a claim's scan leaves publishers alone, and that heavy contention surfaces no
//! deadlock or lock-wait error and neither loses nor doubles a message.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queue_core::{
    Claim, ClaimStrategy, DeadLetters, DeadSelection, Envelope, QueueName, Transport, TransportExt,
    Unique,
};
use support::{err, with_server, Database};
use transport_mysql::MySqlTransport;
use uuid::Uuid;

fn queue() -> QueueName {
    QueueName::new(format!("my.{}", Uuid::new_v4().simple())).expect("a valid queue name")
}

fn job(q: &QueueName, n: usize) -> Envelope {
    Envelope::builder(q.as_str(), "job")
        .payload(&serde_json::json!({ "n": n }))
        .build()
        .expect("a valid envelope")
}

/// A keyed outbox publish reads whether its key is free after taking the key's lock: a
/// transaction at REPEATABLE READ (MySQL's default, not the transport's) is refused, and
/// one on the transport's own READ COMMITTED connections parks the key's second message.
#[test]
fn keyed_outbox_publishes_need_read_committed() {
    with_server(|| async {
        use sqlx::Connection;
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let keyed = |n: usize| {
            Envelope::builder(q.as_str(), format!("k{n}"))
                .ordering_key("order-1")
                .build()
        };
        let mut own = sqlx::MySqlConnection::connect(&support::url())
            .await
            .map_err(err)?;
        sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut own)
            .await
            .map_err(err)?;
        let mut tx = own.begin().await.map_err(err)?;
        match t.publish_tx(&mut tx, keyed(1)?).await {
            Err(queue_core::Error::InvalidInput(why)) => {
                assert!(why.contains("READ COMMITTED"), "{why}")
            }
            other => panic!("a keyed publish at REPEATABLE READ: {other:?}"),
        }
        tx.rollback().await.map_err(err)?;
        let mut tx = t.pool().begin().await.map_err(err)?;
        t.publish_tx(&mut tx, keyed(1)?).await?;
        t.publish_tx(&mut tx, keyed(2)?).await?;
        tx.commit().await.map_err(err)?;
        let first = t.reserve_batch(&q, 10).await?;
        assert_eq!(first.len(), 1, "both messages of one key were claimable");
        t.ack_batch(&first).await?;
        let second = t.reserve_batch(&q, 10).await?;
        assert_eq!(second.first().map(|r| r.envelope.kind.as_str()), Some("k2"));
        Ok(())
    });
}

/// A unique key in the caller's transaction: refused at REPEATABLE READ (a snapshot
/// older than the key's lock), taken only if the transaction commits; and key rows
/// whose jobs are gone are pruned while held keys and throttles stay.
#[test]
fn unique_keys_in_the_outbox_and_their_rows_pruned() {
    with_server(|| async {
        use sqlx::Connection;
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let keyed = |key: &str| {
            Envelope::builder(q.as_str(), key)
                .unique(Unique::new(key))
                .build()
        };
        let mut own = sqlx::MySqlConnection::connect(&support::url())
            .await
            .map_err(err)?;
        sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut own)
            .await
            .map_err(err)?;
        let mut tx = own.begin().await.map_err(err)?;
        match t.publish_tx(&mut tx, keyed("a")?).await {
            Err(queue_core::Error::InvalidInput(why)) => {
                assert!(why.contains("READ COMMITTED"), "{why}")
            }
            other => panic!("a unique publish in a REPEATABLE READ transaction: {other:?}"),
        }
        tx.rollback().await.map_err(err)?;
        let mut tx = t.pool().begin().await.map_err(err)?;
        assert!(t
            .publish_tx(&mut tx, keyed("a")?)
            .await?
            .duplicates
            .is_empty());
        tx.rollback().await.map_err(err)?;
        // The rolled-back publish took nothing: the key is free.
        let a = keyed("a")?;
        let mut tx = t.pool().begin().await.map_err(err)?;
        assert!(t
            .publish_tx(&mut tx, a.clone())
            .await?
            .duplicates
            .is_empty());
        let dup = t.publish_tx(&mut tx, keyed("a")?).await?;
        assert_eq!(dup.duplicates.first().map(|d| d.existing), Some(a.id));
        tx.commit().await.map_err(err)?;

        let held = keyed("held")?;
        t.publish(held).await?;
        let throttled = Envelope::builder(q.as_str(), "thr")
            .unique(Unique::throttle("thr", Duration::from_secs(3600)))
            .build()?;
        t.publish(throttled).await?;
        let done = t.reserve_batch(&q, 10).await?;
        let (gone, kept): (Vec<_>, Vec<_>) =
            done.into_iter().partition(|r| r.envelope.kind != "held");
        t.ack_batch(&gone).await?;
        assert_eq!(
            t.prune_unique_keys(Duration::ZERO).await?,
            1,
            "only the acked job's key row holds nothing"
        );
        assert!(t.publish(keyed("a")?).await?.duplicates.is_empty());
        assert_eq!(t.publish(keyed("held")?).await?.duplicates.len(), 1);
        let thr = Envelope::builder(q.as_str(), "thr")
            .unique(Unique::throttle("thr", Duration::from_secs(3600)))
            .build()?;
        assert_eq!(t.publish(thr).await?.duplicates.len(), 1);
        t.ack_batch(&kept).await?;
        Ok(())
    });
}

#[test]
fn publish_in_the_callers_transaction_exists_only_after_commit() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();

        let mut tx = t.pool().begin().await.map_err(err)?;
        t.publish_tx(&mut tx, job(&q, 1)).await?;
        t.publish_batch_tx(&mut tx, vec![job(&q, 2), job(&q, 3)])
            .await?;
        assert!(
            t.reserve(&q).await?.is_none(),
            "an uncommitted publish was visible"
        );
        tx.rollback().await.map_err(err)?;
        assert!(
            t.reserve(&q).await?.is_none(),
            "a rolled-back publish survived"
        );
        assert!(t.stats(Some(&q)).await?.is_empty());

        let kept = job(&q, 4);
        let mut tx = t.pool().begin().await.map_err(err)?;
        t.publish_tx(&mut tx, kept.clone()).await?;
        tx.commit().await.map_err(err)?;
        let r = t.reserve(&q).await?.expect("the committed message");
        assert_eq!(r.id(), kept.id);
        t.ack(&r).await?;
        Ok(())
    });
}

/// Eight reservers hold their claim transactions open on an empty queue (at REPEATABLE
/// READ their scans would lock the gap where new rows go); publishing still goes
/// through at once.
#[test]
fn claims_in_progress_never_block_publishers() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = MySqlTransport::connect(
            db.options(ClaimStrategy::SkipLocked)
                .with_max_connections(10),
        )
        .await?;
        let publisher = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let claim = format!(
            "SELECT seq FROM `{}`.`switchyard_jobs` WHERE queue = ? AND ready = 1 \
             ORDER BY prio_rank, visible_at, seq LIMIT 16 FOR UPDATE SKIP LOCKED",
            db.name
        );
        let mut open = Vec::new();
        for _ in 0..8 {
            // The transport's own connections: its session settings apply.
            let mut tx = t.pool().begin().await.map_err(err)?;
            sqlx::query(&claim)
                .bind(q.as_str())
                .fetch_all(&mut *tx)
                .await
                .map_err(err)?;
            open.push(tx);
        }
        for n in 0..50 {
            tokio::time::timeout(Duration::from_secs(10), publisher.publish(job(&q, n)))
                .await
                .map_err(|_| err("a publish waited on a claim's locks"))??;
        }
        drop(open);
        let s = publisher.stats(Some(&q)).await?;
        assert_eq!(s.first().map(|s| s.ready), Some(50));
        Ok(())
    });
}

/// 32 reservers and 4 publishers for 20 seconds: no error reaches a caller, and every
/// message is handled exactly once.
#[test]
fn thirty_two_reservers_and_four_publishers_lose_and_double_nothing() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let options = db
            .options(ClaimStrategy::SkipLocked)
            .with_max_connections(40);
        let t = Arc::new(MySqlTransport::connect(options).await?);
        let q = queue();
        let published: Arc<Mutex<Vec<Uuid>>> = Arc::default();
        let handled: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
        let publishing = Arc::new(AtomicBool::new(true));
        let mut tasks = Vec::new();
        for p in 0..4 {
            let (t, q, published, publishing) =
                (t.clone(), q.clone(), published.clone(), publishing.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0;
                while publishing.load(Ordering::SeqCst) {
                    let batch: Vec<Envelope> =
                        (0..10).map(|i| job(&q, p * 1_000_000 + n + i)).collect();
                    let ids: Vec<Uuid> = batch.iter().map(|e| e.id).collect();
                    t.publish_batch(batch).await?;
                    published.lock().map_err(|_| err("poisoned"))?.extend(ids);
                    n += 10;
                }
                Ok::<(), queue_core::Error>(())
            }));
        }
        for _ in 0..32 {
            let (t, q, handled, publishing) =
                (t.clone(), q.clone(), handled.clone(), publishing.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let batch = t.reserve_batch(&q, 10).await?;
                    if batch.is_empty() {
                        if !publishing.load(Ordering::SeqCst) {
                            return Ok(());
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    {
                        let mut handled = handled.lock().map_err(|_| err("poisoned"))?;
                        for r in &batch {
                            *handled.entry(r.id()).or_default() += 1;
                        }
                    }
                    let report = t.ack_batch(&batch).await?;
                    assert!(report.lost.is_empty(), "leases lost: {:?}", report.lost);
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(20)).await;
        publishing.store(false, Ordering::SeqCst);
        for task in tasks {
            task.await.map_err(err)??;
        }
        // Whatever the reservers left when they saw the queue empty.
        while let Some(r) = t.reserve(&q).await? {
            *handled
                .lock()
                .map_err(|_| err("poisoned"))?
                .entry(r.id())
                .or_default() += 1;
            t.ack(&r).await?;
        }
        let published = published.lock().map_err(|_| err("poisoned"))?.clone();
        let handled = handled.lock().map_err(|_| err("poisoned"))?.clone();
        let missing = published
            .iter()
            .filter(|id| !handled.contains_key(id))
            .count();
        let doubled = handled.values().filter(|n| **n > 1).count();
        eprintln!(
            "{} published, {} handled, {} lock conflicts retried",
            published.len(),
            handled.len(),
            t.lock_retries()
        );
        assert!(published.len() > 1_000, "the publishers barely ran");
        assert_eq!(missing, 0, "messages lost");
        assert_eq!(doubled, 0, "messages claimed twice");
        assert_eq!(handled.len(), published.len());
        Ok(())
    });
}

/// While a queue has a backlog, a claim starts where the last one ended (past the
/// delete-marked index entries at the head); a message that became ready before that
/// position, here a higher priority published by another process, is still claimed
/// first once the cursor has expired (100 ms), and nothing is stranded behind it.
#[test]
fn a_message_behind_the_claim_cursor_is_claimed_after_it_expires() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let worker = db.open(ClaimStrategy::SkipLocked).await?;
        let other = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        worker
            .publish_batch((0..300).map(|n| job(&q, n)).collect())
            .await?;
        let mut claimed = std::collections::HashSet::new();
        let first = worker.reserve_batch(&q, 100).await?;
        assert_eq!(first.len(), 100, "a full claim");
        claimed.extend(first.iter().map(|r| r.id()));

        let high = Envelope::builder(q.as_str(), "high").priority(5).build()?;
        other.publish(high.clone()).await?;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let next = worker.reserve_batch(&q, 1).await?;
        assert_eq!(
            next.first().map(|r| r.id()),
            Some(high.id),
            "the higher priority first once the cursor expired"
        );
        claimed.extend(next.iter().map(|r| r.id()));
        loop {
            let got = worker.reserve_batch(&q, 100).await?;
            if got.is_empty() {
                break;
            }
            for r in &got {
                assert!(claimed.insert(r.id()), "{} claimed twice", r.id());
            }
        }
        assert_eq!(claimed.len(), 301, "every message claimed once");
        Ok(())
    });
}

/// A higher priority published by the claiming transport itself is claimed next, at
/// once: the publish forgets the queue's claim cursor.
#[test]
fn a_higher_priority_published_here_is_claimed_next_under_a_backlog() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        t.publish_batch((0..300).map(|n| job(&q, n)).collect())
            .await?;
        assert_eq!(t.reserve_batch(&q, 100).await?.len(), 100, "a full claim");
        let high = Envelope::builder(q.as_str(), "high").priority(5).build()?;
        t.publish(high.clone()).await?;
        let next = t.reserve_batch(&q, 1).await?;
        assert_eq!(next.first().map(|r| r.id()), Some(high.id));
        Ok(())
    });
}

/// With a million ready rows carrying ten labels, one each, a claim that selects two
/// labels walks the claim index in delivery order and checks each row's labels as it goes:
/// no full scan, no filesort, and it takes only those labels.
#[test]
fn a_label_claim_walks_the_claim_index_at_a_depth_of_one_million() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let table = format!("`{}`.`switchyard_jobs`", db.name);
        let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
             UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
             UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let numbers = format!(
            "SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * g.d AS n \
               FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f, {digits} g"
        );
        sqlx::query(&format!(
            "INSERT INTO {table} (id, queue, kind, priority, prio_rank, attempts, ready,
                 available_at, visible_at, created_at, envelope, labels)
             SELECT r.id, ?, 'k', 0, 0, 0, 1, r.at, r.at, r.at,
                    JSON_OBJECT('v', 1, 'id', r.id, 'queue', ?, 'kind', 'k', 'payload', NULL,
                        'attempts', 0, 'priority', 0, 'created_at', '2026-01-01T00:00:00Z',
                        'available_at', '2026-01-01T00:00:00Z', 'headers', JSON_OBJECT(),
                        'labels', JSON_ARRAY(CONCAT('l', r.n % 10))),
                    CONCAT(',l', r.n % 10, ',')
               FROM (SELECT UUID() AS id, n, 1767225600000000 + n AS at FROM ({numbers}) AS x) AS r"
        ))
        .bind(q.as_str())
        .bind(q.as_str())
        .execute(t.pool())
        .await
        .map_err(err)?;
        sqlx::query(&format!("ANALYZE TABLE {table}"))
            .execute(t.pool())
            .await
            .map_err(err)?;
        let filter = vec!["l3".to_owned(), "l7".to_owned()];
        let plan = t.explain_claim(&q, 100, &filter).await?;
        eprintln!("plan of a claim of labels l3 or l7 at a depth of 1,000,000:\n{plan}");
        assert!(plan.contains("claim_idx"), "not the claim index:\n{plan}");
        assert!(
            !plan.contains("ALL") && !plan.contains("filesort"),
            "the label claim scans or sorts:\n{plan}"
        );
        let started = std::time::Instant::now();
        let claimed = t
            .claim(&q, Claim::reserve(100).with_labels(&filter))
            .await?;
        eprintln!(
            "a claim of 100 messages of 2 labels in 10 at that depth took {:?}",
            started.elapsed()
        );
        assert_eq!(claimed.len(), 100);
        assert!(claimed
            .iter()
            .all(|r| r.envelope.labels == ["l3"] || r.envelope.labels == ["l7"]));
        Ok(())
    });
}

/// A tombstone whose dead letter is gone (a version-1 purge during an upgrade removed
/// it) is freed by a purge of everything: its id can be published again.
#[test]
fn a_purge_of_everything_frees_orphan_tombstones() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let orphan = job(&q, 1);
        t.publish(orphan.clone()).await?;
        let r = t.reserve(&q).await?.expect("the message");
        t.dead_letter(&r, "failed", None).await?;
        sqlx::query(&format!("DELETE FROM `{}`.switchyard_jobs_dead", db.name))
            .execute(t.pool())
            .await
            .map_err(err)?;
        t.publish(orphan.clone()).await?;
        assert!(t.reserve(&q).await?.is_none(), "the orphan keeps its id");
        assert_eq!(t.dead_purge(None, &DeadSelection::All).await?, 0);
        t.publish(orphan.clone()).await?;
        let again = t.reserve(&q).await?.expect("the id is free again");
        assert_eq!(again.id(), orphan.id);
        Ok(())
    });
}

/// An idle worker whose own polls are 30 s apart is woken by a publish of another
/// transport (another process, say): the publish watch sees the newest seq grow.
#[test]
fn a_publish_of_another_transport_wakes_an_idle_worker() {
    with_server(|| async {
        use queue_core::worker::{handler_fn, JobContext, Worker, WorkerOptions};
        let db = Database::fresh().await?;
        let worker_side = db.open(ClaimStrategy::SkipLocked).await?;
        let publisher = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let got = Arc::new(tokio::sync::Notify::new());
        let g = got.clone();
        let options =
            WorkerOptions::default().with_poll(Duration::from_secs(30), Duration::from_secs(30));
        let worker = Worker::new(worker_side, q.clone(), options).handle_any(handler_fn(
            move |_ctx: JobContext| {
                g.notify_one();
                async { Ok(()) }
            },
        ));
        let stop = queue_core::CancellationToken::new();
        let running = tokio::spawn(worker.run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await; // idle, and asleep
        for n in 0..2 {
            publisher.publish(job(&q, n)).await?;
            let woke = tokio::time::timeout(Duration::from_secs(5), got.notified()).await;
            assert!(
                woke.is_ok(),
                "publish {n}: the worker slept through it (poll pause 30 s)"
            );
        }
        stop.cancel();
        running.await.map_err(err)??;
        Ok(())
    });
}

/// The longest table name the configuration accepts (56 characters) migrates, its
/// status table too: index names are scoped to their table and never grow with it.
#[test]
fn the_longest_table_name_migrates() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let table = "t".repeat(56);
        let t = MySqlTransport::connect(db.options(ClaimStrategy::SkipLocked).with_table(table))
            .await?;
        let q = queue();
        t.publish(job(&q, 1)).await?;
        let r = t.reserve(&q).await?.expect("the message");
        t.dead_letter(&r, "failed", Some("x")).await?;
        assert_eq!(t.dead_list(Some(&q), 10).await?.len(), 1);
        let status = t.status_store();
        status
            .record(&[queue_core::status::StatusUpdate::running(&r.envelope, 1)])
            .await?;
        assert!(status.get(r.envelope.id).await?.is_some());
        Ok(())
    });
}

/// A build refuses a table whose schema is newer than the versions it knows.
#[test]
fn a_table_from_a_newer_build_is_refused() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        sqlx::query(&format!(
            "INSERT INTO `{}`.switchyard_migrations (target, version, applied_at) \
             VALUES ('switchyard_jobs', 99, 0)",
            db.name
        ))
        .execute(t.pool())
        .await
        .map_err(err)?;
        t.close().await;
        let refused = db
            .open(ClaimStrategy::SkipLocked)
            .await
            .expect_err("a newer schema is refused")
            .to_string();
        assert!(
            refused.contains("version 99") && refused.contains("upgrade"),
            "{refused}"
        );
        Ok(())
    });
}

/// Upgrading a table of schema version 1, whose dead letters left no tombstones: the
/// migration gives them tombstones, so their ids stay taken, and leaves alone an id that
/// was published again under version 1 (it is live).
#[test]
fn a_version_one_table_gets_tombstones_for_its_dead_letters() {
    with_server(|| async {
        let db = Database::fresh().await?;
        let t = db.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let (again, dead) = (job(&q, 1), job(&q, 2));
        t.publish_batch(vec![again.clone(), dead.clone()]).await?;
        for r in t.reserve_batch(&q, 10).await? {
            t.dead_letter(&r, "failed", None).await?;
        }
        // Back to what version 1 left: dead letters without tombstones, one of them
        // published again since.
        for sql in [
            format!("DELETE FROM `{}`.switchyard_jobs WHERE ready = 2", db.name),
            format!(
                "DELETE FROM `{}`.switchyard_migrations WHERE version = 2",
                db.name
            ),
        ] {
            sqlx::query(&sql).execute(t.pool()).await.map_err(err)?;
        }
        t.publish(again.clone()).await?;
        t.close().await;

        let t = db.open(ClaimStrategy::SkipLocked).await?;
        t.publish(dead.clone()).await?;
        let live = t.reserve_batch(&q, 10).await?;
        assert_eq!(
            live.iter().map(|r| r.id()).collect::<Vec<_>>(),
            vec![again.id],
            "only the id published again under version 1 is live"
        );
        let tombstones: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM `{}`.switchyard_jobs WHERE ready = 2",
            db.name
        ))
        .fetch_one(t.pool())
        .await
        .map_err(err)?;
        assert_eq!(tombstones, 1);
        let s = t.stats(Some(&q)).await?;
        assert_eq!(
            (s[0].ready, s[0].delayed, s[0].reserved, s[0].dead),
            (0, 0, 1, 2),
            "{s:?}"
        );
        Ok(())
    });
}
