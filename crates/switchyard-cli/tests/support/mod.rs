//! Shared helpers of the CLI tests: a sandbox directory with its own SQLite database,
//! and the `switchyard` binary run in it.
#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

pub struct Sandbox {
    pub dir: tempfile::TempDir,
    /// `Some(schema)` when the sandbox's queue lives in PostgreSQL.
    pub pg_schema: Option<String>,
    /// `Some(database)` when the sandbox's queue lives in MySQL/MariaDB.
    pub mysql_db: Option<String>,
    /// The sandbox's queues live in RabbitMQ (`QUEUE_BACKEND=rabbitmq`).
    pub rabbitmq: bool,
    /// More environment for every command, set last.
    pub env: Vec<(String, String)>,
}

/// The RabbitMQ broker of the tests: `SWITCHYARD_TEST_AMQP_URL`, by default the local one.
pub fn amqp_url() -> String {
    std::env::var("SWITCHYARD_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The MySQL server of the tests: `SWITCHYARD_TEST_MYSQL_URL`, by default the local one.
pub fn mysql_url() -> String {
    std::env::var("SWITCHYARD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The PostgreSQL server of the tests: `SWITCHYARD_TEST_PG_URL`, by default the local one.
pub fn pg_url() -> String {
    std::env::var("SWITCHYARD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Deletes a queue (and its dead-letter queue) a test made on the test broker.
#[cfg(feature = "amqp")]
pub fn delete_broker_queue(queue: &str) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let t = switchyard::AmqpTransport::connect(switchyard::AmqpOptions::new(amqp_url()))
                .await
                .expect("connect");
            let q = switchyard::QueueName::new(queue).expect("a queue name");
            t.delete_queue(&q).await.expect("delete the queue");
            t.close().await;
        });
}

impl Sandbox {
    /// A sandbox with its own SQLite database file.
    pub fn new() -> Self {
        Sandbox {
            dir: tempfile::tempdir().expect("a temporary directory"),
            pg_schema: None,
            mysql_db: None,
            rabbitmq: false,
            env: Vec::new(),
        }
    }

    /// A sandbox on the test RabbitMQ broker (its tests use fresh queue names), or
    /// `None` (having said why) when no broker is reachable outside CI.
    pub fn rabbitmq() -> Option<Self> {
        if let Some(why) =
            queue_core::conformance::skip_unless_reachable("RabbitMQ", &amqp_url(), 5672)
        {
            eprintln!("SKIPPED: {why}");
            return None;
        }
        let mut sb = Sandbox::new();
        sb.rabbitmq = true;
        Some(sb)
    }

    /// A sandbox with its own database on the test MySQL server, or `None` (having said
    /// why) when no server is reachable outside CI.
    pub fn mysql() -> Option<Self> {
        if let Some(why) =
            queue_core::conformance::skip_unless_reachable("MySQL/MariaDB", &mysql_url(), 3306)
        {
            eprintln!("SKIPPED: {why}");
            return None;
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Some(Sandbox {
            dir: tempfile::tempdir().expect("a temporary directory"),
            pg_schema: None,
            mysql_db: Some(format!("sy_test_{secs}_{:08x}", fastrand::u32(..))),
            rabbitmq: false,
            env: Vec::new(),
        })
    }

    /// A sandbox with its own schema in the test PostgreSQL database, or `None` (having
    /// said why) when no server is reachable outside CI.
    pub fn postgres() -> Option<Self> {
        if let Some(why) =
            queue_core::conformance::skip_unless_reachable("PostgreSQL", &pg_url(), 5432)
        {
            eprintln!("SKIPPED: {why}");
            return None;
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let schema = format!("sy_test_{secs}_{:08x}", fastrand::u32(..));
        Some(Sandbox {
            dir: tempfile::tempdir().expect("a temporary directory"),
            pg_schema: Some(schema),
            mysql_db: None,
            rabbitmq: false,
            env: Vec::new(),
        })
    }

    /// Sets `key` for every later command (replacing an earlier value).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// Unsets `key` for every later command.
    pub fn unset_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
    }

    pub fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("jobs.db")
    }

    /// The binary, run in the sandbox with a clean queue environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
        cmd.args(args).current_dir(self.dir.path());
        for var in [
            "QUEUE_BACKEND",
            "AMQP_URL",
            "QUEUE_CLAIM",
            "QUEUE_CANARY_PERCENT",
            "QUEUE_VISIBILITY_TIMEOUT",
            "QUEUE_TABLE",
            "QUEUE_SCHEMA",
            "QUEUE_DRAIN",
            "QUEUE_STATUS",
            "QUEUE_WATCH",
            "AMQP_QUEUE_TYPE",
            "SWITCHYARD_ADMIN_TOKEN",
            "SWITCHYARD_ALERT_WEBHOOK",
            // A tracing agent's settings must not reach the tests' commands.
            "OTEL_SDK_DISABLED",
            "OTEL_TRACES_EXPORTER",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_SERVICE_NAME",
            "OTEL_RESOURCE_ATTRIBUTES",
            "OTEL_TRACES_SAMPLER",
            "OTEL_TRACES_SAMPLER_ARG",
            "TRACEPARENT",
            "TRACESTATE",
        ] {
            cmd.env_remove(var);
        }
        match (&self.pg_schema, &self.mysql_db) {
            (Some(schema), _) => cmd
                .env("DATABASE_URL", pg_url())
                .env("QUEUE_SCHEMA", schema),
            (None, Some(db)) => cmd.env("DATABASE_URL", mysql_url()).env("QUEUE_SCHEMA", db),
            (None, None) => cmd.env("DATABASE_URL", format!("sqlite://{}", self.db().display())),
        };
        if self.rabbitmq {
            // RabbitMQ alone: no SQL store to drain.
            cmd.env("QUEUE_BACKEND", "rabbitmq")
                .env("AMQP_URL", amqp_url())
                .env("QUEUE_DRAIN", "none");
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run switchyard")
    }

    pub fn run_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn switchyard");
        let written = child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes());
        // A command that refuses its flags exits before it reads its input.
        if let Err(e) = written {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
        child.wait_with_output().expect("wait for switchyard")
    }

    pub fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .expect("read the sandbox")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    /// The `stats --json` counts of `queue` (zeros when it has none).
    pub fn stats(&self, queue: &str) -> serde_json::Value {
        let out = self.run(&["stats", "--json", "--queue", queue]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
        v["queues"]
            .as_array()
            .and_then(|qs| qs.iter().find(|q| q["queue"] == queue).cloned())
            .unwrap_or_else(
                || serde_json::json!({"ready": 0, "delayed": 0, "reserved": 0, "dead": 0}),
            )
    }

    pub fn ready(&self, queue: &str) -> u64 {
        self.stats(queue)["ready"].as_u64().unwrap_or(0)
    }

    /// The dead letters of `queue`, as `dead list --json` prints them.
    pub fn dead(&self, queue: &str) -> Vec<serde_json::Value> {
        let out = self.run(&[
            "dead", "list", "--json", "--queue", queue, "--limit", "1000",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("dead list JSON")
    }

    /// Publishes one message per payload line and returns the ids.
    pub fn publish_lines(&self, queue: &str, kind: &str, lines: &str) -> Vec<String> {
        let out = self.run_stdin(&["publish", "--queue", queue, "--kind", kind], lines);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(str::to_owned).collect()
    }

    /// The environment the sandbox's commands get (variables set, not removed).
    pub fn envs(&self) -> Vec<(String, String)> {
        self.cmd(&[])
            .get_envs()
            .filter_map(|(k, v)| {
                Some((
                    k.to_string_lossy().into_owned(),
                    v?.to_string_lossy().into_owned(),
                ))
            })
            .collect()
    }

    /// The queue configuration the sandbox's commands get, for opening the same store
    /// from the test itself.
    pub fn config(&self) -> switchyard::Config {
        let envs = self.envs();
        switchyard::Config::from_lookup(|name| {
            envs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .expect("the sandbox's configuration")
    }

    /// Starts `switchyard serve` on a free port; stopped when the guard drops.
    pub fn serve(&self) -> Served {
        self.serve_with(&[], Stdio::inherit())
    }

    /// `serve` with more flags, its stderr going to `stderr`.
    pub fn serve_with(&self, flags: &[&str], stderr: Stdio) -> Served {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(flags);
        let mut child = self
            .cmd(&args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn switchyard serve");
        let stdout = child.stdout.take().expect("serve's stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("serve's first line");
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://"))
            .unwrap_or_else(|| panic!("serve said {line:?}"))
            .trim_end_matches('/')
            .to_owned();
        Served { child, url }
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

/// A running `switchyard serve`, killed on drop.
pub struct Served {
    pub child: std::process::Child,
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `curl` of `url` with `args`: the HTTP status and the body.
pub fn curl(url: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl (scripts/test installs it)");
    assert!(out.status.success(), "curl {url}: {}", text(&out.stderr));
    let all = text(&out.stdout);
    let (body, code) = all.rsplit_once('\n').unwrap_or(("", &all));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A failed run: non-zero exit and exactly one line on stderr that contains `needles`.
pub fn assert_one_line_error(out: &Output, needles: &[&str]) {
    assert!(
        !out.status.success(),
        "expected a failure, got {:?}",
        out.status
    );
    let err = text(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
    for n in needles {
        assert!(err.contains(n), "{err:?} does not name {n:?}");
    }
    assert!(
        out.stdout.is_empty(),
        "printed on stdout: {}",
        text(&out.stdout)
    );
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // The transport-pg tests also drop test schemas left behind for over an hour.
        if let Some(db) = &self.mysql_db {
            let _ = Command::new("mariadb")
                .args(["--protocol=tcp", "-h", "127.0.0.1", "-uroot", "-e"])
                .arg(format!("DROP DATABASE IF EXISTS `{db}`"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(schema) = &self.pg_schema {
            let _ = Command::new("psql")
                .args([
                    &pg_url(),
                    "-qc",
                    &format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Worker processes a test started: stopped with SIGTERM by [`Workers::stop`], and
/// killed if the test ends first (a failed assertion must not leave them running).
pub struct Workers(pub Vec<std::process::Child>);

impl Workers {
    /// SIGCONT (a frozen one) then SIGTERM to each, and waits for them all.
    pub fn stop(mut self) {
        for w in &self.0 {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(w.id()).unwrap_or(0));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        for w in &mut self.0 {
            let _ = w.wait();
        }
        self.0.clear();
    }
}

impl std::ops::Deref for Workers {
    type Target = [std::process::Child];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}
