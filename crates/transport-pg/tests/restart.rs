//! PostgreSQL restarts in the middle of a drain: two workers drain 10,000 messages while
//! the server is restarted under them; they reconnect by themselves and every message
//! is handled, none lost.
//!
//! It runs against a throwaway server that the test creates itself (`initdb` into a
//! temporary directory, its own port and socket directory), so the restart cannot disturb
//! the rest of the suite.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queue_core::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use queue_core::{CancellationToken, Envelope, QueueName, Transport};
use transport_pg::{PgOptions, PgTransport};
use uuid::Uuid;

const MESSAGES: usize = 10_000;

/// The directory of `initdb` and `pg_ctl`: `SWITCHYARD_PG_BIN`, or the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout).
fn pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("SWITCHYARD_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A server of our own; stopped (immediately) when dropped.
struct Server {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// PostgreSQL refuses to run as root, so as root it runs as the `postgres` user.
    fn command(&self, program: &str) -> Command {
        command(&self.bin, program)
    }

    fn start() -> Self {
        let bin = pg_bin().expect("initdb: install postgresql or set SWITCHYARD_PG_BIN");
        let dir = tempfile::tempdir().expect("a temporary directory");
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown the server directory to postgres");
        }
        let data = dir.path().join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let server = Server {
            bin,
            data,
            port,
            _dir: dir,
        };
        run(server
            .command("initdb")
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&server.data));
        let socket_dir = server.data.parent().unwrap_or(Path::new("/tmp")).to_owned();
        run(server
            .command("pg_ctl")
            .arg("-D")
            .arg(&server.data)
            .arg("-l")
            .arg(server.data.join("server.log"))
            .arg("-o")
            .arg(format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1",
                socket_dir.display()
            ))
            .args(["-w", "start"]));
        server
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn command(bin: &Path, program: &str) -> Command {
    let path = bin.join(program);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

/// Runs a PostgreSQL tool to completion. Its output goes to a file, not a pipe: the
/// server that `pg_ctl` starts inherits the tool's descriptors and would hold a pipe open
/// for ever.
fn run(cmd: &mut Command) {
    let log = tempfile::NamedTempFile::new().expect("a log file");
    let status = cmd
        .stdin(Stdio::null())
        .stdout(log.reopen().expect("log"))
        .stderr(log.reopen().expect("log"))
        .status()
        .expect("run a PostgreSQL tool");
    assert!(
        status.success(),
        "{cmd:?} failed: {}",
        std::fs::read_to_string(log.path()).unwrap_or_default()
    );
}

#[test]
fn two_workers_drain_through_a_server_restart_and_lose_nothing() {
    if pg_bin().is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no initdb found (install postgresql); under CI=true this is a failure"
        );
        eprintln!("SKIPPED: PostgreSQL restart test: no initdb found (install postgresql)");
        return;
    }
    let server = Server::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let options = || {
            PgOptions::new(server.url())
                .with_visibility_timeout(Duration::from_secs(5))
                .with_acquire_timeout(Duration::from_secs(2))
        };
        let publisher = PgTransport::connect(options()).await.expect("connect");
        let q = QueueName::new("restart").expect("queue name");
        let envs: Vec<Envelope> = (0..MESSAGES)
            .map(|i| {
                Envelope::builder("restart", "job")
                    .payload(&serde_json::json!({ "n": i }))
                    .build()
                    .expect("envelope")
            })
            .collect();
        let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
        publisher.publish_batch(envs).await.expect("publish");

        let seen: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for _ in 0..2 {
            let t: Arc<dyn Transport> =
                Arc::new(PgTransport::connect(options()).await.expect("connect"));
            let record = seen.clone();
            // Slow enough (about 3,000 jobs/s for both) that the restart lands mid-drain.
            let worker = Worker::new(
                t,
                q.clone(),
                WorkerOptions::default()
                    .with_concurrency(8)
                    .with_poll(Duration::from_millis(20), Duration::from_millis(500)),
            )
            .handle_any(handler_fn(move |ctx: JobContext| {
                if let Ok(mut seen) = record.lock() {
                    *seen.entry(ctx.envelope.id).or_default() += 1;
                }
                async {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok(())
                }
            }));
            workers.push(tokio::spawn(worker.run(stop.clone())));
        }

        let handled = || seen.lock().map(|s| s.len()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while handled() < MESSAGES / 5 {
            assert!(Instant::now() < deadline, "the drain did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let at_restart = handled();
        let restart = tokio::task::spawn_blocking({
            let data = server.data.clone();
            let bin = server.bin.clone();
            move || {
                run(command(&bin, "pg_ctl")
                    .arg("-D")
                    .arg(&data)
                    .args(["-m", "fast", "-w", "restart"]))
            }
        });
        restart.await.expect("restart");
        assert!(
            at_restart < MESSAGES,
            "the drain finished before the restart"
        );
        eprintln!("restarted PostgreSQL after {at_restart} of {MESSAGES} messages");

        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = publisher
                .stats(Some(&q))
                .await
                .ok()
                .and_then(|s| s.into_iter().next())
                .map_or(0, |s| s.ready + s.delayed + s.reserved + s.dead);
            if handled() == MESSAGES && left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {MESSAGES} handled, {left} left 120 s after the restart",
                handled()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
        for w in workers {
            w.await.expect("worker task").expect("worker");
        }
        let seen = seen.lock().expect("seen").clone();
        let missing = ids.iter().filter(|id| !seen.contains_key(id)).count();
        let duplicates: u32 = seen.values().map(|n| n - 1).sum();
        assert_eq!(missing, 0, "messages lost across the restart");
        let dead = publisher.dead_list(Some(&q), 10).await.expect("dead list");
        assert!(dead.is_empty(), "messages dead-lettered: {dead:?}");
        eprintln!("all {MESSAGES} handled; {duplicates} handled twice (at-least-once)");
    });
    drop(server);
}
