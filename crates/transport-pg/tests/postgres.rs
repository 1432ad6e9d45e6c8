//! What only PostgreSQL does: publishing inside the caller's transaction, `NOTIFY`
//! wake-ups across transports (and after the listening connection is killed), concurrent
//! migrations, a claim that stays an index scan at a depth of a million rows, and the
//! optimistic claim's rounds of one statement.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use queue_core::sql::{ClaimBy, OptimisticSlice, SqlBackend, StartMode};
use queue_core::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use queue_core::{
    CancellationToken, Claim, ClaimStrategy, Envelope, Error, LeaseToken, QueueName, Result,
    Transport, TransportExt, Unique,
};
use support::{with_server, Schema};
use transport_pg::sqlx::{self, Connection};
use transport_pg::PgTransport;

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::backend("postgres", false, e)
}

fn queue() -> QueueName {
    QueueName::new(format!("pg.{}", uuid::Uuid::new_v4().simple())).expect("a valid queue name")
}

fn job(q: &QueueName, n: usize) -> Envelope {
    Envelope::builder(q.as_str(), "job")
        .payload(&serde_json::json!({ "n": n }))
        .build()
        .expect("a valid envelope")
}

/// A worker that only polls every 30 s, so that it handles anything sooner only when
/// something wakes it. Returns the handled count and the stop token.
fn sleepy_worker(
    t: Arc<PgTransport>,
    q: &QueueName,
) -> (
    Arc<AtomicUsize>,
    Arc<tokio::sync::Notify>,
    CancellationToken,
) {
    let handled = Arc::new(AtomicUsize::new(0));
    let got = Arc::new(tokio::sync::Notify::new());
    let (h, g) = (handled.clone(), got.clone());
    let options =
        WorkerOptions::default().with_poll(Duration::from_secs(30), Duration::from_secs(30));
    let worker =
        Worker::new(t, q.clone(), options).handle_any(handler_fn(move |_ctx: JobContext| {
            h.fetch_add(1, Ordering::SeqCst);
            g.notify_one();
            async { Ok(()) }
        }));
    let stop = CancellationToken::new();
    tokio::spawn(worker.run(stop.clone()));
    (handled, got, stop)
}

/// A keyed outbox publish reads whether its key is free after taking the key's lock; a
/// REPEATABLE READ transaction's older snapshot could miss a message published meanwhile,
/// so it is refused, and a READ COMMITTED one parks the key's second message.
#[test]
fn keyed_outbox_publishes_need_read_committed() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let keyed = |n: usize| {
            Envelope::builder(q.as_str(), format!("k{n}"))
                .ordering_key("order-1")
                .build()
        };
        let mut tx = t.pool().begin().await.map_err(err)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let refused = t.publish_tx(&mut tx, keyed(1)?).await;
        match refused {
            Err(Error::InvalidInput(why)) => assert!(why.contains("READ COMMITTED"), "{why}"),
            other => panic!("a keyed publish in a REPEATABLE READ transaction: {other:?}"),
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
        let schema = Schema::fresh().await?;
        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let keyed = |key: &str| {
            Envelope::builder(q.as_str(), key)
                .unique(Unique::new(key))
                .build()
        };
        let mut tx = t.pool().begin().await.map_err(err)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        match t.publish_tx(&mut tx, keyed("a")?).await {
            Err(Error::InvalidInput(why)) => assert!(why.contains("READ COMMITTED"), "{why}"),
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
        let schema = Schema::fresh().await?;
        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();

        let mut tx = t.pool().begin().await.map_err(err)?;
        t.publish_tx(&mut tx, job(&q, 1)).await?;
        t.publish_batch_tx(&mut tx, vec![job(&q, 2), job(&q, 3)])
            .await?;
        // Not visible to anyone else before the commit.
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
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .map_err(err)?; // the caller's own work
        t.publish_tx(&mut tx, kept.clone()).await?;
        tx.commit().await.map_err(err)?;
        let r = t.reserve(&q).await?.expect("the committed message");
        assert_eq!(r.id(), kept.id);
        t.ack(&r).await?;
        assert!(t.reserve(&q).await?.is_none());
        Ok(())
    });
}

