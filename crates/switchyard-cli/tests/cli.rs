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
fn usage_mistakes_name_the_flag_and_keep_clap_tips() {
    let sb = Sandbox::new();
    for (args, named) in [
        (
            &[
                "publish",
                "--queue",
                "q",
                "--kind",
                "k",
                "--priority",
                "99999",
            ][..],
            "--priority",
        ),
        (
            &[
                "publish", "--queue", "q", "--kind", "k", "--id", "a", "--id", "b",
            ],
            "--id",
        ),
        (&["dead", "replay", "--id", "x", "--all"], "--all"),
        (&["no-such-command"], "no-such-command"),
        // The missing flag is named, with the usage line.
        (&["publish", "--kind", "k"], "--queue <QUEUE>"),
    ] {
        let out = sb.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.starts_with("error: "), "{args:?}: {err:?}");
        assert!(err.contains(named), "{args:?} should name {named}: {err:?}");
        assert!(err.contains("--help"), "{args:?}: {err:?}");
    }
    let out = sb.run(&["publish", "--kind", "k"]);
    assert!(
        text(&out.stderr).contains("Usage: switchyard publish"),
        "{}",
        text(&out.stderr)
    );
    // "Did you mean": for a flag and for a command.
    let out = sb.run(&["publish", "--queu", "q", "--kind", "k"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("tip:") && err.contains("'--queue'"), "{err:?}");
    let out = sb.run(&["stat"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("tip:") && err.contains("'stats'"), "{err:?}");
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

/// `bench --json` on a small run: every job checked off (by worker processes too, past a
/// backlog), the features' drains where the backend has them, and the bare baseline of
/// the same run (SQL, or lapin) beside the queue's figures, with the pickup of a bare
/// consumer on PostgreSQL and RabbitMQ.
fn bench_reports_on(sb: &Sandbox) {
    let out = sb.run(&[
        "bench",
        "--json",
        "--runs",
        "1",
        "--messages",
        "300",
        "--only-claim",
        "optimistic",
        "--reservers",
        "2",
        "--processes",
        "1,2",
        "--backlog",
        "500",
    ]);
    assert!(out.status.success(), "bench failed: {}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bench --json prints one JSON document");
    let r = &report["results"][0];
    assert_eq!(r["duplicates"], 0, "{r}");
    assert_eq!(r["missing"], 0, "{r}");
    assert!(r["drain_per_s"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    let by_processes = r["drain_processes"].as_array().expect("drain_processes");
    assert_eq!(by_processes.len(), 2, "{r}");
    for (d, n) in by_processes.iter().zip([1, 2]) {
        assert_eq!(d["processes"], n, "{d}");
        assert!(d["per_s"].as_f64().is_some_and(|v| v > 0.0), "{d}");
        assert_eq!(
            (&d["duplicates"], &d["missing"]),
            (&0.into(), &0.into()),
            "{d}"
        );
    }
    let sql = r["backend"] != "amqp";
    for field in [
        "drain_labels_per_s",
        "drain_limited_per_s",
        "enqueue_unique_per_s",
        "drain_unique_per_s",
    ] {
        assert_eq!(
            r[field].as_f64().is_some_and(|v| v > 0.0),
            sql,
            "{field} in {r}"
        );
    }
    if sql {
        let wasted = by_processes[1]["wasted_claim_ratio"].as_f64();
        assert!(wasted.is_some_and(|w| (0.0..=1.0).contains(&w)), "{r}");
    }
    let baseline = &r["baseline"];
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
    // The pickup floor: a bare consumer where the server can wake one.
    let wakes = matches!(r["backend"].as_str(), Some("postgres" | "amqp"));
    for field in ["pickup_p50_ms", "pickup_p99_ms", "pickup_ratio"] {
        assert_eq!(
            baseline[field].as_f64().is_some_and(|v| v > 0.0),
            wakes,
            "{field} in {baseline}"
        );
    }
}

#[test]
fn bench_reports_a_bare_sql_baseline_on_sqlite() {
    bench_reports_on(&Sandbox::new());
}

#[cfg(feature = "postgres")]
#[test]
fn bench_reports_a_bare_sql_baseline_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        bench_reports_on(&sb);
        // The queue's tables and the baseline's, open across the run, are dropped (the
        // migrations ledger, shared by every table of the schema, stays).
        let schema = sb.pg_schema.as_deref().expect("a schema");
        let sql = "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 \
                   AND tablename <> 'switchyard_migrations')";
        assert!(!server_says(&support::pg_url(), sql, schema));
    }
}

#[cfg(feature = "mysql")]
#[test]
fn bench_reports_a_bare_sql_baseline_on_mariadb() {
    if let Some(sb) = Sandbox::mysql() {
        bench_reports_on(&sb);
        let db = sb.mysql_db.as_deref().expect("a database");
        let sql = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? \
                   AND table_name <> 'switchyard_migrations'";
        assert!(!server_says(&support::mysql_url(), sql, db));
    }
}

#[cfg(feature = "amqp")]
#[test]
fn bench_reports_a_bare_lapin_baseline_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        bench_reports_on(&sb);
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

/// Runs one query on a test server from the test itself and returns its one boolean.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn server_says(url: &str, sql: &str, bind: &str) -> bool {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            use sqlx::Connection;
            if url.starts_with("postgres") {
                let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
                sqlx::query_scalar::<_, bool>(sql)
                    .bind(bind)
                    .fetch_one(&mut conn)
                    .await
                    .expect("query")
            } else {
                let mut conn = sqlx::MySqlConnection::connect(url).await.expect("connect");
                sqlx::query_scalar::<_, i64>(sql)
                    .bind(bind)
                    .fetch_one(&mut conn)
                    .await
                    .expect("query")
                    > 0
            }
        })
}

