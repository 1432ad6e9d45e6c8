//! Labels and holders end to end: `publish --label`, `work --label --name`, and who holds
//! what in `stats --held`, `switchyard job` and the dashboard's API.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{assert_one_line_error, curl, text, Sandbox};

fn publish(sb: &Sandbox, queue: &str, kind: &str, label: &str) -> String {
    let out = sb.run(&[
        "publish",
        "--queue",
        queue,
        "--kind",
        kind,
        "--label",
        label,
        "--payload",
        "{}",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

fn json(sb: &Sandbox, args: &[&str]) -> serde_json::Value {
    let out = sb.run(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn a_labelled_worker_takes_only_its_labels_and_is_seen_holding_them() {
    let sb = Sandbox::new();
    let reds: Vec<String> = (0..3)
        .map(|_| publish(&sb, "paint", "red", "red"))
        .collect();
    for _ in 0..2 {
        publish(&sb, "paint", "blue", "blue");
    }
    let cmd = "env | grep '^SWITCHYARD_LABELS=' > \"$SWITCHYARD_MESSAGE_ID.labels\"; \
               touch \"started-$SWITCHYARD_MESSAGE_ID\"; \
               while [ ! -e release ]; do sleep 0.05; done";
    let mut worker = sb
        .cmd(&[
            "work", "--queue", "paint", "--label", "red", "--name", "painter", "--exec", cmd,
            "--drain", "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reds
        .iter()
        .all(|id| sb.path(&format!("started-{id}")).exists())
    {
        assert!(Instant::now() < deadline, "the red jobs did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let held = json(&sb, &["stats", "--held", "--queue", "paint", "--json"]);
    let held = held["held"].as_array().expect("a list of held messages");
    assert_eq!(held.len(), 3, "{held:?}");
    let holder = format!(":{}/painter", worker.id());
    for h in held {
        assert!(reds.iter().any(|id| h["id"] == id.as_str()), "{h}");
        let by = h["holder"].as_str().unwrap_or_default();
        assert!(
            by.ends_with(&holder),
            "held by {by:?}, not the worker {holder}"
        );
        assert_eq!(h["started"], true);
        assert!(h["lease_until"].is_string());
    }
    let table = sb.run(&["stats", "--held"]);
    assert!(
        text(&table.stdout).contains("HELD BY"),
        "{}",
        text(&table.stdout)
    );
    assert!(text(&table.stdout).contains(&holder));

    let job = json(&sb, &["job", &reds[0], "--json"]);
    assert!(
        job["held"]["holder"]
            .as_str()
            .unwrap_or_default()
            .ends_with(&holder),
        "{job}"
    );
    assert!(job["location"]
        .as_str()
        .unwrap_or_default()
        .starts_with("held by"));
    let shown = text(&sb.run(&["job", &reds[0]]).stdout);
    assert!(shown.contains("held by"), "{shown}");

    let served = sb.serve();
    let (status, body) = curl(&format!("{}/api/held", served.url), &[]);
    assert_eq!(status, 200, "{body}");
    let api: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(api.as_array().map(Vec::len), Some(3), "{api}");
    let (_, stats) = curl(&format!("{}/api/stats", served.url), &[]);
    assert!(stats.contains("\"holders\":true"), "{stats}");

    std::fs::write(sb.path("release"), "").expect("release the jobs");
    let deadline = Instant::now() + Duration::from_secs(30);
    while worker.try_wait().expect("poll the worker").is_none() {
        assert!(Instant::now() < deadline, "the red worker did not drain");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = worker.wait_with_output().expect("the worker's output");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a report");
    assert_eq!(report["succeeded"], 3, "{report}");
    for id in &reds {
        let labels = std::fs::read_to_string(sb.path(&format!("{id}.labels"))).expect("env");
        assert_eq!(labels.trim(), "SWITCHYARD_LABELS=red");
    }
    assert_eq!(
        sb.ready("paint"),
        2,
        "the blue messages are left for other workers"
    );
    let held = json(&sb, &["stats", "--held", "--json"]);
    assert_eq!(held["held"].as_array().map(Vec::len), Some(0), "{held}");
}

#[test]
fn a_bad_label_is_named_before_anything_is_stored() {
    let sb = Sandbox::new();
    let out = sb.run(&[
        "publish",
        "--queue",
        "paint",
        "--kind",
        "k",
        "--label",
        "dark red",
        "--payload",
        "{}",
    ]);
    assert_one_line_error(
        &out,
        &["--label", "invalid label \"dark red\"", "expected 1 to 64"],
    );
    let out = sb.run(&[
        "work", "--queue", "paint", "--label", "a,b", "--exec", "true", "--drain",
    ]);
    assert_one_line_error(&out, &["--label", "invalid label \"a,b\""]);
    publish(&sb, "paint", "k", "fine");
    assert_eq!(sb.ready("paint"), 1, "the refused publish stored something");
}

#[test]
fn rabbitmq_refuses_labels_and_holdings_and_says_why() {
    let Some(sb) = Sandbox::rabbitmq() else {
        return;
    };
    let queue = format!("labels-{}", uuid::Uuid::new_v4().simple());
    publish(&sb, &queue, "red", "red");
    let out = sb.run(&[
        "work", "--queue", &queue, "--label", "red", "--exec", "true", "--drain",
    ]);
    assert_one_line_error(&out, &["cannot claim by label", "queue of its own"]);
    let out = sb.run(&["stats", "--held"]);
    assert_one_line_error(&out, &["does not say which consumer holds which message"]);
    // The labelled message is still there, for an unfiltered worker.
    let out = sb.run(&[
        "work", "--queue", &queue, "--exec", "true", "--drain", "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    support::delete_broker_queue(&queue);
}
