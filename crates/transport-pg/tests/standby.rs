//! A server that is not the primary. A hot standby (`pg_basebackup -R` of a throwaway
//! primary, on its own port) is refused at connect with a message that says so; and a
//! worker whose server fails over under it (the primary stops, its standby comes up
//! read-only on the primary's port, then is promoted) keeps retrying while the server
//! is read-only and finishes the drain once a primary is back, losing nothing and
//! dead-lettering nothing.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queue_core::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use queue_core::{CancellationToken, DeadLetters, Envelope, QueueName, Transport, TransportExt};
use support::server::{skip_without_tools, Server};
use transport_pg::{PgOptions, PgTransport};
use uuid::Uuid;

const MESSAGES: usize = 3_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn options(url: String) -> PgOptions {
    PgOptions::new(url)
        .with_visibility_timeout(Duration::from_secs(5))
        .with_acquire_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2))
}

#[test]
fn a_hot_standby_is_refused_at_connect_saying_so() {
    if skip_without_tools("PostgreSQL standby test") {
        return;
    }
    let primary = Server::start();
    let standby = Server::standby_of(&primary);
    runtime().block_on(async {
        PgTransport::connect(options(primary.url()))
            .await
            .expect("the primary is accepted");
        let started = Instant::now();
        let err = PgTransport::connect(options(standby.url()))
            .await
            .expect_err("the standby is refused");
        let text = err.to_string();
        assert!(
            text.contains(&format!("PostgreSQL at 127.0.0.1:{}", standby.port)),
            "{text}"
        );
        assert!(text.contains("is a hot standby"), "{text}");
        assert!(text.contains("point DATABASE_URL at the primary"), "{text}");
        assert!(
            !err.is_transient(),
            "retrying the same URL will not help: {text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "refused at once"
        );
    });
}

#[test]
fn a_worker_waits_out_a_read_only_server_and_finishes_on_the_new_primary() {
    if skip_without_tools("PostgreSQL failover test") {
        return;
    }
    let primary = Server::start();
    let standby = Server::standby_of(&primary);
    let port = primary.port;
    runtime().block_on(async {
        let publisher = PgTransport::connect(options(primary.url()))
            .await
            .expect("connect");
        let q = QueueName::new("failover").expect("queue name");
        let envs: Vec<Envelope> = (0..MESSAGES)
            .map(|i| {
                Envelope::builder("failover", "job")
                    .payload(&serde_json::json!({ "n": i }))
                    .build()
                    .expect("envelope")
            })
            .collect();
        let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
        publisher.publish_batch(envs).await.expect("publish");
        publisher.close().await;

        let seen: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
        let stop = CancellationToken::new();
        let t: Arc<dyn Transport> = Arc::new(
            PgTransport::connect(options(primary.url()))
                .await
                .expect("connect"),
        );
        let record = seen.clone();
        let worker = Worker::new(
            t.clone(),
            q.clone(),
            WorkerOptions::default()
                .with_concurrency(8)
                .with_poll(Duration::from_millis(20), Duration::from_millis(500)),
        )
        .handle_any(handler_fn(move |ctx: JobContext| {
            if let Ok(mut seen) = record.lock() {
                *seen.entry(ctx.envelope.id).or_default() += 1;
            }
            async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(())
            }
        }));
        let running = tokio::spawn(worker.run(stop.clone()));

        let handled = || seen.lock().map(|s| s.len()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while handled() < MESSAGES / 5 {
            assert!(Instant::now() < deadline, "the drain did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The failover: a clean stop of the primary sends its last WAL to the standby,
        // which then comes up read-only on the primary's port.
        let at_stop = handled();
        let (data_primary, data_standby) = (&primary, &standby);
        tokio::task::block_in_place(|| {
            data_primary.stop("fast");
            data_standby.stop("fast");
            data_standby.start_on(port);
        });
        eprintln!("primary stopped after {at_stop} of {MESSAGES}; its standby is up read-only on its port");
        let read_only_from = handled();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let during = handled() - read_only_from;
        tokio::task::block_in_place(|| data_standby.promote());
        let promoted_at = Instant::now();
        eprintln!("standby promoted; {during} messages handled while the server was read-only");
        assert!(
            !running.is_finished(),
            "the worker gave up while the server was read-only"
        );

        let after = handled();
        let mut first_after: Option<Duration> = None;
        let deadline = Instant::now() + Duration::from_secs(120);
        while handled() < MESSAGES {
            if first_after.is_none() && handled() > after {
                first_after = Some(promoted_at.elapsed());
            }
            assert!(
                Instant::now() < deadline,
                "{} of {MESSAGES} handled 120 s after the promotion",
                handled()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        running.await.expect("worker task").expect("worker");

        let seen = seen.lock().expect("seen").clone();
        let missing = ids.iter().filter(|id| !seen.contains_key(id)).count();
        let duplicates: u32 = seen.values().map(|n| n - 1).sum();
        assert_eq!(missing, 0, "messages lost across the failover");
        let check = PgTransport::connect(options(standby.url_on(port)))
            .await
            .expect("the new primary is accepted");
        let dead = check.dead_list(Some(&q), 10).await.expect("dead list");
        assert!(dead.is_empty(), "messages dead-lettered: {dead:?}");
        // Redelivered at most: what the worker held (claimed ahead, running, or
        // awaiting a batched ack) when the primary stopped.
        assert!(
            duplicates <= 600,
            "{duplicates} handled twice: more than a worker holds"
        );
        eprintln!(
            "all {MESSAGES} handled; {duplicates} handled twice; first message after the promotion {:?} after it",
            first_after.unwrap_or_default()
        );
    });
}

#[test]
fn a_server_turned_read_only_gives_a_transient_error_until_it_is_writable_again() {
    if skip_without_tools("PostgreSQL read-only test") {
        return;
    }
    let server = Server::start();
    runtime().block_on(async {
        let t = PgTransport::connect(options(server.url()))
            .await
            .expect("connect");
        let job = || {
            Envelope::builder("readonly", "job")
                .build()
                .expect("envelope")
        };
        t.publish(job()).await.expect("a writable server");
        set_read_only(&server.url(), "on").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let err = t
            .publish(job())
            .await
            .expect_err("a read-only server refuses writes");
        assert!(err.is_transient(), "read-only is transient: {err}");
        assert!(
            err.to_string().contains("25006") || err.to_string().contains("read-only"),
            "{err}"
        );
        set_read_only(&server.url(), "off").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The connections opened before the error are dropped at their next checkout;
        // new ones find the server writable.
        t.publish(job()).await.expect("writable again");
    });
}

/// Sets `default_transaction_read_only` server-wide, as a demoted server would behave.
async fn set_read_only(url: &str, on: &str) {
    use transport_pg::sqlx::{self, Connection, PgConnection};
    let mut admin = PgConnection::connect(url)
        .await
        .expect("an admin connection");
    // Two statements: ALTER SYSTEM may not run in the implicit transaction of a batch.
    sqlx::raw_sql(&format!(
        "ALTER SYSTEM SET default_transaction_read_only = {on}"
    ))
    .execute(&mut admin)
    .await
    .expect("set default_transaction_read_only");
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut admin)
        .await
        .expect("set default_transaction_read_only");
}
