//! The `switchyard` binary end to end, on a SQLite file in a temporary directory.

mod support;

use std::path::Path;

use support::{assert_one_line_error, text, Sandbox};

#[test]
fn publish_with_a_bad_backend_fails_in_one_line_and_writes_nothing() {
    let sb = Sandbox::new();
    let out = sb
        .cmd(&["publish", "--queue", "q", "--kind", "k", "--payload", "{}"])
        .env("QUEUE_BACKEND", "kafka")
        .output()
        .expect("run");
    assert_one_line_error(&out, &["QUEUE_BACKEND", "kafka", "exec or rabbitmq"]);
    assert!(sb.files().is_empty(), "wrote {:?}", sb.files());
}

#[test]
fn publish_with_a_malformed_database_url_fails_in_one_line_and_writes_nothing() {
    let sb = Sandbox::new();
    for url in [
        "postgres//nohost",
        "sqlite://",
        "nonsense",
        "postgres://user:hunter2@/db",
    ] {
        let out = sb
            .cmd(&["publish", "--queue", "q", "--kind", "k", "--payload", "{}"])
            .env("DATABASE_URL", url)
            .output()
            .expect("run");
        assert_one_line_error(&out, &["DATABASE_URL", "expected sqlite://"]);
        assert!(
            !text(&out.stderr).contains("hunter2"),
            "leaked the password"
        );
    }
    assert!(sb.files().is_empty(), "wrote {:?}", sb.files());
}

#[test]
fn publish_with_an_invalid_queue_name_fails_in_one_line_and_writes_nothing() {
    let sb = Sandbox::new();
    let out = sb.run(&[
        "publish",
        "--queue",
        "bad queue!",
        "--kind",
        "k",
        "--payload",
        "{}",
    ]);
    assert_one_line_error(&out, &["--queue", "bad queue!", "letters, digits"]);
    assert!(sb.files().is_empty(), "wrote {:?}", sb.files());
}

#[test]
fn publish_with_a_non_json_payload_fails_in_one_line_and_writes_nothing() {
    let sb = Sandbox::new();
    let out = sb.run(&[
        "publish",
        "--queue",
        "q",
        "--kind",
        "k",
        "--payload",
        "{not json",
    ]);
    assert_one_line_error(&out, &["--payload", "not valid JSON"]);
    assert!(sb.files().is_empty(), "wrote {:?}", sb.files());

    // In bulk, one bad line stops the whole batch before anything is published.
    assert!(sb.run(&["migrate"]).status.success());
    let out = sb.run_stdin(
        &["publish", "--queue", "q", "--kind", "k"],
        "{\"a\":1}\n{\"b\":2}\noops\n",
    );
    assert_one_line_error(&out, &["stdin line 3", "not valid JSON"]);
    assert_eq!(sb.ready("q"), 0, "part of a rejected batch was published");
}

