//! `switchyard progress` from a command of `work --exec`, on every backend: the job's
//! status shows the percent and note while it runs; a report under another lease token
//! (a command whose run was overtaken) is refused and exits 1; outside a worker it says
//! what is missing. The command's stderr lines are the job's log, shown while it runs.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{text, Sandbox, Workers};

fn reports_progress(sb: &Sandbox) {
    let q = format!("progress-{:08x}", fastrand::u32(..));
    let ids = sb.publish_lines(&q, "render", "{}\n");
    let bin = env!("CARGO_BIN_EXE_switchyard");
    let command = format!(
        "echo 'rendering page 1' >&2; {bin} progress 40 rendering; echo \"ok=$?\" >> out; \
         SWITCHYARD_LEASE_TOKEN=stale {bin} progress 10 late 2>> err; echo \"stale=$?\" >> out; sleep 2"
    );
    let worker = sb
        .cmd(&["work", "--queue", &q, "--exec", &command])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker");
    let workers = Workers(vec![worker]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = sb.run(&["job", &ids[0], "--json"]);
        let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let status = &view["status"];
        if status["progress"] == 40 {
            assert_eq!(status["progress_message"], "rendering", "{status}");
            assert_eq!(status["state"], "running", "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "no progress within 30 s: {view}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(sb.path("out"))
        .unwrap_or_default()
        .contains("stale=")
    {
        assert!(
            Instant::now() < deadline,
            "the command never finished its reports"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The refused report changed nothing: the job still shows the run's own.
    let view = sb.run(&["job", &ids[0], "--json"]);
    let view: serde_json::Value = serde_json::from_slice(&view.stdout).expect("JSON");
    assert_eq!(view["status"]["progress"], 40, "{view}");
    assert_eq!(view["status"]["progress_message"], "rendering", "{view}");
    assert_eq!(view["logs"][0]["attempt"], 1, "{view}");
    assert_eq!(view["logs"][0]["lines"], "rendering page 1\n", "{view}");
    let shown = text(&sb.run(&["job", &ids[0]]).stdout);
    assert!(
        shown.contains("log of attempt 1") && shown.contains("  rendering page 1"),
        "{shown}"
    );
    workers.stop();
    let out = std::fs::read_to_string(sb.path("out")).expect("the command's record");
    assert!(out.contains("ok=0") && out.contains("stale=1"), "{out}");
    let err = std::fs::read_to_string(sb.path("err")).expect("the refusal");
    assert!(err.contains("another lease"), "{err}");
    if sb.rabbitmq {
        support::delete_broker_queue(&q);
    }
}

#[test]
fn a_command_reports_progress_on_sqlite() {
    reports_progress(&Sandbox::new());
}

#[test]
fn a_command_reports_progress_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        reports_progress(&sb);
    }
}

#[test]
fn a_command_reports_progress_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        reports_progress(&sb);
    }
}

#[test]
fn a_command_reports_progress_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        reports_progress(&sb);
    }
}

#[test]
fn progress_outside_a_worker_says_what_is_missing() {
    let sb = Sandbox::new();
    let out = sb.run(&["progress", "40"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("SWITCHYARD_CONTROL_SOCKET") && err.contains("work --exec"),
        "{err}"
    );
    let out = sb.run(&["progress", "140"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("0..=100"),
        "{}",
        text(&out.stderr)
    );
}
