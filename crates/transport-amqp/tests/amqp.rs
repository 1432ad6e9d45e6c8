//! The RabbitMQ transport against a real broker (`SWITCHYARD_TEST_AMQP_URL`, by default
//! the local one): confirmed publishes, reserves from a consumer, fenced acks,
//! redelivery after a consumer's channel closed (with the attempt counted), delays,
//! releases and dead letters. Each test uses queues of its own.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queue_core::worker::{handler_fn, JobContext, RetryPolicy, Worker, WorkerOptions};
use queue_core::{
    reason, CancellationToken, DeadLetters, DeadSelection, Envelope, Error, QueueName, Result,
    Transport, TransportExt, Unique,
};
use support::url;
use transport_amqp::{AmqpOptions, AmqpTransport, QueueKind};

fn queue() -> QueueName {
    QueueName::new(format!("test.{}", uuid::Uuid::new_v4().simple())).expect("a valid queue name")
}

fn job(q: &QueueName, kind: &str) -> Envelope {
    Envelope::builder(q.as_str(), kind)
        .payload(&serde_json::json!({ "kind": kind }))
        .build()
        .expect("a valid envelope")
}

/// Queues expire after ten idle minutes, should a failed test leave them behind.
fn options(kind: QueueKind) -> AmqpOptions {
    AmqpOptions::new(url())
        .with_queue_kind(kind)
        .with_queue_expires(Duration::from_secs(600))
}

async fn open(kind: QueueKind) -> Result<AmqpTransport> {
    AmqpTransport::connect(options(kind)).await
}

/// Closes, on the broker, the connections named `name`; how many.
fn close_connections(name: &str) -> usize {
    let run = |args: &[&str]| {
        // `SWITCHYARD_TEST_RABBITMQCTL` reaches a broker in a container
        // (`docker exec ID rabbitmqctl`, set by test-servers).
        let ctl =
            std::env::var("SWITCHYARD_TEST_RABBITMQCTL").unwrap_or_else(|_| "rabbitmqctl".into());
        let mut words = ctl.split_whitespace();
        let out = std::process::Command::new(words.next().unwrap_or("rabbitmqctl"))
            .args(words)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("rabbitmqctl (this test runs on the broker's machine)");
        assert!(out.status.success(), "rabbitmqctl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = run(&[
        "list_connections",
        "-q",
        "--no-table-headers",
        "pid",
        "client_properties",
    ]);
    let tag = format!("{{\"connection_name\",\"{name}\"}}");
    let pids: Vec<&str> = listed
        .lines()
        .filter(|l| l.contains(&tag))
        .filter_map(|l| l.split('\t').next())
        .collect();
    for pid in &pids {
        run(&[
            "close_connection",
            pid,
            "switchyard test: dropped connection",
        ]);
    }
    pids.len()
}

/// Runs `f` unless the broker is unreachable outside CI.
fn with_broker<F, Fut>(f: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    if let Some(why) = support::skip_reason() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(60), f())
                .await
                .expect("the test finished within 60 s")
                .expect("the test succeeded");
        });
}

/// Reserves until `n` messages came or `within` passed.
async fn reserve_n(
    t: &AmqpTransport,
    q: &QueueName,
    n: usize,
    within: Duration,
) -> Result<Vec<queue_core::Reservation>> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        got.extend(t.reserve_batch(q, n - got.len()).await?);
        if got.len() < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(got)
}

