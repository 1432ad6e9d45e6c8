//! `switchyard job ID`: one job, from the command line.

use switchyard::{Config, Error, Result};

use crate::job_view::{self, JobView};

pub(crate) async fn run(config: &Config, id: &str, json: bool) -> Result<()> {
    let id = uuid::Uuid::parse_str(id.trim()).map_err(|_| {
        switchyard::ConfigError::new(
            "ID",
            Some(id.to_owned()),
            "a job's id: a UUID such as 0195e2c4-7d1a-7b8e-9c55-3f1d2a6b8e90 (publish prints it)",
        )
    })?;
    let jobs = switchyard::connect_existing_jobs(config).await?;
    let (transport, store) = (jobs.transport().clone(), jobs.store().cloned());
    let Some(view) = job_view::find(&transport, store.as_ref(), id).await? else {
        crate::output::set_exit_code(1);
        return Err(Error::InvalidInput(format!(
            "no job {id}: {} and not among the dead letters",
            if store.is_some() {
                "no status record (never published here, or pruned)"
            } else {
                "job status is off here (QUEUE_STATUS=off, or RabbitMQ without DATABASE_URL)"
            }
        )));
    };
    if json {
        return crate::output::json_line(&view);
    }
    print(&view);
    Ok(())
}

fn print(v: &JobView) {
    if let Some(s) = &v.status {
        print_status(v, s);
    } else if let (Some(h), None) = (&v.held, &v.dead_letter) {
        outln!("job       {}", h.id);
        outln!("queue     {}   kind {}", h.queue, h.kind);
        outln!(
            "state     held ({}, attempt {})",
            if h.started {
                "started"
            } else {
                "claimed ahead"
            },
            h.attempts + 1
        );
        outln!("where     {}", v.location);
    } else if let Some(d) = &v.dead_letter {
        outln!("job       {}", d.id);
        outln!("queue     {}   kind {}", d.queue, d.kind);
        outln!("state     dead ({}, {} attempts)", d.reason, d.attempts);
        outln!("where     {}", v.location);
        outln!("dead at   {}", time(&d.dead_at));
        if let Some(e) = &d.last_error {
            outln!("error     {}", indent(e));
        }
    }
    match &v.payload {
        Some(p) => outln!("payload   {}", pretty(p)),
        None => outln!("payload   (not recorded)"),
    }
    print_history(v);
}

/// The job's status record, with who holds it and its checkpoint.
fn print_status(v: &JobView, s: &switchyard::JobStatus) {
    outln!("job       {}", s.id);
    outln!("queue     {}   kind {}", s.queue, s.kind);
    outln!("state     {} (attempt {})", s.state, s.attempts);
    outln!("where     {}", v.location);
    if s.state == switchyard::JobState::Running && s.progress > 0 {
        let note = s.progress_message.as_deref().unwrap_or("");
        outln!("progress  {}% {note}", s.progress);
    }
    if let Some(w) = &s.worker {
        outln!("worker    {w}");
    }
    if let Some(h) = &v.held {
        outln!(
            "held by   {} until {}",
            h.holder.as_deref().unwrap_or("-"),
            time(&h.lease_until)
        );
    }
    outln!("created   {}", time(&s.created_at));
    if let Some(t) = &s.started_at {
        outln!("started   {}", time(t));
    }
    if let Some(t) = &s.finished_at {
        outln!("finished  {}", time(t));
    }
    if let Some(ms) = v.duration_ms {
        outln!("duration  {ms} ms");
    }
    if let Some(r) = &s.result {
        outln!("result    {}", pretty(r));
    }
    if let Some(c) = &v.checkpoint {
        outln!("checkpoint {}", pretty(c));
    }
    // A completed job's earlier errors are under its failed attempts.
    if let (Some(e), false) = (&s.last_error, s.state == switchyard::JobState::Completed) {
        outln!("error     {}", indent(e));
    }
}

/// The job's failed attempts and the logs of its attempts.
fn print_history(v: &JobView) {
    if !v.attempts.is_empty() {
        outln!("failed attempts:");
        for a in &v.attempts {
            let ran = match a.started_at {
                Some(start) => format!(
                    "{} ms from {}",
                    (a.ended_at - start).num_milliseconds().max(0),
                    time(&start)
                ),
                None => format!("ended {}", time(&a.ended_at)),
            };
            outln!(
                "  #{} {}  {}  {ran}",
                a.attempt,
                a.state,
                a.worker.as_deref().unwrap_or("-")
            );
            if let Some(e) = &a.error {
                outln!("     {}", indent(e));
            }
        }
    }
    for log in &v.logs {
        outln!(
            "log of attempt {} ({}):",
            log.attempt,
            time(&log.updated_at)
        );
        for line in log.lines.lines() {
            outln!("  {line}");
        }
    }
}

/// A time as the job view prints it.
fn time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn pretty(v: &serde_json::Value) -> String {
    indent(&serde_json::to_string_pretty(v).unwrap_or_default())
}

/// Continuation lines under the value column.
fn indent(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n          ")
}
