//! Tenants end to end, on every backend: two tenants with the same queue names, one
//! `work` process serving both and a second serving only the first. Nothing of one
//! tenant (jobs, status, dead letters, stats, metrics, the dashboard) shows through the
//! other; and a 10,000-job backlog in one tenant does not hold up the other's jobs.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{curl, text, Sandbox};

/// Two tenants of one backend, and what removes their stores afterwards.
struct Tenants {
    sb: Sandbox,
    a: String,
    b: String,
    cleanup: Vec<Command>,
}

impl Drop for Tenants {
    fn drop(&mut self) {
        for cmd in &mut self.cleanup {
            let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

impl Tenants {
    fn sqlite() -> Self {
        let mut sb = Sandbox::new();
        let url = format!("sqlite://{}/{{tenant}}.db", sb.dir.path().display());
        sb.set_env("DATABASE_URL", &url);
        Tenants {
            sb,
            a: "ta".into(),
            b: "tb".into(),
            cleanup: Vec::new(),
        }
    }

    fn postgres() -> Option<Self> {
        let sb = Sandbox::postgres()?;
        let base = sb.pg_schema.clone().expect("a schema");
        let (a, b) = (format!("{base}_a"), format!("{base}_b"));
        let drop = |s: &str| {
            let mut c = Command::new("psql");
            c.args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"])
                .arg(format!("DROP SCHEMA IF EXISTS \"{s}\" CASCADE"));
            c
        };
        let cleanup = vec![drop(&a), drop(&b)];
        Some(Tenants { sb, a, b, cleanup })
    }

    fn mysql() -> Option<Self> {
        let sb = Sandbox::mysql()?;
        let base = sb.mysql_db.clone().expect("a database");
        let (a, b) = (format!("{base}_a"), format!("{base}_b"));
        let drop = |d: &str| {
            let mut c = Command::new("mariadb");
            c.args(["--protocol=tcp", "-h", "127.0.0.1", "-uroot", "-e"])
                .arg(format!("DROP DATABASE IF EXISTS `{d}`"));
            c
        };
        let cleanup = vec![drop(&a), drop(&b)];
        Some(Tenants { sb, a, b, cleanup })
    }

    /// Two vhosts of the test broker; the status of each tenant in a SQLite file.
    fn rabbitmq() -> Option<Self> {
        let mut sb = Sandbox::rabbitmq()?;
        let base = format!("sy_t_{:08x}", fastrand::u32(..));
        let (a, b) = (format!("{base}_a"), format!("{base}_b"));
        let mut cleanup = Vec::new();
        for vhost in [&a, &b] {
            rabbitmqctl(&["add_vhost", vhost]);
            rabbitmqctl(&["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]);
            let mut c = Command::new("rabbitmqctl");
            c.args(["-q", "delete_vhost", vhost]);
            cleanup.push(c);
        }
        let url = support::amqp_url();
        let (root, _vhost) = url.rsplit_once('/').expect("AMQP_URL has a vhost");
        sb.set_env("AMQP_URL", &format!("{root}/{{tenant}}"));
        let db = format!("sqlite://{}/{{tenant}}.db", sb.dir.path().display());
        sb.set_env("DATABASE_URL", &db);
        Some(Tenants { sb, a, b, cleanup })
    }

    /// `switchyard --schema TENANTS ARGS…`.
    fn cmd(&self, tenants: &str, args: &[&str]) -> Command {
        let mut all = vec!["--schema", tenants];
        all.extend_from_slice(args);
        self.sb.cmd(&all)
    }

    fn ok(&self, tenants: &str, args: &[&str]) -> String {
        let out = self.cmd(tenants, args).output().expect("run switchyard");
        assert!(
            out.status.success(),
            "--schema {tenants} {args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    fn json(&self, tenants: &str, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(tenants, &all)).expect("JSON output")
    }

    /// Publishes `n` messages of `kind` to `tenant`'s queue `jobs`; their ids.
    fn publish(&self, tenant: &str, kind: &str, n: usize) -> Vec<String> {
        let mut child = self
            .cmd(tenant, &["publish", "--queue", "jobs", "--kind", kind])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn publish");
        let lines = "{}\n".repeat(n);
        let mut stdin = child.stdin.take().expect("stdin");
        let feed = std::thread::spawn(move || {
            use std::io::Write;
            stdin
                .write_all(lines.as_bytes())
                .expect("write the payloads");
        });
        let out = child.wait_with_output().expect("publish");
        feed.join().expect("the payloads were written");
        assert!(out.status.success(), "publish: {}", text(&out.stderr));
        let ids: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
        assert_eq!(ids.len(), n);
        ids
    }

    fn ready(&self, tenant: &str) -> u64 {
        let stats = self.json(tenant, &["stats", "--queue", "jobs"]);
        stats["queues"]
            .as_array()
            .and_then(|qs| qs.iter().find(|q| q["queue"] == "jobs"))
            .and_then(|q| q["ready"].as_u64())
            .unwrap_or(0)
    }
}

fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .expect("run rabbitmqctl (the test script installs RabbitMQ)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        text(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// What every job of the isolation run writes: tenant, worker, id; `fail` jobs fail.
const LOG_JOB: &str = "case \"$SWITCHYARD_KIND\" in fail) exit 3;; esac; sleep 0.1; \
     echo \"$SWITCHYARD_TENANT $WORKER $SWITCHYARD_MESSAGE_ID\" >> handled.log";

fn isolation(t: &Tenants) {
    let (a, b) = (t.a.as_str(), t.b.as_str());
    let both = format!("{a},{b}");
    let ids_a: BTreeSet<String> = t.publish(a, "ok", 40).into_iter().collect();
    let ids_b: BTreeSet<String> = t.publish(b, "ok", 40).into_iter().collect();
    // Different counts per tenant, so that one read through the other would show.
    let fails_a = t.publish(a, "fail", 2);
    let fail_b = t.publish(b, "fail", 1).remove(0);

    // One process serving both tenants, another serving only a, at once.
    let work = |tenants: &str, name: &str| -> Child {
        t.cmd(
            tenants,
            &[
                "work",
                "--queue",
                "jobs",
                "--exec",
                LOG_JOB,
                "--max-attempts",
                "1",
                "--drain",
            ],
        )
        .env("WORKER", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker")
    };
    // The worker of a alone first (a broker hands a queue's backlog to the consumer
    // that comes first), then the one of both as soon as a's jobs run.
    let w_a = work(a, "only-a");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(t.sb.path("handled.log")).is_ok_and(|l| !l.is_empty()) {
        assert!(Instant::now() < deadline, "the worker of a ran nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    let w_both = work(&both, "both");
    for w in [w_both, w_a] {
        let out = w.wait_with_output().expect("the worker ran");
        assert!(out.status.success(), "worker: {}", text(&out.stderr));
    }
    let log = std::fs::read_to_string(t.sb.path("handled.log")).expect("the handlers' log");
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut only_a = 0;
    for line in log.lines() {
        let mut parts = line.split(' ');
        let (tenant, worker, id) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let published = if tenant == a { &ids_a } else { &ids_b };
        assert!(
            tenant == a || tenant == b,
            "SWITCHYARD_TENANT was {tenant:?}: {line}"
        );
        assert!(
            published.contains(id),
            "job {id} ran as tenant {tenant} but was not published there"
        );
        if worker == "only-a" {
            assert_eq!(tenant, a, "the worker of tenant a ran a job of {tenant}");
            only_a += 1;
        }
        seen.entry(tenant.to_owned())
            .or_default()
            .insert(id.to_owned());
    }
    assert_eq!(seen.get(a), Some(&ids_a), "every job of a ran as a");
    assert_eq!(seen.get(b), Some(&ids_b), "every job of b ran as b");
    eprintln!("isolation: the worker of a alone ran {only_a} of a's 40 jobs");

    // Status: a job of one tenant is unknown to the other.
    let some_a = ids_a.iter().next().expect("a job of a");
    let status = t.json(a, &["job", some_a]);
    assert_eq!(status["status"]["state"], "completed", "{status}");
    let out = t.cmd(b, &["job", some_a]).output().expect("job");
    // (RabbitMQ cannot search its queues for an id: it refuses rather than says "no job".)
    assert!(
        !out.status.success() && !text(&out.stdout).contains("completed"),
        "tenant b must not know a's job: {} {}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // Dead letters: each tenant's own, and each row says whose.
    for (tenant, fails) in [(a, fails_a.clone()), (b, vec![fail_b.clone()])] {
        let dead = t.json(tenant, &["dead", "list", "--queue", "jobs"]);
        let mut ids: Vec<String> = dead
            .as_array()
            .expect("a list")
            .iter()
            .map(|d| d["id"].as_str().unwrap_or_default().to_owned())
            .collect();
        ids.sort();
        let mut fails = fails;
        fails.sort();
        assert_eq!(ids, fails, "dead letters of {tenant}");
        assert_eq!(dead[0]["tenant"], tenant);
    }
    let lines = t.ok(&both, &["dead", "list", "--queue", "jobs", "--json"]);
    assert_eq!(lines.lines().count(), 2, "one line per tenant: {lines}");

    // Stats: each tenant counts its own dead letters only.
    for (tenant, dead) in [(a, 2), (b, 1)] {
        let stats = t.json(tenant, &["stats", "--queue", "jobs"]);
        assert_eq!(stats["tenant"], tenant);
        assert_eq!(stats["queues"][0]["dead"], dead, "{stats}");
        assert_eq!(stats["queues"][0]["ready"], 0, "{stats}");
    }

    // The dashboard and metrics of b show nothing of a.
    let served = t.sb.serve_with(&["--schema", b], Stdio::null());
    for path in [
        "/api/jobs?limit=500",
        "/api/dead?queue=jobs",
        "/api/stats?queue=jobs",
        "/metrics",
    ] {
        let (code, body) = curl(&format!("{}{path}", served.url), &[]);
        assert_eq!(code, 200, "{path}: {body}");
        for id in ids_a.iter().chain(&fails_a) {
            assert!(!body.contains(id.as_str()), "{path} of b shows a's {id}");
        }
        assert!(!body.contains(&format!("tenant=\"{a}\"")), "{path}: {body}");
    }
    let (_, jobs) = curl(&format!("{}/api/jobs?limit=500", served.url), &[]);
    assert!(
        jobs.contains(&fail_b),
        "b's dashboard lists b's jobs: {jobs}"
    );
    let (_, metrics) = curl(&format!("{}/metrics", served.url), &[]);
    assert!(
        metrics.contains(&format!("tenant=\"{b}\"")),
        "b's metrics are labelled: {metrics}"
    );
    drop(served);

    // One worker process over both: each gauge says its tenant.
    let port = free_port();
    let mut worker = t
        .cmd(
            &both,
            &[
                "work",
                "--queue",
                "jobs",
                "--exec",
                "true",
                "--metrics-listen",
                &format!("127.0.0.1:{port}"),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker");
    let dead_gauge = |metrics: &str, tenant: &str| -> Option<String> {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("switchyard_queue_depth")
                    && l.contains(&format!("tenant=\"{tenant}\""))
                    && l.contains("state=\"dead\"")
            })
            .map(str::to_owned)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{port}/metrics"))
            .output()
            .expect("curl");
        let body = text(&out.stdout);
        // Each tenant's gauges appear once its worker has opened its store.
        if [a, b].iter().all(|t| dead_gauge(&body, t).is_some()) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no gauges of both tenants: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = worker.kill();
    let _ = worker.wait();
    for (tenant, n) in [(a, " 2"), (b, " 1")] {
        let dead = dead_gauge(&metrics, tenant).unwrap_or_default();
        assert!(dead.ends_with(n), "{dead}");
    }
}

#[test]
fn sqlite_tenants_are_isolated() {
    isolation(&Tenants::sqlite());
}

#[test]
fn postgres_tenants_are_isolated() {
    if let Some(t) = Tenants::postgres() {
        isolation(&t);
    }
}

#[test]
fn mysql_tenants_are_isolated() {
    if let Some(t) = Tenants::mysql() {
        isolation(&t);
    }
}

#[test]
fn rabbitmq_tenants_are_isolated() {
    if let Some(t) = Tenants::rabbitmq() {
        isolation(&t);
    }
}

/// The milliseconds of a UUIDv7: when the message was made.
fn made_at_ms(id: &str) -> u64 {
    let hex: String = id
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    u64::from_str_radix(&hex, 16).expect("a UUIDv7")
}

/// Publishes one job to `tenant` and waits for its start in `b.log`: milliseconds from
/// the message's making to its handler's start.
fn pickup_ms(t: &Tenants, tenant: &str) -> u64 {
    let id = t.publish(tenant, "probe", 1).remove(0);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = std::fs::read_to_string(t.sb.path("b.log")).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.ends_with(&id)) {
            let started_ns: u64 = line
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a start time");
            return (started_ns / 1_000_000).saturating_sub(made_at_ms(&id));
        }
        assert!(
            Instant::now() < deadline,
            "job {id} of {tenant} never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// b's jobs start within a few polls while a has 10,000 waiting: measured, and b is
/// done long before a's backlog is.
fn fairness(t: &Tenants, backend: &str) {
    let (a, b) = (t.a.as_str(), t.b.as_str());
    // Probes (kind probe) log their start; a's bulk jobs do nothing.
    // a's jobs take 20 ms each, so that its backlog outlasts the probes on any machine.
    let exec = "if [ \"$SWITCHYARD_KIND\" = probe ]; then echo \"$(date +%s%N) $SWITCHYARD_MESSAGE_ID\" >> b.log; else sleep 0.02; fi";
    // Both stores exist before the worker looks for them.
    t.publish(a, "probe", 1);
    t.publish(b, "probe", 1);
    let mut worker = t
        .cmd(
            &format!("{a},{b}"),
            &["work", "--queue", "jobs", "--exec", exec],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the worker");
    let idle: Vec<u64> = (0..5).map(|_| pickup_ms(t, b)).collect();
    t.publish(a, "bulk", 10_000);
    let deadline = Instant::now() + Duration::from_secs(60);
    while t.ready(a) >= 10_000 {
        assert!(Instant::now() < deadline, "a's backlog is not being worked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy: Vec<u64> = (0..10).map(|_| pickup_ms(t, b)).collect();
    let left = t.ready(a);
    let _ = nix_term(&worker);
    let status = worker.wait().expect("the worker ends");
    assert!(status.success(), "the worker stopped badly: {status}");
    eprintln!(
        "fairness on {backend}: tenant b's pickup, median {} ms (max {}) with tenant a idle, \
         median {} ms (max {}) with a's 10,000-job backlog being drained; a still had {left} ready; \
         the worker polls every 20 ms to 1 s",
        median(idle.clone()),
        idle.iter().max().copied().unwrap_or(0),
        median(busy.clone()),
        busy.iter().max().copied().unwrap_or(0),
    );
    assert!(
        left > 0,
        "b's jobs waited until a's backlog was gone: they must not queue behind it"
    );
}

fn nix_term(child: &Child) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
}

#[test]
fn sqlite_a_backlog_does_not_hold_up_another_tenant() {
    fairness(&Tenants::sqlite(), "SQLite");
}

#[test]
fn postgres_a_backlog_does_not_hold_up_another_tenant() {
    if let Some(t) = Tenants::postgres() {
        fairness(&t, "PostgreSQL");
    }
}

#[test]
fn mysql_a_backlog_does_not_hold_up_another_tenant() {
    if let Some(t) = Tenants::mysql() {
        fairness(&t, "MariaDB");
    }
}

#[test]
fn rabbitmq_a_backlog_does_not_hold_up_another_tenant() {
    if let Some(t) = Tenants::rabbitmq() {
        fairness(&t, "RabbitMQ");
    }
}

/// A pattern serves the tenants whose stores exist, skips a file that fits the pattern
/// but holds no store, and finds a tenant added while it runs.
#[test]
fn a_pattern_finds_tenants_and_new_ones_while_running() {
    let t = Tenants::sqlite();
    t.publish("ta", "ok", 1);
    t.publish("tb", "ok", 1);
    // Fits `t*`, holds no store: another application's file.
    std::fs::write(t.sb.path("tz.db"), b"").expect("a stray file");
    let stats = t.ok("t*", &["stats", "--json"]);
    let tenants: Vec<String> = stats
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON")["tenant"].to_string())
        .collect();
    assert_eq!(tenants, ["\"ta\"", "\"tb\""], "{stats}");
    let worker = t
        .cmd(
            "t*",
            &[
                "work",
                "--queue",
                "jobs",
                "--tenant-rescan",
                "200ms",
                "--exec",
                "echo \"$SWITCHYARD_TENANT\" >> handled.log",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker");
    let handled = || std::fs::read_to_string(t.sb.path("handled.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while handled().lines().count() < 2 {
        assert!(
            Instant::now() < deadline,
            "ta and tb not served: {}",
            handled()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A tenant onboarded while the worker runs.
    t.publish("tc", "ok", 1);
    while !handled().lines().any(|l| l == "tc") {
        assert!(Instant::now() < deadline, "tc not found: {}", handled());
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = nix_term(&worker);
    let out = worker.wait_with_output().expect("the worker ends");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut seen: Vec<String> = handled().lines().map(str::to_owned).collect();
    seen.sort();
    assert_eq!(seen, ["ta", "tb", "tc"]);
    let stray = std::fs::metadata(t.sb.path("tz.db")).expect("the stray file");
    assert_eq!(stray.len(), 0, "the stray file was made a store");
}

/// Commands that act on one store refuse several tenants, naming the setting; and a
/// `{tenant}` outside a URL's path is refused before anything connects.
#[test]
fn one_store_commands_refuse_several_tenants() {
    let t = Tenants::sqlite();
    t.publish("ta", "ok", 1);
    for args in [
        &[
            "publish",
            "--queue",
            "jobs",
            "--kind",
            "k",
            "--payload",
            "{}",
        ][..],
        &["job", "00000000-0000-0000-0000-000000000000"],
        &["dead", "purge", "--all"],
        &["migrate"],
        &["serve", "--listen", "127.0.0.1:0"],
        &[
            "move", "--queue", "jobs", "--from", "exec", "--to", "rabbitmq",
        ],
        &["relay", "--queue", "jobs", "--drain"],
    ] {
        let out = t.cmd("ta,tb", args).output().expect("run");
        support::assert_one_line_error(&out, &["QUEUE_SCHEMA", "one tenant"]);
    }
    let mut sb = Sandbox::new();
    sb.set_env("DATABASE_URL", "sqlite://jobs.db?cache={tenant}");
    let out = sb.run(&["--schema", "ta,tb", "stats"]);
    support::assert_one_line_error(&out, &["DATABASE_URL", "only in the URL's path"]);
}
