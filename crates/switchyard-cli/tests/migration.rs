//! Moving between backends with the command line: a 10% canary to RabbitMQ, flips of
//! `QUEUE_BACKEND` in both directions while the previous backend is drained, and the
//! outbox relay killed mid-run. The SQL side is the sandbox's SQLite file (and, for the
//! transactional outbox, PostgreSQL); every test uses queues of its own on the broker.
#![cfg(feature = "amqp")]

mod support;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{amqp_url, delete_broker_queue, text, Sandbox};
use switchyard::{AmqpOptions, AmqpTransport, QueueName, Transport, TransportExt};

/// A sandbox on SQLite with the test broker configured beside it, or `None` (having
/// said why) when no broker is reachable outside CI.
fn both() -> Option<Sandbox> {
    let probe = Sandbox::rabbitmq()?;
    drop(probe);
    let mut sb = Sandbox::new();
    sb.set_env("AMQP_URL", &amqp_url());
    Some(sb)
}

fn fresh_queue(label: &str) -> String {
    format!("mig.{label}.{}", uuid::Uuid::new_v4().simple())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Each backend's `ready + delayed + reserved` for `queue`, from `stats --json` during a
/// migration: (exec, rabbitmq).
fn counts(sb: &Sandbox, queue: &str) -> (u64, u64) {
    let out = sb.run(&["stats", "--json", "--queue", queue]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    let mut exec = 0;
    let mut rabbit = 0;
    for b in v["backends"].as_array().expect("both backends") {
        let n: u64 = b["queues"]
            .as_array()
            .map(|qs| {
                qs.iter()
                    .filter(|q| q["queue"] == queue)
                    .map(|q| {
                        q["ready"].as_u64().unwrap_or(0)
                            + q["delayed"].as_u64().unwrap_or(0)
                            + q["reserved"].as_u64().unwrap_or(0)
                    })
                    .sum()
            })
            .unwrap_or(0);
        match b["backend"].as_str() {
            Some("exec") => exec = n,
            Some("rabbitmq") => rabbit = n,
            other => panic!("unexpected backend {other:?}"),
        }
    }
    (exec, rabbit)
}

/// Publishes `n` messages through the CLI (stdin, batched); the ids.
fn publish(sb: &Sandbox, queue: &str, n: usize) -> Vec<String> {
    let lines: String = (0..n).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let ids = sb.publish_lines(queue, "job", &lines);
    assert_eq!(ids.len(), n);
    ids
}

/// Publishes one message of `kind` with ordering key `key` through the CLI.
fn publish_keyed(sb: &Sandbox, queue: &str, kind: &str, key: &str) {
    let out = sb.run(&[
        "publish",
        "--queue",
        queue,
        "--kind",
        kind,
        "--ordering-key",
        key,
        "--payload",
        "{}",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `work --drain` on `queue` until it is empty on both sides.
fn work(sb: &Sandbox, queue: &str) {
    let out = sb.run(&[
        "work",
        "--queue",
        queue,
        "--exec",
        "cat >/dev/null",
        "--concurrency",
        "16",
        "--drain",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Whatever the canary share, a message with an ordering key goes to the primary (both
/// sides keep keys, but a key must not move while its messages wait on one side); the
/// rest follow the share.
#[test]
fn keyed_messages_stay_on_the_primary_during_a_canary() {
    let Some(mut sb) = both() else {
        return;
    };
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_CANARY_PERCENT", "100");
    let q = fresh_queue("keyedcanary");
    for n in 0..5 {
        publish_keyed(&sb, &q, &format!("s{n}"), &format!("order-{n}"));
    }
    publish(&sb, &q, 20);
    let (exec, rabbit) = counts(&sb, &q);
    assert_eq!(
        (exec, rabbit),
        (5, 20),
        "keyed on the primary, the rest on the canary"
    );
    work(&sb, &q);
    assert_eq!(counts(&sb, &q), (0, 0));
    support::delete_broker_queue(&q);
}

/// `QUEUE_CANARY_PERCENT=10`: about a tenth of 10,000 publishes land on RabbitMQ, an id
/// always on the same side, and workers process all of them from both.
#[test]
fn a_ten_percent_canary_splits_by_id_and_workers_drain_both_sides() {
    let Some(mut sb) = both() else {
        return;
    };
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_CANARY_PERCENT", "10");
    let q = fresh_queue("canary");
    publish(&sb, &q, 10_000);
    let (exec, rabbit) = counts(&sb, &q);
    assert_eq!(exec + rabbit, 10_000);
    assert!(
        (800..=1_200).contains(&rabbit),
        "{rabbit} of 10,000 on RabbitMQ at 10%"
    );

    // The same id twice lands on the same side both times.
    let id = uuid::Uuid::now_v7().to_string();
    let before = counts(&sb, &q);
    for _ in 0..2 {
        let out = sb.run(&[
            "publish",
            "--queue",
            &q,
            "--kind",
            "job",
            "--payload",
            "{}",
            "--id",
            &id,
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let after = counts(&sb, &q);
    let (dx, dr) = (after.0 - before.0, after.1 - before.1);
    assert!(
        (dx > 0) != (dr > 0),
        "one id reached both sides: {before:?} -> {after:?}"
    );

    work(&sb, &q);
    assert_eq!(counts(&sb, &q), (0, 0), "messages left after the drain");
    delete_broker_queue(&q);
}

/// Publish under one backend, flip `QUEUE_BACKEND`, publish more: workers started under
/// the new backend drain the old one too (detected from its configured URL, or named by
/// `QUEUE_DRAIN`), and nothing is stranded on either side.
#[test]
fn flips_in_both_directions_strand_nothing() {
    let Some(mut sb) = both() else {
        return;
    };
    // exec → rabbitmq, the old backend detected from DATABASE_URL.
    let q = fresh_queue("flip-up");
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_DRAIN", "none");
    publish(&sb, &q, 500);
    sb.set_env("QUEUE_BACKEND", "rabbitmq");
    sb.unset_env("QUEUE_DRAIN");
    publish(&sb, &q, 500);
    assert_eq!(counts(&sb, &q), (500, 500));
    let out = sb.run(&["stats", "--queue", &q]);
    assert!(
        text(&out.stdout).contains("exec (draining)"),
        "{}",
        text(&out.stdout)
    );
    work(&sb, &q);
    assert_eq!(counts(&sb, &q), (0, 0));
    let out = sb.run(&["stats", "--queue", &q]);
    assert!(
        text(&out.stdout).contains("exec (draining, drained)"),
        "{}",
        text(&out.stdout)
    );
    delete_broker_queue(&q);

    // rabbitmq → exec (a rollback), the old backend named by QUEUE_DRAIN.
    let q = fresh_queue("flip-down");
    sb.set_env("QUEUE_BACKEND", "rabbitmq");
    sb.set_env("QUEUE_DRAIN", "none");
    publish(&sb, &q, 500);
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_DRAIN", "rabbitmq");
    publish(&sb, &q, 500);
    assert_eq!(counts(&sb, &q), (500, 500));
    work(&sb, &q);
    assert_eq!(counts(&sb, &q), (0, 0));
    delete_broker_queue(&q);
}

/// Takes everything on the broker's `queue` (waiting up to `quiet` for more); each id
/// with how many times it came.
async fn consume_all(queue: &str, quiet: Duration) -> HashMap<uuid::Uuid, u32> {
    let t = AmqpTransport::connect(AmqpOptions::new(amqp_url()))
        .await
        .expect("connect");
    let q = QueueName::new(queue).expect("name");
    let mut seen: HashMap<uuid::Uuid, u32> = HashMap::new();
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        let got = t.reserve_batch(&q, 500).await.expect("reserve");
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        last = Instant::now();
        for r in &got {
            *seen.entry(r.id()).or_default() += 1;
        }
        t.ack_batch(&got).await.expect("ack");
    }
    t.delete_queue(&q).await.expect("delete");
    t.close().await;
    seen
}

/// The relay is SIGKILLed mid-run and started again: every message reaches RabbitMQ at
/// least once, and a duplicate carries the id of its original.
#[test]
fn a_relay_killed_mid_run_loses_nothing() {
    let Some(mut sb) = both() else {
        return;
    };
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_DRAIN", "none");
    // Short leases, so that the killed relay's batch is taken again soon.
    sb.set_env("QUEUE_VISIBILITY_TIMEOUT", "2s");
    let q = fresh_queue("relay");
    let ids = publish(&sb, &q, 5_000);

    let mut relay = sb
        .cmd(&["relay", "--queue", &q, "--batch", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the relay");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = sb.ready(&q);
        if left <= 4_000 {
            break;
        }
        assert!(Instant::now() < deadline, "the relay did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    relay.kill().expect("SIGKILL the relay");
    relay.wait().expect("reap the relay");
    let left = sb.ready(&q);
    assert!(left > 0, "the relay finished before it was killed");

    let out = sb.run(&["relay", "--queue", &q, "--drain", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sb.stats(&q)["ready"], 0);

    let seen = runtime().block_on(consume_all(&q, Duration::from_secs(2)));
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| {
            let id = uuid::Uuid::parse_str(id).expect("an id");
            !seen.contains_key(&id)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} ids never reached RabbitMQ",
        missing.len()
    );
    assert_eq!(seen.len(), 5_000, "an id that was never published arrived");
    let duplicates: u32 = seen.values().map(|n| n - 1).sum();
    eprintln!("relay killed with {left} left; {duplicates} forwarded twice, same ids");
}

/// A message the outbox accepted is forwarded even when the broker finds its unique key
/// held by another job: a key held only while pending is freed by the relay's first
/// claim, another job of the key is published meanwhile, and the first claim's lease
/// runs out; the relay's next try must not drop the first job as a duplicate.
#[test]
fn the_relay_forwards_a_job_whose_key_another_job_took_meanwhile() {
    let Some(mut sb) = both() else {
        return;
    };
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_DRAIN", "none");
    sb.set_env("QUEUE_VISIBILITY_TIMEOUT", "1s");
    let q = fresh_queue("relay-unique");
    let config = sb.config();
    let key = || switchyard::Unique::new("invoice-7").while_pending();
    let (first, second) = runtime().block_on(async {
        let outbox = switchyard::connect_backend(&config, switchyard::BackendKind::Exec, true)
            .await
            .expect("the outbox");
        let queue = QueueName::new(q.clone()).expect("a queue name");
        let job = || {
            switchyard::Envelope::builder(q.as_str(), "job")
                .unique(key())
                .build()
                .expect("an envelope")
        };
        let first = job();
        outbox
            .publish(first.clone())
            .await
            .expect("publish the first");
        // A relay that claims it and dies: the claim frees the key.
        let claimed = outbox
            .reserve(&queue)
            .await
            .expect("reserve")
            .expect("the first job");
        assert_eq!(claimed.id(), first.id);
        let second = job();
        let published = outbox
            .publish(second.clone())
            .await
            .expect("publish the second");
        assert!(
            published.duplicate_of(second.id).is_none(),
            "the key was not freed by the claim"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        (first.id, second.id)
    });
    let out = sb.run(&["relay", "--queue", &q, "--drain", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = runtime().block_on(consume_all(&q, Duration::from_secs(2)));
    assert!(
        seen.contains_key(&first),
        "the first job was dropped on its way to RabbitMQ: {seen:?}"
    );
    assert!(seen.contains_key(&second), "the second job: {seen:?}");
}

/// Keyed messages in the outbox are relayed in order to their key's partition on
/// RabbitMQ, beside unkeyed ones, and come out of it one at a time in that order.
#[test]
fn keyed_messages_are_relayed_in_their_order() {
    let Some(mut sb) = both() else {
        return;
    };
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_DRAIN", "none");
    let q = fresh_queue("keyed");
    let ids = publish(&sb, &q, 3);
    for n in 0..5 {
        publish_keyed(&sb, &q, &format!("s{n}"), "order-1");
    }
    let out = sb.run(&["relay", "--queue", &q, "--drain", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(sb.dead(&q).is_empty(), "nothing is set aside");
    let (unkeyed, keyed) = runtime().block_on(async {
        let t = AmqpTransport::connect(AmqpOptions::new(amqp_url()))
            .await
            .expect("connect");
        let queue = QueueName::new(q.as_str()).expect("name");
        let (mut unkeyed, mut keyed) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(30);
        while unkeyed.len() + keyed.len() < 8 && Instant::now() < deadline {
            let got = t.reserve_batch(&queue, 10).await.expect("reserve");
            assert!(
                got.iter()
                    .filter(|r| r.envelope.ordering_key.is_some())
                    .count()
                    <= 1,
                "two messages of one key out at once"
            );
            for r in &got {
                match r.envelope.ordering_key {
                    Some(_) => keyed.push(r.envelope.kind.clone()),
                    None => unkeyed.push(r.id().to_string()),
                }
            }
            t.ack_batch(&got).await.expect("ack");
        }
        t.delete_queue(&queue).await.expect("delete");
        t.close().await;
        (unkeyed, keyed)
    });
    assert_eq!(keyed, ["s0", "s1", "s2", "s3", "s4"], "the key's order");
    let mut unkeyed = unkeyed;
    unkeyed.sort();
    let mut ids = ids;
    ids.sort();
    assert_eq!(unkeyed, ids);
}

#[test]
fn a_rolled_back_outbox_publish_never_reaches_rabbitmq() {
    let Some(mut sb) = Sandbox::postgres() else {
        return;
    };
    if Sandbox::rabbitmq().is_none() {
        return;
    }
    sb.set_env("AMQP_URL", &amqp_url());
    sb.set_env("QUEUE_BACKEND", "exec");
    sb.set_env("QUEUE_DRAIN", "none");
    let q = fresh_queue("outbox");
    let schema = sb.pg_schema.clone().expect("a schema");
    let (kept, dropped) = runtime().block_on(async {
        use switchyard::sqlx::Connection;
        let t = switchyard::PgTransport::connect(
            switchyard::PgOptions::new(support::pg_url()).with_schema(schema),
        )
        .await
        .expect("connect");
        let mut conn = switchyard::sqlx::PgConnection::connect(&support::pg_url())
            .await
            .expect("a connection");
        let kept = switchyard::Envelope::builder(q.as_str(), "kept")
            .build()
            .expect("envelope");
        let dropped = switchyard::Envelope::builder(q.as_str(), "dropped")
            .build()
            .expect("envelope");
        let mut tx = conn.begin().await.expect("begin");
        t.publish_tx(&mut tx, dropped.clone())
            .await
            .expect("publish");
        tx.rollback().await.expect("rollback");
        let mut tx = conn.begin().await.expect("begin");
        t.publish_tx(&mut tx, kept.clone()).await.expect("publish");
        tx.commit().await.expect("commit");
        (kept.id, dropped.id)
    });
    let out = sb.run(&["relay", "--queue", &q, "--drain", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("relay JSON");
    assert_eq!(v["relayed"], 1, "{v}");
    let seen = runtime().block_on(consume_all(&q, Duration::from_secs(1)));
    assert_eq!(seen.get(&kept), Some(&1));
    assert!(
        !seen.contains_key(&dropped),
        "a rolled-back message was relayed"
    );
}

/// The ids of `dead list` for `queue`, with reason and attempts, sorted.
fn dead_of(sb: &Sandbox, queue: &str) -> Vec<(String, String, u64)> {
    let mut out: Vec<(String, String, u64)> = sb
        .dead(queue)
        .iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap_or_default().to_owned(),
                d["reason"].as_str().unwrap_or_default().to_owned(),
                d["attempts"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

/// `move` empties the old backend into the new one, ready and delayed messages (ids,
/// attempts and due times kept) and dead letters alike, and back again.
#[test]
fn move_takes_ready_delayed_and_dead_messages_across_and_back() {
    if let Some(sb) = both() {
        move_round_trip(sb);
    }
}

/// The same, with the SQL side on PostgreSQL.
#[cfg(feature = "postgres")]
#[test]
fn move_round_trips_on_postgres() {
    if let (Some(mut sb), Some(_)) = (Sandbox::postgres(), Sandbox::rabbitmq()) {
        sb.set_env("AMQP_URL", &amqp_url());
        move_round_trip(sb);
    }
}

/// The same, with the SQL side on MariaDB (dead letters leave tombstones there).
#[cfg(feature = "mysql")]
#[test]
fn move_round_trips_on_mariadb() {
    if let (Some(mut sb), Some(_)) = (Sandbox::mysql(), Sandbox::rabbitmq()) {
        sb.set_env("AMQP_URL", &amqp_url());
        move_round_trip(sb);
    }
}

/// A fresh queue on exec (not drained) whose two messages failed for good: the queue
/// and its dead letters.
fn two_dead_letters_on_exec(sb: &mut Sandbox, label: &str) -> (String, Vec<(String, String, u64)>) {
    sb.set_env("QUEUE_DRAIN", "none");
    sb.set_env("QUEUE_BACKEND", "exec");
    let q = fresh_queue(label);
    publish(sb, &q, 2);
    let out = sb.run(&[
        "work",
        "--queue",
        &q,
        "--exec",
        "cat >/dev/null; exit 1",
        "--max-attempts",
        "1",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dead = dead_of(sb, &q);
    assert_eq!(dead.len(), 2);
    (q, dead)
}

fn move_round_trip(mut sb: Sandbox) {
    let (q, dead_before) = two_dead_letters_on_exec(&mut sb, "move");
    publish(&sb, &q, 10);
    for _ in 0..3 {
        let out = sb.run(&[
            "publish",
            "--queue",
            &q,
            "--kind",
            "later",
            "--payload",
            "{}",
            "--delay",
            "3s",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    let out = sb.run(&[
        "move", "--from", "exec", "--to", "rabbitmq", "--queue", &q, "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("move JSON");
    assert_eq!(
        (v["moved"].as_u64(), v["delayed"].as_u64()),
        (Some(13), Some(3)),
        "{v}"
    );
    assert_eq!(v["dead_letters"], 2, "{v}");
    assert_eq!(v["left"], 0, "{v}");
    assert!(
        v["differences"].as_array().is_some_and(|d| !d.is_empty()),
        "no capability differences reported: {v}"
    );
    let s = sb.stats(&q);
    assert_eq!(
        (s["ready"].as_u64(), s["delayed"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    assert!(sb.dead(&q).is_empty(), "dead letters left on exec");

    sb.set_env("QUEUE_BACKEND", "rabbitmq");
    assert_eq!(sb.ready(&q), 10, "the ready messages on RabbitMQ");
    assert_eq!(
        dead_of(&sb, &q),
        dead_before,
        "the dead letters on RabbitMQ"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while sb.ready(&q) < 13 {
        assert!(
            Instant::now() < deadline,
            "the delayed messages never arrived"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let out = sb.run(&[
        "move", "--from", "rabbitmq", "--to", "exec", "--queue", &q, "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("move JSON");
    assert_eq!(v["moved"], 13, "{v}");
    assert_eq!(v["dead_letters"], 2, "{v}");
    assert_eq!(v["left"], 0, "{v}");
    assert_eq!(sb.ready(&q), 0, "left on RabbitMQ");
    assert!(sb.dead(&q).is_empty(), "dead letters left on RabbitMQ");
    sb.set_env("QUEUE_BACKEND", "exec");
    assert_eq!(sb.ready(&q), 13);
    assert_eq!(
        dead_of(&sb, &q),
        dead_before,
        "the dead letters back on exec"
    );
    delete_broker_queue(&q);
}

/// A message held under a lease (a worker's, or a failed move's) cannot be moved: `move`
/// says how many are still on the source, instead of reporting the queue moved.
#[test]
fn move_reports_what_it_left_held_on_the_source() {
    let Some(mut sb) = both() else {
        return;
    };
    sb.set_env("QUEUE_DRAIN", "none");
    sb.set_env("QUEUE_BACKEND", "exec");
    let q = fresh_queue("move-held");
    publish(&sb, &q, 2);
    let rt = runtime();
    let config = sb.config();
    let (source, held) = rt.block_on(async {
        let source = switchyard::connect_backend(&config, switchyard::BackendKind::Exec, false)
            .await
            .expect("the exec backend");
        let queue = QueueName::new(q.clone()).expect("a queue name");
        let held = source
            .reserve(&queue)
            .await
            .expect("reserve")
            .expect("a message to hold");
        (source, held)
    });
    let out = sb.run(&[
        "move", "--from", "exec", "--to", "rabbitmq", "--queue", &q, "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("move JSON");
    assert_eq!(
        (v["moved"].as_u64(), v["left"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert!(
        v["notes"].as_array().is_some_and(|n| n.iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("1 messages") && n.contains("still on exec")))),
        "no note of the message left: {v}"
    );
    rt.block_on(async {
        source.ack(&held).await.expect("ack the held message");
    });
    delete_broker_queue(&q);
}

/// Dead letters without an id stay on the source, and a batch of them ahead of the
/// others (they died first) does not end the move of the letters behind them.
#[cfg(feature = "sqlite")]
#[test]
fn move_takes_dead_letters_behind_ones_without_an_id() {
    let Some(mut sb) = both() else {
        return;
    };
    let (q, dead_before) = two_dead_letters_on_exec(&mut sb, "move-idless");
    // A letter as another program might leave it: no id, and dead before the others.
    let url = format!("sqlite://{}", sb.db().display());
    let queue = q.clone();
    runtime().block_on(async move {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("the sandbox's database");
        sqlx::query(
            "INSERT INTO switchyard_jobs_dead (id, queue, kind, reason, dead_at, envelope) \
             VALUES ('', ?1, 'job', 'malformed', 0, 'not an envelope')",
        )
        .bind(queue)
        .execute(&mut conn)
        .await
        .expect("a dead letter without an id");
    });
    let out = sb.run(&[
        "move", "--from", "exec", "--to", "rabbitmq", "--queue", &q, "--batch", "1", "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("move JSON");
    assert_eq!(v["dead_letters"], 2, "{v}");
    assert_eq!(
        sb.dead(&q).len(),
        1,
        "the letter without an id stays on exec"
    );
    sb.set_env("QUEUE_BACKEND", "rabbitmq");
    assert_eq!(
        dead_of(&sb, &q),
        dead_before,
        "the dead letters on RabbitMQ"
    );
    delete_broker_queue(&q);
}

/// `stats` during a canary names the canary side `canary N%` (never `draining`, which is
/// for a backend being left), whichever way the canary points, in text and JSON.
#[test]
fn stats_name_the_canary_side_in_both_directions() {
    let Some(mut sb) = both() else {
        return;
    };
    let q = fresh_queue("canary-label");
    sb.set_env("QUEUE_CANARY_PERCENT", "10");
    for (primary, canary) in [("exec", "rabbitmq"), ("rabbitmq", "exec")] {
        sb.set_env("QUEUE_BACKEND", primary);
        let out = sb.run(&["migrate"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let out = sb.run(&["stats", "--queue", &q]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let shown = text(&out.stdout);
        assert!(shown.contains(&format!("{primary} (primary)")), "{shown}");
        assert!(shown.contains(&format!("{canary} (canary 10%)")), "{shown}");
        assert!(!shown.contains("draining"), "{shown}");

        let out = sb.run(&["stats", "--json", "--queue", &q]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
        let side = |name: &str| {
            v["backends"]
                .as_array()
                .and_then(|bs| bs.iter().find(|b| b["backend"] == name).cloned())
                .unwrap_or_else(|| panic!("no {name} in {v}"))
        };
        assert_eq!(side(primary)["role"], "primary", "{v}");
        assert_eq!(side(canary)["role"], "canary 10%", "{v}");
        assert_eq!(side(canary)["drained"], false, "{v}");
    }

    // Without a canary share, the other side is the one being drained.
    sb.set_env("QUEUE_CANARY_PERCENT", "0");
    sb.set_env("QUEUE_BACKEND", "rabbitmq");
    let out = sb.run(&["stats", "--queue", &q]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("exec (draining, drained)"),
        "{}",
        text(&out.stdout)
    );
}
