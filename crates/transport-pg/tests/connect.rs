//! Connecting: TLS with every check the URL asks for, and first connections that fail
//! fast with one line naming the server and the cause.
//!
//! The TLS cases need the TLS set-up of `scripts/test` (`scripts/lib/tls.sh`): a test
//! CA in `SWITCHYARD_TEST_TLS_DIR`, the local server's certificate for `localhost` only,
//! and roles that only `hostssl` admits (`switchyard_tls`, and `switchyard_cert`, which
//! logs in with the client certificate). Without it they skip, and fail under
//! `CI=true`.

mod support;

use std::time::{Duration, Instant};

use queue_core::conformance::unreachable::{closed_port, BlackHole};
use queue_core::{Envelope, Error, QueueName, TransportExt};
use transport_pg::{PgOptions, PgTransport};

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

fn url(user: &str, host: &str, query: &str) -> String {
    format!("postgres://{user}@{host}:5432/test?{query}")
}

/// Connects with a short connect timeout and returns the error, checking that it came
/// within the timeout (plus slack for a loaded machine) and is one line.
async fn refused(url: String) -> String {
    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let result = PgTransport::connect(
        PgOptions::new(url)
            .with_connect_timeout(timeout)
            .with_max_connections(1),
    )
    .await;
    let took = started.elapsed();
    let err = result.expect_err("the connection must fail");
    let text = err.to_string();
    assert!(
        took < timeout + Duration::from_secs(3),
        "took {took:?}: {text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

#[tokio::test]
async fn verify_full_with_the_ca_publishes_and_drains_over_tls() {
    let Some(dir) = tls_dir() else { return };
    let schema = format!("sy_tls_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let t = PgTransport::connect(
        PgOptions::new(url(
            "switchyard_tls",
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={dir}/ca.pem"),
        ))
        .with_schema(schema.clone())
        .with_max_connections(2),
    )
    .await
    .expect("verify-full with the test CA connects");
    let tls: bool = transport_pg::sqlx::query_scalar(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .fetch_one(t.pool())
    .await
    .expect("pg_stat_ssl");
    assert!(tls, "the pool's connections use TLS");
    let queue = QueueName::new("tls").expect("queue name");
    let envelope = Envelope::builder(queue.as_str(), "k")
        .build()
        .expect("envelope");
    t.publish(envelope).await.expect("publish over TLS");
    let got = t
        .reserve(&queue)
        .await
        .expect("reserve over TLS")
        .expect("the message published");
    t.ack(&got).await.expect("ack over TLS");
    transport_pg::sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(t.pool())
        .await
        .expect("drop the test schema");
}

#[tokio::test]
async fn a_client_certificate_logs_in_where_the_server_asks_for_one() {
    let Some(dir) = tls_dir() else { return };
    PgTransport::connect(
        PgOptions::new(url(
            "switchyard_cert",
            "localhost",
            &format!(
                "sslmode=verify-full&sslrootcert={dir}/ca.pem&sslcert={dir}/client.pem&sslkey={dir}/client.key"
            ),
        ))
        .with_max_connections(1),
    )
    .await
    .expect("the client certificate is accepted");
    let text = refused(url(
        "switchyard_cert",
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={dir}/ca.pem"),
    ))
    .await;
    assert!(text.contains("authentication refused"), "{text}");
}

#[tokio::test]
async fn a_wrong_ca_fails_fast_naming_the_certificate() {
    let Some(dir) = tls_dir() else { return };
    let text = refused(url(
        "switchyard_tls",
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={dir}/other-ca.pem"),
    ))
    .await;
    assert!(text.contains("PostgreSQL at localhost:5432"), "{text}");
    assert!(text.contains("not signed by a CA"), "{text}");
}

#[tokio::test]
async fn a_wrong_host_name_fails_fast_naming_the_mismatch() {
    let Some(dir) = tls_dir() else { return };
    let text = refused(url(
        "switchyard_tls",
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={dir}/ca.pem"),
    ))
    .await;
    assert!(text.contains("not valid for the host name"), "{text}");
    // A chain-only mode (verify-ca / VERIFY_CA) should pass here, but with sqlx 0.8.6
    // and rustls 0.23.46 it checks the name too: sqlx's name-skipping verifier matches
    // `NotValidForName`, which rustls now reports as `NotValidForNameContext`. The
    // README says so; nothing to assert until sqlx follows.
}

#[tokio::test]
async fn plaintext_is_refused_where_only_tls_is_admitted() {
    let Some(_dir) = tls_dir() else { return };
    let text = refused(url("switchyard_tls", "localhost", "sslmode=disable")).await;
    assert!(text.contains("authentication refused"), "{text}");
    assert!(text.contains("no encryption"), "{text}");
}

#[tokio::test]
async fn bad_tls_settings_are_refused_before_any_connection() {
    let cases = [
        ("sslmode=sometimes", "sslmode"),
        (
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "sslrootcert",
        ),
        ("sslmode=require&sslcert=/nonexistent/c.pem", "sslkey"),
    ];
    for (query, names) in cases {
        // A black hole: were a connection tried, this would wait for the timeout.
        let hole = BlackHole::open().expect("a black hole");
        let started = Instant::now();
        let err = PgTransport::connect(PgOptions::new(format!(
            "postgres://u:hunter2@127.0.0.1:{}/test?{query}",
            hole.port
        )))
        .await
        .expect_err("bad settings are refused");
        assert!(matches!(err, Error::Config(_)), "{query}: {err}");
        let text = err.to_string();
        assert!(text.contains(names), "{query}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{query}: no connection tried"
        );
    }
}

#[tokio::test]
async fn a_closed_port_is_refused_at_once_naming_host_and_port() {
    let port = closed_port().expect("a free port");
    let text = refused(format!("postgres://postgres:hunter2@127.0.0.1:{port}/test")).await;
    assert!(
        text.contains(&format!("PostgreSQL at 127.0.0.1:{port}")),
        "{text}"
    );
    assert!(text.contains("connection refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn a_black_hole_fails_within_the_connect_timeout() {
    let hole = BlackHole::open().expect("a black hole");
    let started = Instant::now();
    let text = refused(format!("postgres://postgres@127.0.0.1:{}/test", hole.port)).await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "waited the timeout"
    );
    assert!(
        text.contains(&format!("PostgreSQL at 127.0.0.1:{}", hole.port)),
        "{text}"
    );
    assert!(text.contains("no answer within 2s"), "{text}");
}

#[tokio::test]
async fn a_missing_database_is_named() {
    if support::skip_reason().is_some() {
        return;
    }
    let text = refused("postgres://postgres@127.0.0.1:5432/sy_no_such_database".into()).await;
    assert!(text.contains("the database does not exist"), "{text}");
}