#[test]
fn published_messages_are_reserved_in_order_and_acked_once() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        let sent: Vec<Envelope> = (0..3).map(|i| job(&q, &format!("m{i}"))).collect();
        t.publish_batch(sent.clone()).await?;
        let got = reserve_n(&t, &q, 3, Duration::from_secs(5)).await?;
        let kinds: Vec<&str> = got.iter().map(|r| r.envelope.kind.as_str()).collect();
        assert_eq!(kinds, ["m0", "m1", "m2"]);
        assert_eq!(got[0].envelope.payload.get(), sent[0].payload.get());
        assert_eq!(got[0].envelope.attempts, 0);
        let report = t.ack_batch(&got).await?;
        assert_eq!(report.acked.len(), 3);
        // A second ack of the same delivery is refused, not sent (it would close the
        // channel).
        assert!(matches!(t.ack(&got[0]).await, Err(Error::LeaseLost { .. })));
        assert!(t.reserve(&q).await?.is_none());
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

/// A consumer that dies without acking gets its messages delivered again, to another
/// consumer, with the attempt counted; its late ack is refused.
#[test]
fn a_dead_consumers_messages_come_back_with_an_attempt_counted() {
    for kind in [QueueKind::Quorum, QueueKind::Classic] {
        with_broker(|| async {
            let q = queue();
            let first = open(kind).await?;
            first.publish(job(&q, "crashy")).await?;
            let held = reserve_n(&first, &q, 1, Duration::from_secs(5)).await?;
            assert_eq!(held.len(), 1);
            first.close().await;
            assert!(matches!(
                first.ack(&held[0]).await,
                Err(Error::LeaseLost { .. })
            ));

            let second = open(kind).await?;
            let again = reserve_n(&second, &q, 1, Duration::from_secs(5)).await?;
            assert_eq!(again.len(), 1, "{kind:?}: delivered again");
            assert_eq!(again[0].id(), held[0].id());
            assert_eq!(
                again[0].envelope.attempts, 1,
                "{kind:?}: the attempt counted"
            );
            second.ack(&again[0]).await?;
            second.delete_queue(&q).await?;
            second.close().await;
            Ok(())
        });
    }
}

/// With a control store beside the broker, a dead consumer's deliveries come back
/// charged only when they were started (by a worker's start or a plain reserve): the
/// one merely prefetched is not, and a started one given back unrun is not either.
#[test]
fn with_a_control_store_a_dead_consumer_charges_only_what_it_started() {
    for kind in [QueueKind::Quorum, QueueKind::Classic] {
        with_broker(|| async {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let sql =
                transport_sqlite::SqliteTransport::connect(transport_sqlite::SqliteOptions::new(
                    format!("sqlite://{}", dir.path().join("control.db").display()),
                ))
                .await?;
            let store = sql.status_store();
            let marked = || options(kind).with_control_store(store.clone());
            let q = queue();
            let first = AmqpTransport::connect(marked()).await?;
            assert!(first.capabilities().charges_only_started);
            let (started, prefetched, reserved, given_back) = (
                job(&q, "started"),
                job(&q, "prefetched"),
                job(&q, "reserved"),
                job(&q, "given back"),
            );
            let ids = [started.id, prefetched.id, reserved.id, given_back.id];
            first
                .publish_batch(vec![started, prefetched, reserved, given_back])
                .await?;
            let mut ahead = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(5);
            while ahead.len() < 2 && Instant::now() < deadline {
                ahead.extend(first.prefetch_batch(&q, 2 - ahead.len()).await?);
            }
            assert_eq!(ahead.len(), 2);
            let report = first.start_batch(&ahead[..1]).await?;
            assert_eq!(report.acked, [ids[0]]);
            let held = reserve_n(&first, &q, 2, Duration::from_secs(5)).await?;
            assert_eq!(held.len(), 2);
            // The fourth: started, then given back unrun (a worker's shutdown).
            let back = held.iter().find(|r| r.id() == ids[3]).expect("the fourth");
            first.abandon(back).await?;
            // Its copy is prefetched again, so that it too comes back from the closed
            // channel and its mark is read.
            let mut copy = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(5);
            while copy.is_empty() && Instant::now() < deadline {
                copy.extend(first.prefetch_batch(&q, 1).await?);
            }
            assert_eq!(copy.first().map(|r| r.id()), Some(ids[3]));
            first.close().await;

            let second = AmqpTransport::connect(marked()).await?;
            let again = reserve_n(&second, &q, 4, Duration::from_secs(10)).await?;
            let attempts = |id| {
                again
                    .iter()
                    .find(|r| r.id() == id)
                    .map(|r| r.envelope.attempts)
            };
            assert_eq!(attempts(ids[0]), Some(1), "{kind:?}: started, charged");
            assert_eq!(
                attempts(ids[1]),
                Some(0),
                "{kind:?}: prefetched, not charged"
            );
            assert_eq!(attempts(ids[2]), Some(1), "{kind:?}: reserved, charged");
            assert_eq!(
                attempts(ids[3]),
                Some(0),
                "{kind:?}: given back, not charged"
            );
            second.ack_batch(&again).await?;
            second.delete_queue(&q).await?;
            second.close().await;
            Ok(())
        });
    }
}