/// Publishes are plain inserts until an id is already stored; then the batch is stored
/// again, skipping stored ids, with nothing lost from any of its statements. Inside the
/// caller's transaction a stored id must not abort the caller's work either.
#[test]
fn stored_ids_are_skipped_and_the_rest_of_the_batch_kept() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let stored = job(&q, 0);
        t.publish(stored.clone()).await?;

        // Three statements in one transaction; the stored id is in the last, and an id
        // of the first comes again in the second.
        let mut batch: Vec<Envelope> = (1..=2_400).map(|n| job(&q, n)).collect();
        batch.insert(1_500, batch[10].clone());
        batch.push(stored.clone());
        t.publish_batch(batch).await?;

        let mut tx = t.pool().begin().await.map_err(err)?;
        t.publish_tx(&mut tx, stored.clone()).await?;
        let outboxed = job(&q, 2_401);
        t.publish_tx(&mut tx, outboxed.clone()).await?;
        tx.commit().await.map_err(err)?;

        let mut ids = std::collections::HashSet::new();
        loop {
            let got = t.reserve_batch(&q, 500).await?;
            if got.is_empty() {
                break;
            }
            for r in &got {
                assert!(ids.insert(r.id()), "{} stored twice", r.id());
            }
            t.ack_batch(&got).await?;
        }
        assert_eq!(ids.len(), 2_402, "every distinct id once");
        assert!(ids.contains(&stored.id) && ids.contains(&outboxed.id));
        Ok(())
    });
}

/// An optimistic round in one statement takes the run of rows its slot names among the
/// candidates, or the window's last whole run when the slot lies past the window, and
/// says how many candidates it saw, also when it claims nothing (the SQL and
/// [`OptimisticSlice::first`] must agree).
#[test]
fn an_optimistic_round_takes_its_slot_of_the_window() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let t = schema.open(ClaimStrategy::Optimistic).await?;
        let q = queue();
        let jobs: Vec<Envelope> = (0..5).map(|n| job(&q, n)).collect();
        t.publish_batch(jobs.clone()).await?;
        let by = ClaimBy {
            holder: "test",
            needles: Vec::new(),
        };
        let ids = |picked: &[usize]| -> Vec<String> {
            picked.iter().map(|&i| jobs[i].id.to_string()).collect()
        };
        // (slot, candidates seen, the jobs taken)
        let rounds: [(usize, usize, &[usize]); 4] =
            [(7, 5, &[2, 3]), (0, 3, &[0, 1]), (3, 1, &[4]), (0, 0, &[])];
        for (slot, seen, taken) in rounds {
            let slice = OptimisticSlice {
                window: 64,
                want: 2,
                slot,
            };
            let (saw, rows) = t
                .optimistic_round(&q, slice, LeaseToken::generate(), StartMode::All, &by)
                .await?
                .expect("PostgreSQL claims in one statement");
            let mut got: Vec<String> = rows.into_iter().map(|r| r.id).collect();
            got.sort();
            let mut want = ids(taken);
            want.sort();
            assert_eq!((saw, got), (seen, want), "slot {slot}");
        }
        Ok(())
    });
}

#[test]
fn a_commit_wakes_idle_workers_of_other_transports() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let worker_side = schema.open(ClaimStrategy::SkipLocked).await?;
        let publisher = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let (handled, got, stop) = sleepy_worker(worker_side, &q);
        tokio::time::sleep(Duration::from_millis(500)).await; // listening, and asleep

        let mut tx = publisher.pool().begin().await.map_err(err)?;
        publisher.publish_tx(&mut tx, job(&q, 1)).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            handled.load(Ordering::SeqCst),
            0,
            "handled before the commit"
        );
        tx.commit().await.map_err(err)?;
        let woke = tokio::time::timeout(Duration::from_secs(5), got.notified()).await;
        assert!(
            woke.is_ok(),
            "the worker slept through the NOTIFY (poll pause 30 s)"
        );

        // A plain publish of the other transport wakes it too.
        publisher.publish(job(&q, 2)).await?;
        let woke = tokio::time::timeout(Duration::from_secs(5), got.notified()).await;
        assert!(woke.is_ok(), "the worker slept through a publish's NOTIFY");
        stop.cancel();
        Ok(())
    });
}

