//! The README's library example, built as a crate of its own (edition 2024) from the
//! README's `[dependencies]` lines and `main.rs`, exactly as a reader pastes them into
//! `cargo new`, then run: it publishes, works and records the status of three jobs.

use std::path::{Path, PathBuf};
use std::process::Command;

const README: &str = include_str!("../README.md");

/// The first fenced block opening with `fence` after `heading`.
fn block_after(heading: &str, fence: &str) -> String {
    let section = README
        .split_once(heading)
        .unwrap_or_else(|| panic!("the README has no {heading:?}"))
        .1;
    let start = section
        .find(fence)
        .unwrap_or_else(|| panic!("no {fence} block after {heading:?}"));
    let body = &section[start + fence.len()..];
    let body = body.split_once('\n').map_or("", |(_, rest)| rest);
    body.split_once("\n```")
        .unwrap_or_else(|| panic!("the {fence} block is not closed"))
        .0
        .to_owned()
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_readme_library_example_builds_as_its_own_crate_and_runs() {
    let deps = block_after("## Use it as a library", "```toml");
    let main = block_after("## Use it as a library", "```rust");
    assert!(deps.starts_with("[dependencies]"), "{deps}");
    assert!(
        !main.lines().any(|l| l.trim_start().starts_with("# ")),
        "rustdoc-only lines"
    );
    // The one change a reader of an unpublished crate makes: where switchyard comes from.
    let deps: String = deps
        .lines()
        .map(|line| match line.strip_prefix("switchyard = \"0.1\"") {
            Some(comment) => format!(
                "switchyard = {{ path = {:?} }}{comment}",
                workspace().display().to_string()
            ),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        deps.contains("path = "),
        "the README's switchyard line changed: {deps}"
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let krate = dir.path().join("readme-example");
    std::fs::create_dir_all(krate.join("src")).expect("src/");
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"readme-example\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n{deps}\n\n[workspace]\n"
        ),
    )
    .expect("Cargo.toml");
    std::fs::write(krate.join("src/main.rs"), &main).expect("main.rs");
    // The workspace's versions, so the build needs no network and no new downloads.
    std::fs::copy(workspace().join("Cargo.lock"), krate.join("Cargo.lock")).expect("Cargo.lock");

    // A target directory of its own (the workspace's may be locked by the test run),
    // kept between runs so that only the first build is slow.
    let target = target_dir().join("readme-example");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "the README's example does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).expect("a directory to run in");
    let mut cmd = Command::new(target.join("debug/readme-example"));
    cmd.current_dir(&run);
    for (var, _) in std::env::vars() {
        if var == "DATABASE_URL" || var.starts_with("QUEUE_") || var.starts_with("AMQP_") {
            cmd.env_remove(var);
        }
    }
    let out = cmd.output().expect("run the example");
    assert!(
        out.status.success(),
        "the README's example failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sent 3 invoices"
    );
    check_status(&run.join("switchyard.db"));
}

/// The example recorded its jobs: three completed with their results.
fn check_status(db: &Path) {
    let url = format!("sqlite://{}", db.display());
    let config = switchyard::Config::from_lookup(|v| (v == "DATABASE_URL").then(|| url.clone()))
        .expect("a configuration");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let opened = switchyard::connect_existing_jobs(&config)
                .await
                .expect("the example's store");
            let store = opened.store().expect("SQLite keeps status");
            let jobs = store.recent(10).await.expect("recent jobs");
            assert_eq!(jobs.len(), 3, "{jobs:?}");
            for job in jobs {
                assert_eq!(job.state, switchyard::JobState::Completed, "{job:?}");
                assert!(job.result.is_some_and(|r| r["sent_to"].is_u64()));
            }
        });
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}