/// Runs one statement on the test PostgreSQL server from the test itself.
#[cfg(feature = "postgres")]
fn pg_execute(url: &str, sql: &str) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query(sql).execute(&mut conn).await.expect("execute");
        });
}

/// The reading commands `stats` and `dead list`, each run against `sb`: all fail in one
/// line naming `needles`.
fn reading_commands_fail_naming(sb: &Sandbox, needles: &[&str]) {
    for args in [&["stats"][..], &["dead", "list"], &["stats", "--json"]] {
        let out = sb.run(args);
        assert_one_line_error(&out, needles);
        assert!(text(&out.stderr).contains("nothing was created"));
    }
}

#[cfg(feature = "postgres")]
#[test]
fn reading_commands_create_no_schema_or_table_on_postgres() {
    let Some(mut sb) = Sandbox::postgres() else {
        return;
    };
    let url = support::pg_url();
    let schema = sb.pg_schema.clone().expect("a schema");
    let schema_exists = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)";
    reading_commands_fail_naming(&sb, &["QUEUE_SCHEMA", &schema, "no schema", "migrate"]);
    assert!(
        !server_says(&url, schema_exists, &schema),
        "created {schema}"
    );

    let out = sb.run(&["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    sb.set_env("QUEUE_TABLE", "typo_jobs");
    reading_commands_fail_naming(&sb, &["QUEUE_TABLE", "typo_jobs", "no table", &schema]);
    for table in ["typo_jobs", "typo_jobs_dead", "typo_jobs_status"] {
        let name = format!("\"{schema}\".\"{table}\"");
        assert!(
            !server_says(&url, "SELECT to_regclass($1) IS NOT NULL", &name),
            "created {name}"
        );
    }

    // A table at an older schema version is refused, not read (nor upgraded).
    sb.unset_env("QUEUE_TABLE");
    pg_execute(
        &url,
        &format!("DELETE FROM \"{schema}\".switchyard_migrations WHERE version > 2"),
    );
    let out = sb.run(&["stats"]);
    assert_one_line_error(&out, &["QUEUE_TABLE", "version 2", "switchyard migrate"]);
}

#[cfg(feature = "mysql")]
#[test]
fn reading_commands_create_no_database_or_table_on_mariadb() {
    let Some(mut sb) = Sandbox::mysql() else {
        return;
    };
    let url = support::mysql_url();
    let db = sb.mysql_db.clone().expect("a database");
    let db_exists = "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?";
    reading_commands_fail_naming(&sb, &["QUEUE_SCHEMA", &db, "no database", "migrate"]);
    assert!(!server_says(&url, db_exists, &db), "created {db}");

    let out = sb.run(&["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    sb.set_env("QUEUE_TABLE", "typo_jobs");
    reading_commands_fail_naming(&sb, &["QUEUE_TABLE", "typo_jobs", "no table", &db]);
    let tables = format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME LIKE ?"
    );
    assert!(
        !server_says(&url, &tables, "typo_jobs%"),
        "created typo_jobs"
    );
}

#[test]
fn reading_commands_create_no_table_in_an_existing_sqlite_file() {
    let mut sb = Sandbox::new();
    let out = sb.run(&["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    sb.set_env("QUEUE_TABLE", "typo_jobs");
    reading_commands_fail_naming(&sb, &["QUEUE_TABLE", "typo_jobs", "no table"]);
    // The table appears only once something that writes runs.
    let out = sb.run(&["publish", "--queue", "q", "--kind", "k", "--payload", "{}"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = sb.run(&["stats"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A bad `--kind`, `--delay`, `--expires-in` or `--max-attempts` is an error of that
/// flag (never of `--payload`), with its value, and a huge value is shown cut short.
#[test]
fn publish_names_the_flag_whose_value_is_bad() {
    let sb = Sandbox::new();
    let huge_kind = "k".repeat(5_000);
    for (flag, value, needles) in [
        (
            "--delay",
            "100000000000d",
            &["--delay 100000000000d", "too long"][..],
        ),
        (
            "--expires-in",
            "100000000000d",
            &["--expires-in 100000000000d", "too long"],
        ),
        ("--max-attempts", "0", &["--max-attempts 0", "at least 1"]),
        (
            "--kind",
            &huge_kind,
            &["--kind", "(5000 characters)", "1 to 255 printable"],
        ),
        ("--kind", "", &["--kind", "1 to 255 printable"]),
    ] {
        let mut args = vec!["publish", "--queue", "q", "--payload", "{}"];
        if flag != "--kind" {
            args.extend(["--kind", "k"]);
        }
        args.extend([flag, value]);
        let out = sb.run(&args);
        assert_one_line_error(&out, needles);
        let err = text(&out.stderr);
        assert!(!err.contains("--payload"), "{flag}: {err}");
        assert!(err.len() < 400, "{flag}: the value is echoed whole: {err}");
        // The same from stdin lines: the flag is named, not the line.
        let out = sb.run_stdin(
            &args[..3]
                .iter()
                .chain(&args[5..])
                .copied()
                .collect::<Vec<_>>(),
            "{}\n",
        );
        assert_one_line_error(&out, needles);
        assert!(!text(&out.stderr).contains("stdin line"), "{flag}");
    }
    assert!(sb.files().is_empty(), "wrote {:?}", sb.files());
}

/// `stats --queue Q` for a queue RabbitMQ does not have is a one-line error naming it
/// (exit 1, no driver noise), not "no messages": on the broker a queue exists or not,
/// and a typo should not read as an empty queue. Asking declares nothing.
#[cfg(feature = "amqp")]
#[test]
fn stats_of_a_queue_rabbitmq_does_not_have_is_a_one_line_error() {
    let Some(sb) = Sandbox::rabbitmq() else {
        return;
    };
    let q = format!("cli.never.{}", uuid::Uuid::new_v4().simple());
    // Twice: the first round must have declared nothing on the broker.
    for _ in 0..2 {
        for args in [
            &["stats", "--queue", &q][..],
            &["stats", "--json", "--queue", &q],
            &["dead", "list", "--queue", &q],
            &["dead", "list", "--json", "--queue", &q],
        ] {
            let out = sb.run(args);
            assert_one_line_error(&out, &["--queue", &q, "no queue of this name"]);
            assert_eq!(out.status.code(), Some(1));
            assert!(
                !text(&out.stderr).contains("NOT_FOUND"),
                "{}",
                text(&out.stderr)
            );
        }
    }
}

#[test]
fn subcommand_help_puts_its_own_options_first_then_the_global_ones_and_examples() {
    let sb = Sandbox::new();
    for command in [
        "migrate", "publish", "work", "stats", "job", "dead", "demo", "bench", "relay", "move",
        "prune", "serve",
    ] {
        let out = sb.run(&[command, "--help"]);
        assert!(out.status.success(), "{command}: {}", text(&out.stderr));
        let help = text(&out.stdout);
        let own = help.find("Options:").unwrap_or(usize::MAX);
        let global = help.find("Global options:").unwrap_or(usize::MAX);
        let examples = help.find("Examples:").unwrap_or(usize::MAX);
        assert!(
            own < global && global < examples && examples < help.len(),
            "{command}: own options, then global ones, then examples: {help}"
        );
        assert!(
            help[examples..].matches("switchyard ").count() >= 2,
            "{command}: two examples at least: {help}"
        );
    }
}
