//! Connecting: `amqps://` with the CA and client certificates, the nodes of a cluster
//! tried in turn, and first connections that fail fast with one line naming the node
//! and the cause.
//!
//! The TLS cases need the TLS set-up of `scripts/test` (`scripts/lib/tls.sh`): a test
//! CA in `SWITCHYARD_TEST_TLS_DIR` and a TLS listener on 127.0.0.1:5671 whose
//! certificate is for `localhost` only. Without it they skip, and fail under `CI=true`.

mod support;

use std::time::{Duration, Instant};

use queue_core::conformance::unreachable::{closed_port, BlackHole};
use queue_core::{Envelope, Error, QueueName, TransportExt};
use transport_amqp::{AmqpOptions, AmqpTransport};

/// The test CA's directory, or why the TLS cases skip.
fn tls_dir() -> Option<String> {
    match std::env::var("SWITCHYARD_TEST_TLS_DIR") {
        Ok(dir) if !dir.is_empty() => Some(dir),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "SWITCHYARD_TEST_TLS_DIR is not set: scripts/test sets TLS up (scripts/lib/tls.sh); under CI=true the TLS tests must run"
            );
            eprintln!(
                "SKIPPED: SWITCHYARD_TEST_TLS_DIR is not set (run scripts/test, which sets TLS up)"
            );
            None
        }
    }
}

fn options(url: String) -> AmqpOptions {
    AmqpOptions::new(url)
        .with_retry_first_connect(false)
        .with_connect_timeout(Duration::from_secs(2))
}

