//! The facade: `connect` builds the configured transport, and says clearly when a build
//! lacks the backend that the configuration asks for.

use switchyard::{Config, Envelope, QueueName, TransportExt};

fn config(pairs: &[(&str, String)]) -> Config {
    Config::from_lookup(|var| {
        pairs
            .iter()
            .find(|(k, _)| *k == var)
            .map(|(_, v)| v.clone())
    })
    .expect("a valid configuration")
}

/// A dropped store leaves none of its tables behind (status, keys, limits, schedules and
/// the rest, not only the jobs and dead letters).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn assert_nothing_left(table: &str, names: Vec<String>) {
    let left: Vec<String> = names.into_iter().filter(|n| n.starts_with(table)).collect();
    assert!(left.is_empty(), "drop_store left {left:?}");
}

#[cfg(not(feature = "amqp"))]
#[tokio::test]
async fn rabbitmq_without_its_transport_is_a_configuration_error_naming_the_feature() {
    let cfg = config(&[("QUEUE_BACKEND", "rabbitmq".into())]);
    match switchyard::connect(&cfg).await {
        Err(switchyard::Error::Config(e)) => {
            assert_eq!(e.setting, "QUEUE_BACKEND");
            assert!(e.to_string().contains("`amqp`"), "{e}");
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_sql_url_without_its_transport_names_the_feature_and_hides_the_password() {
    let mut cases = Vec::new();
    if cfg!(not(feature = "mysql")) {
        cases.push(("mysql://app:s3cret@127.0.0.1:1/db", "`mysql`"));
    }
    if cfg!(not(feature = "postgres")) {
        cases.push(("postgres://app:s3cret@127.0.0.1:1/db", "`postgres`"));
    }
    for (url, feature) in cases {
        let cfg = config(&[("DATABASE_URL", url.into())]);
        let err = switchyard::connect(&cfg)
            .await
            .expect_err("no such transport yet");
        let text = err.to_string();
        assert!(text.contains(feature), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn the_default_backend_is_sqlite_and_works_end_to_end() -> switchyard::Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("facade.db").display());
    let cfg = config(&[("DATABASE_URL", url), ("QUEUE_TABLE", "facade_jobs".into())]);
    let t = switchyard::connect(&cfg).await?;
    assert_eq!(t.name(), "sqlite");
    let env = Envelope::builder("facade", "ping").build()?;
    t.publish(env.clone()).await?;
    let q = QueueName::new("facade")?;
    let r = t.reserve(&q).await?.expect("the message");
    assert_eq!(r.id(), env.id);
    t.ack(&r).await?;
    assert!(!format!("{t:?}").is_empty());
    Ok(())
}

/// `DATABASE_URL=postgres://…` selects the PostgreSQL transport; a failed connection
/// never shows the password.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_url_selects_the_postgres_transport() -> switchyard::Result<()> {
    let cfg = config(&[(
        "DATABASE_URL",
        "postgres://app:s3cret@127.0.0.1:1/db".into(),
    )]);
    let err = switchyard::connect(&cfg)
        .await
        .expect_err("nothing listens on port 1");
    assert!(!err.to_string().contains("s3cret"), "{err}");
    assert!(!format!("{err:?}").contains("s3cret"), "{err:?}");

    let url = std::env::var("SWITCHYARD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if let Some(why) = queue_core::conformance::skip_unless_reachable("PostgreSQL", &url, 5432) {
        eprintln!("SKIPPED: {why}");
        return Ok(());
    }
    let table = format!(
        "facade_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let cfg = config(&[("DATABASE_URL", url), ("QUEUE_TABLE", table.clone())]);
    let t = switchyard::connect(&cfg).await?;
    assert_eq!(t.name(), "postgres");
    let env = Envelope::builder("facade", "ping").build()?;
    t.publish(env.clone()).await?;
    let r = t
        .reserve(&QueueName::new("facade")?)
        .await?
        .expect("the message");
    assert_eq!(r.id(), env.id);
    t.ack(&r).await?;
    let pg = switchyard::PgTransport::connect(switchyard::PgOptions::from_config(&cfg)).await?;
    pg.drop_store().await?;
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()",
    )
    .fetch_all(pg.pool())
    .await
    .expect("the table list");
    assert_nothing_left(&table, names);
    Ok(())
}

/// `DATABASE_URL=mysql://…` selects the MySQL transport.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_mysql_url_selects_the_mysql_transport() -> switchyard::Result<()> {
    let url = std::env::var("SWITCHYARD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    if let Some(why) = queue_core::conformance::skip_unless_reachable("MySQL", &url, 3306) {
        eprintln!("SKIPPED: {why}");
        return Ok(());
    }
    let table = format!(
        "facade_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let cfg = config(&[("DATABASE_URL", url), ("QUEUE_TABLE", table.clone())]);
    let t = switchyard::connect(&cfg).await?;
    assert_eq!(t.name(), "mysql");
    let env = Envelope::builder("facade", "ping").build()?;
    t.publish(env.clone()).await?;
    let r = t
        .reserve(&QueueName::new("facade")?)
        .await?
        .expect("the message");
    assert_eq!(r.id(), env.id);
    t.ack(&r).await?;
    let my =
        switchyard::MySqlTransport::connect(switchyard::MySqlOptions::from_config(&cfg)).await?;
    my.drop_store().await?;
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables WHERE table_schema = DATABASE()",
    )
    .fetch_all(my.pool())
    .await
    .expect("the table list");
    assert_nothing_left(&table, names);
    Ok(())
}

/// `QUEUE_BACKEND=rabbitmq` reaches the broker of `AMQP_URL`.
#[cfg(feature = "amqp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_backend_rabbitmq_selects_the_amqp_transport() -> switchyard::Result<()> {
    let url = std::env::var("SWITCHYARD_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    if let Some(why) = queue_core::conformance::skip_unless_reachable("RabbitMQ", &url, 5672) {
        eprintln!("SKIPPED: {why}");
        return Ok(());
    }
    let cfg = config(&[
        ("QUEUE_BACKEND", "rabbitmq".into()),
        ("AMQP_URL", url.clone()),
    ]);
    let t = switchyard::connect(&cfg).await?;
    assert_eq!(t.name(), "amqp");
    let q = QueueName::new(format!("facade.{}", uuid::Uuid::new_v4().simple()))?;
    let env = Envelope::builder(q.as_str(), "ping").build()?;
    t.publish(env.clone()).await?;
    let r = t.reserve(&q).await?.expect("the message");
    assert_eq!(r.id(), env.id);
    t.ack(&r).await?;
    let stats = t.stats(Some(&q)).await?;
    assert_eq!((stats[0].ready, stats[0].reserved), (0, 0), "{stats:?}");
    let admin = switchyard::AmqpTransport::connect(switchyard::AmqpOptions::new(url)).await?;
    admin.delete_queue(&q).await?;
    admin.close().await;
    Ok(())
}

/// A broker that cannot be reached is an error that keeps the password out.
#[cfg(feature = "amqp")]
#[tokio::test]
async fn an_unreachable_broker_is_an_error_without_the_password() {
    let cfg = config(&[
        ("QUEUE_BACKEND", "rabbitmq".into()),
        ("AMQP_URL", "amqp://app:s3cret@127.0.0.1:1/%2f".into()),
    ]);
    let err = switchyard::connect(&cfg)
        .await
        .expect_err("nothing listens on port 1");
    let text = err.to_string();
    assert!(!text.contains("s3cret"), "{text}");
}

/// A drain that is only inferred (the other backend's URL is set, `QUEUE_DRAIN` is not)
/// does not stop a process whose other backend cannot be opened; a drain asked for by
/// name does, and says how to go on without it.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn an_inferred_drain_of_an_unreachable_backend_is_skipped_a_named_one_fails() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("drain.db").display());
    let base = [
        ("QUEUE_BACKEND", "exec".to_owned()),
        ("DATABASE_URL", url),
        ("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f".to_owned()),
    ];
    let t = switchyard::connect(&config(&base))
        .await
        .expect("the configured backend alone");
    assert_eq!(t.name(), "sqlite");
    let mut named = base.to_vec();
    named.push(("QUEUE_DRAIN", "rabbitmq".to_owned()));
    let err = switchyard::connect(&config(&named))
        .await
        .expect_err("the named drain cannot be opened");
    assert!(err.to_string().contains("QUEUE_DRAIN"), "{err}");
}

