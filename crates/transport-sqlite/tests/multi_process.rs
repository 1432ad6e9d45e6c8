//! Several OS processes on one SQLite file: 4 processes × 4 concurrent reservers drain
//! 20,000 messages; every message is processed, none is claimed twice while its lease
//! holds, no ack loses its lease.
//!
//! The parent test re-runs this test binary as the child processes (the ignored test
//! `child_process_drains_its_share`), so no extra binary has to be built.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use queue_core::{Envelope, QueueName, Transport, TransportExt};
use transport_sqlite::{SqliteOptions, SqliteTransport};

const MESSAGES: usize = 20_000;
const PROCESSES: usize = 4;
const RESERVERS: usize = 4;
const QUEUE: &str = "multi-process";

fn url(db: &Path) -> String {
    format!("sqlite://{}", db.display())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
fn four_processes_drain_one_file_without_double_claims() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("shared.db");
    let rt = runtime();
    let transport = rt
        .block_on(SqliteTransport::connect(SqliteOptions::new(url(&db))))
        .expect("the parent opens the database");
    let envelopes: Vec<Envelope> = (0..MESSAGES)
        .map(|i| {
            Envelope::builder(QUEUE, "job")
                .payload(&serde_json::json!({ "n": i }))
                .build()
                .expect("a valid envelope")
        })
        .collect();
    rt.block_on(async {
        for chunk in envelopes.chunks(1_000) {
            transport
                .publish_batch(chunk.to_vec())
                .await
                .expect("publish");
        }
    });

    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            let out = dir.path().join(format!("claims-{p}.txt"));
            let child = Command::new(&exe)
                .args([
                    "--exact",
                    "child_process_drains_its_share",
                    "--ignored",
                    "--nocapture",
                ])
                .env("SWITCHYARD_CHILD_DB", &db)
                .env("SWITCHYARD_CHILD_OUT", &out)
                .spawn()
                .expect("spawn a child process");
            (child, out)
        })
        .collect();

    let mut claims: HashMap<String, Vec<(usize, String)>> = HashMap::new();
    for (p, (mut child, out)) in children.into_iter().enumerate() {
        let status = child.wait().expect("wait for a child");
        assert!(status.success(), "child process {p} failed: {status}");
        let text = std::fs::read_to_string(&out).expect("the child's claim log");
        for line in text.lines() {
            let (id, token) = line.split_once(' ').expect("an `id token` line");
            claims
                .entry(id.to_owned())
                .or_default()
                .push((p, token.to_owned()));
        }
    }

    let twice: Vec<_> = claims.iter().filter(|(_, c)| c.len() > 1).take(5).collect();
    assert!(
        twice.is_empty(),
        "claimed twice while the lease held: {twice:?}"
    );
    let missing = envelopes
        .iter()
        .filter(|e| !claims.contains_key(&e.id.to_string()))
        .count();
    assert_eq!(missing, 0, "messages never processed");
    assert_eq!(claims.len(), MESSAGES);
    let per_process: Vec<usize> = (0..PROCESSES)
        .map(|p| claims.values().filter(|c| c[0].0 == p).count())
        .collect();
    assert!(
        per_process.iter().all(|n| *n > 0),
        "every process should have taken part: {per_process:?}"
    );
    let q = QueueName::new(QUEUE).expect("valid queue");
    let left = rt.block_on(transport.stats(Some(&q))).expect("stats");
    assert!(
        left.iter()
            .all(|s| s.ready + s.reserved + s.delayed + s.dead == 0),
        "messages left behind: {left:?}"
    );
}

/// One child process: 4 reservers share a transport and drain until the queue is empty,
/// logging `id token` for every claim.
#[test]
#[ignore = "run as a child process by four_processes_drain_one_file_without_double_claims"]
fn child_process_drains_its_share() {
    let db = std::env::var("SWITCHYARD_CHILD_DB").expect("SWITCHYARD_CHILD_DB");
    let out = std::env::var("SWITCHYARD_CHILD_OUT").expect("SWITCHYARD_CHILD_OUT");
    let rt = runtime();
    let log = rt.block_on(async {
        let transport = Arc::new(
            SqliteTransport::connect(
                SqliteOptions::new(url(Path::new(&db)))
                    .with_visibility_timeout(Duration::from_secs(300)),
            )
            .await
            .expect("the child opens the database"),
        );
        let q = QueueName::new(QUEUE).expect("valid queue");
        let mut tasks = Vec::new();
        for _ in 0..RESERVERS {
            let (t, q) = (transport.clone(), q.clone());
            tasks.push(tokio::spawn(async move {
                let mut log = String::new();
                let mut empty_polls = 0;
                while empty_polls < 20 {
                    let batch = t.reserve_batch(&q, 8).await.expect("reserve");
                    if batch.is_empty() {
                        empty_polls += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    empty_polls = 0;
                    for r in &batch {
                        log.push_str(&format!("{} {}\n", r.id(), r.token()));
                    }
                    let report = t.ack_batch(&batch).await.expect("ack");
                    assert!(report.lost.is_empty(), "lost a lease: {:?}", report.lost);
                }
                log
            }));
        }
        let mut all = String::new();
        for task in tasks {
            all.push_str(&task.await.expect("a reserver task"));
        }
        all
    });
    std::fs::write(out, log).expect("write the claim log");
}