#[test]
fn the_listener_reconnects_after_its_connection_is_killed() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let worker_side = schema.open(ClaimStrategy::SkipLocked).await?;
        let publisher = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let channel = worker_side.channel().to_owned();
        let (_handled, got, stop) = sleepy_worker(worker_side, &q);
        tokio::time::sleep(Duration::from_millis(500)).await;

        let mut admin = sqlx::PgConnection::connect(&support::url())
            .await
            .map_err(err)?;
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN \"' || $1 || '\"'",
        )
        .bind(&channel)
        .fetch_all(&mut admin)
        .await
        .map_err(err)?;
        assert_eq!(
            killed,
            vec![true],
            "exactly one listening connection was killed"
        );
        // The worker looks once when the connection drops; let it fall asleep again and
        // the listener reconnect.
        tokio::time::sleep(Duration::from_secs(2)).await;

        publisher.publish(job(&q, 1)).await?;
        let woke = tokio::time::timeout(Duration::from_secs(10), got.notified()).await;
        assert!(
            woke.is_ok(),
            "no wake-up after the listener's connection was killed"
        );
        stop.cancel();
        Ok(())
    });
}

#[test]
fn many_processes_can_migrate_the_same_schema_at_once() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let opens = (0..8).map(|_| {
            let options = schema.options(ClaimStrategy::SkipLocked);
            tokio::spawn(PgTransport::connect(options))
        });
        for open in opens {
            open.await.map_err(err)??;
        }
        // And again, on a schema that is already there.
        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        t.publish(job(&q, 1)).await?;
        assert!(t.reserve(&q).await?.is_some());
        Ok(())
    });
}

/// With a million ready rows in the queue (and a million in another queue) the claim is
/// still an index scan of the claim index, cut at the limit: no sequential scan, no sort.
/// The rows carry ten labels, one each: a claim that selects one walks the same index and
/// checks each row's labels as it goes.
#[test]
fn the_claim_stays_an_index_scan_at_a_depth_of_one_million() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        let table = format!("\"{}\".\"switchyard_jobs\"", schema.name);
        let mut conn = sqlx::PgConnection::connect(&support::url())
            .await
            .map_err(err)?;
        for name in [q.as_str(), "other"] {
            sqlx::query(&format!(
                "INSERT INTO {table} (id, queue, kind, ready, available_at, visible_at, envelope, labels)
                 SELECT id::text, $1, 'k', true, now(), now(),
                        json_build_object('v', 1, 'id', id, 'queue', $1, 'kind', 'k',
                            'payload', null, 'attempts', 0, 'priority', 0,
                            'created_at', now(), 'available_at', now(), 'headers', '{{}}'::json,
                            'labels', json_build_array('l' || g % 10))::text,
                        ',l' || g % 10 || ','
                   FROM (SELECT gen_random_uuid() AS id, g FROM generate_series(1, 1000000) AS g) AS r"
            ))
            .bind(name)
            .execute(&mut conn)
            .await
            .map_err(err)?;
        }
        sqlx::query(&format!("ANALYZE {table}"))
            .execute(&mut conn)
            .await
            .map_err(err)?;
        let plan = t.explain_claim(&q, 100, &[]).await?;
        eprintln!("claim plan at a depth of 1,000,000:\n{plan}");
        assert!(
            plan.contains("Index Scan using switchyard_jobs_claim"),
            "the claim does not walk the claim index:\n{plan}"
        );
        assert!(plan.contains("Limit"), "{plan}");
        assert!(
            !plan.contains("Seq Scan"),
            "the claim scans the table:\n{plan}"
        );
        assert!(!plan.contains("Sort"), "the claim sorts:\n{plan}");

        let filter = vec!["l3".to_owned(), "l7".to_owned()];
        let plan = t.explain_claim(&q, 100, &filter).await?;
        eprintln!("plan of a claim of labels l3 or l7 at a depth of 1,000,000:\n{plan}");
        assert!(
            plan.contains("Index Scan using switchyard_jobs_claim"),
            "the label claim does not walk the claim index:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan") && !plan.contains("Sort"),
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
        let taken: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE token IS NOT NULL AND labels NOT IN (',l3,', ',l7,')"
        ))
        .fetch_all(&mut conn)
        .await
        .map_err(err)?;
        assert_eq!(taken, [0], "a label claim took a message of another label");
        t.ack_batch(&claimed).await?;

        // And a claim at that depth still serves the highest priority first.
        let urgent = Envelope::builder(q.as_str(), "job").priority(9).build()?;
        t.publish(urgent.clone()).await?;
        let got = t.reserve(&q).await?.expect("the urgent message");
        assert_eq!(got.id(), urgent.id);
        Ok(())
    });
}