/// `connect_worker` records job status without further steps, so the dashboard and
/// `publish --wait` see library jobs; `QUEUE_STATUS=off` is the one way out.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn connect_worker_records_status_unless_status_is_off() -> switchyard::Result<()> {
    use switchyard::worker::{handler_fn, JobContext, WorkerOptions};
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("worker.db").display());
    for status in ["on", "off"] {
        let cfg = config(&[
            ("DATABASE_URL", url.clone()),
            ("QUEUE_TABLE", format!("status_{status}")),
            ("QUEUE_STATUS", status.into()),
        ]);
        let worker =
            switchyard::connect_worker(&cfg, "reports", WorkerOptions::default().with_drain(true))
                .await?
                .handle(
                    "render",
                    handler_fn(|ctx: JobContext| async move {
                        ctx.set_result(&serde_json::json!({ "pages": 12 }))?;
                        Ok(())
                    }),
                );
        let t = switchyard::connect(&cfg).await?;
        let env = Envelope::builder("reports", "render").build()?;
        t.publish(env.clone()).await?;
        let report = worker.run(switchyard::CancellationToken::new()).await?;
        assert_eq!(report.succeeded, 1);
        // A store of the same table, read whatever the setting (the status table exists
        // either way).
        let on = config(&[
            ("DATABASE_URL", url.clone()),
            ("QUEUE_TABLE", format!("status_{status}")),
        ]);
        let opened = switchyard::connect_jobs(&on).await?;
        let store = opened.store().expect("SQLite keeps status");
        let recorded = store.get(env.id).await?;
        match status {
            "on" => {
                let job = recorded.expect("the job's status");
                assert_eq!(job.state, switchyard::JobState::Completed);
                assert_eq!(job.result, Some(serde_json::json!({ "pages": 12 })));
            }
            _ => assert_eq!(recorded, None, "QUEUE_STATUS=off records nothing"),
        }
    }
    Ok(())
}