#[test]
fn publish_from_stdin_prints_one_id_per_line_and_stats_count_them() {
    let sb = Sandbox::new();
    let lines: String = (0..1_200).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let out = sb.run_stdin(&["publish", "--queue", "bulk", "--kind", "k"], &lines);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ids: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(ids.len(), 1_200);
    assert!(ids.iter().all(|id| uuid::Uuid::parse_str(id).is_ok()));
    assert_eq!(sb.ready("bulk"), 1_200);

    let out = sb.run(&[
        "publish",
        "--queue",
        "one",
        "--kind",
        "k",
        "--payload",
        "{\"x\":1}",
        "--json",
        "--priority",
        "-2",
        "--header",
        "tenant=acme",
        "--delay",
        "1h",
        "--trace-id",
        "t-1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON line");
    assert_eq!(v["queue"], "one");
    let out = sb.run(&["stats"]);
    let table = text(&out.stdout);
    assert!(table.contains("bulk") && table.contains("1200"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("one ") && l.contains(" 1 ")),
        "{table}"
    );
}

#[test]
fn demo_then_dead_letters_can_be_listed_replayed_and_purged() {
    let sb = Sandbox::new();
    let out = sb.run(&["demo", "--jobs", "200"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary = text(&out.stdout);
    assert!(summary.contains("Processed 199"), "{summary}");
    assert!(summary.contains("dead-lettered 1"), "{summary}");
    assert!(summary.contains("switchyard dead list"), "{summary}");

    let out = sb.run(&["dead", "list", "--json", "--queue", "demo.invoices"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dead: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let dead = dead.as_array().expect("a list");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["reason"], "max_attempts");
    assert!(dead[0]["last_error"]
        .as_str()
        .is_some_and(|e| e.contains("card declined")));
    let id = dead[0]["id"].as_str().expect("an id").to_owned();

    let out = sb.run(&["dead", "replay", "--id", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "replayed 1 dead letter");
    assert_eq!(sb.ready("demo.invoices"), 1);

    let out = sb.run(&["dead", "replay", "--id", &id]);
    assert_one_line_error(&out, &["not found", &id]);
    let out = sb.run(&["dead", "purge", "--older-than", "soon"]);
    assert_one_line_error(&out, &["--older-than", "soon", "30d"]);
    let out = sb.run(&["dead", "purge", "--all", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "{\"purged\":0}");
}

#[test]
fn migrate_is_idempotent_and_honours_the_table_flag() {
    let sb = Sandbox::new();
    for _ in 0..2 {
        let out = sb.run(&["migrate", "--table", "tenant_a_jobs"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out = sb.run(&["migrate", "--table", "jobs;drop"]);
    assert_one_line_error(&out, &["QUEUE_TABLE", "jobs;drop", "identifier"]);
    assert!(Path::new(&sb.db()).exists());
}

#[test]
fn usage_mistakes_are_one_line_errors() {
    let sb = Sandbox::new();
    for args in [
        &[
            "publish",
            "--queue",
            "q",
            "--kind",
            "k",
            "--priority",
            "99999",
        ][..],
        &[
            "publish", "--queue", "q", "--kind", "k", "--id", "a", "--id", "b",
        ],
        &["dead", "replay", "--id", "x", "--all"],
        &["no-such-command"],
    ] {
        let out = sb.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err:?}");
        assert!(err.starts_with("switchyard: error: "), "{err:?}");
    }
    let out = sb.run(&[
        "publish",
        "--queue",
        "q",
        "--kind",
        "k",
        "--payload",
        "{}",
        "--delay",
        "100000000000d",
    ]);
    assert_one_line_error(&out, &["delay", "too long"]);
    assert!(sb.files().is_empty(), "wrote {:?}", sb.files());
}

#[test]
fn reading_commands_never_create_a_database() {
    let sb = Sandbox::new();
    for args in [
        &["stats"][..],
        &["dead", "list"],
        &["dead", "purge", "--all"],
    ] {
        let out = sb.run(args);
        assert_one_line_error(
            &out,
            &["DATABASE_URL", "does not exist", "switchyard migrate"],
        );
    }
    assert!(sb.files().is_empty(), "wrote {:?}", sb.files());
}

/// `bench --json` on a small run: every job checked off, and on a server the bare-SQL
/// baseline of the same run beside the queue's figures.
fn bench_reports_on(sb: &Sandbox, with_baseline: bool) {
    let out = sb.run(&[
        "bench",
        "--json",
        "--runs",
        "1",
        "--messages",
        "300",
        "--only-claim",
        "skip-locked",
        "--reservers",
        "2",
    ]);
    assert!(out.status.success(), "bench failed: {}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bench --json prints one JSON document");
    let r = &report["results"][0];
    assert_eq!(r["duplicates"], 0, "{r}");
    assert_eq!(r["missing"], 0, "{r}");
    assert!(r["drain_per_s"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    let baseline = &r["baseline"];
    if with_baseline {
        for field in [
            "insert_single_per_s",
            "insert_batch_per_s",
            "drain_per_s",
            "enqueue_batch_ratio",
            "drain_ratio",
        ] {
            assert!(
                baseline[field].as_f64().is_some_and(|v| v > 0.0),
                "{field} in {baseline}"
            );
        }
    } else {
        assert!(baseline.is_null(), "{baseline}");
    }
}

#[test]
fn bench_reports_every_job_checked_off() {
    bench_reports_on(&Sandbox::new(), false);
}

#[cfg(feature = "postgres")]
#[test]
fn bench_reports_a_bare_sql_baseline_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        bench_reports_on(&sb, true);
    }
}

#[cfg(feature = "mysql")]
#[test]
fn bench_reports_a_bare_sql_baseline_on_mariadb() {
    if let Some(sb) = Sandbox::mysql() {
        bench_reports_on(&sb, true);
    }
}

#[cfg(feature = "amqp")]
#[test]
fn bench_reports_a_bare_lapin_baseline_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        bench_reports_on(&sb, true);
    }
}

/// The command line on RabbitMQ: migrate, publish, stats of a named queue (AMQP cannot
/// list queues, and says so), work --exec with retries into the dead-letter queue, and
/// the dead-letter commands.
#[cfg(feature = "amqp")]
#[test]
fn the_command_line_works_on_rabbitmq() {
    let Some(sb) = Sandbox::rabbitmq() else {
        return;
    };
    let q = format!("cli.{}", uuid::Uuid::new_v4().simple());
    let out = sb.run(&["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("amqp is ready"),
        "{}",
        text(&out.stdout)
    );
    let ids = sb.publish_lines(&q, "k", "{\"n\":1}\n{\"n\":2}\n");
    assert_eq!(ids.len(), 2);
    assert_eq!(sb.ready(&q), 2);
    let out = sb.run(&["stats"]);
    assert_one_line_error(&out, &["--queue", "cannot list"]);

    let out = sb.run(&[
        "work",
        "--queue",
        &q,
        "--exec",
        "cat >/dev/null; exit 3",
        "--drain",
        "--max-attempts",
        "2",
        "--backoff-base",
        "100ms",
        "--backoff-max",
        "200ms",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dead = sb.dead(&q);
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead.iter().all(|d| d["reason"] == "max_attempts"),
        "{dead:?}"
    );
    let out = sb.run(&["dead", "replay", "--all", "--queue", &q]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sb.ready(&q), 2);
    let out = sb.run(&["work", "--queue", &q, "--exec", "cat >/dev/null", "--drain"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sb.ready(&q), 0);
    assert!(sb.dead(&q).is_empty());
    support::delete_broker_queue(&q);
}
