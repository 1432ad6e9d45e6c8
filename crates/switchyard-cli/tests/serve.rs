//! Job status through the binary: `publish --wait`, `prune`, and the admin server's
//! endpoints (`switchyard serve`): Prometheus metrics, the job event stream, and the
//! guards on replay and purge. On SQLite and, where it says so, PostgreSQL.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{curl, text, Sandbox};
use switchyard::status::{JobState, StatusUpdate};

/// Succeeds with `{"sum": a+b}` for kind `add`; kind `bad` fails with a message on
/// stderr.
const HANDLER: &str = r#"if [ "$SWITCHYARD_KIND" = bad ]; then echo "no such invoice" >&2; exit 3; fi; python3 -c 'import json,sys; p=json.load(sys.stdin)["payload"]; print(json.dumps({"sum": p[0]+p[1]}))'"#;

fn sandboxes() -> Vec<Sandbox> {
    let mut all = vec![Sandbox::new()];
    all.extend(Sandbox::postgres());
    all
}

fn worker(sb: &Sandbox, queue: &str) -> support::Served {
    let child = sb
        .cmd(&[
            "work",
            "--queue",
            queue,
            "--exec",
            HANDLER,
            "--max-attempts",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the worker");
    support::Served {
        child,
        url: String::new(),
    }
}

#[test]
fn publish_wait_prints_the_result_or_fails_or_times_out() {
    for sb in sandboxes() {
        assert!(sb.run(&["migrate"]).status.success());
        let _worker = worker(&sb, "calc");
        let out = sb.run(&[
            "publish",
            "--queue",
            "calc",
            "--kind",
            "add",
            "--payload",
            "[2,3]",
            "--wait",
            "20s",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let result: Value = serde_json::from_slice(&out.stdout).expect("the result as JSON");
        assert_eq!(result, json!({"sum": 5}));

        let out = sb.run(&[
            "publish",
            "--queue",
            "calc",
            "--kind",
            "add",
            "--payload",
            "[1,1]",
            "--wait",
            "20s",
            "--json",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(answer["state"], "completed");
        assert_eq!(answer["result"], json!({"sum": 2}));

        let out = sb.run(&[
            "publish",
            "--queue",
            "calc",
            "--kind",
            "bad",
            "--payload",
            "{}",
            "--wait",
            "20s",
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("ended dead") && err.contains("no such invoice"),
            "{err}"
        );

        // Nobody works this queue.
        let started = Instant::now();
        let out = sb.run(&[
            "publish",
            "--queue",
            "idle",
            "--kind",
            "add",
            "--payload",
            "[1,2]",
            "--wait",
            "500ms",
        ]);
        assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
        assert!(started.elapsed() >= Duration::from_millis(500));
        let err = text(&out.stderr);
        assert!(
            err.contains("no answer") && err.contains("pending"),
            "{err}"
        );

        // Stdin lines and --wait do not mix.
        let out = sb.run_stdin(
            &[
                "publish", "--queue", "calc", "--kind", "add", "--wait", "1s",
            ],
            "[1,2]\n",
        );
        support::assert_one_line_error(&out, &["--wait applies to one message"]);
    }
}

/// Reads Server-Sent Events from `curl -N` until the server ends the stream: each
/// `status` event's data, with when it arrived.
fn follow(url: &str) -> std::process::Child {
    Command::new("curl")
        .args(["-sSN", "--max-time", "60", url])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run curl")
}

fn events(child: std::process::Child) -> (Vec<(Option<String>, Value)>, std::process::ExitStatus) {
    let mut child = child;
    let stdout = child.stdout.take().expect("curl's stdout");
    let mut seen = Vec::new();
    let (mut event, mut id) = (None, None);
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        if let Some(e) = line.strip_prefix("event:") {
            event = Some(e.trim().to_owned());
        } else if let Some(i) = line.strip_prefix("id:") {
            id = Some(i.trim().to_owned());
        } else if let Some(d) = line.strip_prefix("data:") {
            assert_eq!(event.as_deref(), Some("status"), "an unexpected event");
            seen.push((
                id.take(),
                serde_json::from_str(d.trim()).expect("JSON data"),
            ));
            event = None;
        }
    }
    (seen, child.wait().expect("curl exits"))
}

#[test]
fn job_events_stream_each_change_in_order_and_end_at_the_final_state() {
    for sb in sandboxes() {
        assert!(sb.run(&["migrate"]).status.success());
        let served = sb.serve();
        let id = sb.publish_lines("reports", "render", "{}\n").remove(0);
        let envelope = switchyard::Envelope::builder("reports", "render")
            .id(id.parse().expect("a UUID"))
            .build()
            .expect("an envelope");
        let stream = follow(&format!("{}/api/jobs/{id}/events", served.url));
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        rt.block_on(async {
            let jobs = switchyard::connect_existing_jobs(&sb.config())
                .await
                .expect("the sandbox's store");
            let store = jobs.store().expect("a status store");
            let steps = [
                StatusUpdate::running(&envelope, 1),
                StatusUpdate::progress(&envelope, 1, 30, Some("pages".into())),
                StatusUpdate::progress(&envelope, 1, 80, Some("charts".into())),
                StatusUpdate::completed(&envelope, 1, Some(json!({"pages": 4}))),
            ];
            for step in steps {
                tokio::time::sleep(Duration::from_millis(400)).await;
                store.record(&[step]).await.expect("a status write");
            }
        });
        let waited = Instant::now();
        let (seen, exit) = events(stream);
        assert!(
            exit.success(),
            "the stream was cut, not ended by the server: {exit:?}"
        );
        assert!(waited.elapsed() < Duration::from_secs(30));
        let steps: Vec<(String, u64, Option<String>)> = seen
            .iter()
            .map(|(_, s)| {
                (
                    s["state"].as_str().unwrap_or_default().to_owned(),
                    s["progress"].as_u64().unwrap_or(999),
                    s["progress_message"].as_str().map(str::to_owned),
                )
            })
            .collect();
        assert_eq!(
            steps,
            vec![
                ("pending".into(), 0, None),
                ("running".into(), 0, None),
                ("running".into(), 30, Some("pages".into())),
                ("running".into(), 80, Some("charts".into())),
                ("completed".into(), 100, None),
            ]
        );
        let versions: Vec<u64> = seen
            .iter()
            .filter_map(|(_, s)| s["version"].as_u64())
            .collect();
        assert_eq!(versions, vec![1, 2, 3, 4, 5]);
        let ids: Vec<String> = seen.iter().filter_map(|(i, _)| i.clone()).collect();
        assert_eq!(
            ids,
            vec!["1", "2", "3", "4", "5"],
            "SSE ids are the versions"
        );
        assert_eq!(seen[4].1["result"], json!({"pages": 4}));

        // A job already final: one event, then the end.
        let (seen, exit) = events(follow(&format!("{}/api/jobs/{id}/events", served.url)));
        assert!(exit.success());
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1["state"], JobState::Completed.as_str());

        let (code, body) = curl(&format!("{}/api/jobs/{id}", served.url), &[]);
        assert_eq!(code, 200, "{body}");
        let unknown = uuid::Uuid::new_v4();
        let (code, body) = curl(&format!("{}/api/jobs/{unknown}/events", served.url), &[]);
        assert_eq!(code, 404, "{body}");
        let (code, body) = curl(&format!("{}/api/jobs/not-a-uuid", served.url), &[]);
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("expected a UUID"), "{body}");
    }
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let sb = Sandbox::new();
    assert!(sb.run(&["migrate"]).status.success());
    sb.publish_lines("calc", "add", "[1,2]\n[3,4]\n");
    sb.publish_lines("calc", "bad", "{}\n");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address").port()
    };
    let listen = format!("127.0.0.1:{port}");
    let out = sb.run(&[
        "work",
        "--queue",
        "calc",
        "--exec",
        HANDLER,
        "--max-attempts",
        "1",
        "--drain",
        "--metrics-listen",
        &listen,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The worker's metrics end with it: run one that stays, on an empty queue.
    sb.publish_lines("calc", "add", "[5,6]\n");
    let mut stays = sb
        .cmd(&[
            "work",
            "--queue",
            "calc",
            "--exec",
            HANDLER,
            "--metrics-listen",
            &listen,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the worker");
    let url = format!("http://{listen}/metrics");
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let out = Command::new("curl")
            .args(["-sf", &url])
            .output()
            .expect("curl");
        let body = text(&out.stdout);
        if body.contains("switchyard_acked_total") || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = stays.kill();
    let _ = stays.wait();
    let worker = parse(&body);
    let acked = sample(
        &worker,
        "switchyard_acked_total",
        &[("queue", "calc"), ("kind", "add")],
    );
    assert_eq!(acked, Some(1.0), "{body}");
    assert!(sample(&worker, "switchyard_reserved_total", &[("queue", "calc")]).is_some());
    assert!(
        worker
            .samples
            .iter()
            .any(|s| s.metric == "switchyard_handler_duration_seconds"
                && matches!(s.value, prometheus_parse::Value::Histogram(_))),
        "no handler duration histogram in {body}"
    );

    let served = sb.serve();
    let (code, body) = curl(&format!("{}/metrics", served.url), &[]);
    assert_eq!(code, 200);
    let server = parse(&body);
    let depth = |state: &str| {
        sample(
            &server,
            "switchyard_queue_depth",
            &[("queue", "calc"), ("state", state)],
        )
    };
    assert_eq!(depth("dead"), Some(1.0), "{body}");
    assert_eq!(depth("ready"), Some(0.0), "{body}");
    assert_eq!(
        server
            .docs
            .get("switchyard_queue_depth")
            .map(String::as_str),
        Some("Messages per queue and state.")
    );
    let (code, body) = curl(&format!("{}/healthz", served.url), &[]);
    assert_eq!((code, body.contains("\"ok\"")), (200, true), "{body}");
}

fn parse(body: &str) -> prometheus_parse::Scrape {
    // The exposition format's HELP and TYPE lines come first for each family; every
    // other line is a sample `name{labels} value`.
    for line in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line: series value");
        assert!(value.parse::<f64>().is_ok() || value == "+Inf", "{line}");
        assert!(
            series
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_'),
            "{line}"
        );
    }
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
        .expect("the Prometheus text exposition format")
}

fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        })
}

#[test]
fn replay_and_purge_need_the_token_and_refuse_cross_site_requests() {
    let mut sb = Sandbox::new();
    sb.set_env("SWITCHYARD_ADMIN_TOKEN", "s3cret");
    assert!(sb.run(&["migrate"]).status.success());
    sb.publish_lines("calc", "bad", "{}\n");
    let out = sb.run(&[
        "work",
        "--queue",
        "calc",
        "--exec",
        HANDLER,
        "--max-attempts",
        "1",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let served = sb.serve();
    let replay = format!("{}/api/dead/replay", served.url);
    let post = |body: &str, extra: &[&str]| {
        let mut args = vec![
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ];
        args.extend_from_slice(extra);
        curl(&replay, &args)
    };
    let all = r#"{"all":true}"#;
    let token = ["-H", "Authorization: Bearer s3cret"];
    let (code, body) = post(all, &[]);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("SWITCHYARD_ADMIN_TOKEN"), "{body}");
    assert_eq!(post(all, &["-H", "Authorization: Bearer wrong"]).0, 401);
    let (code, body) = post(
        all,
        &[token[0], token[1], "-H", "Sec-Fetch-Site: cross-site"],
    );
    assert_eq!(code, 403, "{body}");
    let (code, body) = post(
        all,
        &[token[0], token[1], "-H", "Origin: http://evil.example"],
    );
    assert_eq!(code, 403, "{body}");
    // A page whose name was rebound to 127.0.0.1 names its own host.
    let (code, body) = post(all, &[token[0], token[1], "-H", "Host: evil.example:8080"]);
    assert_eq!(code, 421, "{body}");
    let (code, _) = curl(
        &format!("{}/api/dead", served.url),
        &["-H", "Host: evil.example:8080"],
    );
    assert_eq!(code, 421, "reads are refused too");
    // A form post (what another site can send without asking) is not JSON.
    let (code, _) = curl(
        &replay,
        &["-X", "POST", token[0], token[1], "-d", "all=true"],
    );
    assert_eq!(code, 415);
    let (code, body) = post(r#"{"all":true,"x":1}"#, &token);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("unknown field"), "{body}");
    let (code, body) = post(r#"{"id":"a","all":true}"#, &token);
    assert_eq!(code, 400, "{body}");
    // What the dashboard itself sends: same origin, with the token.
    let origin = format!("Origin: {}", served.url);
    let (code, body) = post(
        all,
        &[
            token[0],
            token[1],
            "-H",
            &origin,
            "-H",
            "Sec-Fetch-Site: same-origin",
        ],
    );
    assert_eq!((code, body.as_str()), (200, r#"{"replayed":1}"#));
    // Reads need no token.
    let (code, body) = curl(&format!("{}/api/stats", served.url), &[]);
    assert_eq!(code, 200);
    let stats: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(stats["token_required"], true);
    assert_eq!(stats["queues"][0]["ready"], 1);
    let (code, body) = curl(&format!("{}/", served.url), &["-i"]);
    assert_eq!(code, 200);
    assert!(body.contains("frame-ancestors 'none'") && body.contains("<title>Switchyard"));
}

#[test]
fn prune_removes_old_results_and_dead_letters_only() {
    let sb = Sandbox::new();
    assert!(sb.run(&["migrate"]).status.success());
    sb.publish_lines("calc", "add", "[1,2]\n");
    sb.publish_lines("calc", "bad", "{}\n");
    let out = sb.run(&[
        "work",
        "--queue",
        "calc",
        "--exec",
        HANDLER,
        "--max-attempts",
        "1",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pending = sb.publish_lines("calc", "add", "[3,4]\n").remove(0);
    let prune = |age: &str| -> Value {
        let out = sb.run(&["prune", "--older-than", age, "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let kept = prune("1h");
    assert_eq!(
        (kept["results"].as_u64(), kept["dead_letters"].as_u64()),
        (Some(0), Some(0))
    );
    std::thread::sleep(Duration::from_millis(1100));
    let pruned = prune("1s");
    assert_eq!(
        (pruned["results"].as_u64(), pruned["dead_letters"].as_u64()),
        (Some(2), Some(1)),
        "{pruned}"
    );
    assert!(sb.dead("calc").is_empty());
    // The unfinished job is still recorded and still queued.
    let served = sb.serve();
    let (code, body) = curl(&format!("{}/api/jobs/{pending}", served.url), &[]);
    assert_eq!(code, 200, "{body}");
    assert_eq!(sb.ready("calc"), 1);
    let out = sb.run(&["prune", "--older-than", "soon"]);
    support::assert_one_line_error(&out, &["--older-than", "30d"]);

    // The worker's own pruning: at its start, then hourly.
    sb.publish_lines("later", "bad", "{}\n");
    let out = sb.run(&[
        "work",
        "--queue",
        "later",
        "--exec",
        HANDLER,
        "--max-attempts",
        "1",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sb.dead("later").len(), 1);
    std::thread::sleep(Duration::from_millis(1100));
    let out = sb.run(&[
        "work",
        "--queue",
        "other",
        "--exec",
        "true",
        "--drain",
        "--prune-older-than",
        "1s",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(sb.dead("later").is_empty(), "the worker did not prune");
    let (code, _) = curl(&format!("{}/api/jobs/{pending}", served.url), &[]);
    assert_eq!(code, 200, "an unfinished job was pruned");
}