/// A claim writes no indexed column, so PostgreSQL updates the row in place (a heap-only
/// tuple): draining a queue adds no index entries that vacuum must clean up later.
#[test]
fn claims_are_heap_only_updates() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let q = queue();
        t.publish_batch((0..2_000).map(|n| job(&q, n)).collect())
            .await?;
        let mut claimed = 0;
        while let batch @ [_, ..] = &t.reserve_batch(&q, 100).await?[..] {
            claimed += batch.len();
            t.ack_batch(batch).await?;
        }
        assert_eq!(claimed, 2_000);
        // Statistics reach the cumulative views when a session ends (or after it idled
        // for ten seconds).
        t.close().await;
        let mut conn = sqlx::PgConnection::connect(&support::url())
            .await
            .map_err(err)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (updated, hot): (i64, i64) = sqlx::query_as(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
                  WHERE schemaname = $1 AND relname = 'switchyard_jobs'",
            )
            .bind(&schema.name)
            .fetch_one(&mut conn)
            .await
            .map_err(err)?;
            if updated >= 2_000 {
                assert!(
                    hot * 100 >= updated * 95,
                    "only {hot} of {updated} claims were heap-only updates"
                );
                return Ok(());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the statistics show {updated} updates, not the 2,000 claims"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// Creates `schema`'s queue table at schema version 1, as an earlier build left it.
async fn version_one_table(conn: &mut sqlx::PgConnection, schema: &str) -> Result<()> {
    let v1 = include_str!("../../../migrations/postgres/0001_init.sql").replace(
        "\"switchyard_jobs",
        &format!("\"{schema}\".\"switchyard_jobs"),
    );
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA \"{schema}\";
         CREATE TABLE \"{schema}\".switchyard_migrations (
             target text NOT NULL, version integer NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, version));
         INSERT INTO \"{schema}\".switchyard_migrations (target, version) VALUES ('switchyard_jobs', 1);
         {v1}"
    ))
    .execute(conn)
    .await
    .map_err(err)?;
    Ok(())
}