/// Unique keys of RabbitMQ's messages in the control store: a delivery whose consumer
/// died keeps its key until its redelivery is acked; a key whose publish was never
/// confirmed (the publisher died) and a message that expired on the broker free their
/// keys when their time is up; rows that hold nothing are pruned.
#[test]
fn unique_keys_in_the_control_store_outlive_a_dead_consumer_but_not_a_dead_publisher() {
    with_broker(|| async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sql = transport_sqlite::SqliteTransport::connect(transport_sqlite::SqliteOptions::new(
            format!("sqlite://{}", dir.path().join("control.db").display()),
        ))
        .await?;
        let store = sql.status_store();
        let keys = store.unique_keys().expect("a SQL store keeps unique keys");
        let marked = || options(QueueKind::Quorum).with_control_store(store.clone());
        let q = queue();
        let keyed = |key: &str| {
            Envelope::builder(q.as_str(), key)
                .unique(Unique::new(key))
                .build()
                .expect("a valid envelope")
        };
        let first = AmqpTransport::connect(marked()).await?;
        assert!(first.capabilities().unique_keys);
        let a = keyed("a");
        first.publish(a.clone()).await?;
        let held = reserve_n(&first, &q, 1, Duration::from_secs(5)).await?;
        assert_eq!(held.first().map(|r| r.id()), Some(a.id));
        first.close().await;
        let second = AmqpTransport::connect(marked()).await?;
        let out = second.publish(keyed("a")).await?;
        assert_eq!(
            out.duplicates.first().map(|d| d.existing),
            Some(a.id),
            "a delivery back from a dead consumer lost its key"
        );
        let again = reserve_n(&second, &q, 1, Duration::from_secs(10)).await?;
        assert_eq!(again.first().map(|r| r.id()), Some(a.id));
        second.ack_batch(&again).await?;
        assert!(second.publish(keyed("a")).await?.duplicates.is_empty());

        // A publisher that took a key and died before the broker's confirm.
        let orphan = keyed("orphan");
        assert!(keys
            .take(std::slice::from_ref(&orphan), Duration::from_millis(300))
            .await?
            .is_empty());
        assert_eq!(second.publish(keyed("orphan")).await?.duplicates.len(), 1);
        // A message that expires on the broker, unconsumed.
        let brief = Envelope::builder(q.as_str(), "brief")
            .unique(Unique::new("brief"))
            .expires_in(Duration::from_millis(300))
            .build()?;
        second.publish(brief).await?;
        assert_eq!(second.publish(keyed("brief")).await?.duplicates.len(), 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            second.publish(keyed("orphan")).await?.duplicates.is_empty(),
            "an unconfirmed key was held past its window"
        );
        assert!(
            second.publish(keyed("brief")).await?.duplicates.is_empty(),
            "an expired message kept its key"
        );
        let rest = reserve_n(&second, &q, 3, Duration::from_secs(10)).await?;
        second.ack_batch(&rest).await?;
        assert!(
            keys.prune(Duration::ZERO).await? >= 3,
            "the acked jobs' key rows were not pruned"
        );
        second.delete_queue(&q).await?;
        second.close().await;
        Ok(())
    });
}

