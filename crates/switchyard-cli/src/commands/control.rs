//! `switchyard pause`, `resume` and `cancel`: an operator's controls, kept in the status
//! store (RabbitMQ's control store) and seen by every worker within a poll.

use std::sync::Arc;

use switchyard::status::JobFilter;
use switchyard::{Config, Controls, Error, JobState, Jobs, Result};

use crate::cli::{CancelArgs, PauseArgs};

/// The controls of the store `config` names (created first when `create`: a queue can
/// be paused before its first job), or why there are none.
async fn controls(config: &Config, create: bool) -> Result<(Jobs, Arc<dyn Controls>)> {
    let jobs = if create {
        switchyard::connect_jobs(config).await?
    } else {
        switchyard::connect_existing_jobs(config).await?
    };
    let Some(controls) = jobs.store().and_then(|s| s.controls()) else {
        return Err(Error::NotSupported(format!(
            "{} keeps no controls without a SQL store beside it: set DATABASE_URL (and QUEUE_STATUS=on)",
            jobs.transport().name()
        )));
    };
    Ok((jobs, controls))
}

/// `--kind`, which must name a kind when given.
fn kind_arg(kind: Option<&str>) -> Result<()> {
    match kind {
        Some(k) if k.trim().is_empty() => Err(switchyard::ConfigError::new(
            "--kind",
            Some(k.to_owned()),
            "a job kind (leave --kind out to pause or resume the whole queue)",
        )
        .into()),
        _ => Ok(()),
    }
}

pub(crate) async fn pause(config: &Config, args: PauseArgs, json: bool) -> Result<()> {
    kind_arg(args.kind.as_deref())?;
    let queue = super::common::queue_arg(Some(&args.queue))?.map(|q| q.to_string());
    let queue = queue.unwrap_or_default();
    let (_jobs, controls) = controls(config, true).await?;
    controls.pause(&queue, args.kind.as_deref()).await?;
    if json {
        return crate::output::json_line(
            &serde_json::json!({ "paused": { "queue": queue, "kind": args.kind } }),
        );
    }
    match &args.kind {
        Some(kind) => outln!(
            "paused kind {kind} of queue {queue}: workers put its jobs back until it is resumed"
        ),
        None => outln!("paused queue {queue}: workers claim nothing from it until it is resumed"),
    }
    Ok(())
}

pub(crate) async fn resume(config: &Config, args: PauseArgs, json: bool) -> Result<()> {
    kind_arg(args.kind.as_deref())?;
    let queue = super::common::queue_arg(Some(&args.queue))?.map(|q| q.to_string());
    let queue = queue.unwrap_or_default();
    let (_jobs, controls) = controls(config, false).await?;
    let was = controls.resume(&queue, args.kind.as_deref()).await?;
    if json {
        return crate::output::json_line(&serde_json::json!({
            "resumed": { "queue": queue, "kind": args.kind }, "was_paused": was,
        }));
    }
    let what = match &args.kind {
        Some(kind) => format!("kind {kind} of queue {queue}"),
        None => format!("queue {queue}"),
    };
    if was {
        outln!("resumed {what}");
    } else {
        outln!("{what} was not paused");
    }
    Ok(())
}

pub(crate) async fn cancel(config: &Config, args: CancelArgs, json: bool) -> Result<()> {
    let (jobs, controls) = controls(config, false).await?;
    let mut ids = Vec::new();
    for id in &args.ids {
        ids.push(uuid::Uuid::parse_str(id.trim()).map_err(|_| {
            switchyard::ConfigError::new(
                "ID",
                Some(id.clone()),
                "a job's id: a UUID such as 0195e2c4-7d1a-7b8e-9c55-3f1d2a6b8e90 (publish prints it)",
            )
        })?);
    }
    let by_filter = args.queue.is_some()
        || args.kind.is_some()
        || args.state.is_some()
        || args.older_than.is_some();
    if by_filter {
        ids.extend(matching(&jobs, &args).await?);
    } else if ids.is_empty() {
        return Err(Error::InvalidInput(
            "cancel what? Give job ids, or a filter: --queue, --kind, --state, --older-than".into(),
        ));
    }
    if args.dry_run {
        if json {
            return crate::output::json_line(
                &serde_json::json!({ "would_cancel": ids.len(), "ids": ids }),
            );
        }
        outln!(
            "would cancel {} job(s); run again without --dry-run to cancel them",
            ids.len()
        );
        return Ok(());
    }
    // A job that already ended is left alone: a mark would stay, and cancel its replay.
    let mut marked = Vec::new();
    let mut ended = Vec::new();
    let mut states = Vec::new();
    for id in ids {
        let state = match jobs.store() {
            Some(store) => store.get(id).await?.map(|s| s.state),
            None => None,
        };
        if state.is_some_and(JobState::is_final) {
            ended.push(id);
        } else {
            marked.push(id);
            states.push(state);
        }
    }
    controls.cancel(&marked).await?;
    if json {
        return crate::output::json_line(&serde_json::json!({
            "cancelled": marked.len(), "ids": marked, "already_ended": ended,
        }));
    }
    for (id, state) in marked.iter().zip(states) {
        let what = match state {
            Some(JobState::Running) => "running: its handler is cancelled within a second (an exec command gets SIGTERM, then SIGKILL after the worker's grace period)",
            _ => "waiting: it never runs; a worker ends it cancelled when it reaches it",
        };
        outln!("{id} {what}");
    }
    for id in ended {
        outln!("{id} already ended: nothing to cancel");
    }
    Ok(())
}

/// The unfinished jobs `args`' filter names, from the status store.
async fn matching(jobs: &Jobs, args: &CancelArgs) -> Result<Vec<uuid::Uuid>> {
    let Some(store) = jobs.store() else {
        return Err(Error::NotSupported(
            "cancelling by filter reads job status: it is off here (QUEUE_STATUS=off)".into(),
        ));
    };
    let state = match args.state.as_deref() {
        None => None,
        Some(s) => match JobState::parse(s) {
            Some(state @ (JobState::Pending | JobState::Retrying | JobState::Running)) => {
                Some(state)
            }
            _ => {
                return Err(switchyard::ConfigError::new(
                    "--state",
                    Some(s.to_owned()),
                    "pending, retrying or running (ended jobs cannot be cancelled)",
                )
                .into())
            }
        },
    };
    let older_than = args
        .older_than
        .as_deref()
        .map(|d| switchyard::parse_duration("--older-than", d))
        .transpose()?;
    let now = chrono::Utc::now();
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let mut filter = JobFilter::new(JobFilter::MAX_LIMIT);
        filter.queue = args.queue.clone();
        filter.state = state;
        filter.search = args.kind.clone();
        filter.offset = offset;
        let page = store.list(&filter).await?;
        let n = page.len();
        out.extend(
            page.into_iter()
                .filter(|s| !s.state.is_final())
                .filter(|s| args.kind.as_ref().is_none_or(|k| *k == s.kind))
                .filter(|s| {
                    older_than
                        .is_none_or(|age| (now - s.created_at).to_std().unwrap_or_default() >= age)
                })
                .map(|s| s.id),
        );
        if n < JobFilter::MAX_LIMIT {
            break;
        }
        offset += n;
    }
    Ok(out)
}
