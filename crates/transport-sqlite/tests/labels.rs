//! A claim that selects labels at depth: still a walk of the claim index in delivery
//! order, with each row's labels checked on the way.

use queue_core::{Claim, QueueName, Transport};
use sqlx::Connection;
use transport_sqlite::{SqliteOptions, SqliteTransport};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_claim_walks_the_claim_index_at_a_depth_of_one_million() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let t = SqliteTransport::connect(SqliteOptions::new(url.clone()))
        .await
        .expect("connect");
    let mut raw = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("raw connection");
    let q = QueueName::new("deep").expect("queue");
    // A million ready rows of valid envelopes, ten labels, one each.
    sqlx::query(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 1000000),
              r AS (SELECT n, printf('%08x-0000-7000-8000-%012x', n, n) AS id FROM g)
         INSERT INTO switchyard_jobs (id, queue, kind, priority, attempts, ready, available_at,
                                      visible_at, created_at, envelope, labels)
         SELECT id, 'deep', 'k', 0, 0, 1, n, n, n,
                json_object('v', 1, 'id', id, 'queue', 'deep', 'kind', 'k', 'payload', NULL,
                    'attempts', 0, 'priority', 0, 'created_at', '2026-01-01T00:00:00Z',
                    'available_at', '2026-01-01T00:00:00Z', 'headers', json_object(),
                    'labels', json_array('l' || (n % 10))),
                ',l' || (n % 10) || ','
           FROM r",
    )
    .execute(&mut raw)
    .await
    .expect("a million rows");
    sqlx::query("ANALYZE")
        .execute(&mut raw)
        .await
        .expect("analyze");
    let filter = vec!["l3".to_owned(), "l7".to_owned()];
    let plan = t.explain_claim(&q, 100, &filter).await.expect("explain");
    eprintln!("plan of a claim of labels l3 or l7 at a depth of 1,000,000:\n{plan}");
    assert!(
        plan.contains("USING INDEX switchyard_jobs_claim (queue=?)"),
        "not the claim index:\n{plan}"
    );
    assert!(
        !plan.contains("TEMP B-TREE"),
        "the label claim sorts:\n{plan}"
    );
    assert!(
        !plan.contains("SCAN switchyard_jobs"),
        "the label claim scans:\n{plan}"
    );
    let started = std::time::Instant::now();
    let claimed = t
        .claim(&q, Claim::reserve(100).with_labels(&filter))
        .await
        .expect("claim");
    eprintln!(
        "a claim of 100 messages of 2 labels in 10 at that depth took {:?}",
        started.elapsed()
    );
    assert_eq!(claimed.len(), 100);
    assert!(claimed
        .iter()
        .all(|r| r.envelope.labels == ["l3"] || r.envelope.labels == ["l7"]));
}