#[test]
fn a_release_with_a_delay_comes_back_after_it_with_the_attempt_and_error() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        t.publish(job(&q, "retry")).await?;
        let r = reserve_n(&t, &q, 1, Duration::from_secs(5)).await?;
        let released = Instant::now();
        t.release(&r[0], Duration::from_millis(600), Some("boom"))
            .await?;
        assert!(matches!(t.ack(&r[0]).await, Err(Error::LeaseLost { .. })));
        let back = reserve_n(&t, &q, 1, Duration::from_secs(10)).await?;
        assert!(
            released.elapsed() >= Duration::from_millis(550),
            "{:?}",
            released.elapsed()
        );
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].envelope.attempts, 1);
        assert_eq!(back[0].envelope.last_error.as_deref(), Some("boom"));
        t.ack(&back[0]).await?;
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

#[test]
fn a_delayed_publish_is_not_delivered_before_it_is_due() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        let published = Instant::now();
        t.publish(
            Envelope::builder(q.as_str(), "later")
                .delay(Duration::from_millis(800))
                .build()?,
        )
        .await?;
        let got = reserve_n(&t, &q, 1, Duration::from_secs(10)).await?;
        assert_eq!(got.len(), 1);
        assert!(
            published.elapsed() >= Duration::from_millis(750),
            "{:?}",
            published.elapsed()
        );
        t.ack(&got[0]).await?;
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

#[test]
fn dead_letters_are_listed_replayed_and_purged() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        t.publish_batch(vec![job(&q, "a"), job(&q, "b")]).await?;
        let got = reserve_n(&t, &q, 2, Duration::from_secs(5)).await?;
        for r in &got {
            t.dead_letter(r, reason::MAX_ATTEMPTS, Some("no customer"))
                .await?;
        }
        let dead = t.dead_list(Some(&q), 10).await?;
        assert_eq!(dead.len(), 2, "{dead:?}");
        assert_eq!(dead[0].reason, reason::MAX_ATTEMPTS);
        assert_eq!(dead[0].last_error.as_deref(), Some("no customer"));
        let stats = t.stats(Some(&q)).await?;
        assert_eq!((stats[0].ready, stats[0].dead), (0, 2), "{stats:?}");

        let a = got[0].id().to_string();
        assert_eq!(
            t.dead_replay(Some(&q), &DeadSelection::Id(a.clone()))
                .await?,
            1
        );
        let back = reserve_n(&t, &q, 1, Duration::from_secs(5)).await?;
        assert_eq!(back[0].id().to_string(), a);
        assert_eq!(back[0].envelope.attempts, 0, "a replay resets attempts");
        t.ack(&back[0]).await?;
        assert!(matches!(
            t.dead_replay(Some(&q), &DeadSelection::Id(a)).await,
            Err(Error::NotFound { .. })
        ));
        assert_eq!(t.dead_purge(Some(&q), &DeadSelection::All).await?, 1);
        assert!(t.dead_list(Some(&q), 10).await?.is_empty());
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

/// A publish that no queue takes (its queue was deleted behind the transport's back)
/// fails instead of being dropped and confirmed.
#[test]
fn a_publish_no_queue_takes_fails_loudly() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        t.publish(job(&q, "first")).await?;
        let other = open(QueueKind::Quorum).await?;
        other.delete_queue(&q).await?;
        let lost = t.publish(job(&q, "second")).await;
        assert!(
            lost.as_ref()
                .is_err_and(|e| e.to_string().contains("no queue")),
            "{lost:?}"
        );
        other.close().await;
        t.close().await;
        Ok(())
    });
}

