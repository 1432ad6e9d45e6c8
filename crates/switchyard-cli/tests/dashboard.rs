//! The dashboard in a real browser: headless Chromium (Debian's `chromium`, driven by
//! `chromedriver`) against a live `switchyard serve` on PostgreSQL, through the script
//! `tests/browser/dashboard.py`. It sees the queue counts change as a worker runs and
//! the chart's axes, replays a dead letter with its button and three selected ones at
//! once, filters the job list by state, reads a job's payload and its failed attempts'
//! errors, sees a running worker listed and dropped once it stops, follows jobs live
//! over Server-Sent Events and measures how soon their completion reaches the page;
//! pauses and resumes a queue from the flow-control panel and cancels a running job
//! from its page.
//! Screenshots of each view go to `target/test-output/dashboard/`.
//!
//! `scripts/test` installs Chromium and ChromeDriver when they are missing; without
//! them the test is skipped outside CI and fails under `CI=true`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::Sandbox;

fn found(path: &str) -> bool {
    Path::new(path).exists()
}

fn output_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("test-output").join("dashboard")
}

#[test]
fn the_dashboard_shows_counts_replays_dead_letters_and_follows_jobs() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let driver = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    if !found(&chromium) || !found(&driver) {
        let why = format!("no {chromium} or {driver} (apt-get install chromium chromium-driver)");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "under CI=true the browser test must run: {why}"
        );
        eprintln!("SKIPPED: {why}");
        return;
    }
    let Some(mut sb) = Sandbox::postgres() else {
        return;
    };
    sb.set_env("SWITCHYARD_ADMIN_TOKEN", "browser-s3cret");
    assert!(sb.run(&["migrate"]).status.success());
    let out_dir = output_dir();
    let mut cmd = Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dashboard.py"))
        .current_dir(sb.dir.path())
        .envs(sb.envs())
        .env("SWITCHYARD_BIN", env!("CARGO_BIN_EXE_switchyard"))
        .env("OUT_DIR", &out_dir)
        .env("CHROMIUM", &chromium)
        .env("CHROMEDRIVER", &driver);
    let status = cmd
        .status()
        .expect("run python3 (scripts/test installs it)");
    assert!(status.success(), "the browser test failed: {status:?}");
    for shot in [
        "dashboard.png",
        "dashboard-dead-letter.png",
        "dead-letters-selected.png",
        "jobs-pending.png",
        "job-attempts.png",
        "workers.png",
        "flow-control.png",
        "job.png",
    ] {
        let len = std::fs::metadata(out_dir.join(shot)).map_or(0, |m| m.len());
        assert!(len > 1000, "{shot} is missing or empty");
    }
}
