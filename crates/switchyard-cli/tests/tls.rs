//! The command line against each network backend over TLS with every check on
//! (`verify-full`, `VERIFY_IDENTITY`, `amqps://` with the test CA): publish, drain and
//! dead-letter; and the mistakes a user makes with TLS, each a one-line error within
//! the connect timeout.
//!
//! The servers' TLS is set up by `scripts/test` (`scripts/lib/tls.sh`): a throwaway CA
//! in `SWITCHYARD_TEST_TLS_DIR`, server certificates for `localhost` only, and users
//! that only TLS admits. Without it the tests skip, and fail under `CI=true`.

mod support;

use std::time::{Duration, Instant};

use support::{assert_one_line_error, text, Sandbox};

/// The test CA's directory, or why the tests skip.
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

/// Publishes three messages, drains two of them with a command that succeeds, and
/// sends the third to the dead letters with one that fails; all through `sb`'s TLS
/// connection.
fn publish_drain_and_dead_letter(sb: &Sandbox) -> String {
    let queue = format!("tls.{:08x}", fastrand::u32(..));
    let ids = sb.publish_lines(&queue, "ok", "{\"n\":1}\n{\"n\":2}\n");
    assert_eq!(ids.len(), 2);
    let bad = sb.publish_lines(&queue, "bad", "{\"n\":3}\n");
    let out = sb.run(&[
        "work",
        "--queue",
        &queue,
        "--exec",
        "grep -q '\"kind\":\"ok\"'",
        "--max-attempts",
        "1",
        "--drain",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["succeeded"], 2, "{report}");
    assert_eq!(report["dead_lettered"], 1, "{report}");
    let dead = sb.dead(&queue);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["id"], bad[0].as_str(), "{dead:?}");
    queue
}

/// `stats` with `key=value` set in the sandbox, failing in one line that names
/// `needles`, within the connect timeout (2 s) plus slack for a loaded machine.
fn fails_fast(sb: &mut Sandbox, key: &str, value: &str, needles: &[&str]) {
    sb.set_env(key, value);
    sb.set_env("QUEUE_CONNECT_TIMEOUT", "2s");
    let started = Instant::now();
    let out = sb.run(&["stats", "--queue", "tls.check"]);
    let took = started.elapsed();
    assert_one_line_error(&out, needles);
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_verify_full_publishes_drains_and_dead_letters() {
    let Some(dir) = tls_dir() else { return };
    let Some(mut sb) = Sandbox::postgres() else {
        return;
    };
    sb.set_env(
        "DATABASE_URL",
        &format!("postgres://switchyard_tls@localhost:5432/test?sslmode=verify-full&sslrootcert={dir}/ca.pem"),
    );
    publish_drain_and_dead_letter(&sb);
    fails_fast(
        &mut sb,
        "DATABASE_URL",
        &format!("postgres://switchyard_tls@localhost:5432/test?sslmode=verify-full&sslrootcert={dir}/other-ca.pem"),
        &["PostgreSQL at localhost:5432", "not signed by a CA"],
    );
    fails_fast(
        &mut sb,
        "DATABASE_URL",
        &format!("postgres://switchyard_tls@127.0.0.1:5432/test?sslmode=verify-full&sslrootcert={dir}/ca.pem"),
        &["PostgreSQL at 127.0.0.1:5432", "not valid for the host name"],
    );
    fails_fast(
        &mut sb,
        "DATABASE_URL",
        "postgres://switchyard_tls@localhost:5432/test?sslmode=disable",
        &["PostgreSQL at localhost:5432", "no encryption"],
    );
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_verify_identity_publishes_drains_and_dead_letters() {
    let Some(dir) = tls_dir() else { return };
    let Some(mut sb) = Sandbox::mysql() else {
        return;
    };
    sb.set_env(
        "DATABASE_URL",
        &format!("mysql://switchyard_tls@localhost:3306/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={dir}/ca.pem"),
    );
    publish_drain_and_dead_letter(&sb);
    fails_fast(
        &mut sb,
        "DATABASE_URL",
        &format!("mysql://switchyard_tls@localhost:3306/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={dir}/other-ca.pem"),
        &["MySQL at localhost:3306", "not signed by a CA"],
    );
    fails_fast(
        &mut sb,
        "DATABASE_URL",
        &format!("mysql://switchyard_tls@127.0.0.1:3306/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={dir}/ca.pem"),
        &["MySQL at 127.0.0.1:3306", "not valid for the host name"],
    );
    fails_fast(
        &mut sb,
        "DATABASE_URL",
        "mysql://switchyard_tls@localhost:3306/test?ssl-mode=DISABLED",
        &["MySQL at localhost:3306", "requires TLS"],
    );
}

#[cfg(feature = "amqp")]
#[test]
fn rabbitmq_amqps_publishes_drains_and_dead_letters() {
    let Some(dir) = tls_dir() else { return };
    let Some(mut sb) = Sandbox::rabbitmq() else {
        return;
    };
    sb.set_env(
        "AMQP_URL",
        &format!("amqps://guest:guest@localhost:5671/%2f?cacertfile={dir}/ca.pem"),
    );
    let queue = publish_drain_and_dead_letter(&sb);
    support::delete_broker_queue(&queue);
    fails_fast(
        &mut sb,
        "AMQP_URL",
        &format!("amqps://guest:guest@localhost:5671/%2f?cacertfile={dir}/other-ca.pem"),
        &["RabbitMQ at localhost:5671", "not signed by a CA"],
    );
    fails_fast(
        &mut sb,
        "AMQP_URL",
        &format!("amqps://guest:guest@127.0.0.1:5671/%2f?cacertfile={dir}/ca.pem"),
        &["RabbitMQ at 127.0.0.1:5671", "not valid for the host name"],
    );
    fails_fast(
        &mut sb,
        "AMQP_URL",
        "amqp://guest:guest@localhost:5671/%2f",
        &["RabbitMQ at localhost:5671", "plaintext"],
    );
}