/// The broker drops the connection: leases held on it are lost (their messages come back,
/// the attempt counted), and the next operations reconnect by themselves.
#[test]
fn a_dropped_connection_reconnects_and_loses_nothing() {
    with_broker(|| async {
        let name = format!("switchyard-test-{}", uuid::Uuid::new_v4().simple());
        let t =
            AmqpTransport::connect(options(QueueKind::Quorum).with_connection_name(&name)).await?;
        let q = queue();
        t.publish_batch((0..10).map(|i| job(&q, &format!("m{i}"))).collect())
            .await?;
        let held = reserve_n(&t, &q, 3, Duration::from_secs(5)).await?;
        assert_eq!(held.len(), 3);
        let closed = tokio::task::spawn_blocking(move || close_connections(&name))
            .await
            .map_err(|e| Error::InvalidInput(e.to_string()))?;
        assert_eq!(closed, 1, "the transport's connection was not found");
        // Until the transport notices, an ack may still look held; once it has, every
        // lease of the old connection is lost.
        let deadline = Instant::now() + Duration::from_secs(5);
        while t.extend(&held[0], Duration::from_secs(30)).await.is_ok() {
            assert!(Instant::now() < deadline, "the drop went unnoticed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(t.ack_batch(&held).await?.lost.len(), 3);

        t.publish(job(&q, "after")).await?;
        let all = reserve_n(&t, &q, 11, Duration::from_secs(10)).await?;
        let mut kinds: Vec<&str> = all.iter().map(|r| r.envelope.kind.as_str()).collect();
        kinds.sort_unstable();
        let mut expected: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
        expected.push("after".into());
        expected.sort_unstable();
        assert_eq!(kinds, expected);
        for r in &all {
            let was_held = held.iter().any(|h| h.id() == r.id());
            // What the consumer had prefetched and not handed out went back with the
            // channel too, and a quorum queue counts every return.
            let expected = match (was_held, r.envelope.kind.as_str()) {
                (true, _) => 1..=1,
                (false, "after") => 0..=0,
                (false, _) => 0..=1,
            };
            assert!(
                expected.contains(&r.envelope.attempts),
                "{}: {} attempts",
                r.envelope.kind,
                r.envelope.attempts
            );
        }
        assert_eq!(t.ack_batch(&all).await?.acked.len(), 11);
        assert!(t.reserve(&q).await?.is_none());
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

/// The broker cancels a consumer (here because its queue was deleted): the consumer's
/// leases are lost at once, and once the queue is used again a new consumer serves it.
#[test]
fn a_consumer_the_broker_cancels_loses_its_leases_and_is_replaced() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        t.publish(job(&q, "before")).await?;
        let held = reserve_n(&t, &q, 1, Duration::from_secs(5)).await?;
        assert_eq!(held.len(), 1);
        let other = open(QueueKind::Quorum).await?;
        other.delete_queue(&q).await?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while t.extend(&held[0], Duration::from_secs(30)).await.is_ok() {
            assert!(Instant::now() < deadline, "the cancel went unnoticed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(matches!(
            t.ack(&held[0]).await,
            Err(Error::LeaseLost { .. })
        ));
        // The queue is declared again and consumed again.
        t.publish(job(&q, "after")).await?;
        let again = reserve_n(&t, &q, 1, Duration::from_secs(5)).await?;
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].envelope.kind, "after");
        t.ack(&again[0]).await?;
        t.delete_queue(&q).await?;
        other.close().await;
        t.close().await;
        Ok(())
    });
}

