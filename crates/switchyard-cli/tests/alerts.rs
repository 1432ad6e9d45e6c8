//! `serve --alert-webhook`: a job that fails on purpose, past the threshold, makes
//! `serve` post to a local webhook exactly once, and once more when the rate falls; the
//! webhook's URL (a secret) never appears in its logs; bad settings are refused.

mod support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{assert_one_line_error, Sandbox};

/// A webhook receiver on a free port: every request's body, in order.
fn receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let port = listener.local_addr().expect("its address").port();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    let receive = move |body: String| {
        if let Ok(mut seen) = seen.lock() {
            seen.push(body);
        }
        std::future::ready("ok")
    };
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the receiver's runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("the listener");
            let routes = axum::Router::new().route("/{*path}", axum::routing::post(receive));
            let _ = axum::serve(listener, routes).await;
        });
    });
    (
        format!("http://127.0.0.1:{port}/services/T000/B000/SECRETTOKEN"),
        bodies,
    )
}

fn posts(bodies: &Mutex<Vec<String>>) -> Vec<String> {
    bodies.lock().map(|b| b.clone()).unwrap_or_default()
}

/// Waits up to 20 s for `n` posts.
fn wait_for(bodies: &Mutex<Vec<String>>, n: usize) -> Vec<String> {
    let started = Instant::now();
    while posts(bodies).len() < n && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    posts(bodies)
}

fn work(sandbox: &Sandbox, queue: &str, exec: &str) {
    let out = sandbox.run(&[
        "work",
        "--queue",
        queue,
        "--exec",
        exec,
        "--max-attempts",
        "1",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
}

#[test]
fn a_failing_job_alerts_once_and_resolves_once() {
    alert_cycle(Sandbox::new(), "alerts.q");
}

/// On RabbitMQ the failure rate comes from the control store (`DATABASE_URL`).
#[test]
fn a_failing_job_alerts_once_and_resolves_once_on_rabbitmq() {
    let Some(sandbox) = Sandbox::rabbitmq() else {
        return;
    };
    let queue = format!("alerts.{}", uuid::Uuid::new_v4().simple());
    alert_cycle(sandbox, &queue);
    support::delete_broker_queue(&queue);
}

fn alert_cycle(mut sandbox: Sandbox, queue: &str) {
    let (url, bodies) = receiver();
    sandbox.set_env("SWITCHYARD_ALERT_WEBHOOK", &url);
    let log = std::fs::File::create(sandbox.path("serve.log")).expect("serve's log");
    let served = sandbox.serve_with(
        &[
            "--alert-every",
            "200ms",
            "--alert-window",
            "30s",
            "--alert-failure-rate",
            "0.5",
            "--alert-min-finished",
            "3",
            "--alert-oldest-ready",
            "off",
            "--alert-dead-growth",
            "off",
            "--alert-no-workers",
            "off",
        ],
        Stdio::from(log),
    );

    sandbox.publish_lines(queue, "charge", "{}\n{}\n{}\n{}\n{}\n");
    work(&sandbox, queue, "exit 3");
    let fired = wait_for(&bodies, 1);
    assert_eq!(fired.len(), 1, "{fired:?}");
    let body: serde_json::Value = serde_json::from_str(&fired[0]).expect("JSON");
    let text = body["text"].as_str().expect("a Slack-style text");
    assert!(
        text.contains("FIRING") && text.contains("failure rate") && text.contains(queue),
        "{text}"
    );
    assert!(text.contains("5 of the 5 jobs"), "{text}");
    // Many readings later the incident is still one post.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(posts(&bodies).len(), 1, "{:?}", posts(&bodies));

    // Jobs that succeed bring the rate under the threshold: 5 of 25 failed.
    let ok = "{}\n".repeat(20);
    sandbox.publish_lines(queue, "charge", &ok);
    work(&sandbox, queue, "true");
    let both = wait_for(&bodies, 2);
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(
        both[1].contains("RESOLVED") && both[1].contains(queue),
        "{}",
        both[1]
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(posts(&bodies).len(), 2, "{:?}", posts(&bodies));

    drop(served);
    let log = std::fs::read_to_string(sandbox.path("serve.log")).unwrap_or_default();
    assert!(
        !log.contains("SECRETTOKEN"),
        "the webhook's secret was logged: {log}"
    );
}

#[test]
fn bad_alert_settings_are_refused_with_the_flag_named() {
    let sandbox = Sandbox::new();
    for (flags, needle) in [
        (vec!["--alert-webhook", "not a url"], "--alert-webhook"),
        (
            vec![
                "--alert-webhook",
                "http://127.0.0.1:9/h",
                "--alert-failure-rate",
                "2",
            ],
            "--alert-failure-rate",
        ),
        (
            vec![
                "--alert-webhook",
                "http://127.0.0.1:9/h",
                "--alert-window",
                "0s",
            ],
            "--alert-window",
        ),
    ] {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend(flags);
        let out = sandbox.run(&args);
        assert_one_line_error(&out, &[needle]);
    }
}

/// Every `switchyard_…` name in `text` is a metric the library exports (a histogram's
/// `_bucket` series included).
fn assert_known_metrics(file: &str, text: &str) {
    use switchyard::metrics::*;
    let known = [
        PUBLISHED,
        RESERVED,
        ACKED,
        RELEASED,
        DEAD_LETTERED,
        QUEUE_DEPTH,
        OLDEST_READY_AGE,
        WORKERS,
    ];
    let histogram = format!("{HANDLER_DURATION}_bucket");
    let mut found = 0;
    for (at, _) in text.match_indices("switchyard_") {
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `switchyard_(released|dead_lettered)_total`: a regex over two known names.
        if name == "switchyard_" {
            continue;
        }
        found += 1;
        assert!(
            known.contains(&name.as_str()) || name == histogram,
            "{file} names {name}, which Switchyard does not export"
        );
    }
    assert!(found > 3, "{file} names no metric");
}

fn doc(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_alert_rules_and_the_dashboard_query_only_metrics_that_exist() {
    assert_known_metrics("docs/alerts.yml", &doc("alerts.yml"));
    let dashboard = doc("grafana.json");
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("grafana.json is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| p.len() >= 6));
    assert_known_metrics("docs/grafana.json", &dashboard);
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let Ok(out) = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/alerts.yml"))
        .output()
    else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is missing; scripts/test installs it (package prometheus)"
        );
        eprintln!("SKIPPED: no promtool (scripts/test installs it)");
        return;
    };
    assert!(
        out.status.success(),
        "promtool check rules docs/alerts.yml: {}{}",
        support::text(&out.stdout),
        support::text(&out.stderr)
    );
    assert!(
        support::text(&out.stdout).contains("4 rules found"),
        "{}",
        support::text(&out.stdout)
    );
}
