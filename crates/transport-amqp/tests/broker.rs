//! The broker stops under the transport: `rabbitmqctl stop_app` / `start_app` in the
//! middle of a drain of 10,000 messages, the broker's own consumer timeout, and
//! `close_all_connections` while batches are being published.
//!
//! All disturb every other AMQP test running at the same time (the first stops the
//! broker, the second changes a broker-wide setting, the third closes every connection),
//! so they are `#[ignore]`d in the parallel suite and `scripts/test` runs them as a step
//! of their own afterwards: `cargo nextest run -p transport-amqp --test broker
//! --run-ignored only`.

mod support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queue_core::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use queue_core::{
    CancellationToken, DeadLetters, Envelope, Error, QueueName, Transport, TransportExt,
};
use support::url;
use transport_amqp::{AmqpOptions, AmqpTransport};
use uuid::Uuid;

const MESSAGES: usize = 10_000;

fn rabbitmqctl(args: &[&str]) -> String {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl (these tests run on the broker's machine)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn skip() -> bool {
    if let Some(why) = support::skip_reason() {
        eprintln!("SKIPPED: {why}");
        return true;
    }
    false
}

fn options() -> AmqpOptions {
    AmqpOptions::new(url())
        .with_reconnect_timeout(Duration::from_secs(120))
        .with_queue_expires(Duration::from_secs(600))
}

/// Waits until the broker accepts connections again (after a failed test, say).
async fn broker_up() {
    let deadline = Instant::now() + Duration::from_secs(120);
    while AmqpTransport::connect(options()).await.is_err() {
        assert!(Instant::now() < deadline, "RabbitMQ did not come back");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Starts the broker's application again if a failed test left it stopped.
struct StartAppOnDrop;

impl Drop for StartAppOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl").arg("start_app").output();
    }
}

#[test]
#[ignore = "stops the broker: run alone, after the parallel suite (scripts/test does)"]
fn a_broker_restart_mid_drain_loses_nothing() {
    if skip() {
        return;
    }
    let _restart_guard = StartAppOnDrop;
    runtime().block_on(async {
        let publisher = AmqpTransport::connect(options()).await.expect("connect");
        let q = QueueName::new(format!("restart.{}", Uuid::new_v4().simple())).expect("name");
        let envelopes = |from: usize, to: usize| -> Vec<Envelope> {
            (from..to)
                .map(|i| {
                    Envelope::builder(q.as_str(), "job")
                        .payload(&serde_json::json!({ "n": i }))
                        .build()
                        .expect("envelope")
                })
                .collect()
        };
        // Half before the restart; the other half is published while the broker is
        // down, and must wait for it, not be dropped.
        let first = envelopes(0, MESSAGES / 2);
        let second = envelopes(MESSAGES / 2, MESSAGES);
        let mut ids: Vec<Uuid> = first.iter().map(|e| e.id).collect();
        ids.extend(second.iter().map(|e| e.id));
        for chunk in first.chunks(500) {
            publisher
                .publish_batch(chunk.to_vec())
                .await
                .expect("publish");
        }

        let seen: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for _ in 0..2 {
            let t: Arc<dyn Transport> =
                Arc::new(AmqpTransport::connect(options()).await.expect("connect"));
            let record = seen.clone();
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
        while handled() < MESSAGES / 10 {
            assert!(Instant::now() < deadline, "the drain did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let at_stop = handled();
        tokio::task::spawn_blocking(|| rabbitmqctl(&["stop_app"]))
            .await
            .expect("stop_app");
        eprintln!("stopped RabbitMQ after {at_stop} of {MESSAGES} messages");
        let publishing = tokio::spawn(async move {
            for chunk in second.chunks(500) {
                publisher.publish_batch(chunk.to_vec()).await?;
            }
            Ok::<_, Error>(publisher)
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !publishing.is_finished(),
            "a publish went through a stopped broker"
        );
        tokio::task::spawn_blocking(|| rabbitmqctl(&["start_app"]))
            .await
            .expect("start_app");
        eprintln!("started RabbitMQ again");
        let publisher = publishing
            .await
            .expect("the publishing task")
            .expect("publishes during the outage waited and went through");

        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let left = publisher
                .stats(Some(&q))
                .await
                .ok()
                .and_then(|s| s.into_iter().next())
                .map_or(u64::MAX, |s| s.ready + s.dead);
            if handled() == MESSAGES && left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {MESSAGES} handled, {left} left 180 s after the restart",
                handled()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.cancel();
        for w in workers {
            w.await.expect("worker task").expect("worker");
        }
        let seen = seen.lock().expect("seen").clone();
        let missing = ids.iter().filter(|id| !seen.contains_key(id)).count();
        let duplicates: u32 = seen.values().map(|n| n - 1).sum();
        assert_eq!(missing, 0, "messages lost across the restart");
        assert!(publisher
            .dead_list(Some(&q), 10)
            .await
            .expect("dead list")
            .is_empty());
        eprintln!("all {MESSAGES} handled; {duplicates} handled twice (at-least-once)");
        publisher.delete_queue(&q).await.expect("delete");
        publisher.close().await;
    });
}

/// A `rabbit` application setting, as `rabbitmqctl eval` prints it (`{ok,60000}` or
/// `undefined`).
fn rabbit_env(key: &str) -> String {
    rabbitmqctl(&["eval", &format!("application:get_env(rabbit, {key}).")])
        .trim()
        .to_owned()
}

fn set_rabbit_env(key: &str, printed: &str) {
    let expr = match printed
        .strip_prefix("{ok,")
        .and_then(|v| v.strip_suffix('}'))
    {
        Some(value) => format!("application:set_env(rabbit, {key}, {value})."),
        None => format!("application:unset_env(rabbit, {key})."),
    };
    rabbitmqctl(&["eval", &expr]);
}

/// Puts the broker's settings back however the test ends. (Unsetting
/// `consumer_timeout` would switch the timeout off, not restore its default.)
struct RestoreRabbitEnv(Vec<(&'static str, String)>);

impl Drop for RestoreRabbitEnv {
    fn drop(&mut self) {
        for (key, printed) in &self.0 {
            set_rabbit_env(key, printed);
        }
    }
}

#[test]
#[ignore = "changes a broker-wide setting: run alone, after the parallel suite (scripts/test does)"]
fn the_brokers_consumer_timeout_loses_the_lease_and_the_message_returns() {
    if skip() {
        return;
    }
    // Both are read when a channel opens: a 1 s timeout, checked every 500 ms (by
    // default every 60 s).
    let restore = RestoreRabbitEnv(vec![
        ("consumer_timeout", rabbit_env("consumer_timeout")),
        ("channel_tick_interval", rabbit_env("channel_tick_interval")),
    ]);
    set_rabbit_env("consumer_timeout", "{ok,1000}");
    set_rabbit_env("channel_tick_interval", "{ok,500}");
    runtime().block_on(async {
        broker_up().await;
        let t = AmqpTransport::connect(options()).await.expect("connect");
        let q = QueueName::new(format!("timeout.{}", Uuid::new_v4().simple())).expect("name");
        let env = Envelope::builder(q.as_str(), "slow")
            .build()
            .expect("envelope");
        t.publish(env.clone()).await.expect("publish");
        let held = t.reserve(&q).await.expect("reserve").expect("the message");
        assert_eq!(held.envelope.attempts, 0);
        // The broker checks the timeout on its channel tick; hold the delivery until it
        // closes the channel.
        let deadline = Instant::now() + Duration::from_secs(120);
        while t.extend(&held, Duration::from_secs(30)).await.is_ok() {
            assert!(
                Instant::now() < deadline,
                "the broker never timed the consumer out"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        drop(restore);
        assert!(matches!(t.ack(&held).await, Err(Error::LeaseLost { .. })));
        // Delivered again, with the attempt counted.
        let deadline = Instant::now() + Duration::from_secs(10);
        let again = loop {
            if let Some(r) = t.reserve(&q).await.expect("reserve") {
                break r;
            }
            assert!(Instant::now() < deadline, "the message did not come back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(again.id(), env.id);
        assert_eq!(again.envelope.attempts, 1);
        t.ack(&again).await.expect("ack");
        t.delete_queue(&q).await.expect("delete");
        t.close().await;
    });
}

#[test]
#[ignore = "closes every connection to the broker: run alone, after the parallel suite (scripts/test does)"]
fn a_publish_cut_off_by_a_forced_close_is_published_again() {
    if skip() {
        return;
    }
    runtime().block_on(async {
        broker_up().await;
        let publisher = Arc::new(AmqpTransport::connect(options()).await.expect("connect"));
        let q = QueueName::new(format!("forced.{}", Uuid::new_v4().simple())).expect("name");
        // Batches go out back to back, so the close most likely finds one in flight:
        // RabbitMQ closes with 320 CONNECTION_FORCED, as on a node's stop or a rolling
        // restart, and the publish must be made again on the next connection, not
        // reported as failed for good.
        let closed = CancellationToken::new();
        let publishing = tokio::spawn({
            let (publisher, q, closed) = (publisher.clone(), q.clone(), closed.clone());
            async move {
                let mut ids = Vec::new();
                let mut after_close = 0;
                while after_close < 3 {
                    let batch: Vec<Envelope> = (0..500)
                        .map(|_| Envelope::builder(q.as_str(), "job").build())
                        .collect::<Result<_, _>>()?;
                    let batch_ids: Vec<Uuid> = batch.iter().map(|e| e.id).collect();
                    publisher.publish_batch(batch).await?;
                    ids.extend(batch_ids);
                    if closed.is_cancelled() {
                        after_close += 1;
                    }
                }
                Ok::<_, Error>(ids)
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::task::spawn_blocking(|| {
            rabbitmqctl(&[
                "close_all_connections",
                "--global",
                "switchyard forced-close test",
            ])
        })
        .await
        .expect("close_all_connections");
        closed.cancel();
        let ids = publishing
            .await
            .expect("the publishing task")
            .expect("every publish cut off by the close went through on the next connection");

        // Every id acknowledged to the publisher is in the queue (some maybe twice).
        let consumer = AmqpTransport::connect(options()).await.expect("connect");
        let mut seen = std::collections::HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while seen.len() < ids.len() {
            assert!(
                Instant::now() < deadline,
                "{} of {} published messages found",
                seen.len(),
                ids.len()
            );
            let batch = consumer.reserve_batch(&q, 100).await.expect("reserve");
            if batch.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            for r in &batch {
                seen.insert(r.id());
            }
            consumer.ack_batch(&batch).await.expect("ack");
        }
        let missing = ids.iter().filter(|id| !seen.contains(id)).count();
        assert_eq!(missing, 0, "published messages lost to the forced close");
        eprintln!("{} published across a forced close, none lost", ids.len());
        consumer.delete_queue(&q).await.expect("delete");
        consumer.close().await;
        publisher.close().await;
    });
}