/// Acks out of delivery order: the later deliveries acked in one batch never take an
/// earlier one still held with them (a `multiple` ack stops below it); the earlier one
/// returns when its consumer goes.
#[test]
fn acking_later_deliveries_leaves_an_earlier_one_held() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        t.publish_batch((0..3).map(|i| job(&q, &format!("m{i}"))).collect())
            .await?;
        let got = reserve_n(&t, &q, 3, Duration::from_secs(5)).await?;
        assert_eq!(got.len(), 3);
        let report = t.ack_batch(&got[1..]).await?;
        assert_eq!(report.acked.len(), 2);
        t.close().await;

        let other = open(QueueKind::Quorum).await?;
        let back = reserve_n(&other, &q, 1, Duration::from_secs(5)).await?;
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].id(), got[0].id(), "only the unacked one returns");
        assert_eq!(back[0].envelope.attempts, 1);
        other.ack(&back[0]).await?;
        assert!(other.reserve(&q).await?.is_none());
        other.delete_queue(&q).await?;
        other.close().await;
        Ok(())
    });
}

/// A batch ack with a spent token among live ones acks the live ones and reports the
/// spent one lost; the released message comes back once.
#[test]
fn a_batch_ack_reports_a_spent_token_lost_and_acks_the_rest() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        t.publish_batch((0..3).map(|i| job(&q, &format!("m{i}"))).collect())
            .await?;
        let got = reserve_n(&t, &q, 3, Duration::from_secs(5)).await?;
        assert_eq!(got.len(), 3);
        t.release(&got[1], Duration::ZERO, None).await?;
        let report = t.ack_batch(&got).await?;
        assert_eq!(report.lost, vec![got[1].id()]);
        assert_eq!(report.acked.len(), 2);
        let back = reserve_n(&t, &q, 1, Duration::from_secs(5)).await?;
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].id(), got[1].id());
        assert_eq!(back[0].envelope.attempts, 1);
        t.ack(&back[0]).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(t.reserve(&q).await?.is_none());
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

/// A message that kills its consumer every time ends dead: each death counts an
/// attempt, and a worker whose `max_attempts` they reached dead-letters it without
/// running it again.
#[test]
fn a_message_that_kills_its_consumer_every_time_ends_dead() {
    for kind in [QueueKind::Quorum, QueueKind::Classic] {
        with_broker(|| async {
            let q = queue();
            let first = open(kind).await?;
            first.publish(job(&q, "poison")).await?;
            first.close().await;
            for died in 0..3 {
                let t = open(kind).await?;
                let got = reserve_n(&t, &q, 1, Duration::from_secs(5)).await?;
                assert_eq!(
                    got.len(),
                    1,
                    "{kind:?}: delivered again after {died} deaths"
                );
                assert_eq!(got[0].envelope.attempts, died, "{kind:?}");
                // The consumer dies holding it.
                t.close().await;
            }
            let t: Arc<dyn Transport> = Arc::new(open(kind).await?);
            let handled = Arc::new(AtomicUsize::new(0));
            let n = handled.clone();
            let options = WorkerOptions::default()
                .with_retry(RetryPolicy::new(
                    Duration::from_millis(10),
                    Duration::from_millis(20),
                    3,
                ))
                .with_poll(Duration::from_millis(5), Duration::from_millis(50))
                .with_drain(true);
            let worker = Worker::new(t.clone(), q.clone(), options).handle_any(handler_fn(
                move |_ctx: JobContext| {
                    n.fetch_add(1, Ordering::SeqCst);
                    async { Ok(()) }
                },
            ));
            tokio::time::timeout(
                Duration::from_secs(20),
                worker.run(CancellationToken::new()),
            )
            .await
            .map_err(|_| Error::InvalidInput("the worker did not drain".into()))??;
            assert_eq!(
                handled.load(Ordering::SeqCst),
                0,
                "{kind:?}: the poison ran again"
            );
            let dead = t.dead_list(Some(&q), 10).await?;
            assert_eq!(dead.len(), 1, "{kind:?}: {dead:?}");
            assert_eq!(dead[0].reason, reason::MAX_ATTEMPTS);
            assert_eq!(dead[0].attempts, 3, "{kind:?}");
            let admin = open(kind).await?;
            admin.delete_queue(&q).await?;
            admin.close().await;
            Ok(())
        });
    }
}