/// A table created at schema version 1 is upgraded on connect with what it holds: a
/// message under a live lease stays leased, a started message whose lapsed lease was
/// promoted is reclaimed with the attempt counted, a ready message is claimed. A claim
/// written for version 1 (an old worker still running) then fails instead of claiming.
#[test]
fn a_version_one_table_upgrades_with_its_leases_intact() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let mut conn = sqlx::PgConnection::connect(&support::url())
            .await
            .map_err(err)?;
        version_one_table(&mut conn, &schema.name).await?;
        let table = format!("\"{}\".\"switchyard_jobs\"", schema.name);
        let q = queue();
        let (leased, lapsed, ready) = (job(&q, 1), job(&q, 2), job(&q, 3));
        for (env, state) in [
            // How version 1 left each: leased rows out of the claim index with their
            // lease end in visible_at; a lapsed lease promoted back with its token.
            (
                &leased,
                "false, now() + interval '1 hour', gen_random_uuid(), true",
            ),
            (
                &lapsed,
                "true, now() - interval '1 minute', gen_random_uuid(), true",
            ),
            (&ready, "true, now(), NULL, false"),
        ] {
            sqlx::query(&format!(
                "INSERT INTO {table} (id, queue, kind, ready, visible_at, token, started, available_at, envelope)
                 VALUES ($1, $2, 'job', {state}, now() - interval '2 minutes', $3)"
            ))
            .bind(env.id.to_string())
            .bind(q.as_str())
            .bind(env.to_json())
            .execute(&mut conn)
            .await
            .map_err(err)?;
        }

        let t = schema.open(ClaimStrategy::SkipLocked).await?;
        let stats = t.stats(Some(&q)).await?;
        assert_eq!(
            stats.first().map(|s| (s.ready, s.reserved)),
            Some((2, 1)),
            "the live lease is counted as reserved: {stats:?}"
        );
        let got = t.reserve_batch(&q, 10).await?;
        let mut claimed: Vec<_> = got.iter().map(|r| (r.id(), r.envelope.attempts)).collect();
        claimed.sort();
        let mut expected = vec![(lapsed.id, 1), (ready.id, 0)];
        expected.sort();
        assert_eq!(
            claimed, expected,
            "the live lease holds; the lapsed one counts an attempt"
        );

        let old_claim = sqlx::query(&format!(
            "UPDATE {table} SET token = gen_random_uuid(), reserved_at = now(), ready = false
              WHERE ready"
        ))
        .execute(&mut conn)
        .await;
        assert!(
            old_claim.is_err(),
            "a version-1 claim still runs: {old_claim:?}"
        );
        Ok(())
    });
}

/// A build refuses a table whose schema is newer than the versions it knows.
#[test]
fn a_table_from_a_newer_build_is_refused() {
    with_server(|| async {
        let schema = Schema::fresh().await?;
        drop(schema.open(ClaimStrategy::SkipLocked).await?);
        let mut conn = sqlx::PgConnection::connect(&support::url())
            .await
            .map_err(err)?;
        sqlx::query(&format!(
            "INSERT INTO \"{}\".switchyard_migrations (target, version) VALUES ('switchyard_jobs', 99)",
            schema.name
        ))
        .execute(&mut conn)
        .await
        .map_err(err)?;
        let refused = schema
            .open(ClaimStrategy::SkipLocked)
            .await
            .expect_err("a newer schema is refused");
        let message = refused.to_string();
        assert!(
            message.contains("schema version 99") || message.contains("version 99"),
            "{message}"
        );
        assert!(message.contains("upgrade"), "{message}");
        Ok(())
    });
}

/// Status changes written by one transport reach another transport's followers through
/// `NOTIFY` (the watch channel only carries notifications).
#[test]
fn status_changes_are_announced_to_other_transports() {
    use queue_core::status::{next_change, JobState, StatusUpdate};
    with_server(|| async {
        let schema = Schema::fresh().await?;
        let writer_side = schema.open(ClaimStrategy::SkipLocked).await?;
        let reader_side = schema.open(ClaimStrategy::SkipLocked).await?;
        let (writer, reader) = (writer_side.status_store(), reader_side.status_store());
        let q = queue();
        let e = job(&q, 1);
        writer.record(&[StatusUpdate::published(&e)]).await?;
        let mut changes = reader.watch().expect("PostgreSQL pushes changes");
        tokio::time::sleep(Duration::from_millis(500)).await; // listening
        writer
            .record(&[StatusUpdate::completed(&e, 1, Some(serde_json::json!(7)))])
            .await?;
        // The nil id says "read again" (sent as the listener connects): skipped here.
        let id = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match changes.recv().await {
                    Ok(id) if id.is_nil() => continue,
                    other => return other,
                }
            }
        })
        .await
        .expect("a notification within 5 s")
        .map_err(|e| err(e.to_string()))?;
        assert_eq!(id, e.id);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let s = next_change(reader.as_ref(), e.id, 1, deadline)
            .await?
            .expect("the change");
        assert_eq!(
            (s.state, s.result),
            (JobState::Completed, Some(serde_json::json!(7)))
        );
        Ok(())
    });
}