/// Connects (failing at the first refusal) and returns the error, checking that it
/// came within the timeout (plus slack for a loaded machine) and is one line.
async fn refused(url: String) -> String {
    let started = Instant::now();
    let err = AmqpTransport::connect(options(url))
        .await
        .expect_err("the connection must fail");
    let took = started.elapsed();
    let text = err.to_string();
    assert!(took < Duration::from_secs(5), "took {took:?}: {text}");
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

/// Publishes one message to a fresh queue, reserves and acks it, and deletes the queue.
async fn round_trip(t: &AmqpTransport) {
    let queue =
        QueueName::new(format!("tls.{}", uuid::Uuid::new_v4().simple())).expect("a queue name");
    let envelope = Envelope::builder(queue.as_str(), "k")
        .build()
        .expect("an envelope");
    t.publish(envelope).await.expect("publish");
    let mut got = None;
    for _ in 0..50 {
        got = t.reserve(&queue).await.expect("reserve");
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = got.expect("the message published");
    t.ack(&got).await.expect("ack");
    t.delete_queue(&queue).await.expect("delete the queue");
}

#[tokio::test]
async fn amqps_with_the_ca_publishes_and_consumes() {
    let Some(dir) = tls_dir() else { return };
    let t = AmqpTransport::connect(options(format!(
        "amqps://guest:guest@localhost:5671/%2f?cacertfile={dir}/ca.pem"
    )))
    .await
    .expect("amqps with the test CA connects");
    assert_eq!(t.connected_node(), "localhost:5671");
    round_trip(&t).await;
    t.close().await;
}

#[tokio::test]
async fn amqps_presents_a_client_certificate() {
    let Some(dir) = tls_dir() else { return };
    let t = AmqpTransport::connect(options(format!(
        "amqps://guest:guest@localhost:5671/%2f?cacertfile={dir}/ca.pem&certfile={dir}/client.pem&keyfile={dir}/client.key"
    )))
    .await
    .expect("amqps with a client certificate connects");
    round_trip(&t).await;
    t.close().await;
}

#[tokio::test]
async fn a_wrong_ca_fails_fast_naming_the_certificate() {
    let Some(dir) = tls_dir() else { return };
    let text = refused(format!(
        "amqps://guest:guest@localhost:5671/%2f?cacertfile={dir}/other-ca.pem"
    ))
    .await;
    assert!(text.contains("RabbitMQ at localhost:5671"), "{text}");
    assert!(text.contains("not signed by a CA"), "{text}");
}

#[tokio::test]
async fn a_wrong_host_name_fails_fast_naming_the_mismatch() {
    let Some(dir) = tls_dir() else { return };
    let text = refused(format!(
        "amqps://guest:guest@127.0.0.1:5671/%2f?cacertfile={dir}/ca.pem"
    ))
    .await;
    assert!(text.contains("not valid for the host name"), "{text}");
}

#[tokio::test]
async fn plaintext_against_the_tls_listener_fails_fast() {
    let Some(_dir) = tls_dir() else { return };
    let text = refused("amqp://guest:guest@localhost:5671/%2f".into()).await;
    assert!(text.contains("RabbitMQ at localhost:5671"), "{text}");
    assert!(text.contains("plaintext"), "{text}");
}

#[tokio::test]
async fn tls_against_a_plaintext_port_fails_fast() {
    if support::skip_reason().is_some() {
        return;
    }
    let text = refused("amqps://guest:guest@localhost:5672/%2f".into()).await;
    assert!(text.contains("RabbitMQ at localhost:5672"), "{text}");
    assert!(text.contains("TLS"), "{text}");
}

#[tokio::test]
async fn a_wrong_password_is_named_and_not_shown() {
    if support::skip_reason().is_some() {
        return;
    }
    let text = refused("amqp://guest:hunter2@127.0.0.1:5672/%2f".into()).await;
    assert!(text.contains("authentication refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn a_closed_port_is_refused_at_once_naming_host_and_port() {
    let port = closed_port().expect("a free port");
    let text = refused(format!("amqp://guest:hunter2@127.0.0.1:{port}/%2f")).await;
    assert!(
        text.contains(&format!("RabbitMQ at 127.0.0.1:{port}")),
        "{text}"
    );
    assert!(text.contains("connection refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn a_black_hole_fails_within_the_connect_timeout() {
    let hole = BlackHole::open().expect("a black hole");
    let started = Instant::now();
    let text = refused(format!("amqp://guest:guest@127.0.0.1:{}/%2f", hole.port)).await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "waited the timeout"
    );
    assert!(
        text.contains(&format!("RabbitMQ at 127.0.0.1:{}", hole.port)),
        "{text}"
    );
    assert!(text.contains("no answer within 2s"), "{text}");
}

#[tokio::test]
async fn the_first_node_that_answers_is_used() {
    if support::skip_reason().is_some() {
        return;
    }
    let port = closed_port().expect("a free port");
    let t = AmqpTransport::connect(options(format!(
        "amqp://guest:guest@127.0.0.1:{port}/%2f,amqp://guest:guest@127.0.0.1:5672/%2f"
    )))
    .await
    .expect("the second node answers");
    assert_eq!(t.connected_node(), "127.0.0.1:5672");
    round_trip(&t).await;
    t.close().await;
    let hole = BlackHole::open().expect("a black hole");
    let text = refused(format!(
        "amqp://guest:guest@127.0.0.1:{port}/%2f,amqp://guest:guest@127.0.0.1:{}/%2f",
        hole.port
    ))
    .await;
    assert!(
        text.contains("no node of the cluster answered (2 tried)"),
        "{text}"
    );
    assert!(
        text.contains("connection refused") && text.contains("no answer"),
        "{text}"
    );
}

#[tokio::test]
async fn bad_settings_are_refused_before_any_connection() {
    let cases = [
        (
            "amqp://g:hunter2@HOST/%2f?cacertfile=/etc/hosts",
            "amqps:// only",
        ),
        (
            "amqps://g:hunter2@HOST/%2f?cacertfile=/nonexistent/ca.pem",
            "cacertfile",
        ),
        ("amqps://g:hunter2@HOST/%2f?certfile=/etc/hosts", "keyfile"),
        (
            "amqps://g:hunter2@HOST/%2f?verify=verify_none",
            "always verified",
        ),
        (
            "amqp://g:hunter2@HOST/a,amqp://g:hunter2@HOST/b",
            "share their",
        ),
    ];
    for (url, names) in cases {
        // A black hole: were a connection tried, this would wait for the timeout.
        let hole = BlackHole::open().expect("a black hole");
        let url = url.replace("HOST", &format!("127.0.0.1:{}", hole.port));
        let started = Instant::now();
        let err = AmqpTransport::connect(options(url.clone()))
            .await
            .expect_err("bad settings are refused");
        assert!(matches!(err, Error::Config(_)), "{url}: {err}");
        let text = err.to_string();
        assert!(text.contains(names), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{url}: no connection tried"
        );
    }
}