/// Below the worker's limit, a quorum queue's own delivery limit moves a message that
/// keeps coming back to `<queue>.dead` (reason `delivery_limit`), never dropping it.
#[test]
fn the_brokers_delivery_limit_moves_a_returning_message_to_the_dead_queue() {
    with_broker(|| async {
        let mut o = options(QueueKind::Quorum);
        o.delivery_limit = 1;
        let q = queue();
        let first = AmqpTransport::connect(o.clone()).await?;
        first.publish(job(&q, "poison")).await?;
        first.close().await;
        for _ in 0..2 {
            let t = AmqpTransport::connect(o.clone()).await?;
            let got = reserve_n(&t, &q, 1, Duration::from_secs(5)).await?;
            assert_eq!(got.len(), 1);
            t.close().await;
        }
        let t = AmqpTransport::connect(o).await?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let dead = loop {
            let dead = t.dead_list(Some(&q), 10).await?;
            if !dead.is_empty() || Instant::now() > deadline {
                break dead;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0].reason, "delivery_limit");
        assert!(t.reserve(&q).await?.is_none());
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

/// A local port nothing listens on (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
        .port()
}

/// The first connect to a broker that is down waits for it, trying again, and opens
/// once it is up (here: a proxy to the test broker that starts listening late); with
/// `retry_first_connect` off it fails at once, and past `reconnect_timeout` it fails
/// with a transient error that says how long it waited.
#[test]
fn the_first_connect_waits_for_a_broker_that_comes_up_late() {
    with_broker(|| async {
        let port = free_port();
        // The test broker's host:port (the local one, or a container's).
        let base = url();
        let broker = base
            .split_once('@')
            .and_then(|(_, rest)| rest.split('/').next())
            .expect("a broker URL with user@host:port")
            .to_owned();
        let late = base.replacen(&broker, &format!("127.0.0.1:{port}"), 1);
        assert_ne!(late, base, "the test broker's address is in its URL");

        let started = Instant::now();
        let err = AmqpTransport::connect(AmqpOptions::new(&late).with_retry_first_connect(false))
            .await
            .expect_err("nothing listens yet");
        assert!(err.is_transient(), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2), "it waited");

        let started = Instant::now();
        let err = AmqpTransport::connect(
            AmqpOptions::new(&late).with_reconnect_timeout(Duration::from_millis(800)),
        )
        .await
        .expect_err("nothing listens");
        assert!(started.elapsed() >= Duration::from_millis(500), "{err}");
        assert!(err.is_transient(), "{err}");
        assert!(err.to_string().contains("reconnect_timeout"), "{err}");

        // The proxy opens its port 700 ms from now.
        let proxy = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("bind the proxy");
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let broker = broker.clone();
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(broker.as_str()).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        let started = Instant::now();
        let t = AmqpTransport::connect(
            AmqpOptions::new(&late).with_reconnect_timeout(Duration::from_secs(20)),
        )
        .await?;
        assert!(started.elapsed() >= Duration::from_millis(500));
        let q = queue();
        t.publish(job(&q, "late")).await?;
        assert_eq!(t.stats(Some(&q)).await?[0].ready, 1);
        t.delete_queue(&q).await?;
        t.close().await;
        proxy.abort();
        Ok(())
    });
}

/// Published envelopes say what their body is: `content_type` `application/json`.
#[test]
fn published_envelopes_carry_a_json_content_type() {
    with_broker(|| async {
        let t = open(QueueKind::Quorum).await?;
        let q = queue();
        t.publish(job(&q, "typed")).await?;
        let conn = lapin::Connection::connect(&url(), lapin::ConnectionProperties::default())
            .await
            .expect("connect");
        let ch = conn.create_channel().await.expect("a channel");
        let mut got = None;
        for _ in 0..50 {
            got = ch
                .basic_get(
                    q.as_str().into(),
                    lapin::options::BasicGetOptions::default(),
                )
                .await
                .expect("basic.get");
            if got.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let message = got.expect("the message");
        assert_eq!(
            message
                .delivery
                .properties
                .content_type()
                .as_ref()
                .map(|c| c.as_str()),
            Some("application/json")
        );
        let _ = conn.close(200, "done".into()).await;
        t.delete_queue(&q).await?;
        t.close().await;
        Ok(())
    });
}

/// A valid envelope that names another queue (a shovel, an operator's move, a
/// misbinding) is quarantined in the queue it came from, its body byte for byte and the
/// reason saying what was wrong; a draining worker of that queue ends instead of
/// skipping it for ever, and a replay sends it to the queue it names.
#[test]
fn a_message_of_another_queue_is_quarantined_and_a_drain_ends() {
    for kind in [QueueKind::Quorum, QueueKind::Classic] {
        with_broker(|| async {
            let (q, other) = (queue(), queue());
            let t = Arc::new(open(kind).await?);
            let stray = job(&other, "stray");
            // Spaced unlike the transport's own encoding, to see it kept byte for byte.
            let body = format!(" {} ", stray.to_json());
            // The publish declares the queue.
            t.publish(job(&q, "good")).await?;
            t.publish_raw(&q, &stray.id.to_string(), &body).await?;

            let handled = Arc::new(AtomicUsize::new(0));
            let n = handled.clone();
            let options = WorkerOptions::default()
                .with_poll(Duration::from_millis(5), Duration::from_millis(50))
                .with_drain(true);
            let worker = Worker::new(t.clone() as Arc<dyn Transport>, q.clone(), options)
                .handle_any(handler_fn(move |_ctx: JobContext| {
                    n.fetch_add(1, Ordering::SeqCst);
                    async { Ok(()) }
                }));
            tokio::time::timeout(
                Duration::from_secs(20),
                worker.run(CancellationToken::new()),
            )
            .await
            .map_err(|_| Error::InvalidInput(format!("{kind:?}: the worker did not drain")))??;
            assert_eq!(handled.load(Ordering::SeqCst), 1, "{kind:?}");

            let dead = t.dead_list(Some(&q), 10).await?;
            assert_eq!(dead.len(), 1, "{kind:?}: {dead:?}");
            let d = &dead[0];
            assert_eq!(d.reason, reason::MALFORMED, "{kind:?}");
            assert_eq!(d.id, stray.id.to_string());
            assert!(
                d.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains(other.as_str()) && e.contains(q.as_str())),
                "{kind:?}: {d:?}"
            );
            let s = &t.stats(Some(&q)).await?[0];
            assert_eq!((s.ready, s.reserved, s.dead), (0, 0, 1), "{kind:?}: {s:?}");

            // The dead-letter queue holds the body as it came.
            let conn = lapin::Connection::connect(&url(), lapin::ConnectionProperties::default())
                .await
                .expect("connect");
            let ch = conn.create_channel().await.expect("a channel");
            let got = ch
                .basic_get(
                    format!("{q}.dead").as_str().into(),
                    lapin::options::BasicGetOptions::default(),
                )
                .await
                .expect("basic.get")
                .expect("the dead letter");
            assert_eq!(got.delivery.data, body.as_bytes(), "{kind:?}");
            let _ = conn.close(200, "done".into()).await;

            // A replay sends it where it belongs.
            assert_eq!(
                t.dead_replay(Some(&q), &DeadSelection::Id(stray.id.to_string()))
                    .await?,
                1
            );
            let back = reserve_n(&t, &other, 1, Duration::from_secs(5)).await?;
            assert_eq!(back.len(), 1, "{kind:?}: not replayed to its own queue");
            assert_eq!(back[0].id(), stray.id);
            t.ack(&back[0]).await?;
            t.delete_queue(&q).await?;
            t.delete_queue(&other).await?;
            t.close().await;
            Ok(())
        });
    }
}
