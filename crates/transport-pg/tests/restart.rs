//! PostgreSQL restarts in the middle of a drain: two workers drain 10,000 messages while
//! the server is restarted under them; they reconnect by themselves and every message
//! is handled, none lost.
//!
//! It runs against a throwaway server that the test creates itself (`initdb` into a
//! temporary directory, its own port and socket directory), so the restart cannot disturb
//! the rest of the suite.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queue_core::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use queue_core::{CancellationToken, DeadLetters, Envelope, QueueName, Transport};
use transport_pg::{PgOptions, PgTransport};
use uuid::Uuid;

mod support;

use support::server::{command, run, skip_without_tools, Server};

const MESSAGES: usize = 10_000;

#[test]
fn two_workers_drain_through_a_server_restart_and_lose_nothing() {
    if skip_without_tools("PostgreSQL restart test") {
        return;
    }
    let server = Server::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let options = || {
            PgOptions::new(server.url())
                .with_visibility_timeout(Duration::from_secs(5))
                .with_acquire_timeout(Duration::from_secs(2))
        };
        let publisher = PgTransport::connect(options()).await.expect("connect");
        let q = QueueName::new("restart").expect("queue name");
        let envs: Vec<Envelope> = (0..MESSAGES)
            .map(|i| {
                Envelope::builder("restart", "job")
                    .payload(&serde_json::json!({ "n": i }))
                    .build()
                    .expect("envelope")
            })
            .collect();
        let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
        publisher.publish_batch(envs).await.expect("publish");

        let seen: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for _ in 0..2 {
            let t: Arc<dyn Transport> =
                Arc::new(PgTransport::connect(options()).await.expect("connect"));
            let record = seen.clone();
            // Slow enough (about 3,000 jobs/s for both) that the restart lands mid-drain.
            let worker = Worker::new(
                t,
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
            workers.push(tokio::spawn(worker.run(stop.clone())));
        }

        let handled = || seen.lock().map(|s| s.len()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while handled() < MESSAGES / 5 {
            assert!(Instant::now() < deadline, "the drain did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let at_restart = handled();
        let restart = tokio::task::spawn_blocking({
            let data = server.data.clone();
            let bin = server.bin.clone();
            move || {
                run(command(&bin, "pg_ctl")
                    .arg("-D")
                    .arg(&data)
                    .args(["-m", "fast", "-w", "restart"]))
            }
        });
        restart.await.expect("restart");
        assert!(
            at_restart < MESSAGES,
            "the drain finished before the restart"
        );
        eprintln!("restarted PostgreSQL after {at_restart} of {MESSAGES} messages");

        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = publisher
                .stats(Some(&q))
                .await
                .ok()
                .and_then(|s| s.into_iter().next())
                .map_or(0, |s| s.ready + s.delayed + s.reserved + s.dead);
            if handled() == MESSAGES && left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {MESSAGES} handled, {left} left 120 s after the restart",
                handled()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
        for w in workers {
            w.await.expect("worker task").expect("worker");
        }
        let seen = seen.lock().expect("seen").clone();
        let missing = ids.iter().filter(|id| !seen.contains_key(id)).count();
        let duplicates: u32 = seen.values().map(|n| n - 1).sum();
        assert_eq!(missing, 0, "messages lost across the restart");
        let dead = publisher.dead_list(Some(&q), 10).await.expect("dead list");
        assert!(dead.is_empty(), "messages dead-lettered: {dead:?}");
        eprintln!("all {MESSAGES} handled; {duplicates} handled twice (at-least-once)");
    });
    drop(server);
}
